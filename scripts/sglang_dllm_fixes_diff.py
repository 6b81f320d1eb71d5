"""Print candidate fixes for SGLang 0.5.23's dLLM scheduler path as one unified diff of the
installed SGLang's `sglang/srt/managers/schedule_policy.py` and
`sglang/srt/dllm/mixin/scheduler.py`.

    .venv/bin/python scripts/sglang_dllm_fixes_diff.py > sglang-dllm-fixes.patch
    .venv/bin/python scripts/sglang_dllm_fixes_diff.py --fix decode-fallback

Without `--fix`, the five fixes that together let the dLLM suite run with no pool headroom
(`integrations.sglang.fixes.FIXES`); `--fix NAME` (repeatable) picks fixes by name. The diff
is made from the installed files when run; `git apply -p1` applies it in the `python/`
directory of an SGLang checkout of the same version. The tests that validate these very edits
are in `tests/test_real_sglang.py` (each finding's fix, and the suite below the headroom with
the five). Exit 2 with one line for an unknown fix, if SGLang is not installed, or if its
files no longer have the places the fixes edit. Needs `schedspec install-engines sglang`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.patches import print_patch
from integrations.sglang.fixes import BY_NAME, FIXES, fix_as_diff, resolve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--fix",
        action="append",
        choices=list(BY_NAME),
        help="a fix to include (repeatable; default the five of FIXES)",
    )
    args = parser.parse_args(argv)
    names = args.fix or [fix.name for fix in FIXES]
    try:
        resolve(names)
    except ValueError as err:  # two fallbacks together
        print(f"error: {err}", file=sys.stderr)
        return 2
    return print_patch(lambda: fix_as_diff(names))


if __name__ == "__main__":
    sys.exit(main())
