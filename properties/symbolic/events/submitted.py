"""`Submitted` (`SpecMachine._submitted`): a new request joins the queue. r = p.request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import NEW, QUEUED, REQ
from properties.symbolic.events.common import at_request, for_request, without_current_block
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import lifecycle_step
from spec.lifecycles import REQUEST_LIFECYCLE

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    unique_submission   phase[r] = new
    lifecycle           the request table has `submitted` from phase[r]
    valid_request       prompt_valid ∧ prompt_len >= 1 ∧ max_new_tokens >= 1
                        ∧ prompt_len + max_new_tokens <= min(max_context, pool slots)"""
    return [
        Guard("unique_submission", for_request(enc, p, lambda i: s.phase[i] == NEW)),
        Guard(
            "lifecycle",
            for_request(
                enc,
                p,
                lambda i: lifecycle_step(REQUEST_LIFECYCLE, REQ, s.phase[i], "submitted")[0],
            ),
        ),
        Guard(
            "valid_request",
            z3.And(
                p.prompt_valid,
                p.prompt_len >= 1,
                p.max_new_tokens >= 1,
                p.prompt_len + p.max_new_tokens <= enc.cfg.max_context,
                p.prompt_len + p.max_new_tokens <= enc.pool,
            ),
        ),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """phase'[r] = queued; prompt_len', max_new_tokens', reserved_pages' [r] from p;
    stop_sampled'[r] = p.stop_sampled; ignore_eos'[r] = p.ignore_eos; has_stop_token_ids'[r] =
    p.has_stop_token_ids; priority'[r] = p.priority; shared_prefix'(r, j) =
    shared_prefix'(j, r) = p.shared_with[j] for j != r; hit_this_round'[r] = false;
    row'[r] = -1; committed_blocks'[r] = 0;
    eos_committed'[r] = stop_token_committed'[r] = committed_this_round'[r] = false; no current
    block."""
    return s.replace(
        phase=at_request(enc, p, s.phase, lambda i: QUEUED),
        prompt_len=at_request(enc, p, s.prompt_len, lambda i: p.prompt_len),
        max_new_tokens=at_request(enc, p, s.max_new_tokens, lambda i: p.max_new_tokens),
        reserved_pages=at_request(enc, p, s.reserved_pages, lambda i: p.reserved_pages),
        row=at_request(enc, p, s.row, lambda i: -1),
        committed_blocks=at_request(enc, p, s.committed_blocks, lambda i: 0),
        eos_committed=at_request(enc, p, s.eos_committed, lambda i: z3.BoolVal(False)),
        stop_sampled=at_request(enc, p, s.stop_sampled, lambda i: p.stop_sampled),
        ignore_eos=at_request(enc, p, s.ignore_eos, lambda i: p.ignore_eos),
        has_stop_token_ids=at_request(enc, p, s.has_stop_token_ids, lambda i: p.has_stop_token_ids),
        priority=at_request(enc, p, s.priority, lambda i: p.priority),
        shared_prefix=tuple(
            z3.If(p.request == i, p.shared_with[j], z3.If(p.request == j, p.shared_with[i], x))
            if i != j
            else x
            for (i, j), x in zip(
                ((i, j) for i in range(enc.N) for j in range(enc.N)),
                s.shared_prefix,
                strict=True,
            )
        ),
        hit_this_round=at_request(enc, p, s.hit_this_round, lambda i: z3.BoolVal(False)),
        stop_token_committed=at_request(
            enc, p, s.stop_token_committed, lambda i: z3.BoolVal(False)
        ),
        committed_this_round=at_request(
            enc, p, s.committed_this_round, lambda i: z3.BoolVal(False)
        ),
        **without_current_block(enc, s, p),
    )
