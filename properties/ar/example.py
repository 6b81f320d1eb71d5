"""A failing AR example, kept to be run again outside Hypothesis.

The AR conformance machine attaches one to each violation it raises in a harness operation or
its teardown (`SpecViolation.example`): the configuration, the policy the harness checked, every
operation it was asked for (the failing one last), and the decision twin when the run had one.
`run` does what the machine did: the same operations through a fresh harness, the teardown's
drain, then the twin's comparison; and returns the violation it meets, if any. `schedspec
verify` uses it to try an engine's known fixes on a failure: the same program run again with a
fix applied, which must decide as before up to the failure (`first_other_decision`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from properties.ar.decisions import apply_ar_ops, twin_difference, twin_harness
from properties.ar.harness import (
    ArAbort,
    ArAwait,
    ArDrain,
    ArHarness,
    ArInputReady,
    ArOp,
    ArPause,
    ArPropose,
    ArResetCache,
    ArStep,
    ArSubmit,
)
from properties.deadline import CallDeadlineExceeded
from properties.replay import build_for_replay
from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import ArConfig
from spec.ar.decisions import step_decisions
from spec.ar.events import ArEvent
from spec.ar.profile import ArPolicy
from spec.errors import SpecViolation

# what a hang or an implementation error names the operation by (as the harness does)
_CALL_OF: dict[type[ArOp], str] = {
    ArSubmit: "submit",
    ArAbort: "abort",
    ArStep: "step",
    ArDrain: "drain",
    ArAwait: "await_input",
    ArInputReady: "input_ready",
    ArPause: "set_pause",
    ArResetCache: "reset_cache",
    ArPropose: "propose_drafts",
}


@dataclass(frozen=True, slots=True)
class ArExample:
    """One AR example: `ops` run on `config`, checked under `policy` (None: the adapter's own
    rules), and, when the run had a decision twin, ended by comparing it (`twin`, checked under
    `twin_policy`)."""

    config: ArConfig
    policy: ArPolicy | None
    ops: tuple[ArOp, ...]
    twin: ArImplementationFactory | None = None
    twin_policy: ArPolicy | None = None

    #: what one decision of the family is called in a verdict
    unit = "step"

    def replay(self, factory: ArImplementationFactory) -> SpecViolation | None:
        """The first violation of running the example through `factory` (`run`), or None."""
        return self.run(factory)[0]

    def run(self, factory: ArImplementationFactory) -> tuple[SpecViolation | None, list[ArEvent]]:
        """Run the operations through a fresh `factory` harness, each one guarded (an exception
        from the implementation is `implementation_error`, a call past its deadline
        `progress`, as in the conformance machine; building it too), then the teardown's
        drain and the twin's comparison. Returns the first violation (None when the run
        conforms to the end) and the events the implementation emitted until then."""
        harness = build_for_replay(lambda: twin_harness(factory, self.config, self.policy))
        if isinstance(harness, SpecViolation):
            return harness, []
        try:
            for op in self.ops:
                harness.guarded(_CALL_OF[type(op)], _apply, harness, (op,))
            harness.guarded("drain", harness.drain)
            if self.twin is not None:
                h = harness
                differs = twin_difference(h.ops, h.events, h.config, self.twin, self.twin_policy)
                if differs is not None:
                    raise h._violate("twin_decisions", differs)
        except SpecViolation as violation:
            return violation, harness.events
        except CallDeadlineExceeded as hang:
            return SpecViolation("progress", str(hang)), harness.events
        return None, harness.events

    def without_twin(self) -> ArExample:
        """The example without its decision twin (a fix's trial: a twin that copies the
        released engine's decisions differs from a fixed one by design)."""
        return replace(self, twin=None, twin_policy=None)

    #: with `by_design` only allocations are left out: scheduling is compared at every step
    by_design_stops = False

    @staticmethod
    def first_other_decision(
        before: Sequence[ArEvent],
        after: Sequence[ArEvent],
        by_design: bool = False,
        failed_at: object | None = None,
    ) -> int | None:
        """The first step, among those that ended in `before`, that `after` schedules, preempts
        or allocates otherwise; None when every one is the same (`failed_at`, the violation's
        event, is not read: a step that never ended is no step). With `by_design` (a fix that
        allocates otherwise on purpose: a reservation's size) allocations are not compared."""
        mine, theirs = step_decisions(before), step_decisions(after)
        for index, decision in enumerate(mine):
            if index >= len(theirs):
                return index
            other = theirs[index]
            if (decision.scheduled, decision.preempted) != (other.scheduled, other.preempted):
                return index
            if not by_design and decision.allocated != other.allocated:
                return index
        return None


def _apply(harness: ArHarness, ops: Sequence[ArOp]) -> None:
    apply_ar_ops(harness, ops)


__all__ = ["ArExample"]
