"""`check-trace` on a stream: `-` (standard input), `/dev/stdin` on a pipe, a named pipe.

The check reads its input once, front to back, checking each line as it arrives. These tests
pin what the user sees: the same verdicts as for a file, messages that name the input as given
(`<stdin>`), no temporary copy, the verdict of a live stream at its violating line while the
producer is still writing, problems reported in line order whatever the source, and endless or
binary input refused at a bound instead of read into memory.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from properties.ar.harness import ArHarness
from reference.ar.vllm_v1 import make_vllm_v1
from schedspec_cli import trace_input
from schedspec_cli.main import main
from spec import KvFreed
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArBlocksFreed, ArEvent
from spec.ar.trace import ar_event_to_dict, write_ar_trace
from spec.trace import event_to_dict
from tests.test_trace import record

# the fields of a dLLM header after block_size and page_size (a header gives every one)
REST = (
    b'"kv_pages": 4, "req_pool_rows": 2, "max_running_requests": 2, "max_context": 8, '
    b'"mode": "fdfo", "in_place_reuse": true, "reloop": false, "mask_token_id": -1, '
    b'"eos_token_id": null'
)
AR_CFG = ArConfig(
    block_size=2, num_blocks=7, max_num_batched_tokens=6, max_num_seqs=3, max_model_len=10
)

SCHEDSPEC = Path(sys.executable).parent / "schedspec"


def _with_stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary file would land here, so a test can see that none is written."""
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
    assert not list((tmp_path / "spool").iterdir()), "a temporary file was written"


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
        # a header whose family is neither (found by the fuzz test under the release profile:
        # two bytes inserted into "ar" made it 'ar\ufeff', refused without naming the input)
        ('{"kind": "config", "family": "ar\ufeff"}\n'.encode(), "<stdin>:1: the header's family"),
        (b'\n{"kind": "config", "family": 7}\n', "<stdin>:2: the header's family is 7: dllm or ar"),
        # a header the config's own checks refuse (the second found the same way: a digit run
        # inserted into a number made it 4e999), named like any other bad line
        (
            b'{"kind": "config", "block_size": 2, "page_size": 4e999, ' + REST + b"}\n",
            "<stdin>:1: bad header: ",
        ),
        (
            b'{"kind": "config", "block_size": 2, "page_size": 3, ' + REST + b"}\n",
            "<stdin>:1: bad header: invalid page_size=3: must be a positive multiple of "
            "block_size=2",
        ),
        # a header that leaves a field out: named, never filled in with a default
        (
            b'{"kind": "config", "block_size": 2, ' + REST + b"}\n",
            "<stdin>:1: the header lacks fields ['page_size'] (every DllmConfig field but "
            "prefix_cache is required, none is filled in with a default): add them to the "
            "header, or pass --config with them",
        ),
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


def _violating_trace(tmp_path: Path, family: str) -> tuple[bytes, int]:
    """A conforming recorded trace with one violating event appended, and that event's line."""
    if family == "dllm":
        lines = record(tmp_path).read_text().splitlines()
        lines.append(json.dumps(event_to_dict(KvFreed("a", (0, 1)))))
    else:
        events = _ar_run()
        buf = io.StringIO()
        write_ar_trace(events, buf, AR_CFG)
        lines = buf.getvalue().splitlines()
        lines.append(json.dumps(ar_event_to_dict(ArBlocksFreed("nobody", (0,)))))
    return ("\n".join(lines) + "\n").encode(), len(lines)


def _ar_run() -> list[ArEvent]:
    h = ArHarness(make_vllm_v1, AR_CFG)
    h.submit(ArRequest("r0", 3, 2, prompt=(1, 2, 3)))
    h.drain()
    return list(h.events)


@contextlib.contextmanager
def _live_check() -> Iterator[tuple[IO[bytes], IO[bytes], subprocess.Popen[bytes]]]:
    """`schedspec check-trace -` reading a pipe the test writes to and keeps open, as a live
    engine would; the process is killed and its pipes closed afterwards, whatever happened."""
    proc = subprocess.Popen(
        [str(SCHEDSPEC), "check-trace", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        yield proc.stdin, proc.stdout, proc
    finally:
        proc.kill()
        proc.wait()
        for fh in (proc.stdin, proc.stdout, proc.stderr):
            if fh is not None:
                fh.close()


@pytest.mark.parametrize("family", ["dllm", "ar"])
def test_a_live_stream_gets_its_verdict_at_the_violating_line(tmp_path: Path, family: str) -> None:
    """A producer that has written a violation and keeps its end of the pipe open (a live
    engine) must get the verdict then, not when it closes. Reading the whole stream first (as
    a copy to a file did) waits forever here; the limit turns that into a failure."""
    data, bad_line = _violating_trace(tmp_path, family)
    with _live_check() as (stdin, stdout, proc):
        stdin.write(data)
        stdin.flush()  # and the pipe stays open: more events may come
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("check-trace waited for the end of a live stream past its violation")
        out = stdout.read().decode()
    assert code == 1, out
    assert out.startswith(f"FAIL <stdin>:{bad_line}: "), out


def test_a_conforming_live_stream_is_checked_as_it_arrives(tmp_path: Path) -> None:
    """Events are checked as their lines come: a violation written after a pause (the
    producer still running) is found at its line; before it the check is still reading."""
    data, bad_line = _violating_trace(tmp_path, "dllm")
    head, _, last = data.rstrip(b"\n").rpartition(b"\n")
    with _live_check() as (stdin, stdout, proc):
        stdin.write(head + b"\n")
        stdin.flush()
        with pytest.raises(subprocess.TimeoutExpired):  # conforming so far: still reading
            proc.wait(timeout=1)
        stdin.write(last + b"\n")
        stdin.flush()
        code = proc.wait(timeout=120)
        out = stdout.read().decode()
    assert code == 1 and f"FAIL <stdin>:{bad_line}: " in out, out


# Malformed lines, each a different kind of input error, and what the message says of it.
MALFORMED = {
    "wrong_type": (b'{"kind": "aborted", "request_id": 7}\n', "request_id"),
    "nul_byte": (b'{"kind": "aborted",\x00 "request_id": "a"}\n', "NUL bytes"),
    "not_utf8": (b'{"kind": "aborted", "request_id": "\xff"}\n', "UTF-8 text"),
    "not_json": (b'{"kind": "aborted", \n', "not JSON"),
    "unknown_field": (b'{"kind": "aborted", "request_id": "a", "slot": 1}\n', "'slot'"),
}


@pytest.mark.parametrize("family", ["dllm", "ar"])
@pytest.mark.parametrize("source", ["file", "stdin"])
@pytest.mark.parametrize("malformed", sorted(MALFORMED))
def test_problems_are_reported_in_line_order_whatever_the_source(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
    malformed: str,
    family: str,
) -> None:
    """A violation before a malformed line is the verdict (exit 1), a malformed line before
    a violation is an input error naming the input and its line (exit 2): for a file and for a
    pipe alike, in both families."""
    bad, valid = MALFORMED[malformed]
    if family == "ar":  # the same line, as an AR event
        bad = bad.replace(b'"aborted"', b'"ar_aborted"')
    good, bad_line = _violating_trace(tmp_path, family)
    lines = good.splitlines(keepends=True)
    violation_first = good + bad
    malformed_first = b"".join(lines[:-1]) + bad + lines[-1]
    for data, code in ((violation_first, 1), (malformed_first, 2)):
        if source == "file":
            path = tmp_path / "t.jsonl"
            path.write_bytes(data)
            name = str(path)
            assert main(["check-trace", name]) == code
        else:
            name = "<stdin>"
            _with_stdin(monkeypatch, data)
            assert main(["check-trace", "-"]) == code
        out, err = capsys.readouterr()
        if code == 1:
            assert out.startswith(f"FAIL {name}:{bad_line}: "), out
        else:
            assert valid in err and "\n" not in err.strip(), err
            assert f"{name}:{bad_line}" in err, err  # the input and the line, as a FAIL's


def test_a_line_is_taken_up_to_the_bound_and_refused_past_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line bound counts a line's bytes before its newline: a header padded (with JSON
    whitespace) to exactly the bound is read; one byte more is refused in one line."""
    monkeypatch.setattr(trace_input, "MAX_LINE_BYTES", 4096)
    lines = record(tmp_path).read_bytes().splitlines(keepends=True)
    header = lines[0].rstrip(b"\n")
    at_bound = header + b" " * (4096 - len(header)) + b"\n"
    _with_stdin(monkeypatch, at_bound + b"".join(lines[1:]))
    assert main(["check-trace", "-"]) == 0
    capsys.readouterr()
    _with_stdin(monkeypatch, at_bound[:-1] + b" \n" + b"".join(lines[1:]))
    assert main(["check-trace", "-"]) == 2
    err = capsys.readouterr().err.strip()
    assert "<stdin>:1" in err and "at most 0.00390625 MiB" in err, err


def test_endless_binary_input_is_refused_at_the_line_bound() -> None:
    """`check-trace - < /dev/zero`: a stream with no end and no newline is read up to the
    line bound, then refused as binary (exit 2); never read into memory whole, never a hang."""
    with open("/dev/zero", "rb") as zero:
        try:
            res = subprocess.run(
                [str(SCHEDSPEC), "check-trace", "-"],
                stdin=zero,
                capture_output=True,
                timeout=120,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail("check-trace - < /dev/zero did not stop")
    err = res.stderr.decode().strip()
    assert res.returncode == 2 and "<stdin>:1" in err and "NUL bytes" in err, err
