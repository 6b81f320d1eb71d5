"""The dLLM time model calibrated from the engine's measured rounds (`simulate dllm
--calibration FILE`).

A calibration table is JSON (`scripts/calibrate_dllm.py` writes one from the engine benchmark):

    {
      "schema": "schedspec.dllm-calibration/3",
      "device": "cpu",                      # where it was measured
      "source": "...",                      # the command that measured it
      "block_size": 8, "requests": 128, "max_new_tokens": 32,   # the measured workload
      "repeats": 5,                         # new in /2: runs summed into each row
      "rows": [                             # one per (mode, max_running), repeats summed
        {"mode": "sync" | "fdfo" | "fdfo+reuse" | "fdfo+reuse+reloop",
         "max_running": 4,
         "forwards": 6180, "row_forwards": 24560, "rounds": 810, "tokens": 13920,
         "row_rounds": 3150,                # new in /3: rows (running requests) summed over
                                            # rounds
         "block_allocations": 2100,         # new in /3: block KV allocations (new blocks and
                                            # carried blocks allocated again)
         "seconds": 20.1, "forward_seconds": 18.4,
         "seconds_per_forward": 0.00298,    # forward_seconds / forwards
         "rows_per_forward": 3.97,          # row_forwards / forwards
         "seconds_per_round": 0.0021}       # (seconds - forward_seconds) / rounds
      ],
      "measured_ratios": {"fdfo/sync": {"4": 1.633}, ...},  # median over repeats of the
                                            # paired (same repeat) ratios, as the benchmark's
      "paired_range": {"fdfo/sync": {"4": [1.39, 2.08]}, ...},  # new in /2: lowest, highest
      "profiles": [                         # new in /2: what the model did on each prompt
        {"prompt_len": 15, "forwards": [2, 2, 6, 9, 6], "tokens": 32}, ...
      ]
    }

`profiles` holds one `reference.sim.dllm_profile.RequestProfile` per prompt of the benchmark's
prompt set, in its order (the benchmark cycles them to `requests` requests): the prompt's length,
the forwards each output block took until done (final-KV forward included; EOS finishing shows
as fewer blocks) and the output tokens counted. With them the simulator replays the measured
work (sync's lock-step forwards included) instead of drawing rounds per block i.i.d.; an empty
list falls back to the histogram draws. Schemas /1 (no profiles) and /2 (no row_rounds and
block_allocations) are no longer read: re-run `scripts/calibrate_dllm.py`, which needs an engine
benchmark JSON that records both counts per run (`from_benches` refuses one without them).

Two time models are built from a table (`simulate dllm --time-model`):

- "shared" (the default, the prediction): one model for every mode, fitted to all rows' total
  seconds (`fit_shared`: non-negative least squares of the relative errors):

      seconds = per_forward * forwards + per_row * row_forwards + per_round * rounds
                + per_row_round * row_rounds + per_alloc * block_allocations   (`SharedTime`)

  A forward of r rows costs per_forward + per_row * r, a round per_round plus per_row_round for
  every row it holds (the scheduler's per-request work: batching, events, commits), and every
  block KV allocation per_alloc. The simulator counts the same five quantities for the run it
  simulates (allocations are the scheduler's `KvAllocated` events, so FDFO without in-place
  reuse pays per_alloc again for every carried block, every round), so the difference between
  the modes comes from the simulated work alone, the reuse gain included.
- "per-mode" (a replay check): each mode's own seconds per forward interpolated linearly in rows
  per forward (extrapolated from the end points, never below 0) and its own non-forward seconds
  per round interpolated in max_running. Once the simulated work equals the measured work this
  reproduces the pooled measured throughputs by construction, so it checks the work, not the
  time model.

The shared model charges per_alloc as the simulator's `alloc_cost` and per_row_round as its
`row_round_cost` (no per-round allocation cost: the fit has no such term); the per-mode one
charges neither (they are inside each mode's measured figures).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reference.sim.dllm_profile import ProfileWorkload, RequestProfile
from reference.sim.errors import SimConfigError, SimError
from spec.input_file import read_input_text
from spec.json_text import parse_json

SCHEMA = "schedspec.dllm-calibration/3"
OLD_SCHEMAS = ("schedspec.dllm-calibration/1", "schedspec.dllm-calibration/2")
MODES = ("sync", "fdfo", "fdfo+reuse", "fdfo+reuse+reloop")


def _pair(value: Any) -> tuple[float, float]:
    """A JSON [low, high] pair (ValueError otherwise: the loader names the field)."""
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"{value!r} is not a [low, high] pair")
    return float(value[0]), float(value[1])


def _positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


class CalibrationError(SimError, ValueError):
    """A calibration table that cannot be used: names the file and what is wrong."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        super().__init__(f"calibration {path}: {detail}")


def read_json(path: str | Path) -> Any:
    """The JSON value in the file at `path` (a table or a benchmark). A file that cannot be read,
    is not UTF-8 or not JSON raises `CalibrationError` naming it."""
    try:
        return parse_json(read_input_text(path))
    except OSError as err:
        raise CalibrationError(str(path), f"cannot be read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise CalibrationError(str(path), f"not UTF-8 text (byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise CalibrationError(str(path), f"not JSON (line {err.lineno}: {err.msg})") from None


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """One (mode, max_running) row: the benchmark's counts and seconds, summed over repeats."""

    mode: str
    max_running: int
    forwards: int
    row_forwards: int
    rounds: int
    tokens: int
    seconds: float
    forward_seconds: float
    row_rounds: int  # rows (running requests) summed over rounds
    block_allocations: int  # block KV allocations (new blocks, re-allocated carries)

    @property
    def seconds_per_forward(self) -> float:
        """Mean seconds of one forward: `forward_seconds / forwards`."""
        return self.forward_seconds / self.forwards

    @property
    def rows_per_forward(self) -> float:
        """Mean rows (running requests) per forward: `row_forwards / forwards`."""
        return self.row_forwards / self.forwards

    @property
    def seconds_per_round(self) -> float:
        """Mean non-forward seconds per round: `max(0, seconds - forward_seconds) / rounds`."""
        return max(0.0, self.seconds - self.forward_seconds) / self.rounds

    def to_json(self) -> dict[str, Any]:
        """The row as a table's JSON row, with the three derived figures; floats rounded."""
        return {
            "mode": self.mode,
            "max_running": self.max_running,
            "forwards": self.forwards,
            "row_forwards": self.row_forwards,
            "rounds": self.rounds,
            "tokens": self.tokens,
            "row_rounds": self.row_rounds,
            "block_allocations": self.block_allocations,
            "seconds": round(self.seconds, 6),
            "forward_seconds": round(self.forward_seconds, 6),
            "seconds_per_forward": round(self.seconds_per_forward, 9),
            "rows_per_forward": round(self.rows_per_forward, 6),
            "seconds_per_round": round(self.seconds_per_round, 9),
        }


def _paired_ratios(
    runs: list[tuple[int, dict[str, Any]]], names: list[str]
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, tuple[float, float]]]]:
    """Per 'num/den' name and max_running: the median and the range over repeats of the
    throughput ratio of num's and den's runs in the same repeat (of the same benchmark)."""
    by: dict[tuple[str, int, int, int], dict[str, Any]] = {
        (str(r["mode"]), int(r["max_running"]), b, int(r["repeat"])): r for b, r in runs
    }
    median: dict[str, dict[str, float]] = {}
    spread: dict[str, dict[str, tuple[float, float]]] = {}
    for name in names:
        num, _, den = name.partition("/")
        pairs: dict[int, list[float]] = {}
        for (mode, k, b, rep), r in by.items():
            d = by.get((den, k, b, rep))
            if mode == num and d is not None:
                x = (r["tokens"] / r["seconds"]) / (d["tokens"] / d["seconds"])
                pairs.setdefault(k, []).append(x)
        median[name] = {str(k): round(statistics.median(v), 3) for k, v in sorted(pairs.items())}
        spread[name] = {
            str(k): (round(min(v), 3), round(max(v), 3)) for k, v in sorted(pairs.items())
        }
    return median, spread


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise linear through sorted points, extrapolated from the end segments."""
    if len(points) == 1:
        return points[0][1]
    for i in range(len(points) - 1):
        (x0, y0), (x1, y1) = points[i], points[i + 1]
        if x <= x1 or i == len(points) - 2:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]  # pragma: no cover - the loop always returns


@dataclass(frozen=True, slots=True)
class CalibratedForward:
    """An `ExecModel` for dLLM forwards: seconds by rows (prefill_tokens / block_size)."""

    block_size: int
    points: tuple[tuple[float, float], ...]  # (rows per forward, seconds per forward)

    def batch_time(
        self, prefill_tokens: int, decode_tokens: int, kv_tokens: int = 0, attn_pairs: int = 0
    ) -> float:
        """Seconds interpolated at (prefill + decode tokens) / `block_size` rows (fractional rows
        too), extrapolated from the end segments, never below 0; `kv_tokens` and `attn_pairs` are
        not read."""
        rows = (prefill_tokens + decode_tokens) / self.block_size
        return max(0.0, _interp(list(self.points), rows))


# The counts the shared model prices, in the order of SharedTime's coefficients.
SHARED_COUNTS = ("forwards", "row_forwards", "rounds", "row_rounds", "block_allocations")


@dataclass(frozen=True, slots=True)
class SharedTime:
    """seconds = per_forward * forwards + per_row * row_forwards + per_round * rounds
    + per_row_round * row_rounds + per_alloc * block_allocations (every coefficient >= 0)."""

    per_forward: float
    per_row: float
    per_round: float
    per_row_round: float
    per_alloc: float

    def forward_model(self, block_size: int) -> CalibratedForward:
        """The forward part as an `ExecModel`: per_forward + per_row * rows, a row being
        `block_size` tokens."""
        one = self.per_forward + self.per_row
        return CalibratedForward(block_size, ((0.0, self.per_forward), (1.0, one)))

    def seconds(self, row: CalibrationRow) -> float:
        """The model's total seconds for `row`'s five counts (what `fit_shared` fits to
        `row.seconds`)."""
        return float(
            self.per_forward * row.forwards
            + self.per_row * row.row_forwards
            + self.per_round * row.rounds
            + self.per_row_round * row.row_rounds
            + self.per_alloc * row.block_allocations
        )


def fit_shared(rows: tuple[CalibrationRow, ...], source: str = "rows") -> SharedTime:
    """Non-negative least squares of every row's total seconds on its five counts, in relative
    terms: each row is divided by its measured seconds, so the sum of squared relative errors is
    minimised (a 1-seat row takes several times the seconds of a 16-seat row; unweighted, the
    fit would neglect the large seat counts, and the predicted ratios are per seat count).

    The weighted columns are scaled to unit norm (the counts differ by orders of magnitude);
    then every subset of the columns is fitted by ordinary least squares and, among the subsets
    whose coefficients are all >= 0, the one with the smallest residual wins (the others'
    coefficients are 0). With five columns that is 31 small solves, and it is the exact
    non-negative least-squares optimum: that optimum is the unconstrained fit on its own
    non-zero columns.

    Raises CalibrationError(source, ...) when a row's seconds are not > 0, or when the rows do
    not determine the five coefficients (the count matrix has rank < 5: too few rows, or counts
    proportional to each other, e.g. a table without FDFO+reuse rows, where every block
    allocation is a row-round)."""
    names = SHARED_COUNTS
    if any(not r.seconds > 0 for r in rows):
        raise CalibrationError(source, "every row's seconds must be > 0")
    weights = np.array([1.0 / r.seconds for r in rows])
    a = np.array([[float(getattr(r, n)) for n in names] for r in rows]).reshape(
        len(rows), len(names)
    ) * weights.reshape(len(rows), 1)
    y = np.ones(len(rows))
    norms = np.linalg.norm(a, axis=0) if len(rows) else np.zeros(len(names))
    rank = int(np.linalg.matrix_rank(a / np.where(norms > 0, norms, 1.0))) if len(rows) else 0
    if rank < len(names):
        raise CalibrationError(
            source,
            f"the shared time model's {len(names)} costs ({', '.join(names)}) are not "
            f"determined by {len(rows)} rows (rank {rank}): measure sync, fdfo and fdfo+reuse "
            "at two or more max_running values",
        )
    scaled = a / norms
    best: tuple[float, list[float]] | None = None
    for mask in range(1, 1 << len(names)):
        cols = [j for j in range(len(names)) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(scaled[:, cols], y, rcond=None)
        if min(coef) < 0:
            continue
        resid = float(np.sum((scaled[:, cols] @ coef - y) ** 2))
        if best is None or resid < best[0]:
            full = [0.0] * len(names)
            for j, c in zip(cols, coef, strict=True):
                full[j] = float(c) / float(norms[j])
            best = (resid, full)
    if best is None:  # unreachable: a single non-zero column of counts >= 0 fits with c > 0
        raise CalibrationError(source, "no non-negative costs fit the rows")
    return SharedTime(*best[1])


# a benchmark run's fields summed over repeats into a CalibrationRow, in its field order
_SUMMED = (
    "forwards",
    "row_forwards",
    "rounds",
    "tokens",
    "seconds",
    "forward_seconds",
    "row_rounds",
    "block_allocations",
)


@dataclass(frozen=True)
class Calibration:
    """A calibration table (the module doc's JSON); `load` reads and checks one."""

    device: str
    source: str
    block_size: int
    requests: int
    max_new_tokens: int
    rows: tuple[CalibrationRow, ...]
    measured_ratios: dict[str, dict[str, float]]
    profiles: tuple[RequestProfile, ...] = ()
    repeats: int = 1
    # per ratio and max_running: the lowest and highest paired ratio over the repeats
    paired_range: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    path: str = ""  # the file it was loaded from (named in errors), "" when built in memory

    def pooled_ratio(self, num: str, den: str, max_running: int) -> float | None:
        """Throughput num/den over every repeat at once: (tokens / seconds) of the summed
        runs. Unlike the median of paired ratios it weighs every repeat."""
        a, b = self.row(num, max_running), self.row(den, max_running)
        if a is None or b is None:
            return None
        return (a.tokens / a.seconds) / (b.tokens / b.seconds)

    def workload(self) -> ProfileWorkload | None:
        """The measured request profiles (None: the table has none)."""
        return ProfileWorkload(self.profiles) if self.profiles else None

    def shared_time(self) -> SharedTime:
        """The shared time model fitted to every row (`fit_shared`)."""
        return fit_shared(self.rows, self.path or self.source)

    def row(self, mode: str, max_running: int) -> CalibrationRow | None:
        """The row of `mode` measured at `max_running`, None if there is none; `CalibrationError`
        (from `of`) when the table has no row of `mode` at all."""
        return next((r for r in self.of(mode) if r.max_running == max_running), None)

    def of(self, mode: str) -> list[CalibrationRow]:
        """Every row of `mode`, by max_running; `CalibrationError` naming the modes the table has
        when there is none."""
        rows = sorted((r for r in self.rows if r.mode == mode), key=lambda r: r.max_running)
        if not rows:
            have = sorted({r.mode for r in self.rows})
            raise CalibrationError(
                self.path or self.source, f"no rows for mode {mode!r} (has {have})"
            )
        return rows

    def forward_model(self, mode: str) -> CalibratedForward:
        """The per-mode forward model of `mode`: its rows' seconds per forward interpolated in rows
        per forward (`CalibratedForward`)."""
        pts = sorted({(r.rows_per_forward, r.seconds_per_forward) for r in self.of(mode)})
        return CalibratedForward(self.block_size, tuple(pts))

    def round_overhead(self, mode: str, max_running: int) -> float:
        """The non-forward seconds per round of `mode` at `max_running`: its rows' figures
        interpolated linearly in max_running (extrapolated from the end segments), never below 0."""
        pts = [(float(r.max_running), r.seconds_per_round) for r in self.of(mode)]
        return max(0.0, _interp(pts, float(max_running)))

    def seats(self) -> tuple[int, ...]:
        """Every max_running value the rows measure, ascending."""
        return tuple(sorted({r.max_running for r in self.rows}))

    def to_json(self) -> dict[str, Any]:
        """The table as JSON of schema `SCHEMA`, as `load` reads it (`path` is not written)."""
        return {
            "schema": SCHEMA,
            "device": self.device,
            "source": self.source,
            "block_size": self.block_size,
            "requests": self.requests,
            "max_new_tokens": self.max_new_tokens,
            "repeats": self.repeats,
            "rows": [r.to_json() for r in self.rows],
            "measured_ratios": self.measured_ratios,
            "paired_range": {
                k: {kk: list(vv) for kk, vv in v.items()} for k, v in self.paired_range.items()
            },
            "profiles": [p.to_json() for p in self.profiles],
        }

    @staticmethod
    def check_bench(bench: Any, name: str) -> None:
        """Raise CalibrationError(name, ...) unless every run of the benchmark JSON records
        row_rounds and block_allocations (benchmarks written before the engine counted them
        do not: the table's shared time model needs both)."""
        runs = bench.get("runs") if isinstance(bench, dict) else None
        if not isinstance(runs, list) or not runs:
            raise CalibrationError(name, "not an engine benchmark JSON (no runs)")
        for run in runs:
            if not isinstance(run, dict) or any(
                not isinstance(run.get(f), int) or run[f] < 1
                for f in ("row_rounds", "block_allocations")
            ):
                raise CalibrationError(
                    name,
                    "the benchmark's runs have no row_rounds / block_allocations (written "
                    "before the engine counted them): re-run `schedspec bench engine --json`",
                )

    @classmethod
    def from_bench(
        cls,
        bench: dict[str, Any],
        source: str,
        profiles: tuple[RequestProfile, ...] = (),
    ) -> Calibration:
        """From `schedspec bench engine --json` output and the measured profiles of its
        prompts."""
        return cls.from_benches([bench], source, profiles)

    @classmethod
    def from_benches(
        cls,
        benches: list[dict[str, Any]],
        source: str,
        profiles: tuple[RequestProfile, ...] = (),
    ) -> Calibration:
        """From one or more engine benchmark JSONs of the same workload: every repeat's run
        summed per (mode, max_running); the measured ratios are the median over all repeats
        of the paired (same repeat) ratios, as the benchmark computes them. Every run must
        record row_rounds and block_allocations (`check_bench`). Only the modes of `MODES`
        are calibrated: the runs and ratios of any other mode a benchmark served (`bench
        engine --rows-released`) are left out."""
        for bench in benches:
            cls.check_bench(bench, source)
        try:
            s = benches[0]["settings"]
            runs = [
                (i, run)
                for i, bench in enumerate(benches)
                for run in bench["runs"]
                if run["mode"] in MODES
            ]
            for bench in benches[1:]:
                other = bench["settings"]
                for f in ("block_size", "requests", "max_new_tokens", "algorithm"):
                    if other[f] != s[f]:
                        raise CalibrationError(source, f"benchmarks differ in {f}")
            sums: dict[tuple[str, int], list[float]] = {}
            for _, run in runs:
                key = (str(run["mode"]), int(run["max_running"]))
                acc = sums.setdefault(key, [0.0] * len(_SUMMED))
                for i, f in enumerate(_SUMMED):
                    acc[i] += float(run[f])
            rows = tuple(
                CalibrationRow(
                    m,
                    k,
                    int(a[0]),
                    int(a[1]),
                    int(a[2]),
                    int(a[3]),
                    a[4],
                    a[5],
                    int(a[6]),
                    int(a[7]),
                )
                for (m, k), a in sorted(sums.items(), key=lambda kv: (kv[0][1], kv[0][0]))
            )
            names = [
                str(n)
                for n in benches[0].get("ratios", {})
                if all(mode in MODES for mode in str(n).split("/"))
            ]
            median, spread = _paired_ratios(runs, names)
            cal = cls(
                str(benches[0].get("device", "?")),
                source,
                int(s["block_size"]),
                int(s["requests"]),
                int(s["max_new_tokens"]),
                rows,
                median,
                profiles,
                sum(int(b["settings"].get("repeats", 1)) for b in benches),
                spread,
            )
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as err:
            raise CalibrationError(source, f"not an engine benchmark JSON ({err!r})") from None
        cal.check(source)
        return cal

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """Read and check the table at `path`: an `OSError` reading it, text that is not JSON, an
        old or another schema, a missing or malformed field, or a value out of range (block size,
        counts, seconds, ratios, profiles) raises `CalibrationError` naming the file."""
        data = read_json(path)
        if isinstance(data, dict) and data.get("schema") in OLD_SCHEMAS:
            raise CalibrationError(
                str(path),
                f"schema {data['schema']!r} is no longer read (the table must have row_rounds "
                f"and block_allocations, schema {SCHEMA!r}): re-run scripts/calibrate_dllm.py",
            )
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise CalibrationError(str(path), f"schema must be {SCHEMA!r}")
        try:
            rows = tuple(
                CalibrationRow(
                    str(r["mode"]),
                    int(r["max_running"]),
                    int(r["forwards"]),
                    int(r["row_forwards"]),
                    int(r["rounds"]),
                    int(r["tokens"]),
                    float(r["seconds"]),
                    float(r["forward_seconds"]),
                    int(r["row_rounds"]),
                    int(r["block_allocations"]),
                )
                for r in data["rows"]
            )
            cal = cls(
                str(data["device"]),
                str(data.get("source", path)),
                int(data["block_size"]),
                int(data["requests"]),
                int(data["max_new_tokens"]),
                rows,
                {
                    k: {kk: float(vv) for kk, vv in v.items()}
                    for k, v in data["measured_ratios"].items()
                },
                tuple(RequestProfile.from_json(p) for p in data["profiles"]),
                int(data["repeats"]),
                {
                    k: {kk: _pair(vv) for kk, vv in v.items()}
                    for k, v in data["paired_range"].items()
                },
                str(path),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise CalibrationError(str(path), f"missing or bad field ({err!r})") from None
        cal.check(str(path))
        return cal

    def check(self, source: str) -> None:
        """Raise `CalibrationError` naming `source` unless every value is in range: block size,
        max_new_tokens a positive multiple of it, requests and repeats, the profiles, each row's
        mode, counts >= 1 and seconds, and the measured ratios and their ranges."""
        if self.block_size < 1:
            raise CalibrationError(source, f"block_size {self.block_size}: must be >= 1")
        if self.max_new_tokens < 1 or self.max_new_tokens % self.block_size:
            raise CalibrationError(
                source, "max_new_tokens must be a positive multiple of block_size"
            )
        if self.requests < 1 or self.repeats < 1:
            raise CalibrationError(source, "requests and repeats must be >= 1")
        try:
            for prof in self.profiles:
                prof.check(self.block_size)
        except SimConfigError as err:
            raise CalibrationError(source, f"profiles: {err}") from None
        for r in self.rows:
            if r.mode not in MODES:
                raise CalibrationError(source, f"mode {r.mode!r}: one of {', '.join(MODES)}")
            counts = (r.forwards, r.row_forwards, r.rounds, r.row_rounds, r.block_allocations)
            if min(*counts, r.max_running, r.tokens) < 1:
                raise CalibrationError(source, f"row {r.mode} x{r.max_running}: counts >= 1")
            if not (_positive(r.seconds) and 0 <= r.forward_seconds <= r.seconds):
                raise CalibrationError(
                    source,
                    f"row {r.mode} x{r.max_running}: seconds must be finite and > 0, "
                    "forward_seconds between 0 and seconds",
                )
        ratios = [x for v in self.measured_ratios.values() for x in v.values()]
        ratios += [x for v in self.paired_range.values() for pair in v.values() for x in pair]
        if not all(_positive(x) for x in ratios):
            raise CalibrationError(
                source, "measured_ratios and paired_range must be finite and > 0"
            )
        if any(lo > hi for v in self.paired_range.values() for lo, hi in v.values()):
            raise CalibrationError(source, "paired_range: each range is [lowest, highest]")
