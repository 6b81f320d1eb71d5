"""Trying an engine's known fixes on a failure that `verify` found.

A real engine's built-in may name the fixes of its engine's known findings (`Builtin.known_fixes`,
each an `integrations.patches.KnownFix`). For a failure whose example its harness kept
(`Failure.example`, an `ArExample`), the example is first run again as it is: it must fail by the
same rule, else nothing is claimed. Then it is run once with each fix applied alone.

A rule match is no proof, and neither is passing alone: a fix may change what is scheduled early
on so that the program never reaches the failure (FasterTransformer's reservation fix admits
fewer requests at once, and an early finisher then has no batch mate to outlive). A fix
identifies the failure when the program passes with it and every step up to the failing one
schedules and preempts as it did without it. A fix under which it passes by other decisions is
reported apart, with the first step that differs, and one under which it fails by another rule
with that rule (the program may show two findings at once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from integrations.patches import FixDoesNotApply, KnownFix
from properties.ar.example import ArExample
from properties.verify import Failure
from spec.ar.adapter import ArImplementationFactory
from spec.ar.decisions import step_decisions
from spec.ar.events import ArEvent


@dataclass(frozen=True, slots=True)
class FixTrial:
    """What running a failure's example again found.

    tried: the fixes tried, each alone.
    replayed: run again without a fix, it failed by the same rule (else no fix was tried, and
        `again` says what it did instead: "it passed" or the rule it broke).
    passes_with: the fixes under which it passes, scheduling as before up to the failure.
    passes_otherwise: (fix, step) for each fix under which it passes, but schedules otherwise
        from that step on.
    other: (fix, rule) for each fix under which it fails by another rule.
    unapplied: (fix, why) for each fix the installed engine's files do not take (a patched
        install: the place the fix edits is gone, or already edited).
    """

    tried: tuple[KnownFix, ...]
    replayed: bool
    again: str = ""
    passes_with: tuple[str, ...] = ()
    passes_otherwise: tuple[tuple[str, int], ...] = ()
    other: tuple[tuple[str, str], ...] = ()
    unapplied: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """`tried` (fix names), `replayed`, `passes_with`, `passes_otherwise` as {fix: step},
        `other` as {fix: rule}, `unapplied` as {fix: why}; with `replayed` false, `again`."""
        out: dict[str, Any] = {
            "tried": [fix.name for fix in self.tried],
            "replayed": self.replayed,
            "passes_with": list(self.passes_with),
            "passes_otherwise": dict(self.passes_otherwise),
            "other": dict(self.other),
            "unapplied": dict(self.unapplied),
        }
        if not self.replayed:
            out["again"] = self.again
        return out

    def lines(self, rule: str) -> list[str]:
        """The finding in words, for the text output (after the failure's program)."""
        names = ", ".join(f"`{fix.name}`" for fix in self.tried)
        if not self.replayed:
            return [
                f"KNOWN FIXES NOT TRIED ({names}): run again outside Hypothesis, the program "
                f"did not fail by [{rule}] ({self.again})."
            ]
        summaries = {fix.name: fix.summary for fix in self.tried}
        out: list[str] = []
        if not self.passes_with:
            out.append(
                f"NO KNOWN FIX IDENTIFIES IT: with none of {names} applied alone does the "
                "program pass scheduling as before (a new finding, or several at once)."
            )
        for name in self.passes_with:
            out.append(
                f"KNOWN FINDING: this program passes with the engine fix `{name}` applied "
                f"({summaries[name]}), scheduling as before up to the failure; without it, it "
                f"fails by [{rule}] again."
            )
        for name, step in self.passes_otherwise:
            out.append(
                f"With the engine fix `{name}` applied it passes too, but schedules otherwise "
                f"from step {step} on, before the failure: no evidence of that finding."
            )
        for name, other in self.other:
            out.append(f"With the engine fix `{name}` applied it fails by [{other}] instead.")
        for name, why in self.unapplied:
            out.append(f"The engine fix `{name}` could not be applied to the install: {why}")
        return out


def _first_other_step(before: Sequence[ArEvent], after: Sequence[ArEvent]) -> int | None:
    """The first step, among those that ended in `before`, that `after` schedules or preempts
    otherwise; None when every one is the same."""
    mine, theirs = step_decisions(before), step_decisions(after)
    for index, decision in enumerate(mine):
        if index >= len(theirs):
            return index
        other = theirs[index]
        if (decision.scheduled, decision.preempted) != (other.scheduled, other.preempted):
            return index
    return None


def try_known_fixes(
    failure: Failure, factory: ArImplementationFactory, fixes: Sequence[KnownFix]
) -> FixTrial | None:
    """Run `failure`'s example again through `factory`, as it is and with each of `fixes`
    applied alone; None when there is no fix to try or no example kept (a dLLM failure, a
    hang, a twin's difference)."""
    example = failure.example
    if not fixes or not isinstance(example, ArExample):
        return None
    tried = tuple(fixes)
    again, before = example.run(factory)
    if again is None or again.rule != failure.rule:
        said = "it passed" if again is None else f"it failed by [{again.rule}]"
        return FixTrial(tried, replayed=False, again=said)
    passes: list[str] = []
    otherwise: list[tuple[str, int]] = []
    other: list[tuple[str, str]] = []
    unapplied: list[tuple[str, str]] = []
    for fix in tried:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(fix.applied())
            except FixDoesNotApply as err:  # a patched install; nothing was changed
                unapplied.append((fix.name, str(err)))
                continue
            result, after = example.run(factory)
        if result is not None:
            if result.rule != failure.rule:
                other.append((fix.name, result.rule))
            continue
        differs = _first_other_step(before, after)
        if differs is None:
            passes.append(fix.name)
        else:
            otherwise.append((fix.name, differs))
    return FixTrial(
        tried,
        replayed=True,
        passes_with=tuple(passes),
        passes_otherwise=tuple(otherwise),
        other=tuple(other),
        unapplied=tuple(unapplied),
    )


__all__ = ["FixTrial", "try_known_fixes"]
