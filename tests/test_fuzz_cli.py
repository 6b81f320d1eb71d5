"""`scripts/fuzz_cli.py`, the command-line fuzzer: it reads each command's options from its own
`--help`, and it fails (exit 1, printing the argv) on a command that crashes with a traceback,
and only then.

The seeded bug is a stand-in `schedspec` built with argparse: its `crashy` command raises an
uncaught exception when given `--plots` in its `--plots=DIR` spelling (the shape of the bug the
fuzzer found in `simulate --plots=DIR` on 2026-11-26), its `calm` command never does.
"""

from __future__ import annotations

import argparse
import json
import random
import stat
import sys
from pathlib import Path

import pytest

from schedspec_cli.main import main as cli_main
from tests.script_module import load_script

fuzz_cli = load_script("fuzz_cli")

FAKE = """#!{python}
import argparse, sys
p = argparse.ArgumentParser(prog="schedspec")
sub = p.add_subparsers(dest="command", required=True)
for name in ("crashy", "calm"):
    c = sub.add_parser(name)
    c.add_argument("--plots")
    c.add_argument("--count", type=int)
    c.add_argument("--verbose", action="store_true")
if len(sys.argv) > 2 and sys.argv[2] == "--help":
    sub.choices[sys.argv[1]].print_help()
    sys.exit(0)
args = p.parse_args()
if args.command == "crashy" and any(a.startswith("--plots=") for a in sys.argv):
    raise RuntimeError("plots spelled with '=' are not handled")
"""


@pytest.fixture
def fake_schedspec(tmp_path: Path) -> Path:
    path = tmp_path / "schedspec"
    path.write_text(FAKE.format(python=sys.executable), encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_options_are_read_from_a_commands_help() -> None:
    p = argparse.ArgumentParser(prog="schedspec thing")
    p.add_argument("log")
    p.add_argument("--max-running", type=int, nargs="+")
    p.add_argument("--family", choices=("dllm", "ar"))
    p.add_argument("--keep-going", action="store_true")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--sequential", action="store_true")
    group.add_argument("--turn-ms", type=float)
    usage = fuzz_cli.read_usage(p.format_help())
    assert usage.positionals == 1
    assert usage.options == (
        fuzz_cli.Option("--max-running", True),
        fuzz_cli.Option("--family", True, ("dllm", "ar")),
        fuzz_cli.Option("--keep-going", False),
        fuzz_cli.Option("--sequential", False),
        fuzz_cli.Option("--turn-ms", True),
    )


def test_the_fuzzer_fails_on_a_command_that_crashes_and_names_its_argv(
    fake_schedspec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fuzz.json"
    argv = ["--schedspec", str(fake_schedspec), "--runs", "40", "--seed", "0", "--json", str(out)]
    assert fuzz_cli.main([*argv, "--commands", "crashy"]) == 1
    printed = capsys.readouterr().out
    assert "BAD exit 1: schedspec crashy" in printed and "--plots=" in printed, printed
    assert "RuntimeError: plots spelled with '=' are not handled" in printed, printed
    bad = json.loads(out.read_text())["commands"]["crashy"]["bad"]
    assert bad and all(any(a.startswith("--plots=") for a in b["argv"]) for b in bad), bad
    # the same draws against a command that never crashes: nothing is bad
    assert fuzz_cli.main([*argv, "--commands", "calm"]) == 0
    assert json.loads(out.read_text())["commands"]["calm"]["bad"] == []


def test_a_plausible_argv_has_only_plausible_values_and_real_inputs(
    fake_schedspec: Path, tmp_path: Path
) -> None:
    """A third of the runs draw plausible values only: `--plots` gets a directory name or a
    file, `--count` (no plausible value: its name suggests none) is left out, and no edge
    value appears; the other draws do use edge values."""
    fuzzer = fuzz_cli.Fuzzer(str(fake_schedspec), tmp_path, 0, 10.0)
    plausible_plots = {"plotsdir", str(tmp_path / "a-file.txt")}
    for _ in range(30):
        argv = fuzzer.argv("crashy", plausible=True)
        assert "--count" not in argv and not any(a.startswith("--count=") for a in argv), argv
        plots = [a.split("=", 1)[1] for a in argv if a.startswith("--plots=")]
        plots += [argv[i + 1] for i, a in enumerate(argv) if a == "--plots"]
        assert set(plots) <= plausible_plots, argv
    edgy = [fuzzer.argv("crashy") for _ in range(30)]
    assert any("--count" in a or any(x.startswith("--count=") for x in a) for a in edgy), edgy


def test_a_short_run_on_the_real_command_line_passes(tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    argv = ["--runs", "4", "--seed", "1", "--commands", "list-impls,simulate sbs"]
    assert fuzz_cli.main([*argv, "--json", str(out)]) == 0
    tallies = json.loads(out.read_text())["commands"]
    assert sum(t["runs"] for t in tallies.values()) == 4
    assert all(t["bad"] == [] for t in tallies.values())


def test_the_recorded_inputs_get_past_the_readers(tmp_path: Path) -> None:
    """What a positional argument gets half the time is real: both logs conform, and the parity
    report is read and judged (not a release run: it ran on the CPU)."""
    dllm, ar, report = fuzz_cli.recorded_inputs(tmp_path)
    assert cli_main(["check-trace", dllm]) == 0
    assert cli_main(["check-trace", ar]) == 0
    assert cli_main(["release-check", report, "--impl", "reference-dllm"]) == 1


def test_damaged_logs_are_read_to_a_verdict_or_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`damage` changes a recorded log, and `check-trace` reads each damaged copy to a verdict
    (exit 1) or an input error (exit 2, one line), never a traceback; across the seeds both
    happen, so the copies reach past the reader into the checks."""
    dllm, ar, _ = fuzz_cli.recorded_inputs(tmp_path)
    capsys.readouterr()
    exits = []
    for seed in range(24):
        original = Path((dllm, ar)[seed % 2]).read_text(encoding="utf-8")
        damaged = fuzz_cli.damage(original, random.Random(seed))
        assert damaged != original, seed
        path = tmp_path / f"damaged-{seed}.jsonl"
        path.write_text(damaged, encoding="utf-8")
        exits.append(cli_main(["check-trace", str(path)]))
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") <= 1, (seed, err)
    assert set(exits) <= {0, 1, 2} and {1, 2} <= set(exits), exits


def test_a_missing_executable_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as done:
        fuzz_cli.main(["--schedspec", str(tmp_path / "nothing-here")])
    assert done.value.code == 2
