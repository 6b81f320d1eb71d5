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
    otherwise wait for it forever). `locate` adds where the request came from (a trace's
    file:line) to the message."""

    def __init__(self, request: int, needed: int, capacity: int, what: str) -> None:
        self.request = request
        self.needed = needed
        self.capacity = capacity
        self.what = what
        super().__init__(self._text(self._who(None)))

    def _who(self, where: str | None) -> str:
        who = f"request #{self.request}" if self.request >= 0 else "a request"
        return who + (f" ({where})" if where else "")

    def _text(self, who: str) -> str:
        return (
            f"{who} needs {self.needed} {self.what} but the largest unit holds {self.capacity}: "
            f"it could never be scheduled; raise the capacity or drop the request"
        )

    def locate(self, where: str | None) -> Unschedulable:
        """Name where the request came from (`where`: a trace's 'FILE:LINE'; None: nothing) in
        the message; returns the error itself, of the same type."""
        ValueError.__init__(self, self._text(self._who(where)))  # the message, with `where`
        return self


class RequestRefused(Unschedulable):
    """A request the replica's scheduler refuses outright (its length past `max_model_len`,
    say), whatever its capacity: the scheduler's own reason, and what to change."""

    def __init__(self, request: int, needed: int, reason: str) -> None:
        self.request: int = request
        self.needed: int = needed
        self.capacity: int = 0  # not a matter of capacity
        self.reason = reason
        ValueError.__init__(self, self._text(self._who(None)))

    def _text(self, who: str) -> str:
        return (
            f"{who} ({self.needed} tokens) could never be scheduled: the replica's "
            f"scheduler refuses it ({self.reason})"
        )


class NeverAdmitted(Unschedulable):
    """A replica stalled: nothing runs and the request at the head of its queue can never be
    admitted, so the simulation would wait forever. Names the request, the scheduler's reason
    and what would be valid."""

    def __init__(self, request: int, tokens: int, scheduler: str, reason: str) -> None:
        self.request: int = request
        self.needed: int = tokens
        self.capacity: int = 0  # not a matter of capacity
        self.scheduler = scheduler
        self.reason = reason
        ValueError.__init__(self, self._text(self._who(None)))

    def _text(self, who: str) -> str:
        return f"{who} can never be admitted by {self.scheduler}: {self.reason}"


def watermark_stall(
    request: int, tokens: int, block_size: int, usable_blocks: int, fraction: float, scheduler: str
) -> NeverAdmitted:
    """The stall of Vidur's admission (its vLLM and Sarathi as released): a new request is
    admitted only when its whole prefill of `tokens` leaves the watermark, int(`fraction` x
    `usable_blocks`) blocks, free; so with nothing running a prefill of more than usable -
    watermark blocks never is. The error says so, and what prefill or pool would fit."""
    need = -(-tokens // block_size)
    watermark = int(fraction * usable_blocks)
    room = usable_blocks - watermark
    pool = max(need, 1)
    while need > pool - int(fraction * pool):  # the smallest pool whose watermark leaves room
        pool += 1
    reason = (
        f"its prefill of {tokens} tokens needs {need} KV blocks of {block_size} tokens, and "
        f"Vidur's admission needs the whole prefill to fit the free blocks above the watermark, "
        f"int({fraction:g} x {usable_blocks} blocks) = {watermark} block(s), so even with "
        f"nothing running at most {room} blocks ({room * block_size} tokens); valid: a prefill "
        f"of at most {room * block_size} tokens, or a KV pool of at least {pool * block_size} "
        f"tokens (--kv-tokens)"
    )
    return NeverAdmitted(request, tokens, scheduler, reason)


class TimeWentBackwards(SimError, AssertionError):
    """The event loop popped an event earlier than the clock (a simulator bug)."""

    def __init__(self, now: float, event_time: float, what: str) -> None:
        super().__init__(f"event {what} at t={event_time!r} is before the clock t={now!r}")
