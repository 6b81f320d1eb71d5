"""Timelines read off an event log: who ran in which round, KV occupancy, rounds per block.

Pure functions over `spec` events (no plotting here), used by the report and its plots.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from spec.events import (
    Aborted,
    BlockCommitted,
    ControlReturned,
    Event,
    Finished,
    Forward,
    KvAllocated,
    KvFreed,
    Submitted,
)


@dataclass(frozen=True, slots=True)
class RequestSpan:
    """One request on the timeline, each moment a count of forwards (None: it never came)."""

    request_id: str
    submitted_forward: int  # forwards executed before it was submitted
    first_forward: int | None
    last_forward: int | None
    finished_forward: int | None  # forwards executed when it finished (None: never)


@dataclass(frozen=True, slots=True)
class Timeline:
    """What `timeline` reads off an event log; time is the forward index."""

    forwards: int
    rounds: int
    spans: tuple[RequestSpan, ...]
    rows_per_forward: tuple[tuple[str, ...], ...]  # request ids in each forward
    kv_owned_after_forward: tuple[int, ...]
    rounds_per_block: tuple[
        int, ...
    ]  # forwards each committed output block took (sync: incl. waits)
    wasted_row_steps: int  # rows forwarded although their block was already done


def timeline(events: Sequence[Event]) -> Timeline:
    """The `Timeline` of `events`, in one pass. An aborted request's `finished_forward` is when
    it was aborted; `rounds_per_block` has output blocks only (those that began with masks)."""
    forwards = 0
    rounds = 0
    owned = 0
    submitted: dict[str, int] = {}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    finished: dict[str, int] = {}
    rows: list[tuple[str, ...]] = []
    kv: list[int] = []
    block_forwards: dict[tuple[str, int], int] = defaultdict(int)
    initially_masked: dict[tuple[str, int], int] = {}
    done_blocks: set[tuple[str, int]] = set()
    per_block: list[int] = []
    wasted = 0
    for e in events:
        if isinstance(e, Submitted):
            submitted[e.request_id] = forwards
        elif isinstance(e, KvAllocated):
            owned += len(e.slots)
        elif isinstance(e, KvFreed):
            owned -= len(e.slots)
        elif isinstance(e, Forward):
            ids = tuple(r.request_id for r in e.rows)
            for r in e.rows:
                key = (r.request_id, r.block_index)
                if key in done_blocks:
                    wasted += 1
                if key not in block_forwards:
                    initially_masked[key] = r.masked
                block_forwards[key] += 1
                first.setdefault(r.request_id, forwards)
                last[r.request_id] = forwards
            rows.append(ids)
            forwards += 1
            kv.append(owned)
        elif isinstance(e, BlockCommitted):
            key = (e.request_id, e.block_index)
            if initially_masked.get(key, 0):  # output blocks only (prompt blocks take 1)
                per_block.append(block_forwards[key])
        elif isinstance(e, (Finished, Aborted)):
            finished[e.request_id] = forwards
        elif isinstance(e, ControlReturned):
            rounds += 1
        if e.kind == "step_result" and e.accept_length:  # type: ignore[union-attr]
            done_blocks.add((e.request_id, e.block_index))  # type: ignore[union-attr]
    spans = tuple(
        RequestSpan(rid, submitted[rid], first.get(rid), last.get(rid), finished.get(rid))
        for rid in submitted
    )
    return Timeline(forwards, rounds, spans, tuple(rows), tuple(kv), tuple(per_block), wasted)


def histogram(values: Sequence[int]) -> dict[int, int]:
    """Value -> how often it occurs in `values`, in ascending order of value."""
    return dict(sorted(Counter(values).items()))
