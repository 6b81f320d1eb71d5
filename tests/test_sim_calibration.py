"""The dLLM calibration table: built from the engine benchmark JSON, loaded back unchanged, bad
files named with what is wrong, interpolation through the measured points, and the calibrated
`simulate dllm` printing predicted next to measured ratios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference.sim.calibration import Calibration, CalibrationError
from schedspec_cli.simulate import simulate_main

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "engine-bench-cpu.json"
TABLE = ROOT / "docs" / "dllm-calibration-cpu.json"


def test_table_is_the_benchmark_summed_over_repeats(tmp_path: Path) -> None:
    bench = json.loads(BENCH.read_text())
    cal = Calibration.from_bench(bench, "test")
    sync4 = next(r for r in cal.rows if r.mode == "sync" and r.max_running == 4)
    runs = [r for r in bench["runs"] if r["mode"] == "sync" and r["max_running"] == 4]
    assert sync4.forwards == sum(r["forwards"] for r in runs)
    assert sync4.seconds == pytest.approx(sum(r["seconds"] for r in runs))
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal.to_json()))
    # the file keeps seconds to 6 decimals; the committed table is what the script writes from
    # the committed benchmark
    for loaded in (Calibration.load(path), Calibration.load(TABLE)):
        assert loaded.measured_ratios == cal.measured_ratios
        for a, b in zip(loaded.rows, cal.rows, strict=True):
            assert (a.mode, a.max_running, a.forwards, a.rounds) == (
                b.mode,
                b.max_running,
                b.forwards,
                b.rounds,
            )
            assert a.seconds == pytest.approx(b.seconds, abs=1e-6)


def test_forward_model_passes_through_the_measured_points() -> None:
    cal = Calibration.load(TABLE)
    model = cal.forward_model("fdfo")
    for r in cal.of("fdfo"):
        rows = r.rows_per_forward
        assert model.batch_time(round(rows * cal.block_size), 0) == pytest.approx(
            r.seconds_per_forward, rel=0.02
        )
    assert cal.round_overhead("sync", 4) == pytest.approx(cal.of("sync")[1].seconds_per_round)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", "not JSON"),
        ('{"schema": "other"}', "schema must be"),
        ('{"schema": "schedspec.dllm-calibration/1"}', "missing or bad field"),
    ],
)
def test_bad_tables_are_named(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=match):
        Calibration.load(path)
    with pytest.raises(CalibrationError, match="cannot be read"):
        Calibration.load(tmp_path / "missing.json")


def test_calibrated_simulation_prints_predicted_and_measured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert simulate_main(["dllm", "--calibration", str(TABLE)]) == 0
    out = capsys.readouterr().out
    assert "predicted" in out and "measured" in out
    line = next(x for x in out.splitlines() if x.split()[:2] == ["1", "fdfo"])
    predicted, measured = float(line.split()[2]), float(line.split()[3])
    assert abs(predicted / measured - 1) < 0.10  # one seat: the time model alone decides
