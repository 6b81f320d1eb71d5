"""Arrivals: Vidur trace CSVs and synthetic generators (Poisson, bursts, fixed interval).

A `Workload` is three parallel numpy arrays (arrival time in seconds, prefill tokens, decode
tokens), sorted by arrival; request `i` is row `i`. Arrays rather than objects so a million
requests cost a few tens of MB and load in well under a second.

Vidur's trace format is read by `spec.ar.vidur_trace` (the one reader, shared with
`properties.ar.formats`): a header with at least `arrived_at,num_prefill_tokens,
num_decode_tokens`, arrivals in seconds, non-decreasing. As in Vidur, `num_decode_tokens` counts
every output token including the one the prefill produces.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from reference.sim.bounds import (
    CLOCK_RESOLUTION_BITS,
    MAX_REQUEST_TOKENS,
    check_rate,
    latest_arrival,
)
from reference.sim.errors import SimConfigError, TraceError, reason_of
from spec.ar.vidur_trace import (
    NUM_DECODE_TOKENS,
    NUM_PREFILL_TOKENS,
    TRACE_COLUMNS,
    TraceRowError,
    read_vidur_trace_file,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Workload:
    """Requests as parallel arrays sorted by arrival (module doc), checked when built. `source`
    is the trace file the requests were read from (None: generated), so an error about request
    `i` can name its line (`where`)."""

    arrived_at: FloatArray
    prefill: IntArray
    decode: IntArray
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        n = len(self.arrived_at)
        if len(self.prefill) != n or len(self.decode) != n:
            raise SimConfigError(
                "workload", (n, len(self.prefill), len(self.decode)), "arrays of equal length"
            )
        if n and (np.any(np.diff(self.arrived_at) < 0) or self.arrived_at[0] < 0):
            raise SimConfigError("arrived_at", "unsorted", "non-negative, non-decreasing times")
        if n and (self.prefill.min() < 1 or self.decode.min() < 1):
            raise SimConfigError("tokens", "< 1", "every request has >= 1 prefill and decode token")

    def __len__(self) -> int:
        return len(self.arrived_at)

    @property
    def total_tokens(self) -> IntArray:
        """Prefill + decode tokens per request."""
        return self.prefill + self.decode

    def head(self, n: int) -> Workload:
        """The first `n` requests."""
        return Workload(self.arrived_at[:n], self.prefill[:n], self.decode[:n], self.source)

    def where(self, i: int) -> str | None:
        """Where request `i` came from: 'FILE:LINE' for a trace (its row's line, read again
        from the file), None for a generated workload."""
        if self.source is None or not 0 <= i < len(self):
            return None
        line = trace_line(self.source, i)
        return f"{self.source}:{line}" if line is not None else self.source

    def check_clock(self, min_step: float, step: str) -> None:
        """Refuse arrivals later than `bounds.latest_arrival(min_step)`, where the float64 clock
        no longer resolves the run's smallest time step (`step` says what it is, for the
        message): `TraceError` naming the trace's file and line, or for a generated workload
        `SimConfigError` naming the generator's flags."""
        latest = latest_arrival(min_step)
        if not len(self) or self.arrived_at[-1] <= latest:
            return
        i = int(np.argmax(self.arrived_at > latest))
        t = float(self.arrived_at[i])
        why = (
            f"arrived_at={t:g} s is past {latest:.4g} s, the latest arrival at which the "
            f"simulated clock (float64 seconds) still resolves {step}, {min_step:.3g} s, to about "
            f"a millionth (2**-{CLOCK_RESOLUTION_BITS}) of it; at {t:g} s it resolves only "
            f"{math.ulp(t):.3g} s"
        )
        if self.source is not None:
            raise TraceError(
                self.source,
                trace_line(self.source, i) or 0,
                f"{why}; valid: arrival times up to {latest:.4g} s (give seconds from the "
                f"trace's start)",
            )
        raise SimConfigError(
            "arrived_at",
            t,
            f"request #{i}: {why}; valid: arrivals up to {latest:.4g} s (a higher --qps or fewer "
            f"--requests)",
        )

    def to_csv(self, path: Path) -> None:
        """Write a Vidur trace CSV (`TRACE_COLUMNS`; arrival times as `repr`, so `read_trace` reads
        back the same arrays)."""
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(TRACE_COLUMNS)
            for t, p, d in zip(self.arrived_at, self.prefill, self.decode, strict=True):
                w.writerow((repr(float(t)), int(p), int(d)))


def read_trace(path: str | Path) -> Workload:
    """Read a Vidur trace CSV (`spec.ar.vidur_trace`); a malformed row raises `TraceError`
    naming the file and its line, and so does a token count past `MAX_REQUEST_TOKENS`; a file
    that cannot be read as UTF-8 text raises `SimConfigError`."""
    try:
        t = read_vidur_trace_file(path)
    except TraceRowError as err:
        raise TraceError(str(path), err.line_no, err.detail) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SimConfigError(
            "trace_csv", str(path), f"a readable UTF-8 Vidur trace CSV ({reason_of(err)})"
        ) from None
    for column, counts in (
        (NUM_PREFILL_TOKENS, t.num_prefill_tokens),
        (NUM_DECODE_TOKENS, t.num_decode_tokens),
    ):
        i = next((i for i, c in enumerate(counts) if c > MAX_REQUEST_TOKENS), None)
        if i is not None:
            raise TraceError(
                str(path),
                trace_line(path, i) or 0,
                f"{column}={_count_text(counts[i])} is more tokens than any KV pool the "
                f"simulator takes holds; valid: 1 to {MAX_REQUEST_TOKENS} tokens",
            )
    return Workload(
        np.array(t.arrived_at, dtype=np.float64),
        np.array(t.num_prefill_tokens, dtype=np.int64),
        np.array(t.num_decode_tokens, dtype=np.int64),
        str(path),
    )


def _count_text(count: int) -> str:
    """A count as the trace reader holds it: exact up to 2**53, else read through a float (so
    `99999999999999999999` is `1e+20`)."""
    return str(count) if count <= 2**53 else f"{float(count):.6g}"


def trace_line(path: str | Path, index: int) -> int | None:
    """The line (1-based, header = 1) of request row `index` in a trace CSV, skipping blank rows
    as `spec.ar.vidur_trace` does; None if the file no longer has that row."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            next(reader, None)  # the header
            k = 0
            for row in reader:
                if not row or all(not c.strip() for c in row):
                    continue
                if k == index:
                    return reader.line_num
                k += 1
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return None


@dataclass(frozen=True, slots=True)
class Lengths:
    """Token lengths: fixed (`low == high`) or uniform in [low, high]."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str | int, field: str = "lengths") -> Lengths:
        """'128' or '64-512'; anything else (a dangling '64-', a zero) raises `SimConfigError`
        naming `field` (the flag the text came from)."""
        s = str(text)
        try:
            lo, sep, hi = s.partition("-")
            a, b = int(lo), int(hi if sep else lo)
        except ValueError:
            raise SimConfigError(field, s, "'N' or 'LOW-HIGH' with integers >= 1") from None
        if not 1 <= a <= b <= MAX_REQUEST_TOKENS:
            raise SimConfigError(
                field, s, f"'N' or 'LOW-HIGH' with 1 <= LOW <= HIGH <= {MAX_REQUEST_TOKENS}"
            )
        return cls(a, b)

    def draw(self, rng: np.random.Generator, n: int) -> IntArray:
        """`n` lengths: all `low` when fixed (nothing drawn from `rng`), else uniform integers in
        [low, high]."""
        if self.low == self.high:
            return np.full(n, self.low, dtype=np.int64)
        return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise SimConfigError("num_requests", n, "an integer >= 0")


def _check_interval(interval: float) -> None:
    if not (interval > 0 and math.isfinite(interval)):
        raise SimConfigError("interval", interval, "a finite number of seconds > 0")


def poisson(n: int, qps: float, prefill: Lengths, decode: Lengths, seed: int = 0) -> Workload:
    """Poisson arrivals at `qps` requests per second."""
    _check_n(n)
    check_rate("qps", qps)
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / qps, size=n))
    return Workload(times, prefill.draw(rng, n), decode.draw(rng, n))


def bursts(
    n: int, burst_size: int, interval: float, prefill: Lengths, decode: Lengths, seed: int = 0
) -> Workload:
    """`burst_size` requests arrive together every `interval` seconds."""
    _check_n(n)
    _check_interval(interval)
    if burst_size < 1:
        raise SimConfigError("burst_size", burst_size, "an integer >= 1")
    rng = np.random.default_rng(seed)
    times = (np.arange(n) // burst_size).astype(np.float64) * interval
    return Workload(times, prefill.draw(rng, n), decode.draw(rng, n))


def fixed(n: int, interval: float, prefill: Lengths, decode: Lengths, seed: int = 0) -> Workload:
    """One request every `interval` seconds (interval 0 is not allowed: use bursts)."""
    _check_n(n)
    _check_interval(interval)
    rng = np.random.default_rng(seed)
    times = np.arange(n, dtype=np.float64) * interval
    return Workload(times, prefill.draw(rng, n), decode.draw(rng, n))
