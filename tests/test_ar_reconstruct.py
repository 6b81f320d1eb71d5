"""Event reconstruction (`spec.ar.reconstruct`): events derived from pool views before and after
each call equal the events a scheduler reports itself, and the spec accepts them."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from properties.ar.strategies import ar_configs, prompts, request_sizes
from reference.ar.base import CachingBlockPool
from reference.ar.prefix_cache import PrefixCachingVllmV1
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.events import (
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheEvicted,
    ArCacheHit,
    ArEvent,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
)
from spec.ar.machine import ArSpecMachine
from spec.ar.reconstruct import (
    ArPoolView,
    ReconstructionError,
    release_events,
    scheduling_events,
)

SCHEDULING = (ArPreempted, ArCacheHit, ArBlocksAllocated, ArScheduled, ArCacheEvicted)


class _Recorder(PrefixCachingVllmV1):
    """The reference scheduler, viewed before and after each phase of a step."""

    def __init__(self, config: ArConfig, sink: object) -> None:
        self.log: list[ArEvent] = []
        super().__init__(config, self.log.append)
        self.rebuilt: list[ArEvent] = []

    def view(self) -> ArPoolView:
        reqs = [*self.running, *self.waiting]
        pool = self.pool
        return ArPoolView(
            block_tables={r.rid: tuple(r.blocks) for r in reqs},
            num_computed={r.rid: r.num_computed for r in reqs},
            running=tuple(r.rid for r in self.running),
            waiting=tuple(r.rid for r in self.waiting),
            cached=frozenset(pool.cache) if isinstance(pool, CachingBlockPool) else frozenset(),
        )

    def step(self) -> None:
        self.scheduled = {}
        self.step_preempted = []
        before = self.view()
        self._schedule()
        self.rebuilt += scheduling_events(
            before,
            self.view(),
            dict(self.scheduled),
            self.config.block_size,
            preempted_order=[r.rid for r in self.step_preempted],
        )
        self._execute()
        self.rebuilt.append(ArStepEnd(self.step_index))
        before = self.view()
        start = len(self.log)
        self._update()
        self.rebuilt += release_events(before, self.view())
        self.rebuilt += [e for e in self.log[start:] if not isinstance(e, ArBlocksFreed)]
        self.step_index += 1


def _key(e: ArEvent) -> tuple[object, ...]:
    return (type(e).__name__, *(getattr(e, f) for f in e.__dataclass_fields__))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    config=ar_configs(policies=(Policy.FCFS,), prefix_caching=(True, False)),
    data=st.data(),
)
def test_reconstruction_matches_the_reported_events(config: ArConfig, data: st.DataObject) -> None:
    rec = _Recorder(config, None)
    spec = ArSpecMachine(config, rec.rules)
    n = data.draw(st.integers(1, 6), "requests")
    for i in range(n):
        p, m = data.draw(request_sizes(config), "sizes")
        if p + m > config.max_model_len:
            continue
        prompt = data.draw(prompts(p), "prompt")
        rec.submit(ArRequest(f"r{i}", p, m, priority=i % 3, prompt=prompt))
    submitted = list(rec.log)
    rec.log.clear()
    rec.drain(500)
    reported = list(rec.log)
    # same events, phase by phase (the order inside a scheduling phase is canonical)
    assert Counter(map(_key, rec.rebuilt)) == Counter(map(_key, reported))
    spec.apply_all(submitted)
    spec.apply_all(rec.rebuilt)  # the spec accepts the rebuilt stream
    assert spec.is_idle()


def _view(tables: dict[str, tuple[int, ...]], computed: dict[str, int], **kw: object) -> ArPoolView:
    return ArPoolView(block_tables=tables, num_computed=computed, **kw)  # type: ignore[arg-type]


def test_admission_with_a_cache_hit_and_an_eviction() -> None:
    before = _view(
        {"a": (1, 2), "b": ()},
        {"a": 8, "b": 0},
        running=("a",),
        waiting=("b",),
        cached=frozenset({1, 5, 6}),
    )
    after = _view(
        {"a": (1, 2), "b": (1, 3)},
        {"a": 8, "b": 4},
        running=("a", "b"),
        waiting=(),
        cached=frozenset({1}),
    )
    events = scheduling_events(before, after, {"a": 1, "b": 2}, block_size=4)
    assert events == [
        ArScheduled("a", 1),
        ArCacheHit("b", (1,)),
        ArBlocksAllocated("b", (3,)),
        ArScheduled("b", 2),
        ArCacheEvicted((5, 6)),
    ]


def test_preemption_tail_first_then_release() -> None:
    before = _view(
        {"a": (1,), "b": (2,), "c": (3,)},
        {"a": 4, "b": 4, "c": 4},
        running=("a", "b", "c"),
        waiting=(),
    )
    after = _view(
        {"a": (1, 2, 3)},
        {"a": 4, "b": 0, "c": 0},
        running=("a",),
        waiting=("c", "b"),
    )
    events = scheduling_events(before, after, {"a": 5}, block_size=4)
    assert events[:2] == [ArPreempted("c", (3,)), ArPreempted("b", (2,))]
    assert events[2:] == [ArBlocksAllocated("a", (2, 3)), ArScheduled("a", 5)]
    assert release_events(after, _view({}, {}, running=(), waiting=("c", "b"))) == [
        ArBlocksFreed("a", (1, 2, 3))
    ]


def test_views_no_event_explains_are_refused() -> None:
    before = _view({"b": ()}, {"b": 0}, running=(), waiting=("b",))
    after = _view({"b": (4, 5)}, {"b": 3}, running=("b",), waiting=())
    with pytest.raises(ReconstructionError, match="whole blocks"):
        scheduling_events(before, after, {"b": 1}, block_size=2)
    after2 = _view({"b": (4, 5)}, {"b": 2}, running=("b",), waiting=())
    with pytest.raises(ReconstructionError, match="not cached"):
        scheduling_events(before, after2, {"b": 1}, block_size=2)
    with pytest.raises(ReconstructionError, match="not running"):
        scheduling_events(before, before, {"b": 1}, block_size=2)
