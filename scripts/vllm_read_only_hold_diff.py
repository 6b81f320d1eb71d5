"""Print the candidate fix for the read-only hold of vLLM 0.33.0's `DiffusionAsyncScheduler` (a
read-only request's step thrown away) as a unified diff of the installed vLLM's
`vllm/v1/core/sched/diffusion_scheduler.py`.

    .venv/bin/python scripts/vllm_read_only_hold_diff.py > read-only-hold.patch

The diff is made from the installed file when run (`integrations.vllm.read_only_hold_fix.
fix_as_diff`); `git apply -p1` applies it in a vLLM checkout of the same version. The checks
that validate the fix: `scripts/vllm_dllm_check.py --read-only-hold-fix`, which runs this very
edit of the file. Exit 2 with one line if vLLM is not installed or its file no longer has the
places the fix edits. Needs `schedspec install-engines vllm`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.vllm.patches import print_patch
from integrations.vllm.read_only_hold_fix import fix_as_diff

if __name__ == "__main__":
    sys.exit(print_patch(fix_as_diff))
