"""vLLM 0.33.0's diffusion fixes in one list: the whole-canvas fix
(`integrations.vllm.whole_canvas_fix`, an edit of `vllm/v1/core/sched/scheduler.py`) and the
two async hold fixes (`integrations.vllm.async_hold_fixes`, edits of
`vllm/v1/core/sched/diffusion_scheduler.py`), as `VLLM_DLLM_FIXES`: what
`scripts/engine_fixes_diff.py vllm` lists and prints as one patch.

The checks give the fixes to one built scheduler each (`apply_whole_canvas_fix`,
`apply_async_hold_fixes`), not to vLLM's classes, so this set is for naming and printing: its
`applied` would change only `Scheduler.schedule`. `dllm_mutation(names)` gives one built
scheduler the named fixes, in the one order they compose in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from integrations.patches import FixSet
from integrations.vllm import async_hold_fixes, whole_canvas_fix
from integrations.vllm.adapter import load_vllm
from integrations.vllm.async_hold_fixes import (
    MODEL_LEN_HOLD,
    READ_ONLY_HOLD,
    apply_async_hold_fixes,
)
from integrations.vllm.whole_canvas_fix import WHOLE_CANVAS, apply_whole_canvas_fix

VLLM_DLLM_FIXES = FixSet(
    engine="vLLM 0.33.0",
    modules=(whole_canvas_fix.MODULE, async_hold_fixes.MODULE),
    fixes=(whole_canvas_fix.WHOLE_CANVAS_FIX, *async_hold_fixes.HOLD_FIXES.fixes),
    exclusive=(),
    load=load_vllm,
    importing=contextlib.nullcontext,
)

#: The diffusion fixes by name, in the order `dllm_mutation` makes them: the hold fixes replace
#: vLLM's class (the second adds to the first), the whole-canvas fix subclasses whatever class
#: it finds.
DLLM_FIX_ORDER = (READ_ONLY_HOLD, MODEL_LEN_HOLD, WHOLE_CANVAS)


def dllm_mutation(names: Iterable[str]) -> Callable[[Any], None] | None:
    """What `DllmCoreLoop(mutate=...)` takes to make the named fixes (any of `DLLM_FIX_ORDER`,
    in any order) on its scheduler; None for no fix. `ValueError` for an unknown name."""
    chosen = set(names)
    unknown = sorted(chosen - set(DLLM_FIX_ORDER))
    if unknown:
        raise ValueError(f"unknown diffusion fixes {unknown}; known: {list(DLLM_FIX_ORDER)}")
    if not chosen:
        return None
    holds = [name for name in DLLM_FIX_ORDER if name in chosen and name != WHOLE_CANVAS]

    def mutate(sched: Any) -> None:
        if holds:
            apply_async_hold_fixes(sched, holds)
        if WHOLE_CANVAS in chosen:
            apply_whole_canvas_fix(sched)

    return mutate


__all__ = ["DLLM_FIX_ORDER", "VLLM_DLLM_FIXES", "dllm_mutation"]
