"""The dLLM calibration table: built from the engine benchmark JSON, loaded back unchanged, bad
files named with what is wrong, interpolation through the measured points, the measured profiles
replaying the engine's work, and the calibrated `simulate dllm` predicting the engine's
FDFO/sync ratios (a model-accuracy check: it compares numbers read from the committed JSON)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reference.sim.calibration import (
    Calibration,
    CalibrationError,
    CalibrationRow,
    SharedTime,
    fit_shared,
)
from schedspec_cli.simulate import simulate_main

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "engine-bench-cpu.json"
TABLE = ROOT / "docs" / "dllm-calibration-cpu.json"


def _bench() -> dict[str, Any]:
    """The committed engine benchmark JSON; runs written before the engine counted row-rounds
    and block allocations get stand-in counts (any count >= 1 serves the summing tests)."""
    bench: dict[str, Any] = json.loads(BENCH.read_text())
    for i, run in enumerate(bench["runs"]):
        run.setdefault("row_rounds", run["rounds"] * run["max_running"] + i)
        run.setdefault("block_allocations", 700 + i)
    return bench


def test_table_is_the_benchmark_summed_over_repeats(tmp_path: Path) -> None:
    bench = _bench()
    profiles = Calibration.load(TABLE).profiles
    cal = Calibration.from_bench(bench, "test", profiles)
    sync4 = next(r for r in cal.rows if r.mode == "sync" and r.max_running == 4)
    runs = [r for r in bench["runs"] if r["mode"] == "sync" and r["max_running"] == 4]
    assert sync4.forwards == sum(r["forwards"] for r in runs)
    assert sync4.row_rounds == sum(r["row_rounds"] for r in runs)
    assert sync4.block_allocations == sum(r["block_allocations"] for r in runs)
    assert sync4.seconds == pytest.approx(sum(r["seconds"] for r in runs))
    assert cal.repeats == bench["settings"]["repeats"]
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal.to_json()))
    loaded = Calibration.load(path)  # the file keeps seconds to 6 decimals
    assert loaded.measured_ratios == cal.measured_ratios
    assert loaded.profiles == profiles and loaded.repeats == cal.repeats
    for a, b in zip(loaded.rows, cal.rows, strict=True):
        assert (a.mode, a.max_running, a.forwards, a.rounds, a.row_rounds) == (
            b.mode,
            b.max_running,
            b.forwards,
            b.rounds,
            b.row_rounds,
        )
        assert a.block_allocations == b.block_allocations
        assert a.seconds == pytest.approx(b.seconds, abs=1e-6)


def test_committed_profiles_replay_the_measured_fdfo_work() -> None:
    """FDFO row-forwards do not depend on max_running (the engine is batch-invariant), so the
    profiles cycled over the benchmark's requests must do exactly the measured work."""
    cal = Calibration.load(TABLE)
    assert cal.profiles
    b = cal.block_size
    cycled = [cal.profiles[i % len(cal.profiles)] for i in range(cal.requests)]
    replayed = sum(p.prompt_len // b + sum(p.forwards) for p in cycled)
    tokens = sum(p.tokens for p in cycled)
    for row in cal.of("fdfo"):
        assert row.row_forwards == replayed * cal.repeats
        assert row.tokens == tokens * cal.repeats


def test_forward_model_passes_through_the_measured_points() -> None:
    cal = Calibration.load(TABLE)
    model = cal.forward_model("fdfo")
    for r in cal.of("fdfo"):
        rows = r.rows_per_forward
        assert model.batch_time(round(rows * cal.block_size), 0) == pytest.approx(
            r.seconds_per_forward, rel=0.02
        )
    assert cal.round_overhead("sync", 4) == pytest.approx(cal.of("sync")[1].seconds_per_round)


def _table(**changes: Any) -> str:
    data = json.loads(TABLE.read_text())
    data.update(changes)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", "not JSON"),
        ('{"schema": "other"}', "schema must be"),
        ('{"schema": "schedspec.dllm-calibration/1"}', "re-run scripts/calibrate_dllm.py"),
        ('{"schema": "schedspec.dllm-calibration/2"}', "re-run scripts/calibrate_dllm.py"),
        ('{"schema": "schedspec.dllm-calibration/3"}', "missing or bad field"),
        (_table(profiles=[{"prompt_len": 13, "forwards": [5], "tokens": 3}]), "block 0: 2..4"),
        (_table(repeats=0), "repeats must be >= 1"),
    ],
)
def test_bad_tables_are_named(tmp_path: Path, text: str, match: str) -> None:
    """Each bad table is a `CalibrationError` naming the file and what is wrong with it."""
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=match):
        Calibration.load(path)
    with pytest.raises(CalibrationError, match="cannot be read"):
        Calibration.load(tmp_path / "missing.json")


def test_a_table_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'\xff\xfe{"schema": 4}')
    with pytest.raises(CalibrationError, match=r"latin1\.json: not UTF-8 text \(byte 0\)"):
        Calibration.load(path)


@functools.cache
def _calibrated_output(*argv: str) -> str:
    """`simulate dllm --calibration TABLE ...`'s stdout (each command line runs once)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert simulate_main(["dllm", "--calibration", str(TABLE), *argv]) == 0
    return out.getvalue()


def _calibrated_lines(*argv: str) -> list[list[str]]:
    out = _calibrated_output(*argv)
    assert "predicted" in out and "measured" in out
    return [x.split() for x in out.splitlines()]


def test_calibrated_simulation_does_the_measured_work() -> None:
    """Replaying the profiles, the simulated scheduler does the engine's forwards, row-rounds
    and block allocations per run, sync's lock-step forwards included (within 2%: only the
    order of finishing may differ)."""
    cal = Calibration.load(TABLE)
    lines = _calibrated_lines("--profile-order", "cycle")
    checked = 0
    for k in cal.seats():
        for mode in ("sync", "fdfo", "fdfo+reuse"):
            line = next(x for x in lines if x[:2] == [str(k), mode] and len(x) == 8)
            row = cal.row(mode, k)
            assert row is not None
            measured = (row.forwards, row.row_rounds, row.block_allocations)
            for i, count in enumerate(measured):
                simulated, printed = float(line[2 + 2 * i]), float(line[3 + 2 * i])
                assert printed == pytest.approx(count / cal.repeats)
                assert simulated == pytest.approx(printed, rel=0.02), (k, mode, i)
            checked += 1
    assert checked == 3 * len(cal.seats())
    shared = cal.shared_time()
    assert f"{1000 * shared.per_row_round:.4f} ms per row-round" in _calibrated_output(
        "--profile-order", "cycle"
    )


def _ratio_lines(lines: list[list[str]], cal: Calibration) -> list[tuple[float, float, str]]:
    """(predicted, pooled measured, range) of every seat and FDFO mode, checked against the
    table's own numbers."""
    out = []
    for k in cal.seats():
        for mode in ("fdfo", "fdfo+reuse"):
            line = next(x for x in lines if x[:2] == [str(k), mode] and ".." in x[-1])
            predicted, pooled = float(line[2]), float(line[3])
            assert pooled == pytest.approx(cal.pooled_ratio(mode, "sync", k), abs=6e-4)
            assert float(line[5]) == cal.measured_ratios[f"{mode}/sync"][str(k)]
            out.append((predicted, pooled, line[7]))
    assert len(out) == 2 * len(cal.seats())
    return out


@pytest.mark.parametrize(("order", "bound"), [("cycle", 0.10), ("sample", 0.20)])
def test_calibrated_prediction_accuracy_at_every_seat(order: str, bound: float) -> None:
    """With the shared time model (one cost per forward, row, round, row-round and block
    allocation for every mode, so the modes differ only by the simulated work) the predicted
    FDFO/sync and FDFO+reuse/sync ratios lie within 10% of the pooled measurement at every
    measured seat count when the benchmark's order is replayed (the issue's goal). "sample"
    draws whole profiles at random, which changes which requests share a sync batch: within
    20%. The table is re-measured (scripts/calibrate_dllm.py): the bound is on whatever the
    committed table holds, not on numbers written here. (The range of the per-repeat paired
    ratios is printed but not asserted: with 3 repeats on an idle machine it can be narrower
    than the model's tolerance.)"""
    cal = Calibration.load(TABLE)
    lines = _calibrated_lines("--profile-order", order)
    for predicted, pooled, _ in _ratio_lines(lines, cal):
        assert abs(predicted / pooled - 1) < bound, (order, predicted, pooled)


def test_per_mode_costs_replay_the_measured_throughputs() -> None:
    """Each mode's own measured costs over the replayed work give back the pooled measured
    ratios (to 0.5%): the simulated forwards, rows and rounds are the engine's."""
    cal = Calibration.load(TABLE)
    lines = _calibrated_lines("--time-model", "per-mode")
    for predicted, pooled, _ in _ratio_lines(lines, cal):
        assert predicted == pytest.approx(pooled, rel=0.005)


def test_shared_time_model_fits_every_mode() -> None:
    """Every row's seconds within 15% of the fitted model's (a sanity bound on the fit: the
    ratio bound of 10% above is the goal; on a loaded machine single rows stray further)."""
    cal = Calibration.load(TABLE)
    shared = cal.shared_time()
    coefs = (shared.per_forward, shared.per_row, shared.per_round)
    assert min(*coefs, shared.per_row_round, shared.per_alloc) >= 0
    for row in cal.rows:
        assert shared.seconds(row) == pytest.approx(row.seconds, rel=0.15), row.mode
    model = shared.forward_model(cal.block_size)
    assert model.batch_time(4 * cal.block_size, 0) == pytest.approx(
        shared.per_forward + 4 * shared.per_row
    )


def test_paired_ratios_pool_several_benchmarks() -> None:
    bench = _bench()
    one = Calibration.from_bench(bench, "one")
    assert one.measured_ratios == bench["ratios"]  # the benchmark's own median paired ratios
    two = Calibration.from_benches([bench, bench], "two")
    assert two.repeats == 2 * one.repeats
    assert two.rows[0].forwards == 2 * one.rows[0].forwards
    assert two.rows[0].block_allocations == 2 * one.rows[0].block_allocations
    assert two.measured_ratios == one.measured_ratios  # the same runs twice: the same median
    assert two.paired_range == one.paired_range
    lo, hi = one.paired_range["fdfo/sync"]["4"]
    assert lo <= one.measured_ratios["fdfo/sync"]["4"] <= hi
    other = copy.deepcopy(bench)
    other["settings"]["block_size"] = 4
    with pytest.raises(CalibrationError, match="differ in block_size"):
        Calibration.from_benches([bench, other], "mixed")


def test_a_mode_the_time_model_has_not_is_left_out() -> None:
    """A benchmark run with `--rows-released` serves a fifth mode; the calibration is the four
    modes' as if it had not run (before, its rows failed the check: 'mode ... one of ...')."""
    bench = _bench()
    extra = copy.deepcopy(bench)
    extra["runs"] += [
        {**run, "mode": "fdfo+rows-released", "seconds": 2 * run["seconds"]}
        for run in bench["runs"]
        if run["mode"] == "fdfo"
    ]
    extra["ratios"]["fdfo+rows-released/sync"] = {"4": 1.5}
    extra["ratios"]["fdfo+reuse/fdfo+rows-released"] = {"4": 1.1}
    assert Calibration.from_bench(extra, "five modes") == Calibration.from_bench(
        bench, "five modes"
    )


def _row(
    mode: str, k: int, counts: tuple[int, int, int, int, int], t: SharedTime
) -> CalibrationRow:
    fwd, row_fwd, rounds, row_rounds, allocs = counts
    row = CalibrationRow(mode, k, fwd, row_fwd, rounds, 1, 1.0, 0.5, row_rounds, allocs)
    return CalibrationRow(mode, k, fwd, row_fwd, rounds, 1, t.seconds(row), 0.5, row_rounds, allocs)


@pytest.mark.parametrize("per_round", [0.0, 2e-5])
def test_fit_recovers_known_costs(per_round: float) -> None:
    """Rows made from known costs (a zero one included) give those costs back."""
    true = SharedTime(1.6e-3, 3.8e-4, per_round, 6.4e-5, 6.8e-5)
    rng = np.random.default_rng(7)
    rows = []
    for i in range(12):
        fwd, rows_per = int(rng.integers(200, 3200)), float(rng.uniform(1, 16))
        rounds = int(rng.integers(fwd // 4, fwd + 1))
        row_rounds = int(rounds * rng.uniform(1, 16))
        allocs = int(rng.integers(1, row_rounds + 1))
        counts = (fwd, int(fwd * rows_per), rounds, row_rounds, allocs)
        rows.append(_row("fdfo", 1 + i, counts, true))
    fit = fit_shared(tuple(rows))
    for name in ("per_forward", "per_row", "per_round", "per_row_round", "per_alloc"):
        assert getattr(fit, name) == pytest.approx(getattr(true, name), rel=1e-6, abs=1e-12)


def test_fit_weighs_every_row_by_its_relative_error() -> None:
    """A run 100 times as long (every count and its seconds x100) has the same relative error,
    so it does not change the fit: short 16-seat runs weigh as much as long 1-seat ones."""
    t = SharedTime(1.6e-3, 3.8e-4, 2e-5, 6.4e-5, 6.8e-5)
    rng = np.random.default_rng(11)
    rows = []
    for i in range(10):
        c = [int(x) for x in rng.integers(100, 5000, size=5)]
        base = _row("fdfo", 1 + i, (c[0], c[1], c[2], c[3], c[4]), t)
        rows.append(dataclasses.replace(base, seconds=base.seconds * rng.uniform(0.9, 1.1)))
    big = rows[0]
    scaled = dataclasses.replace(
        big,
        forwards=100 * big.forwards,
        row_forwards=100 * big.row_forwards,
        rounds=100 * big.rounds,
        row_rounds=100 * big.row_rounds,
        block_allocations=100 * big.block_allocations,
        seconds=100 * big.seconds,
    )
    one, other = fit_shared(tuple(rows)), fit_shared((scaled, *rows[1:]))
    for name in ("per_forward", "per_row", "per_round", "per_row_round", "per_alloc"):
        assert getattr(other, name) == pytest.approx(getattr(one, name), rel=1e-6, abs=1e-12)


def test_fit_keeps_costs_non_negative() -> None:
    """Seconds that fall with the allocations (an unconstrained fit would give them a negative
    cost) fit a zero allocation cost, and the rest still explain the rows."""
    t = SharedTime(1e-3, 2e-4, 1e-5, 3e-5, 0.0)
    rng = np.random.default_rng(3)
    rows = []
    for i in range(8):
        c = [int(x) for x in rng.integers(100, 5000, size=5)]
        base = _row("sync", 1 + i, (c[0], c[1], c[2], c[3], c[4]), t)
        allocs = base.block_allocations
        rows.append(dataclasses.replace(base, seconds=base.seconds * (1.5 - allocs / 10_000)))
    fit = fit_shared(tuple(rows))
    assert fit.per_alloc == 0.0
    assert min(fit.per_forward, fit.per_row, fit.per_round, fit.per_row_round) >= 0.0
    unconstrained = np.linalg.lstsq(
        np.array(
            [
                [r.forwards, r.row_forwards, r.rounds, r.row_rounds, r.block_allocations]
                for r in rows
            ],
            dtype=float,
        ),
        np.array([r.seconds for r in rows]),
        rcond=None,
    )[0]
    assert unconstrained[4] < 0  # the case really needs the constraint


def test_a_table_without_reuse_rows_is_refused_by_name(tmp_path: Path) -> None:
    data = json.loads(TABLE.read_text())
    data["rows"] = [r for r in data["rows"] if r["mode"] in ("sync", "fdfo")]
    path = tmp_path / "noreuse.json"
    path.write_text(json.dumps(data))
    cal = Calibration.load(path)
    with pytest.raises(CalibrationError, match=r"noreuse\.json: .* not determined"):
        cal.shared_time()


def test_fit_refuses_a_degenerate_table() -> None:
    """Without FDFO+reuse rows every row allocates once per row-round: the two costs cannot be
    told apart, and the fit says so instead of splitting them arbitrarily."""
    t = SharedTime(1e-3, 1e-4, 1e-5, 1e-5, 1e-5)
    rng = np.random.default_rng(5)
    rows = []
    for mode in ("sync", "fdfo"):
        for k in (1, 4, 16):
            fwd, row_fwd, rounds, row_rounds = (int(x) for x in rng.integers(100, 5000, size=4))
            rows.append(_row(mode, k, (fwd, row_fwd, rounds, row_rounds, row_rounds), t))
    with pytest.raises(CalibrationError, match=r"not determined by 6 rows \(rank 4\)"):
        fit_shared(tuple(rows), "t.json")
    with pytest.raises(CalibrationError, match=r"^calibration t\.json: .* by 3 rows \(rank 3\)"):
        fit_shared(tuple(rows[:3]), "t.json")


def test_a_benchmark_without_the_new_counts_is_refused(tmp_path: Path) -> None:
    """A benchmark JSON from before the engine counted row-rounds and allocations: the library
    and the script name the file and say to re-run the benchmark (the script in one line,
    exit status 2)."""
    old = _bench()
    for run in old["runs"]:
        del run["row_rounds"], run["block_allocations"]
    with pytest.raises(CalibrationError, match=r"old\.json: .*re-run `schedspec bench engine"):
        Calibration.from_bench(old, "old.json")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert "re-run" in _script_refusal(path, "--threads", "0")


def _script_refusal(bench: Path, *flags: str) -> str:
    """`calibrate_dllm.py --from-bench BENCH` refuses it: exit status 2, one line naming the
    file, no table written. Returns the line."""
    out = bench.parent / "cal.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "calibrate_dllm.py"),
            "--from-bench",
            str(bench),
            *flags,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bench) in lines[0], proc.stderr
    assert not out.exists()
    return lines[0]


def test_a_benchmark_with_a_zero_count_is_refused_before_the_engine_runs(tmp_path: Path) -> None:
    """Runs that count no forward (or take no time) cannot make a table: the library names the
    row, and the script names the file in one line (exit status 2) before it serves a prompt
    (it divided by zero writing the table, after profiling)."""
    bad = _bench()
    for run in bad["runs"]:
        if run["mode"] == "sync":
            run["forwards"] = run["rounds"] = 0
    with pytest.raises(CalibrationError, match=r"zero\.json: row sync x\d+: counts >= 1"):
        Calibration.from_bench(bad, "zero.json")
    timeless = _bench()
    timeless["runs"][0]["seconds"] = 0.0
    with pytest.raises(CalibrationError, match="not an engine benchmark JSON"):
        Calibration.from_bench(timeless, "timeless.json")
    path = tmp_path / "zero.json"
    path.write_text(json.dumps(bad))
    latin = tmp_path / "latin1.json"
    latin.write_bytes(b"\xff{}")
    for given, says in ((path, "counts >= 1"), (latin, "not UTF-8 text")):
        # serving a prompt would fail on this device: the refusal must come first
        assert says in _script_refusal(given, "--device", "no-such-device")
