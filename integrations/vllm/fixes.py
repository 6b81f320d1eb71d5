"""vLLM 0.33.0's diffusion fixes in one list: the whole-canvas fix
(`integrations.vllm.whole_canvas_fix`, an edit of `vllm/v1/core/sched/scheduler.py`) and the
two async hold fixes (`integrations.vllm.async_hold_fixes`, edits of
`vllm/v1/core/sched/diffusion_scheduler.py`), as `VLLM_DLLM_FIXES`: what
`scripts/engine_fixes_diff.py vllm` lists and prints as one patch.

The checks give the fixes to one built scheduler each (`apply_whole_canvas_fix`,
`apply_async_hold_fixes`), not to vLLM's classes, so this set is for naming and printing: its
`applied` would change only `Scheduler.schedule`.
"""

from __future__ import annotations

import contextlib

from integrations.patches import FixSet
from integrations.vllm import async_hold_fixes, whole_canvas_fix
from integrations.vllm.adapter import load_vllm

VLLM_DLLM_FIXES = FixSet(
    engine="vLLM 0.33.0",
    modules=(whole_canvas_fix.MODULE, async_hold_fixes.MODULE),
    fixes=(whole_canvas_fix.WHOLE_CANVAS_FIX, *async_hold_fixes.HOLD_FIXES.fixes),
    exclusive=(),
    load=load_vllm,
    importing=contextlib.nullcontext,
)

__all__ = ["VLLM_DLLM_FIXES"]
