"""A P/D-separated, DP-parallel deployment in simulated time: immediate dispatch vs Staggered
Batch Scheduling (SBS). Formulas and what is our own: docs/sbs.md.

Prefill: `prefill_instances` instances of `dp_units` units each. An instance runs a forward in
lock-step over its units (expert-parallel all-to-all every layer), so the forward takes
comm + max_u t(tokens on u); a forward is never preempted. Each request's prefill runs on one
unit (chunked: at most `unit_tokens` tokens per unit per forward; a cut request continues on the
same unit), holding its prompt's KV there until its prefill ends.
Decode: `decode_instances` instances of `decode_units` units, lock-step steps of
comm + max_u t(decode batch on u); a request joins at a step boundary and holds prompt + output
KV until it finishes.

Policies:
- immediate: each arrival goes at once to a prefill unit (round-robin over instances, then over
  that instance's units: SGLang's default DP balancing); an instance starts a forward whenever
  it is free and any unit has work; each finished prefill goes to a decode unit round-robin.
- sbs: arrivals are buffered at the scheduler. A prefill instance receives a batch when (a) the
  adaptive interval has elapsed since the last dispatch to any prefill instance and (b) it has
  signalled the end of its previous forward; the batch is split by water-filling
  (`allocation.pour`). The interval is T_hat / G: T_hat an exponentially weighted mean of
  measured forward times, G the number of independently gated groups (the instances), so
  dispatches are staggered evenly over a forward. Decode targets are chosen by the dual
  objective (`allocation.pick_decode_unit`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from reference.sim.allocation import UnitCapacity, pick_decode_unit, pour
from reference.sim.core import EventQueue
from reference.sim.errors import SimConfigError, Unschedulable
from reference.sim.exec_model import ExecModel, Linear
from reference.sim.metrics import RequestMetrics, Summary, summarize
from reference.sim.workload import Workload

ARRIVAL, PREFILL_END, DECODE_END, TIMER = 0, 1, 2, 3
POLICIES = ("immediate", "sbs")


@dataclass(frozen=True)
class SbsParams:
    policy: str = "sbs"
    prefill_instances: int = 2
    dp_units: int = 16
    unit_tokens: int = 8192  # prefill tokens per unit per forward (chunk budget)
    unit_seats: int = 32  # requests per unit per prefill forward
    unit_kv: int = 131072  # prefill-side KV tokens per unit
    decode_instances: int = 1
    decode_units: int = 32
    decode_seats: int = 128  # running requests per decode unit
    decode_kv: int = 262144  # KV tokens per decode unit
    # DeepSeek-V3 on H800 figures (DeepSeek, "Day 6: inference system overview", 2025):
    # ~9.2k prefill tokens/s and ~1.85k decode tokens/s per GPU -> per-token costs below.
    prefill_model: ExecModel = field(default_factory=lambda: Linear(0.004, 1.09e-4))
    decode_model: ExecModel = field(default_factory=lambda: Linear(0.020, 0.0, 1.5e-4, 2e-8))
    prefill_comm: float = 0.010  # per forward: all-to-all and synchronisation
    decode_comm: float = 0.005
    ewma: float = 0.2
    record: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise SimConfigError("policy", self.policy, f"one of {', '.join(POLICIES)}")
        for f in (
            "prefill_instances",
            "dp_units",
            "unit_tokens",
            "unit_seats",
            "unit_kv",
            "decode_instances",
            "decode_units",
            "decode_seats",
            "decode_kv",
        ):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SimConfigError(f, v, "an integer >= 1")
        if not 0 < self.ewma <= 1:
            raise SimConfigError("ewma", self.ewma, "a weight in (0, 1]")


@dataclass
class _Prefill:
    busy: bool = False
    queues: list[deque[list[int]]] = field(default_factory=list)  # immediate: [req, remaining]
    pinned: list[list[int] | None] = field(default_factory=list)  # sbs: cut request per unit
    kv: list[int] = field(default_factory=list)
    chunks: list[list[tuple[int, int]]] = field(default_factory=list)
    t_hat: float = 0.0
    start: float = 0.0
    rr: int = 0


@dataclass
class _Decode:
    busy: bool = False
    n: list[int] = field(default_factory=list)
    kv: list[int] = field(default_factory=list)  # reserved (prompt + output) per unit
    kv_live: list[int] = field(default_factory=list)  # tokens actually cached
    joining: list[list[int]] = field(default_factory=list)  # per unit: joins next step
    finish_at: list[dict[int, list[int]]] = field(default_factory=list)
    step: int = 0
    waiting: deque[int] = field(default_factory=deque)
    rr: int = 0
    start: float = 0.0


@dataclass(frozen=True, slots=True)
class Span:
    """One forward of one unit, for the Chrome trace: (instance kind, instance, unit)."""

    kind: str
    instance: int
    unit: int
    start: float
    end: float
    tokens: int


@dataclass
class SbsResult:
    params: SbsParams
    metrics: RequestMetrics
    summary: Summary
    prefill_forwards: int
    mean_prefill_forward: float
    mean_unit_imbalance: float  # mean over forwards of max_u load / mean_u load
    spans: list[Span]
    event_times: list[float]

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.params.policy,
            "prefill_forwards": self.prefill_forwards,
            "mean_prefill_forward_s": self.mean_prefill_forward,
            "mean_unit_imbalance": self.mean_unit_imbalance,
            **self.summary.as_dict(),
        }


def simulate_sbs(
    workload: Workload, params: SbsParams, progress: Callable[[int, int], None] | None = None
) -> SbsResult:
    p = params
    sbs = p.policy == "sbs"
    N, D = p.dp_units, p.decode_units
    m = RequestMetrics.for_workload(workload)
    arrivals = workload.arrived_at.tolist()
    pre = workload.prefill.tolist()
    dec = workload.decode.tolist()
    for q in range(len(pre)):
        if pre[q] > p.unit_kv:
            raise Unschedulable(q, pre[q], p.unit_kv, "prefill KV tokens")
        if pre[q] + dec[q] > p.decode_kv:
            raise Unschedulable(q, pre[q] + dec[q], p.decode_kv, "decode KV tokens")
    pf = [
        _Prefill(
            queues=[deque() for _ in range(N)],
            pinned=[None] * N,
            kv=[0] * N,
            chunks=[[] for _ in range(N)],
        )
        for _ in range(p.prefill_instances)
    ]
    dc = [
        _Decode(
            n=[0] * D,
            kv=[0] * D,
            kv_live=[0] * D,
            joining=[[] for _ in range(D)],
            finish_at=[{} for _ in range(D)],
        )
        for _ in range(p.decode_instances)
    ]
    decode_unit: dict[int, tuple[int, int]] = {}
    q_ev = EventQueue(record=p.record)
    buffer: deque[list[int]] = deque()  # sbs: [req, remaining]
    last_dispatch = -float("inf")
    timer_at = -1.0
    rr_prefill = 0
    rr_decode = 0
    forwards = 0
    fwd_time_sum = 0.0
    imbalance_sum = 0.0
    spans: list[Span] = []
    n = len(arrivals)
    done_count = 0
    report_every = max(1, n // 100)
    if n:
        q_ev.push(arrivals[0], ARRIVAL, 0)

    def interval() -> float:
        t_hat = sum(x.t_hat for x in pf) / len(pf)
        return t_hat / len(pf)

    # ------------------------------------------------------------------ prefill
    def start_prefill(i: int, now: float) -> None:
        nonlocal forwards, fwd_time_sum, imbalance_sum, last_dispatch
        inst = pf[i]
        loads = [0] * N
        chunks: list[list[tuple[int, int]]] = [[] for _ in range(N)]
        if sbs:
            caps = []
            for u in range(N):
                pin = inst.pinned[u]
                mand = min(pin[1], p.unit_tokens) if pin else 0
                if pin:
                    chunks[u].append((pin[0], mand))
                caps.append(
                    UnitCapacity(
                        mand,
                        p.unit_tokens,
                        p.unit_seats - (1 if pin else 0),
                        p.unit_kv - inst.kv[u],
                    )
                )
            reqs = [(r[0], r[1], pre[r[0]]) for r in buffer]
            plan = pour(caps, reqs)
            placed = 0
            for u in range(N):
                for rid, tok in plan.chunks[u]:
                    chunks[u].append((rid, tok))
                    inst.kv[u] += pre[rid]
                    placed += 1
                    if m.scheduled[rid] != m.scheduled[rid]:
                        m.scheduled[rid] = now
            for _ in range(placed):
                buffer.popleft()
            if any(chunks):
                last_dispatch = now
        else:
            for u in range(N):
                budget = p.unit_tokens
                seats = p.unit_seats
                for item in inst.queues[u]:
                    if budget == 0 or seats == 0:
                        break
                    rid, rem = item
                    started = rem < pre[rid]
                    if not started:
                        if inst.kv[u] + pre[rid] > p.unit_kv:
                            break
                        inst.kv[u] += pre[rid]
                        m.scheduled[rid] = now
                    take = min(rem, budget)
                    chunks[u].append((rid, take))
                    budget -= take
                    seats -= 1
        if not any(chunks):
            inst.busy = False
            return
        for u in range(N):
            loads[u] = sum(t for _, t in chunks[u])
        times = [p.prefill_model.batch_time(x, 0) if x else 0.0 for x in loads]
        dt = p.prefill_comm + max(times)
        inst.busy = True
        inst.chunks = chunks
        inst.start = now
        forwards += 1
        fwd_time_sum += dt
        mean_load = sum(loads) / N
        imbalance_sum += max(loads) / mean_load
        if p.record:
            spans.extend(
                Span("prefill", i, u, now, now + times[u], loads[u]) for u in range(N) if loads[u]
            )
        q_ev.push(now + dt, PREFILL_END, i)

    def end_prefill(i: int, now: float) -> None:
        inst = pf[i]
        dt = now - inst.start
        inst.t_hat = dt if inst.t_hat == 0 else (1 - p.ewma) * inst.t_hat + p.ewma * dt
        for u, chunk in enumerate(inst.chunks):
            for rid, tok in chunk:
                if sbs:
                    pin = inst.pinned[u]
                    if pin is not None and pin[0] == rid:
                        pin[1] -= tok
                        rem = pin[1]
                    else:
                        rem = pre[rid] - tok
                        inst.pinned[u] = [rid, rem] if rem else None
                    if rem == 0:
                        inst.pinned[u] = None
                else:
                    head = (
                        inst.queues[u][0]
                        if inst.queues[u] and inst.queues[u][0][0] == rid
                        else next(x for x in inst.queues[u] if x[0] == rid)
                    )
                    head[1] -= tok
                    rem = head[1]
                    if rem == 0:
                        inst.queues[u].remove(head)
                if rem == 0:
                    inst.kv[u] -= pre[rid]
                    m.first_token[rid] = now
                    to_decode(rid, now)
        inst.chunks = []
        inst.busy = False

    def try_dispatch(now: float) -> None:
        """SBS: dispatch to free instances while the interval allows; arm the timer."""
        nonlocal timer_at, rr_prefill
        for k in range(len(pf)):
            i = (rr_prefill + k) % len(pf)
            inst = pf[i]
            if inst.busy or (not buffer and not any(inst.pinned)):
                continue
            due = last_dispatch + interval()
            if now < due:
                if timer_at < now or timer_at > due:
                    timer_at = due
                    q_ev.push(due, TIMER, 0)
                return
            start_prefill(i, now)
            if inst.busy:
                rr_prefill = (i + 1) % len(pf)

    # ------------------------------------------------------------------ decode
    def to_decode(rid: int, now: float) -> None:
        nonlocal done_count, rr_decode
        if dec[rid] == 1:
            m.completed[rid] = now
            done_count += 1
            return
        j = rr_decode
        rr_decode = (rr_decode + 1) % len(dc)
        inst = dc[j]
        if not place_decode(j, rid):
            inst.waiting.append(rid)
        if not inst.busy:
            start_decode(j, now)

    def place_decode(j: int, rid: int) -> bool:
        inst = dc[j]
        need = pre[rid] + dec[rid]
        loads = [inst.n[u] + len(inst.joining[u]) for u in range(D)]
        if sbs:
            u_opt = pick_decode_unit(
                loads,
                inst.kv,
                [p.decode_seats - x for x in loads],
                [p.decode_kv - x for x in inst.kv],
                need,
            )
        else:
            u_opt = None
            for k in range(D):
                u = (inst.rr + k) % D
                if loads[u] < p.decode_seats and inst.kv[u] + need <= p.decode_kv:
                    u_opt = u
                    inst.rr = (u + 1) % D
                    break
        if u_opt is None:
            return False
        inst.kv[u_opt] += need
        inst.joining[u_opt].append(rid)
        decode_unit[rid] = (j, u_opt)
        return True

    def start_decode(j: int, now: float) -> None:
        inst = dc[j]
        for u in range(D):
            for rid in inst.joining[u]:
                inst.n[u] += 1
                inst.kv_live[u] += pre[rid] + 1
                key = inst.step + dec[rid] - 2  # dec - 1 decode steps, the first is this one
                inst.finish_at[u].setdefault(key, []).append(rid)
            inst.joining[u] = []
        if not any(inst.n):
            inst.busy = False
            return
        times = [
            p.decode_model.batch_time(0, inst.n[u], inst.kv_live[u]) if inst.n[u] else 0.0
            for u in range(D)
        ]
        inst.busy = True
        inst.start = now
        if p.record:
            spans.extend(
                Span("decode", j, u, now, now + times[u], inst.n[u]) for u in range(D) if inst.n[u]
            )
        q_ev.push(now + p.decode_comm + max(times), DECODE_END, j)

    def end_decode(j: int, now: float) -> None:
        nonlocal done_count
        inst = dc[j]
        for u in range(D):
            inst.kv_live[u] += inst.n[u]
            ending = inst.finish_at[u].pop(inst.step, None)
            if ending:
                for rid in ending:
                    m.completed[rid] = now
                    inst.n[u] -= 1
                    inst.kv[u] -= pre[rid] + dec[rid]
                    inst.kv_live[u] -= pre[rid] + dec[rid]
                    done_count += 1
        inst.step += 1
        while inst.waiting and place_decode(j, inst.waiting[0]):
            inst.waiting.popleft()
        start_decode(j, now)

    # ------------------------------------------------------------------ loop
    while len(q_ev):
        now, kind, x = q_ev.pop()
        if kind == ARRIVAL:
            if x + 1 < n:
                q_ev.push(arrivals[x + 1], ARRIVAL, x + 1)
            if progress is not None and (x + 1) % report_every == 0:
                progress(x + 1, n)
            if sbs:
                buffer.append([x, pre[x]])
                try_dispatch(now)
            else:
                i = rr_prefill
                rr_prefill = (rr_prefill + 1) % len(pf)
                inst = pf[i]
                u = inst.rr
                inst.rr = (u + 1) % N
                inst.queues[u].append([x, pre[x]])
                if not inst.busy:
                    start_prefill(i, now)
        elif kind == PREFILL_END:
            end_prefill(x, now)
            if sbs:
                try_dispatch(now)
            else:
                start_prefill(x, now)
        elif kind == DECODE_END:
            end_decode(x, now)
        elif kind == TIMER and sbs and now >= timer_at:
            timer_at = -1.0
            try_dispatch(now)
    if done_count != n:
        raise SimConfigError("workload", n, f"only {done_count} requests completed (stalled)")
    return SbsResult(
        p,
        m,
        summarize(m),
        forwards,
        fwd_time_sum / max(forwards, 1),
        imbalance_sum / max(forwards, 1),
        spans,
        [t for t, _ in q_ev.log] if q_ev.log is not None else [],
    )


def compare(workload: Workload, base: SbsParams) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for pol in POLICIES:
        r = simulate_sbs(workload, SbsParams(**{**base.__dict__, "policy": pol}))
        out[pol] = r.as_dict()
    return out


def percent(a: float, b: float) -> float:
    return float(np.round(100.0 * (b / a - 1.0), 2))
