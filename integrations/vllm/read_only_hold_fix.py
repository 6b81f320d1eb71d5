"""A candidate fix for the read-only hold of vLLM 0.33.0's `DiffusionAsyncScheduler`, applied to
one built scheduler so that the checks of `integrations.vllm.diffusion` can validate it.

The finding (docs/engines.md, "Diffusion LLMs"): a read-only request emits its one canvas on
the step that converges it and ends, so a step scheduled after that one is thrown away. The
scheduler holds such a request back once "all its denoise steps" are in flight
(`_read_in_flight`: the placeholders in flight cover `diffusion_max_steps` canvases). That
counts the steps in flight against all of the request's steps, not against the steps left,
so once a step has returned the hold lets one more through. It also reads only the request's
`diffusion_max_steps`: the runner caps that at the served `max_denoising_steps`, and with no
`diffusion_max_steps` it runs the served number, where the hold is off.

The fix counts the canvas steps the scheduler has given each read-only request since it was
last (re)started, and holds the request once that count reaches its step cap: its
`diffusion_max_steps`, capped at the served `max_denoising_steps`, or the served number when it
gives none (as the runner caps it). A step that comes back then finds everything it needs
already scheduled. A request that converges before its cap still has its later steps in
flight: the scheduler cannot know that in advance. As a change to vLLM it is a counter in
`DiffusionAsyncScheduler.schedule`: the hold before `super().schedule()`, the count after it
(reset when the request is preempted, dropped when it finishes).

`apply_read_only_hold_fix(sched)` gives exactly that `schedule` to one built
`DiffusionAsyncScheduler` through a subclass of its class; nothing of vLLM changes for any other
scheduler. The synchronous `DiffusionScheduler` has no step in flight to throw away, so it is
left as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def read_only_step_cap(request: Any, served_max_steps: int | None) -> int | None:
    """The denoise steps the runner gives a read-only `request` (its `diffusion_max_steps`
    capped at the served `max_denoising_steps`, or the served number); None when the request is
    not read-only or no cap is known."""
    params = request.sampling_params
    extra = params.extra_args if params is not None else None
    if not extra or not extra.get("diffusion_read_only"):
        return None
    own = extra.get("diffusion_max_steps")
    if own is None:
        return served_max_steps
    return own if served_max_steps is None else max(1, min(int(own), served_max_steps))


def _counted_hold(sched: Any, schedule: Callable[[bool], Any], throttle_prefills: bool) -> Any:
    """`schedule(throttle_prefills)` (the built class's own) with the counted hold around it."""
    counts: dict[str, int] = sched.__dict__.setdefault("_read_steps_scheduled", {})
    served = sched.vllm_config.diffusion_config.max_denoising_steps
    for request in sched.running:
        cap = read_only_step_cap(request, served)
        if cap is not None and counts.get(request.request_id, 0) >= cap:
            # as vLLM's own hold: schedule() advances current_step before it checks
            # eligibility, so current_step + 2 skips this call alone
            request.next_decode_eligible_step = max(
                request.next_decode_eligible_step, sched.current_step + 2
            )
    out = schedule(throttle_prefills)
    for rid in (out.preempted_req_ids or set()) | set(out.finished_req_ids):
        counts.pop(rid, None)  # a resumed request starts its canvas again
    for rid in out.scheduled_spec_decode_tokens:
        if read_only_step_cap(sched.requests[rid], served) is not None:
            counts[rid] = counts.get(rid, 0) + 1
    return out


def apply_read_only_hold_fix(sched: Any) -> None:
    """Give `sched`, a built `DiffusionAsyncScheduler`, the counted read-only hold (see the
    module docstring); a synchronous `DiffusionScheduler` is left as it is."""
    cls = type(sched)
    if not any(c.__name__ == "DiffusionAsyncScheduler" for c in cls.__mro__):
        return

    def schedule(self: Any, throttle_prefills: bool = False) -> Any:
        return _counted_hold(self, lambda throttle: cls.schedule(self, throttle), throttle_prefills)

    sched.__class__ = type(cls.__name__, (cls,), {"schedule": schedule, "__module__": __name__})


__all__ = ["apply_read_only_hold_fix", "read_only_step_cap"]
