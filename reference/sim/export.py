"""Chrome / Perfetto trace JSON (one track per replica, DP unit or round stream) and PNG plots
(latency CDFs, Gantt of rounds, KV occupancy). matplotlib is imported lazily (Agg)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reference.sim.cluster import BatchRecord
from reference.sim.dllm import DllmResult
from reference.sim.sbs import Span
from reference.sim.stages import StageRecord
from reference.sim.workload import FloatArray

Trace = dict[str, Any]


def _meta(pid: int, name: str, tids: Mapping[int, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
    ]
    out += [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": n}}
        for t, n in tids.items()
    ]
    return out


def _x(name: str, pid: int, tid: int, start: float, end: float, **args: object) -> dict[str, Any]:
    return {
        "name": name,
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": start * 1e6,
        "dur": max(end - start, 0.0) * 1e6,
        "args": args,
    }


def trace_cluster(batches: Iterable[BatchRecord], limit: int = 200_000) -> Trace:
    """A Chrome trace of the first `limit` batch records: one process per replica, one slice per
    record (a fused decode stretch is recorded, and drawn, as the batches it stands for)."""
    ev: list[dict[str, Any]] = []
    seen: set[int] = set()
    for i, b in enumerate(batches):
        if i >= limit:
            break
        if b.replica not in seen:
            seen.add(b.replica)
            ev += _meta(b.replica, f"replica {b.replica}", {0: "batches"})
        ev.append(
            _x(
                f"batch {b.seqs} seqs",
                b.replica,
                0,
                b.start,
                b.end,
                seqs=b.seqs,
                prefill_tokens=b.prefill_tokens,
                decode_tokens=b.decode_tokens,
            )
        )
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def trace_stages(slices: Iterable[StageRecord], num_stages: int, limit: int = 200_000) -> Trace:
    """One process per replica, one track (thread id = stage) per pipeline stage, one slice
    per batch per stage."""
    ev: list[dict[str, Any]] = []
    seen: set[int] = set()
    for i, sl in enumerate(slices):
        if i >= limit:
            break
        if sl.replica not in seen:
            seen.add(sl.replica)
            names = {s: f"stage {s}" for s in range(num_stages)}
            ev += _meta(sl.replica, f"replica {sl.replica}", names)
        ev.append(
            _x(
                f"batch {sl.batch}",
                sl.replica,
                sl.stage,
                sl.start,
                sl.end,
                seqs=sl.seqs,
                prefill_tokens=sl.prefill_tokens,
                decode_tokens=sl.decode_tokens,
            )
        )
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def trace_sbs(spans: Sequence[Span], prefill_instances: int, limit: int = 200_000) -> Trace:
    """A Chrome trace of the first `limit` spans: one process per instance (the decode ones numbered
    after the `prefill_instances` prefill ones), one track per DP unit."""
    ev: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    for i, s in enumerate(spans):
        if i >= limit:
            break
        pid = s.instance if s.kind == "prefill" else prefill_instances + s.instance
        if (pid, -1) not in seen:
            seen.add((pid, -1))
            ev += _meta(pid, f"{s.kind} instance {s.instance}", {})
        if (pid, s.unit) not in seen:
            seen.add((pid, s.unit))
            ev += _meta(pid, f"{s.kind} instance {s.instance}", {s.unit: f"DP unit {s.unit}"})[1:]
        what = "tokens" if s.kind == "prefill" else "seqs"
        ev.append(_x(f"{s.kind} {s.tokens} {what}", pid, s.unit, s.start, s.end, load=s.tokens))
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def trace_dllm(results: Mapping[str, DllmResult]) -> Trace:
    """A Chrome trace of dLLM runs: one process per run (named by its key), one slice per round with
    its forwards and rows."""
    ev: list[dict[str, Any]] = []
    for pid, (label, r) in enumerate(results.items()):
        ev += _meta(pid, label, {0: "rounds"})
        for rec in r.rounds_log:
            ev.append(
                _x(
                    f"round {rec.index}",
                    pid,
                    0,
                    rec.start,
                    rec.end,
                    forwards=rec.forwards,
                    rows=list(rec.rows),
                )
            )
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def write_trace(trace: Trace, path: Path) -> Path:
    """Write `trace` as JSON to `path`, creating its directory; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace))
    return path


# ---------------------------------------------------------------------- plots
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_cdfs(
    series: Mapping[str, Mapping[str, FloatArray]],
    path: Path,
    title: str,
) -> Path:
    """series: label -> {metric name -> values}; one panel per metric, one line per label."""
    plt = _pyplot()
    metrics = sorted({k for v in series.values() for k in v})
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    for ax, name in zip(axes[0], metrics, strict=True):
        for label, cols in series.items():
            v = np.sort(cols[name][~np.isnan(cols[name])])
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def gantt_rounds(results: Mapping[str, DllmResult], path: Path, max_rounds: int = 400) -> Path:
    """One lane per run: each round a bar (start, end) in simulated seconds."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 0.7 + 0.6 * len(results)))
    for lane, (_label, r) in enumerate(results.items()):
        bars = [(rec.start, rec.end - rec.start) for rec in r.rounds_log[:max_rounds]]
        ax.broken_barh(bars, (lane - 0.4, 0.8), facecolors=["#4477aa", "#88aadd"] * len(bars))
    ax.set_yticks(range(len(results)), list(results))
    ax.set_xlabel("simulated time (s): one bar per scheduler round")
    ax.set_title("Rounds over time")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def kv_occupancy(
    series: Mapping[str, Sequence[tuple[float, float]]],
    capacity: float,
    path: Path,
    title: str = "KV occupancy",
) -> Path:
    """Plot KV occupancy over simulated time to a PNG at `path` (directory created): a step line per
    label's (time, KV tokens) samples, `capacity` dashed; returns `path`."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for label, pts in series.items():
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.step(xs, ys, where="post", label=label, lw=0.8)
    ax.axhline(capacity, color="grey", ls="--", lw=1, label="capacity")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV tokens")
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
