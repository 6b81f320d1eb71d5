"""JSON text a user feeds in, parsed so that every way it can be malformed is one exception.

`json.loads` fails on bad text in three ways: `json.JSONDecodeError` for invalid JSON,
`RecursionError` for arrays or objects nested deeper than the interpreter's recursion limit,
and a plain `ValueError` for an integer literal longer than Python converts
(`sys.get_int_max_str_digits()`, 4300 digits by default). A reader that catches only the first
lets the other two out as tracebacks. `parse_json` turns all three into
`json.JSONDecodeError`, so each reader keeps one `except` and its own typed error.
"""

from __future__ import annotations

import json
import sys
from typing import Any

NESTED_TOO_DEEPLY = "nested too deeply"


def parse_json(text: str) -> Any:
    """`json.loads(text)`; any malformed text raises `json.JSONDecodeError` with a message that
    says what was wrong (never `RecursionError` or a bare `ValueError`)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError(NESTED_TOO_DEEPLY, text, 0) from None
    except ValueError:  # an integer literal past the interpreter's digit limit
        limit = sys.get_int_max_str_digits()
        raise json.JSONDecodeError(f"a number longer than {limit} digits", text, 0) from None


def not_json_detail(line: str, err: json.JSONDecodeError) -> str:
    """What a log line that is not JSON is told: the parser's message, and, when the line opens
    an object it never closes, that the log may have been cut while it was written (an engine
    killed mid-line)."""
    text = line.strip()
    cut = text.startswith("{") and not text.endswith("}") and err.msg != NESTED_TOO_DEEPLY
    hint = (
        "; the line opens an object it never closes: a log cut while it was written?" if cut else ""
    )
    return f"not JSON: {err.msg}{hint}"


__all__ = ["NESTED_TOO_DEEPLY", "not_json_detail", "parse_json"]
