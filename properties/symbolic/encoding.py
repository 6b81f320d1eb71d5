"""`Encoding`: the symbolic spec for one geometry and one (symbolic or concrete) policy.

It holds the sizes (N requests, R rows, S slot variables, block size B, page size P, and the
configuration's pool of `kv_pages * P` slots), makes copies of the state and the event
parameters, defines the derived predicates every guard and invariant is written with, and is
the entry point to the relation (`relation`), the invariants (`invariants`) and the lemmas
(`lemmas`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import z3

from properties.symbolic import invariants as _invariants
from properties.symbolic import lemmas as _lemmas
from properties.symbolic import relation as _relation
from properties.symbolic.codes import (
    ABORTED,
    ADMITTED,
    COMPLETE,
    DENOISING,
    FINISHED,
    QUEUED,
    RUNNING,
)
from properties.symbolic.geometry import Geometry, SymConfig
from properties.symbolic.guard import Guard, Relaxation
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import Z, count


class Encoding:
    """The symbolic spec for one geometry and one (symbolic or concrete) policy."""

    def __init__(self, geom: Geometry, cfg: SymConfig | None = None) -> None:
        self.geom = geom
        self.cfg: SymConfig = cfg if cfg is not None else SymConfig.symbolic()
        self.N: int = geom.requests
        self.R: int = geom.rows
        self.S: int = geom.kv_slots  # slot variables: the largest pool of the geometry
        self.B: int = geom.block_size
        self.P: int = geom.page_size
        self.pool: Z = self.cfg.kv_pages * geom.page_size  # slots of this configuration's pool
        # the relation per relaxation, over template copies (see `relation.transition`)
        self.templates: dict[tuple[Relaxation, ...], tuple[State, Params, State, Z]] = {}
        self._prefix: dict[tuple[int, int], Z] = {}

    # ------------------------------------------------------------------ copies
    def state(self, name: str) -> State:
        """A copy of the state in fresh variables named after `name` (`State.fresh`)."""
        return State.fresh(self.geom, name)

    def params(self, name: str) -> Params:
        """A copy of the event parameters in fresh variables named after `name` (`Params.fresh`)."""
        return Params.fresh(self.geom, name)

    # ------------------------------------------------------------------ derived predicates
    def active(self, s: State, i: int) -> Z:
        """phase[i] ∈ {admitted, running}."""
        return z3.Or(s.phase[i] == ADMITTED, s.phase[i] == RUNNING)

    def terminal(self, s: State, i: int) -> Z:
        """phase[i] ∈ {finished, aborted}."""
        return z3.Or(s.phase[i] == FINISHED, s.phase[i] == ABORTED)

    def n_active(self, s: State) -> Z:
        """|{i : active(i)}|."""
        return count([self.active(s, i) for i in range(self.N)])

    def owns(self, s: State, t: int, i: int, blk: Z) -> Z:
        """Slot t is owned by (request i, block blk)."""
        return z3.And(s.owner_request[t] == i, s.owner_block[t] == blk)

    def owns_any(self, s: State, i: int) -> Z:
        """∃t: owner_request[t] = i."""
        return z3.Or([s.owner_request[t] == i for t in range(self.S)])

    def free(self, s: State, t: int) -> Z:
        """Slot t is free: no request owns it and the prefix cache does not hold it."""
        return z3.And(s.owner_request[t] == -1, z3.Not(s.cached[t]))

    def read_by(self, s: State, t: int, i: int) -> Z:
        """Request i reads the cached block holding slot t (`State.read_by[t * N + i]`)."""
        return s.read_by[t * self.N + i]

    def reads_block(self, s: State, i: int, blk: Z) -> Z:
        """Request i reads its block `blk` from the cache:
        ∃t: read_by(t, i) ∧ cached[t] ∧ cache_block[t] = blk."""
        return z3.Or(
            [
                z3.And(self.read_by(s, t, i), s.cached[t], s.cache_block[t] == blk)
                for t in range(self.S)
            ]
        )

    def reads_any(self, s: State, i: int) -> Z:
        """Request i reads some cached block: ∃t: read_by(t, i)."""
        return z3.Or([self.read_by(s, t, i) for t in range(self.S)])

    def same_key(self, s: State, j: Z, i: int, blk: Z) -> Z:
        """Block `blk` of request j and block `blk` of request i have one content key: j = i,
        or their prompts start with more than `blk` whole blocks alike
        (blk < shared_prefix(j, i))."""
        alts = []
        for x in range(self.N):
            same = z3.BoolVal(True) if x == i else blk < s.shared_prefix[x * self.N + i]
            alts.append(z3.And(j == x, same))
        return z3.Or(alts)

    def key_origin(self, s: State, i: int, blk: Z) -> Z:
        """The canonical request of the content key of block `blk` of request i: the lowest
        index j with same_key(j, i, blk) (i itself at the latest)."""
        origin: Z = z3.IntVal(i)
        for j in reversed(range(i)):
            origin = z3.If(self.same_key(s, z3.IntVal(j), i, blk), j, origin)
        return origin

    def in_block(self, start: Z, t: int) -> Z:
        """start <= t < start + B."""
        return z3.And(start <= t, t < start + self.B)

    def generated_len(self, s: State, i: int) -> Z:
        """Committed tokens past the prompt: max(0, committed_blocks * B - prompt_len)."""
        x = s.committed_blocks[i] * self.B - s.prompt_len[i]
        return z3.If(x > 0, x, 0)

    def finish_due(self, s: State, i: int) -> Z:
        """`spec.machine.finish_condition` is not None:
        eos_committed ∨ stop_token_committed ∨ generated_len >= max_new_tokens."""
        return z3.Or(
            s.eos_committed[i],
            s.stop_token_committed[i],
            self.generated_len(s, i) >= s.max_new_tokens[i],
        )

    def committed_generated_this_round(self, s: State, i: int) -> Z:
        """`SpecMachine._committed_generated_this_round`: request i committed a block holding a
        generated token in this round (where an engine checks its stops and applies a pending
        abort): committed_this_round ∧ `spec.machine.stop_output_lengths` is non-empty, i.e.
        with before_last = max(0, (committed_blocks - 1) * B - prompt_len) (the generated tokens
        of the blocks before the last): before_last < min(generated_len, max_new_tokens)."""
        x = (s.committed_blocks[i] - 1) * self.B - s.prompt_len[i]
        before_last = z3.If(x > 0, x, 0)
        return z3.And(
            s.committed_this_round[i],
            before_last < self.generated_len(s, i),
            before_last < s.max_new_tokens[i],
        )

    def stop_allowed(self, s: State, i: int) -> Z:
        """`SpecMachine._require_stop_allowed` passes:
        stop_sampled ∧ committed_generated_this_round."""
        return z3.And(s.stop_sampled[i], self.committed_generated_this_round(s, i))

    def initial_masks(self, prompt_len: Z, k: Z) -> Z:
        """`spec.machine.initial_masks`: max(0, min(B, k*B + B - prompt_len))."""
        x = k * self.B + self.B - prompt_len
        y = z3.If(x < self.B, x, self.B)
        return z3.If(y > 0, y, 0)

    def prefix_kept(self, s: State, i: int) -> Z:
        """Every committed block k < committed_blocks[i] owns exactly B slots, or request i
        reads it from the prefix cache (`SpecMachine._check_prefix`)."""
        key = (s.committed_blocks[i].get_id(), i)
        if key not in self._prefix:
            cap = self.S // self.B
            parts = [s.committed_blocks[i] <= cap]
            for k in range(cap):
                n = count([self.owns(s, t, i, k) for t in range(self.S)])
                held = z3.Or(n == self.B, self.reads_block(s, i, k))
                parts.append(z3.Implies(k < s.committed_blocks[i], held))
            self._prefix[key] = z3.And(parts)
        return self._prefix[key]

    def page_offset(self, blk: Z) -> Z:
        """The slot offset of block `blk` inside its page: (blk mod P/B) * B."""
        bpp = self.geom.blocks_per_page
        return z3.IntVal(0) if bpp == 1 else (blk % bpp) * self.B

    def reserved_pages(self, s: State) -> Z:
        """Worst-case pages of the running requests (what the reference reserves)."""
        return z3.Sum([z3.If(self.active(s, i), s.reserved_pages[i], 0) for i in range(self.N)])

    def prefill_block(self, s: State, i: int, blk: Z) -> Z:
        """Block `blk` of request i holds only prompt tokens: (blk + 1) * B <= prompt_len[i]
        (`SpecMachine._is_prefill_block`)."""
        return (blk + 1) * self.B <= s.prompt_len[i]

    def prefill_kind(self, s: State, i: int, blk: Z) -> Z:
        """Under PREFILL_FIRST, a row of request i feeding block `blk` is a prefill row: a
        prompt-only block, or the block it computes right after a cache hit in this round
        (`SpecMachine._prefill_kind`: hit_this_round[i] ∧ blk = committed_blocks[i])."""
        after_hit = z3.And(s.hit_this_round[i], blk == s.committed_blocks[i])
        return z3.Or(self.prefill_block(s, i, blk), after_hit)

    def may_lack_row(self, s: State, i: int) -> Z:
        """Between rounds, request i may hold no row (`SpecMachine._may_lack_row`): rows are
        released between rounds, FDFO without in-place reuse, and its current block is carried
        (denoising or complete)."""
        cfg = self.cfg
        carried = z3.Or(s.block_phase[i] == DENOISING, s.block_phase[i] == COMPLETE)
        return z3.And(cfg.rows_released, z3.Not(cfg.sync), z3.Not(cfg.reuse), carried)

    def ahead(self, s: State, j: int, i: int) -> Z:
        """Request j comes before request i in the queue (`SpecMachine._enqueue`): (priority[j]
        under `priority_order`, -max_new_tokens[j] under `longest_output_first`, j) is less than
        the same of i, lexicographically (`DllmPolicy.queue_key`, the index breaking ties; the
        indices follow submission order). Under neither option: j < i."""
        by_index = z3.BoolVal(j < i)
        mn = s.max_new_tokens
        longer, same = mn[j] > mn[i], mn[j] == mn[i]
        by_length = z3.If(
            self.cfg.longest_output_first, z3.Or(longer, z3.And(same, by_index)), by_index
        )
        lower, tied = s.priority[j] < s.priority[i], s.priority[j] == s.priority[i]
        return z3.If(self.cfg.priority_order, z3.Or(lower, z3.And(tied, by_length)), by_length)

    def work_conserved(self, s: State) -> Z:
        """`SpecMachine._check_work_conserving` passes: the policy does not ask for it, or the
        round admitted a request, or nothing is queued, or every seat or every row is taken,
        or the head of the queue (the queued request no other queued one is `ahead` of) does
        not fit the pages the active requests' worst-case footprints leave; under
        `free_queue_order`, some queued request does not fit them."""
        cfg, n = self.cfg, self.N
        queued = [s.phase[j] == QUEUED for j in range(n)]
        rows_held = count([h != -1 for h in s.row_holder])
        claimed = self.reserved_pages(s)
        # the head is queued j with nothing queued ahead of it; it fits the unclaimed pages
        fits = z3.Or(
            [
                z3.And(
                    queued[j],
                    *[z3.Not(z3.And(queued[k], self.ahead(s, k, j))) for k in range(n) if k != j],
                    claimed + s.reserved_pages[j] <= cfg.kv_pages,
                )
                for j in range(n)
            ]
        )
        every_fits = z3.And(
            z3.Or(queued),
            *[
                z3.Implies(queued[j], claimed + s.reserved_pages[j] <= cfg.kv_pages)
                for j in range(n)
            ],
        )
        idle = z3.And(
            cfg.work_conserving,
            z3.Not(s.round_admitted),
            self.n_active(s) < cfg.max_running,
            rows_held < cfg.rows,
            z3.If(cfg.free_queue_order, every_fits, fits),
        )
        return z3.Not(idle)

    def no_step_pending(self, s: State) -> Z:
        """No row of the latest forward awaits its step: ∧_i ¬step_pending[i]."""
        return z3.And([z3.Not(x) for x in s.step_pending])

    # ------------------------------------------------------------------ entry points
    def init(self, s: State) -> Z:
        """The initial state, under a valid configuration."""
        return z3.And([self.cfg.constraints(self.geom), *s.initial_conditions()])

    def domain(self, s: State) -> Z:
        """Value ranges of the representation (`lemmas.domain`)."""
        return _lemmas.domain(self, s)

    def guards(self, s: State, p: Params) -> dict[str, list[Guard]]:
        """Labelled guards of every event kind (`relation.guards`)."""
        return _relation.guards(self, s, p)

    def effects(self, s: State, p: Params) -> State:
        """The successor terms (`relation.next_state`)."""
        return _relation.next_state(self, s, p)

    def params_ok(self, s: State, p: Params) -> Z:
        """Well-formed parameters (`relation.well_formed`)."""
        return _relation.well_formed(self, s, p)

    def enabled(
        self,
        s: State,
        p: Params,
        relax: Sequence[Relaxation] = (),
        guards: Mapping[str, list[Guard]] | None = None,
    ) -> Z:
        """The event `p` is enabled in `s` (`relation.enabled`)."""
        return _relation.enabled(self, s, p, relax, guards)

    def transition(self, s: State, p: Params, s2: State, relax: Sequence[Relaxation] = ()) -> Z:
        """T(s, p, s2) (`relation.transition`)."""
        return _relation.transition(self, s, p, s2, relax)

    def rule_guard(self, s: State, p: Params, kind: str, rule: str, tag: str = "") -> Z:
        """The guards of `kind` labelled `rule` (`relation.rule_guard`)."""
        return _relation.rule_guard(self, s, p, kind, rule, tag)

    def invariants(self, s: State) -> dict[str, Z]:
        """The named invariants of `spec.invariants` (`invariants.invariants`)."""
        return _invariants.invariants(self, s)

    def lemmas(self, s: State) -> dict[str, Z]:
        """The strengthening lemmas (`lemmas.lemmas`)."""
        return _lemmas.lemmas(self, s)
