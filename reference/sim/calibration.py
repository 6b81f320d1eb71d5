"""The dLLM time model calibrated from the engine's measured rounds (`simulate dllm
--calibration FILE`).

A calibration table is JSON (`scripts/calibrate_dllm.py` writes one from the engine benchmark):

    {
      "schema": "schedspec.dllm-calibration/1",
      "device": "cpu",                      # where it was measured
      "source": "...",                      # the command that measured it
      "block_size": 8, "requests": 128, "max_new_tokens": 32,   # the measured workload
      "rows": [                             # one per (mode, max_running), repeats summed
        {"mode": "sync" | "fdfo" | "fdfo+reuse" | "fdfo+reuse+reloop",
         "max_running": 4,
         "forwards": 6180, "row_forwards": 24560, "rounds": 810, "tokens": 13920,
         "seconds": 20.1, "forward_seconds": 18.4,
         "seconds_per_forward": 0.00298,    # forward_seconds / forwards
         "rows_per_forward": 3.97,          # row_forwards / forwards
         "seconds_per_round": 0.0021}       # (seconds - forward_seconds) / rounds
      ],
      "measured_ratios": {"fdfo/sync": {"4": 1.633}, ...}   # the benchmark's own ratios
    }

The simulator charges a forward of r rows the mode's seconds per forward interpolated linearly
in rows per forward (extrapolated from the end points, never below 0), and each round the
mode's non-forward seconds per round interpolated in max_running; allocation costs are then 0
(they are inside the per-round figure).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference.sim.errors import SimError

SCHEMA = "schedspec.dllm-calibration/1"
MODES = ("sync", "fdfo", "fdfo+reuse", "fdfo+reuse+reloop")


class CalibrationError(SimError, ValueError):
    """A calibration table that cannot be used: names the file and what is wrong."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        super().__init__(f"calibration {path}: {detail}")


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    mode: str
    max_running: int
    forwards: int
    row_forwards: int
    rounds: int
    tokens: int
    seconds: float
    forward_seconds: float

    @property
    def seconds_per_forward(self) -> float:
        return self.forward_seconds / self.forwards

    @property
    def rows_per_forward(self) -> float:
        return self.row_forwards / self.forwards

    @property
    def seconds_per_round(self) -> float:
        return max(0.0, self.seconds - self.forward_seconds) / self.rounds

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "max_running": self.max_running,
            "forwards": self.forwards,
            "row_forwards": self.row_forwards,
            "rounds": self.rounds,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 6),
            "forward_seconds": round(self.forward_seconds, 6),
            "seconds_per_forward": round(self.seconds_per_forward, 9),
            "rows_per_forward": round(self.rows_per_forward, 6),
            "seconds_per_round": round(self.seconds_per_round, 9),
        }


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
        rows = (prefill_tokens + decode_tokens) / self.block_size
        return max(0.0, _interp(list(self.points), rows))


@dataclass(frozen=True)
class Calibration:
    device: str
    source: str
    block_size: int
    requests: int
    max_new_tokens: int
    rows: tuple[CalibrationRow, ...]
    measured_ratios: dict[str, dict[str, float]]

    def of(self, mode: str) -> list[CalibrationRow]:
        rows = sorted((r for r in self.rows if r.mode == mode), key=lambda r: r.max_running)
        if not rows:
            have = sorted({r.mode for r in self.rows})
            raise CalibrationError(self.source, f"no rows for mode {mode!r} (has {have})")
        return rows

    def forward_model(self, mode: str) -> CalibratedForward:
        pts = sorted({(r.rows_per_forward, r.seconds_per_forward) for r in self.of(mode)})
        return CalibratedForward(self.block_size, tuple(pts))

    def round_overhead(self, mode: str, max_running: int) -> float:
        pts = [(float(r.max_running), r.seconds_per_round) for r in self.of(mode)]
        return max(0.0, _interp(pts, float(max_running)))

    def seats(self) -> tuple[int, ...]:
        return tuple(sorted({r.max_running for r in self.rows}))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "device": self.device,
            "source": self.source,
            "block_size": self.block_size,
            "requests": self.requests,
            "max_new_tokens": self.max_new_tokens,
            "rows": [r.to_json() for r in self.rows],
            "measured_ratios": self.measured_ratios,
        }

    @classmethod
    def from_bench(cls, bench: dict[str, Any], source: str) -> Calibration:
        """From `schedspec bench engine --json` output (every repeat's run summed)."""
        try:
            s = bench["settings"]
            sums: dict[tuple[str, int], list[float]] = {}
            for run in bench["runs"]:
                key = (str(run["mode"]), int(run["max_running"]))
                acc = sums.setdefault(key, [0.0] * 6)
                for i, f in enumerate(
                    ("forwards", "row_forwards", "rounds", "tokens", "seconds", "forward_seconds")
                ):
                    acc[i] += float(run[f])
            rows = tuple(
                CalibrationRow(m, k, int(a[0]), int(a[1]), int(a[2]), int(a[3]), a[4], a[5])
                for (m, k), a in sorted(sums.items(), key=lambda kv: (kv[0][1], kv[0][0]))
            )
            return cls(
                str(bench.get("device", "?")),
                source,
                int(s["block_size"]),
                int(s["requests"]),
                int(s["max_new_tokens"]),
                rows,
                {k: dict(v) for k, v in bench.get("ratios", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as err:
            raise CalibrationError(source, f"not an engine benchmark JSON ({err!r})") from None

    @classmethod
    def load(cls, path: Path) -> Calibration:
        try:
            data = json.loads(path.read_text())
        except OSError as err:
            raise CalibrationError(str(path), f"cannot be read ({err.strerror})") from None
        except json.JSONDecodeError as err:
            raise CalibrationError(str(path), f"not JSON (line {err.lineno})") from None
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
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise CalibrationError(str(path), f"missing or bad field ({err!r})") from None
        for r in rows:
            if r.mode not in MODES:
                raise CalibrationError(str(path), f"mode {r.mode!r}: one of {', '.join(MODES)}")
            if min(r.forwards, r.row_forwards, r.rounds, r.max_running) < 1 or r.seconds <= 0:
                raise CalibrationError(str(path), f"row {r.mode} x{r.max_running}: counts >= 1")
        if cal.block_size < 1 or cal.max_new_tokens % cal.block_size:
            raise CalibrationError(str(path), "max_new_tokens must be a multiple of block_size")
        return cal
