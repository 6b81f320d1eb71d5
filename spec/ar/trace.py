"""AR event logs as JSON Lines, read as a stream.

The first non-blank line may be a header naming the family and the configuration (and,
optionally, the implementation's declared policy):

    {"kind": "config", "family": "ar", "block_size": 16, "num_blocks": 1024, ...,
     "declared_policy": {"victim": "lowest_priority_any", "full_sequence_admission": true}}

(and `"writer": "vllm 0.33.0"`, what wrote the log, if it says: `spec.trace.writer_of`)

then one event per line, `{"kind": "ar_scheduled", "request_id": "r1", "num_tokens": 8}` (the
kinds of `spec.ar.events`; tuples as JSON lists, the finish reason as its string). Every field
is checked for its type: a line that is not a valid event raises
`spec.trace.TraceFormatError` naming the line — an input error, never a violation. The reader
holds one line at a time, so a log of any length is read in constant memory.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from spec.ar.config import AdmissionOrder, ArConfig, ArRules, Policy, VictimOrder
from spec.ar.events import (
    AR_EVENT_BY_KIND,
    AR_PAUSE_STATES,
    ArEvent,
    ArFinishReason,
    ArScheduled,
)
from spec.ar.profile import ArPolicy
from spec.errors import ConfigError
from spec.json_text import not_json_detail, parse_json
from spec.trace import (
    WRITER,
    TraceFormatError,
    checked_writer,
    duplicate_key,
    duplicate_key_detail,
    writer_of,
)

FAMILY = "ar"

# field name -> (JSON type description, checker)
_INT = "an integer"
_INTS = "a list of integers"


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _field(kind: str, name: str, value: object, line_no: int) -> object:
    """The Python value of one event field, or a TraceFormatError naming what was wrong."""

    def bad(valid: str) -> TraceFormatError:
        return TraceFormatError(line_no, f"{kind}.{name}={value!r}: must be {valid}")

    if name == "request_id":
        if not isinstance(value, str) or not value:
            raise bad("a non-empty string")
        return value
    if name in ("prompt_len", "max_tokens", "num_tokens", "step_index", "priority"):
        if not _is_int(value):
            raise bad(_INT)
        return value
    if name in ("drafts", "accepted"):
        if not isinstance(value, int) or not _is_int(value) or value < 0:
            raise bad("an integer >= 0")
        return value
    if name in ("stop_after", "predicted_len"):
        if value is not None and not _is_int(value):
            raise bad(f"{_INT} or null")
        return value
    if name == "cache_read_limit":
        if value is not None and (not isinstance(value, int) or not _is_int(value) or value < 0):
            raise bad("an integer >= 0 or null")
        return value
    if name == "lora":
        if value is not None and (not isinstance(value, int) or not _is_int(value) or value < 1):
            raise bad("an integer >= 1 or null")
        return value
    if name in ("blocks", "freed", "prompt", "tokens"):
        if value is None and name == "prompt":
            return None
        if not isinstance(value, list) or not all(_is_int(b) for b in value):
            raise bad(_INTS + (" or null" if name == "prompt" else ""))
        return tuple(value)
    if name in ("stop_sampled", "reset", "in_step"):
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if name == "what":
        if not isinstance(value, str) or not value:
            raise bad("a non-empty string")
        return value
    if name == "state":
        if value not in AR_PAUSE_STATES:
            raise bad(f"one of {list(AR_PAUSE_STATES)}")
        return value
    if name == "reason":
        try:
            return ArFinishReason(value)
        except ValueError:
            raise bad(f"one of {[r.value for r in ArFinishReason]}") from None
    raise bad("a known field")  # pragma: no cover - every event field is listed above


def ar_event_to_dict(event: ArEvent) -> dict[str, Any]:
    """The event as a JSON-ready object (`stop_sampled` only when set: most logs script their
    stops, and the field is then left out; `reset` and `in_step` likewise only when set;
    `cache_read_limit` only when bounded; `lora` only when named; a schedule's `drafts` only
    when some)."""
    out: dict[str, Any] = {"kind": event.kind}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if f.name in ("stop_sampled", "reset", "in_step") and not value:
            continue
        if f.name == "drafts" and value == 0 and isinstance(event, ArScheduled):
            continue
        if f.name in ("cache_read_limit", "lora") and value is None:
            continue
        if isinstance(value, ArFinishReason):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


# kind -> (field names with the kind, [(field, required)])
_SHAPES: dict[str, tuple[frozenset[str], tuple[tuple[str, bool], ...]]] = {
    kind: (
        frozenset({"kind", *(f.name for f in dataclasses.fields(cls))}),
        tuple((f.name, f.default is dataclasses.MISSING) for f in dataclasses.fields(cls)),
    )
    for kind, cls in AR_EVENT_BY_KIND.items()
}


def ar_event_from_dict(data: dict[str, Any], line_no: int = 0) -> ArEvent:
    """The AR event a decoded JSON line describes; a `TraceFormatError` naming `line_no` when
    its kind is unknown or a field is missing, extra or of the wrong type."""
    kind = data.get("kind")
    if "kind" not in data:
        raise TraceFormatError(
            line_no, f'the line has no "kind" field; valid kinds: {sorted(AR_EVENT_BY_KIND)}'
        )
    shape = _SHAPES.get(kind) if isinstance(kind, str) else None
    if shape is None or not isinstance(kind, str):
        raise TraceFormatError(
            line_no, f"unknown event kind {kind!r}; valid kinds: {sorted(AR_EVENT_BY_KIND)}"
        )
    names, fields = shape
    if not names.issuperset(data):
        extra = sorted(set(data) - names)
        raise TraceFormatError(line_no, f"{kind} event has unknown fields {extra}")
    kwargs: dict[str, Any] = {}
    for name, required in fields:
        if name not in data:
            if not required:
                continue
            raise TraceFormatError(line_no, f"{kind} event lacks field {name!r}")
        kwargs[name] = _field(kind, name, data[name], line_no)
    return AR_EVENT_BY_KIND[kind](**kwargs)


# --- the header -------------------------------------------------------------------------------

_ENUMS: dict[str, type[Any]] = {
    "admission": AdmissionOrder,
    "victim": VictimOrder,
    "policy": Policy,
}


def ar_config_to_dict(
    config: ArConfig,
    policy: ArPolicy | None = None,
    writer: str | None = None,
    stated: Iterable[str] = (),
) -> dict[str, Any]:
    """The header line: `{"kind": "config", "family": "ar"[, "writer": <writer>], <ArConfig
    fields>[, "declared_policy": <ArPolicy options>]}` (`policy` is ArConfig's own field;
    `writer` names what wrote the log, `spec.trace.writer_of`). The declared policy holds the
    options that differ from the idealised spec's, and those named in `stated` (top-level
    `ArPolicy` fields other than `rules`) whatever their value: a header that writes one at
    its default says the engine runs it so (`ar_policy_stated`), where leaving it out says
    nothing. `ConfigError` for a name that is no such field."""
    out: dict[str, Any] = {"kind": "config", "family": FAMILY}
    if writer is not None:
        out[WRITER] = checked_writer(writer)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if OPTIONAL_AR_CONFIG_FIELDS.get(f.name, out) == value:
            continue  # the value a header that leaves it out means
        out[f.name] = value.value if isinstance(value, Policy) else value
    said = ar_policy_to_dict(policy) if policy is not None else {}
    options = {f.name for f in dataclasses.fields(ArPolicy)} - {"rules"}
    for name in stated:
        if name not in options:
            raise ConfigError("stated", name, f"an ArPolicy option: one of {sorted(options)}")
        if name not in said:
            value = getattr(policy if policy is not None else ArPolicy(), name)
            said[name] = value.value if isinstance(value, VictimOrder) else value
    if said:
        out["declared_policy"] = said
    return out


def ar_policy_stated(data: dict[str, Any]) -> frozenset[str]:
    """The options a header line's `declared_policy` writes out (empty without one): each is
    declared, even at the idealised spec's value (`ar_config_to_dict`'s `stated`)."""
    raw = data.get("declared_policy")
    return frozenset(raw) if isinstance(raw, dict) else frozenset()


def ar_policy_to_dict(policy: ArPolicy) -> dict[str, Any]:
    """The options of `policy` that differ from the idealised spec's, JSON-ready."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(policy):
        value = getattr(policy, f.name)
        if value == f.default:
            continue
        if isinstance(value, ArRules):
            value = {
                g.name: (v.value if isinstance(v, AdmissionOrder | VictimOrder) else v)
                for g in dataclasses.fields(value)
                if (v := getattr(value, g.name)) != g.default
            }
        elif isinstance(value, VictimOrder):
            value = value.value
        out[f.name] = value
    return out


def _typed_kwargs(cls: type[Any], data: dict[str, Any], where: str, line_no: int) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise TraceFormatError(line_no, f"unknown {where} fields {unknown}; valid: {sorted(names)}")
    out: dict[str, Any] = {}
    for k, v in data.items():
        enum = _ENUMS.get(k)
        if enum is not None and v is not None:
            try:
                v = enum(v)
            except ValueError:
                raise TraceFormatError(
                    line_no, f"{where}.{k}={v!r}: must be one of {[e.value for e in enum]}"
                ) from None
        out[k] = v
    return out


#: `ArConfig` fields a header may leave out, with the value that means: each describes every
#: log written before it existed exactly (no log had drafts before `num_speculative_tokens`,
#: nor a drafter's lookahead slots or drafting rows before the two fields that declare them),
#: and `ar_config_to_dict` writes it only when it differs. Every other field is required.
OPTIONAL_AR_CONFIG_FIELDS: dict[str, object] = {
    "num_speculative_tokens": 0,
    "num_lookahead_tokens": 0,
    "num_drafting_slots": 0,
    "max_loras": 0,
}


def missing_ar_config_fields(data: dict[str, Any]) -> list[str]:
    """The required `ArConfig` fields `data` (a header or a `--config`) does not give: a header
    gives every one but those of `OPTIONAL_AR_CONFIG_FIELDS`, and no other is filled in with
    a default."""
    return [
        f.name
        for f in dataclasses.fields(ArConfig)
        if f.name not in data and f.name not in OPTIONAL_AR_CONFIG_FIELDS
    ]


def ar_config_from_dict(data: dict[str, Any], line_no: int = 0) -> tuple[ArConfig, ArPolicy]:
    """The configuration and policy of a header line; a bad field, or a missing one (every
    `ArConfig` field is required), raises `TraceFormatError` naming the line and the field."""
    writer_of(data, line_no)
    body = {k: v for k, v in data.items() if k not in ("kind", "family", WRITER, "declared_policy")}
    family = data.get("family", FAMILY)
    if family != FAMILY:
        raise TraceFormatError(line_no, f"family={family!r}: an AR trace has family 'ar'")
    known = {f.name for f in dataclasses.fields(ArConfig)}
    missing = missing_ar_config_fields(body)
    if missing and not set(body) - known:  # unknown fields first: a misspelt one is named so
        raise TraceFormatError(
            line_no,
            f"the header lacks fields {missing}: give every configuration field (only "
            f"{sorted(OPTIONAL_AR_CONFIG_FIELDS)} may be left out)",
        )
    try:
        config = ArConfig(**_typed_kwargs(ArConfig, body, "config", line_no))
    except (ConfigError, TypeError) as err:
        raise TraceFormatError(line_no, f"bad header: {err}") from None
    return config, ar_policy_from_dict(data, line_no)


def ar_policy_from_dict(data: dict[str, Any], line_no: int = 0) -> ArPolicy:
    """The policy a header line declares (its `declared_policy`; `ArPolicy()` without one); a
    bad field raises `TraceFormatError` naming the line and the field."""
    raw = data.get("declared_policy")
    if raw is None:
        return ArPolicy()
    if not isinstance(raw, dict):
        raise TraceFormatError(line_no, "config.declared_policy must be a JSON object")
    try:
        kwargs = _typed_kwargs(ArPolicy, raw, "policy", line_no)
        rules = kwargs.get("rules")
        if rules is not None:
            if not isinstance(rules, dict):
                raise TraceFormatError(line_no, "policy.rules must be a JSON object")
            kwargs["rules"] = ArRules(**_typed_kwargs(ArRules, rules, "rules", line_no))
        return ArPolicy(**kwargs)
    except ConfigError as err:
        raise TraceFormatError(line_no, f"bad header: {err}") from None
    except TypeError as err:  # a wrong type inside ArRules (it does not validate itself)
        raise TraceFormatError(line_no, f"bad header: {err}") from None


def write_ar_trace(
    events: Iterable[ArEvent],
    out: TextIO,
    config: ArConfig | None = None,
    policy: ArPolicy | None = None,
) -> None:
    """Write a trace: the header (when `config` is given), then one event per line."""
    if config is not None:
        out.write(json.dumps(ar_config_to_dict(config, policy), separators=(",", ":")) + "\n")
    for e in events:
        out.write(json.dumps(ar_event_to_dict(e), separators=(",", ":")) + "\n")


# --- streaming reader -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArTraceHeader:
    """An AR trace's header line: the configuration, the declared policy and its line."""

    config: ArConfig
    policy: ArPolicy
    line_no: int


class ArTraceReader:
    """Reads an AR trace one line at a time: `header` (None if the trace has none), then
    iterate for `(line_no, event)`. Use as a context manager (it holds the file open).

    `source` is a path, or the trace's lines in order (an open text file, a pipe's lines; the
    caller keeps ownership and line numbers count from 1 at the first one). A file that cannot
    be read (missing, a directory, not UTF-8) raises `TraceFormatError`; a byte-order mark at
    the start of a file is skipped.
    """

    def __init__(self, source: str | Path | Iterable[str]) -> None:
        self._fh: TextIO | None = None
        self.path: str  # the file's path, or "<stream>"
        if isinstance(source, str | Path):
            self.path = str(source)
            try:
                self._fh = open(source, encoding="utf-8-sig")  # noqa: SIM115 - closed in close()
            except OSError as err:
                raise TraceFormatError(
                    0, f"cannot read {self.path}: {err.strerror or err}"
                ) from None
            self._lines: Iterator[str] = iter(self._fh)
        else:
            self.path = "<stream>"
            self._lines = iter(source)
        self._line_no = 0
        self._pending: tuple[int, dict[str, Any]] | None = None
        self.header: ArTraceHeader | None = None
        try:
            first = self._next_object()
        except BaseException:
            self.close()
            raise
        if first is not None:
            no, data = first
            if data.get("kind") == "config":
                config, policy = ar_config_from_dict(data, no)
                self.header = ArTraceHeader(config, policy, no)
            else:
                self._pending = first

    def _next_object(self) -> tuple[int, dict[str, Any]] | None:
        while True:
            try:
                line = next(self._lines, None)
            except UnicodeDecodeError:
                raise TraceFormatError(self._line_no + 1, "not UTF-8 text") from None
            except OSError as err:
                raise TraceFormatError(
                    self._line_no + 1, f"cannot read {self.path}: {err.strerror or err}"
                ) from None
            if line is None:  # the end (a blank line given as "" is not)
                return None
            self._line_no += 1
            if not line.strip():
                continue
            try:
                data = parse_json(line)
            except json.JSONDecodeError as err:
                raise TraceFormatError(self._line_no, not_json_detail(line, err)) from None
            if not isinstance(data, dict):
                raise TraceFormatError(self._line_no, "each line must be a JSON object")
            if line.count(":") != len(data) and (key := duplicate_key(line, data)) is not None:
                raise TraceFormatError(self._line_no, duplicate_key_detail(key))
            return self._line_no, data

    def __iter__(self) -> Iterator[tuple[int, ArEvent]]:
        if self._pending is not None:
            no, data = self._pending
            self._pending = None
            yield no, ar_event_from_dict(data, no)
        while (item := self._next_object()) is not None:
            no, data = item
            if data.get("kind") == "config":
                raise TraceFormatError(no, "the config header must be the first line")
            yield no, ar_event_from_dict(data, no)

    def close(self) -> None:
        """Closes the file this reader opened (never a stream it was given)."""
        if self._fh is not None:
            self._fh.close()

    def __enter__(self) -> ArTraceReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def trace_family(path: str | Path) -> str | None:
    """The `family` of a trace's header line ("ar", "dllm" ...), or None (no header, or a
    header without the field): for a CLI that dispatches `check-trace` by family."""
    try:
        with open(path, encoding="utf-8-sig") as fh:
            for line in fh:
                if line.strip():
                    data = parse_json(line)
                    if isinstance(data, dict) and data.get("kind") == "config":
                        family = data.get("family")
                        return family if isinstance(family, str) else None
                    kind = data.get("kind") if isinstance(data, dict) else None
                    if isinstance(kind, str) and kind in AR_EVENT_BY_KIND:
                        return FAMILY
                    return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return None


__all__ = [
    "FAMILY",
    "ArTraceHeader",
    "ArTraceReader",
    "TraceFormatError",
    "ar_config_from_dict",
    "ar_config_to_dict",
    "ar_event_from_dict",
    "ar_event_to_dict",
    "ar_policy_from_dict",
    "ar_policy_stated",
    "ar_policy_to_dict",
    "missing_ar_config_fields",
    "trace_family",
    "write_ar_trace",
]
