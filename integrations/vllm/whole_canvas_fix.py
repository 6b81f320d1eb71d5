"""A candidate fix for a finding in vLLM 0.33.0's diffusion scheduling, applied to one built
scheduler so that the checks of `integrations.vllm.diffusion` can validate it.

The finding (docs/engines/vllm-dllm.md, "Diffusion LLMs"): `Scheduler.schedule` caps a running
request's new tokens at the token budget left, so a diffusion request denoising after another one
gets the part of its canvas that still fits (canvas 4, budget 6: a canvas of 2), and the runner then
denoises and commits a cut canvas, which it expects only where a canvas reaches max_model_len.

The fix: in the running-request loop of `Scheduler.schedule`, a diffusion request whose
canvas the token budget (or the input budget) would cut is skipped this step instead, as
vLLM already refuses to schedule a padded spec-decode request un-padded ("Prefer to not
schedule than schedule un-padded"). A cut at max_model_len stays: it is the one the runner
is written for. As a change to vLLM it is three statements around the budget cap:

    num_wanted_tokens = num_new_tokens
    num_new_tokens = min(num_new_tokens, token_budget, input_budget - draft_slots)
    if is_diffusion and request.spec_token_ids and num_new_tokens < min(
        num_wanted_tokens, max_model_len - num_computed_tokens - num_sampled_tokens_per_step
    ):
        req_index += 1
        continue

The fix is an edit of vLLM's own `vllm/v1/core/sched/scheduler.py` (`WHOLE_CANVAS_FIXES`, an
`integrations.patches.FixSet`, written against vLLM 0.33.0): `fixed_source(text)` makes it,
`fix_as_diff()` gives it as a patch (`scripts/engine_fixes_diff.py vllm --fix whole-canvas`
prints it), and `apply_whole_canvas_fix(sched)` gives one built scheduler the edited
`Scheduler.schedule`, through a subclass of its class: nothing of vLLM is changed for any other
scheduler. If vLLM's file no longer has the statement the fix edits, they raise
`FixDoesNotApply` rather than run unpatched. `scripts/vllm_whole_canvas_cost.py` measures what
the fix costs against vLLM as released.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from integrations.patches import EngineFix, FixDoesNotApply, FixSet
from integrations.vllm.adapter import load_vllm

MODULE = "vllm.v1.core.sched.scheduler"
WHOLE_CANVAS = "whole-canvas"

#: The budget cap of the running-request loop (the waiting loop caps `request_token_budget`,
#: so this is the one statement of its kind).
_BUDGET_CAP = (
    "            num_new_tokens = min(\n"
    "                num_new_tokens, token_budget, input_budget - draft_slots\n"
    "            )\n"
)
_SKIP_A_CUT_CANVAS = (
    "            if (\n"
    "                self.vllm_config.model_config.is_diffusion\n"
    "                and request.spec_token_ids\n"
    "                and num_new_tokens < min(\n"
    "                    num_wanted_tokens,\n"
    "                    self.max_model_len\n"
    "                    - request.num_computed_tokens\n"
    "                    - self.num_sampled_tokens_per_step,\n"
    "                )\n"
    "            ):\n"
    "                # Diffusion: schedule a canvas whole or not at all (the runner expects a\n"
    "                # cut canvas only where it reaches max_model_len).\n"
    "                req_index += 1\n"
    "                continue\n"
)

WHOLE_CANVAS_FIX = EngineFix(
    WHOLE_CANVAS,
    (
        (
            MODULE,
            _BUDGET_CAP,
            "            num_wanted_tokens = num_new_tokens\n" + _BUDGET_CAP + _SKIP_A_CUT_CANVAS,
        ),
    ),
    ((MODULE, "Scheduler.schedule"),),
    "a canvas cut by the token budget: skip the request this step instead",
)
WHOLE_CANVAS_FIXES = FixSet(
    engine="vLLM 0.33.0",
    modules=(MODULE,),
    fixes=(WHOLE_CANVAS_FIX,),
    exclusive=(),
    load=load_vllm,
    importing=contextlib.nullcontext,
)


def fixed_source(text: str) -> str:
    """The text of vLLM's `scheduler.py` with the fix made around its one running-request
    budget cap; `FixDoesNotApply` if it has none or several."""
    return WHOLE_CANVAS_FIXES.edit_text(MODULE, text, [WHOLE_CANVAS])


@functools.cache
def fixed_schedule() -> Any:
    """vLLM's `Scheduler.schedule` with the fix made, reading vLLM's module globals; compiled
    once per process."""
    return WHOLE_CANVAS_FIXES.fixed_methods([WHOLE_CANVAS])[(MODULE, "Scheduler.schedule")]


def fix_as_diff() -> str:
    """The fix as a unified diff of the installed vLLM's `vllm/v1/core/sched/scheduler.py`
    (paths relative to the package's parent, as `git apply -p1` in a vLLM checkout wants),
    made from that file when called: nothing of vLLM's is stored here."""
    return WHOLE_CANVAS_FIXES.as_diff([WHOLE_CANVAS])


def apply_whole_canvas_fix(sched: Any) -> None:
    """Give `sched` (a built `DiffusionScheduler` or `DiffusionAsyncScheduler`) the fixed
    `Scheduler.schedule`: its class becomes a subclass whose MRO puts the fixed method where
    `Scheduler`'s was, so the diffusion classes' own `schedule` (async: the read-only hold)
    still runs first and calls it through `super()`."""
    cls = type(sched)
    base = next(c for c in cls.__mro__ if c.__name__ == "Scheduler")
    fixed_base = type("Scheduler", (base,), {"schedule": fixed_schedule()})
    sched.__class__ = type(cls.__name__, (cls, fixed_base), {"__module__": __name__})


__all__ = [
    "WHOLE_CANVAS",
    "WHOLE_CANVAS_FIX",
    "WHOLE_CANVAS_FIXES",
    "FixDoesNotApply",
    "apply_whole_canvas_fix",
    "fix_as_diff",
    "fixed_schedule",
    "fixed_source",
]
