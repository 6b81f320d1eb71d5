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


_INT_FIELDS = frozenset(
    {
        "row",
        "block_index",
        "round_index",
        "accept_length",
        "masks_remaining",
        "max_new_tokens",
        "num_tokens",
        "masked",
    }
)
_INT_LIST_FIELDS = frozenset({"prompt", "slots", "tokens"})


def _check_type(kind: str, name: str, value: Any, line_no: int) -> None:
    """Refuse a field of the wrong JSON type, naming the line, the field and what is valid."""
    if type(value) is str and name == "request_id":
        return  # the common case first: this runs for every field of every line
    if type(value) is int and name in _INT_FIELDS:
        return
    if name in _INT_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
        raise TraceFormatError(line_no, f"{kind} field {name!r} is {value!r}: an integer")
    if name in _INT_LIST_FIELDS and (
        not isinstance(value, list)
        or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
    ):
        raise TraceFormatError(line_no, f"{kind} field {name!r} is {value!r}: a list of integers")
    if name == "request_id" and not isinstance(value, str):
        raise TraceFormatError(line_no, f"{kind} field 'request_id' is {value!r}: a string")
    if name == "reused" and not isinstance(value, bool):
        raise TraceFormatError(line_no, f"{kind} field 'reused' is {value!r}: true or false")


_FIELDS: dict[type[Event], tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in EVENT_BY_KIND.values()
}


def event_from_dict(data: dict[str, Any], line_no: int = 0) -> Event:
    kind = data.get("kind")
    cls = EVENT_BY_KIND.get(str(kind))
    if cls is None:
        raise TraceFormatError(
            line_no, f"unknown event kind {kind!r}; valid kinds: {sorted(EVENT_BY_KIND)}"
        )
    kwargs: dict[str, Any] = {}
    names = _FIELDS[cls]
    for name in names:
        if name not in data:
            raise TraceFormatError(line_no, f"{kind} event lacks field {name!r}")
        value = data[name]
        _check_type(str(kind), name, value, line_no)
        if name == "rows":
            if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
                raise TraceFormatError(line_no, f"forward rows are {value!r}: a list of objects")
            for row in value:
                for key, v in row.items():
                    _check_type("forward row", key, v, line_no)
            try:
                value = tuple(ForwardRow(**row) for row in value)
            except TypeError as err:
                raise TraceFormatError(line_no, f"bad forward row: {err}") from None
        elif name == "reason":
            try:
                value = FinishReason(value)
            except ValueError:
                valid = [r.value for r in FinishReason]
                raise TraceFormatError(
                    line_no, f"bad finish reason {value!r}; valid: {valid}"
                ) from None
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    if len(data) != len(names) + 1:
        extra = set(data) - set(names) - {"kind"}
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


def _records(fh: TextIO) -> Iterator[tuple[int, dict[str, Any]]]:
    for no, line in enumerate(fh, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise TraceFormatError(no, f"not JSON: {err.msg}") from None
        if not isinstance(data, dict):
            raise TraceFormatError(no, "each line must be a JSON object")
        yield no, data


def iter_trace(path: str | Path) -> Iterator[tuple[int, DllmConfig | Event]]:
    """Stream a trace: (line, config header) first if there is one, then (line, event) pairs.

    Reads one line at a time, so a log of any length checks in bounded memory.
    """
    with open(path, encoding="utf-8") as fh:
        seen_event = False
        for no, data in _records(fh):
            if data.get("kind") == "config":
                if seen_event:
                    raise TraceFormatError(no, "the config header must be the first line")
                seen_event = True
                yield no, config_from_dict(data, no)
                continue
            seen_event = True
            yield no, event_from_dict(data, no)


def read_trace(path: str | Path) -> tuple[DllmConfig | None, list[tuple[int, Event]]]:
    """A trace's optional config header and its events, with line numbers (all in memory;
    `iter_trace` streams)."""
    config: DllmConfig | None = None
    events: list[tuple[int, Event]] = []
    for no, item in iter_trace(path):
        if isinstance(item, DllmConfig):
            config = item
        else:
            events.append((no, item))
    return config, events
