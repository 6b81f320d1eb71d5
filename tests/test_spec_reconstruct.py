"""spec.reconstruct: pool events derived from two pool views; an adapter whose engine emits no
pool events at all passes the conformance suite with events rebuilt from its snapshots."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from properties.conformance import conformance_machine
from reference.dllm import ReferenceDllmScheduler
from spec.adapter import EventSink
from spec.config import DllmConfig, RequestSpec
from spec.events import (
    Admitted,
    CacheEvicted,
    CacheHit,
    CacheReleased,
    Event,
    KvAllocated,
    KvCached,
    KvFreed,
    RowAcquired,
    RowReleased,
)
from spec.reconstruct import (
    PoolView,
    acquire_events,
    reconstruct,
    release_events,
    without_reserved,
)
from spec.snapshot import FinishedOutput, Snapshot

B = 2


def test_admission_and_allocation_in_running_order() -> None:
    before = PoolView()
    after = PoolView(
        slots={4: ("b", 0), 5: ("b", 0), 0: ("a", 0), 1: ("a", 0)},
        rows={1: "b", 0: "a"},
        running=("a", "b"),
    )
    assert reconstruct(before, after) == [
        Admitted("a", 0),
        Admitted("b", 1),
        KvAllocated("a", 0, (0, 1)),
        KvAllocated("b", 0, (4, 5)),
    ]


def test_frees_and_releases_come_before_a_slot_is_taken_again() -> None:
    before = PoolView(slots={0: ("a", 0), 1: ("a", 0)}, rows={0: "a"}, running=("a",))
    after = PoolView(slots={0: ("b", 0), 1: ("b", 0)}, rows={0: "b"}, running=("b",))
    assert reconstruct(before, after) == [
        KvFreed("a", (0, 1)),
        RowReleased("a", 0),
        Admitted("b", 0),
        KvAllocated("b", 0, (0, 1)),
    ]


def test_a_running_request_taking_a_row_again_is_row_acquired() -> None:
    before = PoolView(slots={}, rows={}, running=("a",))
    after = PoolView(slots={2: ("a", 1), 3: ("a", 1)}, rows={1: "a"}, running=("a",))
    assert acquire_events(before, after) == [RowAcquired("a", 1), KvAllocated("a", 1, (2, 3))]
    assert release_events(before, after) == []


def test_token_table_view_maps_positions_to_blocks() -> None:
    view = PoolView.from_token_table(
        {"a": [8, 9, 10, None]}, block_size=B, rows={0: "a"}, running=["a"]
    )
    assert dict(view.slots) == {8: ("a", 0), 9: ("a", 0), 10: ("a", 1)}


def test_reserved_ids_are_shifted_out() -> None:
    engine = PoolView(slots={4: ("a", 0), 5: ("a", 0)}, rows={1: "a"}, running=("a",))
    spec_view = without_reserved(engine, slots=4, rows=1)
    assert dict(spec_view.slots) == {0: ("a", 0), 1: ("a", 0)} and dict(spec_view.rows) == {0: "a"}
    with pytest.raises(ValueError):
        without_reserved(engine, slots=5)


def test_no_change_no_events() -> None:
    v = PoolView(slots={0: ("a", 0)}, rows={0: "a"}, running=("a",))
    assert reconstruct(v, v) == []


# ---------------------------------------------------------------- an engine without events
_POOL_EVENTS = (Admitted, RowAcquired, RowReleased, KvAllocated, KvFreed)


class SnapshotOnlyAdapter:
    """An engine that reports forwards, steps, commits and finishes (what it returns to its
    clients) but no pool events: those are rebuilt from its own pools before each event it
    does report. The engine here is the reference with its pool events dropped."""

    def __init__(self, config: DllmConfig, sink: EventSink) -> None:
        self._sink = sink
        self.engine = ReferenceDllmScheduler(config, self._on_engine_event)
        self._view = PoolView()

    def _read(self) -> PoolView:
        return PoolView.from_snapshot(self.engine.snapshot(), [r.rid for r in self.engine.running])

    def _on_engine_event(self, event: Event) -> None:
        if isinstance(event, _POOL_EVENTS):
            return  # a real engine has no such callback
        now = self._read()
        for e in reconstruct(self._view, now):
            self._sink(e)
        self._view = now
        self._sink(event)

    @property
    def config(self) -> DllmConfig:
        return self.engine.config

    def submit(self, request: RequestSpec) -> None:
        self.engine.submit(request)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def run_round(self) -> None:
        self.engine.run_round()

    def drain(self, max_rounds: int = 100_000) -> None:
        self.engine.drain(max_rounds)

    def snapshot(self) -> Snapshot:
        return self.engine.snapshot()

    def collect_outputs(self) -> Mapping[str, FinishedOutput]:
        return self.engine.collect_outputs()


def make_snapshot_only(config: DllmConfig, sink: EventSink) -> SnapshotOnlyAdapter:
    return SnapshotOnlyAdapter(config, sink)


def test_snapshot_only_adapter_passes_the_suite() -> None:
    machine = conformance_machine(make_snapshot_only)
    run_state_machine_as_test(machine, settings=settings(max_examples=60, deadline=None))


# --- with a prefix cache: the cache's slots and each block's reads are part of the view -----


def test_a_committed_block_checkpointed_into_the_cache_is_kv_cached() -> None:
    before = PoolView(slots={0: ("a", 0), 1: ("a", 0)}, rows={0: "a"}, running=("a",))
    after = PoolView(
        rows={0: "a"}, running=("a",), cached=frozenset({0, 1}), reads={("a", 0): (0, 1)}
    )
    assert reconstruct(before, after) == [KvCached("a", 0, (0, 1))]


def test_a_finishing_request_caches_releases_and_frees_in_that_order() -> None:
    before = PoolView(
        slots={0: ("a", 0), 1: ("a", 0), 4: ("a", 2), 5: ("a", 2)},
        rows={0: "a"},
        running=("a",),
        cached=frozenset({2, 3}),
        reads={("a", 1): (2, 3)},
    )
    after = PoolView(cached=frozenset({0, 1, 2, 3}))
    assert release_events(before, after) == [
        KvCached("a", 0, (0, 1)),
        KvFreed("a", (4, 5)),
        CacheReleased("a", 0, (0, 1)),
        CacheReleased("a", 1, (2, 3)),
        RowReleased("a", 0),
    ]


def test_a_new_request_reads_cached_blocks_before_its_allocation() -> None:
    before = PoolView(cached=frozenset({0, 1, 2, 3}))
    table = {"b": [0, 1, 2, 3, 6, 7]}
    after = PoolView.from_token_table(table, B, {1: "b"}, ("b",), cached=frozenset({0, 1, 2, 3}))
    assert after.reads == {("b", 0): (0, 1), ("b", 1): (2, 3)}
    assert reconstruct(before, after) == [
        Admitted("b", 1),
        CacheHit("b", 0, (0, 1)),
        CacheHit("b", 1, (2, 3)),
        KvAllocated("b", 2, (6, 7)),
    ]


def test_a_duplicate_insert_is_a_swap_then_a_free_of_the_own_copy() -> None:
    before = PoolView(
        slots={6: ("b", 0), 7: ("b", 0)}, rows={1: "b"}, running=("b",), cached=frozenset({0, 1})
    )
    after = PoolView(
        rows={1: "b"}, running=("b",), cached=frozenset({0, 1}), reads={("b", 0): (0, 1)}
    )
    assert reconstruct(before, after) == [CacheHit("b", 0, (0, 1)), KvFreed("b", (6, 7))]


def test_a_swap_onto_a_block_cached_in_the_same_interval_comes_after_its_caching() -> None:
    """Two requests committed the same block; the tree took c's copy (slots 4-5) and b's
    duplicate insert swapped onto it. Whatever order the view lists the owners in (b's row is
    read first here, as SGLang's rows are when a free queue order seats b in row 0), the
    caching comes first: the spec refuses a read of slots nothing cached yet."""
    before = PoolView(
        slots={6: ("b", 0), 7: ("b", 0), 4: ("c", 0), 5: ("c", 0)},
        rows={0: "b", 1: "c"},
        running=("c", "b"),
    )
    after = PoolView(
        rows={0: "b", 1: "c"},
        running=("c", "b"),
        cached=frozenset({4, 5}),
        reads={("b", 0): (4, 5), ("c", 0): (4, 5)},
    )
    assert reconstruct(before, after) == [
        KvCached("c", 0, (4, 5)),
        CacheHit("b", 0, (4, 5)),
        KvFreed("b", (6, 7)),
    ]


def test_eviction_frees_the_slots_and_one_under_a_reader_is_not_a_release() -> None:
    cached = PoolView(cached=frozenset({0, 1, 2, 3}))
    assert release_events(cached, PoolView(cached=frozenset({2, 3}))) == [CacheEvicted((0, 1))]
    # b still reads block 0 from slots 0-1 in its row, but the tree evicted them (and they now
    # read as b's own): the log says evicted, which the spec refuses (evict_unread_only)
    reading = PoolView(
        rows={1: "b"}, running=("b",), cached=frozenset({0, 1}), reads={("b", 0): (0, 1)}
    )
    evicted = PoolView(slots={0: ("b", 0), 1: ("b", 0)}, rows={1: "b"}, running=("b",))
    assert release_events(reading, evicted) == [CacheEvicted((0, 1))]


def test_without_reserved_shifts_the_cache_and_the_reads() -> None:
    view = PoolView(cached=frozenset({4, 5}), reads={("a", 0): (4, 5)})
    shifted = without_reserved(view, slots=4)
    assert shifted.cached == frozenset({0, 1}) and shifted.reads == {("a", 0): (0, 1)}
