"""dLLM sync vs FDFO in simulated time: the schedulers stay within the spec while simulated, the
ideal bound, and the direction of the effects."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from properties.sim.checks import check_time_monotone, harness_driver
from reference.algorithms import ALGORITHMS
from reference.sim.dllm import ROUNDS_REPORT, DllmParams, StepDist, simulate_dllm, sweep
from reference.sim.dllm_profile import ProfileWorkload, RequestProfile
from reference.sim.errors import SimConfigError
from reference.sim.exec_model import Constant
from schedspec_cli.main import main
from spec.config import Mode, request_shape

CASES = [
    (Mode.SYNC, False, False),
    (Mode.FDFO, False, False),
    (Mode.FDFO, True, False),
    (Mode.FDFO, True, True),
]


@pytest.mark.parametrize(("mode", "reuse", "reloop"), CASES)
def test_scheduler_passes_the_spec_inside_the_simulation(
    mode: Mode, reuse: bool, reloop: bool
) -> None:
    dist = StepDist.uniform(2, 5)
    p = DllmParams(
        block_size=4,
        max_running=3,
        mode=mode,
        in_place_reuse=reuse,
        reloop=reloop,
        num_requests=7,
        gen_blocks=3,
        arrival_interval=0.01,
    )
    # The harness replays every event into the SpecMachine, checks invariants after each
    # event and the scheduler's snapshot after every round.
    res = simulate_dllm(p, dist, driver=harness_driver())
    assert len(res.completion) == 7
    assert res.output_tokens == 7 * 3 * 4
    check_time_monotone(res.event_times)
    direct = simulate_dllm(p, dist, check_spec=True)
    assert direct.completion == res.completion  # the harness does not change the run


def test_ideal_bound_formula() -> None:
    d = StepDist.from_histogram({2: 1, 4: 1})
    assert d.mean() == 3.0
    # max of 2 draws is 4 unless both are 2: 2*1/4 + 4*3/4
    assert d.expected_max(2) == pytest.approx(3.5)
    assert d.ideal_ratio(1) == pytest.approx(1.0)
    assert d.ideal_ratio(16) == pytest.approx((4 - 2 * 0.5**16) / 3)
    assert StepDist.parse("2:1,4:1") == StepDist.from_histogram({2: 1, 4: 1})
    with pytest.raises(SimConfigError):
        StepDist.parse("1:3")


def test_fdfo_beats_sync_and_stays_under_the_bound_without_overheads() -> None:
    dist = StepDist.uniform(2, 9)
    base = DllmParams(
        block_size=8,
        num_requests=48,
        gen_blocks=8,
        forward=Constant(0.01),
        round_overhead=0.0,
        alloc_cost=0.0,
        alloc_round_cost=0.0,
    )
    rows = sweep(dist, (1, 4), base)
    k1, k4 = rows
    assert k1["fdfo_over_sync"] == pytest.approx(1.0)
    assert 1.1 < k4["fdfo_over_sync"] <= k4["ideal_bound"] + 0.02


def test_reuse_pays_only_with_allocation_costs() -> None:
    dist = StepDist.uniform(2, 9)
    kw = dict(
        block_size=8,
        max_running=4,
        num_requests=16,
        gen_blocks=4,
        mode=Mode.FDFO,
        forward=Constant(0.01),
        round_overhead=0.0,
        alloc_cost=0.001,
    )
    with_reuse = simulate_dllm(DllmParams(in_place_reuse=True, **kw), dist)  # type: ignore[arg-type]
    without = simulate_dllm(DllmParams(in_place_reuse=False, **kw), dist)  # type: ignore[arg-type]
    assert with_reuse.allocations < without.allocations
    assert with_reuse.throughput > without.throughput


# -- measured request profiles (reference.sim.dllm_profile) ---------------------------------

PROFILES = ProfileWorkload(
    (
        RequestProfile(prompt_len=5, forwards=(3, 9, 2), tokens=20),  # a partial prompt block
        RequestProfile(prompt_len=8, forwards=(2, 9), tokens=16),  # whole prompt block
        RequestProfile(prompt_len=13, forwards=(4,), tokens=3),  # finished early (EOS)
    )
)


def test_cycled_profiles_replay_the_measured_blocks_in_order() -> None:
    reqs = PROFILES.requests(7, 8, "cycle")
    assert [r.forwards for r in reqs] == [PROFILES.profiles[i % 3].forwards for i in range(7)]
    for r in reqs:
        # the token budget makes the request occupy exactly its measured blocks
        shape = request_shape(DllmParams().config(), r.prompt_len, r.max_new_tokens)
        assert shape.total_blocks == r.prompt_len // 8 + len(r.forwards)
    assert PROFILES.histogram() == {2: 2, 3: 1, 4: 1, 9: 2}


def test_sampled_profiles_draw_whole_requests() -> None:
    a = PROFILES.requests(60, 8, "sample", np.random.default_rng(1))
    b = PROFILES.requests(60, 8, "sample", np.random.default_rng(1))
    c = PROFILES.requests(60, 8, "sample", np.random.default_rng(2))
    assert a == b and a != c
    whole = {(p.prompt_len, p.forwards, p.tokens) for p in PROFILES.profiles}
    drawn = {(r.prompt_len, r.forwards, r.tokens) for r in a}
    assert drawn == whole  # each request one whole profile (blocks stay correlated), all seen
    with pytest.raises(SimConfigError, match="profile_order"):
        PROFILES.requests(3, 8, "shuffle")


def test_profiles_that_cannot_be_replayed_are_refused() -> None:
    # prompt 13 leaves 3 masks in the first output block: at most 4 forwards
    with pytest.raises(SimConfigError, match=r"block 0: 2\.\.4"):
        RequestProfile(13, (5,), 3).check(8)
    with pytest.raises(SimConfigError, match=r"block 1: 2\.\.9"):
        RequestProfile(8, (2, 10), 16).check(8)
    with pytest.raises(SimConfigError, match="profiles"):
        ProfileWorkload(()).check(8)


def test_simulation_replays_the_profiles_work() -> None:
    base = DllmParams(
        block_size=8, max_running=3, num_requests=7, forward=Constant(0.01), profiles=PROFILES
    )
    dist = StepDist.uniform(2, 9)
    reqs = PROFILES.requests(7, 8)
    alone = simulate_dllm(dataclasses.replace(base, max_running=1), dist)
    # alone, a request takes one forward per prompt block plus its blocks' measured forwards
    assert alone.forwards == sum(r.prompt_len // 8 + sum(r.forwards) for r in reqs)
    runs = {}
    for mode, reuse in ((Mode.SYNC, False), (Mode.FDFO, True)):
        p = dataclasses.replace(base, mode=mode, in_place_reuse=reuse)
        runs[mode] = res = simulate_dllm(p, dist, driver=harness_driver())  # spec-checked
        assert res.output_tokens == sum(r.tokens for r in reqs)
        assert res.forwards < alone.forwards  # rows share forwards
    # sync: every forward of a batch lasts until its slowest block is done
    assert runs[Mode.SYNC].forwards > runs[Mode.FDFO].forwards


# Two requests of a one-block prompt (block size 4) and two output blocks: A's take 2 and 4
# forwards, B's 3 and 2 (the final-KV forward included); both run at once (2 seats).
_TWO = ProfileWorkload((RequestProfile(4, (2, 4), 8), RequestProfile(4, (3, 2), 8)))


@pytest.mark.parametrize(
    ("mode", "reuse", "counts"),
    [
        # lock-step rounds: the prompts (1 forward), max(2, 3), max(4, 2); 2 rows each
        (Mode.SYNC, False, (8, 16, 3, 6, 6)),
        # one forward a round: A 1 + 2 + 4 rounds, B 1 + 3 + 2 (its last round is A's 6th);
        # without reuse every row allocates its block again every round
        (Mode.FDFO, False, (7, 13, 7, 13, 13)),
        (Mode.FDFO, True, (7, 13, 7, 13, 6)),  # with reuse: each of the 6 blocks once
    ],
)
def test_counters_of_a_small_run_match_a_hand_count(
    mode: Mode, reuse: bool, counts: tuple[int, int, int, int, int]
) -> None:
    """(forwards, row-forwards, rounds, row-rounds, allocations) counted by hand, and each
    row-round and allocation charged exactly its cost."""
    p = DllmParams(
        block_size=4,
        max_running=2,
        mode=mode,
        in_place_reuse=reuse,
        num_requests=2,
        forward=Constant(1.0),
        round_overhead=0.0,
        alloc_cost=0.0,
        alloc_round_cost=0.0,
        profiles=_TWO,
    )
    r = simulate_dllm(p, StepDist.uniform(2, 3))
    assert (r.forwards, r.row_forwards, r.rounds, r.row_rounds, r.allocations) == counts
    assert r.makespan == pytest.approx(r.forwards)
    per_row_round = simulate_dllm(
        dataclasses.replace(p, row_round_cost=0.25), StepDist.uniform(2, 3)
    )
    assert per_row_round.makespan == pytest.approx(r.forwards + 0.25 * counts[3])
    per_alloc = simulate_dllm(dataclasses.replace(p, alloc_cost=0.5), StepDist.uniform(2, 3))
    assert per_alloc.makespan == pytest.approx(r.forwards + 0.5 * counts[4])


def test_an_allocation_cost_gives_reuse_its_gain() -> None:
    """FDFO with and without reuse do the same forwards, rounds and row-rounds; only the
    re-allocation of carried blocks differs, so the reuse gain is 0 without an allocation cost
    and positive with one (what the calibrated shared model charges per allocation)."""
    base = DllmParams(
        block_size=4,
        num_requests=12,
        gen_blocks=3,
        forward=Constant(1e-3),
        round_overhead=1e-4,
        row_round_cost=5e-5,
        alloc_cost=0.0,
        alloc_round_cost=0.0,
    )
    dist = StepDist.uniform(2, 5)
    (free,) = sweep(dist, (4,), base)
    assert free["fdfo_row_rounds"] == free["fdfo_reuse_row_rounds"]
    assert free["fdfo_allocations"] > free["fdfo_reuse_allocations"]
    assert free["reuse_gain"] == pytest.approx(0.0, abs=1e-12)
    (priced,) = sweep(dist, (4,), dataclasses.replace(base, alloc_cost=3e-5))
    assert priced["reuse_gain"] > 0
    # each run is slower by exactly its allocations' cost
    for reuse in (False, True):
        p = dataclasses.replace(base, mode=Mode.FDFO, in_place_reuse=reuse, max_running=4)
        cheap = simulate_dllm(p, dist)
        dear = simulate_dllm(dataclasses.replace(p, alloc_cost=3e-5), dist)
        assert dear.makespan == pytest.approx(cheap.makespan + 3e-5 * cheap.allocations)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_algorithm_chooses_whose_measured_histogram_is_drawn(
    algorithm: str, tmp_path: Path
) -> None:
    """`simulate dllm --algorithm` picks the shipped report's histogram of that algorithm (it
    used to draw LowConfidence's whatever was asked, unless --steps-report was given)."""
    report = json.loads(ROUNDS_REPORT.read_text())
    hist = report["algorithm"][algorithm]["histogram"]
    expected = StepDist.from_histogram(hist)
    out = tmp_path / "sim.json"
    argv = ["simulate", "dllm", "--algorithm", algorithm, "--seats", "1", "--requests", "2"]
    assert main([*argv, "--gen-blocks", "1", "--json", str(out)]) == 0
    dist = json.loads(out.read_text())["distribution"]
    assert algorithm in dist["source"]
    assert (tuple(dist["values"]), tuple(dist["weights"])) == (expected.values, expected.weights)
    others = [a for a in ALGORITHMS if a != algorithm]
    assert all(report["algorithm"][a]["histogram"] != hist for a in others)


def test_a_rounds_report_without_the_algorithm_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rounds.json"
    path.write_text(json.dumps({"block_size": 8, "algorithm": {"LowConfidence": {}}}))
    with pytest.raises(SimConfigError, match=r"algorithm='JointThreshold'.*\['LowConfidence'\]"):
        StepDist.from_report(path, "JointThreshold")
    with pytest.raises(SimConfigError, match="steps_report"):
        StepDist.from_report(path, "LowConfidence")
    with pytest.raises(SimConfigError, match=r"one of \['LowConfidence', 'JointThreshold'\]"):
        StepDist.default(8, "Greedy")
