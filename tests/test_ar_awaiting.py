"""`ArAwaiting` / `ArReady`: a request whose input is not ready yet (vLLM: a structured-output
grammar still compiling) may be passed over, and is not admitted until it is ready (rule
`awaiting`).

vLLM passes over a request in `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR` and admits those behind
it. Until the events existed no AR event said so, and a live vLLM log with grammars compiling
late failed `fcfs_admission`, `policy_admission` or `progress` where vLLM was right. The live
logs are `test_real_vllm_event_log_grammar`.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from properties.ar.decisions import operations, twin_difference
from properties.ar.harness import ArAwait, ArInputReady, ArStep
from properties.ar.trace_check import check_ar_trace
from reference.ar.prefix_cache import PrefixCachingVllmV1
from reference.ar.vidur import make_vidur_vllm
from reference.ar.vllm_v1 import VLLM_033
from schedspec_cli.main import main
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRules, Policy
from spec.ar.events import (
    ArAborted,
    ArAwaiting,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheHit,
    ArCacheReset,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArInputFailed,
    ArPauseSet,
    ArPreempted,
    ArReady,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.machine import ArSpecMachine
from spec.ar.profile import ArPolicy
from spec.ar.trace import ar_event_from_dict, ar_event_to_dict, write_ar_trace
from spec.errors import CannotDrive, SpecViolation
from spec.trace import TraceFormatError
from tests.test_ar_rules_fire import CFG  # blocks of 4, 8 usable, a budget of 8, 2 seats

PRIORITY = CFG.replace(policy=Policy.PRIORITY)


def log_of(events: Sequence[ArEvent], config: ArConfig = CFG) -> list[str]:
    """The AR log of `events` under `config`."""
    out = io.StringIO()
    write_ar_trace(events, out, config, None)
    return out.getvalue().splitlines(keepends=True)


def verdict(events: Sequence[ArEvent], config: ArConfig = CFG) -> tuple[str, str]:
    """(rule, message) the check gives the log of `events`; ("", "") when it conforms."""
    result = check_ar_trace(log_of(events, config))
    if result.violation is None:
        return "", ""
    return str(result.violation.rule), str(result.violation)


# vLLM 0.33.0 as declared, with 0.34.0's cache-aware window of 3 at threshold 0
WINDOW = ArPolicy(
    lone_request_threshold_exempt=True,
    full_sequence_admission=True,
    cache_aware_window=3,
    cache_aware_threshold=0.0,
)


def window_twin(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """The vllm-v1-prefix twin with the window of `WINDOW`."""
    options = dataclasses.replace(VLLM_033, cache_aware_window=3, cache_aware_threshold=0.0)
    return PrefixCachingVllmV1(config, sink, options)


# after step 0: b runs, and a, submitted since, awaits its grammar
B_RUNS_A_AWAITS: list[ArEvent] = [
    ArSubmitted("b", 4, 4),
    ArBlocksAllocated("b", (1,)),
    ArScheduled("b", 4),
    ArStepEnd(0),
    ArSubmitted("a", 4, 1),
    ArAwaiting("a", "grammar"),
]


def b_passes_a(ready: list[ArEvent]) -> list[ArEvent]:
    """a awaits its grammar; b, behind it, is admitted in step 0 and finishes; then `ready`
    (a's readiness, or nothing), and a is admitted in step 1."""
    return [
        ArSubmitted("a", 4, 1),
        ArAwaiting("a", "grammar"),
        ArSubmitted("b", 4, 1),
        ArBlocksAllocated("b", (1,)),
        ArScheduled("b", 4),
        ArStepEnd(0),
        ArBlocksFreed("b", (1,)),
        ArFinished("b", ArFinishReason.LENGTH),
        *ready,
        ArBlocksAllocated("a", (2,)),
        ArScheduled("a", 4),
        ArStepEnd(1),
        ArBlocksFreed("a", (2,)),
        ArFinished("a", ArFinishReason.LENGTH),
    ]


def test_an_awaiting_request_is_passed_over_and_admitted_once_ready() -> None:
    """FCFS admits b past a while a awaits; a is admitted after its ar_ready, whether the
    ready comes between steps or in step 1's admission pass. Without the awaiting event the
    same log breaks FCFS."""
    assert verdict(b_passes_a([ArReady("a")])) == ("", "")
    assert verdict(b_passes_a([ArReady("a", in_step=True)])) == ("", "")
    bare = [e for e in b_passes_a([]) if not isinstance(e, ArAwaiting)]
    rule, message = verdict(bare)
    assert rule == "fcfs_admission" and "admitted 'b' while 'a' is ahead of it" in message


def test_an_awaiting_request_is_not_admitted() -> None:
    """Its first block (or token) before its ar_ready breaks `awaiting`, and the message
    names what it awaits."""
    rule, message = verdict(b_passes_a([]))
    assert rule == "awaiting"
    assert "ArBlocksAllocated for 'a', which awaits its grammar" in message
    assert "awaiting=grammar" in message  # the state shows it


def test_the_fcfs_message_names_the_awaiting_requests_passed_over() -> None:
    """c is admitted past b (ready) while a awaits: the violation names b, and a as awaiting."""
    events: list[ArEvent] = [
        ArSubmitted("a", 4, 1),
        ArAwaiting("a", "grammar"),
        ArSubmitted("b", 4, 1),
        ArSubmitted("c", 4, 1),
        ArBlocksAllocated("c", (1,)),
        ArScheduled("c", 4),
    ]
    rule, message = verdict(events)
    assert rule == "fcfs_admission"
    assert "admitted 'c' while 'b' is ahead of it" in message and "awaiting ['a']" in message


def test_priority_passes_over_an_awaiting_request_of_higher_priority() -> None:
    """Under priority, b (priority 1) is admitted while a (priority 0) awaits; without the
    awaiting event the log breaks `policy_admission`."""
    events: list[ArEvent] = [
        ArSubmitted("a", 4, 1, priority=0),
        ArAwaiting("a", "grammar"),
        ArSubmitted("b", 4, 1, priority=1),
        ArBlocksAllocated("b", (1,)),
        ArScheduled("b", 4),
        ArStepEnd(0),
    ]
    assert verdict(events, PRIORITY) == ("", "")
    bare = [e for e in events if not isinstance(e, ArAwaiting)]
    assert verdict(bare, PRIORITY)[0] == "policy_admission"


def test_progress_asks_nothing_of_an_awaiting_request_but_a_ready_one_is_due() -> None:
    """A step with only an awaiting request scheduled nothing: conforming. Once it is ready,
    a step that schedules nothing breaks `progress`, and the message counts the awaiting."""
    idle: list[ArEvent] = [ArSubmitted("a", 4, 1), ArAwaiting("a", "grammar"), ArStepEnd(0)]
    assert verdict(idle) == ("", "")
    rule, message = verdict([*idle, ArReady("a"), ArStepEnd(1)])
    assert rule == "progress" and "scheduled nothing with 0 running and 1 waiting" in message
    rule, message = verdict([*idle, ArSubmitted("b", 4, 1), ArStepEnd(1)])
    assert rule == "progress" and "2 waiting (1 of them awaiting)" in message


def test_an_awaiting_request_may_be_aborted() -> None:
    """A grammar that fails to compile: vLLM ends the request with an error, never admitted."""
    events: list[ArEvent] = [
        ArSubmitted("a", 4, 1),
        ArAwaiting("a", "grammar"),
        ArStepEnd(0),
        ArAborted("a"),
    ]
    result = check_ar_trace(log_of(events))
    assert result.violation is None and result.idle_at_end


@pytest.mark.parametrize(
    ("events", "words"),
    [
        (  # a step began since a's submission
            [
                ArSubmitted("x", 3, 2),
                ArBlocksAllocated("x", (1,)),
                ArScheduled("x", 3),
                ArStepEnd(0),
                ArSubmitted("a", 4, 1),
                ArScheduled("x", 1),
                ArStepEnd(1),
                ArAwaiting("a", "grammar"),
            ],
            "1 step(s) after its submission",
        ),
        (  # a was scheduled
            [
                ArSubmitted("a", 4, 1),
                ArBlocksAllocated("a", (1,)),
                ArScheduled("a", 2),
                ArStepEnd(0),
                ArSubmitted("b", 4, 1),
                ArAwaiting("a", "grammar"),
            ],
            "after it was scheduled",
        ),
        (  # a was scheduled, then preempted by a cache reset in this very gap
            [
                ArSubmitted("a", 4, 2),
                ArBlocksAllocated("a", (1,)),
                ArScheduled("a", 4),
                ArStepEnd(0),
                ArPreempted("a", (1,), reset=True),
                ArAwaiting("a", "grammar"),
            ],
            "after it was scheduled",
        ),
        (  # inside a schedule phase
            [
                ArSubmitted("b", 4, 1),
                ArBlocksAllocated("b", (1,)),
                ArSubmitted("a", 4, 1),
                ArAwaiting("a", "grammar"),
            ],
            "inside step 0's schedule phase",
        ),
        (  # twice
            [ArSubmitted("a", 4, 1), ArAwaiting("a", "grammar"), ArAwaiting("a", "grammar")],
            "'a' already awaits its grammar",
        ),
        ([ArSubmitted("a", 4, 1), ArAwaiting("a", "")], "a non-empty string"),
        ([ArSubmitted("a", 4, 1), ArReady("a")], "ar_ready for 'a', which awaits nothing"),
        (  # ready inside the schedule phase, not said to be found there
            [
                ArSubmitted("b", 4, 1),
                ArSubmitted("a", 4, 1),
                ArAwaiting("a", "grammar"),
                ArBlocksAllocated("b", (1,)),
                ArReady("a"),
            ],
            "without in_step",
        ),
        (  # found ready in a step that preempted: no waiting pass runs
            [
                *B_RUNS_A_AWAITS,
                ArPreempted("b", (1,)),
                ArReady("a", in_step=True),
            ],
            "the step preempted ['b']",
        ),
        (  # found ready after the pass admitted b: a writer hiding b's admission past a
            [
                ArSubmitted("a", 4, 1),
                ArAwaiting("a", "grammar"),
                ArSubmitted("b", 4, 1),
                ArBlocksAllocated("b", (1,)),
                ArScheduled("b", 4),
                ArReady("a", in_step=True),
            ],
            "after a waiting request's admission events",
        ),
        (  # a preemption after the pass found a ready
            [
                *B_RUNS_A_AWAITS,
                ArReady("a", in_step=True),
                ArPreempted("b", (1,)),
            ],
            "'b' preempted after step 1's admission pass found ['a'] ready",
        ),
        (  # a running request scheduled after the pass found a ready
            [
                *B_RUNS_A_AWAITS,
                ArReady("a", in_step=True),
                ArScheduled("b", 1),
            ],
            "ArScheduled for running 'b' after step 1's admission pass found ['a'] ready",
        ),
        (  # found ready while paused_new: no waiting pass admits
            [
                ArSubmitted("a", 4, 1),
                ArAwaiting("a", "grammar"),
                ArPauseSet("paused_new"),
                ArReady("a", in_step=True),
            ],
            "the step is paused_new",
        ),
    ],
    ids=[
        "late",
        "scheduled",
        "reset",
        "in-step",
        "twice",
        "empty",
        "not-awaiting",
        "ready-in-step-unsaid",
        "ready-after-preemption",
        "ready-after-admission",
        "preemption-after-ready",
        "running-after-ready",
        "ready-paused",
    ],
)
def test_awaiting_and_ready_come_where_the_rule_says(events: list[ArEvent], words: str) -> None:
    machine = ArSpecMachine(CFG)
    *before, last = events
    machine.apply_all(before)
    with pytest.raises(SpecViolation) as caught:
        machine.apply(last)
    assert caught.value.rule == "awaiting" and words in str(caught.value), str(caught.value)


def test_the_cache_aware_window_moves_a_request_only_once_promoted() -> None:
    """vLLM 0.34's cache-aware window reorders only requests of status WAITING: one awaiting
    its grammar, or with its grammar compiled but not yet reached by a pass, keeps its place.
    With one seat, c (cached prefix) moves ahead of b, a keeps its place, and the pass
    promotes and admits a, whether a's grammar compiled between steps or in the pass: the log
    conforms, and the vllm-v1 twin with the window (threshold 0) decides alike."""
    caching = CFG.replace(enable_prefix_caching=True, num_blocks=5, max_num_seqs=1)
    prompt = (1, 2, 3, 4)

    def events(*ready: ArReady) -> list[ArEvent]:
        return [
            ArSubmitted("x", 5, 1, prompt=(*prompt, 9)),
            ArBlocksAllocated("x", (1, 2)),
            ArScheduled("x", 5),
            ArStepEnd(0),
            ArBlocksFreed("x", (1, 2)),
            ArFinished("x", ArFinishReason.LENGTH),
            ArSubmitted("a", 4, 1, prompt=(7, 7, 7, 7)),
            ArAwaiting("a", "grammar"),
            ArSubmitted("b", 4, 1, prompt=(8, 8, 8, 8)),
            ArSubmitted("c", 5, 1, prompt=(*prompt, 6)),
            *ready,
            ArBlocksAllocated("a", (3,)),
            ArScheduled("a", 4),
            ArStepEnd(1),
            ArBlocksFreed("a", (3,)),
            ArFinished("a", ArFinishReason.LENGTH),
        ]

    for ready in ([ArReady("a", in_step=True)], [ArReady("a"), ArReady("a", in_step=True)]):
        log = events(*ready)
        machine = ArSpecMachine(caching, WINDOW)
        machine.apply_all(log[: 10 + len(ready)])
        # the pass reordered while a was unpromoted: a kept its place, c moved ahead of b
        assert machine.unfinished_ids()[0] == ("a", "c", "b")
        machine.apply_all(log[10 + len(ready) :])
        assert twin_difference(operations(log), log, caching, window_twin, WINDOW) is None


def test_the_events_round_trip_through_a_log_line() -> None:
    """`in_step` is written only when set; a bad `what` or `in_step` is a format error."""
    for event in (
        ArAwaiting("a", "grammar"),
        ArReady("a"),
        ArReady("a", in_step=True),
        ArInputFailed("a"),
    ):
        data = json.loads(json.dumps(ar_event_to_dict(event)))
        assert ar_event_from_dict(data) == event
    assert ar_event_to_dict(ArReady("a")) == {"kind": "ar_ready", "request_id": "a"}
    with pytest.raises(TraceFormatError, match="must be a non-empty string"):
        ar_event_from_dict({"kind": "ar_awaiting", "request_id": "a", "what": 3}, 7)
    with pytest.raises(TraceFormatError, match="must be true or false"):
        ar_event_from_dict({"kind": "ar_ready", "request_id": "a", "in_step": 1}, 7)


def test_the_twin_replays_an_awaiting_request(tmp_path: Path) -> None:
    """`operations` holds the request back (`ArAwait`) and releases it before the step whose
    pass found it ready (`ArInputReady`); the vllm-v1 twin decides alike whether the ready
    came between steps or in the pass. A twin that holds nothing back is `CannotDrive`."""
    events = b_passes_a([ArReady("a", in_step=True)])
    ops = operations(events)
    assert ops[1] == ArAwait("a", "grammar") and ops[4:] == [ArInputReady("a"), ArStep()]
    for ready in (ArReady("a"), ArReady("a", in_step=True)):
        path = tmp_path / "awaiting.jsonl"
        path.write_text("".join(log_of(b_passes_a([ready]))))
        assert main(["check-trace", str(path), "--twin", "vllm-v1"]) == 0
    with pytest.raises(CannotDrive, match="holds back no request awaiting an input"):
        twin_difference(ops, events, CFG.replace(enable_chunked_prefill=False), make_vidur_vllm)


#: x runs; a, submitted after step 0, awaits its grammar; b, behind it, fits; step 1's
#: schedule phase has scheduled x alone so far.
BEHIND_AN_AWAITING_ONE: tuple[ArEvent, ...] = (
    ArSubmitted("x", 3, 3),
    ArBlocksAllocated("x", (1,)),
    ArScheduled("x", 3),
    ArStepEnd(0),
    ArSubmitted("a", 4, 1),
    ArAwaiting("a", "grammar"),
    ArSubmitted("b", 4, 1),
    ArScheduled("x", 1),
)


def test_the_twin_catches_a_request_left_waiting_behind_an_awaiting_one(tmp_path: Path) -> None:
    """x runs; b waits behind a, which awaits, though it fits: the log conforms (the
    idealised spec asks no admission; `admission_progress`, vLLM's, is not declared here:
    tests/test_ar_admission_progress.py), and the vllm-v1 twin, which admits b past a, tells
    the difference."""
    events: list[ArEvent] = [*BEHIND_AN_AWAITING_ONE, ArStepEnd(1)]
    assert verdict(events) == ("", "")
    path = tmp_path / "behind.jsonl"
    path.write_text("".join(log_of(events)))
    assert main(["check-trace", str(path), "--twin", "vllm-v1"]) == 1


def test_aging_and_look_ahead_pass_over_an_awaiting_request() -> None:
    """x runs. Aging: a has waited max_wait_steps while it awaits, and b is admitted first;
    FCFS with a look-ahead of 1: b is admitted past a, which would fit. Both conform, and
    break `aging_bound` and `fcfs_admission` without the awaiting event."""
    aging = CFG.replace(policy=Policy.AGING, max_wait_steps=1)
    events: list[ArEvent] = [
        ArSubmitted("x", 3, 2),
        ArSubmitted("a", 4, 1),
        ArAwaiting("a", "grammar"),
        ArBlocksAllocated("x", (1,)),
        ArScheduled("x", 3),
        ArStepEnd(0),
        ArSubmitted("b", 4, 2),
        ArScheduled("x", 1),
        ArBlocksAllocated("b", (2,)),
        ArScheduled("b", 4),
        ArStepEnd(1),
    ]
    bare = [e for e in events if not isinstance(e, ArAwaiting)]
    assert verdict(events, aging) == ("", "")
    assert verdict(bare, aging)[0] == "aging_bound"
    look_ahead = ArPolicy(rules=ArRules(fcfs_lookahead=1))
    ArSpecMachine(CFG, look_ahead).apply_all(events)
    with pytest.raises(SpecViolation) as caught:
        ArSpecMachine(CFG, look_ahead).apply_all(bare)
    assert caught.value.rule == "fcfs_admission" and "past 'a'" in str(caught.value)


def test_the_cadence_escape_passes_over_requests_deferred_for_their_input() -> None:
    """Prefill interval 3, as vLLM's `num_waiting > len(deferred_waiting)`: a release step
    that leaves only b waiting, b deferred for its grammar, does not lift the next hold (b's
    admission in held step 1 breaks `prefill_cadence`); without its awaiting, b lifts it.
    Deferral ends at admission: c, admitted and then preempted by a cache reset, left waiting
    by release step 1, lifts the hold of step 2."""
    cadence = ArPolicy(prefill_interval=3)
    cfg = CFG.replace(max_num_batched_tokens=4, max_model_len=8)

    def left_waiting(awaits: bool) -> list[ArEvent]:
        held = [ArAwaiting("b", "grammar")] if awaits else []
        return [
            ArSubmitted("a", 4, 4),
            ArSubmitted("b", 4, 1),
            *held,
            ArBlocksAllocated("a", (1,)),
            ArScheduled("a", 4),
            ArStepEnd(0),
            *([ArReady("b")] if awaits else []),
            ArBlocksAllocated("a", (2,)),
            ArScheduled("a", 1),
            ArBlocksAllocated("b", (3,)),
            ArScheduled("b", 3),
            ArStepEnd(1),
        ]

    ArSpecMachine(cfg, cadence).apply_all(left_waiting(awaits=False))
    with pytest.raises(SpecViolation) as caught:
        ArSpecMachine(cfg, cadence).apply_all(left_waiting(awaits=True))
    assert caught.value.rule == "prefill_cadence", str(caught.value)
    whole = CFG.replace(max_num_batched_tokens=8, enable_chunked_prefill=False)
    ArSpecMachine(whole, cadence).apply_all(
        [
            ArSubmitted("a", 4, 4),
            ArSubmitted("c", 4, 4),
            ArAwaiting("c", "grammar"),
            ArReady("c"),
            ArBlocksAllocated("a", (1,)),
            ArScheduled("a", 4),
            ArBlocksAllocated("c", (2,)),
            ArScheduled("c", 4),
            ArStepEnd(0),
            ArPreempted("c", (2,), reset=True),
            ArPreempted("a", (1,), reset=True),
            ArCacheReset(),
            ArBlocksAllocated("a", (1, 3)),
            ArScheduled("a", 5),
            ArStepEnd(1),  # c (5 tokens) does not fit beside a: left waiting
            ArScheduled("a", 1),
            ArBlocksAllocated("c", (2, 4)),
            ArScheduled("c", 5),
            ArStepEnd(2),
        ]
    )


def test_a_request_promoted_and_not_admitted_is_moved_by_the_next_reorder() -> None:
    """Window 3, threshold 0: a's pass in step 1 promotes it, but its 3 blocks do not fit;
    once promoted it is `WAITING` to vLLM, so step 2's reorder moves c, whose prefix is
    cached, ahead of it, and admits c. The log conforms, and the vllm-v1 twin with the window
    decides alike."""
    caching = CFG.replace(
        enable_prefix_caching=True, num_blocks=5, max_num_batched_tokens=16, max_model_len=16
    )
    log: list[ArEvent] = [
        ArSubmitted("x", 5, 1, prompt=(1, 2, 3, 4, 9)),
        ArSubmitted("y", 7, 2, prompt=(5, 5, 5, 5, 5, 5, 5)),
        ArBlocksAllocated("x", (1, 2)),
        ArScheduled("x", 5),
        ArBlocksAllocated("y", (3, 4)),
        ArScheduled("y", 7),
        ArStepEnd(0),
        ArBlocksFreed("x", (1, 2)),
        ArFinished("x", ArFinishReason.LENGTH),
        ArSubmitted("a", 12, 1, prompt=tuple(range(20, 32))),
        ArAwaiting("a", "grammar"),
        ArSubmitted("c", 5, 1, prompt=(1, 2, 3, 4, 6)),
        ArScheduled("y", 1),
        ArReady("a", in_step=True),  # promoted; 3 blocks do not fit the 2 free
        ArStepEnd(1),
        ArBlocksFreed("y", (3, 4)),
        ArFinished("y", ArFinishReason.LENGTH),
        ArCacheHit("c", (1,)),
        ArBlocksAllocated("c", (2,)),
        ArScheduled("c", 1),
        ArStepEnd(2),
        ArBlocksFreed("c", (1, 2)),
        ArFinished("c", ArFinishReason.LENGTH),
    ]
    ArSpecMachine(caching, WINDOW).apply_all(log)
    assert twin_difference(operations(log), log, caching, window_twin, WINDOW) is None


def test_a_request_whose_input_failed_is_ended_by_the_pass_that_reaches_it() -> None:
    """a's grammar fails (`ar_input_failed`). Step 0 admits b, behind a: its pass reached a,
    so a is ended in step 0's update phase (vLLM ends it with an error); left waiting, the
    next step breaks `awaiting`. Nothing running and nothing to admit, the pass reaches a
    too. With b ahead of a, a pass that stops after b need not reach a."""
    a_fails: list[ArEvent] = [ArSubmitted("a", 4, 1), ArAwaiting("a", "grammar")]
    b_passes = [
        *a_fails,
        ArSubmitted("b", 4, 1),
        ArInputFailed("a"),
        ArBlocksAllocated("b", (1,)),
        ArScheduled("b", 4),
        ArStepEnd(0),
        ArBlocksFreed("b", (1,)),
        ArFinished("b", ArFinishReason.LENGTH),
    ]
    ArSpecMachine(CFG).apply_all([*b_passes, ArAborted("a"), ArStepEnd(1)])
    with pytest.raises(SpecViolation) as caught:
        ArSpecMachine(CFG).apply_all([*b_passes, ArStepEnd(1)])
    assert caught.value.rule == "awaiting"
    assert "['a'] failed to get their input (ar_input_failed) and step 0's" in str(caught.value)
    with pytest.raises(SpecViolation) as caught:  # the next step's first event, b's decode
        ArSpecMachine(CFG).apply_all(
            [
                *a_fails,
                ArSubmitted("b", 3, 2),
                ArInputFailed("a"),
                ArBlocksAllocated("b", (1,)),
                ArScheduled("b", 3),
                ArStepEnd(0),
                ArScheduled("b", 1),
            ]
        )
    assert caught.value.rule == "awaiting" and caught.value.event == ArScheduled("b", 1)
    alone = [*a_fails, ArInputFailed("a"), ArStepEnd(0)]
    ArSpecMachine(CFG).apply_all([*alone, ArAborted("a"), ArStepEnd(1)])
    with pytest.raises(SpecViolation, match=r"\['a'\] failed to get their input"):
        ArSpecMachine(CFG).apply_all([*alone, ArStepEnd(1)])
    ArSpecMachine(CFG).apply_all(  # b ahead of a: admitting b does not reach a
        [
            ArSubmitted("b", 3, 2),
            *a_fails,
            ArInputFailed("a"),
            ArBlocksAllocated("b", (1,)),
            ArScheduled("b", 3),
            ArStepEnd(0),
            ArScheduled("b", 1),
            ArStepEnd(1),
        ]
    )


@pytest.mark.parametrize(
    ("events", "words"),
    [
        ([ArSubmitted("a", 4, 1), ArInputFailed("a")], "which awaits nothing"),
        (
            [
                ArSubmitted("a", 4, 1),
                ArAwaiting("a", "grammar"),
                ArInputFailed("a"),
                ArInputFailed("a"),
            ],
            "whose input failed already",
        ),
    ],
    ids=["not-awaiting", "twice"],
)
def test_input_failed_follows_an_awaiting(events: list[ArEvent], words: str) -> None:
    with pytest.raises(SpecViolation) as caught:
        ArSpecMachine(CFG).apply_all(events)
    assert caught.value.rule == "awaiting" and words in str(caught.value)
