"""The one reader of Vidur trace CSVs (standard library only).

Vidur's trace format (`data/processed_traces/*.csv` in microsoft/vidur; the trace request
generator's columns): a header with at least `arrived_at,num_prefill_tokens,num_decode_tokens`
(extra columns are ignored, names may carry spaces), one request per row, arrivals in seconds,
non-decreasing. As in Vidur, `num_decode_tokens` counts every output token, including the one
the prefill produces. Blank rows are skipped, and so is a UTF-8 byte-order mark before the
header (spreadsheets such as Excel write one).

Any malformed line raises `TraceRowError` naming the line (1-based, header = 1) and what was
wrong: an empty file, a header without the columns or without any request row after it, a line
the CSV reader refuses (a field over its size limit, a stray NUL), a missing field, a value that
is not a number or not finite, a negative value, a token count that is not a whole number >= 1,
an arrival before the previous row's.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from spec.errors import SchedSpecError

ARRIVED_AT = "arrived_at"
NUM_PREFILL_TOKENS = "num_prefill_tokens"
NUM_DECODE_TOKENS = "num_decode_tokens"
TRACE_COLUMNS = (ARRIVED_AT, NUM_PREFILL_TOKENS, NUM_DECODE_TOKENS)
_BOM = "\ufeff"  # the byte-order mark spreadsheets write first in a UTF-8 CSV


class TraceRowError(SchedSpecError, ValueError):
    """A trace CSV line is malformed: `line_no` (1-based, header = 1), `detail`, `source`."""

    def __init__(self, line_no: int, detail: str, source: str | None = None) -> None:
        self.line_no = line_no
        self.detail = detail
        self.source = source
        where = f"{source}:{line_no}" if source else f"trace line {line_no}"
        super().__init__(f"{where}: {detail}")


@dataclass(frozen=True, slots=True)
class VidurTrace:
    """The rows of a trace as three columns; request i is row i (file order)."""

    arrived_at: tuple[float, ...]
    num_prefill_tokens: tuple[int, ...]
    num_decode_tokens: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.arrived_at)


def _number(line: int, column: str, text: str, integer: bool, source: str | None) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceRowError(line, f"{column}={text!r} is not a number", source) from None
    if not math.isfinite(value):
        raise TraceRowError(line, f"{column}={text!r} is not finite", source)
    if value < 0:
        raise TraceRowError(line, f"{column}={text!r} is negative", source)
    if integer:
        if value != int(value):
            raise TraceRowError(line, f"{column}={text!r} is not a whole number of tokens", source)
        if value < 1:
            raise TraceRowError(line, f"{column}={text!r}: a request has at least 1 token", source)
    return value


def _csv_rows(reader: Any, source: str | None) -> Iterator[list[str]]:
    """The reader's rows; a line it refuses (`csv.Error`) raises `TraceRowError` naming it."""
    while True:
        try:
            row: list[str] = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise TraceRowError(reader.line_num, f"not CSV ({err})", source) from None
        yield row


def _without_bom(lines: Iterable[str]) -> Iterator[str]:
    """`lines`, the first without a leading byte-order mark (it is not part of a column name)."""
    first = True
    for line in lines:
        yield line.removeprefix(_BOM) if first else line
        first = False


def parse_vidur_trace_lines(lines: Iterable[str], source: str | None = None) -> VidurTrace:
    """Parse CSV lines (a text file object, `str.splitlines(keepends=True)`, ...); a byte-order
    mark before the header (text decoded as plain UTF-8) is dropped."""
    reader = csv.reader(_without_bom(lines))
    rows = _csv_rows(reader, source)
    header = next(rows, None)
    if header is None:
        raise TraceRowError(1, f"empty file: expected a header {','.join(TRACE_COLUMNS)}", source)
    cols = [h.strip() for h in header]
    missing = [c for c in TRACE_COLUMNS if c not in cols]
    if missing:
        raise TraceRowError(
            1, f"header lacks column(s) {', '.join(missing)}; need {list(TRACE_COLUMNS)}", source
        )
    i_t, i_p, i_d = (cols.index(c) for c in TRACE_COLUMNS)
    width = max(i_t, i_p, i_d) + 1
    times: list[float] = []
    pre: list[int] = []
    dec: list[int] = []
    last = 0.0
    for row in rows:
        line = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < width or not (row[i_t].strip() and row[i_p].strip() and row[i_d].strip()):
            raise TraceRowError(line, f"missing column(s): got {len(row)} field(s) {row!r}", source)
        t = _number(line, ARRIVED_AT, row[i_t].strip(), False, source)
        p = _number(line, NUM_PREFILL_TOKENS, row[i_p].strip(), True, source)
        d = _number(line, NUM_DECODE_TOKENS, row[i_d].strip(), True, source)
        if t < last:
            raise TraceRowError(
                line,
                f"{ARRIVED_AT}={t!r} is before the previous row's {last!r}: arrivals must be "
                f"sorted",
                source,
            )
        last = t
        times.append(t)
        pre.append(int(p))
        dec.append(int(d))
    if not times:
        raise TraceRowError(
            reader.line_num + 1, "no requests: the header is followed by no request row", source
        )
    return VidurTrace(tuple(times), tuple(pre), tuple(dec))


def parse_vidur_trace_text(text: str, source: str | None = None) -> VidurTrace:
    """`parse_vidur_trace_lines` on a whole trace held in a string."""
    return parse_vidur_trace_lines(text.splitlines(keepends=True), source)


# A row of this format is tens of characters; a longer line is not a trace (`/dev/zero`, a
# binary file) and is refused before it is held in memory whole.
MAX_LINE_CHARS = 1 << 20


def _bounded_lines(f: TextIO, source: str) -> Iterator[str]:
    """The file's lines; one longer than `MAX_LINE_CHARS` raises `TraceRowError`."""
    no = 0
    while line := f.readline(MAX_LINE_CHARS + 1):
        no += 1
        if len(line) > MAX_LINE_CHARS:
            raise TraceRowError(no, f"a line longer than {MAX_LINE_CHARS} characters", source)
        yield line


def read_vidur_trace_file(path: str | Path) -> VidurTrace:
    """Read a Vidur trace CSV file; errors name the file and the line. A leading UTF-8
    byte-order mark (as Excel writes one) is dropped."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        return parse_vidur_trace_lines(_bounded_lines(f, str(path)), str(path))


__all__ = [
    "ARRIVED_AT",
    "NUM_DECODE_TOKENS",
    "NUM_PREFILL_TOKENS",
    "TRACE_COLUMNS",
    "TraceRowError",
    "VidurTrace",
    "parse_vidur_trace_lines",
    "parse_vidur_trace_text",
    "read_vidur_trace_file",
]
