"""Z3-synthesised boundary workloads run through every built-in dLLM implementation.

Each workload must pass the full harness (spec replay, invariants, snapshots, drain, parity)
on every registered dLLM implementation; an implementation that always caches (pages of one
block) runs the same operations with its cache on. Driven by a scripted oracle with Z3's step
counts, the reference must actually reach the edge (checked by replaying its events through
the spec), which also checks the policy model against the reference.
"""

from __future__ import annotations

import dataclasses

import pytest

from properties.symbolic.boundary import (
    EDGES,
    BoundaryWorkload,
    boundary_workloads,
    describe,
    edge_witnessed,
)
from properties.workload import Workload, run_workload
from reference.dllm import ReferenceDllmScheduler
from reference.oracle import ScriptedOracle
from schedspec_cli.impls import resolve
from schedspec_cli.registry import BUILTINS
from spec.adapter import EventSink, ImplementationFactory
from spec.config import DllmConfig
from spec.implementation import DllmImplementation

_CACHE: dict[str, BoundaryWorkload] = {}


def _workloads() -> dict[str, BoundaryWorkload]:
    if not _CACHE:
        results, found = boundary_workloads()
        bad = [r for r in results if r.status != "proved"]
        assert not bad, bad
        _CACHE.update({bw.name: bw for bw in found})
    return _CACHE


def _scripted(bw: BoundaryWorkload) -> ImplementationFactory:
    def factory(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
        oracle = ScriptedOracle(bw.unmask_rounds, config.mask_token_id)
        return ReferenceDllmScheduler(config, sink, oracle)

    return factory


def _dllm_builtins() -> list[str]:
    return [name for name, b in BUILTINS.items() if b.family.value == "dllm" and not b.engine]


def test_every_edge_is_synthesised() -> None:
    assert set(_workloads()) == {e.name for e in EDGES}


@pytest.mark.parametrize("edge", [e.name for e in EDGES])
def test_scripted_reference_reaches_the_edge(edge: str) -> None:
    bw = _workloads()[edge]
    h = run_workload(_scripted(bw), bw.workload)
    assert edge_witnessed(edge, bw.workload.config, h.events), (
        f"the scripted reference did not reach {edge}: {describe(bw)}"
    )


@pytest.mark.parametrize("impl", _dllm_builtins())
@pytest.mark.parametrize("edge", [e.name for e in EDGES])
def test_builtin_passes_boundary_workload(impl: str, edge: str) -> None:
    bw = _workloads()[edge]
    try:
        implementation = resolve(impl).implementation
    except Exception as err:  # an optional implementation that cannot load here
        pytest.skip(f"{impl} cannot be loaded: {err}")
    assert isinstance(implementation, DllmImplementation), impl
    workload = bw.workload
    outside = implementation.profile.space.outside(workload.config)
    if outside is not None and outside[0] in ("prefix_cache", "page_size"):
        # a cache-only implementation (pages of one block): the same operations with its cache
        # on, over a pool of as many slots (the edge's timing may move: hits skip forwards)
        assert implementation.profile.space.prefix_cache == frozenset({True}), (impl, outside)
        workload = _with_the_cache(workload)
        outside = implementation.profile.space.outside(workload.config)
        assert outside is None, (impl, outside)
    h = run_workload(implementation.factory, workload, profile=implementation.profile)
    if workload is not bw.workload:  # the cache did its part: committed blocks were cached
        assert any(e.kind == "kv_cached" for e in h.events), impl


def _with_the_cache(workload: Workload) -> Workload:
    """`workload` with the prefix cache on and pages of one block, the pool's slots kept."""
    c = workload.config
    config = dataclasses.replace(
        c, prefix_cache=True, page_size=c.block_size, kv_pages=c.kv_slots // c.block_size
    )
    return dataclasses.replace(workload, config=config, name=f"{workload.name}, cached")
