"""The FILE of `check-trace`, read once, front to back, as it arrives.

FILE is `-` (standard input) or a path: a regular file, a named pipe, `/dev/stdin` under
`producer | schedspec check-trace /dev/stdin`, a shell's `<(...)`. Nothing is copied and
nothing is read twice, so a live engine piping its events gets the verdict as soon as the
violating line arrives (the check stops there), and a stream of any length is checked in
bounded memory without touching the disk.

Lines are JSON Lines lines: they end at a newline byte (a carriage return before it is JSON
whitespace). Each line is checked when it is read, so a problem is reported at its own line and
in file order, whatever the source: a NUL byte (binary input: `- < /dev/zero` stops at the
first line), a line longer than `MAX_LINE_BYTES`, bytes that are not UTF-8. Messages name the
input as the user gave it (`<stdin>` for `-`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from spec.errors import ConfigError
from spec.input_file import MAX_INPUT_BYTES

STDIN = "-"
# The longest line taken: a forward of a few hundred thousand rows. Without a bound a stream
# with no newline (`/dev/urandom`, a runaway producer) would be read into memory whole.
MAX_LINE_BYTES = MAX_INPUT_BYTES


class TraceLines:
    """The text lines of one trace input, each checked and decoded as it is read.

    Iterate once; raises `ConfigError` naming `name:line` for a line that is binary, too long
    or not UTF-8, or for a read that fails.
    """

    def __init__(self, raw: BinaryIO, name: str) -> None:
        self._raw = raw
        self.name = name

    def __iter__(self) -> Iterator[str]:
        readline = self._raw.readline
        limit = MAX_LINE_BYTES + 1  # a line of exactly the bound still has room for its newline
        line_no = 0
        while True:
            line_no += 1
            where = f"{self.name}:{line_no}"
            try:
                raw = readline(limit)
            except OSError as err:
                raise ConfigError("file", where, f"a readable input ({err.strerror})") from None
            if not raw:
                return
            if b"\x00" in raw:
                raise ConfigError(
                    "file", where, "a JSON Lines text file (this line holds NUL bytes: binary?)"
                )
            if len(raw) == limit and not raw.endswith(b"\n"):
                raise ConfigError(
                    "file",
                    where,
                    f"lines of at most {MAX_LINE_BYTES / 2**20:g} MiB, each ending in a newline "
                    "(this one is longer)",
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError("file", where, "UTF-8 text") from None
            yield text


@contextmanager
def open_trace(given: str) -> Iterator[TraceLines]:
    """`given` (`-` or a path) as `TraceLines` for the duration of the block; a path that
    cannot be opened is a `ConfigError`. Standard input is read, not closed."""
    if given == STDIN:
        if sys.stdin is None or sys.stdin.closed:  # started with standard input closed
            raise ConfigError("file", given, "a path, or '-' with standard input open")
        yield TraceLines(sys.stdin.buffer, "<stdin>")
        return
    if Path(given).is_dir():
        raise ConfigError("file", given, "a file (this is a directory)")
    try:
        fh = open(given, "rb")  # noqa: SIM115 - closed below, after the block
    except OSError as err:
        raise ConfigError("file", given, f"a readable file ({err.strerror})") from None
    with fh:
        yield TraceLines(fh, given)


__all__ = ["MAX_LINE_BYTES", "STDIN", "TraceLines", "open_trace"]
