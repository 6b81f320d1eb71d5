"""The source of the statement a traceback's frame was running, on one line, for reports.

An exception without a message (a bare `assert`) is best named by the statement that raised
it; `FrameSummary.line` holds only its first line, which cuts a statement spanning several
(`assert len(new) + len(resumed) + len(`). `statement_of` gives the whole statement. Standard
library only: the engines' adapters (`integrations`) and the property suites both use it.
"""

from __future__ import annotations

import ast
import io
import linecache
import re
import tokenize
import traceback

#: The longest statement `statement_of` gives whole; a longer one is cut, ending in `...`.
STATEMENT_CHARS = 300


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


__all__ = ["STATEMENT_CHARS", "statement_of"]
