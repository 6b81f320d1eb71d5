"""The event queue: a binary heap of (time, sequence number, kind, payload).

Ties in time are broken by the sequence number (insertion order), so a simulation is fully
deterministic for a seed. The clock never moves backwards: popping an event earlier than the
clock raises `TimeWentBackwards` (a simulator bug, never a user error). Optional `log` records
every popped (time, kind) for the time-monotonicity property.
"""

from __future__ import annotations

import heapq

from reference.sim.errors import TimeWentBackwards


class EventQueue:
    """The heap of (time, kind, payload) events (module doc); `now` is the last popped time."""

    __slots__ = ("_heap", "_seq", "log", "now")

    def __init__(self, record: bool = False) -> None:
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self.now: float = 0.0
        self.log: list[tuple[float, int]] | None = [] if record else None

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, time: float, kind: int, payload: int = 0) -> None:
        """Schedule event `kind` with `payload` at `time` (seconds); a time before `now` raises
        `TimeWentBackwards`."""
        if time < self.now:
            raise TimeWentBackwards(self.now, time, f"kind={kind} pushed")
        heapq.heappush(self._heap, (time, self._seq, kind, payload))
        self._seq += 1

    def peek_time(self) -> float:
        """The earliest pending event's time, inf when there is none."""
        return self._heap[0][0] if self._heap else float("inf")

    def pop(self) -> tuple[float, int, int]:
        """Remove the earliest event (push order among equal times), move `now` to its time and
        return (time, kind, payload); `IndexError` when empty."""
        time, _, kind, payload = heapq.heappop(self._heap)
        if time < self.now:
            raise TimeWentBackwards(self.now, time, f"kind={kind}")
        self.now = time
        if self.log is not None:
            self.log.append((time, kind))
        return time, kind, payload
