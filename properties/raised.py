"""How an exception an implementation raised is named in a finding or an error line.

`RuntimeError: Prefill out of memory (at /src/engine/scheduler.py:88 in run_round)`: the type,
the message and the innermost frame, the line that raised, so a user can open it without a
traceback. An exception without a message (a bare `assert`, a `StopIteration`) is named by the
source statement that raised it instead: `AssertionError: assert len(self.running) <= cap`
(the whole statement where it spans several lines, its comments dropped and its whitespace
collapsed to one line, cut at `STATEMENT_CHARS` characters: `statement_of`). When
that line is in an installed package (an engine's own assert) and the stack passed through code
of the user's own (a subclass of the engine's scheduler, say), the innermost such frame is added
as `via file:line in function`: where the user's change met the engine's check.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from spec.source_statement import STATEMENT_CHARS, statement_of

# this project's packages (spec, properties, integrations, ...): neither the user's nor an engine's
_OURS = str(Path(__file__).resolve().parents[1]) + "/"


def describe_raised(err: BaseException) -> str:
    """`Type: message (at file:line in function[; via file:line in function])` of `err`; the
    parts it lacks are left out (see the module docstring)."""
    text = str(err)
    frames = traceback.extract_tb(err.__traceback__)
    last = frames[-1] if frames else None
    if not text and last is not None:
        text = statement_of(last)
    what = f"{type(err).__name__}: {text}" if text else type(err).__name__
    if last is not None:
        what += f" (at {last.filename}:{last.lineno} in {last.name}"
        mine = _users_innermost(frames) if _installed(last.filename) else None
        if mine is not None and mine is not last:
            what += f"; via {mine.filename}:{mine.lineno} in {mine.name}"
        what += ")"
    return what


def _installed(filename: str) -> bool:
    return "/site-packages/" in filename or "/dist-packages/" in filename


def _users_innermost(frames: traceback.StackSummary) -> traceback.FrameSummary | None:
    """The innermost frame in neither an installed package nor this project (nor Python's own,
    `<frozen ...>` and the like): the user's code, if the stack passed through any."""
    for frame in reversed(frames):
        name = frame.filename
        if _installed(name) or name.startswith("<") or str(Path(name).resolve()).startswith(_OURS):
            continue
        if "/lib/python3" in name:  # the standard library
            continue
        return frame
    return None


__all__ = ["STATEMENT_CHARS", "describe_raised", "statement_of"]
