"""`schedspec_cli.engine_stdout`: while `verify` drives an implementation, what the
implementation writes to stdout (by `print` or straight to descriptor 1, as a native
extension does) goes to stderr, so stdout carries only the command's table."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from schedspec_cli.engine_stdout import implementation_stdout_to_stderr
from schedspec_cli.main import main
from tests.user_module import write_user_module


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
