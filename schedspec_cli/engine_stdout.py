"""While an implementation runs, what it writes to stdout goes to stderr.

A command's stdout carries its table, the part a CI reads. Engines write there too: when
SGLang 0.5.23 runs out of KV memory it prints its whole radix tree, node by node, from its
Rust extension, straight to file descriptor 1 and past Python's `sys.stdout`; a `verify` of
`real-sglang-dllm-under-pressure` printed about twenty such lines above its table.

Inside `implementation_stdout_to_stderr()` both ways of writing to stdout lead to stderr,
where the engine's log lines already go: `sys.stdout` is `sys.stderr`, and descriptor 1 is a
copy of descriptor 2. Both are flushed and put back on the way out, also after an error.
Where descriptor 1 or 2 cannot be duplicated (closed), only `sys.stdout` is redirected.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

_STDOUT_FD = 1
_STDERR_FD = 2


@contextlib.contextmanager
def implementation_stdout_to_stderr() -> Iterator[None]:
    """Send what is written to stdout, by Python or by native code, to stderr inside."""
    sys.stdout.flush()
    saved = _descriptor_1_sent_to_2()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, _STDOUT_FD)
            os.close(saved)


def _descriptor_1_sent_to_2() -> int | None:
    """Point descriptor 1 at what 2 is; return a copy of what 1 was, or None (nothing
    changed) when either cannot be duplicated."""
    try:
        saved = os.dup(_STDOUT_FD)
    except OSError:
        return None
    try:
        os.dup2(_STDERR_FD, _STDOUT_FD)
    except OSError:
        os.close(saved)
        return None
    return saved


__all__ = ["implementation_stdout_to_stderr"]
