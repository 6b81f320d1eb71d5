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

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from reference.sim.allocation import UnitCapacity, pick_decode_unit, pour
from reference.sim.core import EventQueue
from reference.sim.errors import SimConfigError, Unschedulable
from reference.sim.exec_model import ExecModel, Linear, min_batch_seconds
from reference.sim.metrics import RequestMetrics, Summary, summarize
from reference.sim.workload import Workload

POLICIES = ("immediate", "sbs")


@dataclass(frozen=True)
class SbsParams:
    """A deployment (module doc), its time models (seconds) and policy; `record` keeps a trace."""

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

    def min_forward(self) -> float:
        """The shortest forward (seconds) of either side: its communication plus its model's
        shortest batch (`exec_model.min_batch_seconds`)."""
        return min(
            self.prefill_comm + min_batch_seconds(self.prefill_model),
            self.decode_comm + min_batch_seconds(self.decode_model),
        )


@dataclass(slots=True)
class Pending:
    """A request's prefill on one unit: tokens still to run there."""

    request: int
    remaining: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """Part of one request's prefill in one forward on one unit."""

    request: int
    tokens: int


class PrefillInstance:
    """`units` DP units that run prefill forwards in lock-step."""

    def __init__(self, units: int) -> None:
        self.busy: bool = False
        self.queues: list[deque[Pending]] = [deque() for _ in range(units)]  # immediate
        self.pinned: list[Pending | None] = [None] * units  # sbs: the cut request per unit
        self.kv: list[int] = [0] * units
        self.chunks: list[list[Chunk]] = [[] for _ in range(units)]
        self.t_hat: float = 0.0  # EWMA of measured forward times
        self.start: float = 0.0
        self.rr: int = 0  # immediate: the next unit for an arrival


class DecodeInstance:
    """`units` DP units that run decode steps in lock-step; requests join at step boundaries."""

    def __init__(self, units: int) -> None:
        self.busy: bool = False
        self.n: list[int] = [0] * units
        self.kv: list[int] = [0] * units  # reserved (prompt + output) per unit
        self.kv_live: list[int] = [0] * units  # tokens actually cached
        self.joining: list[list[int]] = [[] for _ in range(units)]
        self.finish_at: list[dict[int, list[int]]] = [{} for _ in range(units)]
        self.step: int = 0
        self.waiting: deque[int] = deque()
        self.rr: int = 0
        self.start: float = 0.0


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
    """One `simulate_sbs` run; `spans` and `event_times` are empty unless `params.record`."""

    params: SbsParams
    metrics: RequestMetrics
    summary: Summary
    prefill_forwards: int
    mean_prefill_forward: float
    mean_unit_imbalance: float  # mean over forwards of max_u load / mean_u load
    spans: list[Span]
    event_times: list[float]

    def as_dict(self) -> dict[str, object]:
        """The policy, the prefill-side figures and the summary's figures by name, JSON-ready."""
        return {
            "policy": self.params.policy,
            "prefill_forwards": self.prefill_forwards,
            "mean_prefill_forward_s": self.mean_prefill_forward,
            "mean_unit_imbalance": self.mean_unit_imbalance,
            **self.summary.as_dict(),
        }


class EventKind(IntEnum):
    """SBS event kinds; payload: request (ARRIVAL), instance (*_END), 0 (TIMER)."""

    ARRIVAL = 0
    PREFILL_END = 1
    DECODE_END = 2
    TIMER = 3


class _Run:
    """What every part of one simulation shares: parameters, lengths, metrics, the event
    queue, the trace spans and the counters of the result."""

    def __init__(self, workload: Workload, params: SbsParams) -> None:
        self.p = params
        self.arrivals: list[float] = workload.arrived_at.tolist()
        self.pre: list[int] = workload.prefill.tolist()
        self.dec: list[int] = workload.decode.tolist()
        for q, (a, b) in enumerate(zip(self.pre, self.dec, strict=True)):
            if a > params.unit_kv:
                raise Unschedulable(q, a, params.unit_kv, "prefill KV tokens")
            if a + b > params.decode_kv:
                raise Unschedulable(q, a + b, params.decode_kv, "decode KV tokens")
        self.m: RequestMetrics = RequestMetrics.for_workload(workload)
        self.events: EventQueue = EventQueue(record=params.record)
        self.spans: list[Span] = []
        self.forwards: int = 0
        self.fwd_time_sum: float = 0.0
        self.imbalance_sum: float = 0.0
        self.done: int = 0


class DecodeSide:
    """Decode instances; a finished prefill goes to one round robin, then to a unit: the dual
    objective (`pick_decode_unit`) under SBS, round robin over units with room otherwise."""

    def __init__(self, run: _Run, balanced: bool) -> None:
        self.run = run
        self.balanced = balanced
        self.instances: list[DecodeInstance] = [
            DecodeInstance(run.p.decode_units) for _ in range(run.p.decode_instances)
        ]
        self.rr: int = 0

    def admit(self, rid: int, now: float) -> None:
        """Request `rid`'s prefill ended at `now`: a one-token request is complete; another goes to
        the next decode instance (round robin), onto a unit or into its queue, and an idle
        instance starts a step."""
        run = self.run
        if run.dec[rid] == 1:
            run.m.completed[rid] = now
            run.done += 1
            return
        j = self.rr
        self.rr = (j + 1) % len(self.instances)
        inst = self.instances[j]
        if not self._place(inst, rid):
            inst.waiting.append(rid)
        if not inst.busy:
            self.start(j, now)

    def _place(self, inst: DecodeInstance, rid: int) -> bool:
        p = self.run.p
        need = self.run.pre[rid] + self.run.dec[rid]
        units = len(inst.n)
        loads = [inst.n[u] + len(inst.joining[u]) for u in range(units)]
        u_opt: int | None = None
        if self.balanced:
            seats = [p.decode_seats - x for x in loads]
            u_opt = pick_decode_unit(
                loads, inst.kv, seats, [p.decode_kv - x for x in inst.kv], need
            )
        else:
            for k in range(units):
                u = (inst.rr + k) % units
                if loads[u] < p.decode_seats and inst.kv[u] + need <= p.decode_kv:
                    u_opt = u
                    inst.rr = (u + 1) % units
                    break
        if u_opt is None:
            return False
        inst.kv[u_opt] += need
        inst.joining[u_opt].append(rid)
        return True

    def start(self, j: int, now: float) -> None:
        """Instance `j` starts a step at `now`: joining requests run from it, and it takes
        `decode_comm` plus the slowest unit's `decode_model` time (its running requests, its
        cached KV). With nothing running the instance goes idle."""
        run, inst = self.run, self.instances[j]
        for u, joining in enumerate(inst.joining):
            for rid in joining:
                inst.n[u] += 1
                inst.kv_live[u] += run.pre[rid] + 1
                key = inst.step + run.dec[rid] - 2  # dec - 1 decode steps, the first is this one
                inst.finish_at[u].setdefault(key, []).append(rid)
            inst.joining[u] = []
        if not any(inst.n):
            inst.busy = False
            return
        model = run.p.decode_model
        times = [
            model.batch_time(0, n, kv) if n else 0.0
            for n, kv in zip(inst.n, inst.kv_live, strict=True)
        ]
        inst.busy = True
        inst.start = now
        if run.p.record:
            run.spans.extend(
                Span("decode", j, u, now, now + times[u], n) for u, n in enumerate(inst.n) if n
            )
        run.events.push(now + run.p.decode_comm + max(times), EventKind.DECODE_END, j)

    def end(self, j: int, now: float) -> None:
        """Instance `j`'s step ended at `now`: every running request cached one more token, those at
        their last step complete and free their KV, queued requests are placed while they fit,
        and the next step starts."""
        run, inst = self.run, self.instances[j]
        for u in range(len(inst.n)):
            inst.kv_live[u] += inst.n[u]
            for rid in inst.finish_at[u].pop(inst.step, ()):
                run.m.completed[rid] = now
                inst.n[u] -= 1
                inst.kv[u] -= run.pre[rid] + run.dec[rid]
                inst.kv_live[u] -= run.pre[rid] + run.dec[rid]
                run.done += 1
        inst.step += 1
        while inst.waiting and self._place(inst, inst.waiting[0]):
            inst.waiting.popleft()
        self.start(j, now)


class PrefillDispatch:
    """Prefill instances and how arrivals reach them; subclasses form each forward's chunks
    and account for the tokens a forward ran."""

    def __init__(self, run: _Run, decode: DecodeSide) -> None:
        self.run = run
        self.decode = decode
        p = run.p
        self.instances: list[PrefillInstance] = [
            PrefillInstance(p.dp_units) for _ in range(p.prefill_instances)
        ]
        self.rr: int = 0

    def on_arrival(self, rid: int, now: float) -> None:  # pragma: no cover - subclasses
        """Request `rid` arrived at `now`: route it as the policy does."""
        raise NotImplementedError

    def on_prefill_end(self, i: int, now: float) -> None:  # pragma: no cover - subclasses
        """Instance `i`'s forward ended at `now`: hand on the finished prefills and go on as the
        policy does."""
        raise NotImplementedError

    def on_timer(self, now: float) -> None:
        """A timer armed by the policy fired (only SBS arms one)."""

    def _form(self, inst: PrefillInstance, now: float) -> list[list[Chunk]]:  # pragma: no cover
        raise NotImplementedError

    def _ran(self, inst: PrefillInstance, u: int, c: Chunk) -> int:  # pragma: no cover
        """Account for a chunk that ran on unit u; the request's tokens left there."""
        raise NotImplementedError

    def start(self, i: int, now: float) -> None:
        """Form and start a forward on instance i (it stays free if nothing can run)."""
        run, inst = self.run, self.instances[i]
        chunks = self._form(inst, now)
        if not any(chunks):
            inst.busy = False
            return
        p = run.p
        loads = [sum(c.tokens for c in unit) for unit in chunks]
        times = [p.prefill_model.batch_time(x, 0) if x else 0.0 for x in loads]
        dt = p.prefill_comm + max(times)
        inst.busy, inst.chunks, inst.start = True, chunks, now
        run.forwards += 1
        run.fwd_time_sum += dt
        run.imbalance_sum += max(loads) / (sum(loads) / len(loads))
        if p.record:
            run.spans.extend(
                Span("prefill", i, u, now, now + times[u], x) for u, x in enumerate(loads) if x
            )
        run.events.push(now + dt, EventKind.PREFILL_END, i)

    def end(self, i: int, now: float) -> None:
        """A forward ended: update the forward-time estimate, hand finished prefills on."""
        run, inst = self.run, self.instances[i]
        dt = now - inst.start
        ewma = run.p.ewma
        inst.t_hat = dt if inst.t_hat == 0 else (1 - ewma) * inst.t_hat + ewma * dt
        for u, unit in enumerate(inst.chunks):
            for c in unit:
                if self._ran(inst, u, c) == 0:
                    inst.kv[u] -= run.pre[c.request]
                    run.m.first_token[c.request] = now
                    self.decode.admit(c.request, now)
        inst.chunks = []
        inst.busy = False


class ImmediateDispatch(PrefillDispatch):
    """Each arrival goes at once to an instance (round robin) and one of its units (round
    robin); a free instance starts a forward whenever a unit has work."""

    def on_arrival(self, rid: int, now: float) -> None:
        """Queue request `rid` on the next instance's next unit (both round robin); a free instance
        starts a forward."""
        i = self.rr
        self.rr: int = (i + 1) % len(self.instances)
        inst = self.instances[i]
        u = inst.rr
        inst.rr = (u + 1) % len(inst.queues)
        inst.queues[u].append(Pending(rid, self.run.pre[rid]))
        if not inst.busy:
            self.start(i, now)

    def on_prefill_end(self, i: int, now: float) -> None:
        """End instance `i`'s forward and start its next one at once."""
        self.end(i, now)
        self.start(i, now)

    def _form(self, inst: PrefillInstance, now: float) -> list[list[Chunk]]:
        p, pre, m = self.run.p, self.run.pre, self.run.m
        chunks: list[list[Chunk]] = [[] for _ in inst.queues]
        for u, queue in enumerate(inst.queues):
            budget, seats = p.unit_tokens, p.unit_seats
            for item in queue:
                if budget == 0 or seats == 0:
                    break
                if item.remaining == pre[item.request]:  # not started: needs its KV now
                    if inst.kv[u] + pre[item.request] > p.unit_kv:
                        break
                    inst.kv[u] += pre[item.request]
                    m.scheduled[item.request] = now
                take = min(item.remaining, budget)
                chunks[u].append(Chunk(item.request, take))
                budget -= take
                seats -= 1
        return chunks

    def _ran(self, inst: PrefillInstance, u: int, c: Chunk) -> int:
        queue = inst.queues[u]
        item = (
            queue[0]
            if queue[0].request == c.request
            else next(x for x in queue if x.request == c.request)
        )
        item.remaining -= c.tokens
        if item.remaining == 0:
            queue.remove(item)
        return item.remaining


class StaggeredDispatch(PrefillDispatch):
    """SBS: arrivals wait in a buffer; a free instance gets a water-filled batch once the
    adaptive interval (mean forward-time estimate / instances) has passed since the last
    dispatch to any instance; a timer covers the wait."""

    def __init__(self, run: _Run, decode: DecodeSide) -> None:
        super().__init__(run, decode)
        self.buffer: deque[Pending] = deque()
        self.last_dispatch: float = -float("inf")
        self.timer_at: float = -1.0

    def interval(self) -> float:
        """The dispatch interval (seconds): the instances' mean forward-time estimate divided by the
        number of instances (an instance yet to run counts 0)."""
        t_hat = sum(x.t_hat for x in self.instances) / len(self.instances)
        return t_hat / len(self.instances)

    def on_arrival(self, rid: int, now: float) -> None:
        """Buffer request `rid`, then dispatch what the interval allows."""
        self.buffer.append(Pending(rid, self.run.pre[rid]))
        self.dispatch(now)

    def on_prefill_end(self, i: int, now: float) -> None:
        """End instance `i`'s forward, then dispatch what the interval allows."""
        self.end(i, now)
        self.dispatch(now)

    def on_timer(self, now: float) -> None:
        """A timer fired at `now`: dispatch, unless the armed timer is later (this one is stale)."""
        if now >= self.timer_at:
            self.timer_at = -1.0
            self.dispatch(now)

    def dispatch(self, now: float) -> None:
        """Dispatch to free instances while the interval allows; arm the timer."""
        n = len(self.instances)
        for k in range(n):
            i = (self.rr + k) % n
            inst = self.instances[i]
            if inst.busy or (not self.buffer and not any(inst.pinned)):
                continue
            due = self.last_dispatch + self.interval()
            if now < due:
                if self.timer_at < now or self.timer_at > due:
                    self.timer_at = due
                    self.run.events.push(due, EventKind.TIMER, 0)
                return
            self.start(i, now)
            if inst.busy:
                self.rr: int = (i + 1) % n

    def _form(self, inst: PrefillInstance, now: float) -> list[list[Chunk]]:
        p, pre, m = self.run.p, self.run.pre, self.run.m
        chunks: list[list[Chunk]] = [[] for _ in inst.pinned]
        caps = []
        for u, pin in enumerate(inst.pinned):
            mandatory = min(pin.remaining, p.unit_tokens) if pin else 0
            if pin:
                chunks[u].append(Chunk(pin.request, mandatory))
            seats = p.unit_seats - (1 if pin else 0)
            caps.append(UnitCapacity(mandatory, p.unit_tokens, seats, p.unit_kv - inst.kv[u]))
        plan = pour(caps, [(r.request, r.remaining, pre[r.request]) for r in self.buffer])
        placed = 0
        for u, unit in enumerate(plan.chunks):
            for rid, tok in unit:
                chunks[u].append(Chunk(rid, tok))
                inst.kv[u] += pre[rid]
                placed += 1
                if math.isnan(m.scheduled[rid]):
                    m.scheduled[rid] = now
        for _ in range(placed):
            self.buffer.popleft()
        if any(chunks):
            self.last_dispatch = now
        return chunks

    def _ran(self, inst: PrefillInstance, u: int, c: Chunk) -> int:
        pin = inst.pinned[u]
        if pin is not None and pin.request == c.request:
            pin.remaining -= c.tokens
            rem = pin.remaining
        else:
            rem = self.run.pre[c.request] - c.tokens
            inst.pinned[u] = Pending(c.request, rem) if rem else None
        if rem == 0:
            inst.pinned[u] = None
        return rem


def simulate_sbs(
    workload: Workload, params: SbsParams, progress: Callable[[int, int], None] | None = None
) -> SbsResult:
    """Run the deployment under `params.policy` (see the module doc). Arrivals later than the
    clock resolves the shortest forward are refused (`Workload.check_clock`); a request no unit
    could ever hold raises `Unschedulable` naming its trace line when it has one."""
    workload.check_clock(params.min_forward(), "its shortest forward")
    try:
        run = _Run(workload, params)
    except Unschedulable as err:
        raise err.locate(workload.where(err.request)) from None
    decode = DecodeSide(run, balanced=params.policy == "sbs")
    dispatch: PrefillDispatch = (
        StaggeredDispatch(run, decode) if params.policy == "sbs" else ImmediateDispatch(run, decode)
    )
    n = len(run.arrivals)
    report_every = max(1, n // 100)
    if n:
        run.events.push(run.arrivals[0], EventKind.ARRIVAL, 0)
    while len(run.events):
        now, kind, x = run.events.pop()
        if kind == EventKind.ARRIVAL:
            if x + 1 < n:
                run.events.push(run.arrivals[x + 1], EventKind.ARRIVAL, x + 1)
            if progress is not None and (x + 1) % report_every == 0:
                progress(x + 1, n)
            dispatch.on_arrival(x, now)
        elif kind == EventKind.PREFILL_END:
            dispatch.on_prefill_end(x, now)
        elif kind == EventKind.DECODE_END:
            decode.end(x, now)
        else:
            dispatch.on_timer(now)
    if run.done != n:
        raise SimConfigError("workload", n, f"only {run.done} requests completed (stalled)")
    forwards = max(run.forwards, 1)
    return SbsResult(
        params,
        run.m,
        summarize(run.m),
        run.forwards,
        run.fwd_time_sum / forwards,
        run.imbalance_sum / forwards,
        run.spans,
        [t for t, _ in run.events.log] if run.events.log is not None else [],
    )
