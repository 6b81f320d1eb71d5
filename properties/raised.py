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

import ast
import io
import linecache
import re
import tokenize
import traceback
from pathlib import Path

# this project's packages (spec, properties, integrations, ...): neither the user's nor an engine's
_OURS = str(Path(__file__).resolve().parents[1]) + "/"

#: The longest statement `statement_of` gives whole; a longer one is cut, ending in `...`.
STATEMENT_CHARS = 300


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


def statement_of(frame: traceback.FrameSummary) -> str:
    """The source of the statement `frame` was running, on one line: from the line where the
    statement starts to the line where it ends (the frame's `lineno` to `end_lineno`, widened
    to the simple statement around them where the source parses), comments dropped,
    whitespace collapsed, cut at `STATEMENT_CHARS`; `FrameSummary.line` (the first line only)
    where the source cannot be read, and "" where there is none."""
    lines = linecache.getlines(frame.filename)
    first = frame.lineno
    if first is None or not 1 <= first <= len(lines):
        return (frame.line or "").strip()
    last = min(max(frame.end_lineno or first, first), len(lines))
    first, last = _enclosing_statement(lines, first, last)
    text = _one_line("".join(lines[first - 1 : last]))
    if len(text) > STATEMENT_CHARS:
        text = text[: STATEMENT_CHARS - 3].rstrip() + "..."
    return text


def _enclosing_statement(lines: list[str], first: int, last: int) -> tuple[int, int]:
    """The first and last line of the innermost simple statement (no body of its own) that
    spans lines `first` to `last` of the source `lines`; those lines themselves where the
    source does not parse or no simple statement spans them (a compound statement's header)."""
    try:
        tree = ast.parse("".join(lines))
    except (SyntaxError, ValueError):
        return first, last
    best: tuple[int, int] | None = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or hasattr(node, "body"):
            continue
        start, end = node.lineno, node.end_lineno or node.lineno
        if start <= first and last <= end and (best is None or end - start < best[1] - best[0]):
            best = (start, end)
    return best if best is not None else (first, last)


def _one_line(source: str) -> str:
    """`source` (one statement's lines) on one line: comments dropped, whitespace collapsed, no
    space left just inside brackets."""
    try:
        tokens = [
            tok
            for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type != tokenize.COMMENT
        ]
        source = tokenize.untokenize(tokens)
    except (tokenize.TokenError, SyntaxError, ValueError):
        pass  # a fragment tokenize refuses: its comments stay
    text = " ".join(source.split())
    text = re.sub(r"([(\[{]) ", r"\1", text)
    return re.sub(r" ([)\]}])", r"\1", text)


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
