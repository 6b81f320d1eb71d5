"""Global schedulers over several replicas: routing decisions, and every replica conforms."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference.ar.cluster import GlobalScheduler
from reference.ar.vidur import make_vidur_sarathi
from reference.ar.vllm_v1 import make_vllm_v1
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArEvent
from spec.ar.machine import ArSpecMachine
from spec.errors import ConfigError, RequestError, SchedulerStalled, UnknownRequest


def _cluster(cfg: ArConfig, routing: str, factory=make_vllm_v1, seed: int = 0):  # type: ignore[no-untyped-def]
    specs: list[ArSpecMachine] = []

    def sink_for(i: int):  # type: ignore[no-untyped-def]
        spec = ArSpecMachine(cfg)
        specs.append(spec)

        def sink(e: ArEvent) -> None:
            spec.apply(e)
            spec.check_invariants()

        return sink

    g = GlobalScheduler(cfg, sink_for, factory, routing, seed)
    for spec, rep in zip(specs, g.replicas, strict=True):
        spec.rules = rep.rules
    return g, specs


def test_round_robin_and_lor_placement() -> None:
    cfg = ArConfig(num_replicas=3, num_blocks=9, max_model_len=16)
    g, _ = _cluster(cfg, "round_robin")
    assert [g.submit(ArRequest(f"r{i}", 2, 2)) for i in range(5)] == [0, 1, 2, 0, 1]
    g, _ = _cluster(cfg, "lor")
    g.submit(ArRequest("a", 2, 2))
    g.submit(ArRequest("b", 2, 2))
    g.step()  # both admitted: no replica has queued work
    assert g.submit(ArRequest("c", 2, 2)) == 0
    g1, _ = _cluster(cfg, "random", seed=7)
    g2, _ = _cluster(cfg, "random", seed=7)
    place = [g1.submit(ArRequest(f"r{i}", 2, 2)) for i in range(8)]
    assert place == [g2.submit(ArRequest(f"r{i}", 2, 2)) for i in range(8)]
    with pytest.raises(ConfigError):
        _cluster(cfg, "fastest")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    routing=st.sampled_from(["round_robin", "lor", "random"]),
    sizes=st.lists(st.tuples(st.integers(1, 14), st.integers(1, 6)), min_size=1, max_size=12),
    replicas=st.integers(1, 3),
    sarathi=st.booleans(),
)
def test_every_replica_conforms(
    routing: str, sizes: list[tuple[int, int]], replicas: int, sarathi: bool
) -> None:
    cfg = ArConfig(
        num_replicas=replicas,
        block_size=2,
        num_blocks=11,
        max_model_len=16,
        max_num_batched_tokens=8,
        max_num_seqs=3,
    )
    g, specs = _cluster(cfg, routing, make_vidur_sarathi if sarathi else make_vllm_v1)
    for i, (p, d) in enumerate(sizes):
        with contextlib.suppress(RequestError):
            g.submit(ArRequest(f"r{i}", p, d))
        g.step()
        for spec, rep in zip(specs, g.replicas, strict=True):
            spec.check_snapshot(rep.snapshot())
    g.drain()
    assert all(spec.is_idle() for spec in specs)
    assert all(rep.snapshot().held_blocks() == 0 for rep in g.replicas)


def test_a_stalled_drain_and_an_unknown_abort_name_the_counts_over_the_replicas() -> None:
    cfg = ArConfig(num_replicas=2, num_blocks=9, max_model_len=16)
    g, _ = _cluster(cfg, "round_robin")
    for i in range(3):
        g.submit(ArRequest(f"r{i}", 2, 4))
    assert g.queue_sizes() == (3, 0)
    with pytest.raises(UnknownRequest, match=r"'nope'.*\(3 are active\)"):
        g.abort("nope")
    with pytest.raises(SchedulerStalled, match=r"within 1 steps: 0 waiting and 3 running$"):
        g.drain(max_steps=1)
    g.drain()
    assert g.is_idle() and g.queue_sizes() == (0, 0)
