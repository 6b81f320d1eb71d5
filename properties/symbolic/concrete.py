"""Concrete to symbolic: the values of an `AbstractState` and of an event, by variable label.

Request indices follow `state.requests`' order (`SpecMachine.state()` lists requests in
submission order), so request i is the i-th submitted request. Ghost fields get the values the
proofs assume (`reserved_pages` its definition, `freed_by` -1).

A prompt's content is kept as far as the prefix cache can tell: the whole prompt blocks each
two prompts start with alike (`shared_prompt_blocks`). With the cache on, a state in which two
requests share a block past those (a generated block) lies outside the encoding, and so does a
cached block that no request's committed tokens or prompt reproduce.
"""

from __future__ import annotations

from collections.abc import Sequence

from properties.symbolic.codes import BLK, KIND, NONE_BLOCK, REASON, REQ
from properties.symbolic.geometry import Geometry
from properties.symbolic.state import FIELDS, Scope, copies
from properties.symbolic.terms import Values
from spec.config import DllmConfig, validate_stop_token_ids
from spec.errors import RequestError
from spec.events import (
    Aborted,
    Admitted,
    BlockCommitted,
    CacheEvicted,
    CacheHit,
    CacheReleased,
    ControlReturned,
    Event,
    Finished,
    FinishReason,
    Forward,
    KvAllocated,
    KvCached,
    KvFreed,
    RowAcquired,
    RowReleased,
    StepResult,
    Submitted,
)
from spec.lifecycles import RequestPhase
from spec.machine import finish_condition
from spec.prefix_cache import ROOT, chain
from spec.profile import DllmPolicy
from spec.state import TERMINAL_PHASES, AbstractState, RequestState


class NotEncodable(ValueError):
    """A concrete state or event lies outside the encoding (too many requests, a block whose
    slots are not contiguous, ...)."""


_BLANK: Values = {
    f.name: f.initial for f in FIELDS if f.scope is Scope.REQUEST
}  # an unsubmitted request


def _check_geometry(cfg: DllmConfig, geom: Geometry) -> None:
    if cfg.kv_pages > geom.kv_pages or (cfg.block_size, cfg.page_size) != (
        geom.block_size,
        geom.page_size,
    ):
        raise NotEncodable(f"config {cfg} does not match geometry {geom}")
    if cfg.req_pool_rows > geom.rows or cfg.max_running_requests > geom.running:
        raise NotEncodable("rows or max_running beyond the geometry")
    if cfg.prefix_cache and not geom.prefix_cache:
        raise NotEncodable(f"prefix_cache=True outside a geometry with the cache ({geom.label()})")


def shared_prompt_blocks(first: Sequence[object], second: Sequence[object], block: int) -> int:
    """The whole prompt blocks two prompts start with alike (`State.shared_prefix`)."""
    n = 0
    while (n + 1) * block <= min(len(first), len(second)) and list(
        first[n * block : (n + 1) * block]
    ) == list(second[n * block : (n + 1) * block]):
        n += 1
    return n


def _known_digests(r: RequestState, block_size: int) -> list[str]:
    """The chained content digests (hex) of the whole blocks of `r` known so far: its committed
    tokens, then its prompt past them."""
    known = list(r.tokens) + list(r.prompt[len(r.tokens) :])
    out, digest = [], ROOT
    for k in range(len(known) // block_size):
        digest = chain(digest, known[k * block_size : (k + 1) * block_size])
        out.append(digest.hex())
    return out


def _empty_cache(geom: Geometry) -> Values:
    """The cache's per-slot and per-pair fields at their initial values: nothing cached, read
    or shared."""
    return {
        f"{f.name}[{i}]": f.initial
        for f in FIELDS
        if f.cache and f.scope is not Scope.REQUEST
        for i in range(copies(geom, f.scope))
    }


def _cache_values(state: AbstractState, geom: Geometry, order: list[str]) -> Values:
    """cached, cache_origin, cache_block, read_by and shared_prefix of a state with the prefix
    cache, where they differ from `_empty_cache`; checks that no two requests share a block
    past their prompts' shared whole blocks (a generated block: `NotEncodable`)."""
    b, n = geom.block_size, geom.requests
    index = {rid: i for i, rid in enumerate(order)}
    digests = [_known_digests(state.requests[rid], b) for rid in order]
    prompts = [state.requests[rid].prompt for rid in order]
    out: Values = {}
    for i in range(len(order)):
        for j in range(i + 1, len(order)):
            same = 0
            while same < min(len(digests[i]), len(digests[j])) and (
                digests[i][same] == digests[j][same]
            ):
                same += 1
            told = shared_prompt_blocks(prompts[i], prompts[j], b)
            if same != told:
                raise NotEncodable(
                    f"{order[i]!r} and {order[j]!r} share {same} blocks, {told} of them whole "
                    f"prompt blocks"
                )
            out[f"shared_prefix[{i * n + j}]"] = out[f"shared_prefix[{j * n + i}]"] = told
    for block in state.cache:
        first = _first_slot(tuple(block.slots), geom, "cached block")
        k = block.block_index
        origin = next(
            (i for i, d in enumerate(digests) if len(d) > k and d[k] == block.digest), None
        )
        if origin is None or first % b or first + b > geom.kv_slots:
            raise NotEncodable(f"cached block {list(block.slots)} is not encodable")
        for t in block.slots:
            out[f"cached[{t}]"] = True
            out[f"cache_origin[{t}]"] = origin
            out[f"cache_block[{t}]"] = k
            for rid, kk in block.readers:
                if rid not in index or kk != k:
                    raise NotEncodable(f"reader {(rid, kk)} of cached block {k}")
                out[f"read_by[{t * n + index[rid]}]"] = True
    return out


def _first_slot(slots: tuple[int, ...], geom: Geometry, what: str) -> int:
    """The first slot of a contiguous block of B slots (`NotEncodable` otherwise)."""
    if (
        len(slots) != geom.block_size
        or slots != tuple(range(slots[0], slots[0] + len(slots)))
        or slots[0] < 0
    ):
        raise NotEncodable(f"{what} slots {slots} are not a contiguous block")
    return slots[0]


def _request_values(
    r: RequestState, state: AbstractState, geom: Geometry, in_batch: bool
) -> Values:
    cur = r.current
    if cur is not None and cur.index != r.committed_blocks:
        raise NotEncodable("current block index differs from committed blocks")
    start = -1
    if cur is not None and cur.slots is not None:
        start = _first_slot(tuple(cur.slots), geom, "current block")
    if r.row is not None and not 0 <= r.row < geom.rows:
        raise NotEncodable(f"row {r.row} outside the represented rows")
    if r.phase not in TERMINAL_PHASES and len(r.tokens) != r.committed_blocks * geom.block_size:
        # the encoding's committed length is committed_blocks * B (`Encoding.generated_len`)
        raise NotEncodable(f"{len(r.tokens)} committed tokens in {r.committed_blocks} blocks")
    last = r.last_commit_round
    if last is not None and last > state.round.index:
        # the encoding keeps only "committed in this round", which a later round cannot be
        raise NotEncodable(f"latest commit in round {last}, after round {state.round.index}")
    due = finish_condition(state.config, r)
    pending = [m for (rid, _), m in state.round.pending_masks.items() if rid == r.request_id]
    pl, mn = len(r.prompt), r.max_new_tokens
    return {
        "phase": REQ[r.phase.value],
        "prompt_len": pl,
        "max_new_tokens": mn,
        "reserved_pages": -(-(pl + mn) // geom.page_size),
        "row": -1 if r.row is None else r.row,
        "committed_blocks": r.committed_blocks,
        "block_phase": NONE_BLOCK if cur is None else BLK[cur.phase.value],
        "block_start": start,
        "masks": -1 if cur is None or cur.masks is None else cur.masks,
        "alloc_round": -1 if cur is None or cur.alloc_round is None else cur.alloc_round,
        "eos_committed": due is FinishReason.EOS,
        "stop_sampled": r.stop_sampled,
        "ignore_eos": r.ignore_eos,
        "stop_token_committed": due is FinishReason.STOP,
        "has_stop_token_ids": bool(r.stop_token_ids),
        "priority": r.priority,
        "committed_this_round": last == state.round.index,
        "in_batch": in_batch,
        "step_pending": bool(pending),
        "pending_masks": pending[0] if pending else 0,
        "hit_this_round": r.hit_round == state.round.index and geom.prefix_cache,
    }


def encode_state(state: AbstractState, geom: Geometry, policy: DllmPolicy | None = None) -> Values:
    """The symbolic values of a spec state (ghosts included), its queue in the order of a
    machine under `policy` (default `DllmPolicy()`: submission order; `DllmPolicy.queue_key`
    under `priority_order` or `longest_output_first`). Raises `NotEncodable` when the state
    lies outside the encoding."""
    _check_geometry(state.config, geom)
    order = list(state.requests)
    if len(order) > geom.requests:
        raise NotEncodable(f"{len(order)} requests > {geom.requests}")
    index = {rid: i for i, rid in enumerate(order)}
    queued = [rid for rid in order if state.requests[rid].phase is RequestPhase.QUEUED]
    if policy is not None and policy.orders_queue:  # stable: submission order breaks ties
        requests = state.requests
        queued.sort(
            key=lambda rid: policy.queue_key(requests[rid].priority, requests[rid].max_new_tokens)
        )
    if list(state.queue) != queued:
        # the encoding's queue is "the queued requests in submission order", or by queue key
        raise NotEncodable(f"queue {list(state.queue)} is not the queued requests {queued}")
    rnd = state.round
    pending_of: set[str] = set()
    for rid, blk in rnd.pending_masks:
        r = state.requests.get(rid)
        if r is None or r.current is None or r.current.index != blk or rid in pending_of:
            raise NotEncodable(f"pending key {(rid, blk)} is not the request's current block")
        pending_of.add(rid)
    batch = set()
    for rid, blk in rnd.batch:
        # the key's block is the current one, or the one committed after the forward
        if rid not in state.requests:
            raise NotEncodable(f"batch key {(rid, blk)} names an unknown request")
        batch.add(rid)
    per_request: list[Values] = []
    for i in range(geom.requests):
        if i < len(order):
            rid = order[i]
            per_request.append(_request_values(state.requests[rid], state, geom, rid in batch))
        else:
            per_request.append(_BLANK)
    out: Values = {}
    for f in FIELDS:
        if f.scope is Scope.REQUEST:
            for i, vals in enumerate(per_request):
                out[f"{f.name}[{i}]"] = vals[f.name]
    for row in state.rows:
        if not 0 <= row < geom.rows:
            raise NotEncodable(f"row {row} outside the represented rows")
    for r_ in range(geom.rows):
        h = state.rows.get(r_)
        if h is not None and h not in index:
            raise NotEncodable(f"row {r_} held by unknown request {h!r}")
        out[f"row_holder[{r_}]"] = -1 if h is None else index[h]
    for t in state.slot_owners:
        if not 0 <= t < geom.kv_slots:
            raise NotEncodable(f"slot {t} outside the pool")
    for t in range(geom.kv_slots):
        o = state.slot_owners.get(t)
        if o is not None and o[0] not in index:
            raise NotEncodable(f"slot {t} owned by unknown request {o[0]!r}")
        out[f"owner_request[{t}]"] = -1 if o is None else index[o[0]]
        out[f"owner_block[{t}]"] = 0 if o is None else o[1]
        out[f"freed_by[{t}]"] = -1
    out.update(_empty_cache(geom))
    if state.config.prefix_cache:
        out.update(_cache_values(state, geom, order))
    out["round_index"] = rnd.index
    out["round_forwards"] = rnd.forwards
    out["newly_done_in_last_forward"] = rnd.newly_done_in_last_forward
    out["round_committed"] = rnd.committed
    out["round_admitted"] = rnd.admitted > 0
    return out


def encode_event(state: AbstractState, geom: Geometry, event: Event) -> Values:
    """The symbolic parameters of a concrete event in `state`. An unknown request id gets the
    next unsubmitted index; `NotEncodable` when the event lies outside the encoding."""
    cfg = state.config
    order = list(state.requests)
    index = {rid: i for i, rid in enumerate(order)}

    def idx(rid: str) -> int:
        if rid in index:
            return index[rid]
        if len(order) < geom.requests:
            return len(order)  # an unknown id: the next (unsubmitted) index
        raise NotEncodable(f"no index left for unknown request {rid!r}")

    def row_param(row: int) -> int:
        if not 0 <= row < geom.rows:
            raise NotEncodable(f"row {row} outside the represented rows")
        return row

    out: Values = {
        "kind": KIND[event.kind],
        "request": 0,
        "row": 0,
        "block_index": 0,
        "first_slot": 0,
        "accept_length": 0,
        "masks_remaining": 0,
        "reason": 0,
        "prompt_len": 0,
        "max_new_tokens": 0,
        "reserved_pages": 0,
        "prompt_valid": True,
        "stop_sampled": False,
        "ignore_eos": False,
        "has_stop_token_ids": False,
        "priority": 0,
        "tokens_valid": True,
        "block_has_eos": False,
        "block_has_stop_token": False,
        "stop_token_first": False,
        "round_index": 0,
    }
    for t in range(geom.kv_slots):
        out[f"freed[{t}]"] = False
    for i in range(geom.requests):
        out[f"forwarded[{i}]"] = False
        out[f"row_block_index[{i}]"] = 0
        out[f"row_reused[{i}]"] = False
        out[f"row_num_tokens[{i}]"] = 0
        out[f"row_masked[{i}]"] = 0
        out[f"shared_with[{i}]"] = 0

    if isinstance(event, Submitted):
        out["request"] = idx(event.request_id)
        pl, mn = len(event.prompt), event.max_new_tokens
        if not isinstance(mn, int) or isinstance(mn, bool):
            raise NotEncodable("max_new_tokens is not an int")
        if not isinstance(event.request_id, str) or not event.request_id:
            raise NotEncodable("request id is not a non-empty string")
        for flag in ("stop_sampled", "ignore_eos"):
            if not isinstance(getattr(event, flag), bool):
                raise NotEncodable(f"{flag} is not a bool")
            out[flag] = getattr(event, flag)
        try:
            validate_stop_token_ids(cfg, event.request_id, event.stop_token_ids)
        except RequestError as err:  # the encoding keeps only whether it lists any
            raise NotEncodable(f"stop token ids: {err}") from None
        out["has_stop_token_ids"] = bool(event.stop_token_ids)
        if not isinstance(event.priority, int) or isinstance(event.priority, bool):
            raise NotEncodable("priority is not an int")
        out["priority"] = event.priority
        if geom.prefix_cache:  # the whole blocks it shares with each earlier request
            me = out["request"]
            for j, rid in enumerate(order[: int(me)]):
                shared = shared_prompt_blocks(
                    event.prompt, state.requests[rid].prompt, geom.block_size
                )
                out[f"shared_with[{j}]"] = shared
        out["prompt_len"], out["max_new_tokens"] = pl, mn
        out["reserved_pages"] = -(-(pl + mn) // geom.page_size)
        out["prompt_valid"] = all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 and x != cfg.mask_token_id
            for x in event.prompt
        )
    elif isinstance(event, Admitted | RowAcquired | RowReleased):
        out["request"] = idx(event.request_id)
        out["row"] = row_param(event.row)
    elif isinstance(event, KvAllocated):
        out["request"] = idx(event.request_id)
        out["block_index"] = event.block_index
        sl = tuple(event.slots)
        if len(sl) != geom.block_size or sl != tuple(range(sl[0], sl[0] + len(sl))):
            raise NotEncodable(f"allocated slots {sl} are not a contiguous block")
        out["first_slot"] = sl[0]
    elif isinstance(event, KvFreed):
        out["request"] = idx(event.request_id)
        out.update(_slot_set(event.slots, geom, "freed"))
    elif isinstance(event, Forward):
        seen = set()
        for row in event.rows:
            i = idx(row.request_id)
            if i in seen:
                raise NotEncodable("a request twice in one forward")
            seen.add(i)
            out[f"forwarded[{i}]"] = True
            out[f"row_block_index[{i}]"] = row.block_index
            out[f"row_reused[{i}]"] = row.reused
            out[f"row_num_tokens[{i}]"] = row.num_tokens
            out[f"row_masked[{i}]"] = row.masked
    elif isinstance(event, StepResult):
        out["request"] = idx(event.request_id)
        out["block_index"] = event.block_index
        out["accept_length"] = event.accept_length
        out["masks_remaining"] = event.masks_remaining
    elif isinstance(event, BlockCommitted):
        out["request"] = idx(event.request_id)
        out["block_index"] = event.block_index
        valid, eos, stop = _committed_tokens(state, event)
        out["tokens_valid"] = valid
        out["block_has_eos"] = eos is not None
        out["block_has_stop_token"] = stop is not None
        out["stop_token_first"] = eos is not None and stop is not None and stop < eos
    elif isinstance(event, Finished):
        out["request"] = idx(event.request_id)
        out["reason"] = REASON[event.reason]
    elif isinstance(event, Aborted):
        out["request"] = idx(event.request_id)
    elif isinstance(event, ControlReturned):
        out["round_index"] = event.round_index
    elif isinstance(event, KvCached | CacheHit | CacheReleased):
        out["request"] = idx(event.request_id)
        out["block_index"] = event.block_index
        out["first_slot"] = _first_slot(tuple(event.slots), geom, event.kind)
    elif isinstance(event, CacheEvicted):
        out.update(_slot_set(event.slots, geom, "evicted"))
    else:  # pragma: no cover - every event type is handled above
        raise NotEncodable(f"unknown event {event!r}")
    return out


def _slot_set(slots: tuple[int, ...], geom: Geometry, what: str) -> Values:
    """The `freed[t]` parameters of a freed (or evicted) slot set; `NotEncodable` for a slot
    named twice or outside the slot variables."""
    if len(set(slots)) != len(slots):
        raise NotEncodable(f"duplicate slots in one {what} set")
    for t in slots:
        if not 0 <= t < geom.kv_slots:
            raise NotEncodable(f"{what} slot {t} outside the pool")
    return {f"freed[{t}]": True for t in slots}


def _committed_tokens(
    state: AbstractState, event: BlockCommitted
) -> tuple[bool, int | None, int | None]:
    """(the tokens keep the prompt and hold no mask, the block's first position holding an
    EOS, and one holding one of the request's stop token ids, within max_new_tokens) for a
    committed block."""
    cfg = state.config
    toks = tuple(event.tokens)
    valid = len(toks) == cfg.block_size and cfg.mask_token_id not in toks
    eos: int | None = None
    stop: int | None = None
    r = state.requests.get(event.request_id)
    if r is not None:
        start = event.block_index * cfg.block_size
        for k, tok in enumerate(toks):
            pos = start + k
            if pos < len(r.prompt) and r.prompt[pos] != tok:
                valid = False
            if not len(r.prompt) <= pos < len(r.prompt) + r.max_new_tokens:
                continue
            if eos is None and cfg.eos_token_id is not None and tok == cfg.eos_token_id:
                eos = k
            if stop is None and tok in r.stop_token_ids:
                stop = k
    return valid, eos, stop
