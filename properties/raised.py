"""How an exception an implementation raised is named in a finding or an error line.

`RuntimeError: Prefill out of memory (at /src/engine/scheduler.py:88 in run_round)`: the type,
the message (left out when empty, as a bare `StopIteration` has none) and the innermost frame,
the line that raised, so a user can open it without a traceback.
"""

from __future__ import annotations

import traceback


def describe_raised(err: BaseException) -> str:
    """`Type: message (at file:line in function)` of `err`; the parts it lacks are left out."""
    text = str(err)
    what = f"{type(err).__name__}: {text}" if text else type(err).__name__
    frames = traceback.extract_tb(err.__traceback__)
    if frames:
        last = frames[-1]
        what += f" (at {last.filename}:{last.lineno} in {last.name})"
    return what


__all__ = ["describe_raised"]
