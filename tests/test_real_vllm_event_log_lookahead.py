"""The live `VllmEventLog` with a drafter that reserves lookahead slots (EAGLE, a draft model).

vLLM's `allocate_slots` gives a request with EAGLE or a draft model `num_lookahead_tokens` (k)
KV slots past the tokens the step computes, capped at `max_model_len`, for the drafter's own
KV. In the log they are blocks past the step's tokens, which the spec's block rules allow
(`kv_covers_scheduled` bounds a request's blocks from below, `kv_bounded` by `max_model_len`).
With prefix caching vLLM 0.33.0 and 0.34.0 hash each block with the token after it
(`num_hash_lookahead_tokens` = 1), so they cache a block one token later than the spec may
assume: fewer hits than the spec allows, never more.

Until 2026-12-07 the log refused these drafters; a multi-module MTP drafter (a prefill
lookahead past one token: it shortens prefill chunks) is still refused
(`test_real_vllm_event_log_limits`).

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreProgram, EngineCoreLoop, core_program
from integrations.vllm.event_log import VllmEventLog
from integrations.vllm.settings_034 import VLLM_034_DEFAULTS
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from properties.ar.trace_check import check_ar_trace
from spec.ar.events import ArBlocksAllocated, ArStepEnd
from spec.ar.machine import ArSpecMachine
from spec.ar.trace import ArTraceReader
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.test_real_vllm_cache_aware import has_the_setting

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
) -> list[str]:
    """The live log of the engine-core loop serving `programs(seed)` with prefix caching and
    K drafts by `method`; `watch` receives the scheduler; `window` > 0 serves vLLM 0.34.0's
    cache-aware admission window (threshold 0: every hit ranks); `seeded` is applied to the
    scheduler (a seeded bug); the log's lines go to `into` (when given: kept if the loop
    raises) and are returned."""
    program = programs(seed)
    program = replace(program, config=program.config.replace(enable_prefix_caching=True))
    lines: list[str] = [] if into is None else into

    def attach(scheduler: Any) -> None:
        if watch is not None:
            watch.append(scheduler)
        if seeded is not None:
            seeded(scheduler)
        VllmEventLog(scheduler, lines.append)

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
        assert json.loads(lines[0])["num_speculative_tokens"] == K
        result = check_ar_trace(lines)
        assert result.ok, f"seed {seed}: {result.violation}"
        tally["past the step"] += blocks_past_the_step(lines)
        for line in lines[1:]:
            event = json.loads(line)
            tally[event["kind"]] += 1
            tally["drafted"] += bool(event.get("drafts"))
    # the logs hold what lookahead changes: blocks past the step, drafts, hits and preemptions
    assert tally["past the step"] >= 20, tally
    assert tally["drafted"] >= 20 and tally["ar_drafts_verified"] == tally["drafted"], tally
    assert tally["ar_cache_hit"] >= 1 and tally["ar_preempted"] >= 1, tally


def test_eagle_hashes_blocks_with_the_token_after_them() -> None:
    """The lookahead hashes are on in these runs (vLLM 0.33.0 and 0.34.0), so the conforming
    logs above include them; without prefix caching vLLM leaves them off."""
    watch: list[Any] = []
    lookahead_log(SEEDS[0], "eagle", watch)
    assert watch[0].num_hash_lookahead_tokens == 1


@pytest.mark.parametrize("method", ["eagle", "draft_model"])
def test_beside_the_cache_aware_window_too(method: str) -> None:
    """vLLM 0.34.0's cache-aware window ranks waiting requests by their hits, which lookahead
    hashes make a block shorter until the token after a block is known; the log declares the
    window and the spec's order holds (shared prompts: hits among the waiting). On 0.33.0,
    which has no window, the loop refuses it, naming the release."""
    if not has_the_setting():
        with pytest.raises(ConfigError, match=r"new in vLLM 0\.34\.0"):
            lookahead_log(0, method, window=3)
        return
    hits = 0
    for seed in SHARED_SEEDS:
        lines = lookahead_log(seed, method, window=3, programs=shared_prompt_program)
        assert json.loads(lines[0])["declared_policy"]["cache_aware_window"] == 3, seed
        result = check_ar_trace(lines)
        assert result.ok, f"seed {seed}: {result.violation}"
        hits += sum(json.loads(line)["kind"] == "ar_cache_hit" for line in lines[1:])
    assert hits >= 10, hits


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


def test_lookahead_slots_past_max_model_len_are_caught() -> None:
    """Under `uncap_lookahead` the log shows the blocks past `max_model_len`, and the check
    says `kv_bounded`."""
    caught: Counter[str] = Counter()
    for seed in SEEDS:
        lines: list[str] = []
        try:
            lookahead_log(seed, "eagle", seeded=uncap_lookahead, into=lines)
        except EngineCoreViolation:
            # the loop's own checks may stop it (a pool the uncapped slots never fit admits
            # nothing again: `progress`); what is checked here is the log written till then
            caught["loop stopped"] += 1
        result = check_ar_trace(lines)
        if not result.ok:
            assert result.violation is not None
            assert result.violation.rule == "kv_bounded", str(result.violation)
            caught["kv_bounded"] += 1
    assert caught["kv_bounded"] >= len(SEEDS) // 2, caught
