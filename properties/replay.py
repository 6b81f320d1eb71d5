"""What every conformance harness shares, whichever spec it holds an implementation to.

Events are replayed into the spec machine as they are emitted, the first violation is recorded
(so a teardown never masks it), and `submit` / `abort` are checked the same way: a rejected
request or a refused abort must emit nothing, a valid request must be accepted, a duplicate id
must be refused with `DuplicateRequest`, and an active request's abort must succeed.

`guarded` turns what an implementation raises into findings, for both families: a
`SchedulerStalled` (a drain that gave up) breaks `progress`; any exception the contract does not
allow (anything but the typed `RequestError` / `UnknownRequest` that submit and abort may raise,
which the checked operations handle) breaks `implementation_error` — a real engine's
`RuntimeError: Prefill out of memory` is a named finding, not a crash. Each operation runs under
the call deadline (`properties.deadline`): one that never returns breaks `progress` too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from hypothesis.errors import HypothesisException

from properties.deadline import CallDeadlineExceeded, call_deadline
from properties.raised import describe_raised
from spec.errors import (
    CannotDrive,
    DuplicateRequest,
    RequestError,
    SchedulerStalled,
    SpecViolation,
    UnknownRequest,
)


class SpecLike(Protocol):
    """What the harness needs of a spec machine (SpecMachine, ArSpecMachine)."""

    def apply(self, event: Any) -> None:
        """Check `event` is enabled and apply it; raise the violation if not."""
        ...

    def check_invariants(self) -> None:
        """Check the named state invariants; raise the violation of the first that fails."""
        ...

    def check_snapshot(self, snap: Any) -> None:
        """Compare the implementation's snapshot with the abstract state; raise on a mismatch."""
        ...

    def request_phase(self, request_id: str) -> Any:
        """The request's phase, also after it ended; None for an id never submitted."""
        ...


M = TypeVar("M", bound=SpecLike)
T = TypeVar("T")


class ReplayHarness(Generic[M]):
    """Mixin for the dLLM and AR harnesses. Subclasses set `spec` (their spec machine), `impl`
    (with `snapshot`), `events`, `check_invariants` and `violation`, and provide `_validate`."""

    spec: M
    impl: Any
    events: list[Any]
    check_invariants: bool
    violation: SpecViolation | None

    def _validate(self, request: Any) -> None:
        """Raise the spec's RequestError if `request` is invalid for the config."""
        raise NotImplementedError

    def submit(self, request: Any, /) -> RequestError | None:
        """Submit through the implementation (see `_checked_submit`)."""
        raise NotImplementedError

    def abort(self, request_id: str, /) -> UnknownRequest | None:
        """Abort through the implementation (see `_checked_abort`)."""
        raise NotImplementedError

    def drain(self, max_rounds: int = 10_000, /) -> None:
        """Drain the implementation to idle and check that nothing is left held."""
        raise NotImplementedError

    def _violate(
        self, rule: str, detail: str, event: object | None = None, state: str = ""
    ) -> SpecViolation:
        """A violation found by the harness itself (recorded like those from the spec)."""
        v = SpecViolation(rule, detail, event, state)
        self.violation = self.violation or v
        return v

    def guarded(self, what: str, operation: Callable[..., T], *args: Any) -> T:
        """Run a harness operation; turn what the implementation raised into a violation.

        A violation recorded while the operation ran wins (an implementation that swallowed the
        spec's `SpecViolation` and raised something else is reported by the rule it broke). A
        `SpecViolation` the adapter raised itself (a state it refuses to read, such as vLLM's
        queues a scheduler class broke) is recorded too: the run ends there, as on the spec's.
        """
        before = self.violation
        try:
            with call_deadline(what):
                return operation(*args)
        except SpecViolation as v:
            self.violation = self.violation or v
            raise
        except HypothesisException:
            raise
        except CannotDrive as err:  # the adapter's limit, unless a rule was broken before it
            if self.violation is not None and self.violation is not before:
                raise self.violation from err
            raise
        except SchedulerStalled as err:
            if self.violation is not None and self.violation is not before:
                raise self.violation from err
            raise self._violate("progress", f"{what}: {err}") from err
        except (Exception, SystemExit) as err:  # sys.exit() inside the implementation too
            if self.violation is not None and self.violation is not before:
                raise self.violation from err
            raise self._violate(
                "implementation_error",
                f"the implementation raised {describe_raised(err)}, during {what}, after "
                f"{len(self.events)} events",
            ) from err

    def _sink(self, event: Any) -> None:
        self.events.append(event)
        try:
            self.spec.apply(event)
            if self.check_invariants:
                # the incremental check where the machine has one (cost ~ what the event changed)
                check = getattr(self.spec, "check_changed", None) or self.spec.check_invariants
                check()
        except SpecViolation as v:
            self.violation = self.violation or v
            raise

    def _check_snapshot(self) -> None:
        try:
            self.spec.check_snapshot(self.impl.snapshot())
        except SpecViolation as v:
            self.violation = self.violation or v
            raise

    def _expect_rejection(self, request: Any) -> str | None:
        if self.spec.request_phase(request.request_id) is not None:
            return "duplicate"
        try:
            self._validate(request)
        except RequestError as err:
            return type(err).__name__
        return None

    def _checked_submit(self, request: Any, submit: Callable[[Any], None]) -> RequestError | None:
        """Submit; return the typed error if the implementation rightly rejected the request."""
        expected = self._expect_rejection(request)
        before = len(self.events)
        try:
            submit(request)
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
        if expected == "duplicate":  # accepted without a `Submitted` the spec refuses
            raise self._violate(
                "unique_submission",
                f"accepted a second request under {request.request_id!r}, an id already "
                "submitted: ids are unique for the implementation's lifetime (refuse it with "
                "DuplicateRequest, before any change)",
            )
        if expected is not None:  # pragma: no cover - the submitted event already failed
            raise self._violate("valid_request", f"accepted {request!r} ({expected})")
        self._check_snapshot()
        return None

    def _checked_abort(
        self,
        request_id: str,
        abort: Callable[[str], None],
        *,
        active: bool,
        aborted: Callable[[], bool],
    ) -> UnknownRequest | None:
        """Abort; an active request must end aborted, anything else must be refused cleanly."""
        before = len(self.events)
        try:
            abort(request_id)
        except UnknownRequest as err:
            if active:
                raise self._violate(
                    "known_request", f"abort of active request {request_id!r} was refused: {err}"
                ) from None
            if len(self.events) != before:
                raise self._violate("known_request", "a refused abort emitted events") from None
            return err
        if not aborted():
            raise self._violate(
                "known_request", f"abort of {request_id!r} returned without an aborted event"
            )
        self._check_snapshot()
        return None


def build_for_replay(make: Callable[[], T]) -> T | SpecViolation:
    """`make()` (building a harness to run a kept example again), under the call deadline: a
    hang is a `progress` violation, a violation raised while building is returned, and any
    other exception is the factory's own `implementation_error`, as the conformance machine
    reports them (`ConformanceBase.construct`)."""
    try:
        with call_deadline("building the implementation"):
            return make()
    except CallDeadlineExceeded as hang:
        return SpecViolation("progress", str(hang))
    except SpecViolation as violation:
        return violation
    except CannotDrive:
        raise  # the adapter's limit, as the conformance machine lets it through
    except Exception as err:
        what = f"building the implementation raised {describe_raised(err)}"
        return SpecViolation("implementation_error", what)
