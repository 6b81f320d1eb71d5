"""The offload store's own rules (`integrations.vllm.offload_store.OffloadStore`), checked by a
Hypothesis state machine over any interleaving of finished requests' stores, hits loaded, and
the worker's reports, without vLLM:

- it never holds more than its capacity, blocks held and blocks being stored together;
- a block being loaded stays held until its load is reported (pinned from `prepare_load` to
  `complete_load`, as vLLM's CPU manager keeps it);
- a block is held or being stored, never both, and a lookup hits only held blocks.

`test_the_machine_catches_a_store_that_evicts_a_block_being_loaded` runs the same machine over
a seeded bug (eviction that ignores the loads in flight) and asserts it fails, naming the
block.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from integrations.vllm.offload_store import OffloadStore

#: What `RemoteKv.execute` builds its report with (vLLM's `KVConnectorOutput`, by keywords).
_OUTPUTS = SimpleNamespace(KVConnectorOutput=lambda **fields: SimpleNamespace(**fields))
BLOCK = 2
#: The block hashes requests are made of: prompts share prefixes of this sequence, or not.
HASHES = [f"h{i}".encode() for i in range(6)]
PREFIXES = st.integers(1, 4).map(lambda n: HASHES[:n])
OTHERS = st.lists(st.sampled_from(HASHES), min_size=1, max_size=4)


class _Req:
    """A request as the store reads it, its prompt its blocks' tokens (plus `extra`), all
    computed, finished by stopping."""

    def __init__(self, rid: str, hashes: list[bytes], extra: int = 0) -> None:
        self.request_id = rid
        self.num_prompt_tokens = BLOCK * len(hashes) + extra
        self.num_tokens = self.num_computed_tokens = self.num_prompt_tokens
        self.block_hashes = hashes
        self.status = SimpleNamespace(name="FINISHED_STOPPED")


class StoreMachine(RuleBasedStateMachine):
    """Requests finish and store, others look up and load, the worker runs batches."""

    store_class: type[OffloadStore] = OffloadStore

    def __init__(self) -> None:
        super().__init__()
        self.store: OffloadStore | None = None
        self.count = 0

    @property
    def s(self) -> OffloadStore:
        assert self.store is not None
        return self.store

    def _rid(self) -> str:
        self.count += 1
        return f"r{self.count}"

    @initialize(capacity=st.integers(1, 6), seed=st.integers(0, 2**16))
    def open_store(self, capacity: int, seed: int) -> None:
        if self.store is None:
            self.store = self.store_class(seed, BLOCK, sync_loads=False, capacity=capacity)

    @rule(hashes=st.one_of(PREFIXES, OTHERS))
    def finish(self, hashes: list[bytes]) -> None:
        if self.store is None:
            return
        rid = self._rid()
        sent = self.s.finished(_Req(rid, hashes), range(len(hashes)))
        assert sent == (("send", rid) in self.s.in_flight)

    @rule(hashes=PREFIXES)
    def load(self, hashes: list[bytes]) -> None:
        if self.store is None:
            return
        request = _Req(self._rid(), hashes, extra=1)
        hit = self.s.lookup(request, 0)
        if hit:
            assert hit % BLOCK == 0
            assert all(h in self.s.stored for h in hashes[: hit // BLOCK])
            self.s.allocated(request, range(len(hashes) + 1), hit)

    @rule()
    def run_batch(self) -> None:
        if self.store is not None:
            self.s.execute(self.s.metadata(), _OUTPUTS)

    @invariant()
    def within_capacity(self) -> None:
        if self.store is None or self.s.capacity is None:
            return
        storing = {k for keys in self.s.storing.values() for k in keys}
        assert len(self.s.stored) + len(storing) <= self.s.capacity, (
            f"{len(self.s.stored)} blocks held and {len(storing)} being stored, over a "
            f"capacity of {self.s.capacity}"
        )
        assert not storing & set(self.s.stored), "a block is both held and being stored"

    @invariant()
    def loads_read_held_blocks(self) -> None:
        if self.store is None:
            return
        for t in self.s.in_flight.values():
            if t.kind == "load":
                for key in self.s._hashes(t):
                    assert key in self.s.stored, f"block {key!r} evicted while loading for {t.rid}"


class _EvictsWhatIsLoading(OffloadStore):
    """Seeded bug: eviction ignores the loads in flight (no pins)."""

    def _loading_keys(self, but: str | None = None) -> set[bytes]:
        return set() if but is None else super()._loading_keys(but)


SETTINGS = settings(
    max_examples=300,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_the_store_keeps_its_rules() -> None:
    run_state_machine_as_test(StoreMachine, settings=SETTINGS)


class _Mutant(StoreMachine):
    store_class = _EvictsWhatIsLoading


def test_the_machine_catches_a_store_that_evicts_a_block_being_loaded() -> None:
    """The search finds the seeded bug. Derandomized, as the project's other mutant hunts are:
    the bug needs a hit loaded while a store evicts (about five steps in order), which a random
    search missed under one Hypothesis seed in four or eight; the fixed sequence below needs
    no search at all."""
    with pytest.raises(AssertionError, match="evicted while loading for r"):
        run_state_machine_as_test(_Mutant, settings=settings(SETTINGS, derandomize=True))


@pytest.mark.parametrize("seed", range(4))
def test_a_block_being_loaded_is_pinned_against_the_next_store(seed: int) -> None:
    """One block of room: r1 stores h0, r2 hits it and loads it, r3 finishes with h1 and must
    store it. The store keeps h0 until r2's load is reported (and stores nothing for r3); the
    seeded bug evicts h0 under the load."""
    for machine_class, pinned in ((StoreMachine, True), (_Mutant, False)):
        machine = machine_class()
        machine.open_store(capacity=1, seed=seed)
        machine.finish([HASHES[0]])
        for _ in range(4):  # the worker reports r1's store done
            machine.run_batch()
        assert HASHES[0] in machine.s.stored
        machine.load([HASHES[0]])
        assert [t.kind for t in machine.s.in_flight.values()] == ["load"]
        machine.finish([HASHES[1]])
        if pinned:
            machine.loads_read_held_blocks()
            machine.within_capacity()
        else:
            with pytest.raises(AssertionError, match="evicted while loading for r2"):
                machine.loads_read_held_blocks()
