"""Trying an engine's known fixes on a failure that `verify` found.

A real engine's built-in may name the fixes of its engine's known findings (`Builtin.known_fixes`,
each an `integrations.patches.KnownFix` with the rules its finding breaks). For a failure whose
example its harness kept (`Failure.example`: an AR `ArExample` or a dLLM `DllmExample`):

- only the fixes whose finding breaks the failure's rule are candidates (none: the failure is no
  known finding, and the output says which rules the known findings break);
- the example is run again as it is: it must fail by the same rule, else nothing is claimed;
- then once per candidate with that fix applied; when none names it, under sets of two of the
  known fixes holding a candidate, then three, and so on, until a set names it (a failure may
  pass only once another finding is fixed too: a campaign's later failure is found with the
  earlier rules ignored). Every passing set of the smallest size is reported.

Passing is no proof alone: a fix may change the early decisions so that the program never
reaches the failure (FasterTransformer's reservation fix admits fewer requests at once, and an
early finisher then has no batch mate to outlive). A fix identifies the failure when the program
passes with it and every step (AR: what it schedules, preempts and allocates) or round (dLLM:
what it admits and forwards) that ended before the failure decides as it did without it
(`Example.first_other_decision`). A fix that changes a decision by design (`KnownFix.by_design`:
an AR reservation's size, whose allocations are then not compared; a dLLM admission estimate or
reservation, whose rounds are then compared up to the first it admits otherwise in) is named
with the step or round where it first decides otherwise (`on_purpose`). A pass by other
decisions is reported apart, with the first step or round that differs, and a failure by
another rule with that rule.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from properties.ar.example import ArExample
from properties.example import DllmExample
from properties.verify import Failure
from spec.errors import SpecViolation


class KnownFix(Protocol):
    """What `integrations.patches.KnownFix` gives (the CLI imports no engine package at its
    top): a fix's name, what it fixes, the rules its finding breaks, `apply(names)`, its fix
    set's context manager applying the named fixes, and `applied(*also)`, applying it with the
    fixes named in `also`."""

    @property
    def name(self) -> str:
        """The fix's name."""
        ...

    @property
    def summary(self) -> str:
        """What it fixes, in one line."""
        ...

    @property
    def rules(self) -> frozenset[str]:
        """The rules its finding breaks."""
        ...

    @property
    def apply(self) -> Callable[[Iterable[str]], contextlib.AbstractContextManager[None]]:
        """Its fix set's context manager applying the named fixes."""
        ...

    @property
    def messages(self) -> tuple[tuple[str, str], ...]:
        """(rule, pattern): what a failure by the rule must say to be its finding's."""
        ...

    @property
    def by_design(self) -> bool:
        """Whether it changes a decision before the failure on purpose
        (`Example.first_other_decision`'s `by_design`)."""
        ...

    @property
    def witness(self) -> Callable[[], contextlib.AbstractContextManager[list[str]]] | None:
        """Its finding's witness, if it has one: while the failing example runs again as
        released, the list of each act of the finding's mechanism seen."""
        ...

    def applied(self, *also: str) -> contextlib.AbstractContextManager[None]:
        """A context manager applying it with the fixes named in `also`."""
        ...

    def breaks(self, rule: str, message: str) -> bool:
        """Whether its finding can be a failure by `rule` that says `message`."""
        ...


class Example(Protocol):
    """What a failing example of either family gives (`properties.ar.example.ArExample`,
    `properties.example.DllmExample`): run again through a factory, and the first decision
    that two of its runs' events make otherwise."""

    @property
    def unit(self) -> str:
        """What one decision is called: "step" (AR) or "round" (dLLM)."""
        ...

    def run(self, factory: Any) -> tuple[SpecViolation | None, Sequence[Any]]:
        """The first violation of a fresh run through `factory` (None: it conforms), and the
        events it emitted until then."""
        ...

    def without_twin(self) -> Example:
        """The example without its decision twin."""
        ...

    @property
    def by_design_stops(self) -> bool:
        """Whether `by_design` stops the comparison at the fix's own first decision (dLLM),
        rather than leaving one kind of decision out (AR: allocations)."""
        ...

    def first_other_decision(
        self,
        before: Sequence[Any],
        after: Sequence[Any],
        by_design: bool = False,
        failed_at: object | None = None,
    ) -> int | None:
        """The first decision of `before` that `after` makes otherwise (None: every one
        alike); `by_design` leaves out what a fix changes on purpose; `failed_at` is the
        failure's event, when it was raised at one."""
        ...


@dataclass(frozen=True, slots=True)
class FixTrial:
    """What running a failure's example again found.

    rule: the failure's rule. tried: the candidate fixes (their finding breaks `rule`).
    known_rules: with no candidate, the rules the known findings break; patterns: what a
        known finding's failure by `rule` says, when none matched the failure's message.
    replayed: run again without a fix, it failed by the same rule (else none was tried, and
        `again` says what it did instead: "it passed", the rule it broke).
    passes_with: the smallest sets of known fixes, each holding a candidate, under which it
        passes, deciding as before up to the failure (a set of one when a candidate alone
        does; a larger one when a fix needs another finding's fix as well).
    on_purpose: (set, index) for each of `passes_with` that decides otherwise from that step or
        round on, as one of its fixes does by design (`KnownFix.by_design`: a reservation's
        size, an admission estimate): the decisions before it are the same.
    passes_otherwise: (fix, index) for each candidate under which, alone, it passes deciding
        otherwise from that step (AR) or round (dLLM, `unit`) on.
    other: (fix, rule) for each candidate under which, alone, it fails by another rule.
    accepted_stops: (set, rule) for each set under which it breaks a rule the run accepts (the
        profile's deviations, `--accept`): the run stops there, unchecked past it, so such a set
        is neither a pass nor another failure (a plain run would have discarded the example).
    unapplied: (fix, why) for each the installed engine's files do not take (a patched install).
    witnessed: (fix, notes) for each candidate with a witness (`KnownFix.witness`): what it saw
        of the finding's mechanism while the example ran again as released (none: not seen,
        which claims nothing). A lead for a "probably", never a verdict: the mechanism also
        acts in runs that pass, so seeing it does not tie it to the failure (a review planted
        a bug of its own beside it), and a set is never named on it (`identified_by`).
    twin_differs: how the run's decision twin's declared policy differs from the
        implementation's, where it does in how it orders or admits (`admission: fcfs, the
        implementation prefill-first`): a `twin_decisions` failure then shows that difference,
        by design, and nothing was tried.
    unit: what one decision is called ("step", "round").
    stops: a by-design difference ends the comparison (dLLM: an admission, after which all
        may differ), so such a pass is weaker evidence: "probably" the finding from a later
        round on, "no evidence" from the first (AR: only allocations are left out, and a pass
        is the finding).
    """

    rule: str
    tried: tuple[KnownFix, ...]
    known_rules: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    replayed: bool = False
    again: str = ""
    passes_with: tuple[tuple[str, ...], ...] = ()
    on_purpose: tuple[tuple[tuple[str, ...], int], ...] = ()
    passes_otherwise: tuple[tuple[str, int], ...] = ()
    other: tuple[tuple[str, str], ...] = ()
    accepted_stops: tuple[tuple[tuple[str, ...], str], ...] = ()
    unapplied: tuple[tuple[str, str], ...] = ()
    witnessed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    twin_differs: str = ""
    unit: str = "step"
    stops: bool = False
    summaries: dict[str, str] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The fields by name (fixes by name, a set of them as a list; pairs as objects; the
        summaries aside), and `verdict`: `lines()`."""
        out: dict[str, Any] = {
            "rule": self.rule,
            "unit": self.unit,
            "tried": [fix.name for fix in self.tried],
            "replayed": self.replayed,
            "passes_with": [list(fixes) for fixes in self.passes_with],
            "identified_by": [list(fixes) for fixes in self.identified_by()],
            "on_purpose": [
                {"fixes": list(fixes), self.unit: index} for fixes, index in self.on_purpose
            ],
            "passes_otherwise": dict(self.passes_otherwise),
            "other": dict(self.other),
            "accepted_stops": [
                {"fixes": list(fixes), "rule": rule} for fixes, rule in self.accepted_stops
            ],
            "unapplied": dict(self.unapplied),
            "witnessed": {name: list(notes) for name, notes in self.witnessed},
        }
        if self.twin_differs:
            out["twin_differs"] = self.twin_differs
        elif not self.tried:
            out["known_rules"] = list(self.known_rules)
            if self.patterns:
                out["patterns"] = list(self.patterns)
        elif not self.replayed:
            out["again"] = self.again
        out["verdict"] = self.lines()
        return out

    def identified_by(self) -> tuple[tuple[str, ...], ...]:
        """The sets of `passes_with` that identify the failure: deciding as before up to it
        (AR: allocations aside by design), not only up to a fix's own admission (`stops`)."""
        on_purpose = dict(self.on_purpose)
        return tuple(f for f in self.passes_with if not self.stops or f not in on_purpose)

    def lines(self) -> list[str]:
        """The verdict in words, for the text output (after the failure's program)."""
        rule = self.rule
        if self.twin_differs:
            return [
                f"NOT TRIED: the decision twin declares another policy than the implementation "
                f"({self.twin_differs}), so their decisions differ by design and [{rule}] says "
                "nothing of a finding; a twin of the implementation's own policy tells one apart."
            ]
        if not self.tried and self.patterns:
            said = " or ".join(f"/{p}/" for p in self.patterns)
            return [
                f"NO KNOWN FINDING SAYS THIS: the known findings that break [{rule}] say {said}."
            ]
        if not self.tried:
            return [
                f"NO KNOWN FINDING BREAKS [{rule}]: the known ones break "
                f"{', '.join(f'[{r}]' for r in self.known_rules)}."
            ]
        names = ", ".join(f"`{fix.name}`" for fix in self.tried)
        if not self.replayed:
            return [
                f"KNOWN FIXES NOT TRIED ({names}): run again outside Hypothesis, the program did "
                f"not fail by [{rule}] ({self.again})."
            ]
        summaries = {fix.name: fix.summary for fix in self.tried} | self.summaries
        out: list[str] = []
        if not self.passes_with:
            unchecked = len(self.accepted_stops)
            stopped = (
                f"; {unchecked} set{'s' if unchecked > 1 else ''} stopped at a rule this run "
                "accepts, unchecked past it"
                if unchecked
                else ""
            )
            out.append(
                f"NO KNOWN FIX IDENTIFIES IT: under no set of the known fixes that holds one of "
                f"{names} does the program pass deciding as before (a new finding, or several "
                f"at once{stopped})."
            )
        on_purpose = dict(self.on_purpose)
        for fixes in self.passes_with:
            applied = " and ".join(f"`{name}` ({summaries[name]})" for name in fixes)
            one = len(fixes) == 1
            passes = f"this program passes with the engine fix{'' if one else 'es'} {applied}"
            again = f"without {'it' if one else 'them'}, it fails by [{rule}] again."
            index = on_purpose.get(fixes)
            if index is None:
                out.append(
                    f"KNOWN FINDING: {passes} applied, deciding as before up to the failure; "
                    f"{again}"
                )
            elif not self.stops:
                out.append(
                    f"KNOWN FINDING: {passes} applied, deciding as before up to the failure "
                    f"(its allocations aside from {self.unit} {index} on, by design); {again}"
                )
            elif index == 0:
                out.append(
                    f"NO EVIDENCE EITHER WAY: {passes} applied, but it admits otherwise by "
                    f"design from {self.unit} 0 on, so no {self.unit} ran alike before the "
                    "fix's own decision."
                )
            else:
                out.append(
                    f"PROBABLY A KNOWN FINDING: {passes} applied, deciding as before up to "
                    f"{self.unit} {index}, where it admits otherwise by design (later "
                    f"{self.unit}s not compared); {again}"
                )
        for name, notes in self.witnessed:  # leads, not verdicts
            if notes:
                more = f" (and {len(notes) - 1} more)" if len(notes) > 1 else ""
                out.append(
                    f"A lead, not proof: run again with no fix, the program showed the "
                    f"mechanism of `{name}`'s finding acting: {notes[0]}{more} (it acts in runs "
                    "that pass too, so this does not tie it to the failure)."
                )
        for name, index in self.passes_otherwise:
            out.append(
                f"With the engine fix `{name}` alone it passes too, but decides otherwise from "
                f"{self.unit} {index} on, before the failure: no evidence of that finding."
            )
        for name, other in self.other:
            out.append(f"With the engine fix `{name}` alone it fails by [{other}] instead.")
        for fixes, accepted in self.accepted_stops:
            applied = " and ".join(f"`{name}`" for name in fixes)
            out.append(
                f"With the engine fix{'' if len(fixes) == 1 else 'es'} {applied} it breaks "
                f"[{accepted}], which this run accepts: it stops there, unchecked, so that says "
                f"nothing of [{rule}]."
            )
        for name, why in self.unapplied:
            out.append(f"The engine fix `{name}` could not be applied to the install: {why}")
        return out


#: How a replay that hung reads (`properties.deadline.CallDeadlineExceeded`).
_HANG = "the implementation did not return from"


def try_known_fixes(
    failure: Failure,
    factory: Any,
    fixes: Sequence[KnownFix],
    accepted: frozenset[str] = frozenset(),
) -> FixTrial | None:
    """Run `failure`'s example again through `factory`, as it is and then under sets of
    `fixes`, smallest first, each holding a candidate (a fix whose finding breaks the
    failure's rule), until one passes deciding as before. `factory` is the implementation's,
    of `failure.example`'s family. `accepted`: the rules the run accepts (the profile's
    deviations and `--accept`'s); a set under which the example breaks one is recorded in
    `accepted_stops`, not as a failure. None when there is no fix at all or no example kept
    (a hang, a check outside the harness's operations)."""
    example = failure.example
    if not fixes or not isinstance(example, ArExample | DllmExample):
        return None
    rule = failure.rule
    candidates = tuple(fix for fix in fixes if fix.breaks(rule, failure.message))
    if not candidates:
        known = tuple(sorted({r for fix in fixes for r in fix.rules}))
        patterns = tuple(sorted({p for fix in fixes for r, p in fix.messages if r == rule}))
        return FixTrial(rule, (), known_rules=known, patterns=patterns)
    if rule != "twin_decisions":  # a twin of the released engine differs from a fixed one
        example = example.without_twin()
    return _trial(example, factory, rule, candidates, tuple(fixes), accepted)


def _trial(
    example: Example,
    factory: Any,
    rule: str,
    candidates: tuple[KnownFix, ...],
    fixes: tuple[KnownFix, ...],
    accepted: frozenset[str] = frozenset(),
) -> FixTrial:
    """The example run as it is, then under each candidate alone, then under larger sets of
    `fixes` holding a candidate, until a set passes deciding as before."""
    from integrations.patches import FixDoesNotApply

    unit = example.unit
    summaries = {fix.name: fix.summary for fix in fixes}
    with contextlib.ExitStack() as stack:  # the findings' witnesses watch the released run
        watching = {
            fix.name: stack.enter_context(witness())
            for fix in candidates
            if (witness := getattr(fix, "witness", None)) is not None
        }
        again, before = example.run(factory)
    witnessed = tuple((name, tuple(notes)) for name, notes in watching.items())
    if again is None or again.rule != rule:
        said = "it passed" if again is None else f"it failed by [{again.rule}]"
        return FixTrial(rule, candidates, again=said, unit=unit, witnessed=witnessed)
    apply = fixes[0].apply
    failed_at = again.event

    def run(chosen: tuple[KnownFix, ...]) -> tuple[str, SpecViolation | None, Sequence[Any]]:
        """("ran", violation, events), or ("unapplied", why) / ("no set") as the first."""
        names = tuple(fix.name for fix in chosen)
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(apply(names))
            except FixDoesNotApply as err:  # a patched install; nothing was changed
                return f"unapplied: {err}", None, ()
            except ValueError:  # two fixes that edit the same lines: no such set
                return "no set", None, ()
            result, after = example.run(factory)
        return "ran", result, after

    def alike(chosen: tuple[KnownFix, ...], after: Sequence[Any]) -> int | None:
        by_design = any(fix.by_design for fix in chosen)
        return example.first_other_decision(before, after, by_design, failed_at)

    unapplied: dict[str, str] = {}
    hung: list[frozenset[str]] = []  # sets under which a replay hung: no superset is tried
    otherwise: list[tuple[str, int]] = []
    other: list[tuple[str, str]] = []
    stops: list[tuple[tuple[str, ...], str]] = []
    passes: list[tuple[str, ...]] = []
    on_purpose: list[tuple[tuple[str, ...], int]] = []
    for size in range(1, len(fixes) + 1):
        for chosen in itertools.combinations(fixes, size):
            names = tuple(fix.name for fix in chosen)
            if not any(fix in candidates for fix in chosen) or set(names) & set(unapplied):
                continue
            if any(h <= set(names) for h in hung):
                continue
            ran, result, after = run(chosen)
            if ran != "ran":
                if size == 1 and ran.startswith("unapplied: "):
                    unapplied[names[0]] = ran.removeprefix("unapplied: ")
                continue
            if result is not None:
                hang = result.rule == "progress" and _HANG in str(result)
                if hang:
                    hung.append(frozenset(names))
                # a hang is a failure even where `progress` is accepted: it cannot go on
                if result.rule in accepted and result.rule != rule and not hang:
                    stops.append((names, result.rule))
                elif size == 1 and result.rule != rule:
                    other.append((names[0], result.rule))
                continue
            differs = alike(chosen, after)
            if differs is not None:
                if size == 1:
                    otherwise.append((names[0], differs))
                continue
            # a larger set must need its candidates: without them, it must not pass alike
            rest = tuple(fix for fix in chosen if fix not in candidates)
            if rest:
                ran, without, after_rest = run(rest)
                if ran == "ran" and without is None and alike(rest, after_rest) is None:
                    continue
            passes.append(names)
            own = example.first_other_decision(before, after, False, failed_at)
            if own is not None:
                on_purpose.append((names, own))
        if passes:
            break
    return FixTrial(
        rule,
        candidates,
        replayed=True,
        passes_with=tuple(passes),
        on_purpose=tuple(on_purpose),
        passes_otherwise=tuple(otherwise),
        other=tuple(other),
        accepted_stops=tuple(stops),
        unapplied=tuple(unapplied.items()),
        witnessed=witnessed,
        unit=unit,
        stops=example.by_design_stops,
        summaries=summaries,
    )


__all__ = ["Example", "FixTrial", "KnownFix", "try_known_fixes"]
