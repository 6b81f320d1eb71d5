"""Print the candidate fix for vLLM 0.33.0's first diffusion finding (a canvas cut by the token
budget) as a unified diff of the installed vLLM's `vllm/v1/core/sched/scheduler.py`.

    .venv/bin/python scripts/vllm_whole_canvas_diff.py > whole-canvas.patch

The diff is made from the installed file when run (`integrations.vllm.whole_canvas_fix.
fix_as_diff`); `git apply -p1` applies it in a vLLM checkout of the same version. The checks
that validate the fix: `scripts/vllm_dllm_check.py --budget-binds --whole-canvas-fix`. Exit 2
with one line if vLLM is not installed or its code no longer has the statement the fix edits.
Needs `schedspec install-engines vllm`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.vllm.patches import print_patch
from integrations.vllm.whole_canvas_fix import fix_as_diff

if __name__ == "__main__":
    sys.exit(print_patch(fix_as_diff))
