"""The adapter protocol: how any scheduler implementation plugs into the suites.

An implementation is built by a factory `(config, sink) -> SchedulerAdapter` and reports every
event to `sink` as it happens. The suites drive it only through this protocol, so a serving
engine's own scheduler plugs in exactly like the built-in ones (see docs/implementers.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from spec.config import DllmConfig, RequestSpec
from spec.events import Event
from spec.snapshot import FinishedOutput, Snapshot

EventSink = Callable[[Event], None]


@runtime_checkable
class SchedulerAdapter(Protocol):
    """A dLLM scheduler under test.

    Each method's docstring states its part of the contract. Optionally an adapter also
    implements `ReportsOutputs`; one without it is not checked on outputs (it keeps working
    unchanged).
    """

    @property
    def config(self) -> DllmConfig:
        """The configuration the factory built this scheduler for (read, never changed)."""
        ...

    def submit(self, request: RequestSpec) -> None:
        """Validate `request`, queue it and emit `Submitted`.

        An invalid request (empty prompt, a field out of range, too long for the context, too
        large for the pool, a duplicate id) raises a `spec.errors.RequestError` subclass and
        changes nothing, no event emitted.
        """
        ...

    def abort(self, request_id: str) -> None:
        """Between rounds: free everything the request holds (emitting `KvFreed` and
        `RowReleased`) and emit `Aborted`. An unknown, finished or already aborted id raises
        `spec.errors.UnknownRequest` and changes nothing."""
        ...

    def run_round(self) -> None:
        """Run one scheduler round (admission, allocation, forwards and steps, commits,
        releases), emitting each event as it happens, and end by emitting `ControlReturned`.
        With nothing to do the round still ends."""
        ...

    def drain(self, max_rounds: int = 100_000) -> None:
        """Run rounds until nothing is queued or running; after `max_rounds` rounds with work
        left raise `spec.errors.SchedulerStalled` instead of looping forever."""
        ...

    def snapshot(self) -> Snapshot:
        """The implementation's own view of its pools, read from its data structures (not
        from the events it emitted): the suites compare it with the spec's state."""
        ...


@runtime_checkable
class ReportsOutputs(Protocol):
    """The optional output part of the adapter contract (issue: outputs in the contract).

    `collect_outputs()` returns request id -> `FinishedOutput` for every request that finished
    since the previous call, each exactly once (an engine returns outputs to its client and
    forgets them, which also keeps its state bounded).
    """

    def collect_outputs(self) -> Mapping[str, FinishedOutput]:
        """Request id -> `FinishedOutput` for each request finished since the previous call,
        each exactly once; the harness compares them with the spec after every round (rule
        `reported_output`)."""
        ...


class ImplementationFactory(Protocol):
    """Builds a fresh scheduler for `config` that reports its events to `sink`."""

    def __call__(self, config: DllmConfig, sink: EventSink) -> SchedulerAdapter: ...
