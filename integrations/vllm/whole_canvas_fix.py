"""A candidate fix for a finding in vLLM 0.33.0's diffusion scheduling, applied to one built
scheduler so that the checks of `integrations.vllm.diffusion` can validate it.

The finding (docs/engines.md, "Diffusion LLMs"): `Scheduler.schedule` caps a running request's
new tokens at the token budget left, so a diffusion request denoising after another one gets
the part of its canvas that still fits (canvas 4, budget 6: a canvas of 2), and the runner then
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

`apply_whole_canvas_fix(sched)` makes exactly that change to the installed vLLM's own
`Scheduler.schedule` (its source, edited at the one place named above, compiled in its module's
namespace) and gives it to that scheduler alone, through a subclass of its class: nothing of
vLLM is changed for any other scheduler. If vLLM's code no longer has the place the fix
edits, it raises `FixDoesNotApply` rather than run unpatched. `fix_as_diff()` gives the same
edit as a patch of vLLM's file (`scripts/vllm_whole_canvas_diff.py` prints it), and
`scripts/vllm_whole_canvas_cost.py` measures what it costs against vLLM as released.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import textwrap
from typing import Any

from integrations.vllm.patches import FixDoesNotApply, installed_text, unified_patch

#: The budget cap of the running-request loop (in the waiting loop the cap is on
#: `request_token_budget`, so this matches one statement only).
_BUDGET_CAP = re.compile(
    r"^(?P<indent> +)num_new_tokens = min\(\s*num_new_tokens, token_budget, "
    r"input_budget - draft_slots\s*\)\n",
    re.MULTILINE,
)


def fixed_source(source: str) -> str:
    """`Scheduler.schedule`'s source (dedented) with the fix inserted around its one
    running-request budget cap; `FixDoesNotApply` if it has none or several."""
    matches = list(_BUDGET_CAP.finditer(source))
    if len(matches) != 1:
        raise FixDoesNotApply(
            f"Scheduler.schedule has {len(matches)} running-request budget caps "
            "(`num_new_tokens = min(num_new_tokens, token_budget, input_budget - draft_slots)`); "
            "the fix edits exactly one (vLLM 0.33.0's)"
        )
    match = matches[0]
    pad = match["indent"]
    inner = pad + "    "
    before = f"{pad}num_wanted_tokens = num_new_tokens\n"
    after = (
        f"{pad}if (\n"
        f"{inner}self.vllm_config.model_config.is_diffusion\n"
        f"{inner}and request.spec_token_ids\n"
        f"{inner}and num_new_tokens < min(\n"
        f"{inner}    num_wanted_tokens,\n"
        f"{inner}    self.max_model_len\n"
        f"{inner}    - request.num_computed_tokens\n"
        f"{inner}    - self.num_sampled_tokens_per_step,\n"
        f"{inner})\n"
        f"{pad}):\n"
        f"{inner}# Diffusion: schedule a canvas whole or not at all (the runner expects a\n"
        f"{inner}# cut canvas only where it reaches max_model_len).\n"
        f"{inner}req_index += 1\n"
        f"{inner}continue\n"
    )
    return source[: match.start()] + before + match.group(0) + after + source[match.end() :]


@functools.cache
def fixed_schedule(base: type) -> Any:
    """vLLM's `Scheduler.schedule` (`base` is vLLM's `Scheduler`) with the fix made; compiled
    once per process."""
    original = base.__dict__["schedule"]
    source = fixed_source(textwrap.dedent(inspect.getsource(original)))
    namespace = dict(vars(sys.modules[original.__module__]))
    exec(compile(source, "<vLLM Scheduler.schedule, whole-canvas fix>", "exec"), namespace)
    fixed = namespace["schedule"]
    fixed.__qualname__ = original.__qualname__
    return fixed


def fix_as_diff() -> str:
    """The fix as a unified diff of the installed vLLM's `vllm/v1/core/sched/scheduler.py`
    (paths relative to the package's parent, as `git apply -p1` in a vLLM checkout wants),
    made from that file when called: nothing of vLLM's is stored here."""
    text = installed_text("vllm.v1.core.sched.scheduler")
    return unified_patch("vllm/v1/core/sched/scheduler.py", text, fixed_source(text))


def apply_whole_canvas_fix(sched: Any) -> None:
    """Give `sched` (a built `DiffusionScheduler` or `DiffusionAsyncScheduler`) the fixed
    `Scheduler.schedule`: its class becomes a subclass whose MRO puts the fixed method where
    `Scheduler`'s was, so the diffusion classes' own `schedule` (async: the read-only hold)
    still runs first and calls it through `super()`."""
    cls = type(sched)
    base = next(c for c in cls.__mro__ if c.__name__ == "Scheduler")
    fixed_base = type("Scheduler", (base,), {"schedule": fixed_schedule(base)})
    sched.__class__ = type(cls.__name__, (cls, fixed_base), {"__module__": __name__})


__all__ = [
    "FixDoesNotApply",
    "apply_whole_canvas_fix",
    "fix_as_diff",
    "fixed_schedule",
    "fixed_source",
]
