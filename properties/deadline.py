"""A deadline on every call into an implementation, so a hang is a finding, not a hung CI job.

The conformance harnesses run each operation on the implementation (submit, abort, a round or
step, drain, snapshot, building it, the parity runs) inside `call_deadline`. A call that has not
returned when its deadline passes is interrupted by `CallDeadlineExceeded`, which breaks the
`progress` rule: a scheduler that never returns makes no progress, whether it spins in a loop
or waits on a lock.

Contract:

- the deadline is per call, `call_timeout()` seconds (default `DEFAULT_CALL_TIMEOUT_S`; `None`
  or 0 means no deadline), set with `call_timeout_set(seconds)`. It takes effect when called:
  as `with call_timeout_set(seconds):` for the block (the deadline before comes back at its
  end); called alone, for the rest of the current context (from a `conftest.py` or a test
  module, for the whole pytest session; for one unittest `TestCase` class, such as a
  conformance machine's, `with_call_timeout(TestCase, seconds)`, undone after each test);
- a hang's message says how to change the deadline where it ran: the Python way by default,
  the command line's flag inside `call_timeout_named("--call-timeout")`;
- it is enforced with `SIGALRM` (`signal.setitimer`), so it works where that exists (POSIX)
  and in the main thread only (elsewhere the call simply runs). A timer already armed (an
  outer `call_deadline`, pytest-timeout's signal method) keeps its place: when it would fire
  first nothing else is armed, otherwise it is suspended for the call and re-armed after it
  with the time it had left and its own handler;
- the interrupt arrives between Python bytecodes or when a blocking C call (a sleep, a lock
  wait) returns on the signal; a C extension that loops without returning to the interpreter
  cannot be interrupted this way;
- `CallDeadlineExceeded` is a `BaseException`, not an `Exception`: Hypothesis stops at once
  instead of shrinking (every shrinking attempt would wait out the deadline again), and no
  `except Exception` of the implementation's can swallow it. The conformance machine attaches
  the program it ran so far (`program`) before it leaves the machine.
"""

from __future__ import annotations

import signal
import threading
import time
import unittest
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from types import FrameType, TracebackType
from typing import TypeVar, cast

DEFAULT_CALL_TIMEOUT_S = 60.0
"""Per call: a conformance program's drain serves at most a few dozen small requests."""

_TIMEOUT: ContextVar[float | None] = ContextVar("call_timeout", default=DEFAULT_CALL_TIMEOUT_S)
PYTHON_SETTING = "set with properties.deadline.call_timeout_set(seconds)"
"""How a hang's message says to change the deadline, outside `call_timeout_named`."""
_SETTING: ContextVar[str] = ContextVar("call_timeout_setting", default=PYTHON_SETTING)


class CallDeadlineExceeded(BaseException):
    """A call into the implementation did not return within its deadline (rule `progress`)."""

    rule = "progress"

    def __init__(self, what: str, seconds: float) -> None:
        self.what = what
        self.seconds = seconds
        self.program: str = ""  # filled in by the conformance machine: the calls made so far
        self.setting: str = _SETTING.get()  # where the deadline is set, for the message
        super().__init__(
            f"the implementation did not return from {what} within {seconds:g} s "
            f"(a hang: an endless loop or a wait that never ends; the deadline per call is "
            f"{self.setting})"
        )


class TwinHung(CallDeadlineExceeded):
    """A decision twin's call did not return within its deadline: the twin's own hang, not the
    implementation's. A `BaseException` as its parent is, so the run stops at once instead of
    waiting the deadline out again for every shrinking attempt."""

    def __str__(self) -> str:
        return (
            f"the decision twin did not return from {self.what} within {self.seconds:g} s (the "
            f"twin's own hang, not the implementation's: check or replace the twin; the deadline "
            f"per call is {self.setting})"
        )


def call_timeout() -> float | None:
    """The deadline in seconds for calls made now (None: no deadline)."""
    return _TIMEOUT.get()


def _deadline_of(seconds: float | None) -> float | None:
    """The deadline `seconds` sets (None or 0: None); ValueError below 0."""
    if seconds is not None and seconds < 0:
        raise ValueError(f"a call timeout is a number of seconds >= 0, not {seconds}")
    return seconds or None


class call_timeout_set:  # lower case: a function to its callers, as it always was
    """Use `seconds` (None or 0: no deadline) for the calls made from now on: for the block,
    as `with call_timeout_set(seconds):` (the deadline before comes back at its end); called
    alone, for the rest of the current context (a pytest session, from `conftest.py` or a test
    module). Takes effect when called, so neither use does nothing. ValueError below 0."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds: float | None = _deadline_of(seconds)
        """The deadline set (None: none)."""
        self._token: Token[float | None] = _TIMEOUT.set(self.seconds)

    def __enter__(self) -> None:
        """Nothing more: the deadline was set when called."""

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Put back the deadline there was before the call."""
        _TIMEOUT.reset(self._token)


_Case = TypeVar("_Case", bound=unittest.TestCase)


def with_call_timeout(test_case: type[_Case], seconds: float | None) -> type[_Case]:
    """`test_case` (a unittest `TestCase` class: `conformance_machine(...).TestCase`,
    `ar_conformance_machine(...).TestCase`) whose every test runs under the deadline per call
    `seconds` (None or 0: no deadline), the deadline before coming back after each test; the
    rest of the session keeps its own. A subclass whose `setUp` enters `call_timeout_set`,
    made here so that yours needs no `class` statement: mypy --strict refuses a class whose
    base is such a call's result ("is not valid as a type", "Invalid base class"). Its
    `settings` can be set as the class's can. ValueError below 0."""
    _deadline_of(seconds)  # a negative one is refused now, not in each test

    def set_up(self: unittest.TestCase) -> None:
        test_case.setUp(self)
        self.enterContext(call_timeout_set(seconds))

    made = type(test_case.__name__, (test_case,), {"setUp": set_up})
    made.__qualname__ = test_case.__qualname__
    made.__module__ = test_case.__module__
    return cast("type[_Case]", made)


@contextmanager
def call_timeout_named(setting: str) -> Iterator[None]:
    """Inside the block, a hang's message says the deadline is `setting` (the command line:
    `"--call-timeout"`) instead of `PYTHON_SETTING`."""
    token = _SETTING.set(setting)
    try:
        yield
    finally:
        _SETTING.reset(token)


def _armable() -> bool:
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) is not None  # None: a handler set outside Python
    )


@contextmanager
def call_deadline(what: str) -> Iterator[None]:
    """Run the block under the current deadline; raise `CallDeadlineExceeded(what)` if it has
    not finished in time. Does nothing without a deadline or where one cannot be armed (see
    the module docstring)."""
    seconds = call_timeout()
    if seconds is None or not _armable():
        yield
        return
    outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    if outer_left and outer_left <= seconds:
        yield  # an outer timer fires first: it stays in charge
        return

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise CallDeadlineExceeded(what, seconds)

    outer_handler = signal.signal(signal.SIGALRM, on_alarm)
    started = time.monotonic()
    # re-fired every second after the deadline: a bare `except:` in a loop may swallow one
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_left:  # give the outer timer back what it had left
            left = outer_left - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), outer_interval)


__all__ = [
    "DEFAULT_CALL_TIMEOUT_S",
    "PYTHON_SETTING",
    "CallDeadlineExceeded",
    "TwinHung",
    "call_deadline",
    "call_timeout",
    "call_timeout_named",
    "call_timeout_set",
    "with_call_timeout",
]
