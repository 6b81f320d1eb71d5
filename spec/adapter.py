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

    Contract:
    - `submit` validates the request (raising a `spec.errors.RequestError` subclass and changing
      nothing if invalid), queues it and emits `Submitted`.
    - `abort` is called between rounds; it frees everything the request holds (emitting
      `KvFreed` / `RowReleased`) and emits `Aborted`; an unknown or already finished id raises
      `spec.errors.UnknownRequest` and changes nothing.
    - `run_round` runs one scheduler round (admission, allocation, forwards and steps,
      commits, releases) and ends by emitting `ControlReturned`. With nothing to do it still
      ends the round.
    - `drain` runs rounds until nothing is queued or running, raising
      `spec.errors.SchedulerStalled` instead of looping forever.
    - `snapshot` reads the implementation's own pools (see `Snapshot`).
    - optionally (`ReportsOutputs`), `collect_outputs` returns what the implementation hands its
      clients for the requests finished since the previous call; the harness compares it with
      the spec after every round (rule `reported_output`). An adapter without it is not checked
      on outputs (it keeps working unchanged).
    """

    @property
    def config(self) -> DllmConfig: ...

    def submit(self, request: RequestSpec) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def run_round(self) -> None: ...

    def drain(self, max_rounds: int = 100_000) -> None: ...

    def snapshot(self) -> Snapshot: ...


@runtime_checkable
class ReportsOutputs(Protocol):
    """The optional output part of the adapter contract (issue: outputs in the contract).

    `collect_outputs()` returns request id -> `FinishedOutput` for every request that finished
    since the previous call, each exactly once (an engine returns outputs to its client and
    forgets them, which also keeps its state bounded).
    """

    def collect_outputs(self) -> Mapping[str, FinishedOutput]: ...


class ImplementationFactory(Protocol):
    """Builds a fresh scheduler for `config` that reports its events to `sink`."""

    def __call__(self, config: DllmConfig, sink: EventSink) -> SchedulerAdapter: ...
