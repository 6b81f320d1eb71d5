"""A forward's time on a CUDA device, read from CUDA timing events.

On CUDA a forward's host wall time (`ModelRunner.forward_seconds`) is the time to queue its
kernels: the wait for them lands in the round's next read-back of the done flags, which the
benchmark's profile counts as step time. `DeviceTimer` records a timing event on the engine's
device's current stream before each forward and another after it, and sums the time between
each pair when `seconds` is read.

What that measures is the forward's **span on the stream**: from the moment the stream reaches
the first event to the moment it reaches the second. Where the device is the bottleneck
(kernels queue up), that is the time its kernels run. Where the host is (a small model whose
kernels finish faster than Python launches them, as the shipped model on an H200), the stream
waits for each launch, so the span is about the host's launch time plus the last kernel: the
device is then not what bounds the forward. Either way it is the time the forward holds the
device, which bounds what another schedule of the same forwards could save on it. Kernel
busy time alone would need a profiler (CUPTI), which is not used.

Recording an event only queues it; nothing here waits for the device while forwards run.
Reading `seconds` waits for the recorded events (a host sync), so it is read at reporting time,
after a run drains. Pending pairs are kept until read, at most `max_pending` of them: beyond
that the oldest half is summed then, each waiting for its end event (long done by then, as
every round reads its done flags back), so a long run's memory stays flat. Making and
recording the two events costs the host a few microseconds per forward, inside the forward's
host time and the run's wall time.

On a CPU device the forward runs on the host, so its host wall time is its device time and no
timer is needed: `device_timer_for` gives one only for a CUDA device.
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

    def record(self, stream: Any = None) -> None:
        """Queue the event on `stream` (None: the current device's current stream)."""

    def synchronize(self) -> None:
        """Wait until the stream has reached the event."""

    def elapsed_time(self, end_event: Any) -> float:
        """Milliseconds from this event to `end_event`, both reached."""


def cuda_timing_event() -> TimingEvent:
    """A CUDA event that records time (its device is the stream's it is recorded on)."""
    event_class: Any = torch.cuda.Event  # untyped in torch's stubs
    event: TimingEvent = event_class(enable_timing=True)
    return event


def device_timer_for(device: torch.device) -> DeviceTimer | None:
    """A `DeviceTimer` on `device`'s current stream for a CUDA device; None for any other
    (there the host's wall time in a forward is its device time). Touches no CUDA state."""
    return DeviceTimer(device) if device.type == "cuda" else None


class DeviceTimer:
    """Sums each forward's span on `device`'s current stream between `start()` and
    `stop(mark)` (see the module docstring).

    `device`: the CUDA device whose stream the events are recorded on (its current stream,
    looked up at the first `start`, whatever device is current then); None: the current
    device's current stream. `new_event` makes one timing event (`cuda_timing_event` by
    default; tests pass their own, and `stream_of` with them); `max_pending` (>= 2) bounds
    the pairs kept unread."""

    def __init__(
        self,
        device: torch.device | None = None,
        new_event: Callable[[], TimingEvent] = cuda_timing_event,
        max_pending: int = MAX_PENDING,
        stream_of: Callable[[torch.device | None], Any] | None = None,
    ) -> None:
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 2:
            raise ConfigError("max_pending", max_pending, "an integer >= 2")
        if device is not None and device.type != "cuda":
            raise ConfigError("device", str(device), "a CUDA device (cuda, cuda:N) or None")
        self.device = device
        self._new_event = new_event
        self._stream_of = stream_of if stream_of is not None else torch.cuda.current_stream
        self._stream: Any = None  # looked up at the first start (no CUDA call before)
        self._max_pending = max_pending
        self._pending: list[tuple[TimingEvent, TimingEvent]] = []
        self._summed_ms: float = 0.0
        self.timed: int = 0  # forwards timed (stopped), read or not

    def _record(self) -> TimingEvent:
        if self._stream is None:
            self._stream = self._stream_of(self.device)
        event = self._new_event()
        event.record(self._stream)
        return event

    def start(self) -> TimingEvent:
        """Record the start of a forward; pass the result to `stop`."""
        return self._record()

    def stop(self, mark: TimingEvent) -> None:
        """Record the end of the forward `mark` started."""
        self._pending.append((mark, self._record()))
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
        """The summed spans of every forward timed so far (waits for the last one)."""
        self._sum(len(self._pending))
        return self._summed_ms / 1000.0

    @property
    def pending(self) -> int:
        """Pairs recorded and not yet summed."""
        return len(self._pending)
