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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from reference.sim.bounds import check_rate
from reference.sim.errors import SimConfigError, TraceError, reason_of
from spec.ar.vidur_trace import TRACE_COLUMNS, TraceRowError, read_vidur_trace_file

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Workload:
    """Requests as parallel arrays sorted by arrival (module doc), checked when built."""

    arrived_at: FloatArray
    prefill: IntArray
    decode: IntArray

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
        return Workload(self.arrived_at[:n], self.prefill[:n], self.decode[:n])

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
    naming the file and its line, a file that cannot be read as UTF-8 text `SimConfigError`."""
    try:
        t = read_vidur_trace_file(path)
    except TraceRowError as err:
        raise TraceError(str(path), err.line_no, err.detail) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SimConfigError(
            "trace_csv", str(path), f"a readable UTF-8 Vidur trace CSV ({reason_of(err)})"
        ) from None
    return Workload(
        np.array(t.arrived_at, dtype=np.float64),
        np.array(t.num_prefill_tokens, dtype=np.int64),
        np.array(t.num_decode_tokens, dtype=np.int64),
    )


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
        if a < 1 or b < a:
            raise SimConfigError(field, s, "'N' or 'LOW-HIGH' with 1 <= LOW <= HIGH")
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
