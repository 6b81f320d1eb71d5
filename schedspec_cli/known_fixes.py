"""Trying an engine's known fixes on a failure that `verify` found.

A real engine's built-in may name the fixes of its engine's known findings (`Builtin.known_fixes`,
each an `integrations.patches.KnownFix` with the rules its finding breaks). For a failure whose
example its harness kept (`Failure.example`, an `ArExample`):

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
passes with it and every step that ended before the failure schedules, preempts and allocates as
it did without it (allocations aside for a fix that changes them by design: a reservation's
size). A pass by other decisions is reported apart, with the first step that differs, and a
failure by another rule with that rule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from properties.ar.example import ArExample
from properties.verify import Failure
from spec.ar.adapter import ArImplementationFactory
from spec.ar.decisions import step_decisions
from spec.ar.events import ArEvent


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
    def allocates(self) -> bool:
        """Whether it changes what is allocated by design (allocations not compared)."""
        ...

    def applied(self, *also: str) -> contextlib.AbstractContextManager[None]:
        """A context manager applying it with the fixes named in `also`."""
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
    passes_otherwise: (fix, step) for each under which it passes, deciding otherwise from that
        step on.
    other: (fix, rule) for each under which it fails by another rule.
    unapplied: (fix, why) for each the installed engine's files do not take (a patched install).
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
        for name in self.passes_with:
            out.append(
                f"KNOWN FINDING: this program passes with the engine fix `{name}` "
                f"({summaries[name]}) applied{also}, deciding as before up to the failure; "
                f"without it, it fails by [{rule}] again."
            )
        for name, step in self.passes_otherwise:
            out.append(
                f"With the engine fix `{name}` applied it passes too, but decides otherwise "
                f"from step {step} on, before the failure: no evidence of that finding."
            )
        for name, other in self.other:
            out.append(f"With the engine fix `{name}` applied it fails by [{other}] instead.")
        for name, why in self.unapplied:
            out.append(f"The engine fix `{name}` could not be applied to the install: {why}")
        return out


def _first_other_step(
    before: Sequence[ArEvent], after: Sequence[ArEvent], allocations: bool = True
) -> int | None:
    """The first step, among those that ended in `before`, that `after` schedules, preempts or
    (with `allocations`) allocates otherwise; None when every one is the same."""
    mine, theirs = step_decisions(before), step_decisions(after)
    for index, decision in enumerate(mine):
        if index >= len(theirs):
            return index
        other = theirs[index]
        if (decision.scheduled, decision.preempted) != (other.scheduled, other.preempted):
            return index
        if allocations and decision.allocated != other.allocated:
            return index
    return None


def try_known_fixes(
    failure: Failure,
    factory: ArImplementationFactory,
    fixes: Sequence[KnownFix],
    named: Iterable[str] = (),
) -> FixTrial | None:
    """Run `failure`'s example again through `factory`, as it is and with each candidate of
    `fixes` applied; when none names it, again with the fixes `named` for earlier failures
    applied too. None when there is no fix at all or no example kept (a dLLM failure, a hang,
    a check outside the harness's operations)."""
    example = failure.example
    if not fixes or not isinstance(example, ArExample):
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
    example: ArExample,
    factory: ArImplementationFactory,
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
                return FixTrial(rule, candidates, base, again=f"they did not apply: {err}")
        again, before = example.run(factory)
    if again is None or again.rule != rule:
        said = "it passed" if again is None else f"it failed by [{again.rule}]"
        return FixTrial(rule, candidates, base, again=said)
    passes: list[str] = []
    otherwise: list[tuple[str, int]] = []
    other: list[tuple[str, str]] = []
    unapplied: list[tuple[str, str]] = []
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
        differs = _first_other_step(before, after, allocations=not fix.allocates)
        if differs is None:
            passes.append(fix.name)
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
    )


__all__ = ["FixTrial", "KnownFix", "try_known_fixes"]
