"""Pipeline stages in the simulator: conservation, one batch per stage, S-fold throughput with
a constant batch time, S = 1 equals the plain cluster loop, and S trace tracks per replica."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

import numpy as np
import pytest

from reference.sim import workload as wl
from reference.sim.cluster import simulate_cluster
from reference.sim.errors import SimConfigError
from reference.sim.exec_model import Constant, Linear
from reference.sim.export import trace_stages
from reference.sim.replica import SimpleReplica
from reference.sim.stages import StagedReplica, simulate_stages

MODEL = Linear(0.01, 1e-5, 2e-4, 1e-7)


def _replicas(r: int, s: int, max_batch: int = 8) -> list[StagedReplica]:
    return [StagedReplica(lambda: SimpleReplica(max_batch=max_batch), s) for _ in range(r)]


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("replicas", [1, 3])
def test_conservation_and_one_batch_per_stage(stages: int, replicas: int) -> None:
    w = wl.poisson(300, 80.0, wl.Lengths(8, 256), wl.Lengths(1, 24), seed=stages)
    res = simulate_stages(w, _replicas(replicas, stages), MODEL)
    m = res.metrics
    assert res.summary.completed == len(w)  # every request completes, none twice
    assert not np.isnan(m.completed).any()
    assert (m.first_token <= m.completed).all() and (m.scheduled <= m.first_token).all()
    assert (m.arrived <= m.scheduled).all()
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    per_batch: dict[tuple[int, int], list[int]] = defaultdict(list)
    for sl in res.slices:
        tracks[sl.replica, sl.stage].append((sl.start, sl.end))
        per_batch[sl.replica, sl.batch].append(sl.stage)
    for spans in tracks.values():
        spans.sort()
        for (_, e0), (s1, _) in pairwise(spans):
            assert s1 >= e0  # slices on one stage track never overlap
    for seen in per_batch.values():
        assert seen == list(range(stages))  # each batch visits every stage once, in order
    assert len(per_batch) == res.num_batches


def test_one_stage_matches_cluster_loop() -> None:
    w = wl.poisson(400, 60.0, wl.Lengths(8, 256), wl.Lengths(1, 32), seed=7)
    a = simulate_stages(w, _replicas(2, 1), MODEL)
    b = simulate_cluster(w, [SimpleReplica(max_batch=8) for _ in range(2)], MODEL, fuse=False)
    assert np.array_equal(a.metrics.completed, b.metrics.completed)
    assert np.array_equal(a.metrics.first_token, b.metrics.first_token)
    assert a.num_batches == b.num_batches


@pytest.mark.parametrize("stages", [1, 2, 4, 8])
def test_saturated_throughput_is_s_times(stages: int) -> None:
    # 80 one-token requests at t=0, one per batch: 80 batches of constant time T.
    T, n, b = 0.1, 80, 1
    w = wl.Workload(np.zeros(n), np.full(n, 16, dtype=np.int64), np.ones(n, dtype=np.int64))
    res = simulate_stages(w, _replicas(1, stages, max_batch=b), Constant(T))
    batches = n // b
    assert res.num_batches == batches
    makespan = float(np.max(res.metrics.completed))
    # exact: the first batch ends at T, then one every T/S
    assert makespan == pytest.approx(T + (batches - 1) * T / stages)
    single = batches * T
    assert single / makespan == pytest.approx(stages * batches / (stages + batches - 1))


def test_trace_has_s_tracks_per_replica() -> None:
    w = wl.poisson(120, 50.0, wl.Lengths(8, 64), wl.Lengths(1, 8), seed=1)
    res = simulate_stages(w, _replicas(2, 3), MODEL)
    tr = trace_stages(res.slices, res.num_stages)
    names = defaultdict(set)
    slices = defaultdict(set)
    for e in tr["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[e["pid"]].add(e["tid"])
        elif e["ph"] == "X":
            slices[e["pid"]].add(e["tid"])
    assert dict(names) == {0: {0, 1, 2}, 1: {0, 1, 2}}
    assert dict(slices) == {0: {0, 1, 2}, 1: {0, 1, 2}}
    assert sum(e["ph"] == "X" for e in tr["traceEvents"]) == 3 * res.num_batches


def test_bad_stage_count() -> None:
    with pytest.raises(SimConfigError):
        StagedReplica(SimpleReplica, 0)
