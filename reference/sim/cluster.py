"""The replica-level simulation (Vidur's global → replica tiers): requests arrive, a global
scheduler routes each to a replica at once, every replica runs one batch at a time and the
execution-time model says how long each batch takes.

The loop merges the (sorted) arrival array with a heap of batch ends, so arrivals never sit in
the heap; at equal times an arrival is handled before a batch end (a fixed rule, so runs are
deterministic). Batch ends at equal times pop in push order.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from reference.sim.errors import SimConfigError, TimeWentBackwards
from reference.sim.exec_model import ExecModel
from reference.sim.metrics import RequestMetrics, Summary, summarize
from reference.sim.replica import ReplicaScheduler
from reference.sim.workload import Workload

GLOBAL_SCHEDULERS = ("round_robin", "lor", "random")


@dataclass(frozen=True, slots=True)
class BatchRecord:
    replica: int
    start: float
    end: float
    seqs: int
    prefill_tokens: int
    decode_tokens: int


@dataclass
class ClusterResult:
    metrics: RequestMetrics
    summary: Summary
    batches: list[BatchRecord] = field(default_factory=list)
    kv_samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, replica, used)
    kv_capacity: int = 0
    num_batches: int = 0
    event_times: list[float] | None = None  # every handled event time, if recorded
    log: list[tuple[str, int, float]] | None = None  # (arrive|first|done|restart, req, t)


Progress = Callable[[int, int], None]


def simulate_cluster(
    workload: Workload,
    replicas: Sequence[ReplicaScheduler],
    model: ExecModel,
    global_scheduler: str = "round_robin",
    seed: int = 0,
    record_batches: bool = False,
    kv_sample_interval: float | None = None,
    record_events: bool = False,
    progress: Progress | None = None,
    fuse: bool = True,
) -> ClusterResult:
    if global_scheduler not in GLOBAL_SCHEDULERS:
        raise SimConfigError(
            "global_scheduler", global_scheduler, f"one of {', '.join(GLOBAL_SCHEDULERS)}"
        )
    if not replicas:
        raise SimConfigError("replicas", 0, "at least one replica")
    n = len(workload)
    R = len(replicas)
    m = RequestMetrics.for_workload(workload)
    arrivals = workload.arrived_at.tolist()
    pre = workload.prefill.tolist()
    dec = workload.decode.tolist()
    scheduled = m.scheduled
    first_tok = m.first_token
    completed = m.completed
    restarts = m.restarts
    assign = [0] * n
    busy = [False] * R
    outstanding = [0] * R
    heap: list[tuple[float, int, int, int, int]] = []
    seq = 0
    now = 0.0
    rr = 0
    rng = np.random.default_rng(seed)
    rand_choices = rng.integers(0, R, size=n).tolist() if global_scheduler == "random" else []
    batches: list[BatchRecord] = []
    starts = [0.0] * R
    plans: list[tuple[int, int, int, int, int]] = [(0, 0, 0, 0, 0)] * R
    if kv_sample_interval is None:
        span = arrivals[-1] - arrivals[0] if n > 1 else 1.0
        kv_sample_interval = max(span, 1e-3) / 400
    next_sample = [0.0] * R
    kv_samples: list[tuple[float, int, int]] = []
    times: list[float] | None = [] if record_events else None
    log: list[tuple[str, int, float]] | None = [] if record_events else None
    num_batches = 0
    batch_time = model.batch_time
    decode_ends = getattr(model, "decode_ends", None)
    i = 0
    report_every = max(1, n // 100)

    fusable = [hasattr(rep, "decode_stretch") and fuse for rep in replicas]
    gen = [0] * R  # a batch-end entry is stale unless its generation is the replica's
    runs: list[list[float] | None] = [None] * R  # end times of a fused decode stretch

    def start(r: int, t: float) -> None:
        nonlocal seq, num_batches
        rep = replicas[r]
        k = rep.decode_stretch() if fusable[r] else 0  # type: ignore[attr-defined]
        if k >= 2:
            # k pure-decode iterations with nothing admitted or finished before the last:
            # one heap entry instead of k (end times summed exactly as k batches would be).
            p = rep.next_batch_plan_decode()  # type: ignore[attr-defined]
            nd, kv = p
            if decode_ends is not None:
                ends = decode_ends(t, nd, kv, k)
            else:
                ends = []
                tt = t
                for _ in range(k):
                    tt += batch_time(0, nd, kv, kv + nd)
                    kv += nd
                    ends.append(tt)
            tt = ends[-1]
            runs[r] = ends
            busy[r] = True
            starts[r] = t
            plans[r] = (0, nd, p[1], p[1] + nd, nd)
            heapq.heappush(heap, (tt, seq, r, gen[r], k))
            seq += 1
            num_batches += k
            return
        runs[r] = None
        plan = rep.next_batch()
        if plan is None:
            busy[r] = False
            return
        for q in rep.newly_scheduled:
            if scheduled[q] != scheduled[q]:  # NaN: first time
                scheduled[q] = t
        dt = batch_time(plan[0], plan[1], plan[2], plan[3])
        busy[r] = True
        starts[r] = t
        plans[r] = plan
        heapq.heappush(heap, (t + dt, seq, r, gen[r], 0))
        seq += 1
        num_batches += 1

    def cut_stretch(r: int, t: float) -> None:
        """A request arrived during a fused stretch and could be admitted: end the stretch at
        the end of the iteration running at t (an arrival at a boundary joins the next one)."""
        nonlocal seq, num_batches
        ends = runs[r]
        assert ends is not None
        j = bisect.bisect_left(ends, t)
        if j + 1 >= len(ends):
            return
        gen[r] += 1
        num_batches -= len(ends) - (j + 1)
        runs[r] = ends[: j + 1]
        heapq.heappush(heap, (ends[j], seq, r, gen[r], j + 1))
        seq += 1

    while i < n or heap:
        if i < n and (not heap or arrivals[i] <= heap[0][0]):
            t = arrivals[i]
            if t < now:
                raise TimeWentBackwards(now, t, f"arrival of request {i}")
            now = t
            if global_scheduler == "round_robin":
                r = rr
                rr = rr + 1 if rr + 1 < R else 0
            elif global_scheduler == "lor":
                r = min(range(R), key=outstanding.__getitem__)
            else:
                r = rand_choices[i]
            assign[i] = r
            outstanding[r] += 1
            rep = replicas[r]
            rep.add(i, pre[i], dec[i])
            if runs[r] is not None and rep.would_admit():  # type: ignore[attr-defined]
                cut_stretch(r, t)
            if times is not None and log is not None:
                times.append(t)
                log.append(("arrive", i, t))
            if not busy[r]:
                start(r, t)
            i += 1
            if progress is not None and i % report_every == 0:
                progress(i, n)
            continue
        t, _, r, g, k = heapq.heappop(heap)
        if g != gen[r]:
            continue  # a stretch that an arrival cut short
        if t < now:
            raise TimeWentBackwards(now, t, f"batch end on replica {r}")
        now = t
        rep = replicas[r]
        if k:
            firsts, dones, restarted = rep.end_decode(k)  # type: ignore[attr-defined]
        else:
            firsts, dones, restarted = rep.end_batch()
        for q in firsts:
            if first_tok[q] != first_tok[q]:
                first_tok[q] = t
        for q in restarted:
            restarts[q] += 1
        for q in dones:
            completed[q] = t
            if first_tok[q] != first_tok[q]:
                first_tok[q] = t
        if dones:
            outstanding[r] -= len(dones)
        if times is not None and log is not None:
            times.append(t)
            log.extend(("first", q, t) for q in firsts)
            log.extend(("restart", q, t) for q in restarted)
            log.extend(("done", q, t) for q in dones)
        if record_batches:
            p = plans[r]
            batches.append(BatchRecord(r, starts[r], t, p[4], p[0], p[1]))
        if t >= next_sample[r]:
            kv_samples.append((t, r, rep.kv_used()))
            next_sample[r] = t + kv_sample_interval
        start(r, t)
    m.replica[:] = assign
    return ClusterResult(
        m, summarize(m), batches, kv_samples, replicas[0].kv_capacity, num_batches, times, log
    )
