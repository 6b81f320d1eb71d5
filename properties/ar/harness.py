"""The AR conformance harness: drive one AR implementation and hold it to the AR spec.

Every event is replayed into an `ArSpecMachine` as it is emitted (a violation is raised at the
faulty event, with the implementation's stack live), the state invariants are checked after each
event, and the implementation's own snapshot is compared with the abstract state after every
step, abort and drain. The spec checks the ordering rules the implementation declares
(`adapter.rules`); the core rules hold for all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spec.ar.adapter import ArImplementationFactory, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRequest, validate_ar_request
from spec.ar.events import ArEvent, ArStepEnd
from spec.ar.lifecycles import AR_ACTIVE_PHASES, ArPhase
from spec.ar.machine import ArSpecMachine
from spec.errors import DuplicateRequest, RequestError, SpecViolation, UnknownRequest


@dataclass
class ArHarness:
    """One AR implementation under test, built by `factory` for `config`."""

    factory: ArImplementationFactory
    config: ArConfig
    check_invariants: bool = True
    events: list[ArEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.violation: SpecViolation | None = None
        self.impl: ArSchedulerAdapter = self.factory(self.config, self._sink)
        self.spec = ArSpecMachine(self.config, self.impl.rules)
        self.steps = 0

    def _violate(self, rule: str, detail: str) -> SpecViolation:
        v = SpecViolation(rule, detail)
        self.violation = self.violation or v
        return v

    def _sink(self, event: ArEvent) -> None:
        self.events.append(event)
        try:
            self.spec.apply(event)
            if self.check_invariants:
                self.spec.check_invariants()
        except SpecViolation as v:
            self.violation = self.violation or v
            raise

    def _expect_rejection(self, request: ArRequest) -> str | None:
        if self.spec.request_phase(request.request_id) is not None:
            return "duplicate"
        try:
            validate_ar_request(self.config, request)
        except RequestError as err:
            return type(err).__name__
        return None

    # ------------------------------------------------------------------ operations
    def submit(self, request: ArRequest) -> RequestError | None:
        """Submit; return the typed error if the implementation (rightly) rejected it."""
        expected = self._expect_rejection(request)
        before = len(self.events)
        try:
            self.impl.submit(request)
        except RequestError as err:
            if len(self.events) != before:
                raise self._violate(
                    "valid_request", f"rejected {request.request_id!r} but emitted events"
                ) from None
            if expected is None:
                raise self._violate(
                    "valid_request", f"rejected a valid request {request!r}: {err}"
                ) from None
            if expected == "duplicate" and not isinstance(err, DuplicateRequest):
                raise self._violate(
                    "unique_submission",
                    f"duplicate id rejected with {type(err).__name__}, not DuplicateRequest",
                ) from None
            self._check_snapshot()
            return err
        if expected is not None:  # pragma: no cover - the ArSubmitted event already failed
            raise self._violate("valid_request", f"accepted {request!r} ({expected})")
        self._check_snapshot()
        return None

    def abort(self, request_id: str) -> UnknownRequest | None:
        phase = self.spec.request_phase(request_id)
        active = phase in AR_ACTIVE_PHASES
        before = len(self.events)
        try:
            self.impl.abort(request_id)
        except UnknownRequest as err:
            if active:
                raise self._violate(
                    "known_request", f"abort of active request {request_id!r} was refused: {err}"
                ) from None
            if len(self.events) != before:
                raise self._violate("known_request", "a refused abort emitted events") from None
            return err
        if self.spec.request_phase(request_id) is not ArPhase.ABORTED:
            raise self._violate(
                "known_request", f"abort of {request_id!r} returned without an ArAborted event"
            )
        self._check_snapshot()
        return None

    def step(self) -> None:
        expected = self.spec.step_index
        self.impl.step()
        if self.spec.step_index <= expected:
            raise self._violate(
                "step_order", f"step() returned without ending step {expected} (no ArStepEnd)"
            )
        self.steps += 1
        self._check_snapshot()

    def drain(self, max_steps: int = 10_000) -> None:
        self.impl.drain(max_steps)
        if not self.spec.is_idle():
            raise self._violate(
                "progress", "drain returned while requests are still waiting or running"
            )
        self._check_snapshot()
        snap = self.impl.snapshot()
        if snap.held_blocks():
            raise self._violate(
                "block_conservation", f"after drain {snap.held_blocks()} blocks are still held"
            )

    def _check_snapshot(self) -> None:
        try:
            self.spec.check_snapshot(self.impl.snapshot())
        except SpecViolation as v:
            self.violation = self.violation or v
            raise

    def ended_steps(self) -> int:
        return sum(1 for e in self.events if isinstance(e, ArStepEnd))

    def outputs(self) -> dict[str, int]:
        return self.spec.outputs()
