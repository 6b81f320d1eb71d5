"""The rule `max_loras`, shared by vLLM's autoregressive and diffusion engine-core loops: the
model runner holds at most `max_loras` LoRA adapters at once, so the running requests, and
those one `schedule()` call schedules, run at most that many (the base model, adapter 0, not
counted). And the one request `admission_order` lets be passed: a waiting request whose adapter
finds no room among the running requests', which vLLM skips by design ("Scheduling would
exceed max_loras, skip").
"""

from __future__ import annotations

from typing import Any

from integrations.vllm.adapter import adapter_of
from integrations.vllm.core_loop import EngineCoreViolation


def waits_for_adapter(sched: Any, request: Any, max_loras: int) -> bool:
    """Whether `request` needs a LoRA adapter none of `sched`'s running requests runs while
    they run `max_loras` adapters already."""
    adapter = adapter_of(request)
    if not adapter:
        return False
    running = {adapter_of(r) for r in sched.running} - {0}
    return adapter not in running and len(running) >= max_loras


def check_adapter_limit(sched: Any, out: Any, max_loras: int, where: str) -> None:
    """`max_loras`: after a `schedule()` call whose output is `out`, the running requests, and
    those it scheduled, run at most `max_loras` LoRA adapters."""
    requests = sched.requests
    for what, reqs in (
        ("running", list(sched.running)),
        ("scheduled", [requests[rid] for rid in out.num_scheduled_tokens]),
    ):
        adapters = sorted({adapter_of(r) for r in reqs} - {0})
        if len(adapters) > max_loras:
            raise EngineCoreViolation(
                "max_loras",
                f"{where}: the requests {what} run LoRA adapters {adapters}; max_loras={max_loras}",
            )


__all__ = ["check_adapter_limit", "waits_for_adapter"]
