"""A failing AR example, kept to be run again outside Hypothesis.

The AR conformance machine attaches one to each violation it raises (`SpecViolation.example`):
the configuration, the policy the harness checked and every operation it was asked for, the
failing one last. `replay` runs the same operations through a fresh harness, then drains as the
machine's teardown does, and returns the violation it meets, if any. `schedspec verify` uses it
to try an engine's known fixes on a failure: the same program run again with one fix applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from properties.ar.decisions import apply_ar_ops, twin_harness
from properties.ar.harness import ArAbort, ArDrain, ArOp, ArStep, ArSubmit
from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import ArConfig
from spec.ar.events import ArEvent
from spec.ar.profile import ArPolicy
from spec.errors import SpecViolation

# what a hang or an implementation error names the operation by (as the harness does)
_CALL_OF: dict[type[ArOp], str] = {
    ArSubmit: "submit",
    ArAbort: "abort",
    ArStep: "step",
    ArDrain: "drain",
}


@dataclass(frozen=True, slots=True)
class ArExample:
    """One AR example: `ops` run on `config`, checked under `policy` (None: the adapter's own
    rules)."""

    config: ArConfig
    policy: ArPolicy | None
    ops: tuple[ArOp, ...]

    def replay(self, factory: ArImplementationFactory) -> SpecViolation | None:
        """Run the operations through a fresh `factory` harness, each one guarded (an
        exception from the implementation is `implementation_error`), then the teardown's
        drain; the first violation, or None when the run conforms to the end."""
        return self.run(factory)[0]

    def run(self, factory: ArImplementationFactory) -> tuple[SpecViolation | None, list[ArEvent]]:
        """As `replay`, with the events the implementation emitted up to the violation (the
        violating one included)."""
        harness = twin_harness(factory, self.config, self.policy)

        def run(ops: Sequence[ArOp]) -> None:
            apply_ar_ops(harness, ops)

        try:
            for op in self.ops:
                harness.guarded(_CALL_OF[type(op)], run, (op,))
            harness.guarded("drain", harness.drain)
        except SpecViolation as violation:
            return violation, harness.events
        return None, harness.events


__all__ = ["ArExample"]
