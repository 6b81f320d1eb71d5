"""The caching reference (`reference.prefix_cache`): the reference dLLM scheduler with a prefix
cache, as SGLang's radix cache keeps committed blocks. Each run here is replayed into the spec
as it happens (every event, the invariants, the snapshot after every round); the conformance
suite runs it under its profile, and tests/mutants.py seeds a bug for each cache rule."""

from __future__ import annotations

from collections import Counter
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from properties.conformance import conformance_machine
from reference.dllm import ReferenceDllmScheduler
from reference.prefix_cache import (
    REFERENCE_DLLM_CACHED,
    CachingReferenceScheduler,
    make_caching_scheduler,
)
from spec.adapter import EventSink
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError
from spec.events import CacheEvicted, CacheHit, CacheReleased, Event, KvCached, KvFreed
from spec.machine import SpecMachine

E = TypeVar("E", bound=Event)

CONFIG = DllmConfig(
    block_size=2, page_size=2, kv_pages=12, req_pool_rows=2, max_running_requests=2,
    max_context=12, mode=Mode.FDFO, in_place_reuse=True, prefix_cache=True,
)  # fmt: skip


class Checked:
    """The caching reference with every event replayed into the spec as it is emitted."""

    def __init__(self, config: DllmConfig = CONFIG) -> None:
        self.spec = SpecMachine(config)
        self.events: list[Event] = []
        self.scheduler = CachingReferenceScheduler(config, self._sink)

    def _sink(self, event: Event) -> None:
        self.events.append(event)
        self.spec.apply(event)
        self.spec.check_changed()

    def round(self) -> None:
        self.scheduler.run_round()
        self.spec.check_snapshot(self.scheduler.snapshot())

    def drain(self) -> None:
        while not self.scheduler.is_idle():
            self.round()

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]


def test_a_later_request_reads_the_cached_prompt_blocks_and_decodes_alike() -> None:
    run = Checked()
    run.scheduler.submit(RequestSpec("r0", (1, 2, 3, 4), 2))
    run.drain()
    run.scheduler.submit(RequestSpec("r1", (1, 2, 3, 4, 5), 2))
    run.drain()
    hits = [(e.request_id, e.block_index) for e in run.of(CacheHit)]
    assert hits == [("r1", 0), ("r1", 1)]
    outputs = run.scheduler.collect_outputs()
    solo = make_caching_scheduler(CONFIG.solo_sync(), lambda event: None)
    assert outputs["r1"] == solo.golden_output(RequestSpec("r1", (1, 2, 3, 4, 5), 2))
    assert {e.request_id for e in run.of(CacheReleased)} == {"r0", "r1"}
    assert run.scheduler.snapshot().cached_slots == run.spec.state().cached_slots != frozenset()


def test_two_requests_that_compute_the_same_block_keep_one_copy() -> None:
    """Both run their shared prompt block in the same round: the first caches it, the second
    reads that copy and frees its own (SGLang's duplicate insert)."""
    run = Checked()
    run.scheduler.submit(RequestSpec("r0", (1, 2, 7), 2))
    run.scheduler.submit(RequestSpec("r1", (1, 2, 8), 2))
    run.round()
    assert [(e.request_id, e.block_index) for e in run.of(KvCached)] == [("r0", 0)]
    swap = run.of(CacheHit)
    assert [(e.request_id, e.block_index) for e in swap] == [("r1", 0)]
    assert [e.request_id for e in run.of(KvFreed)] == ["r1"]
    run.drain()


def test_an_allocation_evicts_the_least_recently_used_unread_block() -> None:
    tight = CONFIG.replace(kv_pages=4, max_running_requests=1, req_pool_rows=1)
    run = Checked(tight)
    for i, prompt in enumerate([(1, 2), (3, 4), (5, 6)]):
        run.scheduler.submit(RequestSpec(f"r{i}", prompt, 2))
        run.drain()
    evicted = run.of(CacheEvicted)
    assert evicted and evicted[0] == CacheEvicted((0, 1))  # r0's prompt block, used least lately
    assert run.spec.is_idle()


def test_the_caching_reference_refuses_what_it_does_not_model() -> None:
    with pytest.raises(ConfigError, match="prefix_cache"):
        CachingReferenceScheduler(CONFIG.replace(prefix_cache=False), lambda event: None)
    with pytest.raises(ConfigError, match=r"page_size.*equal to block_size=2"):
        CachingReferenceScheduler(CONFIG.replace(page_size=4), lambda event: None)


def test_the_suite_passes_the_caching_reference_and_it_hits_evicts_and_dedupes() -> None:
    """Under its profile the suite draws prompts that share stems (`shared_stem_prompts`):
    within 200 derandomized examples blocks are cached, read, swapped and evicted."""
    seen: Counter[str] = Counter()

    def counting(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
        def counted(event: Event) -> None:
            seen[event.kind] += 1
            sink(event)

        return make_caching_scheduler(config, counted)

    machine = conformance_machine(counting, profile=REFERENCE_DLLM_CACHED.profile)
    chosen = settings(
        max_examples=200,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    run_state_machine_as_test(machine, settings=chosen)
    assert seen["kv_cached"] > 1000 and seen["cache_hit"] > 100 and seen["cache_evicted"] > 100
