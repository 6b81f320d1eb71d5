"""What the candidate fixes of vLLM's code share: the error when vLLM's code no longer has the
place a fix edits, the installed file a fix edits, the fix as a patch of that file, and the
scripts that print it."""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from collections.abc import Callable
from pathlib import Path

from integrations.vllm.adapter import load_vllm
from spec.errors import SchedSpecError


class FixDoesNotApply(RuntimeError):
    """The installed vLLM's code does not have the place a fix edits."""


def installed_text(module: str) -> str:
    """The text of the installed vLLM's file of `module` (vLLM loaded first, so a missing
    install is the usual typed error)."""
    load_vllm()
    return Path(inspect.getsourcefile(importlib.import_module(module)) or "").read_text(
        encoding="utf-8"
    )


def unified_patch(path: str, text: str, fixed: str) -> str:
    """`fixed` against `text` as a unified diff of vLLM's file `path` (relative to the package's
    parent, as `git apply -p1` in a vLLM checkout wants)."""
    lines = difflib.unified_diff(
        text.splitlines(keepends=True),
        fixed.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return "".join(lines)


def print_patch(fix_as_diff: Callable[[], str]) -> int:
    """A patch script's `main`: print the diff, or one line and exit 2 if vLLM is not installed
    or its code no longer has the place the fix edits."""
    try:
        diff = fix_as_diff()
    except (FixDoesNotApply, SchedSpecError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(diff)
    return 0


__all__ = ["FixDoesNotApply", "installed_text", "print_patch", "unified_patch"]
