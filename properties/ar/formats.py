"""Vidur formats: read a Vidur trace CSV, replay it at constant batch time through any AR
implementation (checked by the spec as it runs), and write request metrics under Vidur's names.

Trace CSV: read by `spec.ar.vidur_trace` (the one reader, shared with the simulator): a header
with at least `arrived_at,num_prefill_tokens,num_decode_tokens`; a malformed row raises
`TraceRowError` naming the line.
Metrics CSV: `Request Id` and Vidur's request metric names (`vidur/metrics/constants.py`):
request_e2e_time, request_scheduling_delay, prefill_e2e_time, request_num_prefill_tokens,
request_num_decode_tokens, request_pd_ratio, request_num_restarts.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from properties.ar.harness import ArHarness
from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArFinished, ArPreempted, ArScheduled
from spec.ar.vidur_trace import (
    TRACE_COLUMNS,
    TraceRowError,
    VidurTrace,
    parse_vidur_trace_text,
    read_vidur_trace_file,
)

__all__ = [
    "METRIC_COLUMNS",
    "TRACE_COLUMNS",
    "RequestMetrics",
    "TraceRowError",
    "parse_vidur_trace",
    "read_vidur_trace",
    "replay_trace",
    "write_request_metrics",
]

METRIC_COLUMNS = (
    "Request Id",
    "request_e2e_time",
    "request_scheduling_delay",
    "prefill_e2e_time",
    "request_num_prefill_tokens",
    "request_num_decode_tokens",
    "request_pd_ratio",
    "request_num_restarts",
)


def _requests(trace: VidurTrace) -> list[ArRequest]:
    return [
        ArRequest(f"r{i}", p, d, arrival_time=t)
        for i, (t, p, d) in enumerate(
            zip(trace.arrived_at, trace.num_prefill_tokens, trace.num_decode_tokens, strict=True)
        )
    ]


def parse_vidur_trace(text: str) -> list[ArRequest]:
    """Requests `r0, r1, ...` from Vidur trace CSV text, in file order."""
    return _requests(parse_vidur_trace_text(text))


def read_vidur_trace(path: str | Path) -> list[ArRequest]:
    """Requests `r0, r1, ...` from a Vidur trace CSV file, in file order; a malformed row
    raises `TraceRowError` naming the file and the line."""
    return _requests(read_vidur_trace_file(path))


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """One finished request of a replayed trace: its times (on the trace's clock) and counts."""

    request_id: str
    arrived_at: float
    scheduled_at: float
    prefill_completed_at: float
    completed_at: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_restarts: int

    def row(self) -> dict[str, object]:
        """The request's row of the metrics CSV, keyed by `METRIC_COLUMNS` (times relative to
        arrival; `request_pd_ratio` is prefill over decode tokens)."""
        return {
            "Request Id": self.request_id,
            "request_e2e_time": self.completed_at - self.arrived_at,
            "request_scheduling_delay": self.scheduled_at - self.arrived_at,
            "prefill_e2e_time": self.prefill_completed_at - self.arrived_at,
            "request_num_prefill_tokens": self.num_prefill_tokens,
            "request_num_decode_tokens": self.num_decode_tokens,
            "request_pd_ratio": self.num_prefill_tokens / self.num_decode_tokens,
            "request_num_restarts": self.num_restarts,
        }


def replay_trace(
    factory: ArImplementationFactory,
    config: ArConfig,
    requests: Iterable[ArRequest],
    batch_time: float = 1.0,
    max_steps: int = 1_000_000,
) -> list[RequestMetrics]:
    """Run the trace at constant batch time (each step takes `batch_time`; an idle replica jumps
    to the next arrival), with every event checked by the spec; metrics of finished requests."""
    pending = sorted(requests, key=lambda r: r.arrival_time)
    h = ArHarness(factory, config, check_invariants=False)
    now = 0.0
    first: dict[str, float] = {}
    prefill_done: dict[str, float] = {}
    done: dict[str, float] = {}
    restarts: dict[str, int] = {}
    outputs: dict[str, int] = {}
    by_id = {r.request_id: r for r in pending}
    i = 0
    for _ in range(max_steps):
        while i < len(pending) and pending[i].arrival_time <= now:
            h.submit(pending[i])
            i += 1
        if h.spec.is_idle():
            if i == len(pending):
                break
            now = pending[i].arrival_time
            continue
        h.events.clear()  # bounded memory: only this step's events are read
        h.step()
        end_time = now + batch_time
        scheduled: set[str] = set()
        for e in h.events:
            if isinstance(e, ArScheduled):
                first.setdefault(e.request_id, now)
                scheduled.add(e.request_id)
            elif isinstance(e, ArPreempted):
                restarts[e.request_id] = restarts.get(e.request_id, 0) + 1
            elif isinstance(e, ArFinished):
                done[e.request_id] = end_time
        # only the requests scheduled in this step can have produced an output token
        for rid in scheduled:
            n = h.spec.num_output(rid)
            if n and rid not in prefill_done:
                prefill_done[rid] = end_time
            outputs[rid] = n
        now = end_time
    out = []
    for rid, t in done.items():
        r = by_id[rid]
        out.append(
            RequestMetrics(
                rid,
                r.arrival_time,
                first[rid],
                prefill_done[rid],
                t,
                r.prompt_len,
                outputs[rid],
                restarts.get(rid, 0),
            )
        )
    return sorted(out, key=lambda m: m.arrived_at)


def write_request_metrics(path: str | Path, metrics: Iterable[RequestMetrics]) -> None:
    """Write `metrics` to `path` as a metrics CSV: the `METRIC_COLUMNS` header, one row each
    (`RequestMetrics.row`); an existing file is overwritten."""
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(METRIC_COLUMNS))
        w.writeheader()
        for m in metrics:
            w.writerow(m.row())
