"""Bounded input reading: `spec.input_file` and the Vidur trace reader's line bound."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

import spec.ar.vidur_trace as vidur_trace
from spec.ar.vidur_trace import TraceRowError, read_vidur_trace_file
from spec.input_file import InputTooLarge, read_input_bytes, read_input_text


def test_a_file_at_the_bound_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_bytes(b"x" * 100)
    assert read_input_bytes(path, limit=100) == b"x" * 100
    assert read_input_text(path, limit=100) == "x" * 100


def test_a_file_past_the_bound_is_an_oserror_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_bytes(b"x" * 101)
    with pytest.raises(InputTooLarge) as err:
        read_input_bytes(path, limit=100)
    assert isinstance(err.value, OSError) and err.value.errno == errno.EFBIG
    assert err.value.filename == str(path) and "larger than" in str(err.value.strerror)


def test_a_trace_line_past_the_bound_names_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vidur_trace, "MAX_LINE_CHARS", 64)
    path = tmp_path / "trace.csv"
    path.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,4,2\n0.5,4," + "2" * 100 + "\n"
    )
    with pytest.raises(TraceRowError) as err:
        read_vidur_trace_file(path)
    assert err.value.line_no == 3 and "longer than 64 characters" in str(err.value)
