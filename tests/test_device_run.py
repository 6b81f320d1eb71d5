"""scripts/device_run.py: the release's device checks as one prepared run within a budget."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.script_module import load_script

device_run = load_script("device_run")
Step = device_run.Step

ROOT = Path(__file__).resolve().parents[1]
# pytest's own quieting flags, which release.md's command leaves out
PYTEST_QUIET = {"-q", "-p", "no:cacheprovider"}


def _as_release_md_writes_it(step: Any) -> str:
    """The step's command without the interpreter, pytest's quieting flags and `--json PATH`,
    for the CUDA device: the words release.md shows (a report's path left out)."""
    argv = step.argv(Path("out"), "cuda")
    words = argv[3:] if argv[1] == "-m" else argv[1:]  # `python -m module` or `python script`
    if argv[2] == "pytest":
        words = ["pytest", *(w for w in words if w not in PYTEST_QUIET)]
    if "--json" in words:
        i = words.index("--json")
        del words[i : i + 2]
    return " ".join(w for w in words if not w.startswith("out/"))  # a report's path


def test_every_step_is_a_command_release_md_names() -> None:
    text = (ROOT / "docs" / "release.md").read_text(encoding="utf-8")
    for step in device_run.STEPS:
        assert _as_release_md_writes_it(step) in text, step.name
    assert "scripts/device_run.py" in text


def test_the_steps_run_the_gate_first_and_fit_a_session() -> None:
    """The release gate (parity, then its check) leads, so a short budget still gives a
    verdict; the whole run's expected time fits the default budget, which leaves a lent
    machine's 600 s per command a minute for start-up."""
    names = [s.name for s in device_run.STEPS]
    assert names[:2] == ["parity", "release-check"]
    assert len(set(names)) == len(names)
    assert sum(s.expected_s for s in device_run.STEPS) <= device_run.DEFAULT_BUDGET_S <= 540


def test_dry_run_lists_the_steps_in_order_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert device_run.main(["--dry-run", "--out", str(out), "--only", "soak", "parity"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["parity", "soak", "total"]
    assert f"--json {out}/parity.json" in lines[0] and "--device cuda" in lines[0]
    assert lines[2].split()[:3] == ["total", "130", "s"]
    assert "skipped" not in "".join(lines)
    assert not out.exists()
    # what a short budget would skip, were every step to take its expected time
    assert device_run.main(["--dry-run", "--out", str(out), "--budget-s", "60"]) == 0
    lines = capsys.readouterr().out.splitlines()
    skipped = [line.split()[0] for line in lines if line.endswith("(skipped at this --budget-s)")]
    assert skipped[:1] == ["parity"] and "release-check" not in skipped


def test_runner_records_codes_and_logs_skips_what_does_not_fit_and_stops_a_hang(
    tmp_path: Path,
) -> None:
    py = sys.executable
    steps = [
        Step("ok", (py, "-c", "print('to {out} on {device}')"), 0.0),
        Step("fails", (py, "-c", "import sys; print('bad'); sys.exit(3)"), 0.0),
        Step("hangs", (py, "-c", "import time; time.sleep(60)"), 0.0),
        Step("too-long", (py, "-c", "print('never')"), 1e6),
        Step("after", (py, "-c", "print('still runs')"), 0.0),
    ]
    results = device_run.run_steps(steps, tmp_path, "cpu", budget_s=100, timeout=lambda s: 1.0)
    by_name = {r.name: r for r in results}
    assert [r.name for r in results] == [s.name for s in steps]
    assert by_name["ok"].passed and by_name["ok"].returncode == 0
    assert (tmp_path / "ok.log").read_text().strip() == f"to {tmp_path} on cpu"
    assert by_name["fails"].returncode == 3 and not by_name["fails"].passed
    assert (tmp_path / "fails.log").read_text().strip() == "bad"
    assert by_name["hangs"].returncode == 124
    assert "stopped after 1 s" in (tmp_path / "hangs.log").read_text()
    assert by_name["too-long"].skipped and by_name["too-long"].returncode is None
    assert not (tmp_path / "too-long.log").exists()
    assert by_name["after"].passed


def test_a_step_is_stopped_at_three_times_its_time_and_at_least_a_minute_more() -> None:
    assert device_run.step_timeout(Step("a", ("x",), 10)) == 70
    assert device_run.step_timeout(Step("b", ("x",), 150)) == 450


def test_a_run_writes_its_summary_and_fails_when_a_step_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real step through the command line: release-check without a parity report exits 2,
    so the run exits 1 and the summary says which step and how."""
    out = tmp_path / "run"
    code = device_run.main(["--device", "cpu", "--out", str(out), "--only", "release-check"])
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"] == "cpu"
    (step,) = summary["steps"]
    assert step["name"] == "release-check" and step["returncode"] == 2 and not step["skipped"]
    assert "parity.json" in (out / "release-check.log").read_text()
    assert "release-check" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "tpu"], "--device: cuda, cuda:N or cpu, got 'tpu'"),
        (["--device", "gpu", "--dry-run"], "--device: cuda, cuda:N or cpu, got 'gpu'"),
        (["--budget-s", "0"], "--budget-s: a positive number"),
        (["--budget-s", "nan"], "--budget-s: a positive number of seconds, got nan"),
        (["--budget-s", "inf", "--dry-run"], "--budget-s: a positive number of seconds, got inf"),
    ],
)
def test_bad_flags_end_in_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert device_run.main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_cuda_where_there_is_none_ends_in_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert device_run.main(["--out", str(tmp_path / "run")]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_a_python_without_torch_ends_in_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, `python3 scripts/device_run.py` under a system Python without torch was a
    traceback (`ModuleNotFoundError: No module named 'torch'`), exit 1."""
    monkeypatch.setattr(device_run, "module_available", lambda name: name != "torch")
    assert device_run.main(["--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "needs torch, which is not installed here" in err
    assert ".venv/bin/python scripts/device_run.py" in err
    assert not (tmp_path / "run").exists()
