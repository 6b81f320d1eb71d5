"""A failing dLLM example, kept to be run again outside Hypothesis.

The dLLM conformance machine attaches one to each violation it raises in a harness operation or
its teardown (`SpecViolation.example`): the configuration, the profile the harness checked,
every operation it was asked for (the failing one last), the teardown's output check and the
decision twin when the run had one. `run` does what the machine did: the same operations
through a fresh harness, the teardown's drain, the parity check and the twin's comparison; and
returns the violation it meets, if any. `schedspec verify` uses it to try an engine's known
fixes on a failure: the same program run again with a fix applied, which must decide as
before up to the failure (`first_other_decision`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from properties.deadline import CallDeadlineExceeded
from properties.decisions import DecisionTwin, admissions_by_round, forward_rounds, twin_difference
from properties.harness import Harness, SoloCache, check_parity
from properties.operations import Abort, Drain, Op, Round, Submit, apply_ops
from properties.replay import build_for_replay
from spec.adapter import ImplementationFactory
from spec.config import DllmConfig
from spec.errors import SpecViolation
from spec.events import Event
from spec.profile import DllmProfile

#: The output check at a conformance example's teardown: "always" (every run's outputs equal
#: the solo sync outputs), "bs1" (only batch-size-1 runs'), "never".
ParityPolicy = Literal["always", "bs1", "never"]

# what a hang or an implementation error names the operation by (as the conformance machine)
_CALL_OF: dict[type[Op], str] = {
    Submit: "submit",
    Abort: "abort",
    Round: "run_round",
    Drain: "drain",
}


@dataclass(frozen=True, slots=True)
class DllmExample:
    """One dLLM example: `ops` run on `config` under `profile`, golden outputs checked after
    every round when `golden`, outputs checked against solo sync at the end as `parity` says,
    and, when the run had a decision twin, ended by comparing it (`twin`, checked under
    `twin_profile`, default `profile`)."""

    config: DllmConfig
    profile: DllmProfile
    ops: tuple[Op, ...]
    parity: ParityPolicy = "always"
    golden: bool = True
    twin: DecisionTwin | None = None
    twin_profile: DllmProfile | None = None

    #: what one decision of the family is called in a verdict
    unit = "round"

    def replay(self, factory: ImplementationFactory) -> SpecViolation | None:
        """The first violation of running the example through `factory` (`run`), or None."""
        return self.run(factory)[0]

    def run(self, factory: ImplementationFactory) -> tuple[SpecViolation | None, list[Event]]:
        """Run the operations through a fresh `factory` harness, each one guarded (an exception
        from the implementation is `implementation_error`, a call past its deadline `progress`,
        as in the conformance machine; building it too), then the teardown's drain, parity
        check and twin comparison. Returns the first violation (None when the run conforms to
        the end) and the events the implementation emitted until then."""
        harness = build_for_replay(
            lambda: Harness(factory, self.config, profile=self.profile, check_golden=self.golden)
        )
        if isinstance(harness, SpecViolation):
            return harness, []
        try:
            for op in self.ops:
                harness.guarded(_CALL_OF[type(op)], apply_ops, harness, (op,))
            harness.guarded("drain", harness.drain)
            self._end_of_run_checks(harness)
        except SpecViolation as violation:
            return violation, harness.events
        except CallDeadlineExceeded as hang:
            return SpecViolation("progress", str(hang)), harness.events
        return None, harness.events

    def _end_of_run_checks(self, h: Harness) -> None:
        """The conformance machine's teardown checks: parity as `parity` says, then the twin."""
        batch_one = h.config.max_running_requests == 1
        if self.parity == "always" or (self.parity == "bs1" and batch_one):
            cache: SoloCache = {}
            h.guarded("parity", check_parity, h, cache)
        if self.twin is not None:
            profile = self.twin_profile or self.profile
            differs = twin_difference(h.events, h.config, self.twin, profile)
            if differs is not None:
                raise h._violate("twin_decisions", differs)

    def without_twin(self) -> DllmExample:
        """The example without its decision twin (a fix's trial: a twin that copies the
        released engine's decisions differs from a fixed one by design)."""
        return replace(self, twin=None, twin_profile=None)

    #: with `by_design`, the comparison stops at the fix's own first decision (an admission)
    by_design_stops = True

    @staticmethod
    def first_other_decision(
        before: Sequence[Event],
        after: Sequence[Event],
        by_design: bool = False,
        failed_at: object | None = None,
    ) -> int | None:
        """The first round of `before` that `after` admits (the requests, in order) or forwards
        (each forward's rows) otherwise; None when every one is the same. When the failure was
        raised at `before`'s last event (`failed_at`, the violation's event: the decision that
        broke the rule, the end of an idle round), that event is left out and the round it fell
        in is compared as far as it went: what that round admitted and forwarded must begin
        what `after` did in it. Otherwise (a crash, a check after a round or at the end of the
        run) every round of `before` is compared whole. With `by_design` (a fix that admits
        otherwise on purpose: an estimate, a reservation) the rounds are compared only up to
        the first that admits otherwise: the fix's own decision, after which all may differ."""
        at_event = failed_at is not None and bool(before) and before[-1] == failed_at
        decided = before[:-1] if at_event else before
        mine_admits, theirs_admits = admissions_by_round(decided), admissions_by_round(after)
        mine_rows, theirs_rows = forward_rounds(decided), forward_rounds(after)
        last = len(mine_admits) - 1  # what came after the last round's end
        for index in range(last + 1):
            if index >= len(theirs_admits):
                return index
            whole = index < last or not at_event
            if not _alike(mine_admits[index], theirs_admits[index], whole):
                return None if by_design else index
            if not _alike(mine_rows[index], theirs_rows[index], whole):
                return index
        return None


def _alike(mine: Sequence[object], theirs: Sequence[object], whole: bool) -> bool:
    """`mine` equals `theirs`, or (not `whole`) begins it."""
    return list(mine) == list(theirs) if whole else list(mine) == list(theirs[: len(mine)])


__all__ = ["DllmExample", "ParityPolicy"]
