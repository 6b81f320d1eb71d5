"""Forward time as a CUDA device spends it, read from CUDA events.

On CUDA a forward's host wall time (`ModelRunner.forward_seconds`) is the time to queue its
kernels: the wait for them lands in the round's next read-back of the done flags, which the
benchmark's profile counts as step time. `DeviceTimer` brackets each forward with a pair of
timing events recorded on the device's current stream and sums their elapsed times when
`seconds` is read. Recording an event queues it; nothing here waits for the device while
forwards run. Reading `seconds` waits for the recorded events (a host sync), so it is read at
reporting time, after a run drains.

Pending pairs are kept until read, at most `max_pending` of them: beyond that the oldest half
is summed then, each waiting for its end event (long done by then, as every round reads its
done flags back), so a long run's memory stays flat.

On a CPU device the forward runs on the host, so its host wall time is its device time and no
`DeviceTimer` is needed (`gpu.bench` attaches one only on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from spec.errors import ConfigError

#: Event pairs kept unread before the oldest half is summed (`DeviceTimer`).
MAX_PENDING = 4096


class TimingEvent(Protocol):
    """What `DeviceTimer` uses of `torch.cuda.Event(enable_timing=True)`."""

    def record(self) -> None: ...

    def synchronize(self) -> None: ...

    # milliseconds from this event to `end_event` (another event of the same kind)
    def elapsed_time(self, end_event: Any) -> float: ...


def cuda_timing_event() -> TimingEvent:
    """A CUDA event that records time, on the current device's current stream when recorded."""
    event_class: Any = torch.cuda.Event  # untyped in torch's stubs
    event: TimingEvent = event_class(enable_timing=True)
    return event


class DeviceTimer:
    """Sums the device time between `start()` and `stop(mark)` over every forward timed.

    `new_event` makes one timing event (`cuda_timing_event` by default; tests pass their own);
    `max_pending` (>= 2) bounds the pairs kept unread."""

    def __init__(
        self,
        new_event: Callable[[], TimingEvent] = cuda_timing_event,
        max_pending: int = MAX_PENDING,
    ) -> None:
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 2:
            raise ConfigError("max_pending", max_pending, "an integer >= 2")
        self._new_event = new_event
        self._max_pending = max_pending
        self._pending: list[tuple[TimingEvent, TimingEvent]] = []
        self._summed_ms: float = 0.0
        self.timed: int = 0  # forwards timed (stopped), read or not

    def start(self) -> TimingEvent:
        """Record the start of a forward; pass the result to `stop`."""
        event = self._new_event()
        event.record()
        return event

    def stop(self, mark: TimingEvent) -> None:
        """Record the end of the forward `mark` started."""
        end = self._new_event()
        end.record()
        self._pending.append((mark, end))
        self.timed += 1
        if len(self._pending) > self._max_pending:
            self._sum(len(self._pending) // 2)

    def _sum(self, count: int) -> None:
        """Add the `count` oldest pairs' elapsed times, waiting for each end event."""
        for start, end in self._pending[:count]:
            end.synchronize()
            self._summed_ms += start.elapsed_time(end)
        del self._pending[:count]

    @property
    def seconds(self) -> float:
        """The device seconds of every forward timed so far (waits for the last one)."""
        self._sum(len(self._pending))
        return self._summed_ms / 1000.0

    @property
    def pending(self) -> int:
        """Pairs recorded and not yet summed."""
        return len(self._pending)
