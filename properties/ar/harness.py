"""The AR conformance harness: drive one AR implementation and hold it to the AR spec.

Every event is replayed into an `ArSpecMachine` as it is emitted (a violation is raised at the
faulty event, with the implementation's stack live), the state invariants are checked after each
event, and the implementation's own snapshot is compared with the abstract state after every
step, abort and drain. The spec checks the ordering rules the implementation declares
(`adapter.rules`); the core rules hold for all.

The harness records every operation it was asked for (`ops`: `ArSubmit`, `ArAbort`, `ArStep`,
`ArDrain`, for a request awaiting an input `ArAwait` and `ArInputReady`, and an operator's
`ArPause` and `ArResetCache`, and a drafter's `ArPropose`; rejected
submissions and unknown aborts included), so that the same run can be
replayed through another implementation (`properties.ar.decisions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from properties.adapter_check import require_adapter
from properties.replay import ReplayHarness
from spec.ar.adapter import (
    ArAwaitingAdapter,
    ArDraftingAdapter,
    ArImplementationFactory,
    ArPausingAdapter,
    ArSchedulerAdapter,
)
from spec.ar.config import ArConfig, ArRequest, validate_ar_request
from spec.ar.events import ArEvent, ArStepEnd, ArSubmitted
from spec.ar.lifecycles import AR_ACTIVE_PHASES, ArPhase
from spec.ar.machine import ArSpecMachine
from spec.ar.profile import ArPolicy
from spec.errors import CannotDrive, RequestError, SpecViolation, UnknownRequest


@dataclass(frozen=True, slots=True)
class ArSubmit:
    """The operation that submits `request`."""

    request: ArRequest


@dataclass(frozen=True, slots=True)
class ArAbort:
    """The operation that aborts `request_id`."""

    request_id: str


@dataclass(frozen=True, slots=True)
class ArStep:
    """The operation that runs one step."""

    pass


@dataclass(frozen=True, slots=True)
class ArDrain:
    """The operation that drains the implementation, running at most `max_steps` steps."""

    max_steps: int


@dataclass(frozen=True, slots=True)
class ArAwait:
    """The operation that holds the request just submitted back until its input is ready
    (`ArAwaitingAdapter.await_input`)."""

    request_id: str
    what: str


@dataclass(frozen=True, slots=True)
class ArInputReady:
    """The operation that says the awaited input is ready (`ArAwaitingAdapter.input_ready`)."""

    request_id: str


@dataclass(frozen=True, slots=True)
class ArPause:
    """The operation that sets the pause state between steps (`ArPausingAdapter.set_pause`)."""

    state: str


@dataclass(frozen=True, slots=True)
class ArResetCache:
    """The operation that resets the prefix cache between steps (`ArPausingAdapter`)."""

    pass


@dataclass(frozen=True, slots=True)
class ArPropose:
    """The operation that scripts the drafter's proposal for a running request's next step
    and how many of it the model accepts (`ArDraftingAdapter.propose_drafts`)."""

    request_id: str
    drafts: int
    accepted: int


ArOp: TypeAlias = (
    ArSubmit
    | ArAbort
    | ArStep
    | ArDrain
    | ArAwait
    | ArInputReady
    | ArPause
    | ArResetCache
    | ArPropose
)


@dataclass
class ArHarness(ReplayHarness[ArSpecMachine]):
    """One AR implementation under test, built by `factory` for `config`."""

    factory: ArImplementationFactory
    config: ArConfig
    check_invariants: bool = True
    events: list[ArEvent] = field(default_factory=list)
    policy: ArPolicy | None = None  # the declared policy; None: the adapter's `rules`
    ops: list[ArOp] = field(default_factory=list)  # every operation asked for, in order

    def __post_init__(self) -> None:
        self.violation: SpecViolation | None = None
        impl = self.factory(self.config, self._sink)
        require_adapter(impl, ArSchedulerAdapter, self.factory)  # typed, yet maybe not one
        self.impl: ArSchedulerAdapter = impl
        self.spec: ArSpecMachine = ArSpecMachine(
            self.config, self.policy if self.policy is not None else self.impl.rules
        )
        self.steps: int = 0
        self._ended_steps = 0

    def _sink(self, event: ArEvent) -> None:
        if isinstance(event, ArStepEnd):
            self._ended_steps += 1
        super()._sink(event)

    def _validate(self, request: ArRequest) -> None:
        validate_ar_request(self.config, request)

    # ------------------------------------------------------------------ operations
    def submit(self, request: ArRequest) -> RequestError | None:
        """Submit; return the typed error if the implementation (rightly) rejected it. An
        accepted request's `ArSubmitted` must carry its `cache_read_limit` (`valid_request`):
        a log without it would leave its cache hits unchecked against it."""
        self.ops.append(ArSubmit(request))
        before = len(self.events)
        err = self._checked_submit(request, self.impl.submit)
        if err is None and request.cache_read_limit is not None:
            carried = next(
                (
                    e.cache_read_limit
                    for e in self.events[before:]
                    if isinstance(e, ArSubmitted) and e.request_id == request.request_id
                ),
                None,
            )
            if carried != request.cache_read_limit:
                raise self._violate(
                    "valid_request",
                    f"submitted {request.request_id!r} with cache_read_limit="
                    f"{request.cache_read_limit}, but its ArSubmitted carries {carried}",
                )
        return err

    def abort(self, request_id: str) -> UnknownRequest | None:
        """Abort `request_id`; return the `UnknownRequest` if the implementation refused it.

        A waiting, preempted or running request must end aborted (`known_request` otherwise);
        any other id must be refused with no event. The snapshot is checked after a successful
        abort.
        """
        self.ops.append(ArAbort(request_id))
        return self._checked_abort(
            request_id,
            self.impl.abort,
            active=self.spec.request_phase(request_id) in AR_ACTIVE_PHASES,
            aborted=lambda: self.spec.request_phase(request_id) is ArPhase.ABORTED,
        )

    def awaiting_impl(self) -> ArAwaitingAdapter:
        """The implementation as an `ArAwaitingAdapter`; `CannotDrive` when it is not one."""
        impl = self.impl
        if not isinstance(impl, ArAwaitingAdapter):
            raise CannotDrive(
                f"{type(impl).__name__} holds back no request awaiting an input (it has no "
                "await_input and input_ready), and the log has such a request (ar_awaiting): "
                "check the log without --twin, or name a twin that has them (vllm-v1)"
            )
        return impl

    def await_input(self, request_id: str, what: str) -> None:
        """Hold the request back until `input_ready` (`ArAwaitingAdapter`)."""
        self.ops.append(ArAwait(request_id, what))
        self.awaiting_impl().await_input(request_id, what)

    def input_ready(self, request_id: str) -> None:
        """The awaited input of the request is ready (`ArAwaitingAdapter`)."""
        self.ops.append(ArInputReady(request_id))
        self.awaiting_impl().input_ready(request_id)

    def pausing_impl(self, what: str) -> ArPausingAdapter:
        """The implementation as an `ArPausingAdapter`; `CannotDrive` (saying the log does
        `what`) when it is not one."""
        impl = self.impl
        if not isinstance(impl, ArPausingAdapter):
            raise CannotDrive(
                f"{type(impl).__name__} cannot be paused or have its cache reset (it has no "
                f"set_pause and reset_cache), and the log {what} between steps: check the log "
                "without --twin, or name a twin that has them (vllm-v1)"
            )
        return impl

    def set_pause(self, state: str) -> None:
        """Set the pause state between steps (`ArPausingAdapter`)."""
        self.ops.append(ArPause(state))
        self.pausing_impl("pauses the scheduler").set_pause(state)

    def reset_cache(self) -> None:
        """Reset the prefix cache between steps (`ArPausingAdapter`)."""
        self.ops.append(ArResetCache())
        self.pausing_impl("resets its cache").reset_cache()

    def drafting_impl(self) -> ArDraftingAdapter:
        """The implementation as an `ArDraftingAdapter`; `CannotDrive` when it is not one."""
        impl = self.impl
        if not isinstance(impl, ArDraftingAdapter):
            raise CannotDrive(
                f"{type(impl).__name__} replays no drafter (it has no propose_drafts), and the "
                "log schedules draft tokens: check the log without --twin, or name a twin that "
                "has it (vllm-v1)"
            )
        return impl

    def propose_drafts(self, request_id: str, drafts: int, accepted: int) -> None:
        """Script the drafter's proposal for the request's next step (`ArDraftingAdapter`)."""
        self.ops.append(ArPropose(request_id, drafts, accepted))
        self.drafting_impl().propose_drafts(request_id, drafts, accepted)

    def step(self) -> None:
        """Run one step; it must end (`ArStepEnd`, else `step_order`), then the snapshot is
        checked."""
        expected = self.spec.step_index
        self.ops.append(ArStep())
        self.impl.step()
        if self.spec.step_index <= expected:
            raise self._violate(
                "step_order", f"step() returned without ending step {expected} (no ArStepEnd)"
            )
        self.steps += 1
        self._check_snapshot()

    def drain(self, max_steps: int = 10_000) -> None:
        """Drain the implementation (`max_steps` passed on); then the spec must be idle
        (`progress`), the snapshot must match, and no block may still be held
        (`block_conservation`)."""
        self.ops.append(ArDrain(max_steps))
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

    def ended_steps(self) -> int:
        """`ArStepEnd` events seen (counted as they arrive: `events` may be cleared)."""
        return self._ended_steps

    def outputs(self) -> dict[str, int]:
        """The number of output tokens of every finished request, by id (the spec's count)."""
        return self.spec.outputs()
