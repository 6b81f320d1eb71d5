"""Print the candidate fixes for the holds of vLLM 0.33.0's `DiffusionAsyncScheduler` as a
unified diff of the installed vLLM's `vllm/v1/core/sched/diffusion_scheduler.py`: the
read-only hold (a read-only request's step thrown away) and the model-len hold (a canvas cut
early near max_model_len).

    .venv/bin/python scripts/vllm_async_hold_diff.py > async-holds.patch
    .venv/bin/python scripts/vllm_async_hold_diff.py --fix model-len-hold

Without `--fix`, both; `--fix NAME` (repeatable) picks. The diff is made from the installed
file when run (`integrations.vllm.async_hold_fixes.fix_as_diff`); `git apply -p1` applies it
in a vLLM checkout of the same version. The checks that validate the fixes:
`scripts/vllm_dllm_check.py --read-only-hold-fix` and `--reach-model-len --model-len-hold-fix`,
which run these very edits of the file. Exit 2 with one line for an unknown fix, if vLLM is
not installed, or if its file no longer has the places the fixes edit. Needs `schedspec
install-engines vllm`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.vllm.async_hold_fixes import HOLD_FIXES, fix_as_diff
from integrations.vllm.patches import print_patch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--fix",
        action="append",
        choices=list(HOLD_FIXES.names),
        help="a hold fix to include (repeatable; default both)",
    )
    args = parser.parse_args(argv)
    fixes = args.fix or list(HOLD_FIXES.names)
    return print_patch(lambda: fix_as_diff(fixes))


if __name__ == "__main__":
    sys.exit(main())
