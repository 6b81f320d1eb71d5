"""`schedspec check-trace FILE|- [--config JSON] [--family dllm|ar] [--require-idle]
[--profile NAME|module:attribute] [--twin NAME|module:attribute] [--json PATH]`.

Checks a recorded event log (JSON Lines) against the spec of its family. The family is read
from the trace's header line (`{"kind": "config", "family": "ar", ...}`; a header without
`family` is a dLLM header), else from the first event's kind, else from `--family` (default
dllm). The configuration is the header's; a trace without a header needs `--config`. Either
must give every field of the family's configuration (a dLLM header may leave out `prefix_cache`),
none is filled in with a default: a header that lacks some is completed by `--config`, else
refused naming them. Given both, they must agree on every field both give: a conflicting
`--config` is an input error naming each field and both values, never a silent override. A log
that ends with work still running is a warning (exit 0), or with `--require-idle` a failure
(exit 1).

`--profile` checks the log under an engine's declared policy (the header's `declared_policy`
must agree with it), and `--twin` then compares the log's decisions with a decision twin's
(`schedspec_cli.trace_profile`; an AR twin runs with the settings the log declares, a vLLM
reference twin taking them, another with a note naming those it runs otherwise; both are resolved,
for the log's family, before any event is read. `--json PATH` writes the verdict as JSON (for
a CI job to read): checked before the log is opened, written for exit 0 and 1, and for an input
error (exit 2) as `{"exit": 2, "verdict": "error", "error": ...}`, so a file an earlier run
wrote never stays behind. A header that says what wrote the log (`"writer": "sglang
0.5.23"`) has it printed after the verdict and recorded as the JSON's `writer`.

FILE is read once, front to back (`schedspec_cli.trace_input`): the header line first, then each
event checked as it arrives. The first problem in line order decides: a violation is exit 1, a
malformed line exit 2, and nothing after it is read.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from properties.deadline import call_timeout_named, call_timeout_set
from schedspec_cli.args import add_call_timeout
from schedspec_cli.trace_input import open_trace
from spec.errors import ConfigError, SchedSpecError, SpecViolation
from spec.implementation import Family
from spec.input_file import read_input_bytes
from spec.json_text import parse_json

if TYPE_CHECKING:  # imported when a run needs them (start-up stays light)
    from properties.verify import Twin
    from schedspec_cli.trace_profile import TraceProfile
    from spec.ar.profile import ArPolicy


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add `check-trace`'s FILE argument and its flags to `p`."""
    p.add_argument("file", help="the event log, one JSON object per line; - reads standard input")
    p.add_argument(
        "--config",
        metavar="JSON",
        help="a JSON file with the configuration's fields, for a trace without a header line; "
        "with a header it must agree with it (a conflict is an input error)",
    )
    p.add_argument(
        "--family",
        choices=("dllm", "ar"),
        help="the trace's family when it has no header line (default dllm); must agree with a "
        "header",
    )
    p.add_argument(
        "--require-idle",
        action="store_true",
        help="fail (exit 1) when the log ends with requests still queued or running "
        "(default: a warning)",
    )
    p.add_argument(
        "--profile",
        metavar="NAME|module:attribute",
        help="check the log under this implementation's declared policy (a built-in of the "
        "log's family, or a DllmProfile / ArProfile / implementation); default: the header's "
        "declared_policy, else the idealised spec",
    )
    p.add_argument(
        "--twin",
        metavar="NAME|module:attribute",
        help="then replay the log's operations through this decision twin (as verify --twin) "
        "and fail (rule twin_decisions) where it decides otherwise; an AR twin runs with the "
        "settings the log declares (vLLM's reference twins take them; another twin runs its "
        "own, with a note); holds the log in memory",
    )
    p.add_argument(
        "--twin-as-declared",
        action="store_true",
        help="with --twin: run an AR twin with its own declared settings, not the log's "
        "(a twin of other settings then decides otherwise by construction)",
    )
    add_call_timeout(
        p,
        "with --twin: each of the twin's calls must return within this, or the twin is "
        "refused as one that hangs",
    )
    p.add_argument("--json", metavar="PATH", help="write the verdict as JSON here")


@dataclass(frozen=True, slots=True)
class Header:
    """The log's first non-blank line (`read_header`): a config header or, without one, the
    family of the first event's kind or why the line is not JSON."""

    line: int
    data: dict[str, Any] | None  # None: no header line
    first_event: Family | None = None  # without a header: the family of the first event's kind
    not_json: str | None = None  # why the first non-blank line is not JSON

    @property
    def family(self) -> Family | None:
        """The family the first line names: a header's `family` (default dllm), else the
        first event's kind's; None when it names none."""
        if self.data is None:
            return self.first_event
        return Family.parse(str(self.data.get("family", "dllm")))  # checked by read_header


def _event_family(data: object) -> Family | None:
    from spec.ar.events import AR_EVENT_BY_KIND
    from spec.events import EVENT_BY_KIND

    kind = data.get("kind") if isinstance(data, dict) else None
    if not isinstance(kind, str):  # a list or object is no kind (and is unhashable)
        return None
    if kind in AR_EVENT_BY_KIND:
        return Family.AR
    if kind in EVENT_BY_KIND:
        return Family.DLLM
    return None


def read_text_file(path: str, flag: str) -> str:
    """A whole small text file (a --config), as checked input (ConfigError naming `flag`)."""
    raw = _read_bytes(path, flag)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(flag, path, "a UTF-8 text file") from None


def _read_bytes(path: str, flag: str) -> bytes:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(flag, path, "a file (this is a directory)")
    try:
        return read_input_bytes(p)
    except OSError as err:
        raise ConfigError(flag, path, f"a readable file ({err.strerror})") from None


def read_header(lines: Iterator[str], name: str) -> tuple[Header, list[str]]:
    """The first non-blank line as a `Header`, and the lines read to find it (to be checked
    with the rest: the check reads `lines` once). `name` is what messages call the input."""
    head: list[str] = []
    for line in lines:
        head.append(line)
        if head[0].startswith("\ufeff"):
            raise ConfigError("file", name, "UTF-8 text without a byte-order mark")
        if not line.strip():
            continue
        no = len(head)
        try:
            data = parse_json(line)
        except json.JSONDecodeError as err:
            return Header(no, None, not_json=err.msg), head
        if isinstance(data, dict) and data.get("kind") == "ar_config":  # no such header
            raise TraceLineError(
                name,
                no,
                'a header\'s kind is "config" (an AR one: {"kind": "config", '
                '"family": "ar", ...}), not "ar_config"',
            )
        if isinstance(data, dict) and str(data.get("kind", "")) == "config":
            from spec.trace import duplicate_key, duplicate_key_detail

            key = duplicate_key(line, data)  # read here, before the spec's reader sees it
            if key is not None:
                raise TraceLineError(name, no, duplicate_key_detail(key))
            family = data.get("family", "dllm")
            if data["kind"] == "config" and family not in ("dllm", "ar"):
                raise TraceLineError(name, no, f"the header's family is {family!r}: dllm or ar")
            return Header(no, data), head
        return Header(no, None, _event_family(data)), head
    raise ConfigError("file", name, "a non-empty event log")


class TraceLineError(SchedSpecError, ValueError):
    """A line of the log is not a valid event or header; the message names the input and the
    line (`<stdin>:6: kv_freed event lacks field 'slots'`), as a violation's does."""

    def __init__(self, name: str, line_no: int, detail: str) -> None:
        self.name = name
        self.line_no = line_no
        self.detail = detail
        super().__init__(f"{name}:{line_no}: {detail}")


def run(args: argparse.Namespace) -> int:
    """Reads FILE once, front to back: the header line, then every event as it arrives; the
    verdict comes at the first violation without reading further."""
    from schedspec_cli.output import check_output_path, write_json
    from spec.trace import TraceFormatError, writer_of

    check_output_path("--json", args.json, inputs=[("FILE", args.file), ("--config", args.config)])
    if args.twin_as_declared and args.twin is None:
        raise ConfigError(
            "--twin-as-declared", True, "only with --twin (it says how the twin runs)"
        )
    name = args.file
    try:
        with (
            call_timeout_named("--call-timeout"),
            call_timeout_set(args.call_timeout),
            open_trace(args.file) as source,
        ):
            name = source.name
            lines = iter(source)
            header, head = read_header(lines, source.name)
            args = argparse.Namespace(**{**vars(args), "file": source.name, "verdict": {}})
            try:
                writer = writer_of(header.data, header.line) if header.data is not None else None
                args.verdict["writer"] = writer
                code = _run(args, header, head, lines)
            except TraceFormatError as err:  # the spec's parser knows the line, not the input
                raise TraceLineError(source.name, err.line_no, err.detail) from None
    except SpecViolation:  # pragma: no cover - a verdict is returned, never raised
        raise
    except SchedSpecError as err:
        # an input error is recorded too: a file an earlier run wrote never stays behind
        # saying it passed
        error = " ".join(str(err).split())
        write_json(args.json, {"file": name, "exit": 2, "verdict": "error", "error": error})
        raise
    if writer is not None:  # which release's behaviour the verdict is about
        print(f"{source.name}: written by {writer}")
    write_json(args.json, {"file": source.name, "exit": code, **args.verdict})
    return code


def _run(args: argparse.Namespace, header: Header, head: list[str], rest: Iterator[str]) -> int:
    wanted = Family.parse(args.family) if args.family else None
    family = header.family or wanted or Family.DLLM
    if wanted is not None and header.family is not None and wanted is not header.family:
        if header.data is not None and "family" not in header.data:
            raise ConfigError(
                "--family",
                wanted.value,
                f'the trace\'s family: its header line has no "family", which makes it a '
                f"{header.family.value} header; for an {wanted.value} log add "
                f'"family": "{wanted.value}" to the header (the flag is for a log without one)',
            )
        said = "its header line" if header.data is not None else "its first event's kind"
        raise ConfigError(
            "--family",
            wanted.value,
            f"the trace's family, which {said} says is {header.family.value}: pass "
            f"--family {header.family.value} or drop it",
        )
    given: dict[str, Any] | None = None
    if args.config is not None:
        text = read_text_file(args.config, "config")
        try:
            given = parse_json(text)
        except json.JSONDecodeError as err:
            raise ConfigError(
                "config", f"{args.config}:{err.lineno}", f"JSON ({err.msg})"
            ) from None
        if not isinstance(given, dict):
            raise ConfigError("config", args.config, "a JSON object of configuration fields")
        from spec.trace import duplicate_key, duplicate_key_detail

        key = duplicate_key(text, given)
        if key is not None:
            raise ConfigError("config", args.config, f"JSON ({duplicate_key_detail(key)})")
    if header.data is None and given is None:
        if header.not_json is not None:
            raise ConfigError(
                "file",
                f"{args.file}:{header.line}",
                f"an event log whose first line is its config header (not JSON: "
                f"{header.not_json}), or pass --config",
            )
        raise ConfigError(
            "file",
            f"{args.file}:{header.line}",
            'an event log whose first line is its config header {"kind": "config", ...} (this '
            "line is not one), or pass --config",
        )
    from schedspec_cli.trace_profile import resolve_trace_profile
    from schedspec_cli.twins import installed_twin

    named = resolve_trace_profile(args.profile, family) if args.profile is not None else None
    twin = installed_twin(args.twin, family) if args.twin is not None else None
    args.verdict.update(
        family=family.value,
        profile=named.name if named is not None else None,
        twin=twin.name if twin is not None else None,
    )
    ran, head = _settle_config(args, header, head, given, _Schema.of(family))
    lines = itertools.chain(head, rest)
    config = ran if header.data is None else None  # with a header: the check reads its own
    if family is Family.DLLM:
        if args.twin_as_declared:
            raise ConfigError(
                "--twin-as-declared", True, "only for an AR log (a dLLM twin takes no settings)"
            )
        return _check_dllm(args, lines, ran, config, Extras(named, twin))
    from spec.ar.trace import ar_policy_stated

    stated = ar_policy_stated(header.data) if header.data is not None else frozenset()
    extras = Extras(named, twin, _declared_ar_policy(header), stated)
    return _check_ar(args, lines, ran, config, extras)


def _declared_ar_policy(header: Header) -> ArPolicy | None:
    """The AR policy the header declares, or None (none declared, or a bad one: the check
    names that at the header's line)."""
    from spec.ar.trace import ar_policy_from_dict
    from spec.trace import TraceFormatError

    if header.data is None or header.data.get("declared_policy") is None:
        return None  # `null`, as the check reads it: declares nothing
    try:
        return ar_policy_from_dict(header.data, header.line)
    except TraceFormatError:
        return None


@dataclass(frozen=True, slots=True)
class _Schema:
    """How a family's configuration is read from a header line or a `--config`."""

    name: str  # the configuration's type, for messages
    fields: frozenset[str]
    missing: Callable[[dict[str, Any]], list[str]]  # the required fields a body lacks
    optional: tuple[str, ...]  # the fields a body may leave out
    build: Callable[[dict[str, Any]], Any]  # raises TraceFormatError (its detail) or others

    @staticmethod
    def of(family: Family) -> _Schema:
        """The schema of `family`'s configuration (`DllmConfig` or `ArConfig`)."""
        if family is Family.DLLM:
            from spec.config import DllmConfig
            from spec.trace import OPTIONAL_CONFIG_FIELDS, config_from_dict, missing_config_fields

            return _Schema(
                "DllmConfig",
                frozenset(f.name for f in dataclasses.fields(DllmConfig)),
                missing_config_fields,
                tuple(sorted(OPTIONAL_CONFIG_FIELDS)),
                config_from_dict,
            )
        from spec.ar.config import ArConfig
        from spec.ar.trace import (
            OPTIONAL_AR_CONFIG_FIELDS,
            ar_config_from_dict,
            missing_ar_config_fields,
        )

        return _Schema(
            "ArConfig",
            frozenset(f.name for f in dataclasses.fields(ArConfig)),
            missing_ar_config_fields,
            tuple(sorted(OPTIONAL_AR_CONFIG_FIELDS)),
            lambda body: ar_config_from_dict({**body, "kind": "config", "family": "ar"})[0],
        )

    @property
    def required(self) -> str:
        """The fields a header or a `--config` must give, in words."""
        but = f" but {', '.join(self.optional)}" if self.optional else ""
        return f"every {self.name} field{but}"


# a header's keys that are no config field
_HEADER_ONLY = ("kind", "family", "writer", "declared_policy")


def _settle_config(
    args: argparse.Namespace,
    header: Header,
    head: list[str],
    given: dict[str, Any] | None,
    schema: _Schema,
) -> tuple[Any, list[str]]:
    """The configuration the log ran, from its header and `--config`, and the lines read so
    far with the header completed by the fields `--config` gives and the header lacks (the
    check then reads it whole). Every required field must come from one or the other, and
    where both give a field they must agree; else an input error naming the fields."""
    from spec.trace import TraceFormatError

    own = {k: v for k, v in (header.data or {}).items() if k not in _HEADER_ONLY}
    extra = {k: v for k, v in (given or {}).items() if k not in _HEADER_ONLY}
    completed = sorted(set(extra) - set(own)) if header.data is not None else []

    def at_header(detail: str) -> SchedSpecError:
        note = f" (completed by --config with {completed})" if completed else ""
        return TraceLineError(args.file, header.line, f"bad header{note}: {detail}")

    def at_config(detail: str) -> SchedSpecError:
        return ConfigError("config", args.config, f"{schema.name} fields ({detail})")

    def build(body: dict[str, Any], refuse: Callable[[str], SchedSpecError]) -> Any:
        try:
            return schema.build(body)
        except TraceFormatError as err:
            raise refuse(err.detail.removeprefix("bad header: ")) from None
        except (SchedSpecError, TypeError, ValueError) as err:
            raise refuse(str(err)) from None

    sources = [(own, at_header)] if header.data is not None else []
    sources += [(extra, at_config)] if given is not None else []
    for body, refuse in sources:
        unknown = sorted(set(body) - schema.fields)
        if unknown:
            hint = _ar_fields_hint(unknown) if refuse is at_header else ""
            raise refuse(f"unknown config fields {unknown}; valid: {sorted(schema.fields)}{hint}")
    missing = schema.missing({**extra, **own})
    if missing and header.data is None:
        raise ConfigError(
            "config",
            args.config,
            f"a JSON object giving {schema.required} (it lacks {missing}): add them",
        )
    if missing:
        nor = ", nor does --config give them" if given is not None else ""
        raise TraceLineError(
            args.file,
            header.line,
            f"the header lacks fields {missing}{nor} ({schema.required} is required, none "
            "is filled in with a default): add them to the header, or pass --config with them",
        )
    if header.data is None:
        return build(extra, at_config), head
    ran = build({**extra, **own}, at_header)
    if given is not None:
        theirs = build({**own, **extra}, at_config)
        differ = [f for f in sorted(schema.fields) if getattr(ran, f) != getattr(theirs, f)]
        if differ:
            values = "; ".join(
                f"{f} is {json.dumps(own.get(f))} in the header, {json.dumps(extra.get(f))} "
                "in --config"
                for f in differ
            )
            raise ConfigError(
                "config",
                args.config,
                f"a configuration that agrees with the trace's header (line {header.line}), "
                f"or no --config: they disagree on {', '.join(differ)} ({values})",
            )
    if completed:
        head = [*head]
        filled = {**(header.data or {}), **{k: extra[k] for k in completed}}
        head[header.line - 1] = json.dumps(filled) + "\n"
    return ran, head


def _ar_fields_hint(unknown: list[str]) -> str:
    """For a header read as a dLLM one (it has no `family`) whose unknown fields are all an
    AR configuration's: what to add."""
    from spec.ar.config import ArConfig

    if set(unknown) <= {f.name for f in dataclasses.fields(ArConfig)}:
        return (
            '; these are an AR configuration\'s fields: a header without "family" is a dLLM '
            'one, so add "family": "ar" to it'
        )
    return ""


@dataclass(frozen=True, slots=True)
class Extras:
    """What `--profile` and `--twin` named, resolved for the log's family."""

    named: TraceProfile | None
    twin: Twin | None
    declared: ArPolicy | None = None  # the AR policy the log's header declares (None: none)
    stated: frozenset[str] = frozenset()  # the options the header writes out (at any value)

    def under(self) -> str:
        """What the OK line adds: ` under the profile of NAME`, or "" without `--profile`."""
        return f" under the profile of {self.named.name}" if self.named is not None else ""

    def accepted(
        self,
        args: argparse.Namespace,
        where: object,
        violation: SpecViolation,
        counted: tuple[int, int, str],
    ) -> int | None:
        """Exit 0 with a report when the profile accepts the violated rule, else None
        (`counted`: the events and rounds or steps that conformed before it, and the unit)."""
        if self.named is None:
            return None
        deviation = self.named.profile.accepted(violation.rule)
        if deviation is None:
            return None
        print(
            f"ACCEPTED {args.file}:{where}: [{violation.rule}] is a deviation {self.named.name} "
            f"declares ({deviation.reason}); the log after this line is not checked"
        )
        args.verdict.update(
            verdict="accepted",
            rule=str(violation.rule),
            line=where,
            reason=deviation.reason,
            **_counts(counted),
            **_event_fields(violation),
        )
        return 0


@contextlib.contextmanager
def _profile_named(extras: Extras) -> Iterator[None]:
    """The check's refusal of a profile whose policy the trace's header contradicts, named by
    the `--profile` the user gave (the check knows only the policy: `profile={}` for the
    idealised spec's)."""
    try:
        yield
    except ConfigError as err:
        if err.field != "profile" or extras.named is None:
            raise
        raise ConfigError(
            "--profile", extras.named.name, f"{err.valid} (this profile's policy: {err.value})"
        ) from None


def _check_dllm(
    args: argparse.Namespace, lines: Iterable[str], ran: Any, config: Any, extras: Extras
) -> int:
    """`ran`: the log's configuration; `config`: the one the check is given (None: the
    header's, which `_settle_config` completed)."""
    from properties.trace_check import check_trace
    from properties.verify import DllmTwin
    from schedspec_cli.trace_profile import dllm_log_difference, in_space, twin_runs
    from spec.profile import DllmPolicy, DllmProfile

    if extras.named is not None:
        in_space(extras.named, ran)
    if extras.twin is not None:
        twin_runs(extras.twin, ran, extras.named)
    kept: list[Any] | None = [] if extras.twin is not None else None
    profile = extras.named.profile if extras.named is not None else None
    policy = profile.policy if isinstance(profile, DllmProfile) else None
    with _profile_named(extras):
        res = check_trace(lines, config, policy, kept)
    if res.violation is not None:
        counted = (res.events, res.rounds, "rounds")
        accepted = extras.accepted(args, res.line, res.violation, counted)
        if accepted is not None:
            return accepted
        return _violated(args, res.line, res.violation, counted)
    declared = res.policy is not None and res.policy != DllmPolicy()
    end = End(res.idle_at_end, res.queued_at_end, res.active_at_end)
    code = _finish(args, res.events, (res.rounds, "rounds"), end, extras, declared)
    twin = extras.twin
    if not isinstance(twin, DllmTwin) or res.config is None:
        return code
    with _twin_returns(twin.name):
        difference = dllm_log_difference(twin, kept or [], res.config, res.idle_at_end)
    return _twin_verdict(args, twin.name, difference, f"{res.rounds} rounds") or code


def _check_ar(
    args: argparse.Namespace, lines: Iterable[str], ran: Any, config: Any, extras: Extras
) -> int:
    """As `_check_dllm`, for an AR log."""
    from properties.ar.decisions import operations
    from properties.ar.trace_check import check_ar_trace
    from properties.verify import ArTwin
    from schedspec_cli.trace_profile import (
        TwinReplays,
        ar_log_difference,
        ar_policy_for,
        in_space,
        twin_replays,
        twin_runs,
    )
    from schedspec_cli.twin_settings import window_applies, with_settings
    from spec.ar.profile import ArPolicy

    policy = None
    if extras.named is not None:
        in_space(extras.named, ran)
        policy = ar_policy_for(extras.named, ran)
    if extras.twin is not None:
        twin_runs(extras.twin, ran, extras.named)
    note = ""
    if isinstance(extras.twin, ArTwin) and not args.twin_as_declared:  # before any event
        settings = extras.declared if extras.declared is not None else policy
        window = window_applies(ran)
        stated = extras.stated if extras.declared is not None else frozenset()
        settled, note = with_settings(extras.twin, settings, window, "the log", ran, stated)
        args.verdict["twin_settings"] = dict(settled.took)
        args.verdict["twin_note"] = note or None
        extras = dataclasses.replace(extras, twin=settled)
    kept: list[Any] | None = [] if extras.twin is not None else None
    # refuses a profile that contradicts the header
    with _profile_named(extras):
        res = check_ar_trace(lines, config, policy, kept)
    if res.violation is not None:
        where = res.line if res.line is not None else "end"
        counted = (res.events, res.steps, "steps")
        accepted = extras.accepted(args, where, res.violation, counted)
        if accepted is not None:
            return accepted
        return _violated(args, where, res.violation, counted)
    twin = extras.twin
    replays = None
    if isinstance(twin, ArTwin):  # a log no twin replays (a pause, a cache reset): exit 2 first
        replays = twin_replays(twin, res.config) if res.config is not None else None
        said = replays or TwinReplays(outputs=False, pauses=False)
        operations(
            kept or [],
            res.sampled_stops,
            res.config,
            res.policy,
            said.outputs,
            said.pauses,
            said.drafts,
        )
    declared = res.policy is not None and res.policy != ArPolicy()
    end = End(res.idle_at_end, res.waiting_ids, res.running_ids, res.unjudged_at_end)
    code = _finish(args, res.events, (res.steps, "steps"), end, extras, declared)
    if not isinstance(twin, ArTwin) or res.config is None:
        return code
    with _twin_returns(twin.name):
        difference = ar_log_difference(
            twin, kept or [], res.config, res.policy, res.idle_at_end, res.sampled_stops, replays
        )
    if note:
        print(f"note: {args.file}: {note}")
    return _twin_verdict(args, twin.described(), difference, f"{res.steps} steps") or code


@contextlib.contextmanager
def _twin_returns(name: str) -> Iterator[None]:
    """A twin that hangs on the log's operations (each call under the default deadline) is a
    bad `--twin`, said in one line (exit 2), not a hung command."""
    from properties.deadline import TwinHung

    try:
        yield
    except TwinHung as hang:
        raise ConfigError("--twin", name, f"a twin that returns ({hang})") from None


@dataclass(frozen=True, slots=True)
class End:
    """How a log that conformed ends: idle or not, the requests it leaves waiting (queued) and
    running (active), and, for an AR log that ends with work left, the between-steps
    violation its end would be were it a step boundary (`unjudged`: a log cut inside a step or
    its update phase does not meet them yet)."""

    idle: bool
    waiting: tuple[str, ...] = ()
    running: tuple[str, ...] = ()
    unjudged: SpecViolation | None = None

    def left(self) -> str:
        """The requests left, in words: `1 waiting ('r1'), 2 running ('r0', 'r2')`."""
        return ", ".join(
            f"{len(ids)} {what} ({_ids(ids)})"
            for what, ids in (("waiting", self.waiting), ("running", self.running))
            if ids
        )


def _ids(ids: tuple[str, ...], most: int = 5) -> str:
    shown = ", ".join(repr(i) for i in ids[:most])
    return shown + (f", ... {len(ids)} in all" if len(ids) > most else "")


def _counts(counted: tuple[int, int, str]) -> dict[str, int]:
    events, periods, unit = counted
    return {"events": events, unit: periods}


def _event_fields(violation: SpecViolation) -> dict[str, str]:
    """The violating event's kind and request id, where it has them (for a CI job to group
    failures by), beside the message."""
    event = violation.event
    fields: dict[str, str] = {}
    kind = getattr(event, "kind", None)
    if isinstance(kind, str):
        fields["event_kind"] = kind
    request_id = getattr(event, "request_id", None)
    if isinstance(request_id, str):
        fields["request_id"] = request_id
    return fields


def _finish(
    args: argparse.Namespace,
    events: int,
    periods: tuple[int, str],
    end: End,
    extras: Extras,
    declared: bool,
) -> int:
    """The verdict of a log that conformed: `periods`, its rounds or steps (count, unit);
    `declared`, its header declared a policy. A log that ends with work left is a warning,
    with `--require-idle` a failure (one FAIL line, no OK line): `incomplete`, or, for an AR
    log whose end breaks a between-steps rule, that violation (the flag says the log is
    whole, so its end is a step boundary)."""
    count, unit = periods
    under = extras.under() or (" under the policy its header declares" if declared else "")
    conform = f"{events} events, {count} {unit} conform to the spec{under}"
    source = "profile" if extras.named is not None else "header" if declared else "idealised"
    args.verdict.update(
        verdict="pass",
        events=events,
        **{unit: count},
        policy=source,
        idle_at_end=end.idle,
        waiting_at_end=list(end.waiting),
        running_at_end=list(end.running),
    )
    if end.idle:
        print(f"OK {args.file}: {conform}")
        return 0
    if args.require_idle:
        if end.unjudged is not None:
            return _violated(args, "end", end.unjudged, (events, count, unit))
        print(
            f"FAIL {args.file}: {conform}, but the log ends with work still running "
            f"(--require-idle): {end.left()}"
        )
        args.verdict["verdict"] = "incomplete"
        return 1
    print(f"OK {args.file}: {conform}")
    print(
        f"warning: {args.file}: the log ends with work still running (incomplete log?): "
        f"{end.left()}"
    )
    if end.unjudged is not None:
        first = str(end.unjudged).splitlines()[0]
        print(
            f"warning: {args.file}: not judged at its end, which may be a cut inside a step "
            f"or its update phase: {first} (--require-idle judges it)"
        )
        args.verdict["unjudged_at_end"] = {
            "rule": str(end.unjudged.rule),
            "message": str(end.unjudged),
        }
    return 0


def _violated(
    args: argparse.Namespace,
    where: object,
    violation: SpecViolation,
    counted: tuple[int, int, str],
) -> int:
    """Exit 1, the violation printed and in the verdict (`counted`: the events and rounds or
    steps that conformed before it, and the unit)."""
    print(f"FAIL {args.file}:{where}: {violation}")
    args.verdict.update(
        verdict="violation",
        rule=str(violation.rule),
        line=where,
        message=str(violation),
        **_counts(counted),
        **_event_fields(violation),
    )
    return 1


def _twin_verdict(args: argparse.Namespace, name: str, difference: str | None, periods: str) -> int:
    """Exit 1 with the first difference, or 0 with one line saying the twin agreed."""
    args.verdict["twin_difference"] = difference
    if difference is not None:
        print(f"FAIL {args.file}: [twin_decisions] against {name}: {difference}")
        args.verdict.update(verdict="violation", rule="twin_decisions", message=difference)
        return 1
    print(f"OK {args.file}: its twin {name} decides alike in all {periods}")
    return 0
