"""The live `VllmEventLog` with a drafter that reserves lookahead slots (EAGLE, a draft model).

vLLM's `allocate_slots` gives a request with EAGLE or a draft model `num_lookahead_tokens` (k)
KV slots past the tokens the step computes, capped at `max_model_len`, for the drafter's own
KV. In the log they are blocks past the step's tokens, which the header declares
(`num_lookahead_tokens`): `kv_covers_scheduled` asks for them, and `kv_bounded` bounds a step's
allocation by them and every request by `max_model_len`.
With prefix caching and EAGLE, vLLM 0.33.0 and 0.34.0 hash each block with the token after it
(`num_hash_lookahead_tokens` = 1), which the log declares as `ArPolicy.hash_lookahead_tokens`:
the spec's cache keys then cover that token too (`tests/test_ar_hash_lookahead.py`).

Until 2026-12-07 the log refused these drafters; a multi-module MTP drafter (a prefill
lookahead past one token: it shortens prefill chunks) is still refused
(`test_real_vllm_event_log_limits`).

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.adapter import load_vllm
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreProgram, EngineCoreLoop, core_program
from integrations.vllm.event_log import VllmEventLog
from integrations.vllm.settings_034 import VLLM_034_DEFAULTS
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from properties.ar.trace_check import ArTraceResult, check_ar_trace
from spec.ar.events import ArBlocksAllocated, ArStepEnd
from spec.ar.machine import ArSpecMachine
from spec.ar.trace import ArTraceReader
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.test_real_vllm_cache_aware import has_the_setting
from tests.test_real_vllm_event_log_lora import twin_agrees
from tests.test_twin_settings import check

#: Programs of the engine-core loop whose pool holds one `max_model_len` sequence with the
#: drafter's lookahead (vLLM refuses a smaller one at start-up) and a budget above it, with
#: preemptions and cache hits among them; prefix caching on.
SEEDS = (0, 11, 13, 14, 17, 24, 27, 32)
#: Shared-prompt programs (FCFS, so the window applies) that vLLM 0.34.0 serves so, with hits.
SHARED_SEEDS = (0, 2, 3, 11, 13, 18, 25, 27)
K = 3


@pytest.fixture(autouse=True)
def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def lookahead_log(
    seed: int,
    method: str,
    watch: list[Any] | None = None,
    *,
    window: int = 0,
    programs: Callable[[int], CoreProgram] = core_program,
    seeded: Callable[[Any], None] | None = None,
    into: list[str] | None = None,
    prefix_caching: bool = True,
) -> list[str]:
    """The live log of the engine-core loop serving `programs(seed)` with prefix caching (or
    not) and K drafts by `method`; `watch` receives the scheduler; `window` > 0 serves vLLM
    0.34.0's cache-aware admission window (threshold 0: every hit ranks); `seeded` is applied
    to the scheduler once the log is attached (a seeded bug); the log's lines go to `into`
    (when given: kept if the loop raises) and are returned."""
    program = programs(seed)
    config = program.config.replace(enable_prefix_caching=prefix_caching)
    program = replace(program, config=config)
    lines: list[str] = [] if into is None else into

    def attach(scheduler: Any) -> None:
        if watch is not None:
            watch.append(scheduler)
        VllmEventLog(scheduler, lines.append)
        if seeded is not None:  # after the header: the log states what vLLM was configured for
            seeded(scheduler)

    EngineCoreLoop(
        program.config,
        async_scheduling=False,
        mutate=attach,
        speculative_tokens=K,
        speculative_method=method,
        draft_seed=seed,
        settings_034=replace(
            VLLM_034_DEFAULTS, cache_aware_window=window, cache_aware_threshold=0.0
        ),
    ).run(program)
    return lines


def checked_logs(
    write: Callable[[int, list[str]], object], seeds: Iterable[int], tally: Counter[str]
) -> Iterator[tuple[list[str], ArTraceResult]]:
    """Each seed's live log, as `write(seed, into)` writes it, with its verdict: a program
    vLLM or the loop refuses at start-up (`ConfigError`) is counted "refused" in `tally` and
    skipped; one stopped by an `EngineCoreViolation` (vLLM's known padding finding) is counted
    "stopped", and its log so far is checked."""
    for seed in seeds:
        lines: list[str] = []
        try:
            write(seed, lines)
        except ConfigError:
            tally["refused"] += 1
            continue
        except EngineCoreViolation:
            tally["stopped"] += 1
        yield lines, check_ar_trace(lines)


def tally_lookahead_logs(method: str, seeds: Iterable[int]) -> dict[str, int]:
    """For the by-hand runs of docs/engines/vllm.md: how many of the `seeds`' logs conform,
    how many programs vLLM or the loop refuses at start-up (`ConfigError`: a pool or a
    budget too small for the lookahead), how many stop at an `EngineCoreViolation` (vLLM's
    known padding assertion) with their logs so far conforming, and what the logs hold."""
    tally: Counter[str] = Counter()

    def write(seed: int, into: list[str]) -> None:
        lookahead_log(seed, method, into=into)

    for lines, result in checked_logs(write, seeds, tally):
        tally["conform" if result.ok else f"violation {result.violation}"] += 1
        for line in lines[1:]:
            event = json.loads(line)
            tally["drafted steps"] += event["kind"] == "ar_scheduled" and bool(event.get("drafts"))
            tally["preemptions"] += event["kind"] == "ar_preempted"
            tally["hits"] += event["kind"] == "ar_cache_hit"
    return dict(tally)


def tally_twin_verdicts(
    method: str,
    seeds: Iterable[int],
    *,
    prefix_caching: bool = True,
    seeded: Callable[[Any], None] | None = None,
) -> dict[str, int]:
    """For the by-hand runs of docs/engines/vllm.md: `check-trace LOG --twin vllm-v1[-prefix]`
    on each seed's log by `method` (`seeded`: a bug planted first), by exit code (0: conforms
    and decides alike; 1: a violation or a twin difference; 2: the twin refused); programs
    refused at start-up or stopped by the loop are counted apart."""
    tally: Counter[str] = Counter()
    twin = "vllm-v1-prefix" if prefix_caching else "vllm-v1"
    with tempfile.TemporaryDirectory() as folder:
        for seed in seeds:
            lines: list[str] = []
            try:
                lookahead_log(
                    seed, method, seeded=seeded, into=lines, prefix_caching=prefix_caching
                )
            except ConfigError:
                tally["refused"] += 1
                continue
            except EngineCoreViolation:
                tally["stopped"] += 1
                continue
            tally[f"exit {twin_agrees(lines, Path(folder), twin)[0]}"] += 1
    return dict(tally)


#: `core_program` seeds whose EAGLE logs (prefix caching on) the twin decides otherwise when
#: its cache keys leave out the token after each block (`--twin-as-declared`): 4 of the first
#: 40, these the first two.
LOOKAHEAD_KEYED_SEEDS = (3, 21)


def test_the_twin_keys_eagles_blocks_with_the_token_after_them(tmp_path: Path) -> None:
    """With EAGLE and prefix caching vLLM hashes each block with the token after it; the
    twin, rebuilt with the header's `hash_lookahead_tokens`, decides alike, and the same
    twin as it declares itself (keys of a block's own tokens) decides otherwise."""
    path = tmp_path / "log.jsonl"
    for seed in LOOKAHEAD_KEYED_SEEDS:
        path.write_text("".join(f"{line}\n" for line in lookahead_log(seed, "eagle")))
        code, said = check(str(path), "--twin", "vllm-v1-prefix")
        assert code == 0 and "(with hash_lookahead_tokens=1)" in said, said
        code, said = check(str(path), "--twin", "vllm-v1-prefix", "--twin-as-declared")
        assert code == 1 and "[twin_decisions]" in said, said


def blocks_past_the_step(lines: list[str]) -> int:
    """How many times, at a step's end, a request the step allocated blocks to holds more
    than its computed tokens (the step's included) fill: what only lookahead slots make.
    Without them vLLM allocates up to the step's last token. (Blocks a request kept after
    its drafts were rejected lie past its computed tokens too, but the step that next needs
    a block allocates exactly up to its last token again.)"""
    with ArTraceReader(lines) as reader:
        assert reader.header is not None
        config, policy = reader.header.config, reader.header.policy
        machine = ArSpecMachine(config, policy)
        allocated: set[str] = set()
        past = 0
        for _line, event in reader:
            machine.apply(event)
            if isinstance(event, ArBlocksAllocated):
                allocated.add(event.request_id)
            if isinstance(event, ArStepEnd):
                for rid, r in machine.state().requests.items():
                    needed = -(-r.num_computed // config.block_size)
                    past += rid in allocated and len(r.blocks) > needed
                allocated.clear()
    return past


@pytest.mark.parametrize("method", ["eagle", "draft_model"])
def test_a_live_log_with_lookahead_slots_conforms(method: str) -> None:
    tally: Counter[str] = Counter()
    for seed in SEEDS:
        watch: list[Any] = []
        lines = lookahead_log(seed, method, watch)
        assert watch[0].num_lookahead_tokens == K
        header = json.loads(lines[0])
        assert header["num_speculative_tokens"] == header["num_lookahead_tokens"] == K
        # a draft model's one input row per request (0 for EAGLE: the field is left out)
        assert header.get("num_drafting_slots", 0) == (1 if method == "draft_model" else 0)
        result = check_ar_trace(lines)
        assert result.ok, f"seed {seed}: {result.violation}"
        tally["past the step"] += blocks_past_the_step(lines)
        for line in lines[1:]:
            event = json.loads(line)
            tally[event["kind"]] += 1
            tally["drafted"] += event["kind"] == "ar_scheduled" and bool(event.get("drafts"))
    # the logs hold what lookahead changes: blocks past the step, drafts, hits and preemptions
    assert tally["past the step"] >= 20, tally
    assert tally["drafted"] >= 20 and tally["ar_drafts_verified"] == tally["drafted"], tally
    assert tally["ar_cache_hit"] >= 1 and tally["ar_preempted"] >= 1, tally


def test_eagle_hashes_blocks_with_the_token_after_them() -> None:
    """With EAGLE and prefix caching vLLM hashes each block with the token after it, on the
    scheduler and in the requests' own block hashes (the loop builds them as vLLM's engine
    core does): two prompts that share a block but not the token after it hash that block
    apart, so the second takes no hit on it (fewer hits than the spec allows, never more)."""
    watch: list[Any] = []
    lookahead_log(SEEDS[0], "eagle", watch)
    assert watch[0].num_hash_lookahead_tokens == 1
    v = load_vllm()
    config = core_program(SEEDS[0]).config.replace(enable_prefix_caching=True, block_size=2)
    loop = EngineCoreLoop(
        config, async_scheduling=False, speculative_tokens=K, speculative_method="eagle"
    )
    hasher = loop.impl.hasher  # what the loop's requests hash with
    plain = v.kv_utils.get_request_block_hasher(2, v.hashing.sha256, 0)

    def hashes(prompt: list[int], hash_blocks: Any) -> list[Any]:
        params = v.sampling.SamplingParams(max_tokens=1)
        request = v.request.Request("r", prompt, params, None, block_hasher=hash_blocks)
        return list(request.block_hashes)

    assert hashes([1, 2, 3, 4, 5], plain)[:1] == hashes([1, 2, 7, 8, 9], plain)[:1]
    assert hashes([1, 2, 3, 4, 5], hasher)[:1] != hashes([1, 2, 7, 8, 9], hasher)[:1]


@pytest.mark.parametrize("method", ["eagle", "draft_model"])
def test_beside_the_cache_aware_window_too(method: str) -> None:
    """vLLM 0.34.0's cache-aware window ranks waiting requests by their hits. A draft model
    hashes blocks as without drafts. EAGLE's hashes also cover the token after each block,
    which the header declares (`hash_lookahead_tokens`), and the spec's order then ranks by
    such keys: both drafters' logs declare the window and keep the spec's order (shared
    prompts: hits among the waiting; a review found `fcfs_admission` reported on
    shared-prompt seeds 18 and 62 before the spec modelled the keys). On 0.33.0, which has
    no window, the loop refuses it, naming the release."""
    if not has_the_setting():
        with pytest.raises(ConfigError, match=r"new in vLLM 0\.34\.0"):
            lookahead_log(0, method, window=3)
        return
    hits = 0
    for seed in (*SHARED_SEEDS, 62):
        lines = lookahead_log(seed, method, window=3, programs=shared_prompt_program)
        header = json.loads(lines[0])
        assert header["declared_policy"]["cache_aware_window"] == 3, seed
        ahead = header["declared_policy"].get("hash_lookahead_tokens", 0)
        assert ahead == (1 if method == "eagle" else 0), seed
        result = check_ar_trace(lines)
        assert result.ok, f"seed {seed}: {result.violation}"
        hits += sum(json.loads(line)["kind"] == "ar_cache_hit" for line in lines[1:])
    assert hits >= 10, hits


def test_requests_hashed_without_the_lookahead_token_are_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seeded bug, the loop's own until 2026-12-07: the requests' block hasher built
    without the lookahead token while the scheduler declares it. vLLM then takes hits on
    blocks whose next token differs (its drafter's KV there is wrong), and the check says
    `cache_hit_cached` (or, where the window ranks them, the order)."""
    v = load_vllm()
    real = v.kv_utils.get_request_block_hasher

    def without_lookahead(block_size: int, hash_fn: Any, _ahead: int = 0) -> Any:
        return real(block_size, hash_fn, 0)

    monkeypatch.setattr(v.kv_utils, "get_request_block_hasher", without_lookahead)
    caught: Counter[str] = Counter()
    for seed in range(24):
        lines: list[str] = []
        try:
            lookahead_log(seed, "eagle", programs=shared_prompt_program, into=lines)
        except ConfigError:
            continue  # a pool or budget too small for the lookahead
        except EngineCoreViolation:
            caught["loop stopped"] += 1
        result = check_ar_trace(lines)
        if not result.ok:
            assert result.violation is not None
            assert result.violation.rule in {"cache_hit_cached", "fcfs_admission"}, str(
                result.violation
            )
            caught[str(result.violation.rule)] += 1
    assert caught["cache_hit_cached"] >= 2, caught


def test_without_lookahead_no_block_lies_past_the_step() -> None:
    """The count above sees lookahead slots and nothing else: ngram's logs of the same
    programs (drafts, rejections and all) have none."""
    for seed in SEEDS:
        lines = lookahead_log(seed, "ngram")
        assert check_ar_trace(lines).ok
        assert blocks_past_the_step(lines) == 0, seed


def uncap_lookahead(scheduler: Any) -> None:
    """A seeded bug: `scheduler`'s `allocate_slots` without its cap at `max_model_len` (it
    reserves every lookahead slot, past the model's length)."""
    manager = scheduler.kv_cache_manager
    allocate = manager.allocate_slots

    def uncapped(*args: Any, **kwargs: Any) -> Any:
        cap = manager.max_model_len
        manager.max_model_len = cap + kwargs.get("num_lookahead_tokens", 0)
        try:
            return allocate(*args, **kwargs)
        finally:
            manager.max_model_len = cap

    manager.allocate_slots = uncapped


def lookahead_times(factor: int) -> Callable[[Any], None]:
    """A seeded bug: the scheduler's `allocate_slots` reserves `factor` times the lookahead
    slots (within `max_model_len`): none with 0, so the drafter writes KV into slots it was
    never given; twice with 2, holding blocks no forward writes."""

    def seed(scheduler: Any) -> None:
        manager = scheduler.kv_cache_manager
        allocate = manager.allocate_slots

        def scaled(*args: Any, **kwargs: Any) -> Any:
            ahead = kwargs.get("num_lookahead_tokens", 0)
            return allocate(*args, **{**kwargs, "num_lookahead_tokens": factor * ahead})

        manager.allocate_slots = scaled

    return seed


class Overriding:
    """`inner` with some attributes read as `overrides` say."""

    def __init__(self, inner: Any, **overrides: Any) -> None:
        self._inner = inner
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._inner, name)


def with_speculative(**overrides: Any) -> Callable[[Any], None]:
    """A change that gives the scheduler's speculative config `overrides` (a seeded bug, or a
    drafter no loop here drives)."""

    def change(scheduler: Any) -> None:
        config = scheduler.vllm_config
        speculative = Overriding(config.speculative_config, **overrides)
        scheduler.vllm_config = Overriding(config, speculative_config=speculative)

    return change


#: A seeded bug: `schedule` charges no input row for the drafter (a draft model's one per
#: request), so a step's tokens and drafting rows overrun the batch.
uncharged_drafting_rows = with_speculative(max_num_new_slots_for_drafting=0)


@pytest.mark.parametrize(
    ("bug", "method", "rule"),
    [
        (uncap_lookahead, "eagle", "kv_bounded"),
        (lookahead_times(0), "eagle", "kv_covers_scheduled"),
        (lookahead_times(0), "draft_model", "kv_covers_scheduled"),
        (lookahead_times(2), "eagle", "kv_bounded"),
        (uncharged_drafting_rows, "draft_model", "token_budget"),
    ],
    ids=[
        "lookahead-past-max-model-len",
        "no-lookahead",
        "no-lookahead-draft",
        "lookahead-doubled",
        "rows-uncharged",
    ],
)
def test_a_seeded_drafter_bug_is_caught(bug: Callable[[Any], None], method: str, rule: str) -> None:
    """Under each seeded bug the log shows what vLLM did, and the check names the rule it
    breaks on at least half the programs (a program whose steps never reach the bug conforms:
    a request that never decodes, a budget never full)."""
    caught: Counter[str] = Counter()
    for seed in SEEDS:
        lines: list[str] = []
        try:
            lookahead_log(seed, method, seeded=bug, into=lines)
        except EngineCoreViolation:
            # the loop's own checks may stop it (a pool the uncapped slots never fit admits
            # nothing again: `progress`); what is checked here is the log written till then
            caught["loop stopped"] += 1
        result = check_ar_trace(lines)
        if not result.ok:
            assert result.violation is not None
            assert result.violation.rule == rule, str(result.violation)
            caught[rule] += 1
    assert caught[rule] >= len(SEEDS) // 2, caught
