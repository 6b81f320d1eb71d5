"""Typed errors of the simulator (all `spec.errors.SchedSpecError` subclasses)."""

from __future__ import annotations

from spec.ar.vidur_trace import TraceRowError
from spec.errors import SchedSpecError


def reason_of(err: BaseException) -> str:
    """What went wrong, without Python's decoration: an OSError's `strerror` ("No such file or
    directory", not "[Errno 2] ... 'path'"), else the message, else the exception's type."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


class SimError(SchedSpecError):
    """Base class of the simulator's errors."""


class TraceError(SimError, TraceRowError):
    """A malformed row in a Vidur trace CSV; names the file, the 1-based line and the problem
    (the simulator's face of `spec.ar.vidur_trace.TraceRowError`)."""

    def __init__(self, path: str, line: int, detail: str) -> None:
        self.path = path
        self.line = line
        super().__init__(line, detail, path)


class SimConfigError(SimError, ValueError):
    """A simulator configuration value is invalid: names the field and what would be valid."""

    def __init__(self, field: str, value: object, valid: str) -> None:
        self.field = field
        self.value = value
        self.valid = valid
        super().__init__(f"invalid {field}={value!r}: {valid}")


class Unschedulable(SimError, ValueError):
    """A request can never run: it is larger than every unit's capacity (so the simulation would
    otherwise wait for it forever)."""

    def __init__(self, request: int, needed: int, capacity: int, what: str) -> None:
        self.request = request
        self.needed = needed
        self.capacity = capacity
        super().__init__(
            f"request #{request} needs {needed} {what} but the largest unit holds {capacity}: "
            f"it could never be scheduled; raise the capacity or drop the request"
        )


class RequestRefused(Unschedulable):
    """A request the replica's scheduler refuses outright (its length past `max_model_len`,
    say), whatever its capacity: the scheduler's own reason, and what to change."""

    def __init__(self, request: int, needed: int, reason: str) -> None:
        self.request: int = request
        self.needed: int = needed
        self.capacity: int = 0  # not a matter of capacity
        ValueError.__init__(
            self,
            f"request #{request} ({needed} tokens) could never be scheduled: the replica's "
            f"scheduler refuses it ({reason})",
        )


class TimeWentBackwards(SimError, AssertionError):
    """The event loop popped an event earlier than the clock (a simulator bug)."""

    def __init__(self, now: float, event_time: float, what: str) -> None:
        super().__init__(f"event {what} at t={event_time!r} is before the clock t={now!r}")
