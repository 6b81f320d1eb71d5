"""SBS: Z3-checked optimality and capacities of water-filling, decode selection, the gated
queueing formulas, the deployment simulation and the `simulate sbs` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from properties.sim.checks import check_pour, check_time_monotone, check_water_fill
from reference.sim import workload as wl
from reference.sim.allocation import UnitCapacity, iqr_outliers, pick_decode_unit, water_fill
from reference.sim.errors import Unschedulable
from reference.sim.queueing import simulate_gated
from reference.sim.sbs import SbsParams, simulate_sbs
from schedspec_cli.simulate import simulate_main


@st.composite
def fill_instances(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    n = draw(st.integers(1, 6))
    loads = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    avail = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    total = draw(st.integers(0, sum(avail)))
    return loads, avail, total


@settings(max_examples=60, deadline=None)
@given(fill_instances())
def test_water_fill_is_optimal_and_within_capacity_z3(
    inst: tuple[list[int], list[int], int],
) -> None:
    check_water_fill(*inst)


@st.composite
def pour_instances(draw: st.DrawFn) -> tuple[list[UnitCapacity], list[tuple[int, int, int]]]:
    n = draw(st.integers(1, 4))
    caps = [
        UnitCapacity(
            mandatory=draw(st.integers(0, 20)),
            token_budget=draw(st.integers(20, 60)),
            seats=draw(st.integers(0, 6)),
            kv_free=draw(st.integers(0, 200)),
        )
        for _ in range(n)
    ]
    k = draw(st.integers(0, 8))
    reqs = []
    for i in range(k):
        t = draw(st.integers(1, 50))
        reqs.append((i, t, t))
    return caps, reqs


@settings(max_examples=80, deadline=None)
@given(pour_instances())
def test_pour_respects_capacities_and_is_optimal_when_unbound_z3(
    inst: tuple[list[UnitCapacity], list[tuple[int, int, int]]],
) -> None:
    check_pour(*inst)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.lists(st.integers(1, 50), min_size=1, max_size=10))
def test_pour_unbound_is_optimal(n: int, sizes: list[int]) -> None:
    sizes = sizes + [50] * (2 * n + 4)  # enough requests to meet every unit's share
    caps = [UnitCapacity(0, 40, 100, 10_000) for _ in range(n)]
    check_pour(caps, [(i, s, s) for i, s in enumerate(sizes)])


def test_water_fill_examples() -> None:
    assert water_fill([0, 0, 0], [10, 10, 10], 9) == [3, 3, 3]
    assert water_fill([5, 0, 0], [10, 10, 2], 9) == [1, 6, 2]
    assert water_fill([0, 0], [3, 10], 10) == [3, 7]


def test_decode_pick_lexicographic_with_outliers() -> None:
    assert iqr_outliers([1, 1, 1, 1, 50]) == {4}
    # unit 2 has the fewest requests but an outlying KV usage: skipped
    loads = [5, 5, 1, 5, 5]
    kv = [100, 100, 5000, 110, 90]
    assert pick_decode_unit(loads, kv, [9] * 5, [10_000] * 5, 10) == 4
    # a unit without room is never chosen; None when no unit fits
    assert pick_decode_unit([0, 3], [0, 0], [0, 5], [100, 100], 10) == 1
    assert pick_decode_unit([0], [0], [1], [5], 10) is None


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_gated_queueing_formulas(n: int) -> None:
    imm = simulate_gated(n, 0.1, "immediate", requests=8000)
    stg = simulate_gated(n, 0.1, "staggered", requests=8000)
    assert imm.mean_wait == pytest.approx(0.05, rel=0.05)
    assert stg.mean_wait == pytest.approx(0.1 / (2 * n), rel=0.05)


@pytest.mark.parametrize("policy", ["immediate", "sbs"])
def test_sbs_deployment_conserves_and_is_monotone(policy: str) -> None:
    w = wl.poisson(400, 60.0, wl.Lengths(64, 3000), wl.Lengths(1, 64), seed=3)
    p = SbsParams(
        policy=policy,
        prefill_instances=2,
        dp_units=4,
        unit_tokens=4096,
        decode_units=4,
        record=True,
    )
    r = simulate_sbs(w, p)
    m = r.metrics
    assert not np.isnan(m.completed).any()
    assert (m.first_token >= m.arrived).all() and (m.completed >= m.first_token).all()
    check_time_monotone(r.event_times)
    assert r.summary.completed == 400


def test_sbs_impossible_request_is_a_typed_error() -> None:
    w = wl.fixed(2, 1.0, wl.Lengths(5000, 5000), wl.Lengths(4, 4))
    with pytest.raises(Unschedulable, match="could never be scheduled"):
        simulate_sbs(w, SbsParams(unit_kv=4096))


def test_cli_sbs_json(tmp_path: Path) -> None:
    out = tmp_path / "sbs.json"
    code = simulate_main(
        [
            "sbs",
            "--dp-units",
            "4",
            "--batch-time",
            "0.2",
            "--requests",
            "300",
            "--qps",
            "40",
            "--decode",
            "4-16",
            "--json",
            str(out),
            "--trace",
            str(tmp_path / "t.json"),
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    for key in ("dp_units", "batch_time", "mean_wait_immediate", "mean_wait_staggered"):
        assert key in data
    assert data["dp_units"] == 4 and data["batch_time"] == 0.2
    assert data["mean_wait_staggered"] < data["mean_wait_immediate"]
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])
