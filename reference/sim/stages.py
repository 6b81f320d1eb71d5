"""Pipeline stages in the replica-level simulation.

A `StagedReplica` is split into `num_stages = S` pipeline stages. A batch passes through the S
stages in order and each stage takes (batch time / S) under the execution-time model; a stage
holds at most one batch, and a batch whose stage is done waits there until the next stage is
free. A new batch enters stage 0 as soon as stage 0 is free.

`reference/ar/stages.py` ticks a Vidur replica scheduler with a constant stage time, which does
not fit the simulator's `ReplicaScheduler` protocol (one `next_batch`/`end_batch` pair at a
time), so this module keeps a simpler model: the replica holds S independent replica
schedulers (one per micro-batch slot, like vLLM's virtual engines); requests are dealt to them
round robin, and each has at most one batch in flight, so a request is in at most one batch in
flight. With S = 1 this is `simulate_cluster` without fused decode stretches, event for event.

It is not Vidur's pipeline model: each slot's scheduler has the replica's whole KV pool and
whole seat cap (S pools and S times the seats in all), where Vidur runs one replica scheduler
whose micro-batches share one pool and divide the seats over the stages (`batch_size_cap //
num_stages` for its vLLM, Sarathi and Mnemosyne). Requests that Vidur's one scheduler runs one
after another can run side by side in two slots here, so finish times differ from Vidur's.

Model relation: with a constant batch time T and a saturated replica, the first batch ends at T
and then one batch ends every T/S: S times the single-stage throughput.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from reference.sim.errors import SimConfigError, TimeWentBackwards, Unschedulable
from reference.sim.exec_model import ExecModel, min_batch_seconds
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
        self.in_flight: list[bool] = [False] * num_stages
        self.stages: list[_InFlight | None] = [None] * num_stages
        self.next_slot: int = 0  # round robin for adds
        self.next_form: int = 0  # round robin for forming batches

    def add(self, req: int, prefill: int, decode: int) -> None:
        """Queue `req` at the next slot's scheduler (round robin); what it raises (`Unschedulable`)
        propagates."""
        self.slots[self.next_slot].add(req, prefill, decode)
        self.next_slot = (self.next_slot + 1) % self.num_stages

    def outstanding(self) -> int:
        """Requests added and not finished, over every slot."""
        return sum(s.outstanding() for s in self.slots)

    def pending(self) -> int:
        """Requests queued and not running, over every slot."""
        return sum(s.pending() for s in self.slots)


@dataclass
class StagedResult:
    """One `simulate_stages` run: metrics, summary, stage slices, batches and the largest S."""

    metrics: RequestMetrics
    summary: Summary
    slices: list[StageRecord] = field(default_factory=list)
    num_batches: int = 0
    num_stages: int = 1


class StageEnd(NamedTuple):
    """A heap entry: a batch's processing on one stage ends."""

    time: float
    seq: int
    replica: int
    stage: int


class StagedSim:
    """One run of `simulate_stages`."""

    def __init__(
        self, workload: Workload, replicas: Sequence[StagedReplica], model: ExecModel
    ) -> None:
        self.replicas = replicas
        self.model = model
        self.n: int = len(workload)
        self.metrics: RequestMetrics = RequestMetrics.for_workload(workload)
        self.arrivals: list[float] = workload.arrived_at.tolist()
        self.pre: list[int] = workload.prefill.tolist()
        self.dec: list[int] = workload.decode.tolist()
        self.heap: list[StageEnd] = []
        self.seq: int = 0
        self.now: float = 0.0
        self.slices: list[StageRecord] = []
        self.num_batches: int = 0
        self.assign: list[int] = [0] * self.n
        self.to_form: list[int] = []

    def run(self) -> StagedResult:
        """Handle every arrival and stage end in order (module doc) and return the result. A
        replica's `Unschedulable` propagates; `TimeWentBackwards` is a simulator bug."""
        arrivals, heap, n = self.arrivals, self.heap, self.n
        i = 0
        while i < n or heap:
            if i < n and (not heap or arrivals[i] <= heap[0].time):
                self._arrive(i, arrivals[i])
                i += 1
                if i == n or arrivals[i] != arrivals[i - 1]:  # every same-time arrival first
                    for r in self.to_form:
                        self._form(r, arrivals[i - 1])
                    self.to_form.clear()
                continue
            end = heapq.heappop(heap)
            self._advance(end.time, f"stage {end.stage} end on replica {end.replica}")
            b = self.replicas[end.replica].stages[end.stage]
            assert b is not None
            b.done = True
            self._move(end.replica, end.time)
        self.metrics.replica[:] = self.assign
        S = max(rep.num_stages for rep in self.replicas)
        return StagedResult(self.metrics, summarize(self.metrics), self.slices, self.num_batches, S)

    def _advance(self, t: float, what: str) -> None:
        if t < self.now:
            raise TimeWentBackwards(self.now, t, what)
        self.now = t

    def _arrive(self, i: int, t: float) -> None:
        self._advance(t, f"arrival of request {i}")
        r = i % len(self.replicas)
        self.assign[i] = r
        self.replicas[r].add(i, self.pre[i], self.dec[i])
        if r not in self.to_form:
            self.to_form.append(r)

    def _enter(self, r: int, s: int, b: _InFlight, t: float) -> None:
        self.replicas[r].stages[s] = b
        b.done = False
        p = b.plan
        end = t + b.stage_time
        self.slices.append(StageRecord(r, s, b.batch, t, end, p.seqs, p.prefill, p.decode))
        heapq.heappush(self.heap, StageEnd(end, self.seq, r, s))
        self.seq += 1

    def _form(self, r: int, t: float) -> None:
        """Stage 0 is free: the next slot (round robin) with no batch in flight forms one."""
        rep = self.replicas[r]
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
                if math.isnan(self.metrics.scheduled[q]):
                    self.metrics.scheduled[q] = t
            dt = self.model.batch_time(plan.prefill, plan.decode, plan.kv_read, plan.attn_pairs)
            rep.in_flight[k] = True
            rep.next_form = (k + 1) % S
            self._enter(r, 0, _InFlight(self.num_batches, k, plan, dt / S), t)
            self.num_batches += 1
            return

    def _finish(self, rep: StagedReplica, b: _InFlight, t: float) -> None:
        """The batch left the last stage: its slot reports the batch's end."""
        m = self.metrics
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

    def _move(self, r: int, t: float) -> None:
        """Done batches move to the next stage if it is free (last stage first), or leave."""
        rep = self.replicas[r]
        S = rep.num_stages
        for s in range(S - 1, -1, -1):
            b = rep.stages[s]
            if b is None or not b.done:
                continue
            if s == S - 1:
                rep.stages[s] = None
                self._finish(rep, b, t)
            elif rep.stages[s + 1] is None:
                rep.stages[s] = None
                self._enter(r, s + 1, b, t)
        self._form(r, t)


def simulate_stages(
    workload: Workload, replicas: Sequence[StagedReplica], model: ExecModel
) -> StagedResult:
    """Round-robin routing to replicas; at one instant every arrival is queued, then stage ends
    are handled, and free stage 0s form batches (the same-time order of `simulate_cluster`)."""
    if not replicas:
        raise SimConfigError("replicas", 0, "at least one replica")
    stages = max(r.num_stages for r in replicas)
    workload.check_clock(min_batch_seconds(model) / stages, "its shortest stage time")
    try:
        return StagedSim(workload, replicas, model).run()
    except Unschedulable as err:  # name the request's trace line, if it came from a trace
        raise err.locate(workload.where(err.request)) from None
