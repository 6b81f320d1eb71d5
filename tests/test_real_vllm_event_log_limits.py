"""What the live `VllmEventLog` refuses, and a request vLLM ends inside `update_from_output`.

A vLLM maintainer's review (2026-12-07) found two ways the log described something vLLM did
not do:

- Attached to a scheduler whose KV cache has a sliding-window group first (vLLM orders groups
  by the first layer's type, so a Gemma-3-like model gets one), the log showed the window's
  frees of a running request's leading blocks as frees of its computed tokens, and the check
  reported `kv_covers_computed`; with full attention first, other groups' recycling gave
  `evict_unreferenced_only`. A KV connector (loads into waiting requests, late frees) and
  speculative decoding (rejected drafts lower the computed tokens) have no AR events either.
  Attaching to any of these is now a `ConfigError` naming the setting.
- A request vLLM ends with `FINISHED_ERROR` inside `update_from_output` (a grammar that failed
  to compile: vLLM calls `finish_requests` from there) had its blocks logged freed twice, the
  nested call's frees and then the outer call's, and the check said `free_owned_only`.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.adapter import RealVllmScheduler
from integrations.vllm.engine_core import EngineCoreLoop, core_program
from integrations.vllm.event_log import VllmEventLog
from integrations.vllm.sessions import session_program
from properties.ar.trace_check import check_ar_trace
from spec.ar.config import ArConfig, ArRequest
from spec.errors import ConfigError
from tests.engine_gate import require_engine


@pytest.fixture(autouse=True)
def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"sliding_window": 4}, "kv_cache_groups"),
        ({"kv_connector": "recompute"}, "kv_connector"),
        ({"speculative_tokens": 2}, "num_speculative_tokens"),
    ],
)
def test_the_log_refuses_a_scheduler_it_cannot_describe(
    options: dict[str, Any], field: str
) -> None:
    program = core_program(0)
    lines: list[str] = []

    def attach(scheduler: Any) -> None:
        VllmEventLog(scheduler, lines.append)

    with pytest.raises(ConfigError) as caught:
        EngineCoreLoop(
            program.config,
            async_scheduling=False,
            mutate=attach,
            **options,
        ).run(program)
    assert caught.value.field == field, str(caught.value)
    assert lines == []  # not even a header: nothing that a check could misread


def test_the_log_refuses_a_streaming_input_session() -> None:
    """A session re-adds its request id each turn and keeps its KV between turns: the log
    used to fail `unique_submission` on it; now the session's request is refused, naming
    `resumable`, before vLLM sees it."""
    program = session_program(0)
    lines: list[str] = []

    def attach(scheduler: Any) -> None:
        VllmEventLog(scheduler, lines.append)

    with pytest.raises(ConfigError) as caught:
        EngineCoreLoop(program.config, async_scheduling=False, mutate=attach).run(program)
    assert caught.value.field == "resumable", str(caught.value)
    assert check_ar_trace(lines).ok  # what was written before the refusal conforms


def test_a_request_vllm_ends_inside_update_from_output_is_logged_once() -> None:
    config = ArConfig(block_size=2, num_blocks=12, max_num_batched_tokens=8, max_model_len=16)
    adapter = RealVllmScheduler(config, lambda e: None)
    lines: list[str] = []
    VllmEventLog(adapter.sched, lines.append)
    adapter.submit(ArRequest("r0", 5, 6))
    adapter.submit(ArRequest("r1", 3, 6))
    adapter.step()
    adapter.step()
    adapter.sched.grammar_compile_error_reqs = {"r0": "the grammar failed to compile"}
    # the adapter's own events have no name for FINISHED_ERROR; the log, written first, does
    with pytest.raises(ConfigError, match="finish_reason"):
        adapter.step()
    frees = [json.loads(line) for line in lines if '"ar_blocks_freed"' in line]
    assert [f["request_id"] for f in frees] == ["r0"], lines
    assert json.loads(lines[-1]) == {"kind": "ar_aborted", "request_id": "r0"}, lines
    result = check_ar_trace(lines)
    assert result.ok, str(result.violation)


@pytest.mark.parametrize("mode", ["keep", "wait"])
def test_a_live_log_with_pauses_and_cache_resets_conforms(mode: str) -> None:
    """vLLM's engine-core loop pausing now and then in `mode` (`integrations.vllm.pauses`),
    clearing the caches once idle and resuming, prefix caching on. Before `ArPauseSet` and the
    reset's `ArPreempted(reset=True)` such logs failed `progress` (a paused step schedules
    nothing) and, in "keep" (running requests preempted by the reset), the admission rules;
    without `ArCacheReset` a hit on KV cached before the reset conformed."""
    kinds: Counter[str] = Counter()
    for seed in range(8):
        program = core_program(seed)
        program = replace(program, config=program.config.replace(enable_prefix_caching=True))
        lines: list[str] = []

        def attach(scheduler: Any, lines: list[str] = lines) -> None:
            VllmEventLog(scheduler, lines.append)

        EngineCoreLoop(program.config, async_scheduling=False, mutate=attach, pauses=mode).run(
            program
        )
        result = check_ar_trace(lines)
        assert result.ok, f"seed {seed}: {result.violation}"
        for line in lines[1:]:
            event = json.loads(line)
            if event["kind"] == "ar_pause_set":
                kinds[event["state"]] += 1
            elif event["kind"] == "ar_preempted" and event.get("reset"):
                kinds["reset"] += 1
            elif event["kind"] == "ar_cache_reset":
                kinds["cache_reset"] += 1
    paused = "paused_all" if mode == "keep" else "paused_new"
    assert kinds[paused] >= 1 and kinds["unpaused"] >= 1 and kinds["cache_reset"] >= 1, kinds
    if mode == "keep":  # running requests wait out a "keep" pause, and the reset preempts them
        assert kinds["reset"] >= 1, kinds
