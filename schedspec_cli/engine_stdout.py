"""While an implementation runs, what it writes to stdout goes to stderr.

A command's stdout carries its table, the part a CI reads. Engines write there too: when
SGLang 0.5.23 runs out of KV memory it prints its whole radix tree, node by node, from its
Rust extension, straight to file descriptor 1 and past Python's `sys.stdout`; a `verify` of
`real-sglang-dllm-under-pressure` printed about twenty such lines above its table.

Inside `implementation_stdout_to_stderr()` both ways of writing to stdout lead to stderr,
where the engine's log lines already go: `sys.stdout` is `sys.stderr`, and descriptor 1 is a
copy of descriptor 2. Python's streams and the C library's buffers (`printf`) are flushed on
the way in, so what was written before lands where it was meant to, and on the way out, so
what the implementation left buffered lands on stderr; then both are put back, also after an
error. Where descriptor 1 or 2 cannot be duplicated (closed) only `sys.stdout` is redirected;
with no `sys.stdout` or no `sys.stderr` at all (descriptor 1 or 2 closed at start) nothing is.

`verify` (the main job and `--impl` runs: loading the implementations, the runs, the known-fix
trials), `bench conformance` and `parity --impl` load and drive implementations inside it;
what schedspec prints comes after.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

_STDOUT_FD = 1
_STDERR_FD = 2


@contextlib.contextmanager
def implementation_stdout_to_stderr() -> Iterator[None]:
    """Send what is written to stdout, by Python or by native code, to stderr inside."""
    if sys.stdout is None or sys.stderr is None:  # nothing to keep apart
        yield
        return
    _flush_everything()
    saved = _descriptor_1_sent_to_2()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _flush_everything()
        if saved is not None:
            os.dup2(saved, _STDOUT_FD)
            os.close(saved)


def _flush_everything() -> None:
    """Python's streams (also `sys.__stdout__`, which code may hold on to) and every stdio
    stream of the C library (`fflush(NULL)`), where there is one to flush."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):  # closed, or a broken pipe
                stream.flush()
    with contextlib.suppress(OSError, AttributeError, TypeError):  # no C library to ask
        ctypes.CDLL(None).fflush(None)


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
