"""Telling a victim vLLM had scheduled in the same `schedule()` call from the hashes its
scheduling left behind (`integrations.vllm.unscheduled`), and its events
(`spec.ar.reconstruct.scheduling_events(unscheduled=...)`). No vLLM needed: requests are
stand-ins with `block_hashes`, hashes are bytes, the group id a 4-byte suffix as in vLLM."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from integrations.vllm.unscheduled import unscheduled_victims
from spec.ar.config import ArRules, VictimOrder
from spec.ar.events import (
    ArBlocksAllocated,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.machine import ArSpecMachine
from spec.ar.reconstruct import ArPoolView, scheduling_events
from tests.same_step_preemption import CONFIG

GROUP = b"\x00\x00\x00\x00"


def _key(h: bytes) -> bytes:
    return h + GROUP


def _strip(key: bytes) -> bytes:
    return key[: -len(GROUP)]


@dataclass
class _Req:
    block_hashes: list[bytes]


def _hashes(name: str, n: int) -> list[bytes]:
    return [f"{name}{k}".encode() for k in range(n)]


# A: 7 tokens, blocks 1..5 held with 5 computed; B holds 6 and, after the call, 8.
A = _Req(_hashes("a", 7))
BEFORE = ArPoolView(
    {"A": (1, 2, 3, 4, 5), "B": (6,)},
    {"A": 5, "B": 1},
    ("A", "B"),
    (),
    frozenset({1, 2, 3, 4, 5, 6}),
)
AFTER = ArPoolView({"B": (6, 8)}, {"A": 0, "B": 1}, ("B",), ("A",), frozenset(range(1, 9)))
HASHES_BEFORE = {b: _key(A.block_hashes[b - 1]) for b in range(1, 6)} | {6: _key(b"b0")}


def _victims(
    hashes_after: dict[int, bytes], requests: dict[str, _Req] | None = None
) -> dict[str, tuple[tuple[int, ...], int]]:
    return unscheduled_victims(
        requests or {"A": A},
        ["A"] if requests is None else list(requests),
        BEFORE,
        AFTER,
        HASHES_BEFORE,
        hashes_after,
        1,
        _strip,
    )


def test_a_hash_left_on_a_free_block_names_the_victims_scheduling() -> None:
    """Block 7 now carries A's hash for token 5 and nobody holds it: A was scheduled one
    token into block 7 before it was preempted (block 8, re-taken by B, is not seen)."""
    after = HASHES_BEFORE | {7: _key(A.block_hashes[5]), 8: _key(b"b1")}
    assert _victims(after) == {"A": ((7,), 1)}


def test_nothing_left_behind_means_nothing_reported() -> None:
    """With vLLM's candidate fix the hashes go with the preemption: no evidence, no events."""
    assert _victims(HASHES_BEFORE | {8: _key(b"b1")}) == {}


def test_only_uncomputed_blocks_and_only_free_ones_count() -> None:
    """A hash of A's computed prefix (block index 2 < 5 computed) on another free block, or
    A's next hash on a block B holds, proves nothing; a gap ends the new blocks."""
    after = HASHES_BEFORE | {9: _key(A.block_hashes[2]), 8: _key(A.block_hashes[5])}
    assert _victims(after) == {}
    after = HASHES_BEFORE | {7: _key(A.block_hashes[6])}  # index 6 without index 5: a gap
    assert _victims(after) == {}


def test_a_hash_two_victims_share_is_attributed_to_neither() -> None:
    """Two victims with the same prefix: the block could be either's."""
    twin = _Req(list(A.block_hashes))
    after = HASHES_BEFORE | {7: _key(A.block_hashes[5])}
    assert _victims(after, {"A": A, "A2": twin}) == {}


def test_the_events_schedule_the_victim_right_before_its_preemption() -> None:
    """`scheduling_events` puts the victim's allocation and tokens right before its
    preemption, which frees those blocks too; the spec (vLLM's victim rule) accepts the step
    and uncaches block 7, whose content no forward writes."""
    # vLLM exempts a lone request from the threshold; the spec here does not
    config = dataclasses.replace(CONFIG, long_prefill_token_threshold=3)
    events = scheduling_events(BEFORE, AFTER, {"B": 1}, 1, unscheduled={"A": ((7,), 1)})
    assert events == [
        ArBlocksAllocated("A", (7,)),
        ArScheduled("A", 1),
        ArPreempted("A", (1, 2, 3, 4, 5, 7)),
        ArBlocksAllocated("B", (8,)),
        ArScheduled("B", 1),
    ]
    spec = ArSpecMachine(config, ArRules(victim=VictimOrder.LOWEST_PRIORITY_ANY))
    for e in [
        ArSubmitted("A", 7, 1, priority=1),
        ArBlocksAllocated("A", (1, 2, 3)),
        ArScheduled("A", 3),
        ArStepEnd(0),
        ArSubmitted("B", 1, 2, priority=0),
        ArBlocksAllocated("A", (4, 5)),
        ArScheduled("A", 2),
        ArBlocksAllocated("B", (6,)),
        ArScheduled("B", 1),
        ArStepEnd(1),
        *events,
        ArStepEnd(2),
    ]:
        spec.apply(e)
    assert sorted(spec.state().cached) == [1, 2, 3, 4, 5, 6, 8]  # not 7: never written
