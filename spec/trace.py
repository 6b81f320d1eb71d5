"""Event logs as JSON Lines: one event per line, `{"kind": ..., <fields>}`.

This is the format `schedspec check-trace` reads, so a foreign engine can log its scheduler's
decisions and have them checked against the spec without any Python adapter.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from spec.errors import SchedSpecError
from spec.events import EVENT_BY_KIND, Event, FinishReason, Forward, ForwardRow


class TraceFormatError(SchedSpecError, ValueError):
    """A trace line is not a valid event; the message names the line."""

    def __init__(self, line_no: int, detail: str) -> None:
        self.line_no = line_no
        super().__init__(f"trace line {line_no}: {detail}")


def event_to_dict(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": event.kind}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if isinstance(value, FinishReason):
            value = value.value
        elif isinstance(event, Forward) and f.name == "rows":
            value = [dataclasses.asdict(r) for r in event.rows]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def event_from_dict(data: dict[str, Any], line_no: int = 0) -> Event:
    kind = data.get("kind")
    cls = EVENT_BY_KIND.get(str(kind))
    if cls is None:
        raise TraceFormatError(
            line_no, f"unknown event kind {kind!r}; valid kinds: {sorted(EVENT_BY_KIND)}"
        )
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            raise TraceFormatError(line_no, f"{kind} event lacks field {f.name!r}")
        value = data[f.name]
        if f.name == "rows":
            try:
                value = tuple(ForwardRow(**row) for row in value)
            except TypeError as err:
                raise TraceFormatError(line_no, f"bad forward row: {err}") from None
        elif f.name == "reason":
            try:
                value = FinishReason(value)
            except ValueError:
                valid = [r.value for r in FinishReason]
                raise TraceFormatError(
                    line_no, f"bad finish reason {value!r}; valid: {valid}"
                ) from None
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    extra = set(data) - {f.name for f in dataclasses.fields(cls)} - {"kind"}
    if extra:
        raise TraceFormatError(line_no, f"{kind} event has unknown fields {sorted(extra)}")
    return cls(**kwargs)


def write_events(events: Iterable[Event], out: TextIO) -> None:
    for e in events:
        out.write(json.dumps(event_to_dict(e), separators=(",", ":")) + "\n")


def read_events(path: str | Path) -> Iterator[tuple[int, Event]]:
    """(line number, event) for each non-blank line of a JSONL trace."""
    with open(path, encoding="utf-8") as fh:
        for no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as err:
                raise TraceFormatError(no, f"not JSON: {err.msg}") from None
            if not isinstance(data, dict):
                raise TraceFormatError(no, "each line must be a JSON object")
            yield no, event_from_dict(data, no)
