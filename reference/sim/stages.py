"""Pipeline stages in the replica-level simulation.

A `StagedReplica` is split into `num_stages = S` pipeline stages. A batch passes through the S
stages in order and each stage takes (batch time / S) under the execution-time model; a stage
holds at most one batch, and a batch whose stage is done waits there until the next stage is
free. A new batch enters stage 0 as soon as stage 0 is free.

`reference/ar/stages.py` ticks a Vidur replica scheduler with a constant stage time, which does
not fit the simulator's `ReplicaScheduler` protocol (one `next_batch`/`end_batch` pair at a
time), so this module keeps the minimal equivalent: the replica holds S independent replica
schedulers (one per micro-batch slot, like vLLM's virtual engines); requests are dealt to them
round robin, and each has at most one batch in flight, so a request is in at most one batch in
flight. With S = 1 this is `simulate_cluster` without fused decode stretches, event for event.

Model relation: with a constant batch time T and a saturated replica, the first batch ends at T
and then one batch ends every T/S: S times the single-stage throughput.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from reference.sim.errors import SimConfigError, TimeWentBackwards
from reference.sim.exec_model import ExecModel
from reference.sim.metrics import RequestMetrics, Summary, summarize
from reference.sim.replica import BatchPlan, ReplicaScheduler
from reference.sim.workload import Workload


@dataclass(frozen=True, slots=True)
class StageRecord:
    """One batch's work on one stage: [start, end) of its processing there."""

    replica: int
    stage: int
    batch: int
    start: float
    end: float
    seqs: int
    prefill_tokens: int
    decode_tokens: int


@dataclass(slots=True)
class _InFlight:
    batch: int
    slot: int
    plan: BatchPlan
    stage_time: float
    done: bool = False  # processing on its current stage has ended


class StagedReplica:
    """S pipeline stages over S replica schedulers made by `make` (see module doc)."""

    def __init__(self, make: Callable[[], ReplicaScheduler], num_stages: int = 1) -> None:
        if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
            raise SimConfigError("num_stages", num_stages, "an integer >= 1")
        self.num_stages = num_stages
        self.slots: list[ReplicaScheduler] = [make() for _ in range(num_stages)]
        self.in_flight = [False] * num_stages
        self.stages: list[_InFlight | None] = [None] * num_stages
        self.next_slot = 0  # round robin for adds
        self.next_form = 0  # round robin for forming batches

    def add(self, req: int, prefill: int, decode: int) -> None:
        self.slots[self.next_slot].add(req, prefill, decode)
        self.next_slot = (self.next_slot + 1) % self.num_stages

    def outstanding(self) -> int:
        return sum(s.outstanding() for s in self.slots)

    def pending(self) -> int:
        return sum(s.pending() for s in self.slots)


@dataclass
class StagedResult:
    metrics: RequestMetrics
    summary: Summary
    slices: list[StageRecord] = field(default_factory=list)
    num_batches: int = 0
    num_stages: int = 1


def simulate_stages(
    workload: Workload, replicas: Sequence[StagedReplica], model: ExecModel
) -> StagedResult:
    """Round-robin routing to replicas; at one instant every arrival is queued, then stage ends
    are handled, and free stage 0s form batches (the same-time order of `simulate_cluster`)."""
    if not replicas:
        raise SimConfigError("replicas", 0, "at least one replica")
    n = len(workload)
    R = len(replicas)
    m = RequestMetrics.for_workload(workload)
    arrivals = workload.arrived_at.tolist()
    pre = workload.prefill.tolist()
    dec = workload.decode.tolist()
    heap: list[tuple[float, int, int, int]] = []  # (end time, seq, replica, stage)
    seq = 0
    now = 0.0
    slices: list[StageRecord] = []
    num_batches = 0
    assign = [0] * n

    def enter(r: int, s: int, b: _InFlight, t: float) -> None:
        nonlocal seq
        rep = replicas[r]
        rep.stages[s] = b
        b.done = False
        p = b.plan
        slices.append(StageRecord(r, s, b.batch, t, t + b.stage_time, p.seqs, p.prefill, p.decode))
        heapq.heappush(heap, (t + b.stage_time, seq, r, s))
        seq += 1

    def form(r: int, t: float) -> None:
        nonlocal num_batches
        rep = replicas[r]
        if rep.stages[0] is not None:
            return
        S = rep.num_stages
        for j in range(S):
            k = (rep.next_form + j) % S
            if rep.in_flight[k]:
                continue
            slot = rep.slots[k]
            plan = slot.next_batch()
            if plan is None:
                continue
            for q in slot.newly_scheduled:
                if math.isnan(m.scheduled[q]):
                    m.scheduled[q] = t
            dt = model.batch_time(plan.prefill, plan.decode, plan.kv_read, plan.attn_pairs) / S
            rep.in_flight[k] = True
            rep.next_form = (k + 1) % S
            enter(r, 0, _InFlight(num_batches, k, plan, dt), t)
            num_batches += 1
            return

    def advance(r: int, t: float) -> None:
        rep = replicas[r]
        S = rep.num_stages
        for s in range(S - 1, -1, -1):
            b = rep.stages[s]
            if b is None or not b.done:
                continue
            if s == S - 1:
                rep.stages[s] = None
                rep.in_flight[b.slot] = False
                firsts, dones, restarted = rep.slots[b.slot].end_batch()
                for q in firsts:
                    if math.isnan(m.first_token[q]):
                        m.first_token[q] = t
                for q in restarted:
                    m.restarts[q] += 1
                for q in dones:
                    m.completed[q] = t
                    if math.isnan(m.first_token[q]):
                        m.first_token[q] = t
            elif rep.stages[s + 1] is None:
                rep.stages[s] = None
                enter(r, s + 1, b, t)
        form(r, t)

    i = 0
    to_form: list[int] = []
    while i < n or heap:
        if i < n and (not heap or arrivals[i] <= heap[0][0]):
            t = arrivals[i]
            if t < now:
                raise TimeWentBackwards(now, t, f"arrival of request {i}")
            now = t
            r = i % R
            assign[i] = r
            replicas[r].add(i, pre[i], dec[i])
            if r not in to_form:
                to_form.append(r)
            i += 1
            if i == n or arrivals[i] != t:  # Vidur: every same-time arrival queues first
                for q in to_form:
                    form(q, t)
                to_form.clear()
            continue
        t, _, r, s = heapq.heappop(heap)
        if t < now:
            raise TimeWentBackwards(now, t, f"stage {s} end on replica {r}")
        now = t
        b = replicas[r].stages[s]
        assert b is not None
        b.done = True
        advance(r, t)
    m.replica[:] = assign
    S = max(rep.num_stages for rep in replicas)
    return StagedResult(m, summarize(m), slices, num_batches, S)
