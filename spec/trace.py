"""Event logs as JSON Lines: one event per line, `{"kind": ..., <fields>}`.

This is the format `schedspec check-trace` reads, so a foreign engine can log its scheduler's
decisions and have them checked against the spec without any Python adapter.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from spec.config import DllmConfig, Mode
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


def config_to_dict(config: DllmConfig) -> dict[str, Any]:
    """A JSON-ready header line for a trace: `{"kind": "config", <DllmConfig fields>}`."""
    out: dict[str, Any] = {"kind": "config"}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        out[f.name] = value.value if isinstance(value, Mode) else value
    return out


def config_from_dict(data: dict[str, Any], line_no: int = 0) -> DllmConfig:
    fields = {f.name for f in dataclasses.fields(DllmConfig)}
    unknown = sorted(set(data) - fields - {"kind"})
    if unknown:
        raise TraceFormatError(line_no, f"unknown config fields {unknown}; valid: {sorted(fields)}")
    kwargs = {k: v for k, v in data.items() if k in fields}
    if "mode" in kwargs:
        kwargs["mode"] = Mode.parse(str(kwargs["mode"]))
    return DllmConfig(**kwargs)


def read_trace(path: str | Path) -> tuple[DllmConfig | None, list[tuple[int, Event]]]:
    """A trace's optional config header and its events, with line numbers."""
    config: DllmConfig | None = None
    events: list[tuple[int, Event]] = []
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
            if data.get("kind") == "config":
                if events or config is not None:
                    raise TraceFormatError(no, "the config header must be the first line")
                config = config_from_dict(data, no)
                continue
            events.append((no, event_from_dict(data, no)))
    return config, events
