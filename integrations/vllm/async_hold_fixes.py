"""Two candidate fixes for holds of vLLM 0.33.0's `DiffusionAsyncScheduler`, made as edits of
vLLM's own `vllm/v1/core/sched/diffusion_scheduler.py` and applied to one built scheduler so
that the checks of `integrations.vllm.diffusion` can validate them.

**`read-only-hold`.** The finding (docs/engines/vllm-dllm.md, "Diffusion LLMs"): a read-only request
emits its one canvas on the step that converges it and ends, so a step scheduled after that
one is thrown away. The scheduler holds such a request back once "all its denoise steps" are
in flight (`_read_in_flight`: the placeholders in flight cover `diffusion_max_steps`
canvases). That counts the steps in flight against all of the request's steps, not against
the steps left, so once a step has returned the hold lets one more through. It also reads only
the request's `diffusion_max_steps`: the runner caps that at the served `max_denoising_steps`,
and with no `diffusion_max_steps` it runs the served number, where the hold is off. The fix
counts the canvas steps the scheduler has given each read-only request since it was last
(re)started, and holds the request once that count reaches its step cap: its
`diffusion_max_steps`, capped at the served `max_denoising_steps`, or the served number when it
gives none (as the runner caps it). A request that converges before its cap still has its
later steps in flight: the scheduler cannot know that in advance. As a change to vLLM's file:
a function `_read_step_cap`, a counter set in `DiffusionAsyncScheduler.__init__`, the hold in
`schedule` before `super().schedule()` and the count after it (reset when the request is
preempted, dropped when it finishes).

**`model-len-hold`.** The finding: `Scheduler.schedule` caps a step at `max_model_len -
num_computed_tokens - num_sampled_tokens_per_step`, and with a denoise step in flight that
count still holds the in-flight canvas, which the step will roll back; so near max_model_len
the async loop cuts a canvas that the synchronous loop schedules whole. No cap the scheduler
computes alone is right for both outcomes of the step in flight (a denoise leaves the canvas
where it is, a commit moves it on), but waiting is: the fix holds a request whose canvas the
cap would cut while it has a canvas step in flight, for this `schedule()` call (the same
`next_decode_eligible_step` device the read-only hold uses). By the next call the step's
output has been applied and `num_computed_tokens` is exact, so the cap cuts only what
max_model_len requires. It costs a step of pipelining, only for a request within a canvas of
max_model_len.

`fixed_module_source(text, fixes)` makes the named fixes' edits to the file's text
(`FixDoesNotApply` if the file no longer has a place they edit); `fix_as_diff(fixes)` gives
them as a patch of the installed file (`scripts/engine_fixes_diff.py vllm --fix NAME` prints
it). `apply_async_hold_fixes(sched, fixes)` runs the edited file, as a module of its
own, and gives one built `DiffusionAsyncScheduler` the edited class (with the counter the
edited `__init__` sets); a second call adds its fixes to the first's. Nothing of vLLM changes
for any other scheduler. The synchronous `DiffusionScheduler` has no step in flight, so it is
left as it is.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import types
from collections.abc import Iterable
from typing import Any

from integrations.patches import EngineFix, FixDoesNotApply, FixSet
from integrations.vllm.adapter import load_vllm
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


#: The model-len hold: near max_model_len, a request with a canvas step in flight waits for it.
_MODEL_LEN_EDITS = (
    (
        "            if len(request.spec_token_ids) > width:\n"
        "                request.spec_token_ids = request.spec_token_ids[:width]\n",
        "            if len(request.spec_token_ids) > width:\n"
        "                request.spec_token_ids = request.spec_token_ids[:width]\n"
        "            if request.num_output_placeholders and (\n"
        "                self.max_model_len\n"
        "                - request.num_computed_tokens\n"
        "                - self.num_sampled_tokens_per_step\n"
        "                < width\n"
        "            ):\n"
        "                # Near max_model_len the cap would count the canvas in flight,\n"
        "                # which a denoise step rolls back: wait for that step, then cut\n"
        "                # only what max_model_len requires.\n"
        "                request.next_decode_eligible_step = max(\n"
        "                    request.next_decode_eligible_step, self.current_step + 2\n"
        "                )\n",
    ),
)

READ_ONLY_HOLD = "read-only-hold"
MODEL_LEN_HOLD = "model-len-hold"
#: The two hold fixes as edits of the one file; they are applied per scheduler (by class) with
#: `apply_async_hold_fixes`, so no method list: `FixSet` serves for naming, order, the edits and
#: the patch.
HOLD_FIXES = FixSet(
    engine="vLLM 0.33.0",
    modules=(MODULE,),
    fixes=(
        EngineFix(
            READ_ONLY_HOLD,
            tuple((MODULE, old, new) for old, new in _EDITS),
            (),
            "a read-only request's step thrown away: hold it once its step cap is scheduled",
        ),
        EngineFix(
            MODEL_LEN_HOLD,
            tuple((MODULE, old, new) for old, new in _MODEL_LEN_EDITS),
            (),
            "a canvas cut early near max_model_len: wait for the canvas step in flight",
        ),
    ),
    exclusive=(),
    load=load_vllm,
    importing=contextlib.nullcontext,
)


def _chosen(fixes: Iterable[str]) -> tuple[str, ...]:
    return tuple(fix.name for fix in HOLD_FIXES.resolve(fixes))


def fixed_module_source(text: str, fixes: Iterable[str] = (READ_ONLY_HOLD,)) -> str:
    """The text of `diffusion_scheduler.py` with the named hold fixes made; `FixDoesNotApply`
    if one of the places they edit is missing or not unique (written against vLLM 0.33.0)."""
    return HOLD_FIXES.edit_text(MODULE, text, fixes)


@functools.cache
def _fixed_class(fixes: tuple[str, ...]) -> Any:
    source = fixed_module_source(installed_text(MODULE), fixes)
    module = types.ModuleType(f"{MODULE}_{'_'.join(f.replace('-', '_') for f in fixes)}")
    exec(compile(source, f"<{FILE}, {', '.join(fixes)}>", "exec"), module.__dict__)
    cls = module.DiffusionAsyncScheduler
    cls._hold_fixes = fixes  # what apply_async_hold_fixes reads to compose with more
    return cls


def fixed_async_class(fixes: Iterable[str] = (READ_ONLY_HOLD,)) -> Any:
    """`DiffusionAsyncScheduler` of the file with the named hold fixes, run as a module of its
    own (vLLM's module is left as it is); made once per process and set of fixes."""
    return _fixed_class(_chosen(fixes))


def fix_as_diff(fixes: Iterable[str] = (READ_ONLY_HOLD,)) -> str:
    """The named hold fixes as a unified diff of the installed vLLM's `diffusion_scheduler.py`
    (paths as `git apply -p1` in a vLLM checkout wants), made from that file when called."""
    return HOLD_FIXES.as_diff(fixes)


def apply_async_hold_fixes(sched: Any, fixes: Iterable[str]) -> None:
    """Give `sched`, a built `DiffusionAsyncScheduler`, the class of the file edited with the
    named hold fixes (with those it has from an earlier call: the holds compose), and the
    counter the read-only hold's `__init__` sets. A synchronous `DiffusionScheduler` is left
    as it is. Apply them before any other change of the scheduler's class (the whole-canvas
    fix subclasses whatever class it finds, so it composes after these); a class changed
    otherwise is refused."""
    cls = type(sched)
    vllm_async = importlib.import_module(MODULE).DiffusionAsyncScheduler
    have: tuple[str, ...] = cls.__dict__.get("_hold_fixes", ())
    if cls is not vllm_async and not have:
        if not issubclass(cls, vllm_async):
            return  # the synchronous scheduler
        raise FixDoesNotApply(
            f"the scheduler's class was changed already ({cls.__module__}.{cls.__qualname__}); "
            "apply the hold fixes first"
        )
    chosen = _chosen((*have, *fixes))
    sched.__class__ = _fixed_class(chosen)
    if READ_ONLY_HOLD in chosen and not hasattr(sched, "_read_steps"):
        sched._read_steps = {}


def apply_read_only_hold_fix(sched: Any) -> None:
    """`apply_async_hold_fixes(sched, ["read-only-hold"])`."""
    apply_async_hold_fixes(sched, (READ_ONLY_HOLD,))


def apply_model_len_hold_fix(sched: Any) -> None:
    """`apply_async_hold_fixes(sched, ["model-len-hold"])`."""
    apply_async_hold_fixes(sched, (MODEL_LEN_HOLD,))


__all__ = [
    "HOLD_FIXES",
    "MODEL_LEN_HOLD",
    "READ_ONLY_HOLD",
    "apply_async_hold_fixes",
    "apply_model_len_hold_fix",
    "apply_read_only_hold_fix",
    "fix_as_diff",
    "fixed_async_class",
    "fixed_module_source",
]
