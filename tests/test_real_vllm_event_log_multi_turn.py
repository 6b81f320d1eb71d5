"""The live `VllmEventLog` on a conversation's next turn: prompts that continue an earlier
request's prompt and outputs (`integrations.vllm.multi_turn_programs`).

vLLM hashes the output tokens of a request into its block hashes, so the next turn hits the
blocks holding the earlier turn's outputs. With prefix caching the log names every output's id
(`ArOutputTokens`, after the step and its `ArDraftsVerified`), and the spec keys those blocks
by them. Before the event the check reported `cache_hit_cached` on such hits: the same logs
without the names still do, here. The adapter (`RealVllmScheduler`) names them too.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.adapter import SPACE, SPACE_PREFIX, RealVllmScheduler
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import EngineCoreLoop
from integrations.vllm.event_log import VllmEventLog
from integrations.vllm.multi_turn_programs import NEXT_TURN, gap_steps, multi_turn_program
from integrations.vllm.token_ids import (
    GREEDY_ANSWERS,
    branch_token,
    output_token_id,
    prompt_stream,
    stop_token_id,
)
from properties.ar.trace_check import ArTraceResult, check_ar_trace
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArDraftsVerified, ArEvent, ArOutputTokens
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.test_real_vllm_event_log_lookahead import checked_logs

#: Programs in which a next turn hits blocks holding its earlier turn's outputs, with any
#: drafter or none (`hits_past_the_earlier_prompt` over seeds 0-59 finds 15 without drafts,
#: 11 with ngram's, 6 with EAGLE's and with a draft model's; in each, without the names the log
#: fails `cache_hit_cached`, and in no other).
SEEDS = (3, 16, 41, 43, 49)
#: With EAGLE's lookahead hashes, programs whose next turn hits only the block before the
#: outputs, whose key covers the first of them: without the names the log fails too.
BLOCK_BEFORE = (8, 23)


@pytest.fixture(autouse=True)
def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def next_turn_log(
    seed: int,
    method: str | None = None,
    log_class: Callable[[Any, Callable[[str], object]], object] = VllmEventLog,
    into: list[str] | None = None,
    *,
    greedy: bool = False,
) -> list[str]:
    """The live log of the engine-core loop serving `multi_turn_program(seed, greedy=greedy)`
    (with `greedy`, its model sampling greedily), with 3 drafts by `method` when given;
    `log_class` writes it (a seeded writer bug); its lines go to `into` (when given: kept if
    the loop raises) and are returned."""
    program = multi_turn_program(seed, greedy=greedy)
    lines: list[str] = [] if into is None else into

    def attach(scheduler: Any) -> None:
        log_class(scheduler, lines.append)

    drafts: dict[str, Any] = (
        {"speculative_tokens": 3, "speculative_method": method, "draft_seed": seed}
        if method
        else {}
    )
    EngineCoreLoop(
        program.config,
        async_scheduling=False,
        mutate=attach,
        greedy_outputs=greedy,
        **drafts,
    ).run(program)
    return lines


def hits_past_the_earlier_prompt(lines: list[str]) -> int:
    """Next turns whose first admission hits past the earlier turn's prompt, into blocks
    holding its outputs (not a preempted turn taking back its own blocks)."""
    block_size = json.loads(lines[0])["block_size"]
    prompts: dict[str, int] = {}
    preempted: set[str] = set()
    past = 0
    for line in lines[1:]:
        event = json.loads(line)
        if event["kind"] == "ar_submitted":
            prompts[event["request_id"]] = event["prompt_len"]
        rid = event.get("request_id", "")
        if event["kind"] == "ar_preempted":
            preempted.add(rid)
        if event["kind"] == "ar_cache_hit" and rid.endswith(NEXT_TURN) and rid not in preempted:
            earlier = prompts[rid[: -len(NEXT_TURN)]]
            past += len(event["blocks"]) * block_size > earlier
    return past


def tally_next_turn_logs(method: str | None, seeds: Iterable[int]) -> dict[str, int]:
    """For the by-hand runs of docs/engines/vllm.md: over the `seeds`' logs, how many conform,
    how many programs vLLM or the loop refuses at start-up (`ConfigError`), how many stop at
    an `EngineCoreViolation` (vLLM's known padding finding: its assertion, or a stall) with
    their logs so far checked too, how many have a next turn hitting past its earlier prompt,
    and how many fail without their `ar_output_tokens` lines (by rule)."""
    tally: Counter[str] = Counter()

    def write(seed: int, into: list[str]) -> None:
        next_turn_log(seed, method, into=into)

    for lines, result in checked_logs(write, seeds, tally):
        found = result.violation
        tally["conform" if found is None else f"violation: {found.rule}"] += 1
        tally["logs with a hit past the earlier prompt"] += hits_past_the_earlier_prompt(lines) > 0
        before = check_ar_trace(unnamed(lines)).violation
        if before is not None:
            tally[f"unnamed: {before.rule}"] += 1
    return dict(tally)


def unnamed(lines: list[str]) -> list[str]:
    """The log without its `ar_output_tokens` lines: what the log was before the event."""
    return [line for line in lines if '"ar_output_tokens"' not in line]


def test_the_program_sends_each_next_turn_after_the_first_turns() -> None:
    """After `gap_steps` steps with no arrival, one next turn per request not aborted: the
    earlier prompt, then the outputs the scripted model samples for it (its stop token at
    `stop_after`), then tokens of its own (`branch_token`), within `max_model_len`."""
    for seed in SEEDS:
        program = multi_turn_program(seed)
        gap = gap_steps(program.config)
        first = [r for batch in program.arrivals[: -1 - gap] for r in batch]
        aborted = {rid for batch in program.aborts for rid in batch}
        assert program.config.enable_prefix_caching
        assert all(batch == () for batch in program.arrivals[-1 - gap : -1])
        assert all(r.prompt is not None for r in first)
        turns = program.arrivals[-1]
        kept = [(n, r) for n, r in enumerate(first) if r.request_id not in aborted]
        assert [r.request_id + NEXT_TURN for _, r in kept] == [t.request_id for t in turns]
        for m, ((arrival, earlier), turn) in enumerate(zip(kept, turns, strict=True)):
            assert earlier.prompt is not None and turn.prompt is not None
            outputs = [
                stop_token_id(arrival) if i == earlier.stop_after else output_token_id(arrival, i)
                for i in range(1, earlier.final_output + 1)
            ]
            own = [branch_token(len(first) + m, i) for i in range(4)]
            talk = (*earlier.prompt, *outputs, *own)
            assert turn.prompt == talk[: turn.prompt_len], (seed, turn)
            assert turn.prompt_len > len(earlier.prompt) or turn.prompt_len == (
                program.config.max_model_len - turn.max_tokens
            )
            assert turn.prompt_len + turn.max_tokens <= program.config.max_model_len


@pytest.mark.parametrize("method", [None, "ngram", "eagle", "draft_model"])
def test_next_turns_conform_and_hit_the_named_outputs(method: str | None) -> None:
    """Every log conforms, names outputs, and a next turn hits past its earlier turn's prompt
    (with EAGLE, in BLOCK_BEFORE, the block before it); without the names, the same log fails
    `cache_hit_cached` (the false violation before the event)."""
    seeds = SEEDS + (BLOCK_BEFORE if method == "eagle" else ())
    for seed in seeds:
        lines = next_turn_log(seed, method)
        result = check_ar_trace(lines)
        assert result.ok, (seed, method, str(result.violation))
        assert sum('"ar_output_tokens"' in line for line in lines) >= 1, seed
        assert hits_past_the_earlier_prompt(lines) >= (seed not in BLOCK_BEFORE), seed
        before = check_ar_trace(unnamed(lines))
        assert before.violation is not None, (seed, method)
        assert before.violation.rule == "cache_hit_cached", (seed, str(before.violation))
        # a next turn's hit, on the blocks holding its earlier turn's private outputs
        assert re.match(r"\[cache_hit_cached\] 'r\d+\.2' claims block", str(before.violation))


class ShiftedIds(VllmEventLog):
    """Seeded writer bug: each named id is one past vLLM's."""

    def _emit(self, event: ArEvent) -> None:
        if isinstance(event, ArOutputTokens):
            event = ArOutputTokens(event.request_id, tuple(t + 1 for t in event.tokens))
        super()._emit(event)


class NamedTwice(VllmEventLog):
    """Seeded writer bug: every naming written twice."""

    def _emit(self, event: ArEvent) -> None:
        super()._emit(event)
        if isinstance(event, ArOutputTokens):
            super()._emit(event)


class NamedBeforeVerified(VllmEventLog):
    """Seeded writer bug: a drafted request's outputs named before its drafts are verified."""

    _held: ArDraftsVerified | None = None

    def _emit(self, event: ArEvent) -> None:
        if isinstance(event, ArDraftsVerified):
            self._held = event
            return
        super()._emit(event)
        if self._held is not None:
            held, self._held = self._held, None
            super()._emit(held)


def first_violations(
    log_class: Callable[[Any, Callable[[str], object]], object], method: str | None = None
) -> list[ArTraceResult]:
    """The failing verdicts over SEEDS of logs written by `log_class`."""
    results = [check_ar_trace(next_turn_log(seed, method, log_class)) for seed in SEEDS]
    return [r for r in results if not r.ok]


@pytest.mark.parametrize(
    ("log_class", "method", "rule", "says", "at_least"),
    [
        (ShiftedIds, None, "cache_hit_cached", "caches other content", len(SEEDS)),
        (NamedTwice, None, "output_tokens", "but has produced", len(SEEDS)),
        (NamedBeforeVerified, "ngram", "output_tokens", "were verified", len(SEEDS)),
    ],
)
def test_a_seeded_writer_bug_is_caught(
    log_class: Callable[[Any, Callable[[str], object]], object],
    method: str | None,
    rule: str,
    says: str,
    at_least: int,
) -> None:
    failed = first_violations(log_class, method)
    assert len(failed) >= at_least, [str(r.violation) for r in failed]
    for result in failed:
        assert result.violation is not None
        assert result.violation.rule == rule, str(result.violation)
        assert says in str(result.violation), str(result.violation)


def test_the_adapter_names_the_outputs_it_samples() -> None:
    """`RealVllmScheduler.step` names each step's sampled output with prefix caching (the ids
    its model fabricates), and nothing without it."""
    for caching in (True, False):
        events: list[ArEvent] = []
        config = ArConfig(max_model_len=16).replace(enable_prefix_caching=caching)
        impl = RealVllmScheduler(config, events.append, SPACE_PREFIX if caching else SPACE)
        impl.submit(ArRequest("a", 3, 4, prompt=(5, 6, 7)))
        impl.drain()
        named = [t for e in events if isinstance(e, ArOutputTokens) for t in e.tokens]
        expected = [output_token_id(0, i) for i in range(1, 5)] if caching else []
        assert named == expected, events


def declaring_longest(scheduler: Any, write: Callable[[str], object]) -> VllmEventLog:
    """The log, declaring `longest_cache_hit`."""
    return VllmEventLog(scheduler, write, longest_cache_hit=True)


@pytest.mark.parametrize("method", [None, "eagle"])
def test_every_hit_is_the_longest_cached_prefix(method: str | None) -> None:
    """Declared (`VllmEventLog(..., longest_cache_hit=True)`), every admission's hit is the
    longest run of cached blocks holding its prefix, with EAGLE's lookahead hashes too."""
    for seed in SEEDS + (BLOCK_BEFORE if method == "eagle" else ()):
        lines = next_turn_log(seed, method, declaring_longest)
        assert json.loads(lines[0])["declared_policy"]["longest_cache_hit"] is True
        result = check_ar_trace(lines)
        assert result.ok, (seed, method, str(result.violation))


class OutputsUnhashed(VllmEventLog):
    """Seeded vLLM bug, planted in each request's block hasher as it is added: a block that
    holds an output token gets no hash, so nothing is ever cached past a prompt."""

    #: whether a block holding an output is hashed (without its parent's hash) or not at all
    parentless = False

    def _add_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        v = self._v
        block_size = self.config.block_size
        parentless = self.parentless

        def hasher(req: Any) -> list[Any]:
            hashes: list[Any] = []
            start = len(req.block_hashes) * block_size
            parent = req.block_hashes[-1] if req.block_hashes else None
            end = req.num_tokens if parentless else min(req.num_tokens, req.num_prompt_tokens)
            while start + block_size <= end:
                tokens = list(req.all_token_ids[start : start + block_size])
                if start + block_size > req.num_prompt_tokens:  # it holds an output
                    parent = None
                parent = v.kv_utils.hash_block_tokens(v.hashing.sha256, parent, tokens, None)
                hashes.append(parent)
                start += block_size
            return hashes

        request._block_hasher = hasher
        return super()._add_request(request, *args, **kwargs)


class OutputsParentless(OutputsUnhashed):
    """Seeded vLLM bug: a block that holds an output token is hashed without its parent's hash,
    so equal outputs after different prompts share a hash."""

    parentless = True


def test_a_prefix_cache_that_misses_is_caught_only_where_declared() -> None:
    """vLLM with output blocks unhashed serves next turns no hit past their earlier prompt:
    every hit it takes is cached content, so the log conforms as before; declaring
    `longest_cache_hit`, it fails `cache_hit_longest` at a next turn's admission wherever
    the earlier turn's output blocks outlive it (vLLM reuses the blocks it does not count
    cached first, so in seeds 41 and 43 they do not)."""
    caught = 0
    for seed in SEEDS:
        assert check_ar_trace(next_turn_log(seed, None, OutputsUnhashed)).ok, seed
        declared = functools.partial(OutputsUnhashed, longest_cache_hit=True)
        found = check_ar_trace(next_turn_log(seed, None, declared)).violation
        if found is not None:
            assert found.rule == "cache_hit_longest", str(found)
            assert re.match(r"\[cache_hit_longest\] 'r\d+\.2' was admitted with ", str(found))
            caught += 1
    assert caught >= 3, caught


def test_next_turns_decide_as_the_twin_which_replays_the_named_outputs(tmp_path: Path) -> None:
    """`check-trace --twin vllm-v1-prefix` replays a next turn's hit on the earlier turn's
    output blocks: the twin samples the outputs the log names and keys them so (until the
    tenth session of 2026-12-07 it refused such a log, exit 2). Released vLLM decides alike
    on every program;
    vLLM with output blocks unhashed (`OutputsUnhashed`) takes no such hit, and the twin
    differs on every program, even where the undeclared log conforms and the declared
    `longest_cache_hit` misses it (seeds 41 and 43)."""
    from tests.test_twin_settings import check

    for seed in SEEDS:
        for log_class, expected in ((VllmEventLog, 0), (OutputsUnhashed, 1)):
            log = tmp_path / f"{seed}-{expected}.jsonl"
            log.write_text("".join(f"{line}\n" for line in next_turn_log(seed, None, log_class)))
            code, said = check(str(log), "--twin", "vllm-v1-prefix")
            assert code == expected, (seed, said)


def test_a_salted_request_is_refused_where_longest_is_declared() -> None:
    """A salted request's blocks hash apart from the same tokens': under `longest_cache_hit`
    the log refuses it before vLLM sees it, naming the field; undeclared, it is logged. (A
    LoRA request's adapter is declared and keyed: tests/test_real_vllm_event_log_lora.py.)"""

    class Salting(VllmEventLog):
        def _add_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            request.cache_salt = "tenant-1"
            return super()._add_request(request, *args, **kwargs)

    with pytest.raises(ConfigError, match=r"invalid cache_salt=.*None while the log declares"):
        next_turn_log(SEEDS[0], None, functools.partial(Salting, longest_cache_hit=True))
    assert check_ar_trace(next_turn_log(SEEDS[0], None, Salting)).ok


def test_an_empty_salt_is_no_salt() -> None:
    """vLLM keys no empty `cache_salt`: declared, such a request is logged and checked."""

    class EmptySalt(VllmEventLog):
        def _add_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            request.cache_salt = ""
            return super()._add_request(request, *args, **kwargs)

    lines = next_turn_log(SEEDS[0], None, functools.partial(EmptySalt, longest_cache_hit=True))
    assert check_ar_trace(lines).ok


def test_the_longest_hit_is_refused_beside_eagles_block_drop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With `disable_lookahead_block_hashes` vLLM's EAGLE drops the last block of every hit, by
    design: declaring `longest_cache_hit` there is refused, naming it (a review found 11 of 17
    such logs failing `cache_hit_longest` before); undeclared, the logs conform."""
    built = RealVllmScheduler._speculative_config

    def dropping(self: RealVllmScheduler, model_config: Any) -> Any:
        config = built(self, model_config)
        if config is not None:
            config.disable_lookahead_block_hashes = True
        return config

    monkeypatch.setattr(RealVllmScheduler, "_speculative_config", dropping)
    with pytest.raises(ConfigError, match="invalid longest_cache_hit=True: False beside an EAGLE"):
        next_turn_log(SEEDS[0], "eagle", declaring_longest)
    for seed in SEEDS:
        result = check_ar_trace(next_turn_log(seed, "eagle"))
        assert result.ok, (seed, str(result.violation))


def test_a_greedy_model_samples_equal_outputs_for_equal_prompts() -> None:
    """`greedy_outputs`: two requests with one prompt sample the same outputs (each its own
    stop token), a third with another prompt samples one of `GREEDY_ANSWERS` streams; a
    grammar or a session, which number outputs by arrival, is refused with it."""
    config = ArConfig(max_model_len=16).replace(enable_prefix_caching=True)
    events: list[ArEvent] = []
    impl = RealVllmScheduler(config, events.append, SPACE_PREFIX, greedy_outputs=True)
    for rid, prompt in (("a", (5, 6, 7)), ("b", (5, 6, 7)), ("c", (5, 6, 8))):
        impl.submit(ArRequest(rid, 3, 3, prompt=prompt))
    impl.drain()
    named: dict[str, list[int]] = {}
    for e in events:
        if isinstance(e, ArOutputTokens):
            named.setdefault(e.request_id, []).extend(e.tokens)
    stream = prompt_stream((5, 6, 7))
    assert named["a"] == named["b"] == [output_token_id(stream, i) for i in (1, 2, 3)]
    assert named["c"] == [output_token_id(prompt_stream((5, 6, 8)), i) for i in (1, 2, 3)]
    assert 0 <= stream < GREEDY_ANSWERS
    with pytest.raises(ConfigError, match="greedy_outputs"):
        RealVllmScheduler(config, events.append, SPACE_PREFIX, greedy_outputs=True,
                          structured_output=True)  # fmt: skip
    with pytest.raises(ConfigError, match="greedy_outputs"):
        impl.submit(ArRequest("s", 3, 3, prompt=(1, 2, 3)), resumable=True)


def test_greedy_next_turns_share_blocks_across_conversations() -> None:
    """With a greedy model (a third of the first turns repeat a prompt, and a few answers),
    next turns hit blocks holding other requests' outputs, and every log conforms with the
    longest hit declared, with or without drafts."""
    repeated = 0
    for seed in SEEDS:
        program = multi_turn_program(seed, greedy=True)
        prompts = [r.prompt for batch in program.arrivals[:-1] for r in batch]
        repeated += len(prompts) - len(set(prompts))
        plain = multi_turn_program(seed)  # the same program but for the repeats and outputs
        assert len(program.arrivals) == len(plain.arrivals)
    assert repeated >= 3, repeated
    crossed = 0
    for method in (None, "ngram"):
        for seed in SEEDS:
            lines = next_turn_log(seed, method, declaring_longest, greedy=True)
            result = check_ar_trace(lines)
            assert result.ok, (seed, method, str(result.violation))
            crossed += hits_past_the_earlier_prompt(lines)
    assert crossed >= len(SEEDS), crossed


def test_a_parentless_output_hash_is_caught_on_greedy_next_turns() -> None:
    """vLLM hashing a block that holds outputs without its parent's hash lets equal outputs
    after different prompts share a key, and a next turn misses the earlier turn's output
    blocks (their keys are not its prompt's). On greedy programs the log, declaring the
    longest hit, or the loop's own check (`cache_hit_written`: a hit on another prompt's
    outputs) catches it: on 12 of seeds 0-39, these the first 8."""
    declared = functools.partial(OutputsParentless, longest_cache_hit=True)
    for seed in (3, 11, 14, 16, 17, 18, 21, 22):
        try:
            found = check_ar_trace(next_turn_log(seed, None, declared, greedy=True)).violation
        except EngineCoreViolation as err:
            assert "cache_hit_written" in str(err), (seed, str(err))
            continue
        assert found is not None and found.rule == "cache_hit_longest", (seed, str(found))
