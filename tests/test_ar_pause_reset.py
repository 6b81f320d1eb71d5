"""An operator's pause and cache reset in an AR log (`ArPauseSet`, `ArPreempted(reset=True)`,
`ArCacheReset`).

vLLM pauses its scheduler around an RL weight update (`pause_scheduler`: `PauseState`
PAUSED_NEW admits nothing, PAUSED_ALL schedules nothing) and, once idle, clears the caches
with `reset_prefix_cache(reset_running_requests=True)`, which preempts every running request,
the last first. A live log of that used to fail `progress` (a paused step schedules nothing)
and `no_admission_after_preemption` / `finish_released` (the reset's preemptions were not in
the log). Both are now events of the log, checked by the rule `pause` and by the preemption
rules without a victim order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from properties.ar.decisions import operations
from properties.ar.harness import ArHarness, ArPause, ArResetCache
from properties.ar.trace_check import check_ar_trace
from reference.ar.prefix_cache import VLLM_V1_PREFIX
from schedspec_cli.main import main
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.events import (
    ArAborted,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheEvicted,
    ArCacheHit,
    ArCacheReset,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArPauseSet,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.profile import ArPolicy
from spec.errors import CannotDrive
from spec.trace import TraceFormatError
from tests.test_ar_free_keeps_computed import log_of as shared_log_of
from tests.test_ar_free_keeps_computed import verdict as shared_verdict

CFG = ArConfig(block_size=4, num_blocks=9, max_num_batched_tokens=16, max_num_seqs=2)
CACHING = CFG.replace(enable_prefix_caching=True)


def log_of(events: list[ArEvent], config: ArConfig = CFG) -> list[str]:
    return shared_log_of(events, config)


def verdict(
    events: list[ArEvent], config: ArConfig = CFG, policy: ArPolicy | None = None
) -> tuple[str, str]:
    """(rule, message) of the log of `events`; ("", "") when it conforms."""
    return shared_verdict(events, config, policy)


# a runs from step 0 (4 prompt tokens, 4 outputs to go); b arrives after it
A_RUNS: list[ArEvent] = [
    ArSubmitted("a", 4, 4),
    ArBlocksAllocated("a", (1, 2)),
    ArScheduled("a", 4),
    ArStepEnd(0),
    ArSubmitted("b", 4, 2),
]


# a and b both run after step 1
BOTH_RUN: list[ArEvent] = [
    *A_RUNS,
    ArBlocksAllocated("b", (3,)),
    ArScheduled("a", 1),
    ArScheduled("b", 4),
    ArStepEnd(1),
]


def test_paused_all_steps_schedule_nothing_and_owe_no_progress() -> None:
    events = [*A_RUNS, ArPauseSet("paused_all"), ArStepEnd(1), ArStepEnd(2)]
    assert verdict(events) == ("", "")
    rule, message = verdict([*A_RUNS, ArPauseSet("paused_all"), ArScheduled("a", 1)])
    assert rule == "pause", message
    assert "ArScheduled for 'a' while the scheduler is paused_all" in message, message
    assert "preempted []; paused_all" in message, message  # the state says it is paused


def test_paused_new_runs_the_running_and_admits_no_one() -> None:
    events = [*A_RUNS, ArPauseSet("paused_new"), ArScheduled("a", 1), ArStepEnd(1)]
    assert verdict(events) == ("", "")
    rule, message = verdict([*A_RUNS, ArPauseSet("paused_new"), ArScheduled("b", 4)])
    assert rule == "pause", message
    assert "for 'b' (waiting) while the scheduler is paused_new" in message, message


def test_paused_new_still_owes_progress_to_the_running() -> None:
    rule, message = verdict([*A_RUNS, ArPauseSet("paused_new"), ArStepEnd(1)])
    assert rule == "progress", message


def test_resumed_the_waiting_are_admitted_again() -> None:
    events = [
        *A_RUNS,
        ArPauseSet("paused_all"),
        ArStepEnd(1),
        ArPauseSet("unpaused"),
        ArScheduled("a", 1),
        ArBlocksAllocated("b", (3,)),
        ArScheduled("b", 4),
        ArStepEnd(2),
    ]
    assert verdict(events) == ("", "")


def test_a_pause_is_set_between_steps() -> None:
    rule, message = verdict([*A_RUNS, ArScheduled("a", 1), ArPauseSet("paused_all")])
    assert rule == "pause", message
    assert "inside step 1's schedule phase" in message, message


def test_a_reset_preempts_between_steps_and_the_next_step_readmits() -> None:
    events = [
        *A_RUNS,
        ArPreempted("a", (1, 2), reset=True),
        ArCacheReset(),
        ArBlocksAllocated("a", (3, 4)),
        ArScheduled("a", 5),
        ArStepEnd(1),
    ]
    assert verdict(events) == ("", "")


def test_a_reset_empties_the_cache_what_was_cached_is_no_hit() -> None:
    """The review's false pass: r0 readmitted after the reset with a hit on blocks cached from
    the old weights. The reset now empties the spec's cache, and the hit is refused."""
    prompt = tuple(range(100, 109))
    events: list[ArEvent] = [
        ArSubmitted("a", 9, 4, prompt=prompt),
        ArBlocksAllocated("a", (1, 2, 3)),
        ArScheduled("a", 9),
        ArStepEnd(0),
        ArPreempted("a", (1, 2, 3), reset=True),
        ArCacheReset(),
        ArCacheHit("a", (1, 2)),
    ]
    rule, message = verdict(events, CACHING)
    assert rule == "cache_hit_cached", message
    assert "claims block 1 as its prefix block 0, but block 1 is not cached" in message, message


def test_a_reset_takes_every_running_request_first() -> None:
    """The review's partial reset: b preempted, a left running with its old KV."""
    events = [
        *BOTH_RUN,
        ArPreempted("b", (3,), reset=True),
        ArCacheReset(),
    ]
    rule, message = verdict(events)
    assert rule == "cache_reset", message
    assert "reset with ['a'] running and ['a'] holding blocks" in message, message


def test_a_reset_preemption_is_followed_by_the_reset() -> None:
    events = [*A_RUNS, ArPreempted("a", (1, 2), reset=True), ArStepEnd(1)]
    rule, message = verdict(events)
    assert rule == "cache_reset", message
    assert "preempted ['a'], and no ar_cache_reset followed before step 1" in message, message


def test_a_reset_does_not_stand_in_for_a_finish() -> None:
    """The review's third find: a owes its finish (its one output is out) and is reset,
    recomputed and finished with two outputs. Refused at the reset."""
    events: list[ArEvent] = [
        ArSubmitted("a", 4, 1),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 4),
        ArStepEnd(0),
        ArPreempted("a", (1,), reset=True),
    ]
    rule, message = verdict(events)
    assert rule == "finish_released", message
    assert "preempted by a cache reset instead of finishing" in message, message


def test_a_reset_inside_a_schedule_phase_is_refused() -> None:
    events = [
        *A_RUNS,
        ArBlocksAllocated("b", (3,)),
        ArScheduled("b", 4),
        ArPreempted("a", (1, 2), reset=True),
    ]
    rule, message = verdict(events)
    assert rule == "lifecycle", message
    assert "preempted by a cache reset inside step 1's schedule phase" in message, message


def test_the_log_round_trips_both_and_refuses_an_unknown_state() -> None:
    lines = log_of([*A_RUNS, ArPauseSet("paused_new"), ArPreempted("a", (1, 2), reset=True)])
    assert json.loads(lines[-2]) == {"kind": "ar_pause_set", "state": "paused_new"}
    assert json.loads(lines[-1]) == {
        "kind": "ar_preempted",
        "request_id": "a",
        "freed": [1, 2],
        "reset": True,
    }
    plain = log_of([*A_RUNS[:3], ArPreempted("a", (1, 2))])
    assert "reset" not in plain[-1]  # a scheduler's preemption is written as before
    bad = [*lines[:-2], '{"kind": "ar_pause_set", "state": "paused"}\n']
    with pytest.raises(TraceFormatError, match=r"line 7: ar_pause_set.state='paused': must be one"):
        check_ar_trace(bad)


@pytest.mark.parametrize(
    "event",
    [ArPauseSet("paused_all"), ArPreempted("a", (1, 2), reset=True)],
    ids=["pause", "reset"],
)
def test_a_twin_without_set_pause_replays_no_operators_operation(event: ArEvent) -> None:
    """`operations` without `replay_pauses` (a twin that is no `ArPausingAdapter`) refuses a
    pause or a reset; with it, each is one operation (a reset's preemptions and its
    `ArCacheReset` are one `ArResetCache`)."""
    with pytest.raises(CannotDrive, match=r"this twin does not replay \(it has no set_pause"):
        operations([*A_RUNS, event])
    ops = operations([*A_RUNS, event, ArCacheReset()], replay_pauses=True)
    expected = ArPause("paused_all") if isinstance(event, ArPauseSet) else ArResetCache()
    assert ops[3:] == [expected] + ([ArResetCache()] if isinstance(event, ArPauseSet) else [])


def test_a_reset_of_an_idle_cache_is_replayed_only_by_a_twin_that_resets() -> None:
    """A reset that preempted nothing: with prefix caching a twin that cannot reset is
    `CannotDrive` (its cache would outlive the log's), one that can resets; without prefix
    caching it changes no decision and is left out."""
    events: list[ArEvent] = [*A_RUNS[:4], ArCacheReset(), ArStepEnd(1)]
    with pytest.raises(CannotDrive, match="the log resets its cache between steps"):
        operations(events, None, CACHING)
    assert ArResetCache() in operations(events, None, CACHING, replay_pauses=True)
    assert ArResetCache() not in operations(events, None, CFG)


def operator_run(pause: str) -> list[ArEvent]:
    """The reference `vllm-v1` (prefix caching) serving a, b and c with an operator pausing it
    in `pause` after step 1, resetting its cache (a and b running are preempted), resuming
    after step 3, then draining: its events, checked by the harness as it ran."""
    h = ArHarness(VLLM_V1_PREFIX.factory, CACHING, policy=VLLM_V1_PREFIX.profile.policy)
    prompt = (1, 2, 3, 4, 5)
    h.submit(ArRequest("a", 5, 4, prompt=prompt))
    h.step()
    h.submit(ArRequest("b", 5, 3, prompt=prompt))
    h.step()
    h.set_pause(pause)
    h.submit(ArRequest("c", 5, 2, prompt=prompt))
    h.step()
    h.reset_cache()
    h.step()
    h.set_pause("unpaused")
    h.drain()
    assert h.violation is None, h.violation
    return list(h.events)


@pytest.mark.parametrize("pause", ["paused_all", "paused_new"])
def test_the_vllm_twin_replays_pauses_and_cache_resets(
    pause: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vllm-v1 is an `ArPausingAdapter`: a log with an operator's pause and cache reset (the
    reference's own, with both requests running preempted by the reset) decides alike."""
    events = operator_run(pause)
    kinds = [type(e).__name__ for e in events]
    assert "ArCacheReset" in kinds and kinds.count("ArPauseSet") == 2, kinds
    assert sum(isinstance(e, ArPreempted) and e.reset for e in events) == 2, events
    log = tmp_path / "operated.jsonl"
    log.write_text("".join(log_of(events, CACHING)))
    assert main(["check-trace", str(log), "--twin", "vllm-v1-prefix"]) == 0
    out, _ = capsys.readouterr()
    assert "its twin vllm-v1-prefix decides alike" in out, out


def test_check_trace_with_a_twin_that_cannot_pause_is_one_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A twin that is no `ArPausingAdapter` (the Vidur twins) on a paused log: exit 2 with
    one line, and no `OK` printed before it (a CI grepping `^OK` must not pass)."""
    whole = CFG.replace(enable_chunked_prefill=False, max_model_len=16)
    log = tmp_path / "paused.jsonl"
    log.write_text("".join(log_of([*A_RUNS, ArPauseSet("paused_all"), ArStepEnd(1)], whole)))
    verdict_file = tmp_path / "verdict.json"
    code = main(["check-trace", str(log), "--twin", "vidur-vllm", "--json", str(verdict_file)])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "OK" not in out, out
    assert "pauses the scheduler between steps" in err and len(err.strip().splitlines()) == 1
    assert json.loads(verdict_file.read_text())["verdict"] == "error"
    assert main(["check-trace", str(log)]) == 0  # without the twin the log conforms


def test_a_reset_preempts_the_last_running_request_first() -> None:
    """vLLM pops `running` from its end, so the requests wait again in their running order."""
    in_order = [
        *BOTH_RUN,
        ArPreempted("b", (3,), reset=True),
        ArPreempted("a", (1, 2), reset=True),
        ArCacheReset(),
    ]
    assert verdict(in_order) == ("", "")
    rule, message = verdict([*BOTH_RUN, ArPreempted("a", (1, 2), reset=True)])
    assert rule == "cache_reset", message
    assert "preempted 'a' before 'b': it preempts the last running request first" in message


def test_a_paused_all_step_evicts_nothing() -> None:
    prompt = tuple(range(100, 109))
    events: list[ArEvent] = [
        ArSubmitted("a", 9, 4, prompt=prompt),
        ArBlocksAllocated("a", (1, 2, 3)),
        ArScheduled("a", 9),
        ArStepEnd(0),
        ArBlocksFreed("a", (1, 2, 3)),
        ArAborted("a"),
        ArPauseSet("paused_all"),
        ArCacheEvicted((1,)),
    ]
    rule, message = verdict(events, CACHING)
    assert rule == "pause", message
    assert "evicted cached blocks [1] while the scheduler is paused_all" in message, message


P9 = tuple(range(100, 109))
B_CACHES: list[ArEvent] = [  # b computes a 9-token prompt and finishes: blocks 1, 2 cached
    ArSubmitted("b", 9, 1, prompt=P9),
    ArBlocksAllocated("b", (1, 2, 3)),
    ArScheduled("b", 9),
    ArStepEnd(0),
    ArBlocksFreed("b", (1, 2, 3)),
    ArFinished("b", ArFinishReason.LENGTH),
]
CACHE_AWARE = ArPolicy(cache_aware_window=2, cache_aware_threshold=0.0)

# Edges a mutation review (2026-12-07) found the tests above left open: each trace changes its
# verdict under one mutant of the pause and reset checks. (events, config, policy, rule)
EDGES: dict[str, tuple[list[ArEvent], ArConfig, ArPolicy | None, str]] = {
    "a reset's preemption without its reset before a readmission": (
        [
            *A_RUNS,
            ArPreempted("a", (1, 2), reset=True),
            ArBlocksAllocated("a", (3, 4)),
            ArScheduled("a", 5),
            ArStepEnd(1),
        ],
        CFG,
        None,
        "cache_reset",
    ),
    "a cache reset inside a schedule phase": (
        [
            *B_CACHES,
            ArSubmitted("a", 9, 4, prompt=P9),
            ArCacheHit("a", (1, 2)),
            ArBlocksFreed("a", (1, 2)),
            ArCacheReset(),
        ],
        CACHING,
        None,
        "cache_reset",
    ),
    "a cache hit while paused_all": (
        [
            *B_CACHES,
            ArSubmitted("a", 9, 4, prompt=P9),
            ArPauseSet("paused_all"),
            ArCacheHit("a", (1, 2)),
        ],
        CACHING,
        None,
        "pause",
    ),
    "a scheduler's preemption while paused_all": (
        [*A_RUNS, ArPauseSet("paused_all"), ArPreempted("a", (1, 2))],
        CFG,
        None,
        "pause",
    ),
    "a reset of a waiting request": (
        [ArSubmitted("b", 4, 2), ArPreempted("b", (), reset=True)],
        CFG,
        None,
        "lifecycle",
    ),
    "the token floor is not owed while paused_all": (
        [*A_RUNS, ArPauseSet("paused_all"), ArStepEnd(1)],
        CFG.replace(policy=Policy.FAIR),
        None,
        "",
    ),
    # the cache-aware window (2, any usage): a paused_all step does not reorder y (whose prompt
    # p cached) ahead of x; after the reset and resume x is admitted first, in arrival order
    "a paused_all step leaves the cache-aware order": (
        [
            ArSubmitted("p", 8, 1, prompt=tuple(range(100, 108))),
            ArBlocksAllocated("p", (1, 2)),
            ArScheduled("p", 8),
            ArStepEnd(0),
            ArBlocksFreed("p", (1, 2)),
            ArFinished("p", ArFinishReason.LENGTH),
            ArSubmitted("x", 8, 1, prompt=tuple(range(300, 308))),
            ArSubmitted("y", 8, 1, prompt=tuple(range(100, 108))),
            ArPauseSet("paused_all"),
            ArStepEnd(1),
            ArCacheReset(),
            ArPauseSet("unpaused"),
            ArBlocksAllocated("x", (3, 4)),
            ArScheduled("x", 8),
            ArBlocksAllocated("y", (5, 6)),
            ArScheduled("y", 8),
            ArStepEnd(2),
        ],
        CACHING,
        CACHE_AWARE,
        "",
    ),
    # prefill interval 2: step 0 left b waiting (the capacity escape); b is aborted, a
    # paused_all step passes, and step 2 may admit c while a decodes, as vLLM does
    "a paused_all step leaves the prefill cadence": (
        [
            ArSubmitted("a", 4, 4),
            ArSubmitted("b", 4, 4),
            ArBlocksAllocated("a", (1,)),
            ArScheduled("a", 4),
            ArStepEnd(0),
            ArAborted("b"),
            ArPauseSet("paused_all"),
            ArStepEnd(1),
            ArPauseSet("unpaused"),
            ArSubmitted("c", 3, 2),
            ArBlocksAllocated("a", (2,)),
            ArScheduled("a", 1),
            ArBlocksAllocated("c", (3,)),
            ArScheduled("c", 3),
            ArStepEnd(2),
        ],
        CFG.replace(max_num_batched_tokens=4),
        ArPolicy(prefill_interval=2),
        "",
    ),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_an_edge_of_the_pause_and_reset_checks(name: str) -> None:
    events, config, policy, rule = EDGES[name]
    found, message = verdict(events, config, policy)
    assert found == rule, message
