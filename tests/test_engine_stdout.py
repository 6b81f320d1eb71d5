"""`schedspec_cli.engine_stdout`: while `verify` drives an implementation, what the
implementation writes to stdout (by `print` or straight to descriptor 1, as a native
extension does) goes to stderr, so stdout carries only the command's table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from schedspec_cli.engine_stdout import implementation_stdout_to_stderr
from schedspec_cli.main import main
from tests.user_module import write_user_module

ROOT = Path(__file__).resolve().parents[1]


def write_both_ways(text: str) -> None:
    print(f"{text} by print", flush=True)
    os.write(1, f"{text} to descriptor 1\n".encode())


def test_inside_both_ways_of_writing_to_stdout_reach_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with implementation_stdout_to_stderr():
        write_both_ways("inside")
    write_both_ways("after")
    seen = capfd.readouterr()
    assert seen.err == "inside by print\ninside to descriptor 1\n"
    assert seen.out == "after by print\nafter to descriptor 1\n"


def test_stdout_is_back_after_an_error(capfd: pytest.CaptureFixture[str]) -> None:
    stream = sys.stdout
    with pytest.raises(RuntimeError), implementation_stdout_to_stderr():
        raise RuntimeError("inside")
    assert sys.stdout is stream
    write_both_ways("after")
    assert capfd.readouterr().out == "after by print\nafter to descriptor 1\n"


NOISY = """
import os
from reference.dllm import REFERENCE_DLLM
from spec.config import DllmConfig
from spec.adapter import EventSink

def noisy(config: DllmConfig, sink: EventSink):
    print("engine chatter by print")
    os.write(1, b"engine chatter to descriptor 1\\n")
    return REFERENCE_DLLM.factory(config, sink)
"""


def test_verify_keeps_an_implementations_prints_off_its_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    write_user_module(tmp_path, monkeypatch, "noisy_impl", NOISY)
    code = main(["verify", "--impl", "noisy_impl:noisy", "--examples", "5"])
    seen = capfd.readouterr()
    assert code == 0, seen
    assert "chatter" not in seen.out
    assert seen.out.splitlines()[0].split()[:3] == ["impl", "family", "result"]
    assert "engine chatter by print" in seen.err
    assert "engine chatter to descriptor 1" in seen.err


#: Run with buffered stdio (no `PYTHONUNBUFFERED`, which also makes C's stdio unbuffered) and
#: stdout a pipe: C's `printf` and the original stream keep what they are given.
BUFFERED = """
import ctypes, sys
from schedspec_cli.engine_stdout import implementation_stdout_to_stderr
libc = ctypes.CDLL(None)
libc.printf(b"before, by C\\n")
with implementation_stdout_to_stderr():
    libc.printf(b"inside, by C\\n")
    sys.__stdout__.write("inside, by the original stream\\n")
print("the table")
"""


def test_what_native_code_and_the_original_stream_leave_buffered_lands_on_stderr() -> None:
    """What was buffered before the guard reaches stdout; what the implementation left
    buffered inside reaches stderr, not the table after it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run(
        [sys.executable, "-c", BUFFERED],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "before, by C\nthe table\n", done
    # two buffers, flushed one after the other: their lines keep no order between them
    assert sorted(done.stderr.splitlines()) == [
        "inside, by C",
        "inside, by the original stream",
    ], done


def test_without_a_stdout_nothing_is_redirected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Descriptor 1 closed at start: Python has no `sys.stdout`; the guard changes nothing."""
    monkeypatch.setattr(sys, "stdout", None)
    with implementation_stdout_to_stderr():
        assert sys.stdout is None


@pytest.mark.parametrize("closed", ["1>&-", "2>&-"])
def test_verify_runs_with_stdout_or_stderr_closed(tmp_path: Path, closed: str) -> None:
    """Descriptor 1 or 2 closed at start: Python has no `sys.stdout` or `sys.stderr`; the run
    still passes (exit 0, not the 1 of a violation) and writes its JSON."""
    out = tmp_path / "verify.json"
    command = (
        f"{sys.executable} -m schedspec_cli.main verify --impl reference-dllm --examples 3 "
        f"--json {out} {closed}"
    )
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["passed"] is True
    if closed == "2>&-":
        assert done.stdout.splitlines()[0].split()[:3] == ["impl", "family", "result"], done


def test_verify_runs_the_known_fix_trials_inside_the_guard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The trials run failing examples again through the engine (SGLang's radix tree dump):
    they too must leave stdout to the table."""
    import schedspec_cli.verify as verify_command

    def noisy_trials(target: Any, result: Any, accepted: Any = (), twin: Any = None) -> list[None]:
        write_both_ways("trial chatter")
        return [None] * len(result.failures)

    monkeypatch.setattr(verify_command, "known_fix_trials", noisy_trials)
    code = main(["verify", "--impl", "reference-dllm", "--examples", "3"])
    seen = capfd.readouterr()
    assert code == 0, seen
    assert "trial chatter" not in seen.out
    assert "trial chatter by print" in seen.err and "trial chatter to descriptor 1" in seen.err


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "conformance", "--impl", "noisy_impl:noisy", "--examples", "3"],
        ["parity", "--impl", "noisy_impl:noisy", "--prompts", "2", "--max-new-tokens", "4"],
    ],
)
def test_bench_conformance_and_parity_keep_prints_off_their_tables(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    write_user_module(tmp_path, monkeypatch, "noisy_impl", NOISY)
    code = main(command)
    seen = capfd.readouterr()
    assert code == 0, seen
    assert "chatter" not in seen.out and "engine chatter by print" in seen.err


IMPORT_NOISY = """
import os
print("import chatter by print")
os.write(1, b"import chatter to descriptor 1\\n")
from reference.dllm import REFERENCE_DLLM as LOUD
"""


@pytest.mark.parametrize("command", [["verify"], ["bench", "conformance"]])
def test_what_a_module_prints_as_it_is_imported_stays_off_the_table(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    write_user_module(tmp_path, monkeypatch, "import_noisy", IMPORT_NOISY)
    code = main([*command, "--impl", "import_noisy:LOUD", "--examples", "3"])
    seen = capfd.readouterr()
    assert code == 0, seen
    assert "chatter" not in seen.out
    assert "import chatter by print" in seen.err and "import chatter to descriptor 1" in seen.err
