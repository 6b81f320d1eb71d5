"""A candidate fix for the read-only hold of vLLM 0.33.0's `DiffusionAsyncScheduler`, made as an
edit of vLLM's own `vllm/v1/core/sched/diffusion_scheduler.py` and applied to one built
scheduler so that the checks of `integrations.vllm.diffusion` can validate it.

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
flight: the scheduler cannot know that in advance. As a change to vLLM's file: a function
`_read_step_cap`, a counter set in `DiffusionAsyncScheduler.__init__`, the hold in `schedule`
before `super().schedule()` and the count after it (reset when the request is preempted,
dropped when it finishes).

`fixed_module_source(text)` makes that edit to the file's text (`FixDoesNotApply` if the file
no longer has the places it edits); `fix_as_diff()` gives it as a patch of the installed file
(`scripts/vllm_read_only_hold_diff.py` prints it). `apply_read_only_hold_fix(sched)` runs the
edited file, as a module of its own, and gives one built `DiffusionAsyncScheduler` the edited
class (with the counter the edited `__init__` sets); nothing of vLLM changes for any other
scheduler. The synchronous `DiffusionScheduler` has no step in flight to throw away, so it is
left as it is.
"""

from __future__ import annotations

import functools
import importlib
import types
from typing import Any

from integrations.patches import FixDoesNotApply, edit_once, unified_patch
from integrations.vllm.patches import installed_text

MODULE = "vllm.v1.core.sched.diffusion_scheduler"
FILE = "vllm/v1/core/sched/diffusion_scheduler.py"

_STEP_CAP = '''

def _read_step_cap(request: Request, served_steps: int | None) -> int | None:
    """The denoise steps the runner gives a read-only request: its
    diffusion_max_steps capped at the served max_denoising_steps, or the
    served number. None when it is not read-only or no cap is known."""
    params = request.sampling_params
    extra = params.extra_args if params is not None else None
    if not extra or not extra.get("diffusion_read_only"):
        return None
    steps = extra.get("diffusion_max_steps")
    if steps is None:
        return served_steps
    if served_steps is None:
        return int(steps)
    return max(1, min(int(steps), served_steps))
'''

#: (what the file has, exactly once; what the fix puts in its place)
_EDITS = (
    (
        "\n\nclass DiffusionScheduler(Scheduler):\n",
        _STEP_CAP + "\n\nclass DiffusionScheduler(Scheduler):\n",
    ),
    (
        "class DiffusionAsyncScheduler(DiffusionScheduler, AsyncScheduler):\n"
        "    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:\n"
        "        for request in self.running:\n",
        "class DiffusionAsyncScheduler(DiffusionScheduler, AsyncScheduler):\n"
        "    def __init__(self, *args, **kwargs) -> None:\n"
        "        super().__init__(*args, **kwargs)\n"
        "        # Canvas steps scheduled per read-only request since it last started.\n"
        "        self._read_steps: dict[str, int] = {}\n"
        "\n"
        "    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:\n"
        "        diffusion_config = self.vllm_config.diffusion_config\n"
        "        served = diffusion_config.max_denoising_steps if diffusion_config else None\n"
        "        for request in self.running:\n",
    ),
    (
        "            if _read_in_flight(request, width):\n",
        "            cap = _read_step_cap(request, served)\n"
        "            if _read_in_flight(request, width) or (\n"
        "                cap is not None\n"
        "                and self._read_steps.get(request.request_id, 0) >= cap\n"
        "            ):\n",
    ),
    (
        "        return super().schedule(throttle_prefills)\n",
        "        output = super().schedule(throttle_prefills)\n"
        "        for req_id in (output.preempted_req_ids or set()) | output.finished_req_ids:\n"
        "            # A resumed request starts its canvas again.\n"
        "            self._read_steps.pop(req_id, None)\n"
        "        for req_id in output.scheduled_spec_decode_tokens:\n"
        "            if _read_step_cap(self.requests[req_id], served) is not None:\n"
        "                self._read_steps[req_id] = self._read_steps.get(req_id, 0) + 1\n"
        "        return output\n",
    ),
)


def fixed_module_source(text: str) -> str:
    """The text of `diffusion_scheduler.py` with the fix made; `FixDoesNotApply` if one of the
    places it edits is missing or not unique (the fix is written against vLLM 0.33.0)."""
    return edit_once(
        text, _EDITS, file=FILE, fix="the read-only hold fix (written against vLLM 0.33.0)"
    )


@functools.cache
def fixed_async_class() -> Any:
    """`DiffusionAsyncScheduler` of the edited file, run as a module of its own (vLLM's module
    is left as it is); made once per process."""
    source = fixed_module_source(installed_text(MODULE))
    module = types.ModuleType(f"{MODULE}_read_only_hold_fix")
    exec(compile(source, f"<{FILE}, read-only hold fix>", "exec"), module.__dict__)
    return module.DiffusionAsyncScheduler


def fix_as_diff() -> str:
    """The fix as a unified diff of the installed vLLM's `diffusion_scheduler.py` (paths as
    `git apply -p1` in a vLLM checkout wants), made from that file when called."""
    text = installed_text(MODULE)
    return unified_patch(FILE, text, fixed_module_source(text))


def apply_read_only_hold_fix(sched: Any) -> None:
    """Give `sched`, a built `DiffusionAsyncScheduler`, the edited class and the counter its
    `__init__` sets. A synchronous `DiffusionScheduler` is left as it is. Apply it before any
    other change of the scheduler's class (the whole-canvas fix subclasses whatever class it
    finds, so it composes after this one); a class changed already is refused."""
    cls = type(sched)
    vllm_async = importlib.import_module(MODULE).DiffusionAsyncScheduler
    if cls is not vllm_async:
        if not issubclass(cls, vllm_async):
            return  # the synchronous scheduler
        raise FixDoesNotApply(
            f"the scheduler's class was changed already ({cls.__module__}.{cls.__qualname__}); "
            "apply the read-only hold fix first"
        )
    sched.__class__ = fixed_async_class()
    sched._read_steps = {}


__all__ = [
    "apply_read_only_hold_fix",
    "fix_as_diff",
    "fixed_async_class",
    "fixed_module_source",
]
