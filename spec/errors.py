"""Typed errors of schedspec.

Every error a user can trigger with bad configuration or bad input is one of these; each message
says what was wrong and what would be valid. A `SpecViolation` is different: it means an
implementation broke the specification, and it names the rule, the event and the state.
"""

from __future__ import annotations


class SchedSpecError(Exception):
    """Base class of every error raised on purpose by schedspec."""


class ConfigError(SchedSpecError, ValueError):
    """A configuration value is invalid.

    The message names the field, the value given and what would be valid.
    """

    def __init__(self, field: str, value: object, valid: str) -> None:
        self.field = field
        self.value = value
        self.valid = valid
        super().__init__(f"invalid {field}={value!r}: {valid}")


class RequestError(SchedSpecError, ValueError):
    """A request was rejected at submission or abort; nothing was allocated or changed."""


class EmptyPrompt(RequestError):
    """The request's prompt has no token."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        super().__init__(f"request {request_id!r} has an empty prompt: give at least one token")


class InvalidRequest(RequestError):
    """A request field is out of range (for example max_new_tokens < 1)."""

    def __init__(self, request_id: str, field: str, value: object, valid: str) -> None:
        self.request_id = request_id
        self.field = field
        self.value = value
        super().__init__(f"request {request_id!r}: invalid {field}={value!r}: {valid}")


class PromptTooLong(RequestError):
    """The prompt plus the tokens it may generate does not fit in the context."""

    def __init__(self, request_id: str, needed_tokens: int, max_context: int) -> None:
        self.request_id = request_id
        self.needed_tokens = needed_tokens
        self.max_context = max_context
        super().__init__(
            f"request {request_id!r} needs {needed_tokens} context tokens (prompt plus "
            f"max_new_tokens, rounded up to whole blocks) but max_context is {max_context}: "
            f"shorten the prompt or lower max_new_tokens"
        )


class RequestTooLarge(RequestError):
    """The request can never fit in the KV pool, even when the pool is empty."""

    def __init__(self, request_id: str, needed_slots: int, pool_slots: int) -> None:
        self.request_id = request_id
        self.needed_slots = needed_slots
        self.pool_slots = pool_slots
        super().__init__(
            f"request {request_id!r} needs {needed_slots} KV slots but the whole pool has "
            f"{pool_slots}: it could never be scheduled; use a larger pool or a shorter request"
        )


class DuplicateRequest(RequestError):
    """A request id that was already submitted (request ids must be unique)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        super().__init__(
            f"request id {request_id!r} was already submitted: request ids must be unique"
        )


class UnknownRequest(RequestError, KeyError):
    """An abort named a request that is neither queued nor running."""

    def __init__(self, request_id: str, known: int = 0) -> None:
        self.request_id = request_id
        super().__init__(
            f"unknown request id {request_id!r}: only queued or running requests can be aborted "
            f"({known} are active)"
        )

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0])


class SchedulerStalled(SchedSpecError, RuntimeError):
    """A bounded loop made no progress within its bound, instead of hanging forever: a drain
    that did not reach idle within `rounds` rounds (an AR drain: steps; a pipeline: ticks), or
    a block that did not finish within as many forwards. `unit` names what was counted."""

    def __init__(self, rounds: int, detail: str, unit: str = "rounds") -> None:
        self.rounds = rounds  # the bound, counted in `unit`
        self.unit = unit
        super().__init__(f"scheduler made no progress within {rounds} {unit}: {detail}")


class CannotDrive(SchedSpecError):
    """The adapter cannot drive the implementation as it stands: a limit of the adapter, not a
    rule the implementation broke (a change to an engine that reads state the adapter does not
    build, say). The message says what is missing and where the adapter would provide it. A
    harness lets it through instead of reporting `implementation_error` (a rule broken in the
    same call still wins), and `schedspec verify` stops there: with nothing found before it,
    the run is refused with it (exit 2); failures found before it stand (exit 1)."""


class SpecViolation(SchedSpecError, AssertionError):
    """An implementation broke a rule of the specification.

    Attributes:
        rule: the name of the violated rule or invariant (see `spec.rules.RULES`).
        event: the event being replayed (or None for a snapshot / end-of-run check).
        detail: what exactly was wrong.
        state: a readable rendering of the abstract state before the event.
        example: the failing example in a form the harness that found it can run again (an
            AR conformance run attaches `properties.ar.example.ArExample`); None otherwise.
    """

    def __init__(
        self, rule: str, detail: str, event: object | None = None, state: str = ""
    ) -> None:
        self.rule = rule
        self.detail = detail
        self.event = event
        self.state = state
        self.example: object | None = None
        parts = [f"[{rule}] {detail}"]
        if event is not None:
            parts.append(f"  event: {event!r}")
        if state:
            parts.append("  state:\n" + "\n".join("    " + line for line in state.splitlines()))
        super().__init__("\n".join(parts))
