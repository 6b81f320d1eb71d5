"""The two orders a scheduler may declare instead of vLLM's (Vidur's Mnemosyne declares both):

- `ArRules.fcfs_lookahead`: FCFS that may admit past at most that many waiting requests, each
  too large for the free pool (`fcfs_admission`), with the queue in arrival order;
- `VictimOrder.LAST_DECODING`: the victim is the request that started decoding last, never
  one still in its prefill (`preemption_victim`).

Each option is checked on a hand-built trace: what it allows passes, what it still forbids
fails by the rule's name, and the same trace fails under the idealised spec's order.
"""

from __future__ import annotations

import pytest

from spec.ar.config import AdmissionOrder, ArConfig, ArRules, VictimOrder
from spec.ar.events import (
    ArBlocksAllocated,
    ArEvent,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.machine import ArSpecMachine
from spec.ar.profile import ArPolicy
from spec.errors import ConfigError, SpecViolation
from tests.ar_event_runs import first_ar_violation

# blocks of one token, six of them, no null block
CFG = ArConfig(
    block_size=1,
    num_blocks=6,
    reserve_null_block=False,
    max_num_batched_tokens=8,
    max_num_seqs=4,
    max_model_len=8,
)
LOOKAHEAD_1 = ArPolicy(rules=ArRules(fcfs_lookahead=1))
LAST_DECODING = ArPolicy(rules=ArRules(victim=VictimOrder.LAST_DECODING))

# step 0: `a` computes its 3-token prompt in blocks 0-2, leaving 3 free
A_RUNS: list[ArEvent] = [
    ArSubmitted("a", 3, 4),
    ArBlocksAllocated("a", (0, 1, 2)),
    ArScheduled("a", 3),
    ArStepEnd(0),
]


def passing_over(*ahead: tuple[str, int]) -> list[ArEvent]:
    """After A_RUNS: `ahead` (name, prompt) submitted, then `small` (1 token); in step 1 `a`
    decodes into block 3 and `small` is admitted into block 4, past every one of `ahead`."""
    return [
        *A_RUNS,
        *(ArSubmitted(name, prompt, 1) for name, prompt in ahead),
        ArSubmitted("small", 1, 1),
        ArBlocksAllocated("a", (3,)),
        ArScheduled("a", 1),
        ArBlocksAllocated("small", (4,)),
        ArScheduled("small", 1),
    ]


def run(policy: ArPolicy | None, events: list[ArEvent]) -> SpecViolation | None:
    return first_ar_violation(CFG, policy, events)


def test_the_lookahead_admits_past_a_request_too_large_for_the_free_pool() -> None:
    # `big` needs 4 blocks; at most 2 were free when it was passed over (1 now, 1 to small)
    assert run(LOOKAHEAD_1, passing_over(("big", 4))) is None
    strict = run(None, passing_over(("big", 4)))
    assert strict is not None and strict.rule == "fcfs_admission", strict
    assert "while 'big' is ahead of it" in str(strict)


def test_the_lookahead_never_passes_a_request_that_fits() -> None:
    found = run(LOOKAHEAD_1, passing_over(("fits", 2)))
    assert found is not None and found.rule == "fcfs_admission", found
    assert "past 'fits', whose 2 known tokens need 2 block(s) and fit the 2 free" in str(found)


def test_the_lookahead_passes_at_most_its_count() -> None:
    found = run(LOOKAHEAD_1, passing_over(("big", 4), ("bigger", 5)))
    assert found is not None and found.rule == "fcfs_admission", found
    assert "with 2 waiting requests ahead of it" in str(found) and "fcfs_lookahead=1" in str(found)
    two = ArPolicy(rules=ArRules(fcfs_lookahead=2))
    assert run(two, passing_over(("big", 4), ("bigger", 5))) is None


def test_a_preempted_request_returns_to_its_arrival_place_under_the_lookahead() -> None:
    # `b` is admitted past `big` in step 1 and preempted in step 2: vLLM's queue would put it
    # at the head, ahead of `big`; the look-ahead's queue is in arrival order, `big` first
    events: list[ArEvent] = [
        *A_RUNS,
        ArSubmitted("big", 4, 1),
        ArSubmitted("b", 1, 3),
        ArBlocksAllocated("a", (3,)),
        ArScheduled("a", 1),
        ArBlocksAllocated("b", (4,)),
        ArScheduled("b", 1),
        ArStepEnd(1),
        ArPreempted("b", (4,)),
    ]
    machine = ArSpecMachine(CFG, LOOKAHEAD_1)
    for event in events:
        machine.apply(event)
    assert machine.state().waiting == ("big", "b")


def test_the_lookahead_is_fcfs_s_alone() -> None:
    with pytest.raises(ConfigError, match=r"rules\.fcfs_lookahead"):
        ArRules(admission=AdmissionOrder.SJF, fcfs_lookahead=2)
    with pytest.raises(ConfigError, match=r"rules\.fcfs_lookahead"):
        ArRules(fcfs_lookahead=0)


# step 0: `x` then `y` compute their one-token prompts (both start decoding, `x` first); `z`
# is admitted last with 1 of its 4 prompt tokens, its whole prompt in blocks 2-5: none free
DECODING: list[ArEvent] = [
    ArSubmitted("x", 1, 5),
    ArSubmitted("y", 1, 5),
    ArSubmitted("z", 4, 1),
    ArBlocksAllocated("x", (0,)),
    ArScheduled("x", 1),
    ArBlocksAllocated("y", (1,)),
    ArScheduled("y", 1),
    ArBlocksAllocated("z", (2, 3, 4, 5)),
    ArScheduled("z", 1),
    ArStepEnd(0),
]


def test_the_last_decoding_victim_is_the_last_to_start_decoding() -> None:
    # `x` needs a block for its next token: `y` is the victim, not `z`, the latest admitted
    assert run(LAST_DECODING, [*DECODING, ArPreempted("y", (1,))]) is None
    tail = run(None, [*DECODING, ArPreempted("y", (1,))])
    assert tail is not None and tail.rule == "preemption_victim", tail
    assert "the tail victim is 'z'" in str(tail)


def test_the_last_decoding_victim_is_never_a_request_in_its_prefill() -> None:
    found = run(LAST_DECODING, [*DECODING, ArPreempted("z", (2, 3, 4, 5))])
    assert found is not None and found.rule == "preemption_victim", found
    assert "the last_decoding victim is 'y'" in str(found)
    alone: list[ArEvent] = [
        ArSubmitted("z", 4, 1),
        ArBlocksAllocated("z", (0, 1, 2, 3)),
        ArScheduled("z", 1),
        ArStepEnd(0),
        ArPreempted("z", (0, 1, 2, 3)),
    ]
    found = run(LAST_DECODING, alone)
    assert found is not None and found.rule == "preemption_victim", found
    assert "has completed its prefill" in str(found)


def test_a_preempted_request_starts_decoding_anew() -> None:
    # `y` starts decoding before `x`, is preempted, recomputes and starts decoding again after
    # `x`: now `y` is the last to start decoding (kept from its first start, it would be `x`)
    events: list[ArEvent] = [
        ArSubmitted("y", 1, 5),
        ArSubmitted("x", 1, 5),
        ArBlocksAllocated("y", (0,)),
        ArScheduled("y", 1),
        ArBlocksAllocated("x", (1,)),
        ArScheduled("x", 1),
        ArStepEnd(0),
        ArBlocksAllocated("x", (2,)),
        ArScheduled("x", 1),
        ArPreempted("y", (0,)),
        ArStepEnd(1),
        ArBlocksAllocated("y", (0, 3)),
        ArScheduled("y", 2),
        ArBlocksAllocated("x", (4,)),
        ArScheduled("x", 1),
        ArStepEnd(2),
        ArPreempted("y", (0, 3)),
    ]
    assert run(LAST_DECODING, events) is None
    found = run(LAST_DECODING, [*events[:-1], ArPreempted("x", (1, 2, 4))])
    assert found is not None and found.rule == "preemption_victim", found
    assert "the last_decoding victim is 'y'" in str(found)
