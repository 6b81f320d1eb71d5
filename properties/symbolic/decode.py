"""Symbolic to concrete: a model's events as spec events, and a model's state as text."""

from __future__ import annotations

from dataclasses import dataclass, field

from properties.symbolic.codes import (
    BLK_NAME,
    EOS_TOKEN,
    FILLER_TOKEN,
    KIND_NAME,
    PROMPT_TOKEN,
    REASON_OF,
    REQ_NAME,
    STOP_ID_TOKEN,
    TAIL_TOKEN,
)
from properties.symbolic.geometry import Geometry
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import Z, model_int, model_value
from spec.config import DllmConfig
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
    Forward,
    ForwardRow,
    KvAllocated,
    KvCached,
    KvFreed,
    RowAcquired,
    RowReleased,
    StepResult,
    Submitted,
)


def request_id(i: int) -> str:
    """The id of symbolic request i."""
    return f"r{i}"


@dataclass
class Decoder:
    """Turns model values of (state, params) into concrete events (ids "r0", "r1", ...).

    Decode a trace's steps in order: a `Submitted` records the prompt that the request's later
    `BlockCommitted` tokens must keep."""

    geom: Geometry
    config: DllmConfig
    prompts: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def event(self, model: Z, s: State, p: Params) -> Event:
        """The concrete event `model` gives the step from state `s` with params `p` (its kind is
        `p.kind`); call it for a trace's steps in order."""

        def num(x: Z) -> int:
            return model_int(model, x)

        def flag(x: Z) -> bool:
            return bool(model_value(model, x))

        kind = KIND_NAME[num(p.kind)]
        i = num(p.request)
        rid = request_id(i)
        b = self.geom.block_size
        if kind == "submitted":
            tok = PROMPT_TOKEN if flag(p.prompt_valid) else self.config.mask_token_id
            prompt = (tok,) * num(p.prompt_len)
            if self.config.prefix_cache and flag(p.prompt_valid):
                prompt = self._shared_prompt(i, num(p.prompt_len), [num(x) for x in p.shared_with])
            self.prompts[i] = prompt
            return Submitted(
                rid,
                prompt,
                num(p.max_new_tokens),
                stop_sampled=flag(p.stop_sampled),
                ignore_eos=flag(p.ignore_eos),
                stop_token_ids=(STOP_ID_TOKEN,) if flag(p.has_stop_token_ids) else (),
                priority=num(p.priority),
            )
        if kind == "admitted":
            return Admitted(rid, num(p.row))
        if kind == "row_acquired":
            return RowAcquired(rid, num(p.row))
        if kind == "row_released":
            return RowReleased(rid, num(p.row))
        if kind == "kv_allocated":
            start = num(p.first_slot)
            return KvAllocated(rid, num(p.block_index), tuple(range(start, start + b)))
        if kind == "kv_freed":
            return KvFreed(rid, tuple(t for t in range(self.geom.kv_slots) if flag(p.freed[t])))
        if kind == "forward":
            return Forward(
                tuple(
                    ForwardRow(
                        request_id(j),
                        num(p.row_block_index[j]),
                        flag(p.row_reused[j]),
                        num(p.row_num_tokens[j]),
                        num(p.row_masked[j]),
                    )
                    for j in range(self.geom.requests)
                    if flag(p.forwarded[j])
                )
            )
        if kind == "step_result":
            return StepResult(rid, num(p.block_index), num(p.accept_length), num(p.masks_remaining))
        if kind == "block_committed":
            blk = num(p.block_index)
            enders = [EOS_TOKEN] if flag(p.block_has_eos) else []
            if flag(p.block_has_stop_token):
                enders.insert(0 if flag(p.stop_token_first) else len(enders), STOP_ID_TOKEN)
            toks = self._block_tokens(i, blk, num(s.max_new_tokens[i]), enders)
            if not flag(p.tokens_valid):
                toks[-1] = self.config.mask_token_id
            return BlockCommitted(rid, blk, tuple(toks))
        if kind == "finished":
            return Finished(rid, REASON_OF[num(p.reason)])
        if kind == "aborted":
            return Aborted(rid)
        if kind == "control_returned":
            return ControlReturned(num(p.round_index))
        if kind in ("kv_cached", "cache_hit", "cache_released"):
            start = num(p.first_slot)
            slots, k = tuple(range(start, start + b)), num(p.block_index)
            if kind == "kv_cached":
                return KvCached(rid, k, slots)
            if kind == "cache_hit":
                return CacheHit(rid, k, slots)
            return CacheReleased(rid, k, slots)
        if kind == "cache_evicted":
            return CacheEvicted(tuple(t for t in range(self.geom.kv_slots) if flag(p.freed[t])))
        raise ValueError(kind)  # pragma: no cover

    def _shared_prompt(self, i: int, length: int, shared_with: list[int]) -> tuple[int, ...]:
        """Request i's prompt with the cache on: each whole block it shares with an earlier
        request (`shared_with[j]` blocks with request j) copied from that request's prompt, its
        own token `TAIL_TOKEN + i` everywhere else (the shared prefixes form a tree, so any
        request it shares a block with has the same one)."""
        b = self.geom.block_size
        out: list[int] = []
        for k in range(length // b + 1):
            donor = next((j for j, n in enumerate(shared_with) if j < i and n > k), None)
            part = self.prompts[donor][k * b : (k + 1) * b] if donor is not None else ()
            out += part or (TAIL_TOKEN + i,) * b
        return tuple(out[:length])

    def _block_tokens(self, i: int, blk: int, max_new: int, enders: list[int]) -> list[int]:
        """Block `blk` of request i: the prompt at prompt positions, the `enders` (an EOS, a
        stop token id, in order) at the first generated positions (as many as fit within
        max_new_tokens: the first decides), filler elsewhere."""
        b = self.geom.block_size
        prompt = self.prompts.get(i, ())
        toks: list[int] = []
        for k in range(b):
            pos = blk * b + k
            if pos < len(prompt):
                toks.append(prompt[pos])
            elif enders and pos < len(prompt) + max_new:
                toks.append(enders.pop(0))
            else:  # with the cache, a generated block is the request's own
                toks.append(FILLER_TOKEN + (TAIL_TOKEN + i if self.config.prefix_cache else 0))
        return toks


def render_values(model: Z, s: State, geom: Geometry) -> str:
    """A compact rendering of one symbolic state in a model (for CTIs and traces)."""

    def ev(x: Z) -> int | bool:
        return model_value(model, x)

    lines = [
        f"round {ev(s.round_index)}: forwards={ev(s.round_forwards)} "
        f"newly_done={ev(s.newly_done_in_last_forward)} commits={ev(s.round_committed)} "
        f"admitted={ev(s.round_admitted)}"
    ]
    owners: dict[int, list[int]] = {}
    for t in range(geom.kv_slots):
        o = int(ev(s.owner_request[t]))
        if o != -1:
            owners.setdefault(o, []).append(t)
    free = [
        t for t in range(geom.kv_slots) if int(ev(s.owner_request[t])) == -1 and not ev(s.cached[t])
    ]
    lines.append(f"free slots ({len(free)}): {free}")
    for i in range(geom.requests):
        ph = REQ_NAME.get(int(ev(s.phase[i])), "?")
        bph = BLK_NAME.get(int(ev(s.block_phase[i])), "?")
        own = " ".join(f"{t}:b{ev(s.owner_block[t])}" for t in owners.get(i, []))
        lines.append(
            f"r{i}: {ph} prompt_len={ev(s.prompt_len[i])} "
            f"max_new_tokens={ev(s.max_new_tokens[i])} row={ev(s.row[i])} "
            f"committed={ev(s.committed_blocks[i])} current=[{bph} "
            f"start={ev(s.block_start[i])} masks={ev(s.masks[i])} "
            f"alloc_round={ev(s.alloc_round[i])}] eos={ev(s.eos_committed[i])} "
            f"stop_token={ev(s.stop_token_committed[i])}/{ev(s.has_stop_token_ids[i])} "
            f"priority={ev(s.priority[i])} "
            f"stop_sampled={ev(s.stop_sampled[i])} ignore_eos={ev(s.ignore_eos[i])} "
            f"committed_this_round={ev(s.committed_this_round[i])} "
            f"batch={ev(s.in_batch[i])} pending={ev(s.step_pending[i])}/"
            f"{ev(s.pending_masks[i])} owns=[{own}]"
        )
    lines.append(f"rows: {[ev(h) for h in s.row_holder]}")
    cached = [t for t in range(geom.kv_slots) if ev(s.cached[t])]
    if cached:
        n = geom.requests
        lines.append(
            "cached: "
            + " ".join(
                f"{t}:r{ev(s.cache_origin[t])}/b{ev(s.cache_block[t])}"
                f"[read by {[i for i in range(n) if ev(s.read_by[t * n + i])]}]"
                for t in cached
            )
        )
    return "\n".join(lines)
