"""A symbolic model of the scheduling POLICY at forward granularity (one tick = one forward).

The event-level relation (`encoding`) says what is allowed; this model says what an FCFS
scheduler in sync or FDFO mode does, for every choice of step counts. It is the abstraction
the policy theorems and the boundary workloads are stated over:

- request i arrives at tick a_i (FCFS order = index order), has nb_i blocks, and block k needs
  T_ik forwards (the forwards until its step reports done, the final-KV forward included: a
  block of prompt tokens only needs 1, a block with masks 1 + the steps to unmask it);
- at a round boundary the scheduler completes done blocks (a request whose last block is done
  leaves; the others start their next block), processes aborts, and admits arrived requests in
  FCFS order while a seat (max_running_requests) and, optionally, the worst-case KV pages
  (the reference's reservation) are free; it stops at the first request that does not fit;
- every tick runs one forward over every running request; a row whose block is already done
  is a wasted row-step (sync only: it re-steps done rows until every block of the batch is
  done);
- FDFO: every tick is a round boundary (one forward per round, no re-loop). Sync: a boundary
  only when every running block is done.

`tick(...)` is the one transition function; `PolicyRun` applies it H times (k copies).
Time is counted in forwards: `completion[i]` is the number of forwards run up to and including
the one that finished request i's last block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import z3

from properties.symbolic.terms import Z, count

WAIT, RUN, DONE, ABORTED = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class PolicyBounds:
    """The bounds of the policy model: requests, blocks per request, forwards per block, the
    latest arrival tick and max_running."""

    requests: int = 4
    blocks: int = 2  # blocks per request, at most
    max_steps: int = 4  # forwards per block, at most
    max_arrival: int = 3  # arrival tick, at most
    max_running: int = 4

    @property
    def horizon(self) -> int:
        """Ticks after which every request has completed, in both modes."""
        return self.max_arrival + self.requests * self.blocks * self.max_steps + 1


@dataclass
class PolicyInputs:
    """Step counts, arrivals and max_running (symbolic), plus optional KV and aborts."""

    bounds: PolicyBounds
    name: str = "in"
    nb: list[Z] = field(default_factory=list)
    steps: list[list[Z]] = field(default_factory=list)
    arrival: list[Z] = field(default_factory=list)
    abort_at: list[Z] = field(default_factory=list)  # boundary tick of an abort, -1 = never
    pages: list[Z] = field(default_factory=list)  # worst-case KV pages (reservation)
    max_running: Z = None
    kv_pages: Z = None  # None: KV never binds

    def __post_init__(self) -> None:
        b, n = self.bounds, self.bounds.requests
        self.nb = [z3.Int(f"{self.name}.nb[{i}]") for i in range(n)]
        self.steps = [
            [z3.Int(f"{self.name}.T[{i}][{k}]") for k in range(b.blocks)] for i in range(n)
        ]
        self.arrival = [z3.Int(f"{self.name}.a[{i}]") for i in range(n)]
        self.abort_at = [z3.Int(f"{self.name}.abort[{i}]") for i in range(n)]
        self.pages = [z3.Int(f"{self.name}.pages[{i}]") for i in range(n)]
        self.max_running = z3.Int(f"{self.name}.m")

    def constraints(self, *, aborts: bool = False, kv: bool = False) -> Z:
        """The inputs within `bounds`: `max_running` 1..max_running, 1..blocks blocks and
        1..max_steps forwards per block, arrivals 0..max_arrival in index order; no aborts (-1)
        unless `aborts` (then -1..horizon), no pages (0) unless `kv` (then left free, as is
        `kv_pages`)."""
        b, n = self.bounds, self.bounds.requests
        parts = [self.max_running >= 1, self.max_running <= b.max_running]
        for i in range(n):
            parts += [self.nb[i] >= 1, self.nb[i] <= b.blocks]
            parts += [z3.And(t >= 1, t <= b.max_steps) for t in self.steps[i]]
            parts += [self.arrival[i] >= 0, self.arrival[i] <= b.max_arrival]
            if i:
                parts.append(self.arrival[i - 1] <= self.arrival[i])
            if not aborts:
                parts.append(self.abort_at[i] == -1)
            else:
                parts += [self.abort_at[i] >= -1, self.abort_at[i] <= b.horizon]
            if not kv:
                parts.append(self.pages[i] == 0)
        return z3.And(parts)

    def step_count(self, i: int, k: Z) -> Z:
        """T[i][k] for a symbolic block index `k` (a `k` out of range reads the last block's)."""
        out = self.steps[i][-1]
        for kk in range(len(self.steps[i]) - 2, -1, -1):
            out = z3.If(k == kk, self.steps[i][kk], out)
        return out


@dataclass
class Tick:
    """The policy state at the start of a tick (before its boundary processing)."""

    st: list[Z]
    blk: list[Z]
    rem: list[Z]


@dataclass
class Forward:
    """What one tick's forward ran: per request, in the batch / block / steps left before /
    a wasted re-step of a done row."""

    row: list[Z]
    blk: list[Z]
    rem: list[Z]
    waste: list[Z]


def tick(inp: PolicyInputs, sync: bool, t: int, cur: Tick) -> tuple[Tick, Forward, dict[str, Z]]:
    """THE policy transition: boundary (complete, abort, admit) then one forward."""
    n = inp.bounds.requests
    running = [cur.st[i] == RUN for i in range(n)]
    if sync:
        boundary = z3.And([z3.Implies(running[i], cur.rem[i] == 0) for i in range(n)])
    else:
        boundary = z3.BoolVal(True)
    # 1. completion of done blocks
    st1, blk1, rem1 = [], [], []
    for i in range(n):
        done_blk = z3.And(boundary, running[i], cur.rem[i] == 0)
        last = cur.blk[i] == inp.nb[i] - 1
        st1.append(z3.If(z3.And(done_blk, last), DONE, cur.st[i]))
        nxt = cur.blk[i] + 1
        blk1.append(z3.If(z3.And(done_blk, z3.Not(last)), nxt, cur.blk[i]))
        rem1.append(z3.If(z3.And(done_blk, z3.Not(last)), inp.step_count(i, nxt), cur.rem[i]))
    # 2. aborts (between rounds)
    st2 = []
    for i in range(n):
        ab = z3.And(boundary, inp.abort_at[i] == t, z3.Or(st1[i] == WAIT, st1[i] == RUN))
        st2.append(z3.If(ab, ABORTED, st1[i]))
    # 3. FCFS admission
    seats_taken = count([x == RUN for x in st2])
    reserved = z3.Sum([z3.If(st2[i] == RUN, inp.pages[i], 0) for i in range(n)])
    blocked = z3.BoolVal(False)
    st3, blk3, rem3 = [], [], []
    admitted = []
    for i in range(n):
        eligible = z3.And(boundary, st2[i] == WAIT, inp.arrival[i] <= t)
        fits = seats_taken < inp.max_running
        if inp.kv_pages is not None:
            fits = z3.And(fits, reserved + inp.pages[i] <= inp.kv_pages)
        adm = z3.And(eligible, z3.Not(blocked), fits)
        admitted.append(adm)
        blocked = z3.Or(blocked, z3.And(st2[i] == WAIT, z3.Not(adm)))
        seats_taken = seats_taken + z3.If(adm, 1, 0)
        reserved = reserved + z3.If(adm, inp.pages[i], 0)
        st3.append(z3.If(adm, RUN, st2[i]))
        blk3.append(z3.If(adm, 0, blk1[i]))
        rem3.append(z3.If(adm, inp.step_count(i, z3.IntVal(0)), rem1[i]))
    # 4. one forward over the running requests
    row = [x == RUN for x in st3]
    fwd = Forward(
        row=row,
        blk=blk3,
        rem=rem3,
        waste=[z3.And(row[i], rem3[i] == 0) for i in range(n)],
    )
    nxt_rem = [z3.If(z3.And(row[i], rem3[i] > 0), rem3[i] - 1, rem3[i]) for i in range(n)]
    info = {
        "boundary": boundary,
        "running_after_admission": count(row),
        "admitted": z3.Or(admitted) if admitted else z3.BoolVal(False),
        "waiting_arrived": z3.Or([z3.And(st3[i] == WAIT, inp.arrival[i] <= t) for i in range(n)]),
    }
    return Tick(st3, blk3, nxt_rem), fwd, info


class PolicyRun:
    """H ticks of one mode from the initial state (every request waiting)."""

    def __init__(
        self, inp: PolicyInputs, sync: bool, horizon: int | None = None, name: str = ""
    ) -> None:
        self.inp = inp
        self.sync = sync
        n = inp.bounds.requests
        self.horizon: int = horizon if horizon is not None else inp.bounds.horizon
        tag = name or ("sync" if sync else "fdfo")
        self.ticks: list[Tick] = []
        self.forwards: list[Forward] = []
        self.info: list[dict[str, Z]] = []
        self.constraints: list[Z] = []

        def fresh(t: int) -> Tick:
            return Tick(
                [z3.Int(f"{tag}.st[{t}][{i}]") for i in range(n)],
                [z3.Int(f"{tag}.blk[{t}][{i}]") for i in range(n)],
                [z3.Int(f"{tag}.rem[{t}][{i}]") for i in range(n)],
            )

        cur = fresh(0)
        self.constraints += [x == WAIT for x in cur.st]
        self.constraints += [x == 0 for x in cur.blk + cur.rem]
        self.ticks.append(cur)
        for t in range(self.horizon):
            nxt, fwd, info = tick(inp, sync, t, cur)
            var = fresh(t + 1)
            # ranges (implied by the transition; explicit so finite-domain solvers apply)
            b = inp.bounds
            self.constraints += [z3.And(x >= 0, x <= ABORTED) for x in var.st]
            self.constraints += [z3.And(x >= 0, x < b.blocks) for x in var.blk]
            self.constraints += [z3.And(x >= 0, x <= b.max_steps) for x in var.rem]
            for a, b in zip(var.st + var.blk + var.rem, nxt.st + nxt.blk + nxt.rem, strict=True):
                self.constraints.append(a == b)
            self.forwards.append(fwd)
            self.info.append(info)
            self.ticks.append(var)
            cur = var

    def finished(self, t: int, i: int) -> Z:
        """At the start of tick t request i's last block has had its final forward."""
        x = self.ticks[t]
        return z3.Or(
            x.st[i] == DONE,
            z3.And(x.st[i] == RUN, x.blk[i] == self.inp.nb[i] - 1, x.rem[i] == 0),
        )

    def completion(self, i: int) -> Z:
        """Forwards up to and including the one that finished request i's last block."""
        return z3.Sum([z3.If(self.finished(t, i), 0, 1) for t in range(self.horizon + 1)])

    def all_finished(self) -> Z:
        """At the horizon every request has finished its last block or was aborted."""
        return z3.And(
            [
                z3.Or(self.finished(self.horizon, i), self.ticks[self.horizon].st[i] == ABORTED)
                for i in range(self.inp.bounds.requests)
            ]
        )

    def wasted(self) -> Z:
        """Row-steps wasted over the run: forwarded rows whose block was already done."""
        return count([w for f in self.forwards for w in f.waste])


def fresh_tick(n: int, tag: str) -> Tick:
    """A policy state of `n` requests in fresh, unconstrained variables named `<tag>.<field>[i]`."""
    return Tick(
        [z3.Int(f"{tag}.st[{i}]") for i in range(n)],
        [z3.Int(f"{tag}.blk[{i}]") for i in range(n)],
        [z3.Int(f"{tag}.rem[{i}]") for i in range(n)],
    )


def progress(inp: PolicyInputs, x: Tick, i: int) -> Z:
    """Forwards request i has had that advanced its blocks (cumulative useful steps)."""
    blocks = inp.bounds.blocks
    before = z3.Sum([z3.If(k < x.blk[i], inp.steps[i][k], 0) for k in range(blocks)])
    return z3.If(x.st[i] == WAIT, 0, before + inp.step_count(i, x.blk[i]) - x.rem[i])


def total_steps(inp: PolicyInputs, i: int) -> Z:
    """Forwards request i needs in all: the sum of T[i][k] over its `nb[i]` blocks."""
    return z3.Sum([z3.If(k < inp.nb[i], inp.steps[i][k], 0) for k in range(inp.bounds.blocks)])


def well_formed(inp: PolicyInputs, x: Tick, t: Z) -> Z:
    """Facts of every policy state at the start of tick t (no aborts)."""
    n = inp.bounds.requests
    parts = []
    for i in range(n):
        parts += [
            z3.Or(x.st[i] == WAIT, x.st[i] == RUN, x.st[i] == DONE),
            x.blk[i] >= 0,
            x.blk[i] < inp.nb[i],
            x.rem[i] >= 0,
            x.rem[i] <= inp.step_count(i, x.blk[i]),
            z3.Implies(x.st[i] == WAIT, z3.And(x.blk[i] == 0, x.rem[i] == 0)),
            z3.Implies(x.st[i] == DONE, z3.And(x.blk[i] == inp.nb[i] - 1, x.rem[i] == 0)),
            z3.Implies(x.st[i] == RUN, progress(inp, x, i) >= 1),
            z3.Implies(x.st[i] != WAIT, inp.arrival[i] < t),
        ]
        for j in range(i + 1, n):
            parts.append(z3.Implies(x.st[i] == WAIT, x.st[j] == WAIT))
    parts.append(count([s == RUN for s in x.st]) <= inp.max_running)
    return z3.And(parts)


def finished_at(inp: PolicyInputs, x: Tick, i: int) -> Z:
    """Request i's last block has had its final forward."""
    return z3.Or(
        x.st[i] == DONE,
        z3.And(x.st[i] == RUN, x.blk[i] == inp.nb[i] - 1, x.rem[i] == 0),
    )


def row_key(f: Forward, i: int) -> Sequence[Z]:
    """Request i's row of forward `f` for comparison: (in the batch, block, steps left), the
    last two -1 when it is not in the batch."""
    return (f.row[i], z3.If(f.row[i], f.blk[i], -1), z3.If(f.row[i], f.rem[i], -1))
