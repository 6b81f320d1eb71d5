"""Event logs as JSON Lines: one event per line, `{"kind": ..., <fields>}`.

This is the format `schedspec check-trace` reads, so a foreign engine can log its scheduler's
decisions and have them checked against the spec without any Python adapter.

The first line may be a header: the configuration, and optionally the policy options the engine
follows on purpose (`spec.profile.DllmPolicy`; only those that differ from the idealised spec):

    {"kind": "config", "block_size": 2, "page_size": 2, ...,
     "declared_policy": {"admission": "prefill-first", "work_conserving": false}}

A header gives every `DllmConfig` field (`missing_config_fields`): only `prefix_cache` may be
left out, meaning false (`OPTIONAL_CONFIG_FIELDS`). It may say `"family": "dllm"`, and
`"writer": "sglang 0.5.23"`: what wrote the log, in words (`writer_of`; it changes no verdict,
`check-trace` reports it). A line that
gives a key twice in one object is refused (`DuplicateKeyError`), never read as its last value.
"""

from __future__ import annotations

import dataclasses
import json
import json.scanner
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO, cast

from spec.config import DllmConfig, Mode
from spec.errors import SchedSpecError
from spec.events import (
    EVENT_BY_KIND,
    BlockCommitted,
    Event,
    FinishReason,
    Forward,
    ForwardRow,
    KvAllocated,
    StepResult,
)
from spec.json_text import not_json_detail, parse_json
from spec.profile import DllmAdmission, DllmPolicy


class TraceFormatError(SchedSpecError, ValueError):
    """A trace line is not a valid event; the message names the line."""

    def __init__(self, line_no: int, detail: str) -> None:
        self.line_no = line_no
        self.detail = detail
        super().__init__(f"trace line {line_no}: {detail}")


def event_to_dict(event: Event) -> dict[str, Any]:
    """The event as a JSON-ready object (`Submitted`'s optional fields only when set)."""
    out: dict[str, Any] = {"kind": event.kind}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if f.name in _OPTIONAL_FIELDS:
            if value:
                out[f.name] = list(value) if isinstance(value, tuple) else value
            continue
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
        "priority",
    }
)
_INT_LIST_FIELDS = frozenset({"prompt", "slots", "tokens", "stop_token_ids"})
_OPTIONAL_FLAGS = frozenset({"stop_sampled", "ignore_eos"})
# written only when set (non-empty, non-zero)
_OPTIONAL_FIELDS = _OPTIONAL_FLAGS | {"stop_token_ids", "priority"}
_BOOL_FIELDS = frozenset({"reused"}) | _OPTIONAL_FLAGS


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
    if name in _BOOL_FIELDS and not isinstance(value, bool):
        raise TraceFormatError(line_no, f"{kind} field {name!r} is {value!r}: true or false")


# Per kind, its required fields (the fast path decodes exactly these) and all of its fields:
# an optional one (`Submitted.stop_sampled`, `.ignore_eos`, `.stop_token_ids`, `.priority`) is
# written only when set.
_FIELDS: dict[type[Event], tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING)
    for cls in EVENT_BY_KIND.values()
}
_ALL_FIELDS: dict[type[Event], tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in EVENT_BY_KIND.values()
}


def event_from_dict(data: dict[str, Any], line_no: int = 0) -> Event:
    """The event a trace line's object describes; a `TraceFormatError` naming the line, the
    field and what is valid if it is not one."""
    kind = data.get("kind")
    if type(kind) is str:
        decode = _FAST.get(kind)
        if decode is not None:
            event = decode(data)
            if event is not None:
                return event
    return _event_from_dict_checked(data, line_no)


def _event_from_dict_checked(data: dict[str, Any], line_no: int) -> Event:
    """The field-by-field decoder: it finds and names what is wrong (see `_FAST`)."""
    kind = data.get("kind")
    if "kind" not in data:
        raise TraceFormatError(
            line_no, f'the line has no "kind" field; valid kinds: {sorted(EVENT_BY_KIND)}'
        )
    cls = EVENT_BY_KIND.get(str(kind))
    if cls is None:
        raise TraceFormatError(
            line_no, f"unknown event kind {kind!r}; valid kinds: {sorted(EVENT_BY_KIND)}"
        )
    kwargs: dict[str, Any] = {}
    required = _FIELDS[cls]
    names = _ALL_FIELDS[cls]
    for name in names:
        if name not in data:
            if name not in required:
                continue
            raise TraceFormatError(line_no, f"{kind} event lacks field {name!r}")
        value = data[name]
        _check_type(str(kind), name, value, line_no)
        if name == "rows":
            if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
                raise TraceFormatError(line_no, f"forward rows are {value!r}: a list of objects")
            for i, row in enumerate(value):
                missing = [k for k in _ROW_FIELDS if k not in row]
                unknown = sorted(k for k in row if k not in _ROW_KEYS)
                if missing or unknown:
                    wrong = f"lacks {missing}" if missing else f"has unknown fields {unknown}"
                    raise TraceFormatError(
                        line_no, f"forward row {i} {wrong}; a row has exactly {list(_ROW_FIELDS)}"
                    )
                for key, v in row.items():
                    _check_type("forward row", key, v, line_no)
            value = tuple(ForwardRow(**row) for row in value)
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
    extra = set(data) - set(names) - {"kind"}
    if extra:
        raise TraceFormatError(line_no, f"{kind} event has unknown fields {sorted(extra)}")
    return cls(**kwargs)


# ---------------------------------------------------------------- fast path
# Every well-formed line of a long log takes this path: one exact-type test per field, no
# per-field error bookkeeping. Anything it does not accept verbatim (a wrong type, a missing or
# extra field, a bad row or reason) returns None and goes to `_event_from_dict_checked`, which
# decides and names the problem, so both paths accept exactly the same lines.
_BAD: Any = object()


def _fast_ints(v: list[Any]) -> Any:
    for x in v:
        if type(x) is not int:
            return _BAD
    return tuple(v)


_REASONS = {r.value: r for r in FinishReason}
_ROW_FIELDS = tuple(f.name for f in dataclasses.fields(ForwardRow))
_ROW_KEYS = frozenset(_ROW_FIELDS)
_ROW_TYPES = (str, int, bool, int, int)  # request_id, block_index, reused, num_tokens, masked
_row_values = operator.itemgetter(*_ROW_FIELDS)


def _fast_reason(v: str) -> Any:
    return _REASONS.get(v, _BAD)


def _fast_rows(v: list[Any]) -> Any:
    rows = []
    for row in v:
        if type(row) is not dict or row.keys() != _ROW_KEYS:
            return _BAD
        values = _row_values(row)
        if tuple(map(type, values)) != _ROW_TYPES:
            return _BAD
        rows.append(ForwardRow(*values))
    return tuple(rows)


# Per field: the exact JSON type its value must have, and the conversion (None: as is).
_FAST_FIELD: dict[str, tuple[type, Callable[[Any], Any] | None]] = {
    **dict.fromkeys(_INT_FIELDS, (int, None)),
    **dict.fromkeys(_INT_LIST_FIELDS, (list, _fast_ints)),
    "request_id": (str, None),
    "reason": (str, _fast_reason),
    "rows": (list, _fast_rows),
}


def _fast_decoder(cls: type[Event]) -> Callable[[dict[str, Any]], Event | None]:
    names = _FIELDS[cls]
    size = len(names) + 1  # and "kind"
    values_of = operator.itemgetter(*names)
    types = tuple(_FAST_FIELD[n][0] for n in names)
    converts = tuple((i, c) for i, n in enumerate(names) if (c := _FAST_FIELD[n][1]) is not None)
    single = len(names) == 1

    def decode(data: dict[str, Any]) -> Event | None:
        if len(data) != size:
            return None
        try:
            got = values_of(data)
        except KeyError:
            return None
        values = (got,) if single else got
        if tuple(map(type, values)) != types:
            return None
        if not converts:
            return cls(*values)
        values = list(values)
        for i, convert in converts:
            value = convert(values[i])
            if value is _BAD:
                return None
            values[i] = value
        return cls(*values)

    return decode


# The three kinds that make up four fifths of a log (a step result per row and forward, an
# allocation and a commit per block), spelled out: a third of the generic decoder's time.


def _fast_step_result(data: dict[str, Any]) -> Event | None:
    if len(data) != 5:
        return None
    try:
        rid, block = data["request_id"], data["block_index"]
        accept, masks = data["accept_length"], data["masks_remaining"]
    except KeyError:
        return None
    if type(rid) is str and type(block) is int and type(accept) is int and type(masks) is int:
        return StepResult(rid, block, accept, masks)
    return None


def _fast_block_ints(
    cls: type[KvAllocated] | type[BlockCommitted], field: str
) -> Callable[[dict[str, Any]], Event | None]:
    """The decoder of a block's event that carries one list of ints (`field`): an allocation's
    slots, a commit's tokens."""

    def decode(data: dict[str, Any]) -> Event | None:
        if len(data) != 4:
            return None
        try:
            rid, block, values = data["request_id"], data["block_index"], data[field]
        except KeyError:
            return None
        if type(rid) is str and type(block) is int and type(values) is list:
            ints = _fast_ints(values)
            if ints is not _BAD:
                return cls(rid, block, ints)
        return None

    return decode


_FAST: dict[str, Callable[[dict[str, Any]], Event | None]] = {
    **{kind: _fast_decoder(cls) for kind, cls in EVENT_BY_KIND.items()},
    StepResult.kind: _fast_step_result,
    KvAllocated.kind: _fast_block_ints(KvAllocated, "slots"),
    BlockCommitted.kind: _fast_block_ints(BlockCommitted, "tokens"),
}


def write_events(events: Iterable[Event], out: TextIO) -> None:
    """Write each event to `out` as one JSON line (`event_to_dict`), the format
    `check-trace` reads."""
    for e in events:
        out.write(json.dumps(event_to_dict(e), separators=(",", ":")) + "\n")


def config_to_dict(
    config: DllmConfig, policy: DllmPolicy | None = None, writer: str | None = None
) -> dict[str, Any]:
    """A JSON-ready header line for a trace: `{"kind": "config"[, "writer": <writer>],
    <DllmConfig fields>[, "declared_policy": <the DllmPolicy options that differ from the
    idealised spec>]}`. `writer` names what wrote the log (`writer_of`)."""
    out: dict[str, Any] = {"kind": "config"}
    if writer is not None:
        out[WRITER] = checked_writer(writer)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "prefix_cache" and not value:
            continue  # written only when on: headers without a cache read as before
        out[f.name] = value.value if isinstance(value, Mode) else value
    if policy is not None and policy != DllmPolicy():
        out[DECLARED_POLICY] = policy_to_dict(policy)
    return out


DECLARED_POLICY = "declared_policy"  # the header's key for the engine's declared policy
WRITER = "writer"  # the header's key for what wrote the log ("sglang 0.5.23"), either family
WRITER_MAX_CHARS = 200


def checked_writer(value: object, line_no: int = 0) -> str:
    """`value` as a header's `writer`: a string of 1 to `WRITER_MAX_CHARS` printable
    characters, else `TraceFormatError` naming the line and what is valid."""
    if (
        not isinstance(value, str)
        or not value.strip()
        or len(value) > WRITER_MAX_CHARS
        or not value.isprintable()
    ):
        raise TraceFormatError(
            line_no,
            f"{WRITER}={json.dumps(value)[:60]}: must be a string of 1 to {WRITER_MAX_CHARS} "
            'printable characters naming what wrote the log (e.g. "sglang 0.5.23")',
        )
    return value


def writer_of(header: Mapping[str, object], line_no: int = 0) -> str | None:
    """What wrote the log, as its header says (`checked_writer`), or None when it does not
    (no `writer` key, or `null`, as `check-trace --json` records a log without one)."""
    if header.get(WRITER) is None:
        return None
    return checked_writer(header[WRITER], line_no)


# a declared reservation -> the header field that bounds it, and what it reserves
_RESERVED = {
    "reserved_kv_pages": ("kv_pages", "KV pages"),
    "reserved_rows": ("req_pool_rows", "request-pool rows"),
}


def policy_to_dict(policy: DllmPolicy) -> dict[str, Any]:
    """The options of `policy` that differ from the idealised spec's, JSON-ready."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(policy):
        value = getattr(policy, f.name)
        if value != f.default:
            out[f.name] = value.value if isinstance(value, DllmAdmission) else value
    return out


def policy_from_dict(
    data: object, line_no: int = 0, config: DllmConfig | None = None
) -> DllmPolicy:
    """A header's `declared_policy` object as a `DllmPolicy`; a bad field raises
    `TraceFormatError` naming the line, the field and what is valid. Given the header's
    `config`, a reservation must be an integer within its pool: `reserved_kv_pages` at most
    `kv_pages`, `reserved_rows` at most `req_pool_rows`."""
    if not isinstance(data, dict):
        raise TraceFormatError(
            line_no, f"{DECLARED_POLICY} must be a JSON object of policy options"
        )
    fields = {f.name: f for f in dataclasses.fields(DllmPolicy)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise TraceFormatError(
            line_no, f"unknown {DECLARED_POLICY} fields {unknown}; valid: {sorted(fields)}"
        )
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        default = fields[name].default
        if isinstance(default, DllmAdmission):
            valid = [a.value for a in DllmAdmission]
            if value not in valid:
                raise TraceFormatError(
                    line_no, f"{DECLARED_POLICY}.{name}={value!r}: must be one of {valid}"
                )
            value = DllmAdmission(value)
        elif isinstance(default, bool) and not isinstance(value, bool):
            raise TraceFormatError(
                line_no, f"{DECLARED_POLICY}.{name}={value!r}: must be true or false"
            )
        elif name in _RESERVED and config is not None:
            pool, what = _RESERVED[name]
            size = getattr(config, pool)
            if type(value) is not int or not 0 <= value <= size:
                raise TraceFormatError(
                    line_no,
                    f"{DECLARED_POLICY}.{name}={value!r}: must be an integer from 0 to "
                    f"{pool}={size} (the {what} the engine keeps for itself, within its pool)",
                )
        kwargs[name] = value
    try:
        return DllmPolicy(**kwargs)
    except SchedSpecError as err:  # the policy's own checks (e.g. a negative reservation)
        raise TraceFormatError(line_no, f"bad {DECLARED_POLICY}: {err}") from None


#: The header fields a log may leave out, and what leaving one out means (`config_to_dict`
#: writes `prefix_cache` only when on). Every other `DllmConfig` field is required: a default
#: filled in silently could change the verdict (a missing `eos_token_id` would read as no EOS).
OPTIONAL_CONFIG_FIELDS: dict[str, object] = {"prefix_cache": False}
FAMILY = "dllm"  # a dLLM header's `family`, when it gives one


def missing_config_fields(data: Mapping[str, object]) -> list[str]:
    """The required `DllmConfig` fields `data` (a header or a `--config`) does not give."""
    return [
        f.name
        for f in dataclasses.fields(DllmConfig)
        if f.name not in data and f.name not in OPTIONAL_CONFIG_FIELDS
    ]


def config_from_dict(data: dict[str, Any], line_no: int = 0) -> DllmConfig:
    """A header line's configuration (its `kind`, `family`, `writer` and `declared_policy`
    aside). It must give every field but those of `OPTIONAL_CONFIG_FIELDS`; a
    `TraceFormatError` names the line and the fields it lacks."""
    fields = {f.name for f in dataclasses.fields(DllmConfig)}
    writer_of(data, line_no)
    family = data.get("family", FAMILY)
    if family == "ar":  # before its fields, which are an ArConfig's: not unknown, another family's
        raise TraceFormatError(
            line_no,
            "family='ar': this is an AR event log; check it with "
            "properties.ar.trace_check.check_ar_trace (or `schedspec check-trace`, which reads "
            "the header's family), not the dLLM check_trace",
        )
    unknown = sorted(set(data) - fields - {"kind", "family", WRITER, DECLARED_POLICY})
    if unknown:
        raise TraceFormatError(line_no, f"unknown config fields {unknown}; valid: {sorted(fields)}")
    if family != FAMILY:
        raise TraceFormatError(
            line_no, f"family={family!r}: a dLLM header has family {FAMILY!r} (or none)"
        )
    missing = missing_config_fields(data)
    if missing:
        raise TraceFormatError(
            line_no,
            f"the header lacks fields {missing}: give every configuration field (only "
            f"{sorted(OPTIONAL_CONFIG_FIELDS)} may be left out)",
        )
    kwargs = {k: v for k, v in data.items() if k in fields}
    if "mode" in kwargs:
        kwargs["mode"] = Mode.parse(str(kwargs["mode"]))
    return DllmConfig(**kwargs)


# The decoder's scanner called directly: `json.loads` per line costs a third more (argument
# checks, a whitespace regex either side). A line it does not take whole (leading whitespace,
# trailing data, invalid JSON) goes through `json.loads`, which accepts it or names the error.
_scan = json.scanner.make_scanner(cast(Any, json.JSONDecoder()))


def _scanned(line: str) -> dict[str, Any] | None:
    """The object on `line` if it is exactly one JSON object (and JSON whitespace), else None."""
    if line[:1] != "{":
        return None
    try:
        data, end = _scan(line, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    tail = line[end:]
    if tail and tail != "\n" and tail.strip(" \t\n\r"):
        return None
    return cast(dict[str, Any], data)


class DuplicateKeyError(Exception):
    """A JSON object that gives `key` twice (`json.loads` would keep its last value)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"duplicate key {key!r}")


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return data


def duplicate_key(line: str, data: object) -> str | None:
    """The first key an object on `line` (which parsed as `data`) gives twice, or None.

    Cheap for an event log's lines: each key in the text is followed by one ':' (and a string
    may hold more), so a line with exactly as many ':' as `data` has keys, its own and its
    forward rows', repeats none; only another line is parsed again, keeping every pair."""
    if isinstance(data, dict):
        count = len(data)
        rows = data.get("rows")
        if type(rows) is list:
            for row in rows:
                if type(row) is dict:
                    count += len(row)
        if line.count(":") == count:
            return None
    try:
        json.loads(line, object_pairs_hook=_unique_pairs)
    except DuplicateKeyError as err:
        return err.key
    except (ValueError, RecursionError):  # pragma: no cover - `line` parsed once already
        return None
    return None


def duplicate_key_detail(key: str) -> str:
    """What a line that gives `key` twice is told (after its file and line)."""
    return f"duplicate key {key!r} in one JSON object: give each key once"


def _record(line: str, no: int) -> dict[str, Any]:
    try:
        data = parse_json(line)
    except json.JSONDecodeError as err:
        raise TraceFormatError(no, not_json_detail(line, err)) from None
    if not isinstance(data, dict):
        raise TraceFormatError(no, "each line must be a JSON object")
    return data


def _records(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line."""
    for no, line in enumerate(lines, start=1):
        data = _scanned(line)
        if data is None:
            if not line.strip():
                continue
            data = _record(line, no)
        if line.count(":") != len(data) and (key := duplicate_key(line, data)) is not None:
            raise TraceFormatError(no, duplicate_key_detail(key))
        yield no, data


TraceItem = DllmConfig | DllmPolicy | Event


def iter_trace(source: str | Path | Iterable[str]) -> Iterator[tuple[int, TraceItem]]:
    """Stream a trace: (line, config header) first if there is one, then (line, the header's
    declared policy) if it declares one, then (line, event) pairs.

    `source` is a path, or the trace's lines in order (an open text file, a pipe's lines:
    line numbers count from 1 at the first one). Reads one line at a time and yields each
    event as soon as its line is read, so a log of any length checks in bounded memory and a
    live stream is checked as it arrives.
    """
    if isinstance(source, str | Path):
        with open(source, encoding="utf-8") as fh:
            yield from _trace_items(fh)
    else:
        yield from _trace_items(source)


def _trace_items(lines: Iterable[str]) -> Iterator[tuple[int, TraceItem]]:
    seen_event = False
    for no, data in _records(lines):
        kind = data.get("kind")
        if type(kind) is str:  # the common case, inline: a well-formed event
            decode = _FAST.get(kind)
            event = None if decode is None else decode(data)
            if event is not None:
                seen_event = True
                yield no, event
                continue
        if kind == "config":
            if seen_event:
                raise TraceFormatError(no, "the config header must be the first line")
            seen_event = True
            config = config_from_dict(data, no)
            yield no, config
            if DECLARED_POLICY in data:
                yield no, policy_from_dict(data[DECLARED_POLICY], no, config)
            continue
        seen_event = True
        yield no, _event_from_dict_checked(data, no)


def read_trace(
    source: str | Path | Iterable[str],
) -> tuple[DllmConfig | None, list[tuple[int, Event]]]:
    """A trace's optional config header and its events, with line numbers (all in memory;
    `iter_trace` streams, and yields the header's declared policy too)."""
    config: DllmConfig | None = None
    events: list[tuple[int, Event]] = []
    for no, item in iter_trace(source):
        if isinstance(item, DllmConfig):
            config = item
        elif isinstance(item, DllmPolicy):
            continue
        else:
            events.append((no, item))
    return config, events
