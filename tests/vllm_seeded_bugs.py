"""Seeded bugs in vLLM's scheduler that both engine-core test modules (AR async and dLLM) plant
in a built scheduler's instance, to show the shared schedule() checks have teeth."""

from __future__ import annotations

from typing import Any


def under_allocate(sched: Any) -> None:
    """Seeded bug: every allocation reserves one token less than it schedules."""
    manager = sched.kv_cache_manager
    original = manager.allocate_slots

    def allocate(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        return original(request, max(1, num_new_tokens - 1), *args, **kwargs)

    manager.allocate_slots = allocate


def extra_seat(sched: Any) -> None:
    """Seeded bug: one more request may run than max_num_seqs allows."""
    sched.max_num_active_reqs += 1
    sched.max_num_running_reqs += 1


def lifo_admission(sched: Any) -> None:
    """Seeded bug: under FCFS a new request joins the front of the waiting queue."""
    queue = sched.waiting
    if type(queue).__name__ == "FCFSRequestQueue":
        queue.add_request = queue.prepend_request
