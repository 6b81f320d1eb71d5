"""The shrink scripts' command line (`scripts/vllm_shrink.py`, `scripts/vllm_dllm_shrink.py`,
`integrations.vllm.shrink_cli`), without vLLM: a usage error is one line on stderr and exit 2;
a configuration vLLM refuses is a usage error when the flags made it refuse (vLLM serves the
program without them), and nothing to shrink (exit 0, as before) when vLLM refuses the program
as drawn. The same over vLLM itself: tests/test_real_vllm_shrink.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.shrink_cli import RefusedByFlags, shrink_target
from spec.errors import ConfigError
from tests.script_module import SCRIPTS, load_script

SHRINKS = ("vllm_shrink", "vllm_dllm_shrink")
# (script, argv) a user can type that are usage errors, each refused before anything runs
BAD = [
    (script, argv)
    for script in SHRINKS
    for argv in (
        ["--seed", "-1"],
        ["--seed", "1", "--budget", "0"],
        ["--seed", "1", "--pipeline-parallel", "0"],
        ["--seed", "1", "--rule", "nonsense"],
        ["--seed", "x"],
        ["--seed", "1", "--bogus"],
        [],
    )
] + [("vllm_dllm_shrink", ["--seed", "1", "--loop", "sync", "--pipeline-parallel", "2"])]


def _one_line(err: str, script: str) -> str:
    """The one line of `err`, checked: `scripts/NAME.py: error: ...`, no usage block."""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"scripts/{script}.py: error: "), err
    assert "usage:" not in err and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize(("script", "argv"), BAD, ids=[f"{s}:{' '.join(a)}" for s, a in BAD])
def test_a_usage_error_is_one_line(
    script: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 (`SystemExit`, as argparse's own) with one line on stderr and nothing on stdout:
    no usage block of ~40 lines before the error (found by a review)."""
    module = load_script(script)
    with pytest.raises(SystemExit) as leaving:
        module.main(argv)
    assert leaving.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    _one_line(err, script)


def test_the_seed_error_says_what_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script("vllm_shrink")
    with pytest.raises(SystemExit):
        module.main(["--seed", "-1"])
    line = _one_line(capsys.readouterr().err, "vllm_shrink")
    assert line.endswith("--seed must be >= 0, --budget and --pipeline-parallel >= 1"), line


@pytest.mark.parametrize("script", SHRINKS)
def test_help_still_prints_the_usage(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = load_script(script)
    with pytest.raises(SystemExit) as leaving:
        module.main(["--help"])
    assert leaving.value.code == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: scripts/{script}.py") and "--seed" in out and err == ""


@pytest.mark.parametrize("script", SHRINKS)
def test_the_command_line_says_a_usage_error_in_one_line(script: str) -> None:
    """As a user runs it: `python scripts/NAME.py --seed -1`."""
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / f"{script}.py"), "--seed", "-1"],
        capture_output=True,
        text=True,
        cwd=Path(SCRIPTS).parent,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == "", done
    _one_line(done.stderr, script)


# ----------------------------------------------------------------- a configuration vLLM refuses
def _refuses(*_: Any) -> None:
    raise ConfigError("output index", 4098, "0..4095\n(the adapter's token ids fit vLLM's)")


def _runs(*_: Any) -> None:
    return None


def _breaks(*_: Any) -> None:
    raise EngineCoreViolation("progress", "sync loop: not drained")


@pytest.mark.parametrize("plain", [_runs, _breaks], ids=["runs", "breaks-a-rule"])
def test_a_refusal_the_flags_make_is_refused_by_flags(plain: Callable[[bool], None]) -> None:
    """vLLM serves the program without the flags (it runs, or breaks a rule): the flags made
    it refuse, an input error said in one line with what would be valid."""
    with pytest.raises(RefusedByFlags) as refused:
        shrink_target("program 0 (random)", _refuses, None, None, plain=plain)
    said = str(refused.value)
    assert "\n" not in said, said
    assert said.startswith("vLLM refuses program 0 (random) with the flags given"), said
    assert "invalid output index=4098: 0..4095 (the adapter's" in said and "valid: " in said


def test_a_program_refused_as_drawn_is_nothing_to_shrink(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """vLLM refuses the program without the flags too: the program's own configuration, which
    the check scripts count as refused, neither passed nor failed; its meaning is unchanged."""
    assert shrink_target("program 3 (random)", _refuses, None, None, plain=_refuses) is None
    out = capsys.readouterr().out
    assert out.startswith("program 3 (random): vLLM refuses its configuration: invalid "), out
    assert out.count("\n") == 1, out


def test_the_program_is_asked_of_the_loop_that_refused() -> None:
    """Refused in the asynchronous loop only (the synchronous one breaking another rule): the
    program without the flags is run in the asynchronous loop."""
    asked: list[bool] = []

    def run(async_scheduling: bool) -> None:
        if not async_scheduling:
            raise EngineCoreViolation("progress", "sync loop: not drained")
        _refuses()

    def plain(async_scheduling: bool) -> None:
        asked.append(async_scheduling)

    with pytest.raises(RefusedByFlags, match="in the async loop"):
        shrink_target("program 0 (random)", run, None, "kv_covers_scheduled", plain=plain)
    assert asked == [True]


def test_a_violation_or_a_pass_is_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a refusal the program without the flags is never run."""

    def never(_: bool) -> None:
        raise AssertionError("run without the flags although vLLM refused nothing")

    assert shrink_target("program 1 (random)", _runs, None, None, plain=never) is None
    assert "nothing to shrink" in capsys.readouterr().out
    found = shrink_target("program 2 (random)", _breaks, "sync", None, plain=never)
    assert found is not None and found[0] == "sync" and found[1].rule == "progress"


def test_the_diffusion_script_refuses_flags_vllm_refuses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`scripts/vllm_dllm_shrink.py` with a fix vLLM refuses (a stand-in for vLLM that refuses
    any run with a fix): exit 2, one line; without the fix vLLM serves the program as drawn."""
    module = load_script("vllm_dllm_shrink")

    def run(program: Any, async_scheduling: bool, fixes: Any = (), trace: Any = None) -> None:
        if fixes:
            raise ConfigError("serving", "...", "a configuration vLLM accepts")

    monkeypatch.setattr(module, "run_dllm_named", run)
    with pytest.raises(SystemExit) as leaving:
        module.main(["--seed", "0", "--whole-canvas-fix"])
    assert leaving.value.code == 2
    out, err = capsys.readouterr()
    line = _one_line(err, "vllm_dllm_shrink")
    assert "vLLM refuses program 0 (random; fix whole-canvas) with the flags given" in line
    assert out == ""


def test_the_diffusion_script_says_a_program_refused_as_drawn(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stand-in for vLLM that refuses the program with or without the flags: nothing to
    shrink, exit 0, as before."""
    module = load_script("vllm_dllm_shrink")
    monkeypatch.setattr(module, "run_dllm_named", _refuses)
    assert module.main(["--seed", "0", "--whole-canvas-fix"]) == 0
    out, err = capsys.readouterr()
    assert "program 0 (random; fix whole-canvas): vLLM refuses its configuration" in out, out
    assert err == ""
