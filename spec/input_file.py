"""Reading a file a user names as input, bounded.

A configuration, parity report, accept list, calibration table or rounds report is kilobytes.
A path that names something else (`/dev/zero`, a multi-GiB log given by mistake) must end in one
line, not in a `MemoryError` traceback after exhausting the machine's memory. The readers here
read at most `MAX_INPUT_BYTES` and raise `InputTooLarge` beyond it; it is an `OSError` (errno
`EFBIG`), so every reader's "cannot be read" path and the CLI's top-level handler already
report it in one line.
"""

from __future__ import annotations

import errno
from pathlib import Path

MAX_INPUT_BYTES = 64 * 2**20


class InputTooLarge(OSError):
    """An input file is larger than the reader takes."""


def read_input_bytes(path: str | Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The file's bytes; `InputTooLarge` when it holds more than `limit`."""
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise InputTooLarge(
            errno.EFBIG,
            f"larger than {limit / 2**20:g} MiB, more than any input of this kind holds",
            str(path),
        )
    return data


def read_input_text(path: str | Path, limit: int = MAX_INPUT_BYTES) -> str:
    """The file as UTF-8 text (`UnicodeDecodeError` when it is not), bounded like
    `read_input_bytes`."""
    return read_input_bytes(path, limit).decode("utf-8")


__all__ = ["MAX_INPUT_BYTES", "InputTooLarge", "read_input_bytes", "read_input_text"]
