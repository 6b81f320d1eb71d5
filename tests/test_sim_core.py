"""The cluster simulation: determinism, conservation, monotone time, fused decode stretches,
the AR scheduler adapter and impossible configurations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from properties.sim.checks import check_conservation, check_time_monotone
from reference.sim import workload as wl
from reference.sim.cluster import simulate_cluster
from reference.sim.core import EventQueue
from reference.sim.errors import TimeWentBackwards, Unschedulable
from reference.sim.exec_model import Linear
from reference.sim.replica import ArReplica, SimpleReplica
from spec.ar.config import ArConfig

MODEL = Linear(0.01, 1e-5, 2e-4, 1e-7)


def test_event_queue_ties_and_clock() -> None:
    q = EventQueue(record=True)
    q.push(1.0, 5, 1)
    q.push(1.0, 3, 2)
    q.push(0.5, 9, 3)
    assert [q.pop()[2] for _ in range(3)] == [3, 1, 2]  # time, then insertion order
    with pytest.raises(TimeWentBackwards):
        q.push(0.1, 0, 0)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 120),
    replicas=st.integers(1, 5),
    qps=st.floats(0.5, 200),
    gs=st.sampled_from(["round_robin", "lor", "random"]),
    seed=st.integers(0, 1000),
    max_batch=st.integers(1, 16),
)
def test_simple_replica_conserves_and_fused_equals_unfused(
    n: int, replicas: int, qps: float, gs: str, seed: int, max_batch: int
) -> None:
    w = wl.poisson(n, qps, wl.Lengths(1, 300), wl.Lengths(1, 40), seed)
    runs = []
    for fuse in (True, False):
        reps = [SimpleReplica(max_batch, 600, 512) for _ in range(replicas)]
        res = simulate_cluster(w, reps, MODEL, gs, seed, record_events=True, fuse=fuse)
        assert res.log is not None and res.event_times is not None
        check_conservation(res.log, n)
        check_time_monotone(res.event_times)
        runs.append(res)
    a, b = runs
    assert np.array_equal(a.metrics.completed, b.metrics.completed)
    assert np.array_equal(a.metrics.first_token, b.metrics.first_token, equal_nan=True)
    assert a.num_batches == b.num_batches
    s = a.summary.stats
    assert s["prefill_e2e_time"].mean <= s["request_e2e_time"].mean
    assert a.summary.completed == n


def test_deterministic_for_a_seed() -> None:
    w = wl.poisson(300, 50.0, wl.Lengths(1, 200), wl.Lengths(1, 50), 7)
    r1 = simulate_cluster(w, [SimpleReplica(8, 2000) for _ in range(3)], MODEL, "random", 4)
    r2 = simulate_cluster(w, [SimpleReplica(8, 2000) for _ in range(3)], MODEL, "random", 4)
    assert np.array_equal(r1.metrics.completed, r2.metrics.completed)
    assert np.array_equal(r1.metrics.replica, r2.metrics.replica)


def test_request_larger_than_any_replica_is_a_typed_error() -> None:
    w = wl.fixed(3, 1.0, wl.Lengths(500, 500), wl.Lengths(10, 10))
    with pytest.raises(Unschedulable, match="could never be scheduled"):
        simulate_cluster(w, [SimpleReplica(4, 100)], MODEL)


def test_vllm_v1_reference_in_simulated_time() -> None:
    from reference.ar.vllm_v1 import VllmV1Scheduler

    cfg = ArConfig(
        block_size=4, num_blocks=40, max_num_batched_tokens=32, max_num_seqs=4, max_model_len=64
    )
    w = wl.poisson(60, 20.0, wl.Lengths(1, 40), wl.Lengths(1, 20), 2)
    reps = [ArReplica(VllmV1Scheduler, cfg) for _ in range(2)]
    res = simulate_cluster(w, reps, MODEL, "lor", record_events=True)
    assert res.log is not None and res.event_times is not None
    check_conservation(res.log, 60)
    check_time_monotone(res.event_times)
    assert res.summary.completed == 60
    with pytest.raises(Unschedulable):
        simulate_cluster(
            wl.fixed(1, 1.0, wl.Lengths(60, 60), wl.Lengths(10, 10)),
            [ArReplica(VllmV1Scheduler, cfg)],
            MODEL,
        )
