"""Every measurement script checks its output paths when it parses its arguments: a run of
minutes must not end in a traceback because its `--json` (or `--out`) names a directory."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
# (script, output flag): every flag of the scripts that writes a file
OUTPUTS = [
    ("bench_ar_replay", "--json"),
    ("bench_catch_time", "--json"),
    ("bench_prefix_cache", "--json"),
    ("bench_sim_speed", "--json"),
    ("bench_trace_check", "--json"),
    ("cache_aware_tally", "--json"),
    ("fuzz_cli", "--json"),
    ("calibrate_dllm", "--out"),
    ("calibrate_dllm", "--bench-json"),
    ("probe_cold_cost", "--json"),
    ("probe_heavier_forward", "--json"),
    ("probe_overlap", "--json"),
    ("profile_round", "--json"),
    ("repro_vidur_rules", "--json"),
    ("sglang_radix_check", "--json"),
    ("sglang_vs_reference", "--json"),
    ("soak_engine", "--json"),
    ("vidur_speed", "--json"),
    ("vllm_async_check", "--json"),
    ("vllm_dllm_check", "--json"),
    ("vllm_dllm_shrink", "--json"),
    ("vllm_shrink", "--json"),
    ("vllm_differential", "--json"),
    ("vllm_whole_canvas_cost", "--json"),
    ("vidur_pipeline_check", "--json"),
]
# (script, output flag) of the scripts whose output is a directory
OUTPUT_DIRS = [("device_run", "--out")]


def test_the_list_covers_every_script_that_writes() -> None:
    """A new script with an output flag joins the list above (found by its flag's text)."""
    writers = set()
    for path in SCRIPTS.glob("*.py"):
        text = path.read_text()
        for flag in ('"--json"', '"--out"', '"--bench-json"', '"--csv"'):
            if f"add_argument({flag}" in text.replace("\n", "").replace(" ", ""):
                writers.add((path.stem, flag.strip('"')))
    assert writers == set(OUTPUTS) | set(OUTPUT_DIRS)


# every output flag, with whether it names a directory
CASES = [(s, f, False) for s, f in OUTPUTS] + [(s, f, True) for s, f in OUTPUT_DIRS]


def _targets(tmp_path: Path, directory: bool) -> list[tuple[Path, str]]:
    """The paths an output flag must refuse, each with the reason its message gives."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    if directory:
        return [(blocker, "this is an existing file"), (blocker / "run", "is a file")]
    return [(tmp_path, "this is a directory"), (blocker / "x.json", "is a file")]


def _check_refusal(code: object, stderr: str, flag: str, why: str) -> None:
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert "Traceback" not in stderr and len(lines) >= 1, stderr
    assert f"argument {flag}:" in lines[-1] and why in lines[-1], stderr


@pytest.mark.parametrize(("script", "flag", "directory"), CASES, ids=[s + f for s, f, _ in CASES])
def test_an_unwritable_output_is_refused_before_any_work(
    script: str,
    flag: str,
    directory: bool,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A file output refuses a directory, a directory output an existing file; both refuse a
    path under a file. Exit 2, one line naming the flag and why, nothing created.

    In this process (`main` called as `python scripts/NAME.py` calls it): a subprocess of a
    script that imports torch spends about 2 s of CPU importing it before its arguments are
    parsed, twice per flag. The test below runs one script as the command line does."""
    module = load_script(script)
    for target, why in _targets(tmp_path, directory):
        argv = [flag, str(target)]
        monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
        takes_argv = bool(inspect.signature(module.main).parameters)
        with pytest.raises(SystemExit) as exited:
            module.main(argv) if takes_argv else module.main()
        _check_refusal(exited.value.code, capsys.readouterr().err, flag, why)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.parametrize(("script", "flag"), [("soak_engine", "--json"), ("device_run", "--out")])
def test_the_command_line_refuses_an_unwritable_output_before_any_work(
    script: str, flag: str, tmp_path: Path
) -> None:
    """The same refusal from `python scripts/NAME.py`, as a user runs it."""
    for target, why in _targets(tmp_path, directory=(script, flag) in OUTPUT_DIRS):
        res = subprocess.run(
            [sys.executable, str(SCRIPTS / f"{script}.py"), flag, str(target)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
        _check_refusal(res.returncode, res.stderr, flag, why)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
