"""`schedspec simulate`'s inputs: a step histogram that is not finite, a --steps range past any
block, an output path that is one of the command's input files, a trace CSV with a byte-order
mark, and a Ray flag next to --backend local. Each refusal is exit 2 with one line on stderr
naming the flag (no numpy warning, nothing on stdout, nothing written)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from reference.sim import workload as wl
from reference.sim.dllm import MAX_FORWARDS_PER_BLOCK, StepDist
from reference.sim.errors import SimConfigError
from schedspec_cli.main import main
from schedspec_cli.simulate import MAX_SIM_BLOCK_SIZE
from spec.ar.vidur_trace import parse_vidur_trace_text, read_vidur_trace_file

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT / "docs" / "dllm-calibration-cpu.json"
TRACE = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.1,12,4\n"
SMALL_DLLM = ["--seats", "1", "--requests", "2"]
SMALL_SWEEP = ["--qps", "16", "--scheduler", "simple", "--replicas", "1", "--kv-tokens", "8192"]
TABLE_MODEL = ["--exec-model", "table:{table}"]


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `schedspec argv`, which must refuse its input: exit 2, nothing on stdout, no warning,
    one line on stderr without a traceback; returns that line."""
    capsys.readouterr()  # what an earlier call printed is not this one's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, f"exit {code}\n{out}{err}"
    assert not out, f"printed results before refusing its input:\n{out}"
    assert not caught, [str(w.message) for w in caught]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _report(path: Path, histogram: str) -> Path:
    path.write_text(
        '{"block_size": 8, "algorithm": {"LowConfidence": {"histogram": ' + histogram + "}}}"
    )
    return path


# 1. counts that are not finite, or whose sum overflows, make the probabilities nan


@pytest.mark.parametrize("steps", ["3:inf", "3:nan", "3:-inf", "3:1e308,4:1e308"])
def test_non_finite_step_counts_are_refused_naming_steps(
    steps: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(["simulate", "dllm", "--steps", steps, *SMALL_DLLM], capsys)
    assert f"invalid steps={steps!r}: --steps 'F:COUNT,F:COUNT,...'" in line
    assert "each COUNT a finite number >= 0, their sum positive and finite" in line
    assert "nan forwards" not in line and "Probabilities" not in line


@pytest.mark.parametrize("histogram", ['{"3": Infinity, "4": 1}', '{"3": 1e308, "4": 1e308}'])
def test_a_rounds_report_with_non_finite_counts_is_refused_naming_the_file(
    histogram: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _report(tmp_path / "report.json", histogram)
    line = refused(["simulate", "dllm", "--steps-report", str(report), *SMALL_DLLM], capsys)
    assert f"invalid --steps-report='{report}': a histogram for LowConfidence" in line
    assert "finite numbers >= 0, with a positive and finite sum" in line


def test_a_step_dist_refuses_non_finite_weights() -> None:
    for weights in ((math.inf,), (math.nan,), (1e308, 1e308)):
        with pytest.raises(SimConfigError, match="finite"):
            StepDist(tuple(range(3, 3 + len(weights))), weights)
    assert StepDist((3, 4), (1e307, 1e307)).mean() == pytest.approx(3.5)


def test_no_numpy_warning_reaches_the_terminal(tmp_path: Path) -> None:
    """The real stderr (the warning went there, not to pytest): one line."""
    schedspec = Path(sys.executable).parent / "schedspec"
    res = subprocess.run(
        [str(schedspec), "simulate", "dllm", "--steps", "3:inf", *SMALL_DLLM],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert res.returncode == 2 and not res.stdout, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "--steps" in res.stderr, res.stderr


# 2. forwards per block are at most the largest block size plus one


def test_the_forwards_bound_is_the_largest_block_plus_one() -> None:
    assert MAX_FORWARDS_PER_BLOCK == MAX_SIM_BLOCK_SIZE + 1 == 257
    widest = StepDist.parse(f"uniform:2-{MAX_FORWARDS_PER_BLOCK}")
    assert widest.values == tuple(range(2, 258))
    assert StepDist.parse("2:1,257:3").values == (2, 257)
    with pytest.raises(SimConfigError, match=r"2 <= LO <= HI <= 9 \(this has LO 2, HI 10\)"):
        StepDist.parse("uniform:2-10", max_forwards=9)


@pytest.mark.parametrize(
    ("steps", "has"),
    [
        ("uniform:2-258", "LO 2, HI 258"),
        ("uniform:1-99999999999999999999", "LO 1, HI 99999999999999999999"),
        ("uniform:9-3", "LO 9, HI 3"),
        ("258:1", "F 258"),
        (f"{10**30}:1", f"F {10**30}"),
        ("1:1", "F 1"),
        ("3:1,3:5", "F 3 twice"),
        ("2:0", "counts summing to 0"),
    ],
)
def test_a_step_range_past_any_block_is_refused_with_the_valid_range(
    steps: str, has: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(["simulate", "dllm", "--steps", steps, *SMALL_DLLM], capsys)
    assert "--steps 'F:COUNT,F:COUNT,...' with each F from 2 to 257" in line
    assert "'uniform:LO-HI' with 2 <= LO <= HI <= 257" in line
    assert line.endswith(f"(this has {has})"), line


# 3. an output written over one of the command's input files would destroy it


def _inputs(tmp_path: Path) -> dict[str, Path]:
    files = {
        "trace": tmp_path / "trace.csv",
        "table": tmp_path / "table.json",
        "report": tmp_path / "report.json",
        "cal": tmp_path / "cal.json",
    }
    files["trace"].write_text(TRACE)
    files["table"].write_text('{"points": [[1, 0.01], [1000, 0.02]]}')
    _report(files["report"], '{"3": 2, "4": 1}')
    files["cal"].write_bytes(CALIBRATION.read_bytes())
    return files


@pytest.mark.parametrize(
    ("argv", "input_flag", "output_flag", "name"),
    [
        (["replicas", "--trace-csv", "{trace}", "--json", "{trace}"], "--trace-csv", "--json", ""),
        (["replicas", "--trace-csv", "{link}", "--json", "{trace}"], "--trace-csv", "--json", ""),
        (["sbs", "--trace-csv", "{trace}", "--trace", "{trace}"], "--trace-csv", "--trace", ""),
        (
            ["replicas", "--exec-model", "table:{table}", "--json", "{table}"],
            "--exec-model",
            "--json",
            "table",
        ),
        (
            ["dllm", "--steps-report", "{report}", *SMALL_DLLM, "--json", "{report}"],
            "--steps-report",
            "--json",
            "report",
        ),
        (["dllm", "--calibration", "{cal}", "--json", "{cal}"], "--calibration", "--json", "cal"),
        (
            ["dllm", "--forward", "table:{table}", *SMALL_DLLM, "--trace", "{table}"],
            "--forward",
            "--trace",
            "table",
        ),
        (
            ["sweep", "--backend", "local", *SMALL_SWEEP, *TABLE_MODEL, "--csv", "{table}"],
            "--exec-model",
            "--csv",
            "table",
        ),
    ],
)
def test_an_output_over_an_input_file_is_refused(
    argv: list[str],
    input_flag: str,
    output_flag: str,
    name: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = _inputs(tmp_path)
    (tmp_path / "link.csv").symlink_to(files["trace"])
    before = {p: p.read_bytes() for p in files.values()}
    filled = [a.replace("{link}", str(tmp_path / "link.csv")) for a in argv]
    for key, path in files.items():
        filled = [a.replace(f"{{{key}}}", str(path)) for a in filled]
    line = refused(["simulate", *filled], capsys)
    target = files[name or "trace"]
    assert f"invalid {output_flag}='{target}': another path than {input_flag}'s" in line
    assert {p: p.read_bytes() for p in files.values()} == before


def test_the_shipped_rounds_report_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --steps or --steps-report, dllm reads the shipped gpu/assets/rounds_report.json
    (a copy here, so that a regression overwrites the copy)."""
    import reference.sim.dllm

    report = tmp_path / "rounds_report.json"
    before = reference.sim.dllm.ROUNDS_REPORT.read_bytes()
    report.write_bytes(before)
    monkeypatch.setattr(reference.sim.dllm, "ROUNDS_REPORT", report)
    monkeypatch.chdir(tmp_path)
    line = refused(["simulate", "dllm", *SMALL_DLLM, "--json", "rounds_report.json"], capsys)
    assert (
        "invalid --json='rounds_report.json': another path than the default --steps-report's"
        in line
    )
    assert report.read_bytes() == before


# 4. a trace CSV that starts with a UTF-8 byte-order mark (as Excel writes it)


def test_a_trace_with_a_byte_order_mark_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbf" + TRACE.encode())
    plain = parse_vidur_trace_text(TRACE)
    assert read_vidur_trace_file(path) == plain
    assert parse_vidur_trace_text("\ufeff" + TRACE) == plain  # decoded as plain UTF-8
    quoted = '\ufeff"arrived_at","num_prefill_tokens","num_decode_tokens"\n0.0,10,5\n0.1,12,4\n'
    assert parse_vidur_trace_text(quoted) == plain
    assert list(wl.read_trace(path).prefill) == [10, 12]
    assert main(["simulate", "replicas", "--trace-csv", str(path)]) == 0
    assert "2 requests on 4 replicas" in capsys.readouterr().out


# 5. a Ray-only flag the sweep's backend would ignore


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (
            ["--backend", "local", "--address", "auto"],
            "invalid --address='auto': only with --backend ray",
        ),
        (
            ["--backend", "local", "--num-cpus", "2"],
            "invalid --num-cpus=2: only with --backend ray",
        ),
        (
            ["--backend", "local", "--address", "auto", "--num-cpus", "2"],
            "drop --address, --num-cpus",
        ),
        (
            ["--address", "auto", "--num-cpus", "2"],
            "invalid --num-cpus=2: only with a local Ray (--backend ray without --address",
        ),
    ],
)
def test_a_ray_flag_the_sweep_would_ignore_is_refused(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(["simulate", "sweep", *SMALL_SWEEP, "--requests", "5", *flags], capsys)
    assert says in line


def test_a_local_sweep_without_ray_flags_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "sweep", "--backend", "local", *SMALL_SWEEP, "--requests", "5"]) == 0
    assert "1 points on one process" in capsys.readouterr().err


def test_a_report_that_parses_still_runs(tmp_path: Path) -> None:
    report = _report(tmp_path / "r.json", '{"3": 2, "4": 1}')
    out = tmp_path / "out.json"
    argv = ["simulate", "dllm", "--steps-report", str(report), *SMALL_DLLM, "--json", str(out)]
    assert main(argv) == 0
    assert json.loads(out.read_text())["distribution"]["values"] == [3, 4]
