"""`Finished` (`SpecMachine._finished`): request r ends with `p.reason`. r = p.request."""

from __future__ import annotations

from typing import TYPE_CHECKING

import z3

from properties.symbolic.codes import REASON, REQ
from properties.symbolic.events.common import at_request, for_request
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import lifecycle_step
from spec.events import FinishReason
from spec.lifecycles import REQUEST_LIFECYCLE

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard per line (rule  formula):
    known_request               active(r)
    lifecycle                   the request table has `finished` from phase[r]
    finish_condition            reason = stop ⇒ stop_token_committed[r] ∨ stop_allowed(r):
                                  stop_sampled[r] ∧ committed_generated_this_round(r), which is
                                  committed_this_round[r]
                                  ∧ before_last(r) < min(generated_len(r), max_new_tokens[r])
                                  where before_last(r) = max(0, (committed_blocks[r] - 1) * B
                                  - prompt_len[r]) (`stop_output_lengths` is non-empty)
                                reason != stop ⇒ finish_due(r)
                                  ∧ (reason = eos ⇒ eos_committed[r])
                                  ∧ (reason = length ⇒ generated_len(r) >= max_new_tokens[r])
    terminal_owns_nothing/slots r owns no slot
    terminal_owns_nothing/row   row[r] = -1
    terminal_owns_nothing/reads r reads no cached block"""
    return [
        Guard("known_request", for_request(enc, p, lambda i: enc.active(s, i))),
        Guard(
            "lifecycle",
            for_request(
                enc,
                p,
                lambda i: lifecycle_step(REQUEST_LIFECYCLE, REQ, s.phase[i], "finished")[0],
            ),
        ),
        Guard(
            "finish_condition",
            for_request(
                enc,
                p,
                lambda i: z3.If(
                    # a STOP needs no EOS and no max_new_tokens: a stop token id ended it, or
                    # the engine saw a stop string
                    p.reason == REASON[FinishReason.STOP],
                    z3.Or(s.stop_token_committed[i], enc.stop_allowed(s, i)),
                    z3.And(
                        enc.finish_due(s, i),
                        z3.Implies(p.reason == REASON[FinishReason.EOS], s.eos_committed[i]),
                        z3.Implies(
                            p.reason == REASON[FinishReason.LENGTH],
                            enc.generated_len(s, i) >= s.max_new_tokens[i],
                        ),
                    ),
                ),
            ),
        ),
        Guard(
            "terminal_owns_nothing",
            for_request(enc, p, lambda i: z3.Not(enc.owns_any(s, i))),
            "slots",
        ),
        Guard("terminal_owns_nothing", for_request(enc, p, lambda i: s.row[i] == -1), "row"),
        Guard(
            "terminal_owns_nothing",
            for_request(enc, p, lambda i: z3.Not(enc.reads_any(s, i))),
            "reads",
        ),
    ]


def effect(enc: Encoding, s: State, p: Params) -> State:
    """phase'[r] per the request table's `finished` row."""
    return s.replace(
        phase=at_request(
            enc,
            p,
            s.phase,
            lambda i: lifecycle_step(REQUEST_LIFECYCLE, REQ, s.phase[i], "finished")[1],
        )
    )
