"""Per-request and overall metrics; those with Vidur's names are computed as Vidur computes them.

Per request (seconds; NaN where the request never reached that point):
- request_e2e_time = completed - arrived
- prefill_e2e_time = first token - arrived (TTFT)
- request_scheduling_delay = first scheduled - arrived
- decode_time_execution_plus_preemption_normalized = (completed - first token) / decode, as
  Vidur 0.0.25 computes it (vidur/metrics/metrics_store.py:541-547, `_on_request_end`:
  `(request.completed_at - request.prefill_completed_at) / request.num_decode_tokens`; its
  `prefill_completed_at` is the first prefill's end, kept across restarts, as our first token
  is): divided by every output token, the prefill's included, so a one-token request counts 0
- time_per_output_token = (completed - first token) / (decode - 1): the usual TPOT, the mean
  time between output tokens after the first (ours, not Vidur's; NaN for one-token requests,
  which have no such interval)
- request_num_restarts = preemptions (recomputation restarts)
Overall: makespan, throughput (requests/s, output tokens/s), percentiles, KV occupancy samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from reference.sim.workload import FloatArray, IntArray, Workload

NAN = float("nan")


@dataclass
class RequestMetrics:
    """Arrays indexed by request number."""

    arrived: FloatArray
    prefill: IntArray
    decode: IntArray
    scheduled: FloatArray
    first_token: FloatArray
    completed: FloatArray
    restarts: IntArray
    replica: IntArray

    @classmethod
    def for_workload(cls, w: Workload) -> RequestMetrics:
        """Fresh metrics for `w`: its arrivals and lengths, NaN times, no restarts, replica -1."""
        n = len(w)
        return cls(
            w.arrived_at,
            w.prefill,
            w.decode,
            np.full(n, NAN),
            np.full(n, NAN),
            np.full(n, NAN),
            np.zeros(n, dtype=np.int64),
            np.full(n, -1, dtype=np.int64),
        )

    def columns(self) -> dict[str, FloatArray]:
        """The per-request metrics (module doc) by name, as float arrays; NaN where a time is
        missing."""
        decode_time = self.completed - self.first_token
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(self.decode > 1, decode_time / np.maximum(self.decode - 1, 1), NAN)
        return {
            "request_e2e_time": self.completed - self.arrived,
            "prefill_e2e_time": self.first_token - self.arrived,
            "request_scheduling_delay": self.scheduled - self.arrived,
            "decode_time_execution_plus_preemption_normalized": decode_time / self.decode,
            "time_per_output_token": tpot,
            "request_num_restarts": self.restarts.astype(np.float64),
        }


@dataclass(frozen=True)
class Stat:
    """Mean, p50, p90, p99 and count of a metric's non-NaN values."""

    mean: float
    p50: float
    p90: float
    p99: float
    count: int

    @classmethod
    def of(cls, values: FloatArray) -> Stat:
        """Over the non-NaN `values`; every figure NaN and count 0 when there are none."""
        v = values[~np.isnan(values)]
        if len(v) == 0:
            return cls(NAN, NAN, NAN, NAN, 0)
        p50, p90, p99 = np.percentile(v, [50, 90, 99])
        return cls(float(v.mean()), float(p50), float(p90), float(p99), len(v))

    def as_dict(self) -> dict[str, float]:
        """The figures by name, NaN as None (JSON null)."""
        return {
            k: (None if isinstance(v, float) and math.isnan(v) else v)  # type: ignore[misc]
            for k, v in (
                ("mean", self.mean),
                ("p50", self.p50),
                ("p90", self.p90),
                ("p99", self.p99),
                ("count", self.count),
            )
        }


@dataclass
class Summary:
    """A run's makespan (seconds), throughputs (per second) and a `Stat` per request metric."""

    num_requests: int
    completed: int
    aborted: int
    makespan: float
    throughput_rps: float
    throughput_tokens: float  # output tokens per second
    stats: dict[str, Stat] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        """The figures by name (`throughput_tokens` as `throughput_output_tokens_per_s`) and each
        metric's `Stat.as_dict()`."""
        return {
            "num_requests": self.num_requests,
            "completed": self.completed,
            "aborted": self.aborted,
            "makespan": self.makespan,
            "throughput_rps": self.throughput_rps,
            "throughput_output_tokens_per_s": self.throughput_tokens,
            **{k: s.as_dict() for k, s in self.stats.items()},
        }


def summarize(m: RequestMetrics, aborted: int = 0) -> Summary:
    """The `Summary` of `m`: makespan = last completion - first arrival (0 when nothing completed);
    throughputs are completed requests and their decode tokens per second of it (a span of at
    least 1e-12 s); `aborted` is passed through."""
    done = ~np.isnan(m.completed)
    n_done = int(done.sum())
    start = float(m.arrived.min()) if len(m.arrived) else 0.0
    end = float(m.completed[done].max()) if n_done else start
    span = max(end - start, 1e-12)
    tokens = float(m.decode[done].sum())
    return Summary(
        len(m.arrived),
        n_done,
        aborted,
        end - start,
        n_done / span,
        tokens / span,
        {k: Stat.of(v) for k, v in m.columns().items()},
    )
