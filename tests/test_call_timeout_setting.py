"""Setting the call deadline from an engine's own pytest (`properties.deadline`).

`call_timeout_set(seconds)` was a context manager only: an engine's test module that called it
alone (`call_timeout_set(2)` at module level) got the default 60 s, silently. It now takes
effect when called: alone, for the rest of the context (a pytest session), and as `with` for
the block. A hang's message said "the deadline per call is --call-timeout", a flag pytest lacks:
it names the Python way, and the command line's flag only in the command line.
"""

from __future__ import annotations

import contextvars
import os
import subprocess
import sys
import unittest
from pathlib import Path
from typing import ClassVar

import pytest

from properties.deadline import (
    DEFAULT_CALL_TIMEOUT_S,
    PYTHON_SETTING,
    CallDeadlineExceeded,
    call_timeout,
    call_timeout_named,
    call_timeout_set,
    with_call_timeout,
)
from schedspec_cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def in_fresh_context() -> tuple[float | None, float | None, float | None]:
    """(the deadline after `call_timeout_set(2)` called alone, inside a `with` of 5 after it,
    after that block)."""
    call_timeout_set(2)
    alone = call_timeout()
    with call_timeout_set(5):
        inside = call_timeout()
    return alone, inside, call_timeout()


def test_called_alone_it_sets_the_deadline_and_a_block_puts_it_back() -> None:
    assert contextvars.copy_context().run(in_fresh_context) == (2, 5, 2)
    assert call_timeout() == DEFAULT_CALL_TIMEOUT_S  # this context untouched


def test_zero_means_no_deadline_and_a_negative_one_is_refused() -> None:
    with call_timeout_set(0):
        assert call_timeout() is None
    with pytest.raises(ValueError, match="seconds >= 0, not -1"):
        call_timeout_set(-1)


def test_a_hang_names_the_python_way_unless_the_command_line_names_its_flag() -> None:
    python = str(CallDeadlineExceeded("run_round", 2))
    assert python.endswith(f"the deadline per call is {PYTHON_SETTING})"), python
    assert "--call-timeout" not in python
    with call_timeout_named("--call-timeout"):
        command = str(CallDeadlineExceeded("run_round", 2))
    assert command.endswith("the deadline per call is --call-timeout)"), command


def test_verify_names_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--impl", "tests.hang_adapters:spins_in_a_round", "--call-timeout", "1"]
    assert main(["verify", "--examples", "5", *argv]) == 1
    out = capsys.readouterr().out
    assert "within 1 s" in out and "the deadline per call is --call-timeout)" in out, out[-2000:]


# An engine's test module: the deadline set once for the session, at module level, one TestCase
# that sets its own for its run only (unittest's enterContext), and one that gets its own from
# `with_call_timeout`, with no class statement (which mypy --strict refuses on such a base).
ENGINE_TEST = """
from properties.conformance import conformance_machine
from properties.deadline import call_timeout_set, with_call_timeout
from tests.hang_adapters import spins_in_a_round

call_timeout_set(1)

TestSession = conformance_machine(spins_in_a_round).TestCase


class TestOwn(conformance_machine(spins_in_a_round, name="Own").TestCase):
    def setUp(self):
        self.enterContext(call_timeout_set(2))


TestTyped = with_call_timeout(conformance_machine(spins_in_a_round, name="Typed").TestCase, 1.5)
"""


class _Records(unittest.TestCase):
    """Records the deadline its test ran under."""

    seen: ClassVar[list[float | None]] = []

    def test_it(self) -> None:
        self.seen.append(call_timeout())


def test_with_call_timeout_sets_the_deadline_for_each_test_and_puts_it_back() -> None:
    made = with_call_timeout(_Records, 7)
    assert issubclass(made, _Records) and made.__name__ == "_Records"
    for seconds, want in ((7, 7), (0, None)):
        result = unittest.TestResult()
        with_call_timeout(_Records, seconds)("test_it").run(result)
        assert result.wasSuccessful() and _Records.seen[-1] == want, result.errors
    assert call_timeout() == DEFAULT_CALL_TIMEOUT_S  # put back after the test
    with pytest.raises(ValueError, match="seconds >= 0, not -1"):
        with_call_timeout(_Records, -1)


def test_in_pytest_a_module_level_call_lasts_the_session_and_one_class_sets_its_own(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_engine.py").write_text(ENGINE_TEST, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_engine.py"]
    res = subprocess.run(
        [sys.executable, "-m", "pytest", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out = res.stdout
    assert res.returncode == 1 and "3 failed" in out, out[-3000:] + res.stderr[-2000:]
    assert "did not return from run_round within 1 s" in out, out[-3000:]
    assert "did not return from run_round within 2 s" in out, out[-3000:]
    assert "within 1.5 s (a hang" in out, out[-3000:]  # in whichever call it hung
    assert f"the deadline per call is {PYTHON_SETTING})" in out
    assert "--call-timeout" not in out
