"""What the candidate fixes of an engine's code share, whatever the engine: the error when the
installed code no longer has a place a fix edits, the edit itself (text that must be there
exactly once, and what takes its place), the fix as a unified patch, and the `main` of the
scripts that print one."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterable

from spec.errors import SchedSpecError


class FixDoesNotApply(RuntimeError):
    """The installed engine's code does not have the place a fix edits."""


def edit_once(text: str, edits: Iterable[tuple[str, str]], *, file: str, fix: str) -> str:
    """`text` with each (old, new) of `edits` made in turn; every `old` must occur exactly once
    in the text as it stands then (`FixDoesNotApply` names the file, the first line of the
    `old` that is missing or not unique, and `fix`: what needs it, e.g. "the read-only hold fix
    (written against vLLM 0.33.0)")."""
    for old, new in edits:
        found = text.count(old)
        if found != 1:
            first = old.strip().splitlines()[0]
            raise FixDoesNotApply(
                f"{file} has {found} copies of `{first}`; {fix} needs exactly one"
            )
        text = text.replace(old, new)
    return text


def unified_patch(path: str, text: str, fixed: str) -> str:
    """`fixed` against `text` as a unified diff of the engine's file `path` (relative to the
    package's parent, as `git apply -p1` in the engine's checkout wants)."""
    lines = difflib.unified_diff(
        text.splitlines(keepends=True),
        fixed.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return "".join(lines)


def print_patch(fix_as_diff: Callable[[], str]) -> int:
    """A patch script's `main`: print the diff, or one line and exit 2 if the engine is not
    installed or its code no longer has the place the fix edits."""
    try:
        diff = fix_as_diff()
    except (FixDoesNotApply, SchedSpecError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(diff)
    return 0


__all__ = ["FixDoesNotApply", "edit_once", "print_patch", "unified_patch"]
