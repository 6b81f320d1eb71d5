"""A log's header may say what wrote it (`"writer": "sglang 0.5.23"`): `check-trace` prints it
after the verdict and records it in the JSON, in both families; a writer that is not a short
printable string is an input error at the header's line. The live-scheduler logs name the
engine release, and the class when a server runs a scheduler of its own."""

from __future__ import annotations

import io
import json
import sys
import types
from pathlib import Path

import pytest

from integrations.log_writer import engine_release, scheduler_writer
from reference.ar.vllm_v1 import VLLM_V1
from reference.dllm import REFERENCE_DLLM
from schedspec_cli.main import main
from spec.ar.trace import ArTraceReader, ar_config_to_dict
from spec.trace import WRITER_MAX_CHARS, TraceFormatError, config_to_dict, event_to_dict, iter_trace
from tests.test_check_trace_profile import AR, DLLM, _ar_events, _write_ar, record_dllm_run

DLLM_BODY = [json.dumps(event_to_dict(e)) for e in record_dllm_run(REFERENCE_DLLM)]


def _dllm_log(tmp_path: Path, writer: object, body: list[str] = DLLM_BODY) -> Path:
    path = tmp_path / "dllm.jsonl"
    header = {**config_to_dict(DLLM), "writer": writer}
    path.write_text("\n".join([json.dumps(header), *body]) + "\n", encoding="utf-8")
    return path


def _ar_log(tmp_path: Path, writer: object) -> Path:
    path = tmp_path / "ar.jsonl"
    _write_ar(path, _ar_events(VLLM_V1))
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "writer": writer})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["check-trace", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("family", ["dllm", "ar"])
def test_the_writer_is_printed_after_the_verdict_and_recorded_in_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], family: str
) -> None:
    writer = "vllm 0.33.0, scheduler_cls my_sched.MyScheduler"
    log = _dllm_log(tmp_path, writer) if family == "dllm" else _ar_log(tmp_path, writer)
    out_json = tmp_path / "verdict.json"
    code, out, err = _check(capsys, str(log), "--json", str(out_json))
    assert code == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0].startswith(f"OK {log}: ") and "conform to the spec" in lines[0], out
    assert lines[-1] == f"{log}: written by {writer}", out
    verdict = json.loads(out_json.read_text(encoding="utf-8"))
    assert verdict["writer"] == writer and verdict["family"] == family


def test_a_failing_log_names_its_writer_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A violation is about the release that wrote the log: the writer is said with it."""
    frees = [i for i, line in enumerate(DLLM_BODY) if json.loads(line)["kind"] == "kv_freed"]
    assert frees, "the recorded run frees pages"
    leaky = [line for i, line in enumerate(DLLM_BODY) if i != frees[0]]
    log = _dllm_log(tmp_path, "sglang 0.5.23", leaky)
    out_json = tmp_path / "verdict.json"
    code, out, _ = _check(capsys, str(log), "--require-idle", "--json", str(out_json))
    assert code == 1 and out.startswith(f"FAIL {log}:"), out
    assert out.splitlines()[-1] == f"{log}: written by sglang 0.5.23", out
    assert json.loads(out_json.read_text(encoding="utf-8"))["writer"] == "sglang 0.5.23"


@pytest.mark.parametrize("header", [{}, {"writer": None}], ids=["no-key", "null"])
def test_a_log_without_a_writer_prints_none_and_records_null(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], header: dict[str, object]
) -> None:
    """`null` reads as no writer: what the verdict's JSON records for a log without one."""
    path = tmp_path / "plain.jsonl"
    first = json.dumps({**config_to_dict(DLLM), **header})
    path.write_text("\n".join([first, *DLLM_BODY]) + "\n", "utf-8")
    out_json = tmp_path / "verdict.json"
    code, out, _ = _check(capsys, str(path), "--json", str(out_json))
    assert code == 0 and "written by" not in out, out
    assert json.loads(out_json.read_text(encoding="utf-8"))["writer"] is None


@pytest.mark.parametrize("family", ["dllm", "ar"])
@pytest.mark.parametrize("writer", [7, "", "   ", "x" * (WRITER_MAX_CHARS + 1), "a\nb", False])
def test_a_writer_that_is_no_short_printable_string_is_an_input_error_at_the_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], family: str, writer: object
) -> None:
    log = _dllm_log(tmp_path, writer) if family == "dllm" else _ar_log(tmp_path, writer)
    code, out, err = _check(capsys, str(log))
    assert code == 2 and out == "", out
    assert err.count("\n") == 1 and f"{log}:1: writer=" in err, err
    assert f"must be a string of 1 to {WRITER_MAX_CHARS} printable characters" in err, err


def test_the_writers_header_reads_back_through_the_spec_readers() -> None:
    dllm = json.dumps(config_to_dict(DLLM, writer="sglang 0.5.23"))
    assert json.loads(dllm)["writer"] == "sglang 0.5.23"
    read = list(iter_trace([dllm, *DLLM_BODY]))
    assert read[0] == (1, DLLM) and len(read) == 1 + len(DLLM_BODY)
    ar = io.StringIO(json.dumps(ar_config_to_dict(AR, writer="vllm 0.34.0")) + "\n")
    with ArTraceReader(ar) as reader:
        assert reader.header is not None and reader.header.config == AR
    with pytest.raises(TraceFormatError, match="writer="):
        config_to_dict(DLLM, writer="")
    with pytest.raises(TraceFormatError, match="writer="):
        ar_config_to_dict(AR, writer="two\nlines")


class _OutsideScheduler:
    """A scheduler class defined outside the engine's package (a maintainer's subclass)."""


def test_a_scheduler_is_named_by_its_release_and_its_class_when_not_the_engines_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = types.ModuleType("fake_engine")
    engine.__version__ = "1.2.3"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_engine", engine)
    own = type("Scheduler", (), {"__module__": "fake_engine.core.sched"})
    assert scheduler_writer(own(), "fake_engine") == "fake_engine 1.2.3"
    assert scheduler_writer(_OutsideScheduler(), "fake_engine") == (
        f"fake_engine 1.2.3, scheduler_cls {__name__}._OutsideScheduler"
    )
    # a package that names no version, and has no version module, says so
    monkeypatch.setitem(sys.modules, "fake_unversioned", types.ModuleType("fake_unversioned"))
    assert engine_release("fake_unversioned") == "unknown"
