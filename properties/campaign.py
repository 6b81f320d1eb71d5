"""Campaigns: run a conformance machine on after a failure, to find every distinct rule broken.

A plain run stops at its first failure, so one known, accepted difference hides everything
behind it. A campaign runs the machine, records the violated rule with its shrunk
counterexample, then runs it again with that rule ignored (the machines' `ignored_rules` hook
turns a violation of an ignored rule into an invalid example), until a run passes, a failure is
not a rule violation (it cannot be ignored), the implementation hung (a call broke the call
deadline, `properties.deadline`), or `max_rules` rules were found.

Accepted deviations (the implementation's profile, a user's `--accept FILE`) are ignored from
the start and reported as "accepted" with how often each was hit (`ignored_hits`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis.errors import UnsatisfiedAssumption
from hypothesis.stateful import RuleBasedStateMachine

from properties.deadline import CallDeadlineExceeded, TwinHung
from properties.verify import Failure, failure_from, run_machine
from spec.errors import ConfigError
from spec.input_file import read_input_bytes
from spec.json_text import parse_json
from spec.profile import AcceptedDeviation

# names the failure of a run that was not a rule violation (see `failure_from`)
MAX_RULES = 32


@dataclass(frozen=True, slots=True)
class Accepted:
    """An accepted deviation and how many times the campaign's runs hit it."""

    rule: str
    reason: str
    source: str  # "profile" or the --accept file
    hits: int

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON object: `rule`, `reason`, `source` and `hits`."""
        return {"rule": self.rule, "reason": self.reason, "source": self.source, "hits": self.hits}


@dataclass(slots=True)
class CampaignResult:
    """Every distinct rule violated (each with its own shrunk program), the accepted ones, and
    why the campaign stopped."""

    failures: list[Failure] = field(default_factory=list)
    accepted: list[Accepted] = field(default_factory=list)
    runs: int = 0
    stopped: str = ""

    @property
    def passed(self) -> bool:
        """No rule was violated (hits of accepted deviations do not count)."""
        return not self.failures


def _quiet_teardown(machine: type[RuleBasedStateMachine]) -> Any:
    """A teardown that does not reject: Hypothesis runs teardown in a `finally`, also after it
    stopped an example (data overrun), when `reject()` can no longer mark the example invalid
    (`Frozen`). An ignored rule hit at teardown is still counted in `ignored_hits`; the example
    simply ends there."""

    def teardown(self: RuleBasedStateMachine) -> None:
        try:
            machine.teardown(self)
        except UnsatisfiedAssumption:
            return

    return teardown


def _rule_of(err: BaseException) -> str | None:
    rule = getattr(err, "rule", None)
    return str(rule) if rule is not None else None


def run_campaign(
    machine: type[RuleBasedStateMachine],
    run_settings: settings,
    *,
    accepted: Iterable[tuple[AcceptedDeviation, str]] = (),
    keep_going: bool = True,
    max_rules: int = MAX_RULES,
    on_failure: Callable[[Failure], None] | None = None,
    fatal: tuple[type[BaseException], ...] = (),
) -> CampaignResult:
    """Run `machine` until it passes or stops failing with new rules.

    accepted: (deviation, source) pairs ignored from the start.
    keep_going: False = stop at the first failure (a plain run, but accepted deviations still
        honoured).
    Raises nothing for a violation: failures are in the result. Errors that are not rule
    violations are recorded under their type name and end the campaign; an error of a type in
    `fatal` (e.g. the factory returns no adapter, the adapter cannot drive it) is re-raised
    when nothing was found before it, else it ends the campaign (`stopped` says why) and the
    failures found stand.
    """
    reasons: dict[str, tuple[str, str]] = {}
    for deviation, source in accepted:
        reasons.setdefault(str(deviation.rule), (deviation.reason, source))
    ignored: set[str] = set(reasons)
    hits: dict[str, int] = dict.fromkeys(reasons, 0)
    result = CampaignResult()
    while True:
        run_hits: dict[str, int] = {}
        attrs: dict[str, Any] = {
            "ignored_rules": frozenset(ignored),
            "ignored_hits": run_hits,
            "teardown": _quiet_teardown(machine),
        }
        cls = type(machine.__name__, (machine,), attrs)
        cls.__qualname__ = machine.__qualname__
        err, printed = run_machine(cls, run_settings)
        result.runs += 1
        for rule, n in run_hits.items():
            hits[str(rule)] = hits.get(str(rule), 0) + n
        if isinstance(err, fatal):
            if not result.failures:
                raise err
            # what was found before it stands: reported, with why the run stopped
            result.stopped = f"it could not be driven further: {err}"
            break
        if err is None:
            result.stopped = "passed" if not result.failures else "no further rule violated"
            break
        if isinstance(err, TwinHung):  # the twin's fault, not the implementation's: no failure
            if not result.failures:
                raise err
            result.stopped = f"it could not be checked further: {err}"
            break
        failure = failure_from(err, printed)
        if isinstance(err, CallDeadlineExceeded):  # even an accepted `progress`: it cannot go on
            result.failures.append(failure)
            if on_failure is not None:
                on_failure(failure)
            result.stopped = "the implementation hung; it cannot be driven any further"
            break
        found = _rule_of(err)
        if found is not None and found in ignored:
            # the machine does not honour `ignored_rules`: it cannot run on past this rule
            result.stopped = f"the machine re-raised ignored rule {found} (no ignored_rules hook)"
            if found not in reasons:
                break
            result.failures.append(failure)
            break
        result.failures.append(failure)
        if on_failure is not None:
            on_failure(failure)
        if found is None:
            result.stopped = f"{failure.rule} is not a rule violation; it cannot be ignored"
            break
        if not keep_going:
            result.stopped = "first failure (no --keep-going)"
            break
        if len(result.failures) >= max_rules:
            result.stopped = f"{max_rules} distinct rules found"
            break
        ignored.add(found)
    result.accepted = [
        Accepted(rule, reason, source, hits.get(rule, 0))
        for rule, (reason, source) in reasons.items()
    ]
    return result


# ---------------------------------------------------------------------- accepted deviations
def parse_accept_file(
    path: str | Path, known_rules: Mapping[str, str] | None = None
) -> tuple[AcceptedDeviation, ...]:
    """Accepted deviations from a file: JSON (a list of {"rule", "reason"} objects, or
    {"deviations": [...]}) or text, one `rule: reason` per line (`#` comments, blank lines).

    Raises `ConfigError('accept', 'FILE:LINE', what is valid)` for anything else; with
    `known_rules`, an unknown rule name is refused too.
    """
    p = Path(path)
    try:
        raw = read_input_bytes(p)
    except IsADirectoryError:
        raise ConfigError("accept", str(path), "a file (this is a directory)") from None
    except OSError as err:
        raise ConfigError("accept", str(path), f"a readable file ({err.strerror})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError("accept", str(path), "a UTF-8 text file") from None
    if "\x00" in text:
        raise ConfigError("accept", str(path), "a UTF-8 text file (it holds NUL bytes)")
    stripped = text.lstrip()
    if not stripped:
        raise ConfigError("accept", str(path), "at least one 'rule: reason' entry")
    entries: list[tuple[int, object, object]] = []
    if stripped[0] in "[{":
        try:
            data = parse_json(text)
        except json.JSONDecodeError as err:
            raise ConfigError("accept", f"{path}:{err.lineno}", f"valid JSON ({err.msg})") from None
        if isinstance(data, dict):
            data = data.get("deviations")
        if not isinstance(data, list) or not data:
            raise ConfigError(
                "accept", str(path), 'a JSON list of {"rule": ..., "reason": ...} objects'
            )
        for i, item in enumerate(data, start=1):
            if not isinstance(item, dict) or set(item) - {"rule", "reason"}:
                raise ConfigError(
                    "accept", f"{path}: entry {i}", 'an object {"rule": ..., "reason": ...}'
                )
            entries.append((i, item.get("rule"), item.get("reason")))
        where = "entry"
    else:
        for no, line in enumerate(text.splitlines(), start=1):
            body = line.strip()
            if not body or body.startswith("#"):
                continue
            name, sep, why = body.partition(":")
            if not sep:
                raise ConfigError("accept", f"{path}:{no}", "a line 'rule: reason'")
            entries.append((no, name.strip(), why.strip()))
        where = "line"
    out: list[AcceptedDeviation] = []
    seen: set[str] = set()
    for no, rule, reason in entries:
        loc = f"{path}:{no}" if where == "line" else f"{path}: entry {no}"
        if not isinstance(rule, str) or not rule.strip():
            raise ConfigError("accept", loc, "a rule name")
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError("accept", loc, f"a reason for accepting {rule!r}")
        if known_rules is not None and rule not in known_rules:
            raise ConfigError("accept", loc, f"a rule name, one of {sorted(known_rules)}")
        if rule in seen:
            raise ConfigError("accept", loc, f"each rule once ({rule!r} is listed twice)")
        seen.add(rule)
        out.append(AcceptedDeviation(rule, reason))
    return tuple(out)


__all__ = ["MAX_RULES", "Accepted", "CampaignResult", "parse_accept_file", "run_campaign"]
