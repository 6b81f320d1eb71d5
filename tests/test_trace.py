"""JSON Lines traces: round trip, checking a foreign log, and line-numbered errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from properties.harness import Harness
from reference.dllm import make_scheduler
from schedspec_cli.main import main
from spec import DllmConfig, KvFreed, Mode, RequestSpec
from spec.trace import (
    TraceFormatError,
    config_to_dict,
    event_from_dict,
    event_to_dict,
    read_trace,
    write_events,
)


def record(tmp_path: Path, extra: list[dict[str, object]] | None = None) -> Path:
    cfg = DllmConfig(block_size=2, page_size=4, kv_pages=4, max_context=8, mode=Mode.FDFO)
    h = Harness(make_scheduler, cfg)
    h.submit(RequestSpec("a", (1, 2, 3), 3))
    h.submit(RequestSpec("b", (4,), 2))
    h.drain()
    buf = io.StringIO()
    write_events(h.events, buf)
    path = tmp_path / "trace.jsonl"
    lines = [json.dumps(config_to_dict(cfg)), *buf.getvalue().splitlines()]
    lines += [json.dumps(x) for x in extra or []]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_round_trip_every_event(tmp_path: Path) -> None:
    path = record(tmp_path)
    cfg, events = read_trace(path)
    assert cfg is not None and cfg.block_size == 2
    for _, e in events:
        assert event_from_dict(event_to_dict(e)) == e


def test_check_trace_cli_ok_and_violation(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["check-trace", str(record(tmp_path))]) == 0
    assert "conform" in capsys.readouterr().out
    bad = record(tmp_path, [event_to_dict(KvFreed("a", (0, 1)))])
    assert main(["check-trace", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "free_owned_only" in out and f"{bad}:" in out


def test_malformed_lines_name_the_line(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"kind": "submitted", "request_id": "a"}\n')
    with pytest.raises(TraceFormatError, match="line 1: submitted event lacks field 'prompt'"):
        read_trace(p)
    p.write_text('{"kind": "teleported"}\n')
    with pytest.raises(TraceFormatError, match="unknown event kind"):
        read_trace(p)
    p.write_text("not json\n")
    with pytest.raises(TraceFormatError, match="line 1: not JSON"):
        read_trace(p)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"request_id": "a"}, r"forward row 0 lacks \['block_index', 'reused', 'num_tokens'"),
        (
            {"request_id": "a", "block_index": 0, "reused": False, "num_tokens": 2, "masked": 1}
            | {"slots": [0, 1]},
            r"forward row 0 has unknown fields \['slots'\]; a row has exactly \['request_id'",
        ),
    ],
)
def test_a_forward_row_of_other_fields_is_named_by_its_fields(
    row: dict[str, object], message: str, tmp_path: Path
) -> None:
    """Not Python's `__init__() missing 4 required positional arguments` (as it once was)."""
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"kind": "forward", "rows": [row]}) + "\n")
    with pytest.raises(TraceFormatError, match=f"line 1: {message}"):
        read_trace(p)
