"""A symbolic, finite-domain encoding of the dLLM lifecycle spec (`spec.machine.SpecMachine`).

Sizes are bounded and concrete (`Geometry`: block size, page size, at most K KV pages, at most
N requests and R request-pool rows); the rest of the configuration (mode, in-place reuse,
re-loop, max_running_requests, req_pool_rows, max_context, kv_pages <= K, EOS on/off) is
symbolic, so one query covers all of it at once (`SymConfig.symbolic`) or one concrete
`DllmConfig` (`SymConfig.concrete`).

State (one copy = one `State`): per request its phase, prompt length, max_new_tokens, row,
committed blocks, current block (phase, first KV slot, masks left, allocation round), whether an
end-of-sequence token was generated, and the round bookkeeping (in batch, step pending, input
masks); per row its holder; per KV slot its owner (request, block); the round index, forwards,
"a block became done in the last forward" and commits this round.

Abstractions (what is not encoded): token contents. A prompt is its length plus a validity bit;
a committed block is a validity bit ("keeps the prompt, no mask") plus "contains EOS within
max_new_tokens"; the EOS bit per request replaces the generated tokens in the finish condition.
A block's KV slots are its first slot (blocks are contiguous by the allocation guards). Request
indices follow submission order (a symmetry reduction: the FCFS queue is then "the queued
requests by index").

Transitions: `Encoding.transition(s, p, s2)` is ONE quantifier-free relation, a disjunction over
event kinds of (guards ∧ effect), where `p` holds the event's parameters (kind, request, slots,
forward rows, step result, ...). Guards are labelled with the rule of `spec.rules` that
`SpecMachine` names when they fail, so a seeded mutant is "the relation with one labelled
guard relaxed". Phase changes are read from the lifecycle tables in `spec.lifecycles`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from spec.config import DllmConfig, Mode
from spec.events import (
    EVENT_TYPES,
    Aborted,
    Admitted,
    BlockCommitted,
    ControlReturned,
    Event,
    Finished,
    FinishReason,
    Forward,
    ForwardRow,
    KvAllocated,
    KvFreed,
    RowAcquired,
    RowReleased,
    StepResult,
    Submitted,
)
from spec.lifecycles import (
    BLOCK_LIFECYCLE,
    REQUEST_LIFECYCLE,
    STEP_DONE,
    STEP_NOT_DONE_COMPLETE,
    STEP_NOT_DONE_MASKED,
    BlockPhase,
    Lifecycle,
    RequestPhase,
)

Z = Any  # a z3 expression (z3 ships no type stubs)

# ---------------------------------------------------------------------------- enumerations


def _codes(lc: Lifecycle) -> dict[str, int]:
    """Integer codes of a lifecycle's phases: its initial pseudo-phase is 0."""
    codes = {lc.initial: 0}
    for i, name in enumerate(lc.states):
        codes[name] = i + 1
    return codes


REQ = _codes(REQUEST_LIFECYCLE)  # "(new)" = 0 (not submitted), "queued" = 1, ...
BLK = _codes(BLOCK_LIFECYCLE)  # "(none)" = 0 (no current block), "masked" = 1, ...
REQ_NAME = {v: k for k, v in REQ.items()}
BLK_NAME = {v: k for k, v in BLK.items()}
NEW = REQ[REQUEST_LIFECYCLE.initial]
QUEUED = REQ[RequestPhase.QUEUED.value]
ADMITTED = REQ[RequestPhase.ADMITTED.value]
RUNNING = REQ[RequestPhase.RUNNING.value]
FINISHED = REQ[RequestPhase.FINISHED.value]
ABORTED = REQ[RequestPhase.ABORTED.value]
NONE_BLOCK = BLK[BLOCK_LIFECYCLE.initial]
MASKED = BLK[BlockPhase.MASKED.value]
DENOISING = BLK[BlockPhase.DENOISING.value]
COMPLETE = BLK[BlockPhase.COMPLETE.value]
DONE = BLK[BlockPhase.DONE.value]

KIND = {t.kind: i for i, t in enumerate(EVENT_TYPES)}  # event kind -> code
KIND_NAME = {v: k for k, v in KIND.items()}
REASON = {FinishReason.LENGTH: 0, FinishReason.EOS: 1}
REASON_OF = {v: k for k, v in REASON.items()}

PROMPT_TOKEN = 1  # token used for every prompt position of a decoded request
FILLER_TOKEN = 2  # token used for generated positions of a decoded block
EOS_TOKEN = 15  # the EOS id of decoded configurations (properties.strategies.EOS)


# ---------------------------------------------------------------------------- geometry, config


@dataclass(frozen=True, slots=True)
class Geometry:
    """The concrete, bounded sizes of an encoding."""

    block_size: int
    page_size: int
    kv_pages: int
    requests: int = 4  # request indices 0..requests-1 (ids "r0", "r1", ...)
    rows: int = 4  # request-pool rows represented; req_pool_rows <= rows
    running: int = 4  # max_running_requests <= running

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.page_size % self.block_size or self.kv_pages < 1:
            raise ValueError(f"invalid geometry {self}")

    @property
    def kv_slots(self) -> int:
        return self.page_size * self.kv_pages

    @property
    def blocks_per_page(self) -> int:
        return self.page_size // self.block_size

    def label(self) -> str:
        return (
            f"B={self.block_size} P={self.page_size} S<={self.kv_slots} N={self.requests} "
            f"R={self.rows}"
        )

    @classmethod
    def of(cls, config: DllmConfig, requests: int = 4) -> Geometry:
        return cls(
            config.block_size,
            config.page_size,
            config.kv_pages,
            requests,
            max(config.req_pool_rows, 1),
            max(config.max_running_requests, 1),
        )


@dataclass(frozen=True, slots=True)
class SymConfig:
    """The policy part of a `DllmConfig` as z3 terms (symbolic or concrete)."""

    sync: Z
    reuse: Z
    reloop: Z
    max_running: Z
    rows: Z
    max_context: Z
    eos: Z  # an EOS token id is configured
    kv_pages: Z  # pages in the pool (the pool is kv_pages * page_size slots)

    @classmethod
    def symbolic(cls, prefix: str = "cfg") -> SymConfig:
        return cls(
            z3.Bool(f"{prefix}.sync"),
            z3.Bool(f"{prefix}.reuse"),
            z3.Bool(f"{prefix}.reloop"),
            z3.Int(f"{prefix}.max_running"),
            z3.Int(f"{prefix}.rows"),
            z3.Int(f"{prefix}.max_context"),
            z3.Bool(f"{prefix}.eos"),
            z3.Int(f"{prefix}.kv_pages"),
        )

    @classmethod
    def concrete(cls, config: DllmConfig) -> SymConfig:
        return cls(
            z3.BoolVal(config.mode is Mode.SYNC),
            z3.BoolVal(config.in_place_reuse),
            z3.BoolVal(config.reloop),
            z3.IntVal(config.max_running_requests),
            z3.IntVal(config.req_pool_rows),
            z3.IntVal(config.max_context),
            z3.BoolVal(config.eos_token_id is not None),
            z3.IntVal(config.kv_pages),
        )

    def constraints(self, geom: Geometry) -> Z:
        """What `DllmConfig` validation accepts, within the geometry's bounds."""
        b = geom.block_size
        return z3.And(
            self.max_running >= 1,
            self.max_running <= geom.running,
            self.rows >= 1,
            self.rows <= geom.rows,
            self.max_context >= b,
            self.max_context % b == 0,
            self.kv_pages >= 1,
            self.kv_pages <= geom.kv_pages,
            z3.Implies(self.sync, z3.And(z3.Not(self.reuse), z3.Not(self.reloop))),
        )

    def decode(self, model: Z, geom: Geometry) -> DllmConfig:
        """The concrete configuration chosen by a model."""

        def ev(x: Z) -> Z:
            return model.eval(x, model_completion=True)

        return DllmConfig(
            block_size=geom.block_size,
            page_size=geom.page_size,
            kv_pages=ev(self.kv_pages).as_long(),
            req_pool_rows=ev(self.rows).as_long(),
            max_running_requests=ev(self.max_running).as_long(),
            max_context=ev(self.max_context).as_long(),
            mode=Mode.SYNC if z3.is_true(ev(self.sync)) else Mode.FDFO,
            in_place_reuse=z3.is_true(ev(self.reuse)),
            reloop=z3.is_true(ev(self.reloop)),
            mask_token_id=-1,
            eos_token_id=EOS_TOKEN if z3.is_true(ev(self.eos)) else None,
        )


# ---------------------------------------------------------------------------- state schema

# (field, sort) per request, per row, per slot, and global. Sort "I" = Int, "B" = Bool.
REQ_FIELDS: tuple[tuple[str, str], ...] = (
    ("phase", "I"),  # REQ code
    ("pl", "I"),  # prompt length
    ("mn", "I"),  # max_new_tokens
    ("pages", "I"),  # ghost: worst-case KV pages ceil((pl + mn) / page_size)
    ("row", "I"),  # request-pool row, -1 = none
    ("com", "I"),  # committed blocks (= index of the current block)
    ("bph", "I"),  # BLK code of the current block, 0 = no current block
    ("start", "I"),  # first KV slot of the current block, -1 = holds no slots
    ("masks", "I"),  # masks left after the block's latest step, -1 = not stepped yet
    ("around", "I"),  # round its slots were allocated in, -1 = never
    ("eos", "B"),  # an EOS token was committed within max_new_tokens
    ("batch", "B"),  # a row of this round's forwards
    ("pend", "B"),  # a step result is pending for its row of the latest forward
    ("pmask", "I"),  # the pending row's input mask count (0 when not pending)
)
ROW_FIELDS: tuple[tuple[str, str], ...] = (("holder", "I"),)  # request index, -1 = free
SLOT_FIELDS: tuple[tuple[str, str], ...] = (
    ("oreq", "I"),  # owner request index, -1 = free
    ("oblk", "I"),  # owner block index (0 when free)
    ("freed_by", "I"),  # ghost: the request that last freed the slot, -1 = never
)
GLOBAL_FIELDS: tuple[tuple[str, str], ...] = (
    ("round", "I"),
    ("nfwd", "I"),  # forwards in this round
    ("newly", "B"),  # a block became done in the latest forward
    ("ncommit", "I"),  # blocks committed in this round
)
GHOST_FIELDS = frozenset({"pages", "freed_by"})


class State:
    """One copy of the symbolic state: lists of z3 terms per field (scalars for globals)."""

    def __init__(self, geom: Geometry, values: dict[str, list[Z]], globals_: dict[str, Z]):
        self.geom = geom
        self.v = values
        self.g = globals_

    @classmethod
    def fresh(cls, geom: Geometry, name: str) -> State:
        def mk(label: str, sort: str) -> Z:
            return z3.Int(label) if sort == "I" else z3.Bool(label)

        values: dict[str, list[Z]] = {}
        for fields, n in (
            (REQ_FIELDS, geom.requests),
            (ROW_FIELDS, geom.rows),
            (SLOT_FIELDS, geom.kv_slots),
        ):
            for f, sort in fields:
                values[f] = [mk(f"{name}.{f}[{i}]", sort) for i in range(n)]
        globals_ = {f: mk(f"{name}.{f}", sort) for f, sort in GLOBAL_FIELDS}
        return cls(geom, values, globals_)

    def __getattr__(self, name: str) -> Any:
        if name in ("geom", "v", "g"):
            raise AttributeError(name)
        if name in self.v:
            return self.v[name]
        if name in self.g:
            return self.g[name]
        raise AttributeError(name)

    def items(self, ghosts: bool = True) -> Iterable[tuple[str, Z]]:
        """(label, term) of every variable, in a fixed order."""
        for f, terms in self.v.items():
            if ghosts or f not in GHOST_FIELDS:
                for i, t in enumerate(terms):
                    yield f"{f}[{i}]", t
        for f, t in self.g.items():
            yield f, t

    def terms(self) -> list[Z]:
        return [t for _, t in self.items()]

    def equals(self, other: State, ghosts: bool = True) -> Z:
        mine = dict(self.items(ghosts))
        return z3.And([mine[k] == t for k, t in other.items(ghosts)])


# ---------------------------------------------------------------------------- event parameters


class Params:
    """The parameters of one symbolic event (which kind, and its arguments)."""

    def __init__(self, geom: Geometry, name: str) -> None:
        n, s = geom.requests, geom.kv_slots
        self.kind = z3.Int(f"{name}.kind")
        self.req = z3.Int(f"{name}.req")
        self.row = z3.Int(f"{name}.row")
        self.blk = z3.Int(f"{name}.blk")
        self.start = z3.Int(f"{name}.start")  # KvAllocated: first slot (slots are contiguous)
        self.free = [z3.Bool(f"{name}.free[{i}]") for i in range(s)]  # KvFreed: slot set
        self.f_in = [z3.Bool(f"{name}.f_in[{i}]") for i in range(n)]  # Forward rows
        self.f_blk = [z3.Int(f"{name}.f_blk[{i}]") for i in range(n)]
        self.f_reused = [z3.Bool(f"{name}.f_reused[{i}]") for i in range(n)]
        self.f_ntok = [z3.Int(f"{name}.f_ntok[{i}]") for i in range(n)]
        self.f_masked = [z3.Int(f"{name}.f_masked[{i}]") for i in range(n)]
        self.accept = z3.Int(f"{name}.accept")
        self.rem = z3.Int(f"{name}.rem")
        self.reason = z3.Int(f"{name}.reason")
        self.pl = z3.Int(f"{name}.pl")  # Submitted
        self.mn = z3.Int(f"{name}.mn")
        self.pages = z3.Int(f"{name}.pages")
        self.prompt_ok = z3.Bool(f"{name}.prompt_ok")
        self.tok_ok = z3.Bool(f"{name}.tok_ok")  # BlockCommitted: tokens keep the prompt
        self.blk_eos = z3.Bool(f"{name}.blk_eos")  # BlockCommitted: has EOS within max_new
        self.idx = z3.Int(f"{name}.idx")  # ControlReturned.round_index

    def is_kind(self, kind: str) -> Z:
        return self.kind == KIND[kind]


@dataclass(frozen=True, slots=True)
class Guard:
    """One conjunct of an event's enabling condition, labelled with the rule it enforces."""

    rule: str
    expr: Z
    tag: str = ""


@dataclass(frozen=True, slots=True)
class Relaxation:
    """A seeded bug: in events of `kind`, the guards labelled `rule` (and `tag`, if given)
    are replaced by `replacement(s, p)` (None = dropped)."""

    kind: str
    rule: str
    tag: str = ""
    replacement: Callable[[State, Params], Z] | None = None

    def matches(self, kind: str, g: Guard) -> bool:
        return kind == self.kind and g.rule == self.rule and (not self.tag or g.tag == self.tag)


# ---------------------------------------------------------------------------- helpers


def _sum(xs: Sequence[Z]) -> Z:
    return z3.Sum([z3.If(x, 1, 0) for x in xs]) if xs else z3.IntVal(0)


def _table(lc: Lifecycle, codes: Mapping[str, int], cur: Z, trigger: str) -> tuple[Z, Z]:
    """(enabled, target code) of `trigger` from phase `cur`, read from the lifecycle table."""
    ts = [t for t in lc.transitions if t.trigger == trigger]
    enabled = z3.Or([cur == codes[t.source] for t in ts]) if ts else z3.BoolVal(False)
    target: Z = cur
    for t in reversed(ts):
        target = z3.If(cur == codes[t.source], codes[t.target], target)
    return enabled, target


class Encoding:
    """The symbolic spec for one geometry and one (symbolic or concrete) policy."""

    def __init__(self, geom: Geometry, cfg: SymConfig | None = None) -> None:
        self.geom = geom
        self.cfg = cfg if cfg is not None else SymConfig.symbolic()
        self.N = geom.requests
        self.R = geom.rows
        self._templates: dict[tuple[Relaxation, ...], tuple[State, Params, State, Z]] = {}
        self._prefix: dict[tuple[int, int], Z] = {}
        self.S = geom.kv_slots  # slot variables: the largest pool of the geometry
        self.pool = self.cfg.kv_pages * geom.page_size  # slots of this configuration's pool
        self.B = geom.block_size
        self.P = geom.page_size

    # ------------------------------------------------------------------ copies
    def state(self, name: str) -> State:
        return State.fresh(self.geom, name)

    def params(self, name: str) -> Params:
        return Params(self.geom, name)

    # ------------------------------------------------------------------ derived predicates
    def active(self, s: State, i: int) -> Z:
        return z3.Or(s.phase[i] == ADMITTED, s.phase[i] == RUNNING)

    def terminal(self, s: State, i: int) -> Z:
        return z3.Or(s.phase[i] == FINISHED, s.phase[i] == ABORTED)

    def n_active(self, s: State) -> Z:
        return _sum([self.active(s, i) for i in range(self.N)])

    def owns(self, s: State, t: int, i: int, blk: Z) -> Z:
        return z3.And(s.oreq[t] == i, s.oblk[t] == blk)

    def owns_any(self, s: State, i: int) -> Z:
        return z3.Or([s.oreq[t] == i for t in range(self.S)])

    def in_block(self, start: Z, t: int) -> Z:
        return z3.And(start <= t, t < start + self.B)

    def gen_len(self, s: State, i: int) -> Z:
        x = s.com[i] * self.B - s.pl[i]
        return z3.If(x > 0, x, 0)

    def finish_due(self, s: State, i: int) -> Z:
        """`spec.machine.finish_condition` is not None."""
        return z3.Or(s.eos[i], self.gen_len(s, i) >= s.mn[i])

    def initial_masks(self, pl: Z, k: Z) -> Z:
        """`spec.machine.initial_masks`: max(0, min(B, k*B + B - pl))."""
        x = k * self.B + self.B - pl
        y = z3.If(x < self.B, x, self.B)
        return z3.If(y > 0, y, 0)

    def prefix_kept(self, s: State, i: int) -> Z:
        """Every committed block k < com holds exactly block_size slots (_check_prefix)."""
        key = (s.com[i].get_id(), i)
        if key not in self._prefix:
            cap = self.S // self.B
            parts = [s.com[i] <= cap]
            for k in range(cap):
                count = _sum([self.owns(s, t, i, k) for t in range(self.S)])
                parts.append(z3.Implies(k < s.com[i], count == self.B))
            self._prefix[key] = z3.And(parts)
        return self._prefix[key]

    def page_offset(self, blk: Z) -> Z:
        bpp = self.geom.blocks_per_page
        return z3.IntVal(0) if bpp == 1 else (blk % bpp) * self.B

    def reserved_pages(self, s: State) -> Z:
        """Worst-case pages of the running requests (what the reference reserves)."""
        return z3.Sum([z3.If(self.active(s, i), s.pages[i], 0) for i in range(self.N)])

    def free_slots(self, s: State) -> Z:
        return _sum([s.oreq[t] == -1 for t in range(self.S)])

    # ------------------------------------------------------------------ initial, domain
    def init(self, s: State) -> Z:
        parts = [self.cfg.constraints(self.geom)]
        for i in range(self.N):
            parts += [
                s.phase[i] == NEW,
                s.pl[i] == 0,
                s.mn[i] == 0,
                s.pages[i] == 0,
                s.row[i] == -1,
                s.com[i] == 0,
                s.bph[i] == NONE_BLOCK,
                s.start[i] == -1,
                s.masks[i] == -1,
                s.around[i] == -1,
                z3.Not(s.eos[i]),
                z3.Not(s.batch[i]),
                z3.Not(s.pend[i]),
                s.pmask[i] == 0,
            ]
        parts += [h == -1 for h in s.holder]
        for t in range(self.S):
            parts += [s.oreq[t] == -1, s.oblk[t] == 0, s.freed_by[t] == -1]
        parts += [s.round == 0, s.nfwd == 0, z3.Not(s.newly), s.ncommit == 0]
        return z3.And(parts)

    def domain(self, s: State) -> Z:
        """Value ranges of the representation (phase codes, indices)."""
        parts = [self.cfg.constraints(self.geom)]
        for i in range(self.N):
            parts += [
                s.phase[i] >= 0,
                s.phase[i] <= max(REQ.values()),
                s.bph[i] >= 0,
                s.bph[i] <= max(BLK.values()),
                s.row[i] >= -1,
                s.row[i] < self.R,
                s.start[i] >= -1,
                s.masks[i] >= -1,
                s.around[i] >= -1,
            ]
        parts += [z3.And(h >= -1, h < self.N) for h in s.holder]
        for t in range(self.S):
            parts += [
                s.oreq[t] >= -1,
                s.oreq[t] < self.N,
                s.freed_by[t] >= -1,
                s.freed_by[t] < self.N,
            ]
        parts += [s.round >= 0, s.nfwd >= 0, s.ncommit >= 0]
        return z3.And(parts)

    # ------------------------------------------------------------------ parameters
    def params_ok(self, s: State, p: Params) -> Z:
        """Well-formed parameters (not spec guards): ranges, and the abstract token facts."""
        n = self.N
        i_com = self._sel(s.com, p.req)
        i_pl = self._sel(s.pl, p.req)
        i_mn = self._sel(s.mn, p.req)
        block_start = i_com * self.B
        eos_possible = z3.And(
            self.cfg.eos,
            block_start < i_pl + i_mn,
            block_start + self.B > i_pl,
        )
        return z3.And(
            p.kind >= 0,
            p.kind < len(KIND),
            p.req >= 0,
            p.req < n,
            p.row >= 0,
            p.row < self.R,
            z3.Or(p.reason == 0, p.reason == 1),
            # Submitted: request indices follow submission order (symmetry reduction)
            z3.Implies(
                p.is_kind(Submitted.kind),
                z3.And(
                    [
                        z3.Implies(p.req == i, z3.And([s.phase[j] != NEW for j in range(i)]))
                        for i in range(n)
                    ]
                ),
            ),
            # ghost: worst-case pages of the submitted request
            self.P * (p.pages - 1) < p.pl + p.mn,
            p.pl + p.mn <= self.P * p.pages,
            z3.Implies(p.blk_eos, eos_possible),
        )

    def _sel(self, arr: Sequence[Z], idx: Z) -> Z:
        out = arr[-1]
        for i in range(len(arr) - 2, -1, -1):
            out = z3.If(idx == i, arr[i], out)
        return out

    # ------------------------------------------------------------------ guards
    def guards(self, s: State, p: Params) -> dict[str, list[Guard]]:
        """Labelled enabling conditions of every event kind (SpecMachine's checks)."""
        n, b = self.N, self.B
        cfg = self.cfg
        G: dict[str, list[Guard]] = {k: [] for k in KIND}

        def per_req(kind: str, rule: str, f: Callable[[int], Z], tag: str = "") -> None:
            G[kind].append(
                Guard(rule, z3.And([z3.Implies(p.req == i, f(i)) for i in range(n)]), tag)
            )

        no_pending = z3.And([z3.Not(x) for x in s.pend])

        # Submitted
        per_req("submitted", "unique_submission", lambda i: s.phase[i] == NEW)
        per_req(
            "submitted",
            "lifecycle",
            lambda i: _table(REQUEST_LIFECYCLE, REQ, s.phase[i], "submitted")[0],
        )
        G["submitted"].append(
            Guard(
                "valid_request",
                z3.And(
                    p.prompt_ok,
                    p.pl >= 1,
                    p.mn >= 1,
                    p.pl + p.mn <= cfg.max_context,
                    p.pl + p.mn <= self.pool,
                ),
            )
        )

        # Admitted
        per_req(
            "admitted",
            "lifecycle",
            lambda i: z3.And(
                s.phase[i] == QUEUED,
                _table(REQUEST_LIFECYCLE, REQ, s.phase[i], "admitted")[0],
            ),
        )
        G["admitted"].append(Guard("scheduler_phase", s.nfwd == 0))
        per_req(
            "admitted",
            "fcfs_admission",
            lambda i: z3.And([s.phase[j] != QUEUED for j in range(i)]),
        )
        G["admitted"].append(Guard("max_running", self.n_active(s) < cfg.max_running))
        G["admitted"].append(
            Guard(
                "row_exclusive",
                z3.And(p.row < cfg.rows, self._sel(s.holder, p.row) == -1),
            )
        )

        # RowAcquired: SpecMachine has no handler (never enabled)
        G["row_acquired"].append(Guard("lifecycle", z3.BoolVal(False)))

        # KvAllocated
        per_req("kv_allocated", "known_request", lambda i: self.active(s, i))
        G["kv_allocated"].append(Guard("scheduler_phase", s.nfwd == 0))
        per_req("kv_allocated", "row_exclusive", lambda i: s.row[i] != -1)
        per_req("kv_allocated", "whole_block_alloc", lambda i: p.blk == s.com[i])
        G["kv_allocated"].append(
            Guard(
                "kv_exclusive",
                z3.And(
                    p.start >= 0,
                    p.start + b <= self.pool,
                    z3.And(
                        [
                            z3.Implies(self.in_block(p.start, t), s.oreq[t] == -1)
                            for t in range(self.S)
                        ]
                    ),
                ),
            )
        )
        off = self.page_offset(p.blk)
        page_ok = z3.And(
            p.start % self.P == off,
            z3.Implies(
                off == 0,
                z3.And(
                    [
                        z3.Implies(z3.And(p.start <= t, t < p.start + self.P), s.oreq[t] == -1)
                        for t in range(self.S)
                    ]
                ),
            ),
        )
        G["kv_allocated"].append(Guard("page_alignment", page_ok, "aligned"))
        per_req(
            "kv_allocated",
            "page_alignment",
            lambda i: z3.Implies(
                off != 0,
                z3.And(
                    p.start >= 1,
                    z3.And(
                        [
                            z3.Implies(p.start - 1 == t, self.owns(s, t, i, p.blk - 1))
                            for t in range(self.S)
                        ]
                    ),
                ),
            ),
            "continues",
        )
        per_req(
            "kv_allocated",
            "whole_block_alloc",
            lambda i: z3.Implies(s.bph[i] != NONE_BLOCK, s.start[i] == -1),
            "holds",
        )
        per_req(
            "kv_allocated",
            "reuse_keeps_slots",
            lambda i: z3.Implies(s.bph[i] != NONE_BLOCK, z3.Not(cfg.reuse)),
        )
        per_req(
            "kv_allocated",
            "lifecycle",
            lambda i: z3.Or(
                s.bph[i] != NONE_BLOCK,
                _table(REQUEST_LIFECYCLE, REQ, s.phase[i], "kv_allocated")[0],
            ),
        )

        # KvFreed
        per_req("kv_freed", "known_request", lambda i: s.phase[i] != NEW)
        per_req(
            "kv_freed",
            "free_owned_only",
            lambda i: z3.And([z3.Implies(p.free[t], s.oreq[t] == i) for t in range(self.S)]),
            "owned",
        )
        whole = []
        for t in range(self.S):
            for u in range(self.S):
                if t != u:
                    whole.append(
                        z3.Not(
                            z3.And(
                                p.free[t],
                                z3.Not(p.free[u]),
                                s.oreq[t] != -1,
                                s.oreq[u] == s.oreq[t],
                                s.oblk[u] == s.oblk[t],
                            )
                        )
                    )
        G["kv_freed"].append(Guard("free_owned_only", z3.And(whole), "whole"))

        # RowReleased
        per_req(
            "row_released",
            "free_owned_only",
            lambda i: z3.And(
                s.phase[i] != NEW,
                s.row[i] == p.row,
                self._sel(s.holder, p.row) == i,
            ),
        )

        # Forward
        G["forward"].append(Guard("step_per_row", no_pending))
        G["forward"].append(Guard("forward_ready", z3.Or(p.f_in)))
        G["forward"].append(Guard("forward_policy", s.ncommit == 0, "after_commit"))
        all_done = z3.And([z3.Implies(p.f_in[i], s.bph[i] == DONE) for i in range(n)])
        G["forward"].append(
            Guard(
                "batch_stable",
                z3.Implies(s.nfwd > 0, z3.And([p.f_in[i] == s.batch[i] for i in range(n)])),
            )
        )
        G["forward"].append(
            Guard(
                "forward_policy",
                z3.Implies(
                    s.nfwd > 0,
                    z3.If(cfg.sync, z3.Not(all_done), z3.And(cfg.reloop, z3.Not(s.newly))),
                ),
                "again",
            )
        )
        for i in range(n):
            fin = p.f_in[i]
            holds = z3.And(
                s.start[i] != -1,
                z3.And(
                    [
                        z3.Implies(self.in_block(s.start[i], t), self.owns(s, t, i, s.com[i]))
                        for t in range(self.S)
                    ]
                ),
                s.start[i] + b <= self.S,
            )
            expected = z3.If(s.masks[i] == -1, self.initial_masks(s.pl[i], s.com[i]), s.masks[i])
            retained = z3.And(s.around[i] >= 0, s.around[i] < s.round)
            for rule, expr, tag in (
                ("known_request", self.active(s, i), ""),
                ("forward_ready", s.row[i] != -1, "row"),
                ("forward_ready", z3.And(s.bph[i] != NONE_BLOCK, p.f_blk[i] == s.com[i]), "cur"),
                ("whole_block_rows", p.f_ntok[i] == b, ""),
                ("forward_ready", holds, "slots"),
                ("committed_prefix_kept", self.prefix_kept(s, i), ""),
                ("reuse_keeps_slots", p.f_reused[i] == retained, "flag"),
                ("carrier_continuity", p.f_masked[i] == expected, ""),
            ):
                G["forward"].append(Guard(rule, z3.Implies(fin, expr), tag))

        # StepResult
        i_pmask = self._sel(s.pmask, p.req)
        done = p.accept == b
        trig_cond = {
            STEP_DONE: done,
            STEP_NOT_DONE_MASKED: z3.And(z3.Not(done), p.rem > 0),
            STEP_NOT_DONE_COMPLETE: z3.And(z3.Not(done), p.rem == 0),
        }
        per_req(
            "step_result",
            "step_per_row",
            lambda i: z3.And(s.pend[i], p.blk == s.com[i]),
        )
        G["step_result"].append(
            Guard(
                "accept_length",
                z3.And(z3.Or(p.accept == 0, p.accept == b), p.rem >= 0, p.rem <= i_pmask),
            )
        )
        G["step_result"].append(
            Guard("final_forward_before_commit", z3.Implies(done, i_pmask == 0))
        )

        def step_enabled(i: int) -> Z:
            return z3.Or(
                [
                    z3.And(cond, _table(BLOCK_LIFECYCLE, BLK, s.bph[i], trig)[0])
                    for trig, cond in trig_cond.items()
                ]
            )

        per_req("step_result", "lifecycle", step_enabled)

        # BlockCommitted
        per_req("block_committed", "known_request", lambda i: self.active(s, i))
        G["block_committed"].append(Guard("step_per_row", no_pending))
        per_req(
            "block_committed",
            "lifecycle",
            lambda i: z3.And(s.bph[i] != NONE_BLOCK, p.blk == s.com[i]),
        )
        per_req(
            "block_committed",
            "final_forward_before_commit",
            lambda i: _table(BLOCK_LIFECYCLE, BLK, s.bph[i], "block_committed")[0],
        )
        G["block_committed"].append(Guard("prompt_preserved", p.tok_ok))
        per_req(
            "block_committed",
            "lifecycle",
            lambda i: _table(REQUEST_LIFECYCLE, REQ, s.phase[i], "block_committed")[0],
            "request",
        )

        # Finished
        per_req("finished", "known_request", lambda i: self.active(s, i))
        per_req(
            "finished",
            "lifecycle",
            lambda i: _table(REQUEST_LIFECYCLE, REQ, s.phase[i], "finished")[0],
        )
        per_req(
            "finished",
            "finish_condition",
            lambda i: z3.And(
                self.finish_due(s, i),
                z3.Implies(p.reason == REASON[FinishReason.EOS], s.eos[i]),
                z3.Implies(p.reason == REASON[FinishReason.LENGTH], self.gen_len(s, i) >= s.mn[i]),
            ),
        )
        per_req("finished", "terminal_owns_nothing", lambda i: z3.Not(self.owns_any(s, i)), "slots")
        per_req("finished", "terminal_owns_nothing", lambda i: s.row[i] == -1, "row")

        # Aborted
        per_req(
            "aborted",
            "known_request",
            lambda i: _table(REQUEST_LIFECYCLE, REQ, s.phase[i], "aborted")[0],
        )
        per_req("aborted", "step_per_row", lambda i: z3.Not(s.pend[i]))
        G["aborted"].append(Guard("scheduler_phase", s.nfwd == 0))
        per_req("aborted", "terminal_owns_nothing", lambda i: z3.Not(self.owns_any(s, i)), "slots")
        per_req("aborted", "terminal_owns_nothing", lambda i: s.row[i] == -1, "row")

        # ControlReturned
        G["control_returned"].append(Guard("round_order", p.idx == s.round))
        G["control_returned"].append(Guard("step_per_row", no_pending))
        for i in range(n):
            act = self.active(s, i)
            present = s.bph[i] != NONE_BLOCK
            unfinished = z3.Or(s.bph[i] == MASKED, s.bph[i] == DENOISING, s.bph[i] == COMPLETE)
            for rule, expr, tag in (
                ("row_exclusive", s.row[i] != -1, ""),
                ("committed_prefix_kept", self.prefix_kept(s, i), ""),
                ("fdfo_releases_same_round", z3.Not(self.finish_due(s, i)), "finish"),
                ("sync_yields_when_all_done", z3.Implies(present, z3.Not(cfg.sync)), ""),
                ("fdfo_releases_same_round", s.bph[i] != DONE, "done"),
                (
                    "reuse_keeps_slots",
                    z3.Implies(z3.And(unfinished, cfg.reuse), s.start[i] != -1),
                    "",
                ),
                (
                    "no_reuse_releases",
                    z3.Implies(z3.And(unfinished, z3.Not(cfg.reuse)), s.start[i] == -1),
                    "",
                ),
            ):
                G["control_returned"].append(Guard(rule, z3.Implies(act, expr), tag))
        any_active = z3.Or([self.active(s, i) for i in range(n)])
        queued = z3.Or([s.phase[i] == QUEUED for i in range(n)])
        nothing_held = z3.And(
            z3.And([o == -1 for o in s.oreq]), z3.And([h == -1 for h in s.holder])
        )
        G["control_returned"].append(
            Guard(
                "progress",
                z3.Implies(
                    s.nfwd == 0,
                    z3.And(z3.Not(any_active), z3.Not(z3.And(queued, nothing_held))),
                ),
            )
        )
        return G

    # ------------------------------------------------------------------ effects
    def effects(self, s: State, p: Params) -> State:
        """Next-state terms: for every variable, an if-then-else over the event kind."""
        n, b = self.N, self.B
        upd: dict[str, dict[tuple[str, int], Z]] = {k: {} for k in KIND}

        def put(kind: str, f: str, i: int, val: Z) -> None:
            upd[kind][(f, i)] = val

        def put_req(kind: str, f: str, val: Callable[[int], Z]) -> None:
            for i in range(n):
                put(kind, f, i, z3.If(p.req == i, val(i), s.v[f][i]))

        def clear_current(kind: str) -> None:
            put_req(kind, "bph", lambda i: NONE_BLOCK)
            put_req(kind, "start", lambda i: -1)
            put_req(kind, "masks", lambda i: -1)
            put_req(kind, "around", lambda i: -1)

        G = "__global__"

        # Submitted
        put_req("submitted", "phase", lambda i: QUEUED)
        put_req("submitted", "pl", lambda i: p.pl)
        put_req("submitted", "mn", lambda i: p.mn)
        put_req("submitted", "pages", lambda i: p.pages)
        put_req("submitted", "row", lambda i: -1)
        put_req("submitted", "com", lambda i: 0)
        put_req("submitted", "eos", lambda i: z3.BoolVal(False))
        clear_current("submitted")

        # Admitted
        put_req("admitted", "phase", lambda i: ADMITTED)
        put_req("admitted", "row", lambda i: p.row)
        for r in range(self.R):
            put("admitted", "holder", r, z3.If(p.row == r, p.req, s.holder[r]))

        # KvAllocated
        for t in range(self.S):
            ins = self.in_block(p.start, t)
            put("kv_allocated", "oreq", t, z3.If(ins, p.req, s.oreq[t]))
            put("kv_allocated", "oblk", t, z3.If(ins, p.blk, s.oblk[t]))
        for i in range(n):
            present = s.bph[i] != NONE_BLOCK
            sel = p.req == i
            target = _table(REQUEST_LIFECYCLE, REQ, s.phase[i], "kv_allocated")[1]
            put("kv_allocated", "start", i, z3.If(sel, p.start, s.start[i]))
            put("kv_allocated", "around", i, z3.If(sel, s.round, s.around[i]))
            put(
                "kv_allocated",
                "bph",
                i,
                z3.If(z3.And(sel, z3.Not(present)), MASKED, s.bph[i]),
            )
            put(
                "kv_allocated",
                "masks",
                i,
                z3.If(z3.And(sel, z3.Not(present)), -1, s.masks[i]),
            )
            put(
                "kv_allocated",
                "phase",
                i,
                z3.If(z3.And(sel, z3.Not(present)), target, s.phase[i]),
            )

        # KvFreed
        for t in range(self.S):
            put("kv_freed", "oreq", t, z3.If(p.free[t], -1, s.oreq[t]))
            put("kv_freed", "oblk", t, z3.If(p.free[t], 0, s.oblk[t]))
            put("kv_freed", "freed_by", t, z3.If(p.free[t], p.req, s.freed_by[t]))
        for i in range(n):
            hit = z3.Or([z3.And(p.free[t], self.in_block(s.start[i], t)) for t in range(self.S)])
            cond = z3.And(p.req == i, s.bph[i] != NONE_BLOCK, s.start[i] != -1, hit)
            put("kv_freed", "start", i, z3.If(cond, -1, s.start[i]))

        # RowReleased
        put_req("row_released", "row", lambda i: -1)
        for r in range(self.R):
            put("row_released", "holder", r, z3.If(p.row == r, -1, s.holder[r]))

        # Forward
        for i in range(n):
            put("forward", "batch", i, p.f_in[i])
            put("forward", "pend", i, p.f_in[i])
            put("forward", "pmask", i, z3.If(p.f_in[i], p.f_masked[i], 0))
        put("forward", G + "nfwd", 0, s.nfwd + 1)
        put("forward", G + "newly", 0, z3.BoolVal(False))

        # StepResult
        done = p.accept == b
        for i in range(n):
            sel = p.req == i
            tgt_done = _table(BLOCK_LIFECYCLE, BLK, s.bph[i], STEP_DONE)[1]
            tgt_mask = _table(BLOCK_LIFECYCLE, BLK, s.bph[i], STEP_NOT_DONE_MASKED)[1]
            tgt_comp = _table(BLOCK_LIFECYCLE, BLK, s.bph[i], STEP_NOT_DONE_COMPLETE)[1]
            target = z3.If(done, tgt_done, z3.If(p.rem > 0, tgt_mask, tgt_comp))
            put("step_result", "bph", i, z3.If(sel, target, s.bph[i]))
            put("step_result", "masks", i, z3.If(sel, p.rem, s.masks[i]))
            put("step_result", "pend", i, z3.If(sel, False, s.pend[i]))
            put("step_result", "pmask", i, z3.If(sel, 0, s.pmask[i]))
        newly_done = z3.Or([z3.And(p.req == i, done, s.bph[i] != DONE) for i in range(n)])
        put("step_result", G + "newly", 0, z3.Or(s.newly, newly_done))

        # BlockCommitted
        put_req("block_committed", "com", lambda i: s.com[i] + 1)
        put_req(
            "block_committed",
            "phase",
            lambda i: _table(REQUEST_LIFECYCLE, REQ, s.phase[i], "block_committed")[1],
        )
        put_req("block_committed", "eos", lambda i: z3.Or(s.eos[i], p.blk_eos))
        clear_current("block_committed")
        put("block_committed", G + "ncommit", 0, s.ncommit + 1)

        # Finished
        put_req(
            "finished",
            "phase",
            lambda i: _table(REQUEST_LIFECYCLE, REQ, s.phase[i], "finished")[1],
        )

        # Aborted
        put_req("aborted", "phase", lambda i: ABORTED)
        clear_current("aborted")

        # ControlReturned
        put("control_returned", G + "round", 0, s.round + 1)
        put("control_returned", G + "nfwd", 0, z3.IntVal(0))
        put("control_returned", G + "newly", 0, z3.BoolVal(False))
        put("control_returned", G + "ncommit", 0, z3.IntVal(0))
        for i in range(n):
            put("control_returned", "batch", i, z3.BoolVal(False))
            put("control_returned", "pend", i, z3.BoolVal(False))
            put("control_returned", "pmask", i, z3.IntVal(0))

        # combine: an if-then-else chain over the kinds that touch each variable
        values: dict[str, list[Z]] = {f: list(terms) for f, terms in s.v.items()}
        globals_: dict[str, Z] = dict(s.g)
        for kind, changes in upd.items():
            cond = p.kind == KIND[kind]
            for (f, i), val in changes.items():
                if f.startswith(G):
                    name = f[len(G) :]
                    globals_[name] = z3.If(cond, val, globals_[name])
                else:
                    values[f][i] = z3.If(cond, val, values[f][i])
        return State(self.geom, values, globals_)

    # ------------------------------------------------------------------ the relation
    def enabled(
        self,
        s: State,
        p: Params,
        relax: Sequence[Relaxation] = (),
        guards: Mapping[str, list[Guard]] | None = None,
    ) -> Z:
        """The event `p` is enabled in `s` (with the relaxations applied)."""
        G = guards if guards is not None else self.guards(s, p)
        alts = []
        for kind, gs in G.items():
            conj = []
            for g in gs:
                rx = next((r for r in relax if r.matches(kind, g)), None)
                if rx is None:
                    conj.append(g.expr)
                elif rx.replacement is not None:
                    conj.append(rx.replacement(s, p))
            alts.append(z3.And(p.kind == KIND[kind], *conj))
        return z3.Or(alts)

    def build_transition(
        self, s: State, p: Params, s2: State, relax: Sequence[Relaxation] = ()
    ) -> Z:
        """T(s, p, s2) built from the guards and effects (see `transition`)."""
        nxt = self.effects(s, p)
        return z3.And(self.params_ok(s, p), self.enabled(s, p, relax), s2.equals(nxt))

    def transition(self, s: State, p: Params, s2: State, relax: Sequence[Relaxation] = ()) -> Z:
        """T(s, p, s2): event p is well-formed, enabled in s, and s2 is its effect.

        The relation is built once per encoding (and relaxation) over template copies and
        instantiated for (s, p, s2) by substitution: every copy is the same definition."""
        key = tuple(relax)
        if key not in self._templates:
            ts, tp, ts2 = self.state("T.s"), self.params("T.p"), self.state("T.t")
            self._templates[key] = (ts, tp, ts2, self.build_transition(ts, tp, ts2, relax))
        ts, tp, ts2, rel = self._templates[key]
        pairs = list(zip(ts.terms(), s.terms(), strict=True))
        pairs += list(zip(param_terms(tp).values(), param_terms(p).values(), strict=True))
        pairs += list(zip(ts2.terms(), s2.terms(), strict=True))
        return z3.substitute(rel, *pairs)

    def rule_guard(self, s: State, p: Params, kind: str, rule: str, tag: str = "") -> Z:
        """The conjunction of the guards of `kind` labelled `rule` (and `tag`)."""
        gs = [
            g.expr for g in self.guards(s, p)[kind] if g.rule == rule and (not tag or g.tag == tag)
        ]
        return z3.And(gs) if gs else z3.BoolVal(True)

    # ------------------------------------------------------------------ invariants
    def invariants(self, s: State) -> dict[str, Z]:
        """The named invariants of `spec.invariants.INVARIANTS`, as formulas over `s`."""
        n, b, S, P = self.N, self.B, self.S, self.P

        def submitted(i: Z) -> Z:
            return self._sel([s.phase[j] != NEW for j in range(n)], i)

        no_leak = []
        for t in range(S):
            o = s.oreq[t]
            live = z3.Or(
                [
                    z3.And(
                        o == i,
                        s.phase[i] != NEW,
                        z3.Or(
                            s.oblk[t] < s.com[i],
                            z3.And(s.bph[i] != NONE_BLOCK, s.oblk[t] == s.com[i]),
                        ),
                    )
                    for i in range(n)
                ]
            )
            no_leak.append(z3.Implies(o != -1, z3.And(t < self.pool, live)))

        terminal = []
        for i in range(n):
            terminal.append(
                z3.Implies(
                    self.terminal(s, i),
                    z3.And(
                        z3.Not(self.owns_any(s, i)),
                        s.row[i] == -1,
                        z3.And([h != i for h in s.holder]),
                    ),
                )
            )

        rows = []
        for r in range(self.R):
            h = s.holder[r]
            rows.append(
                z3.Implies(
                    h != -1,
                    z3.And(
                        r < self.cfg.rows,
                        submitted(h),
                        self._sel(s.row, h) == r,
                    ),
                )
            )
        for i in range(n):
            rows.append(
                z3.Implies(
                    z3.And(s.phase[i] != NEW, s.row[i] != -1),
                    self._sel(s.holder, s.row[i]) == i,
                )
            )

        whole = []
        for t in range(S):
            count = _sum([z3.And(s.oreq[u] == s.oreq[t], s.oblk[u] == s.oblk[t]) for u in range(S)])
            whole.append(z3.Implies(s.oreq[t] != -1, count == b))

        align = []
        for t in range(S):
            owned = s.oreq[t] != -1
            at_offset = (t % P) == self.page_offset(s.oblk[t])
            cont = (
                z3.And(s.oreq[t - 1] == s.oreq[t], s.oblk[t - 1] == s.oblk[t])
                if t % P != 0
                else z3.BoolVal(False)
            )
            align.append(z3.Implies(owned, z3.Or(at_offset, cont)))
            for u in range(t + 1, S):
                both = z3.And(owned, s.oreq[u] != -1)
                if t // P != u // P:
                    align.append(
                        z3.Implies(
                            both,
                            z3.Not(z3.And(s.oreq[u] == s.oreq[t], s.oblk[u] == s.oblk[t])),
                        )
                    )
                else:
                    align.append(z3.Implies(both, s.oreq[u] == s.oreq[t]))

        keeps = []
        for i in range(n):
            has = z3.And(self.active(s, i), s.bph[i] != NONE_BLOCK, s.start[i] != -1)
            keeps.append(
                z3.Implies(
                    has,
                    z3.And(
                        s.start[i] >= 0,
                        s.start[i] + b <= S,
                        z3.And(
                            [
                                z3.Implies(
                                    self.in_block(s.start[i], t), self.owns(s, t, i, s.com[i])
                                )
                                for t in range(S)
                            ]
                        ),
                    ),
                )
            )

        carriers = []
        for i in range(n):
            carried = z3.Or(s.bph[i] == DENOISING, s.bph[i] == COMPLETE)
            carriers.append(z3.Implies(carried, s.masks[i] != -1))
            carriers.append(
                z3.Implies(z3.And(s.phase[i] != NEW, s.bph[i] != NONE_BLOCK), self.active(s, i))
            )

        return {
            "no_leak": z3.And(no_leak),
            "terminal_owns_nothing": z3.And(terminal),
            "max_running": self.n_active(s) <= self.cfg.max_running,
            "row_exclusive": z3.And(rows),
            "whole_block_alloc": z3.And(whole),
            "page_alignment": z3.And(align),
            "reuse_keeps_slots": z3.And(keeps),
            "carriers_iff_unfinished": z3.And(carriers),
        }

    def lemmas(self, s: State) -> dict[str, Z]:
        """Strengthening lemmas (Ivy-style): facts of every reachable state that make the named
        invariants inductive. Each is itself proved (inductive together with the invariants)."""
        n, S = self.N, self.S
        out: dict[str, Z] = {}
        out["domain"] = self.domain(s)
        out["unsubmitted_is_blank"] = z3.And(
            [
                z3.Implies(
                    s.phase[i] == NEW,
                    z3.And(
                        s.bph[i] == NONE_BLOCK,
                        s.row[i] == -1,
                        z3.Not(s.pend[i]),
                        z3.Not(self.owns_any(s, i)),
                        z3.And([h != i for h in s.holder]),
                    ),
                )
                for i in range(n)
            ]
        )
        out["queued_holds_nothing"] = z3.And(
            [
                z3.Implies(
                    s.phase[i] == QUEUED,
                    z3.And(
                        s.bph[i] == NONE_BLOCK,
                        s.row[i] == -1,
                        z3.Not(s.pend[i]),
                        z3.Not(self.owns_any(s, i)),
                    ),
                )
                for i in range(n)
            ]
        )
        out["running_iff_current_block"] = z3.And(
            [
                z3.Implies(
                    z3.Or(s.phase[i] == ADMITTED, s.phase[i] == RUNNING),
                    (s.phase[i] == RUNNING) == (s.bph[i] != NONE_BLOCK),
                )
                for i in range(n)
            ]
        )
        out["slotless_block_owns_nothing"] = z3.And(
            [
                z3.Implies(
                    z3.And(s.bph[i] != NONE_BLOCK, s.start[i] == -1),
                    z3.And([z3.Not(self.owns(s, t, i, s.com[i])) for t in range(S)]),
                )
                for i in range(n)
            ]
        )
        out["pending_rows_are_running"] = z3.And(
            [z3.Implies(s.pend[i], s.phase[i] == RUNNING) for i in range(n)]
        )
        out["current_block_allocated"] = z3.And(
            [
                z3.Implies(
                    s.bph[i] != NONE_BLOCK,
                    z3.And(
                        s.bph[i] != BLK[BlockPhase.COMMITTED.value],
                        s.around[i] >= 0,
                        s.around[i] <= s.round,
                    ),
                )
                for i in range(n)
            ]
        )
        out["block_runs"] = self.block_runs(s)
        return out

    def block_runs(self, s: State) -> Z:
        """Local form of whole blocks: an owned slot at its block's page offset starts a run of
        exactly block_size slots with the same owner. With `page_alignment` (every owned slot
        is at its offset or continues its predecessor, one page per block) this implies
        `whole_block_alloc`, and it is much cheaper to carry through a transition."""
        b, P, S = self.B, self.P, self.S
        parts = []
        for t in range(S):
            c = t % P
            if c % b or c + b > P:
                continue
            starts = z3.And(s.oreq[t] != -1, self.page_offset(s.oblk[t]) == c)
            same = [
                z3.And(s.oreq[t + j] == s.oreq[t], s.oblk[t + j] == s.oblk[t]) for j in range(1, b)
            ]
            if c + b < P:
                same.append(z3.Not(z3.And(s.oreq[t + b] == s.oreq[t], s.oblk[t + b] == s.oblk[t])))
            parts.append(z3.Implies(starts, z3.And(same)))
        return z3.And(parts)


# ---------------------------------------------------------------------------- concrete <-> symbolic

Values = dict[str, int | bool]  # label (as in State.items) -> concrete value


class NotEncodable(ValueError):
    """A concrete state or event lies outside the encoding (too many requests, a block whose
    slots are not contiguous, ...)."""


def _rid(i: int) -> str:
    return f"r{i}"


def request_order(machine: Any) -> list[str]:
    """Request ids in submission order (= symbolic request indices)."""
    return list(machine._requests)


def encode_machine(machine: Any, geom: Geometry) -> Values:
    """The symbolic values of a `SpecMachine`'s state (non-ghost fields; ghosts derived)."""
    cfg: DllmConfig = machine.config
    if cfg.kv_pages > geom.kv_pages or (cfg.block_size, cfg.page_size) != (
        geom.block_size,
        geom.page_size,
    ):
        raise NotEncodable(f"config {cfg} does not match geometry {geom}")
    if cfg.req_pool_rows > geom.rows or cfg.max_running_requests > geom.running:
        raise NotEncodable("rows or max_running beyond the geometry")
    order = request_order(machine)
    if len(order) > geom.requests:
        raise NotEncodable(f"{len(order)} requests > {geom.requests}")
    index = {rid: i for i, rid in enumerate(order)}
    queued = [rid for rid in order if machine._requests[rid].phase is RequestPhase.QUEUED]
    if list(machine._queue) != queued:
        # the encoding's queue is "the queued requests in submission order"
        raise NotEncodable(f"queue {list(machine._queue)} is not the queued requests {queued}")
    rnd = machine._round
    out: Values = {}
    pend_masks: dict[str, int] = {}
    for (rid, blk), m in rnd.pending.items():
        r = machine._requests.get(rid)
        if r is None or r.current is None or r.current.index != blk or rid in pend_masks:
            raise NotEncodable(f"pending key {(rid, blk)} is not the request's current block")
        pend_masks[rid] = m
    batch = set()
    for rid, blk in rnd.batch:
        # the key's block is the current one, or the one committed after the forward
        if rid not in machine._requests:
            raise NotEncodable(f"batch key {(rid, blk)} names an unknown request")
        batch.add(rid)
    eos_id = cfg.eos_token_id
    for i in range(geom.requests):
        rid = order[i] if i < len(order) else None
        r = machine._requests.get(rid) if rid is not None else None
        if r is None:
            vals: dict[str, int | bool] = {
                "phase": NEW,
                "pl": 0,
                "mn": 0,
                "pages": 0,
                "row": -1,
                "com": 0,
                "bph": NONE_BLOCK,
                "start": -1,
                "masks": -1,
                "around": -1,
                "eos": False,
                "batch": False,
                "pend": False,
                "pmask": 0,
            }
        else:
            cur = r.current
            if cur is not None and cur.index != r.committed_blocks:
                raise NotEncodable("current block index differs from committed blocks")
            start = -1
            if cur is not None and cur.slots is not None:
                sl = tuple(cur.slots)
                if (
                    len(sl) != geom.block_size
                    or sl != tuple(range(sl[0], sl[0] + len(sl)))
                    or sl[0] < 0
                ):
                    raise NotEncodable(f"current block slots {sl} are not a contiguous block")
                start = sl[0]
            if r.row is not None and not 0 <= r.row < geom.rows:
                raise NotEncodable(f"row {r.row} outside the represented rows")
            gen = list(r.tokens[len(r.prompt) :])[: r.max_new_tokens]
            pl, mn = len(r.prompt), r.max_new_tokens
            vals = {
                "phase": REQ[r.phase.value],
                "pl": pl,
                "mn": mn,
                "pages": -(-(pl + mn) // geom.page_size),
                "row": -1 if r.row is None else r.row,
                "com": r.committed_blocks,
                "bph": NONE_BLOCK if cur is None else BLK[cur.phase.value],
                "start": start,
                "masks": -1 if cur is None or cur.masks is None else cur.masks,
                "around": -1 if cur is None or cur.alloc_round is None else cur.alloc_round,
                "eos": eos_id is not None and eos_id in gen,
                "batch": rid in batch,
                "pend": rid in pend_masks,
                "pmask": pend_masks.get(rid, 0) if rid is not None else 0,
            }
        for f, _ in REQ_FIELDS:
            out[f"{f}[{i}]"] = vals[f]
    holders = {row: rid for row, rid in machine._rows.items()}
    for row in holders:
        if not 0 <= row < geom.rows:
            raise NotEncodable(f"row {row} outside the represented rows")
    for r_ in range(geom.rows):
        h = holders.get(r_)
        if h is not None and h not in index:
            raise NotEncodable(f"row {r_} held by unknown request {h!r}")
        out[f"holder[{r_}]"] = -1 if h is None else index[h]
    for t in machine._owner:
        if not 0 <= t < geom.kv_slots:
            raise NotEncodable(f"slot {t} outside the pool")
    for t in range(geom.kv_slots):
        o = machine._owner.get(t)
        if o is not None and o[0] not in index:
            raise NotEncodable(f"slot {t} owned by unknown request {o[0]!r}")
        out[f"oreq[{t}]"] = -1 if o is None else index[o[0]]
        out[f"oblk[{t}]"] = 0 if o is None else o[1]
        out[f"freed_by[{t}]"] = -1
    out["round"] = rnd.index
    out["nfwd"] = rnd.forwards
    out["newly"] = rnd.newly_done_in_last_forward
    out["ncommit"] = rnd.committed
    return out


def encode_event(machine: Any, geom: Geometry, event: Event) -> Values:
    """The symbolic parameters of a concrete event in the machine's current state."""
    cfg: DllmConfig = machine.config
    order = request_order(machine)
    index = {rid: i for i, rid in enumerate(order)}

    def idx(rid: str) -> int:
        if rid in index:
            return index[rid]
        if len(order) < geom.requests:
            return len(order)  # an unknown id: the next (unsubmitted) index
        raise NotEncodable(f"no index left for unknown request {rid!r}")

    out: Values = {
        "kind": KIND[event.kind],
        "req": 0,
        "row": 0,
        "blk": 0,
        "start": 0,
        "accept": 0,
        "rem": 0,
        "reason": 0,
        "pl": 0,
        "mn": 0,
        "pages": 0,
        "prompt_ok": True,
        "tok_ok": True,
        "blk_eos": False,
        "idx": 0,
    }
    for t in range(geom.kv_slots):
        out[f"free[{t}]"] = False
    for i in range(geom.requests):
        out[f"f_in[{i}]"] = False
        out[f"f_blk[{i}]"] = 0
        out[f"f_reused[{i}]"] = False
        out[f"f_ntok[{i}]"] = 0
        out[f"f_masked[{i}]"] = 0

    def row_param(row: int) -> int:
        if not 0 <= row < geom.rows:
            raise NotEncodable(f"row {row} outside the represented rows")
        return row

    if isinstance(event, Submitted):
        if event.request_id in index:
            out["req"] = index[event.request_id]
        else:
            out["req"] = idx(event.request_id)
        pl, mn = len(event.prompt), event.max_new_tokens
        if not isinstance(mn, int) or isinstance(mn, bool):
            raise NotEncodable("max_new_tokens is not an int")
        if not isinstance(event.request_id, str) or not event.request_id:
            raise NotEncodable("request id is not a non-empty string")
        out["pl"], out["mn"] = pl, mn
        out["pages"] = -(-(pl + mn) // geom.page_size)
        out["prompt_ok"] = all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 and x != cfg.mask_token_id
            for x in event.prompt
        )
    elif isinstance(event, Admitted | RowAcquired | RowReleased):
        out["req"] = idx(event.request_id)
        out["row"] = row_param(event.row)
    elif isinstance(event, KvAllocated):
        out["req"] = idx(event.request_id)
        sl = tuple(event.slots)
        if len(sl) != geom.block_size or sl != tuple(range(sl[0], sl[0] + len(sl))):
            raise NotEncodable(f"allocated slots {sl} are not a contiguous block")
        out["blk"] = event.block_index
        out["start"] = sl[0]
    elif isinstance(event, KvFreed):
        out["req"] = idx(event.request_id)
        if len(set(event.slots)) != len(event.slots):
            raise NotEncodable("duplicate slots in one free")
        for t in event.slots:
            if not 0 <= t < geom.kv_slots:
                raise NotEncodable(f"freed slot {t} outside the pool")
            out[f"free[{t}]"] = True
    elif isinstance(event, Forward):
        seen = set()
        for row in event.rows:
            i = idx(row.request_id)
            if i in seen:
                raise NotEncodable("a request twice in one forward")
            seen.add(i)
            out[f"f_in[{i}]"] = True
            out[f"f_blk[{i}]"] = row.block_index
            out[f"f_reused[{i}]"] = row.reused
            out[f"f_ntok[{i}]"] = row.num_tokens
            out[f"f_masked[{i}]"] = row.masked
    elif isinstance(event, StepResult):
        out["req"] = idx(event.request_id)
        out["blk"] = event.block_index
        out["accept"] = event.accept_length
        out["rem"] = event.masks_remaining
    elif isinstance(event, BlockCommitted):
        i = idx(event.request_id)
        out["req"] = i
        out["blk"] = event.block_index
        r = machine._requests.get(event.request_id)
        toks = tuple(event.tokens)
        ok = len(toks) == cfg.block_size and cfg.mask_token_id not in toks
        eos = False
        if r is not None:
            start = event.block_index * cfg.block_size
            for k, tok in enumerate(toks):
                pos = start + k
                if pos < len(r.prompt) and r.prompt[pos] != tok:
                    ok = False
                if (
                    cfg.eos_token_id is not None
                    and tok == cfg.eos_token_id
                    and len(r.prompt) <= pos < len(r.prompt) + r.max_new_tokens
                ):
                    eos = True
        out["tok_ok"] = ok
        out["blk_eos"] = eos
    elif isinstance(event, Finished):
        out["req"] = idx(event.request_id)
        out["reason"] = REASON[event.reason]
    elif isinstance(event, Aborted):
        out["req"] = idx(event.request_id)
    elif isinstance(event, ControlReturned):
        out["idx"] = event.round_index
    else:  # pragma: no cover - every event type is handled above
        raise NotEncodable(f"unknown event {event!r}")
    return out


def param_terms(p: Params) -> dict[str, Z]:
    out: dict[str, Z] = {
        "kind": p.kind,
        "req": p.req,
        "row": p.row,
        "blk": p.blk,
        "start": p.start,
        "accept": p.accept,
        "rem": p.rem,
        "reason": p.reason,
        "pl": p.pl,
        "mn": p.mn,
        "pages": p.pages,
        "prompt_ok": p.prompt_ok,
        "tok_ok": p.tok_ok,
        "blk_eos": p.blk_eos,
        "idx": p.idx,
    }
    for t, x in enumerate(p.free):
        out[f"free[{t}]"] = x
    for name in ("f_in", "f_blk", "f_reused", "f_ntok", "f_masked"):
        for i, x in enumerate(getattr(p, name)):
            out[f"{name}[{i}]"] = x
    return out


def z3val(v: int | bool) -> Z:
    return z3.BoolVal(v) if isinstance(v, bool) else z3.IntVal(v)


def pyval(t: Z) -> int | bool:
    if z3.is_true(t):
        return True
    if z3.is_false(t):
        return False
    if z3.is_int_value(t):
        return int(t.as_long())
    raise ValueError(f"not a concrete value: {t}")


# ---------------------------------------------------------------------------- decoding models


@dataclass
class DecodedStep:
    """One step of a symbolic trace, as a concrete spec event."""

    event: Event
    kind: str


@dataclass
class Decoder:
    """Turns model values of (state, params) into concrete events (ids "r0", "r1", ...)."""

    geom: Geometry
    config: DllmConfig
    prompts: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def event(self, model: Z, s: State, p: Params) -> Event:
        def ev(x: Z) -> int | bool:
            return pyval(model.eval(x, model_completion=True))

        kind = KIND_NAME[int(ev(p.kind))]
        i = int(ev(p.req))
        rid = _rid(i)
        b = self.geom.block_size
        if kind == "submitted":
            pl, mn = int(ev(p.pl)), int(ev(p.mn))
            tok = PROMPT_TOKEN if ev(p.prompt_ok) else self.config.mask_token_id
            prompt = (tok,) * pl
            self.prompts[i] = prompt
            return Submitted(rid, prompt, mn)
        if kind == "admitted":
            return Admitted(rid, int(ev(p.row)))
        if kind == "row_acquired":
            return RowAcquired(rid, int(ev(p.row)))
        if kind == "row_released":
            return RowReleased(rid, int(ev(p.row)))
        if kind == "kv_allocated":
            start = int(ev(p.start))
            return KvAllocated(rid, int(ev(p.blk)), tuple(range(start, start + b)))
        if kind == "kv_freed":
            return KvFreed(rid, tuple(t for t in range(self.geom.kv_slots) if ev(p.free[t])))
        if kind == "forward":
            rows = tuple(
                ForwardRow(
                    _rid(j),
                    int(ev(p.f_blk[j])),
                    bool(ev(p.f_reused[j])),
                    int(ev(p.f_ntok[j])),
                    int(ev(p.f_masked[j])),
                )
                for j in range(self.geom.requests)
                if ev(p.f_in[j])
            )
            return Forward(rows)
        if kind == "step_result":
            return StepResult(rid, int(ev(p.blk)), int(ev(p.accept)), int(ev(p.rem)))
        if kind == "block_committed":
            blk = int(ev(p.blk))
            prompt = self.prompts.get(i, ())
            mn = int(ev(s.mn[i]))
            toks: list[int] = []
            eos_left = bool(ev(p.blk_eos))
            for k in range(b):
                pos = blk * b + k
                if pos < len(prompt):
                    toks.append(prompt[pos])
                elif eos_left and pos < len(prompt) + mn:
                    toks.append(EOS_TOKEN)
                    eos_left = False
                else:
                    toks.append(FILLER_TOKEN)
            if not ev(p.tok_ok):
                toks[-1] = self.config.mask_token_id
            return BlockCommitted(rid, blk, tuple(toks))
        if kind == "finished":
            return Finished(rid, REASON_OF[int(ev(p.reason))])
        if kind == "aborted":
            return Aborted(rid)
        if kind == "control_returned":
            return ControlReturned(int(ev(p.idx)))
        raise ValueError(kind)  # pragma: no cover


def render_values(model: Z, s: State, geom: Geometry) -> str:
    """A compact rendering of one symbolic state in a model (for CTIs and traces)."""

    def ev(x: Z) -> int | bool:
        return pyval(model.eval(x, model_completion=True))

    lines = [
        f"round {ev(s.round)}: forwards={ev(s.nfwd)} newly_done={ev(s.newly)} "
        f"commits={ev(s.ncommit)}"
    ]
    owners: dict[int, list[int]] = {}
    for t in range(geom.kv_slots):
        o = int(ev(s.oreq[t]))
        if o != -1:
            owners.setdefault(o, []).append(t)
    free = [t for t in range(geom.kv_slots) if int(ev(s.oreq[t])) == -1]
    lines.append(f"free slots ({len(free)}): {free}")
    for i in range(geom.requests):
        ph = REQ_NAME.get(int(ev(s.phase[i])), "?")
        bph = BLK_NAME.get(int(ev(s.bph[i])), "?")
        own = " ".join(f"{t}:b{ev(s.oblk[t])}" for t in owners.get(i, []))
        lines.append(
            f"r{i}: {ph} pl={ev(s.pl[i])} mn={ev(s.mn[i])} row={ev(s.row[i])} "
            f"committed={ev(s.com[i])} current=[{bph} start={ev(s.start[i])} "
            f"masks={ev(s.masks[i])} alloc_round={ev(s.around[i])}] eos={ev(s.eos[i])} "
            f"batch={ev(s.batch[i])} pending={ev(s.pend[i])}/{ev(s.pmask[i])} owns=[{own}]"
        )
    lines.append(f"rows: {[ev(h) for h in s.holder]}")
    return "\n".join(lines)


def rid_of(i: int) -> str:
    return _rid(i)


def all_kinds() -> list[str]:
    return list(KIND)


__all__ = [
    "BLK",
    "KIND",
    "REQ",
    "Decoder",
    "Encoding",
    "Geometry",
    "Guard",
    "NotEncodable",
    "Params",
    "Relaxation",
    "State",
    "SymConfig",
    "encode_event",
    "encode_machine",
    "param_terms",
    "pyval",
    "render_values",
    "z3val",
]
