"""The replica-level simulation (Vidur's global → replica tiers): requests arrive, a global
scheduler routes each to a replica at once, every replica runs one batch at a time and the
execution-time model says how long each batch takes.

Same-time semantics are Vidur's (its event heap orders by (time, creation id), and every arrival
event is created before the run, so at one instant all arrivals are handled before anything a
batch end or a schedule creates): at an instant t the simulator

1. routes every request arriving at t (in request order) and queues it at its replica,
2. ends every batch ending at t,
3. and only then lets each free replica with work form its next batch.

So several requests arriving together at an idle replica start in one batch, and a request
arriving exactly when a batch ends joins the next batch. The loop merges the (sorted) arrival
array with a heap of batch ends, so arrivals never sit in the heap; batch ends at equal times
pop in push order (replicas are independent, so their order changes no decision).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from reference.sim.errors import SimConfigError, TimeWentBackwards, Unschedulable
from reference.sim.exec_model import ExecModel, min_batch_seconds
from reference.sim.metrics import RequestMetrics, Summary, summarize
from reference.sim.replica import BatchPlan, ReplicaScheduler
from reference.sim.workload import Workload

GLOBAL_SCHEDULERS = ("round_robin", "lor", "random")
EMPTY_PLAN = BatchPlan(0, 0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One batch on one replica, [start, end) in simulated seconds (a fused decode stretch is
    recorded as the batches it stands for)."""

    replica: int
    start: float
    end: float
    seqs: int
    prefill_tokens: int
    decode_tokens: int


@dataclass
class ClusterResult:
    """One `simulate_cluster` run; `batches`, `event_times` and `log` are kept only on request."""

    metrics: RequestMetrics
    summary: Summary
    batches: list[BatchRecord] = field(default_factory=list)
    kv_samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, replica, used)
    kv_capacity: int = 0
    num_batches: int = 0
    event_times: list[float] | None = None  # every handled event time, if recorded
    log: list[tuple[str, int, float]] | None = None  # (arrive|first|done|restart, req, t)


Progress = Callable[[int, int], None]


# ---------------------------------------------------------------------- global schedulers
class Router(Protocol):
    """A global scheduler: the replica of each request, picked at its arrival."""

    def pick(self, req: int) -> int:
        """The replica request `req` goes to (called once per request, in arrival order)."""
        ...


class RoundRobin:
    """Vidur's round-robin: request k of the run goes to replica k mod R."""

    def __init__(self, num_replicas: int) -> None:
        self.num_replicas = num_replicas
        self.next: int = 0

    def pick(self, req: int) -> int:
        """The next replica in turn (`req` is not read)."""
        r = self.next
        self.next = r + 1 if r + 1 < self.num_replicas else 0
        return r


class LeastOutstanding:
    """Vidur's LOR: the replica with the fewest queued (not yet running) requests, the lowest
    index on ties. Queues are read after every earlier same-time arrival was queued and before
    any replica schedules at that instant, as Vidur's one global-schedule event does."""

    def __init__(self, replicas: Sequence[ReplicaScheduler]) -> None:
        self.replicas = replicas

    def pick(self, req: int) -> int:
        """The replica with the fewest pending requests (`pending()`), the lowest index on ties."""
        counts = [rep.pending() for rep in self.replicas]
        return counts.index(min(counts))


class SeededRandom:
    """A uniformly random replica per request from a seeded numpy generator."""

    def __init__(self, num_replicas: int, num_requests: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.choices: list[int] = rng.integers(0, num_replicas, size=num_requests).tolist()

    def pick(self, req: int) -> int:
        """Request `req`'s replica, drawn for every request at construction."""
        return self.choices[req]


def make_router(
    name: str, replicas: Sequence[ReplicaScheduler], num_requests: int, seed: int
) -> Router:
    """The global scheduler `name` (one of `GLOBAL_SCHEDULERS`) over `replicas`; `num_requests` and
    `seed` size and seed the random one's draws. Another name raises `SimConfigError`."""
    if name == "round_robin":
        return RoundRobin(len(replicas))
    if name == "lor":
        return LeastOutstanding(replicas)
    if name == "random":
        return SeededRandom(len(replicas), num_requests, seed)
    raise SimConfigError("global_scheduler", name, f"one of {', '.join(GLOBAL_SCHEDULERS)}")


# ---------------------------------------------------------------------- the loop
class BatchEnd(NamedTuple):
    """A heap entry: the end of a batch (or of `iterations` fused decode batches)."""

    time: float
    seq: int  # push order, the tie-break
    replica: int
    gen: int  # stale unless equal to the replica's generation (a cut stretch)
    iterations: int  # 0: one ordinary batch; k >= 1: k fused pure-decode batches


@dataclass(slots=True)
class _ReplicaState:
    busy: bool = False
    start: float = 0.0
    plan: BatchPlan = EMPTY_PLAN
    gen: int = 0
    stretch: list[float] | None = None  # end times of a fused decode stretch in flight
    next_sample: float = 0.0


class ClusterSim:
    """One run of `simulate_cluster` (see the module doc for the event order)."""

    def __init__(
        self,
        workload: Workload,
        replicas: Sequence[ReplicaScheduler],
        model: ExecModel,
        router: Router,
        record_batches: bool,
        kv_sample_interval: float | None,
        record_events: bool,
        fuse: bool,
    ) -> None:
        self.replicas = replicas
        self.model = model
        self.router = router
        self.n: int = len(workload)
        self.metrics: RequestMetrics = RequestMetrics.for_workload(workload)
        # plain lists while running (numpy element access is slow), copied back at the end
        nan = math.nan
        self.scheduled: list[float] = [nan] * self.n
        self.first_token: list[float] = [nan] * self.n
        self.completed: list[float] = [nan] * self.n
        self.restarts: list[int] = [0] * self.n
        self.arrivals: list[float] = workload.arrived_at.tolist()
        self.pre: list[int] = workload.prefill.tolist()
        self.dec: list[int] = workload.decode.tolist()
        self.assign: list[int] = [0] * self.n
        self.state: list[_ReplicaState] = [_ReplicaState() for _ in replicas]
        self.fusable: list[bool] = [fuse and hasattr(rep, "decode_stretch") for rep in replicas]
        self.heap: list[BatchEnd] = []
        self.seq: int = 0
        self.now: float = 0.0
        self.to_start: list[int] = []  # idle replicas that got work at the current instant
        self.num_batches: int = 0
        self.record_batches = record_batches
        self.batches: list[BatchRecord] = []
        if kv_sample_interval is None:
            span = self.arrivals[-1] - self.arrivals[0] if self.n > 1 else 1.0
            kv_sample_interval = max(span, 1e-3) / 400
        self.kv_sample_interval = kv_sample_interval
        self.kv_samples: list[tuple[float, int, int]] = []
        self.times: list[float] | None = [] if record_events else None
        self.log: list[tuple[str, int, float]] | None = [] if record_events else None
        self.decode_ends: Callable[[float, int, int, int], list[float]] | None = getattr(
            model, "decode_ends", None
        )

    def run(self, progress: Progress | None) -> ClusterResult:
        """Handle every arrival and batch end in order (module doc) and return the result;
        `progress(arrivals handled, total)` is called about every 1% of the arrivals. A replica's
        `Unschedulable` propagates; `TimeWentBackwards` is a simulator bug."""
        arrivals, heap, n = self.arrivals, self.heap, self.n
        report_every = max(1, n // 100)
        i = 0
        while i < n or heap:
            if i < n and (not heap or arrivals[i] <= heap[0].time):
                t = arrivals[i]
                self._arrive(i, t)
                i += 1
                if i == n or arrivals[i] != t:
                    self._start_new_work(t)
                if progress is not None and i % report_every == 0:
                    progress(i, n)
                continue
            end = heapq.heappop(heap)
            if end.gen == self.state[end.replica].gen:  # else: a stretch an arrival cut short
                self._end(end)
        m = self.metrics
        m.replica[:] = self.assign
        m.scheduled[:] = self.scheduled
        m.first_token[:] = self.first_token
        m.completed[:] = self.completed
        m.restarts[:] = self.restarts
        if any(self.fusable):  # a stretch's batches were recorded at its end: back in time order
            self.batches.sort(key=lambda b: b.end)
        return ClusterResult(
            self.metrics,
            summarize(self.metrics),
            self.batches,
            self.kv_samples,
            self.replicas[0].kv_capacity,
            self.num_batches,
            self.times,
            self.log,
        )

    def _advance(self, t: float, what: str) -> None:
        if t < self.now:
            raise TimeWentBackwards(self.now, t, what)
        self.now = t

    def _push(self, time: float, r: int, iterations: int) -> None:
        heapq.heappush(self.heap, BatchEnd(time, self.seq, r, self.state[r].gen, iterations))
        self.seq += 1

    # ------------------------------------------------------------------ arrivals
    def _arrive(self, i: int, t: float) -> None:
        self._advance(t, f"arrival of request {i}")
        r = self.router.pick(i)
        self.assign[i] = r
        rep = self.replicas[r]
        rep.add(i, self.pre[i], self.dec[i])
        st = self.state[r]
        if st.stretch is not None and rep.would_admit():  # type: ignore[attr-defined]
            self._cut_stretch(r, t)
        if self.log is not None and self.times is not None:
            self.times.append(t)
            self.log.append(("arrive", i, t))
        if not st.busy and r not in self.to_start:
            self.to_start.append(r)

    def _start_new_work(self, t: float) -> None:
        """The last arrival at t was queued: free replicas that got work form a batch."""
        for r in self.to_start:
            if not self.state[r].busy:
                self._start(r, t)
        self.to_start.clear()

    def _cut_stretch(self, r: int, t: float) -> None:
        """A request that could be admitted arrived during a fused stretch: end the stretch at
        the end of the iteration running at t (an arrival at a boundary joins the next one)."""
        st = self.state[r]
        ends = st.stretch
        assert ends is not None
        j = bisect.bisect_left(ends, t)
        if j + 1 >= len(ends):
            return
        st.gen += 1
        self.num_batches -= len(ends) - (j + 1)
        st.stretch = ends[: j + 1]
        self._push(ends[j], r, j + 1)

    # ------------------------------------------------------------------ batches
    def _start(self, r: int, t: float) -> None:
        rep = self.replicas[r]
        st = self.state[r]
        k = rep.decode_stretch() if self.fusable[r] else 0  # type: ignore[attr-defined]
        if k >= 2:
            self._start_stretch(r, t, k)
            return
        st.stretch = None
        plan = rep.next_batch()
        if plan is None:
            st.busy = False
            return
        scheduled = self.scheduled
        for q in rep.newly_scheduled:
            if math.isnan(scheduled[q]):
                scheduled[q] = t
        dt = self.model.batch_time(plan.prefill, plan.decode, plan.kv_read, plan.attn_pairs)
        st.busy, st.start, st.plan = True, t, plan
        self._push(t + dt, r, 0)
        self.num_batches += 1

    def _start_stretch(self, r: int, t: float, k: int) -> None:
        """k pure-decode iterations with nothing admitted or finished before the last: one heap
        entry instead of k (end times summed exactly as k batches would be)."""
        nd, kv = self.replicas[r].next_batch_plan_decode()  # type: ignore[attr-defined]
        if self.decode_ends is not None:
            ends = self.decode_ends(t, nd, kv, k)
        else:
            ends = []
            tt, kk = t, kv
            for _ in range(k):
                tt += self.model.batch_time(0, nd, kk, kk + nd)
                kk += nd
                ends.append(tt)
        st = self.state[r]
        st.stretch = ends
        st.busy, st.start, st.plan = True, t, BatchPlan(0, nd, kv, kv + nd, nd)
        self._push(ends[-1], r, k)
        self.num_batches += k

    def _end(self, end: BatchEnd) -> None:
        t, r = end.time, end.replica
        self._advance(t, f"batch end on replica {r}")
        rep = self.replicas[r]
        if end.iterations:
            firsts, dones, restarted = rep.end_decode(end.iterations)  # type: ignore[attr-defined]
        else:
            firsts, dones, restarted = rep.end_batch()
        first_token, completed = self.first_token, self.completed
        for q in firsts:
            if math.isnan(first_token[q]):
                first_token[q] = t
        for q in restarted:
            self.restarts[q] += 1
        for q in dones:
            completed[q] = t
            if math.isnan(first_token[q]):
                first_token[q] = t
        if self.log is not None and self.times is not None:
            self.times.append(t)
            self.log.extend(("first", q, t) for q in firsts)
            self.log.extend(("restart", q, t) for q in restarted)
            self.log.extend(("done", q, t) for q in dones)
        st = self.state[r]
        if self.record_batches:
            p = st.plan
            if end.iterations and st.stretch is not None:
                # a fused stretch: one record per decode batch it stands for, as unfused
                begin = st.start
                for stop in st.stretch[: end.iterations]:
                    self.batches.append(BatchRecord(r, begin, stop, p.seqs, p.prefill, p.decode))
                    begin = stop
            else:
                self.batches.append(BatchRecord(r, st.start, t, p.seqs, p.prefill, p.decode))
        if t >= st.next_sample:
            self.kv_samples.append((t, r, rep.kv_used()))
            st.next_sample = t + self.kv_sample_interval
        self._start(r, t)


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
    """Run `workload` over `replicas` (see the module doc). `fuse` lets replicas that offer
    `decode_stretch` run pure-decode stretches as one event (identical results, tested).
    Arrivals later than the clock resolves `model`'s shortest batch are refused
    (`Workload.check_clock`); a request that can never run raises `Unschedulable` naming its
    trace line when it has one."""
    if not replicas:
        raise SimConfigError("replicas", 0, "at least one replica")
    workload.check_clock(min_batch_seconds(model), "its shortest batch")
    router = make_router(global_scheduler, replicas, len(workload), seed)
    sim = ClusterSim(
        workload, replicas, model, router, record_batches, kv_sample_interval, record_events, fuse
    )
    try:
        return sim.run(progress)
    except Unschedulable as err:  # name the request's trace line, if it came from a trace
        raise err.locate(workload.where(err.request)) from None
