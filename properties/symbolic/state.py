"""The symbolic state: one copy of `spec.state.AbstractState` as z3 variables.

Field names follow `spec.state` (`RequestState`, `BlockState`, `RoundState`, `AbstractState`);
where a spec field is a structure, the encoding keeps what the guards need:

per request i (`RequestState`, in submission order; index i is request "r<i>"):
  phase[i]              request phase code (`codes.REQ`; 0 = not submitted yet)
  prompt_len[i]         len(prompt)
  max_new_tokens[i]     max_new_tokens; under `longest_output_first` the queue is by
                        (-max_new_tokens, index), after the priority under both options
  reserved_pages[i]     ghost: worst-case KV pages ceil((prompt_len + max_new_tokens) / P)
  row[i]                request-pool row, -1 = none
  committed_blocks[i]   committed blocks (= the index of the current block)
  block_phase[i]        current block's phase code (`codes.BLK`; 0 = no current block)
  block_start[i]        current block's first KV slot, -1 = holds no slots
  masks[i]              masks left after the block's latest step, -1 = not stepped yet
  alloc_round[i]        round the current block's slots were allocated in, -1 = never
  eos_committed[i]      the first token that ends it (within max_new_tokens) is a committed EOS
  stop_token_committed[i]  ... is one of its committed stop token ids (`finish_condition` STOP)
  stop_sampled[i]       it may finish with STOP (`RequestState.stop_sampled`)
  ignore_eos[i]         no token ends it (`RequestState.ignore_eos`): eos_committed[i] and
                        stop_token_committed[i] stay false
  has_stop_token_ids[i]  it lists stop token ids (`RequestState.stop_token_ids` is not empty)
  priority[i]           its priority as submitted (`RequestState.priority`); under
                        `priority_order` the queue is by (priority, index) (`Encoding.ahead`)
  committed_this_round[i]  it committed a block in this round
                        (`RequestState.last_commit_round` = `RoundState.index`)
  in_batch[i]           a row of this round's forwards (`RoundState.batch`)
  step_pending[i]       its row of the latest forward awaits a step (`RoundState.pending_steps`)
  pending_masks[i]      that row's input mask count (`RoundState.pending_masks`; 0 if none)
  hit_this_round[i]     it read its next block from the cache in this round
                        (`RequestState.hit_round` = `RoundState.index`): under PREFILL_FIRST
                        the block it computes next is a prefill row
per request-pool row r:   row_holder[r]  request index, -1 = free (`AbstractState.rows`)
per KV slot t (`AbstractState.slot_owners`):
  owner_request[t]      request index, -1 = free
  owner_block[t]        block index (0 when free)
  freed_by[t]           ghost: the request that last freed the slot, -1 = never
  cached[t]             the prefix cache holds it (`AbstractState.cache`; then unowned)
  cache_origin[t], cache_block[t]  a cached slot's content key: block cache_block[t] of
                        request cache_origin[t], the lowest request whose block has that key
                        (`Encoding.key_origin`; -1 and 0 when not cached)
per (request i, request j), index i * N + j (i != j):
  shared_prefix[i * N + j]  whole prompt blocks that the prompts of i and j start with alike
                        (their prompts' content, as far as the prefix cache can tell): the
                        content key of block k of i equals that of block k of j exactly when
                        k < shared_prefix (`Encoding.same_key`); a generated block is its own
per (slot t, request i), index t * N + i:
  read_by[t * N + i]    request i reads the cached block holding t (`RequestState.cache_reads`;
                        as its block cache_block[t], the only index whose key can match)
per round (`RoundState`): round_index, round_forwards, round_committed,
  newly_done_in_last_forward, round_admitted (`RoundState.admitted` > 0: the round admitted a
  request, which is what rule work_conserving asks)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

import z3

from properties.symbolic.codes import NEW, NONE_BLOCK
from properties.symbolic.geometry import Geometry
from properties.symbolic.terms import Z

Terms = tuple[Z, ...]


class Scope(Enum):
    """How many copies of a field a state has."""

    REQUEST = "request"
    ROW = "row"
    SLOT = "slot"
    SLOT_REQUEST = "slot x request"
    REQUEST_PAIR = "request x request"
    ROUND = "round"  # one (a scalar)


@dataclass(frozen=True, slots=True)
class Field:
    """One field of the symbolic state: its scope, sort, value in the initial state, and
    whether it is a ghost (proof bookkeeping that the spec state does not have)."""

    name: str
    scope: Scope
    is_bool: bool
    initial: int | bool
    ghost: bool = False
    # the prefix cache's: a constant (its initial value) in a geometry without the cache, so
    # the queries of the other geometries carry no variable of it
    cache: bool = False


FIELDS: tuple[Field, ...] = (
    Field("phase", Scope.REQUEST, False, NEW),
    Field("prompt_len", Scope.REQUEST, False, 0),
    Field("max_new_tokens", Scope.REQUEST, False, 0),
    Field("reserved_pages", Scope.REQUEST, False, 0, ghost=True),
    Field("row", Scope.REQUEST, False, -1),
    Field("committed_blocks", Scope.REQUEST, False, 0),
    Field("block_phase", Scope.REQUEST, False, NONE_BLOCK),
    Field("block_start", Scope.REQUEST, False, -1),
    Field("masks", Scope.REQUEST, False, -1),
    Field("alloc_round", Scope.REQUEST, False, -1),
    Field("eos_committed", Scope.REQUEST, True, False),
    Field("stop_sampled", Scope.REQUEST, True, False),
    Field("ignore_eos", Scope.REQUEST, True, False),
    Field("stop_token_committed", Scope.REQUEST, True, False),
    Field("has_stop_token_ids", Scope.REQUEST, True, False),
    Field("priority", Scope.REQUEST, False, 0),
    Field("committed_this_round", Scope.REQUEST, True, False),
    Field("in_batch", Scope.REQUEST, True, False),
    Field("step_pending", Scope.REQUEST, True, False),
    Field("pending_masks", Scope.REQUEST, False, 0),
    Field("hit_this_round", Scope.REQUEST, True, False, cache=True),
    Field("row_holder", Scope.ROW, False, -1),
    Field("owner_request", Scope.SLOT, False, -1),
    Field("owner_block", Scope.SLOT, False, 0),
    Field("freed_by", Scope.SLOT, False, -1, ghost=True),
    Field("cached", Scope.SLOT, True, False, cache=True),
    Field("cache_origin", Scope.SLOT, False, -1, cache=True),
    Field("cache_block", Scope.SLOT, False, 0, cache=True),
    Field("read_by", Scope.SLOT_REQUEST, True, False, cache=True),
    Field("shared_prefix", Scope.REQUEST_PAIR, False, 0, cache=True),
    Field("round_index", Scope.ROUND, False, 0),
    Field("round_forwards", Scope.ROUND, False, 0),
    Field("newly_done_in_last_forward", Scope.ROUND, True, False),
    Field("round_committed", Scope.ROUND, False, 0),
    Field("round_admitted", Scope.ROUND, True, False),
)
FIELD = {f.name: f for f in FIELDS}
GHOST_FIELDS = frozenset(f.name for f in FIELDS if f.ghost)


def copies(geom: Geometry, scope: Scope) -> int:
    """How many copies of a field of `scope` a state of `geom` has (0 for a scalar)."""
    return {
        Scope.REQUEST: geom.requests,
        Scope.ROW: geom.rows,
        Scope.SLOT: geom.kv_slots,
        Scope.SLOT_REQUEST: geom.kv_slots * geom.requests,
        Scope.REQUEST_PAIR: geom.requests * geom.requests,
        Scope.ROUND: 0,
    }[scope]


@dataclass(frozen=True, slots=True, eq=False)
class State:
    """One copy of the symbolic state (see the module docstring for every field)."""

    geom: Geometry
    phase: Terms
    prompt_len: Terms
    max_new_tokens: Terms
    reserved_pages: Terms
    row: Terms
    committed_blocks: Terms
    block_phase: Terms
    block_start: Terms
    masks: Terms
    alloc_round: Terms
    eos_committed: Terms
    stop_sampled: Terms
    ignore_eos: Terms
    stop_token_committed: Terms
    has_stop_token_ids: Terms
    priority: Terms
    committed_this_round: Terms
    in_batch: Terms
    step_pending: Terms
    pending_masks: Terms
    hit_this_round: Terms
    row_holder: Terms
    owner_request: Terms
    owner_block: Terms
    freed_by: Terms
    cached: Terms
    cache_origin: Terms
    cache_block: Terms
    read_by: Terms
    shared_prefix: Terms
    round_index: Z
    round_forwards: Z
    newly_done_in_last_forward: Z
    round_committed: Z
    round_admitted: Z

    @classmethod
    def fresh(cls, geom: Geometry, name: str) -> State:
        """A copy of fresh variables named `<name>.<field>[<i>]` (`<name>.<field>` for scalars;
        the cache's fields are constants in a geometry without the cache)."""

        def var(label: str, f: Field) -> Z:
            if f.cache and not geom.prefix_cache:
                return z3.BoolVal(bool(f.initial)) if f.is_bool else z3.IntVal(int(f.initial))
            return z3.Bool(label) if f.is_bool else z3.Int(label)

        values: dict[str, Any] = {}
        for f in FIELDS:
            n = copies(geom, f.scope)
            if f.scope is Scope.ROUND:
                values[f.name] = var(f"{name}.{f.name}", f)
            else:
                values[f.name] = tuple(var(f"{name}.{f.name}[{i}]", f) for i in range(n))
        return cls(geom, **values)

    def replace(self, **changes: Any) -> State:
        """This state with some fields replaced (the effect of an event)."""
        return dataclasses.replace(self, **changes)

    def items(self, ghosts: bool = True) -> Iterator[tuple[str, Z]]:
        """(label, term) of every variable in a fixed order; labels are `field[i]` or `field`."""
        for f in FIELDS:
            if f.ghost and not ghosts:
                continue
            value = getattr(self, f.name)
            if f.scope is Scope.ROUND:
                yield f.name, value
            else:
                for i, t in enumerate(value):
                    yield f"{f.name}[{i}]", t

    def terms(self) -> list[Z]:
        """Every variable, ghosts included, in the fixed order of `items`."""
        return [t for _, t in self.items()]

    def equals(self, other: State, ghosts: bool = True) -> Z:
        """Every variable (ghosts too, unless `ghosts` is False) equals `other`'s."""
        mine = dict(self.items(ghosts))
        return z3.And([mine[k] == t for k, t in other.items(ghosts)])

    def initial_conditions(self) -> list[Z]:
        """The initial state: every field at its `Field.initial` value (nothing submitted)."""

        def at_initial(f: Field, t: Z) -> Z:
            return z3.Not(t) if f.initial is False else t == f.initial

        parts: list[Z] = []
        for scope in (
            Scope.REQUEST,
            Scope.ROW,
            Scope.SLOT,
            Scope.SLOT_REQUEST,
            Scope.REQUEST_PAIR,
        ):
            group = [f for f in FIELDS if f.scope is scope]
            for i in range(copies(self.geom, scope)):
                parts += [at_initial(f, getattr(self, f.name)[i]) for f in group]
        parts += [at_initial(f, getattr(self, f.name)) for f in FIELDS if f.scope is Scope.ROUND]
        return parts
