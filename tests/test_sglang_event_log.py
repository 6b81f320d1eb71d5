"""A live SGLang 0.5.23 dLLM scheduler writing its own event log (integrations.sglang.event_log).

The scheduler is SGLang's real one (integrations/sglang/engine.py says what is stubbed), driven
by SGLang's own `event_loop_normal` (`integrations.sglang.event_loop.serve`), with
`SglangEventLog` attached the way it would be on a server. What is checked is the log alone:
`check_trace` under the policy its header declares, and the decision twin `sglang-dllm-order`
on the log's own operations.

SGLang must be installed (`schedspec install-engines sglang`); see tests/test_real_sglang.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integrations.sglang import SGLANG_DLLM_PROFILE, observer
from integrations.sglang.adapter import SglangDllmAdapter
from integrations.sglang.engine import Engine, build, import_engine, new_request, scripted_token
from integrations.sglang.event_log import (
    SglangEventLog,
    declared_policy,
    dllm_config_of,
    eos_token_of,
)
from integrations.sglang.event_loop import serve
from integrations.sglang.manifest import VERSION as SGLANG_VERSION
from properties.decisions import twin_difference
from properties.trace_check import check_trace
from reference.sglang_dllm import SGLANG_ORDER_TWIN
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError
from spec.events import (
    Aborted,
    CacheHit,
    CacheReleased,
    Event,
    Finished,
    FinishReason,
    KvCached,
    Submitted,
)
from spec.machine import SpecMachine
from spec.snapshot import FinishedOutput
from spec.trace import event_to_dict
from tests.test_real_sglang import sglang_installed  # noqa: F401  (the module's fixture)

LOG_PROGRAMS = int(os.environ.get("SCHEDSPEC_SGLANG_LOG_PROGRAMS", "8"))


@dataclasses.dataclass(frozen=True, slots=True)
class Tick:
    """What reaches the scheduler before one iteration of its loop."""

    submits: tuple[RequestSpec, ...] = ()
    aborts: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Program:
    config: DllmConfig
    ticks: tuple[Tick, ...]


def served_program(seed: int) -> Program:
    """A configuration inside SGLang's declared space and arrivals and aborts over time.
    Request ids have one width, so none is a prefix of another (SGLang aborts by prefix)."""
    rng = random.Random(seed)
    b = rng.choice([1, 2, 4])
    mode = rng.choice([Mode.SYNC, Mode.FDFO])
    seats = rng.randrange(1, 4)
    config = DllmConfig(
        block_size=b,
        page_size=b,
        kv_pages=1,
        req_pool_rows=seats,
        max_running_requests=seats,
        max_context=8 * b,
        mode=mode,
        in_place_reuse=mode is Mode.FDFO,
        eos_token_id=rng.choice([None, 7]),
    )
    least = SGLANG_DLLM_PROFILE.space.min_kv_pages(config)
    config = config.replace(kv_pages=least + rng.randrange(0, 6))
    ticks: list[Tick] = []
    live: list[str] = []
    for i in range(rng.randrange(4, 16)):
        submits: list[RequestSpec] = []
        for j in range(rng.choice([0, 0, 1, 1, 2])):
            prompt = tuple(rng.randrange(1, 20) for _ in range(rng.randrange(1, 3 * b)))
            rid = f"r{i:02d}{j}"
            submits.append(RequestSpec(rid, prompt, rng.randrange(1, 8 * b - len(prompt))))
            live.append(rid)
        aborts: tuple[str, ...] = ()
        if live and rng.random() < 0.15:
            aborts = (live.pop(rng.randrange(len(live))),)
        ticks.append(Tick(tuple(submits), aborts))
    return Program(config, tuple(ticks))


@dataclasses.dataclass(frozen=True, slots=True)
class Stops:
    """A request's own stop conditions (`SamplingParams.stop` and `stop_token_ids`)."""

    strings: tuple[str, ...] = ()
    token_ids: tuple[int, ...] = ()


class LetterTokenizer:
    """Token t reads as one letter, enough for SGLang to match stop strings on text (no EOS
    and no extra stop ids of its own)."""

    eos_token_id = None
    additional_stop_token_ids = None

    def decode(self, ids: Any, **_: Any) -> str:
        return "".join(letter(int(t)) for t in ids)

    def encode(self, text: str, **_: Any) -> list[int]:
        return [ord(c) - ord("a") for c in text]


def letter(token: int) -> str:
    return chr(ord("a") + token % 26)


def _queue(
    engine: Engine,
    spec_id: dict[int, str],
    request: RequestSpec,
    stops: Stops | None,
    served: dict[str, Any],
) -> None:
    rid, prompt, max_new, ignore_eos = (
        request.request_id,
        request.prompt,
        request.max_new_tokens,
        request.ignore_eos,
    )
    if stops is None:
        req = new_request(engine, rid, prompt, max_new, ignore_eos=ignore_eos)
    else:
        req = new_request(
            engine,
            rid,
            prompt,
            max_new,
            stop=stops.strings,
            stop_token_ids=stops.token_ids,
            ignore_eos=ignore_eos,
            tokenizer=LetterTokenizer(),
        )
    spec_id[id(req)] = request.request_id  # the scripted step's tokens follow the id
    served[request.request_id] = req
    engine.scheduler.waiting_queue.append(req)


def serve_logged(
    program: Program,
    mutate: Callable[[Engine], None] | None = None,
    *,
    max_iterations: int = 2_000,
    stops: dict[str, Stops] | None = None,
    served: dict[str, Any] | None = None,
    radix_cache: bool = False,
    schedule_policy: str | None = None,
) -> list[str]:
    """The lines `SglangEventLog` writes while SGLang's own loop serves `program` (`stops`:
    requests' own stop conditions; `served` receives each request's SGLang `Req`; with
    `radix_cache`, SGLang's default for dLLMs, its block-level radix cache on; with
    `schedule_policy`, under that `--schedule-policy`)."""
    served = {} if served is None else served
    spec_id: dict[int, str] = {}
    engine = build(
        program.config, spec_id, radix_cache=radix_cache, schedule_policy=schedule_policy
    )
    if mutate is not None:
        mutate(engine)
    lines: list[str] = []
    SglangEventLog(engine.scheduler, lines.append, worker=engine.worker)
    abort_req = import_engine()["AbortReq"]
    ticks = iter(program.ticks)

    def ingest(engine: Engine) -> bool:
        tick = next(ticks, None)
        if tick is None:
            return False
        for request in tick.submits:
            _queue(engine, spec_id, request, (stops or {}).get(request.request_id), served)
        for rid in tick.aborts:
            engine.scheduler.abort_request(abort_req(rid=rid))
        return True

    serve(engine, ingest, max_iterations=max_iterations)
    return lines


def adapter_events(program: Program) -> list[Event]:
    """The conformance adapter's events on the same program: a round per loop iteration in
    which anything is live (a server's idle iterations write nothing)."""
    events: list[Event] = []
    adapter = SglangDllmAdapter(program.config, events.append)
    for tick in program.ticks:
        for request in tick.submits:
            adapter.submit(request)
        for rid in tick.aborts:
            if rid in adapter.live:
                adapter.abort(rid)
        if adapter.live:
            adapter.run_round()
    adapter.drain()
    return events


def _checked(lines: list[str]) -> list[Event]:
    kept: list[Event] = []
    result = check_trace(lines, keep=kept)
    assert result.ok, (result.line, result.violation)
    assert result.idle_at_end and result.policy == SGLANG_DLLM_PROFILE.policy
    return kept


def test_a_live_sglang_log_checks_under_its_declared_policy_and_decides_as_its_twin() -> None:
    """Served by SGLang's own loop, the log conforms under the policy its header declares,
    the re-implementation of SGLang's admission order decides alike on the log's operations,
    and every line is what the conformance adapter derives from the same program (one
    derivation, `SglangObserver`, behind both). CI runs 8 programs;
    `SCHEDSPEC_SGLANG_LOG_PROGRAMS=200 pytest tests/test_sglang_event_log.py -k twin` runs
    200."""
    seen: set[str] = set()
    for seed in range(LOG_PROGRAMS):
        program = served_program(seed)
        lines = serve_logged(program)
        header = json.loads(lines[0])
        assert header["declared_policy"]["admission"] == "prefill-first"
        assert header["writer"] == f"sglang {SGLANG_VERSION}"  # the release, SGLang's class
        kept = _checked(lines)
        assert kept == adapter_events(program), seed
        difference = twin_difference(
            kept, program.config, SGLANG_ORDER_TWIN, SGLANG_DLLM_PROFILE, subject="the log"
        )
        assert difference is None, (seed, difference)
        seen |= {type(e).__name__ for e in kept}
    if LOG_PROGRAMS >= 8:
        assert {"Aborted", "Finished", "Forward", "KvFreed"} <= seen, seen


def test_the_logged_config_is_the_schedulers_own() -> None:
    config = served_program(3).config
    engine = build(config, {})
    assert dllm_config_of(engine.scheduler) == config
    cached = build(config, {}, radix_cache=True)  # SGLang's default: no --disable-radix-cache
    assert dllm_config_of(cached.scheduler) == config.replace(prefix_cache=True)


def test_served_with_the_radix_cache_on_the_log_records_the_cache_and_conforms() -> None:
    """SGLang's default for dLLMs, the radix cache on: r0's committed blocks enter the cache
    as it runs, r1 (r0's prompt and two more tokens, arriving later) reads them instead of
    computing them, both stop reading them as they finish, and the log conforms to the spec
    with its prefix cache, under the header's declared policy."""
    config = DllmConfig(
        block_size=2, page_size=2, kv_pages=24, req_pool_rows=2, max_running_requests=2,
        max_context=24, mode=Mode.FDFO, in_place_reuse=True,
    )  # fmt: skip
    r0 = RequestSpec("r0", (3, 1, 4, 1, 5, 9), 4)
    r1 = RequestSpec("r1", (*r0.prompt, 2, 6), 2)
    ticks = (Tick(submits=(r0,)), *(Tick(),) * 12, Tick(submits=(r1,)))
    lines = serve_logged(Program(config, ticks), radix_cache=True)
    assert json.loads(lines[0])["prefix_cache"] is True
    kept = _checked(lines)
    hits = [e for e in kept if isinstance(e, CacheHit)]
    assert [(e.request_id, e.block_index) for e in hits] == [("r1", 0), ("r1", 1), ("r1", 2)]
    cached = {(e.request_id, e.block_index) for e in kept if isinstance(e, KvCached)}
    assert {("r0", 0), ("r0", 1), ("r0", 2)} <= cached
    released = {e.request_id for e in kept if isinstance(e, CacheReleased)}
    assert released == {"r0", "r1"}


def test_an_abort_by_prefix_is_logged_for_every_request_it_ends(tmp_path: Path) -> None:
    """SGLang aborts every request whose id starts with the given one: aborting `r1` ends
    `r10` too, and the log says so (two `Aborted`), and still checks."""
    config = served_program(0).config.replace(mode=Mode.FDFO, in_place_reuse=True)
    config = config.replace(kv_pages=SGLANG_DLLM_PROFILE.space.min_kv_pages(config))
    b = config.block_size
    program = Program(
        config,
        (
            Tick((RequestSpec("r1", (3,), 4 * b), RequestSpec("r10", (4,), 4 * b))),
            Tick(),
            Tick(aborts=("r1",)),
        ),
    )
    kept = _checked(serve_logged(program))
    assert sorted(e.request_id for e in kept if isinstance(e, Aborted)) == ["r1", "r10"]


def test_a_request_sglang_aborts_inside_the_round_is_logged_where_it_ended() -> None:
    """A request SGLang ends in the round with an abort (`to_finish`, as a grammar failure
    sets it) is written as `Aborted` after its frees, right after its commit, where SGLang
    ended it. SGLang's profile declares that (`aborts_after_commit`), so the log conforms and
    `sglang-dllm-order` aborts it alike; under the idealised spec, where aborts happen between
    rounds, `check_trace` reports `scheduler_phase` at that line."""
    program = served_program(5)
    first = program.ticks[0].submits[0].request_id

    def abort_inside(engine: Engine) -> None:
        own = engine.scheduler.process_batch_result_dllm

        def process(batch: Any, result: Any) -> Any:
            for req in batch.reqs:
                if req.rid == first:
                    req.to_finish = import_engine()["FINISH_ABORT"]("stopped by the test")
            return own(batch, result)

        engine.scheduler.process_batch_result_dllm = process

    lines = serve_logged(program, abort_inside)
    kept = _checked(lines)
    assert Aborted(first) in kept
    assert twin_difference(kept, program.config, SGLANG_ORDER_TWIN, SGLANG_DLLM_PROFILE) is None
    header = json.loads(lines[0])
    del header["declared_policy"]["aborts_after_commit"]
    result = check_trace([json.dumps(header), *lines[1:]])
    assert result.violation is not None and result.violation.rule == "scheduler_phase"
    assert result.line is not None
    assert json.loads(lines[result.line - 1]) == {"kind": "aborted", "request_id": first}
    previous = [json.loads(line)["kind"] for line in lines[: result.line - 1]]
    assert previous[-3:] == ["block_committed", "kv_freed", "row_released"]


def test_a_live_log_refuses_what_it_cannot_describe_and_detaches() -> None:
    config = served_program(1).config
    engine = build(config, {})
    s = engine.scheduler
    s.enable_overlap = True
    with pytest.raises(ConfigError, match="enable_overlap"):
        SglangEventLog(s, print, worker=engine.worker)
    s.enable_overlap = False
    s.tree_cache.disable = False  # SGLang's default: logged, a cache-aware order as free
    own_policy = s.policy.policy
    s.policy.policy = import_engine()["CacheAwarePolicy"]("lpm")
    assert declared_policy(s).free_queue_order
    s.policy.policy = types.SimpleNamespace(value="priority")  # no such policy in 0.5.23
    with pytest.raises(ConfigError, match=r"schedule_policy='priority': one of fcfs, lof"):
        SglangEventLog(s, print, worker=engine.worker)
    s.policy.policy = own_policy
    s.tree_cache.disable = True
    s.model_config.hf_eos_token_id = None
    s.dllm_config = None
    with pytest.raises(ConfigError, match="dllm"):
        SglangEventLog(s, print, worker=engine.worker)
    s.dllm_config = engine.sg_config
    own = s.get_next_batch_to_run
    log = SglangEventLog(s, lambda line: None, worker=engine.worker)
    assert s.get_next_batch_to_run != own and "forward" in vars(engine.worker.model_runner)
    log.detach()
    assert s.get_next_batch_to_run == own and "get_next_batch_to_run" not in vars(s)
    assert "forward" not in vars(engine.worker.model_runner)
    assert "step" not in vars(engine.worker.dllm_algorithm)


def _lifo_admission(engine: Engine) -> None:
    """Seeded bug: the scheduler takes its waiting queue newest first."""
    s = engine.scheduler
    own = s.get_next_batch_to_run

    def reversed_queue(*args: Any, **kwargs: Any) -> Any:
        s.waiting_queue.reverse()
        return own(*args, **kwargs)

    s.get_next_batch_to_run = reversed_queue


def _keep_one_page(engine: Engine) -> None:
    """Seeded bug: the allocator never takes back the first page it is given to free."""
    allocator = engine.scheduler.token_to_kv_pool_allocator
    own = allocator.free
    lost: list[int] = []

    def free(indices: Any) -> Any:
        if not lost and len(indices):
            lost.append(int(indices[0]))
            keep = indices[indices // engine.page_size != lost[0] // engine.page_size]
            return own(keep)
        return own(indices)

    allocator.free = free


@pytest.mark.parametrize(
    ("bug", "rules"),
    [
        (_lifo_admission, {"prefill_first", "fcfs_admission"}),
        (_keep_one_page, {"terminal_owns_nothing", "no_leak"}),
    ],
)
def test_a_live_log_shows_a_seeded_bug_in_sglangs_scheduler(
    bug: Callable[[Engine], None], rules: set[str]
) -> None:
    for seed in range(40):
        program = served_program(seed)
        try:
            lines = serve_logged(program, bug)
        except RuntimeError:
            continue  # the bug stalled SGLang's loop: not what this test looks for
        result = check_trace(lines)
        if result.violation is not None:
            assert result.violation.rule in rules, result.violation
            assert result.line is not None, result
            return
    pytest.fail(f"no program of 40 showed {bug.__name__}")


def test_the_log_is_json_lines_of_the_spec_events() -> None:
    lines = serve_logged(served_program(2))
    kept = _checked(lines)
    assert [json.loads(line) for line in lines[1:]] == [event_to_dict(e) for e in kept]


def test_idle_rounds_in_a_row_are_written_once_and_fail_progress() -> None:
    """Seeded bug: for its first five iterations the scheduler plans nothing while a request
    that fits is queued. The log writes that run of idle rounds once (a stalled server must
    not fill the disk), and `check_trace` fails it with `progress` at that line."""
    config = served_program(4).config
    first = "r0"
    program = Program(config, (Tick((RequestSpec(first, (3, 4), 2),)), *[Tick()] * 6))

    def hold_back(engine: Engine) -> None:
        s = engine.scheduler
        own = s.get_next_batch_to_run
        held = [0]

        def plan(*args: Any, **kwargs: Any) -> Any:
            if s.waiting_queue and held[0] < 5:
                held[0] += 1
                return types.SimpleNamespace(running_batch=s.running_batch, batch_to_run=None)
            return own(*args, **kwargs)

        s.get_next_batch_to_run = plan

    lines = serve_logged(program, hold_back)
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds[1:4] == ["submitted", "control_returned", "admitted"], kinds
    assert json.loads(lines[1])["request_id"] == first
    result = check_trace(lines)
    assert result.violation is not None and result.violation.rule == "progress", result
    assert kinds[(result.line or 0) - 1] == "control_returned"


def test_the_idle_engine_finding_shows_in_a_served_log() -> None:
    """The finding `test_finding_idle_engine_skips_a_round_before_admitting_a_request_that_fits`
    (below the declared headroom: 4 pages, a request of 12 tokens whose estimate is 19), served by
    SGLang's own loop: the first round admits nothing, the next admits the request, and the
    log fails `progress` at the idle round."""
    config = DllmConfig(
        block_size=4,
        page_size=4,
        kv_pages=4,
        req_pool_rows=2,
        max_running_requests=2,
        max_context=32,
        mode=Mode.FDFO,
        in_place_reuse=True,
    )
    lines = serve_logged(Program(config, (Tick((RequestSpec("a", (5, 6, 7, 8, 9), 6),)),)))
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds[:4] == ["config", "submitted", "control_returned", "admitted"], kinds
    result = check_trace(lines)
    assert result.violation is not None and result.violation.rule == "progress", result
    assert result.line == 3


def stop_program(mode: Mode) -> tuple[Program, dict[str, Stops]]:
    """Three requests served together: `t` stops on a stop token id, `s` on a stop string
    (two letters its scripted tokens spell), `u` has no stop and runs to its length. The
    stops lie at most at the fourth generated position, well before max_new_tokens."""
    b = 2
    config = DllmConfig(
        block_size=b,
        page_size=b,
        kv_pages=1,
        req_pool_rows=3,
        max_running_requests=3,
        max_context=16,
        mode=mode,
        in_place_reuse=mode is Mode.FDFO,
    )
    config = config.replace(kv_pages=3 * SGLANG_DLLM_PROFILE.space.min_kv_pages(config))
    mask = config.mask_token_id
    t, s, u = RequestSpec("t", (3,), 9), RequestSpec("s", (3, 4, 5), 9), RequestSpec("u", (6,), 5)
    word = letter(scripted_token("s", 5, mask)) + letter(scripted_token("s", 6, mask))
    stops = {"t": Stops(token_ids=(scripted_token("t", 4, mask),)), "s": Stops(strings=(word,))}
    return Program(config, (Tick((t, s, u)),)), stops


@pytest.mark.parametrize("mode", [Mode.SYNC, Mode.FDFO])
def test_requests_sglang_stops_are_logged_and_check(mode: Mode) -> None:
    """A request with its own stop token ids is logged with them (`stop_token_ids`), one with
    stop strings `stop_sampled`, and SGLang's stop (`FINISH_MATCHED_TOKEN` of a non-EOS id,
    `FINISH_MATCHED_STR`) as `Finished` with reason stop: the log conforms under its declared
    policy, its twin stops where SGLang did and decides alike, and what SGLang hands each
    client (`output_ids` up to `finished_len`) is an output the spec allows: for `t`, exactly
    its tokens up to its stop token."""
    program, stops = stop_program(mode)
    served: dict[str, Any] = {}
    kept = _checked(serve_logged(program, stops=stops, served=served))
    submitted = {e.request_id: e for e in kept if isinstance(e, Submitted)}
    assert {rid for rid, e in submitted.items() if e.stop_sampled} == {"s"}
    assert submitted["t"].stop_token_ids == stops["t"].token_ids
    assert submitted["s"].stop_token_ids == submitted["u"].stop_token_ids == ()
    reasons = {e.request_id: e.reason for e in kept if isinstance(e, Finished)}
    assert reasons == {"t": FinishReason.STOP, "s": FinishReason.STOP, "u": FinishReason.LENGTH}
    assert twin_difference(kept, program.config, SGLANG_ORDER_TWIN, SGLANG_DLLM_PROFILE) is None
    machine = SpecMachine(program.config, SGLANG_DLLM_PROFILE.policy)
    for event in kept:
        machine.apply(event)
    outputs = {}
    for rid, req in served.items():
        n = req.finished_len if req.finished_len is not None else len(req.output_ids)
        outputs[rid] = FinishedOutput(tuple(int(x) for x in req.output_ids[:n]), reasons[rid])
    assert len(outputs["t"].tokens) < 9 and len(outputs["s"].tokens) < 9
    assert outputs["t"].tokens[-1] == stops["t"].token_ids[0]
    machine.check_outputs(outputs)


def eos_program(ignore_eos: bool) -> Program:
    """`i` alone (prompt one token, 7 new, blocks of 2), with the model's EOS the token the
    scripted step writes at its position 3: its second output block holds it."""
    base = DllmConfig(
        block_size=2, page_size=2, kv_pages=1, req_pool_rows=2, max_running_requests=2
    )
    config = base.replace(
        max_context=16,
        mode=Mode.FDFO,
        in_place_reuse=True,
        eos_token_id=scripted_token("i", 3, base.mask_token_id),
    )
    config = config.replace(kv_pages=2 * SGLANG_DLLM_PROFILE.space.min_kv_pages(config))
    return Program(config, (Tick((RequestSpec("i", (3,), 7, ignore_eos=ignore_eos),)),))


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_a_request_sglang_serves_with_ignore_eos_runs_past_its_eos_and_checks(
    ignore_eos: bool,
) -> None:
    """SGLang ends `i` at its EOS, or with `ignore_eos` runs it to max_new_tokens: the log
    says which (`Submitted.ignore_eos`), conforms either way, its twin decides alike, and
    what SGLang hands the client (EOS kept with `ignore_eos`) is the spec's output."""
    program = eos_program(ignore_eos)
    eos = program.config.eos_token_id
    served: dict[str, Any] = {}
    kept = _checked(serve_logged(program, served=served))
    (submitted,) = [e for e in kept if isinstance(e, Submitted)]
    assert submitted.ignore_eos is ignore_eos
    (finished,) = [e for e in kept if isinstance(e, Finished)]
    assert finished.reason is (FinishReason.LENGTH if ignore_eos else FinishReason.EOS)
    assert twin_difference(kept, program.config, SGLANG_ORDER_TWIN, SGLANG_DLLM_PROFILE) is None
    req = served["i"]
    n = req.finished_len if req.finished_len is not None else len(req.output_ids)
    output = tuple(int(x) for x in req.output_ids[:n])
    assert (eos in output) and (len(output) == 7) is ignore_eos, output
    machine = SpecMachine(program.config, SGLANG_DLLM_PROFILE.policy)
    for event in kept:
        machine.apply(event)
    machine.check_outputs({"i": FinishedOutput(output, finished.reason)})


def test_the_named_eos_of_a_model_with_several_is_its_configs_else_its_tokenizers_else_least() -> (
    None
):
    """`eos_token_of` names one of the model's EOS ids (the others are logged as stop token
    ids): the model config's own when it is in the set, else the tokenizer's, else the least."""
    own = types.SimpleNamespace(eos_token_id=9)

    def model(ids: object, hf_config: object = None) -> object:
        return types.SimpleNamespace(hf_eos_token_id=ids, hf_config=hf_config)

    tokenizer = types.SimpleNamespace(eos_token_id=7)
    assert eos_token_of(model(None)) is None and eos_token_of(model(set())) is None
    assert eos_token_of(model(5)) == 5
    assert eos_token_of(model({9, 2, 7}, own), tokenizer) == 9
    assert eos_token_of(model({2, 7}, own), tokenizer) == 7
    assert eos_token_of(model({2, 7}, types.SimpleNamespace(eos_token_id=[2, 7]))) == 2
    assert eos_token_of(model({4, 2, 7})) == 2
    scheduler = build(served_program(1).config, {}).scheduler
    scheduler.model_config.hf_eos_token_id = {2, 7}
    scheduler.tokenizer = tokenizer
    assert dllm_config_of(scheduler).eos_token_id == 7  # the scheduler's own tokenizer


def test_the_mask_id_is_never_the_named_eos_even_when_the_model_lists_it() -> None:
    """A model whose EOS ids include the mask id (a step never commits it, and the spec requires
    the EOS to differ from the mask) gets another of its ids named, or none: the scheduler's
    configuration is accepted rather than refused."""
    own = types.SimpleNamespace(eos_token_id=3)
    model = types.SimpleNamespace(hf_eos_token_id={3, 8}, hf_config=own)
    assert eos_token_of(model) == 3
    assert eos_token_of(model, mask_id=3) == 8
    assert eos_token_of(types.SimpleNamespace(hf_eos_token_id=3), mask_id=3) is None
    scheduler = build(served_program(1).config, {}).scheduler
    mask = int(scheduler.dllm_config.mask_id)
    scheduler.model_config.hf_eos_token_id = {mask, 7}
    scheduler.model_config.hf_config = types.SimpleNamespace(eos_token_id=mask)
    assert dllm_config_of(scheduler).eos_token_id == 7


@pytest.mark.parametrize(
    ("other_at", "ignore_eos", "reason", "length"),
    [
        (2, False, FinishReason.STOP, 2),  # the other EOS id first in the EOS's block
        (5, False, FinishReason.EOS, 3),  # the named EOS first
        (2, True, FinishReason.LENGTH, 7),  # ignore_eos: neither ends it
    ],
)
def test_a_model_with_several_eos_ids_is_logged_with_the_others_as_stop_token_ids(
    other_at: int, ignore_eos: bool, reason: FinishReason, length: int
) -> None:
    """A model with two EOS ids (SGLang's `hf_eos_token_id`, its model config's own first):
    the log's header names its own EOS, every `Submitted` carries the other as a stop token
    id, and SGLang ends `i` at whichever of the two it commits first (`FINISH_MATCHED_TOKEN`),
    logged as EOS or STOP. The log conforms, its twin decides alike, and what SGLang hands the
    client is the spec's output, cut after that token."""
    program = eos_program(ignore_eos)
    eos = program.config.eos_token_id
    assert eos is not None
    other = scripted_token("i", other_at, program.config.mask_token_id)

    def two_eos_ids(engine: Engine) -> None:
        engine.scheduler.model_config.hf_eos_token_id = {eos, other}
        engine.scheduler.model_config.hf_config = types.SimpleNamespace(eos_token_id=eos)

    served: dict[str, Any] = {}
    lines = serve_logged(program, two_eos_ids, served=served)
    assert json.loads(lines[0])["eos_token_id"] == eos
    kept = _checked(lines)
    (submitted,) = [e for e in kept if isinstance(e, Submitted)]
    assert submitted.stop_token_ids == (other,)
    (finished,) = [e for e in kept if isinstance(e, Finished)]
    assert finished.reason is reason
    assert twin_difference(kept, program.config, SGLANG_ORDER_TWIN, SGLANG_DLLM_PROFILE) is None
    req = served["i"]
    n = req.finished_len if req.finished_len is not None else len(req.output_ids)
    output = tuple(int(x) for x in req.output_ids[:n])
    assert len(output) == length, output
    ender = {FinishReason.STOP: other, FinishReason.EOS: eos}.get(reason)
    assert output[-1] == ender if ender is not None else {eos, other} <= set(output), output
    machine = SpecMachine(program.config, SGLANG_DLLM_PROFILE.policy)
    for event in kept:
        machine.apply(event)
    machine.check_outputs({"i": FinishedOutput(output, reason)})


def test_an_ignored_eos_logged_without_the_flag_fails_at_the_end_of_its_round() -> None:
    """Seeded bug: the log drops `ignore_eos`. The request is then still running at the end
    of the round that committed its EOS, and `check_trace` names that round's end."""
    lines = serve_logged(eos_program(ignore_eos=True))
    events = [json.loads(line) for line in lines[1:]]
    assert [e.pop("ignore_eos", None) for e in events].count(True) == 1
    dropped = [lines[0], *(json.dumps(e) for e in events)]
    result = check_trace(dropped)
    assert result.violation is not None, result
    assert result.violation.rule == "fdfo_releases_same_round"
    assert result.line is not None
    assert json.loads(dropped[result.line - 1])["kind"] == "control_returned"


def test_a_stop_logged_without_stop_sampled_fails_finish_condition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seeded bug: the log marks no request `stop_sampled`. SGLang's stops are then finishes
    the spec cannot explain, and `check_trace` names the first at its line."""
    monkeypatch.setattr(observer, "has_sampled_stop", lambda req: False)
    program, stops = stop_program(Mode.FDFO)
    lines = serve_logged(program, stops=stops)
    result = check_trace(lines)
    assert result.violation is not None and result.violation.rule == "finish_condition"
    assert "not submitted with stop_sampled" in str(result.violation)
    assert result.line is not None
    assert json.loads(lines[result.line - 1])["reason"] == "stop"


def test_a_stop_logged_without_its_stop_token_ids_fails_finish_condition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seeded bug: the log drops every request's stop token ids. SGLang's stop of `t` at its
    stop token is then a finish the spec cannot explain, named at its line."""
    monkeypatch.setattr(observer, "stop_token_ids", lambda req, config: ())
    program, stops = stop_program(Mode.FDFO)
    lines = serve_logged(program, stops=stops)
    result = check_trace(lines)
    assert result.violation is not None and result.violation.rule == "finish_condition"
    assert "'t' finished with reason stop" in str(result.violation)
    assert "it has no stop_token_ids" in str(result.violation)
    assert result.line is not None
    assert json.loads(lines[result.line - 1]) == {
        "kind": "finished",
        "request_id": "t",
        "reason": "stop",
    }
