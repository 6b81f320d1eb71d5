"""Vidur's global schedulers over several replicas: round-robin, least outstanding requests
(LOR: the replica with the fewest queued requests, as Vidur's `num_pending_requests`), and
seeded random. Each replica is its own AR scheduler with its own KV pool, reporting to its own
sink, so each is checked by its own `ArSpecMachine`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from spec.ar.adapter import (
    ArEventSink,
    ArImplementationFactory,
    ArSchedulerAdapter,
    drain_steps,
)
from spec.ar.config import ArConfig, ArRequest
from spec.errors import ConfigError, UnknownRequest

ROUTINGS = ("round_robin", "lor", "random")


class GlobalScheduler:
    """Routes each request to one replica at submission; a step steps every replica."""

    def __init__(
        self,
        config: ArConfig,
        sink_for: Callable[[int], ArEventSink],
        replica_factory: ArImplementationFactory,
        routing: str = "round_robin",
        seed: int = 0,
    ) -> None:
        if routing not in ROUTINGS:
            raise ConfigError("routing", routing, f"one of {list(ROUTINGS)}")
        self.config = config
        self.routing = routing
        self.rng: random.Random = random.Random(seed)
        self.replicas: list[ArSchedulerAdapter] = [
            replica_factory(config, sink_for(i)) for i in range(config.num_replicas)
        ]
        self.next_rr: int = 0
        self.placement: dict[str, int] = {}

    def _pick(self) -> int:
        if self.routing == "round_robin":
            i = self.next_rr
            self.next_rr = (i + 1) % len(self.replicas)
            return i
        if self.routing == "lor":
            pending = [len(r.snapshot().waiting) for r in self.replicas]
            return pending.index(min(pending))
        return self.rng.randrange(len(self.replicas))

    def submit(self, request: ArRequest) -> int:
        """Route and submit; the replica index (a rejected request consumes no turn)."""
        rr = self.next_rr
        i = self._pick()
        try:
            self.replicas[i].submit(request)
        except Exception:
            self.next_rr = rr
            raise
        self.placement[request.request_id] = i
        return i

    def abort(self, request_id: str) -> None:
        """Abort on the replica the request was routed to; `UnknownRequest` for an id never routed
        (the replica raises it for one that ended)."""
        i = self.placement.get(request_id)
        if i is None:
            raise UnknownRequest(request_id, sum(self.queue_sizes()))
        self.replicas[i].abort(request_id)

    def queue_sizes(self) -> tuple[int, int]:
        """(waiting, running) requests over every replica (read from their snapshots)."""
        snaps = [r.snapshot() for r in self.replicas]
        return sum(len(s.waiting) for s in snaps), sum(len(s.running) for s in snaps)

    def step(self) -> None:
        """Step every replica once, in replica order."""
        for r in self.replicas:
            r.step()

    def is_idle(self) -> bool:
        """No replica has a request running or waiting (read from their snapshots)."""
        return self.queue_sizes() == (0, 0)

    def drain(self, max_steps: int = 100_000) -> None:
        """Step until idle; after `max_steps` steps with work left raise `SchedulerStalled`
        naming the waiting and running counts over the replicas (`drain_steps`)."""
        drain_steps(self.step, self.is_idle, self.queue_sizes, max_steps)
