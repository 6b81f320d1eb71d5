"""Trying an engine's known fixes on a failure that `verify` found.

A real engine's built-in may name the fixes of its engine's known findings (`Builtin.known_fixes`,
each an `integrations.patches.KnownFix` with the rules its finding breaks). For a failure whose
example its harness kept (`Failure.example`: an AR `ArExample` or a dLLM `DllmExample`):

- only the fixes whose finding breaks the failure's rule are candidates (none: the failure is no
  known finding, and the output says which rules the known findings break);
- the example is run again as it is: it must fail by the same rule, else nothing is claimed;
- then once per candidate with that fix applied; when none names it, all of that again with
  the fixes that named earlier failures of the same run applied too (`named`: a campaign's
  later failure was found with the earlier rules ignored, so it may pass only once they are
  fixed; applied from the start, they may also keep it from showing at all).

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
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
    def by_design(self) -> bool:
        """Whether it changes a decision before the failure on purpose
        (`Example.first_other_decision`'s `by_design`)."""
        ...

    def applied(self, *also: str) -> contextlib.AbstractContextManager[None]:
        """A context manager applying it with the fixes named in `also`."""
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

    def first_other_decision(
        self, before: Sequence[Any], after: Sequence[Any], by_design: bool = False
    ) -> int | None:
        """The first decision, among those that ended in `before`, that `after` makes
        otherwise (None: every one alike); `by_design` leaves out what a fix changes on
        purpose."""
        ...


@dataclass(frozen=True, slots=True)
class FixTrial:
    """What running a failure's example again found.

    rule: the failure's rule. tried: the candidate fixes (their finding breaks `rule`), each
        applied with `named`, the fixes that named earlier failures of the run.
    known_rules: with no candidate, the rules the known findings break.
    replayed: run again without a candidate, it failed by the same rule (else none was tried,
        and `again` says what it did instead: "it passed", the rule it broke).
    passes_with: the candidates under which it passes, deciding as before up to the failure.
    passes_otherwise: (fix, index) for each under which it passes, deciding otherwise from that
        step (AR) or round (dLLM, `unit`) on.
    other: (fix, rule) for each under which it fails by another rule.
    unapplied: (fix, why) for each the installed engine's files do not take (a patched install).
    unit: what one decision is called ("step", "round").
    on_purpose: (fix, index) for each of `passes_with` that decides otherwise from that step or
        round on, as it does by design (`KnownFix.by_design`: a reservation's size, an
        admission estimate): the decisions before it are the same.
    """

    rule: str
    tried: tuple[KnownFix, ...]
    named: tuple[str, ...] = ()
    known_rules: tuple[str, ...] = ()
    replayed: bool = False
    again: str = ""
    passes_with: tuple[str, ...] = ()
    passes_otherwise: tuple[tuple[str, int], ...] = ()
    other: tuple[tuple[str, str], ...] = ()
    unapplied: tuple[tuple[str, str], ...] = ()
    unit: str = "step"
    on_purpose: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Every field by name (fixes by name; pairs as objects), and `verdict`: `lines()`."""
        out: dict[str, Any] = {
            "tried": [fix.name for fix in self.tried],
            "with_named": list(self.named),
            "replayed": self.replayed,
            "passes_with": list(self.passes_with),
            "passes_otherwise": dict(self.passes_otherwise),
            "other": dict(self.other),
            "unapplied": dict(self.unapplied),
            "on_purpose": dict(self.on_purpose),
        }
        if not self.tried:
            out["known_rules"] = list(self.known_rules)
        elif not self.replayed:
            out["again"] = self.again
        out["verdict"] = self.lines()
        return out

    def lines(self) -> list[str]:
        """The verdict in words, for the text output (after the failure's program)."""
        rule = self.rule
        if not self.tried:
            return [
                f"NO KNOWN FINDING BREAKS [{rule}]: the known ones break "
                f"{', '.join(f'[{r}]' for r in self.known_rules)}."
            ]
        names = ", ".join(f"`{fix.name}`" for fix in self.tried)
        also = (
            f" together with {', '.join(f'`{n}`' for n in self.named)}, which named an earlier "
            "failure"
            if self.named
            else ""
        )
        if not self.replayed:
            return [
                f"KNOWN FIXES NOT TRIED ({names}): run again outside Hypothesis"
                f"{' with ' + ', '.join(self.named) + ' applied' if self.named else ''}, the "
                f"program did not fail by [{rule}] ({self.again})."
            ]
        summaries = {fix.name: fix.summary for fix in self.tried}
        out: list[str] = []
        if not self.passes_with:
            out.append(
                f"NO KNOWN FIX IDENTIFIES IT: with none of {names} applied{also} does the "
                "program pass deciding as before (a new finding, or several at once)."
            )
        on_purpose = dict(self.on_purpose)
        for name in self.passes_with:
            alike = "deciding as before up to the failure"
            if name in on_purpose:
                alike = (
                    f"deciding as before up to {self.unit} {on_purpose[name]}, where it decides "
                    "otherwise by design"
                )
            out.append(
                f"KNOWN FINDING: this program passes with the engine fix `{name}` "
                f"({summaries[name]}) applied{also}, {alike}; without it, it fails by [{rule}] "
                "again."
            )
        for name, index in self.passes_otherwise:
            out.append(
                f"With the engine fix `{name}` applied it passes too, but decides otherwise "
                f"from {self.unit} {index} on, before the failure: no evidence of that finding."
            )
        for name, other in self.other:
            out.append(f"With the engine fix `{name}` applied it fails by [{other}] instead.")
        for name, why in self.unapplied:
            out.append(f"The engine fix `{name}` could not be applied to the install: {why}")
        return out


def try_known_fixes(
    failure: Failure,
    factory: Any,
    fixes: Sequence[KnownFix],
    named: Iterable[str] = (),
) -> FixTrial | None:
    """Run `failure`'s example again through `factory`, as it is and with each candidate of
    `fixes` applied; when none names it, again with the fixes `named` for earlier failures
    applied too. `factory` is the implementation's, of `failure.example`'s family. None when
    there is no fix at all or no example kept (a hang, a check outside the harness's
    operations)."""
    example = failure.example
    if not fixes or not isinstance(example, ArExample | DllmExample):
        return None
    rule = failure.rule
    candidates = tuple(fix for fix in fixes if rule in fix.rules)
    if not candidates:
        known = tuple(sorted({r for fix in fixes for r in fix.rules}))
        return FixTrial(rule, (), known_rules=known)
    alone = _trial(example, factory, rule, candidates, (), fixes[0].apply)
    base = tuple(n for n in named if n not in {fix.name for fix in candidates})
    if alone.passes_with or not base:
        return alone
    # a campaign's later failure was found with the earlier rules ignored: it may pass only
    # once the earlier findings are fixed too
    together = _trial(example, factory, rule, candidates, base, fixes[0].apply)
    return together if together.passes_with or not alone.replayed else alone


def _trial(
    example: Example,
    factory: Any,
    rule: str,
    candidates: tuple[KnownFix, ...],
    base: tuple[str, ...],
    apply: Callable[[Iterable[str]], contextlib.AbstractContextManager[None]],
) -> FixTrial:
    """The example run with the fixes `base` applied (`apply`), then with each candidate too."""
    from integrations.patches import FixDoesNotApply

    with contextlib.ExitStack() as stack:
        if base:
            try:
                stack.enter_context(apply(base))
            except FixDoesNotApply as err:
                why = f"they did not apply: {err}"
                return FixTrial(rule, candidates, base, again=why, unit=example.unit)
        again, before = example.run(factory)
    if again is None or again.rule != rule:
        said = "it passed" if again is None else f"it failed by [{again.rule}]"
        return FixTrial(rule, candidates, base, again=said, unit=example.unit)
    passes: list[str] = []
    otherwise: list[tuple[str, int]] = []
    other: list[tuple[str, str]] = []
    unapplied: list[tuple[str, str]] = []
    on_purpose: list[tuple[str, int]] = []
    for fix in candidates:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(fix.applied(*base))
            except FixDoesNotApply as err:  # a patched install; nothing was changed
                unapplied.append((fix.name, str(err)))
                continue
            result, after = example.run(factory)
        if result is not None:
            if result.rule != rule:
                other.append((fix.name, result.rule))
            continue
        differs = example.first_other_decision(before, after, by_design=fix.by_design)
        if differs is None:
            passes.append(fix.name)
            own = example.first_other_decision(before, after) if fix.by_design else None
            if own is not None:
                on_purpose.append((fix.name, own))
        else:
            otherwise.append((fix.name, differs))
    return FixTrial(
        rule,
        candidates,
        base,
        replayed=True,
        passes_with=tuple(passes),
        passes_otherwise=tuple(otherwise),
        other=tuple(other),
        unapplied=tuple(unapplied),
        unit=example.unit,
        on_purpose=tuple(on_purpose),
    )


__all__ = ["Example", "FixTrial", "KnownFix", "try_known_fixes"]
