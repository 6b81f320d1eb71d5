"""`check-trace` on a stream: `-` (standard input), `/dev/stdin` on a pipe, a named pipe.

The check reads its input more than once, so a stream is copied to a temporary file first.
These tests pin what the user sees: the same verdicts as for a file, messages that name the
input as given (`<stdin>`, never the temporary copy), the copy removed afterwards, and binary
input refused while copying.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from schedspec_cli.main import main
from spec import KvFreed
from spec.trace import event_to_dict
from tests.test_trace import record

SCHEDSPEC = Path(sys.executable).parent / "schedspec"


def _with_stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Temporary copies land here, so a test can see that none is left behind."""
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    return spool


def test_stdin_passes_a_conforming_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _with_stdin(monkeypatch, record(tmp_path).read_bytes())
    assert main(["check-trace", "-"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK <stdin>: ") and "conform to the spec" in out
    assert not list((tmp_path / "spool").iterdir()), "the temporary copy was left behind"


def test_stdin_reports_a_violation_at_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = record(tmp_path, [event_to_dict(KvFreed("a", (0, 1)))])
    last_line = len(bad.read_text().splitlines())
    _with_stdin(monkeypatch, bad.read_bytes())
    assert main(["check-trace", "-"]) == 1
    out = capsys.readouterr().out
    assert f"FAIL <stdin>:{last_line}: " in out and "free_owned_only" in out
    assert str(tmp_path / "spool") not in out


@pytest.mark.parametrize(
    ("data", "valid"),
    [
        (b"\x00" * 200_000, "NUL bytes"),
        (b"", "a non-empty event log"),
        (b"\xff\xfe not utf-8\n", "UTF-8 text"),
    ],
)
def test_bad_stdin_is_an_input_error_naming_stdin(
    data: bytes,
    valid: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _with_stdin(monkeypatch, data)
    assert main(["check-trace", "-"]) == 2
    err = capsys.readouterr().err.strip()
    assert "<stdin>" in err and valid in err and "\n" not in err, err
    assert not list((tmp_path / "spool").iterdir())


def test_a_pipe_through_dev_stdin_is_read_whole(tmp_path: Path) -> None:
    """`producer | schedspec check-trace /dev/stdin`: /dev/stdin is the pipe, readable once.
    Reading it in passes used to leave the later passes an empty file ("no header line")."""
    res = subprocess.run(
        [str(SCHEDSPEC), "check-trace", "/dev/stdin"],
        input=record(tmp_path).read_bytes(),
        capture_output=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr.decode()
    assert res.stdout.decode().startswith("OK /dev/stdin: ")


def test_a_named_pipe_is_read_whole(tmp_path: Path) -> None:
    """A named pipe can be opened only once per writer: reading it in passes used to block
    forever on the second open. Run as a subprocess with a limit, so a regression fails
    instead of hanging the suite."""
    trace = record(tmp_path).read_bytes()
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)

    def produce() -> None:
        with fifo.open("wb") as fh:
            fh.write(trace)

    threading.Thread(target=produce, daemon=True).start()
    try:
        res = subprocess.run(
            [str(SCHEDSPEC), "check-trace", str(fifo)],
            capture_output=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("check-trace on a named pipe did not finish: it waits for a second writer")
    assert res.returncode == 0, res.stderr.decode()
    out = res.stdout.decode()
    assert out.startswith(f"OK {fifo}: ")
    lines = [json.loads(x) for x in trace.decode().splitlines()]
    assert f"{len(lines) - 1} events" in out  # every event after the header was checked
