"""The FILE of `check-trace` as a path that can be read more than once.

The check reads its input in passes (the header, the field types, the replay), so a stream —
`-` for standard input, a pipe such as `/dev/stdin` under `producer | schedspec check-trace`,
or a shell's `<(...)` — is first copied to a temporary file, removed afterwards. Messages name
the input as the user gave it (`<stdin>` for `-`), never the temporary copy. A regular file, a
directory or a missing path is passed through untouched for the usual checks to name.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

from spec.errors import ConfigError

STDIN = "-"
_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class TraceSource:
    path: str  # what to open
    name: str  # what messages call it


def _is_stream(given: str) -> bool:
    if given == STDIN:
        return True
    try:
        mode = os.stat(given).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _copy(src: BinaryIO, dst: BinaryIO, name: str) -> None:
    """Copy chunk by chunk; stop at the first NUL byte, so that `- < /dev/zero` is refused
    as binary instead of filling the disk."""
    while chunk := src.read(_CHUNK):
        if b"\x00" in chunk:
            raise ConfigError("file", name, "a JSON Lines text file (it holds NUL bytes: binary?)")
        dst.write(chunk)


@contextmanager
def trace_source(given: str) -> Iterator[TraceSource]:
    """`given` as a re-readable `TraceSource` for the duration of the block."""
    if not _is_stream(given):
        yield TraceSource(given, given)
        return
    name = "<stdin>" if given == STDIN else given
    with tempfile.TemporaryDirectory(prefix="schedspec-trace-") as tmp:
        path = os.path.join(tmp, "trace.jsonl")
        with open(path, "wb") as dst:
            if given == STDIN:
                _copy(sys.stdin.buffer, dst, name)
            else:
                try:
                    with open(given, "rb") as src:
                        _copy(src, dst, name)
                except OSError as err:
                    raise ConfigError("file", name, f"a readable file ({err.strerror})") from None
        yield TraceSource(path, name)


__all__ = ["STDIN", "TraceSource", "trace_source"]
