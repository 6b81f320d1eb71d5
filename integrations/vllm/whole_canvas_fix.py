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

    wanted = num_new_tokens
    num_new_tokens = min(num_new_tokens, token_budget, input_budget - draft_slots)
    if is_diffusion and request.spec_token_ids and num_new_tokens < min(
        wanted, max_model_len - num_computed_tokens - num_sampled_tokens_per_step
    ):
        req_index += 1
        continue

`apply_whole_canvas_fix(sched)` makes exactly that change to the installed vLLM's own
`Scheduler.schedule` (its source, edited at the one place named above, compiled in its module's
namespace) and gives it to that scheduler alone, through a subclass of its class: nothing of
vLLM is changed for any other scheduler. If vLLM's code no longer has the place the fix
edits, it raises `FixDoesNotApply` rather than run unpatched.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import textwrap
from typing import Any

#: The budget cap of the running-request loop (in the waiting loop the cap is on
#: `request_token_budget`, so this matches one statement only).
_BUDGET_CAP = re.compile(
    r"^(?P<indent> +)num_new_tokens = min\(\s*num_new_tokens, token_budget, "
    r"input_budget - draft_slots\s*\)\n",
    re.MULTILINE,
)


class FixDoesNotApply(RuntimeError):
    """The installed vLLM's `Scheduler.schedule` does not have the statement the fix edits."""


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
    before = f"{pad}_schedspec_wanted = num_new_tokens\n"
    after = (
        f"{pad}if (\n"
        f"{inner}self.vllm_config.model_config.is_diffusion\n"
        f"{inner}and request.spec_token_ids\n"
        f"{inner}and num_new_tokens < min(\n"
        f"{inner}    _schedspec_wanted,\n"
        f"{inner}    self.max_model_len - request.num_computed_tokens"
        " - self.num_sampled_tokens_per_step,\n"
        f"{inner})\n"
        f"{pad}):\n"
        f"{inner}# schedspec's candidate fix: a canvas is scheduled whole or not at all.\n"
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


def apply_whole_canvas_fix(sched: Any) -> None:
    """Give `sched` (a built `DiffusionScheduler` or `DiffusionAsyncScheduler`) the fixed
    `Scheduler.schedule`: its class becomes a subclass whose MRO puts the fixed method where
    `Scheduler`'s was, so the diffusion classes' own `schedule` (async: the read-only hold)
    still runs first and calls it through `super()`."""
    cls = type(sched)
    base = next(c for c in cls.__mro__ if c.__name__ == "Scheduler")
    fixed_base = type("Scheduler", (base,), {"schedule": fixed_schedule(base)})
    sched.__class__ = type(cls.__name__, (cls, fixed_base), {"__module__": __name__})


__all__ = ["FixDoesNotApply", "apply_whole_canvas_fix", "fixed_schedule", "fixed_source"]
