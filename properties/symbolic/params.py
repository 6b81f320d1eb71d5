"""The parameters of one symbolic event: its kind and the fields of every event type.

One `Params` copy holds the arguments of any event kind (`kind` selects which apply). Names
follow `spec.events`; per-request forward rows are indexed by request:

  kind                    the event kind's code (`codes.KIND`)
  request                 request index (every per-request event)
  row                     request-pool row (Admitted, RowAcquired, RowReleased)
  block_index             KvAllocated, StepResult, BlockCommitted, KvCached, CacheHit,
                          CacheReleased
  first_slot              KvAllocated, KvCached, CacheHit, CacheReleased: the first slot (slots
                          are contiguous)
  freed[t]                KvFreed, CacheEvicted: slot t is in the freed (evicted) set
  forwarded[i]            Forward: request i has a row; row_block_index[i], row_reused[i],
                          row_num_tokens[i], row_masked[i] are that `ForwardRow`'s fields
  accept_length, masks_remaining    StepResult
  reason                  Finished (`codes.REASON`)
  prompt_len, max_new_tokens, prompt_valid, stop_sampled, ignore_eos, has_stop_token_ids,
  priority, shared_with[j]
                          Submitted (a prompt is its length plus a validity bit, and its content
                          as far as the prefix cache can tell: the whole prompt blocks it
                          starts with alike request j's, `state`'s shared_prefix; constants 0
                          in a geometry without the cache; stop token ids are whether it lists
                          any);
                          reserved_pages is the ghost ceil((pl + mn) / P)
  tokens_valid, block_has_eos, block_has_stop_token, stop_token_first
                          BlockCommitted: the tokens keep the prompt and hold no mask; the
                          block holds an EOS, one of the request's stop token ids, within
                          max_new_tokens; its first stop token id comes before its first EOS
  round_index             ControlReturned
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from properties.symbolic.codes import KIND
from properties.symbolic.geometry import Geometry
from properties.symbolic.terms import Z

Terms = tuple[Z, ...]

_SCALARS = (
    ("kind", False),
    ("request", False),
    ("row", False),
    ("block_index", False),
    ("first_slot", False),
    ("accept_length", False),
    ("masks_remaining", False),
    ("reason", False),
    ("prompt_len", False),
    ("max_new_tokens", False),
    ("reserved_pages", False),
    ("prompt_valid", True),
    ("stop_sampled", True),
    ("ignore_eos", True),
    ("has_stop_token_ids", True),
    ("priority", False),
    ("tokens_valid", True),
    ("block_has_eos", True),
    ("block_has_stop_token", True),
    ("stop_token_first", True),
    ("round_index", False),
)
_ROW_FIELDS = (
    ("forwarded", True),
    ("row_block_index", False),
    ("row_reused", True),
    ("row_num_tokens", False),
    ("row_masked", False),
    ("shared_with", False),
)


@dataclass(frozen=True, slots=True, eq=False)
class Params:
    """The parameters of one symbolic event (see the module docstring)."""

    kind: Z
    request: Z
    row: Z
    block_index: Z
    first_slot: Z
    accept_length: Z
    masks_remaining: Z
    reason: Z
    prompt_len: Z
    max_new_tokens: Z
    reserved_pages: Z
    prompt_valid: Z
    stop_sampled: Z
    ignore_eos: Z
    has_stop_token_ids: Z
    priority: Z
    tokens_valid: Z
    block_has_eos: Z
    block_has_stop_token: Z
    stop_token_first: Z
    round_index: Z
    freed: Terms
    forwarded: Terms
    row_block_index: Terms
    row_reused: Terms
    row_num_tokens: Terms
    row_masked: Terms
    shared_with: Terms

    @classmethod
    def fresh(cls, geom: Geometry, name: str) -> Params:
        """Fresh variables named `<name>.<field>` (`<name>.<field>[<i>]` for sets and rows)."""

        def var(label: str, is_bool: bool) -> Z:
            return z3.Bool(label) if is_bool else z3.Int(label)

        scalars = {f: var(f"{name}.{f}", b) for f, b in _SCALARS}
        freed = tuple(z3.Bool(f"{name}.freed[{t}]") for t in range(geom.kv_slots))
        rows = {
            f: tuple(var(f"{name}.{f}[{i}]", b) for i in range(geom.requests))
            for f, b in _ROW_FIELDS
        }
        if not geom.prefix_cache:  # a prompt's content matters only to the cache
            rows["shared_with"] = tuple(z3.IntVal(0) for _ in range(geom.requests))
        return cls(freed=freed, **scalars, **rows)

    def is_kind(self, kind: str) -> Z:
        """The condition that this event is of `kind` (a name in `codes.KIND`)."""
        return self.kind == KIND[kind]

    def items(self) -> dict[str, Z]:
        """Every variable by label (`field` or `field[i]`), in a fixed order."""
        out: dict[str, Z] = {f: getattr(self, f) for f, _ in _SCALARS}
        for t, x in enumerate(self.freed):
            out[f"freed[{t}]"] = x
        for f, _ in _ROW_FIELDS:
            for i, x in enumerate(getattr(self, f)):
                out[f"{f}[{i}]"] = x
        return out
