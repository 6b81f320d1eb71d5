"""The seeded symbolic mutants of the finish and abort rules: where a stop token id, the EOS
under `ignore_eos`, and an engine's in-round abort (`DllmPolicy.aborts_after_commit`) may end
a request. No reference mutant replays them: their traces carry Z3's tokens, which the
reference's own denoising does not produce (the Hypothesis mutants of tests/mutants.py break
the same rules on the reference's tokens)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import z3

from properties.symbolic.codes import EOS_TOKEN, KIND, REASON
from properties.symbolic.encoding import Encoding
from properties.symbolic.guard import Relaxation
from properties.symbolic.mutant import Extra, History, SymbolicMutant
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import Z
from properties.symbolic.workloads import dllm_config
from spec.events import FinishReason
from spec.profile import DllmPolicy


def _due_only_at_a_stop_token(enc: Encoding, s: State, p: Params) -> Z:
    """An active request whose first ending token is one of its stop token ids, neither an
    EOS nor max_new_tokens ending it: only the stop token makes it due."""
    return z3.Or(
        [
            z3.And(
                enc.active(s, i),
                s.stop_token_committed[i],
                enc.generated_len(s, i) < s.max_new_tokens[i],
            )
            for i in range(enc.N)
        ]
    )


Condition = Callable[[Encoding, State, int], Z]


def _finishes(reason: FinishReason, *conditions: Condition) -> Extra:
    """The bad step finishes request r with `reason` right after r committed a block holding a
    generated token (where an engine checks its stops), with no stop the spec cannot see
    (`stop_sampled`), and each of `conditions` holds of r."""

    def extra(enc: Encoding, s: State, p: Params) -> Z:
        return z3.And(
            p.reason == REASON[reason],
            z3.Or(
                [
                    z3.And(
                        p.request == i,
                        enc.committed_generated_this_round(s, i),
                        z3.Not(s.stop_sampled[i]),
                        *(c(enc, s, i) for c in conditions),
                    )
                    for i in range(enc.N)
                ]
            ),
        )

    return extra


def _has_stop_token_ids(enc: Encoding, s: State, i: int) -> Z:
    return s.has_stop_token_ids[i]


def _ignores_eos(enc: Encoding, s: State, i: int) -> Z:
    return s.ignore_eos[i]


def _heeds_eos(enc: Encoding, s: State, i: int) -> Z:
    return z3.Not(s.ignore_eos[i])


def _no_stop_token_committed(enc: Encoding, s: State, i: int) -> Z:
    return z3.Not(s.stop_token_committed[i])


def _committed_a_block_with(flag: str) -> History:
    """An earlier step commits a block of the bad step's request that holds the token
    `flag` names (`block_has_eos`, `block_has_stop_token`): the trace shows the token that
    the bad finish wrongly takes as its end."""

    def history(enc: Encoding, states: Sequence[State], params: Sequence[Params]) -> Z:
        bad = params[-1]
        return z3.Or(
            [
                z3.And(
                    p.kind == KIND["block_committed"],
                    p.request == bad.request,
                    getattr(p, flag),
                )
                for p in params[:-1]
            ]
        )

    return history


def _aborted_mid_round_without_commit(enc: Encoding, s: State, p: Params) -> Z:
    """The abort falls inside a round (a forward ran) for a request that committed no block
    holding a generated token in it, where `aborts_after_commit` allows none."""
    return z3.And(
        s.round_forwards > 0,
        z3.Or(
            [
                z3.And(p.request == i, z3.Not(enc.committed_generated_this_round(s, i)))
                for i in range(enc.N)
            ]
        ),
    )


FINISH_MUTANTS: tuple[SymbolicMutant, ...] = (
    SymbolicMutant(
        "runs_past_stop_token",
        "a request keeps running after the round that committed one of its stop token ids",
        "fdfo_releases_same_round",
        dllm_config(kv_pages=2),
        "control_returned",
        (Relaxation("control_returned", "fdfo_releases_same_round", "finish"),),
        ("fdfo_releases_same_round", "finish"),
        extra=_due_only_at_a_stop_token,
        requests=1,
        depths=(8, 10, 12),
    ),
    SymbolicMutant(
        "stops_before_its_stop_token",
        "a request with stop token ids is finished with reason stop before any of them ended it",
        "finish_condition",
        dllm_config(kv_pages=2),
        "finished",
        (Relaxation("finished", "finish_condition"),),
        ("finish_condition", ""),
        extra=_finishes(
            FinishReason.STOP, _has_stop_token_ids, _heeds_eos, _no_stop_token_committed
        ),
        requests=1,
        depths=(8, 10, 12),
    ),
    SymbolicMutant(
        "eos_ends_ignore_eos_request",
        "a request submitted with ignore_eos is finished with reason eos",
        "finish_condition",
        dllm_config(kv_pages=2, eos_token_id=EOS_TOKEN),
        "finished",
        (Relaxation("finished", "finish_condition"),),
        ("finish_condition", ""),
        extra=_finishes(FinishReason.EOS, _ignores_eos),
        history=_committed_a_block_with("block_has_eos"),
        requests=1,
        depths=(8, 10, 12),
    ),
    SymbolicMutant(
        "stop_token_ends_ignore_eos_request",
        "a stop token id ends a request submitted with ignore_eos (vLLM's rule, not SGLang's "
        "or the spec's)",
        "finish_condition",
        dllm_config(kv_pages=2),
        "finished",
        (Relaxation("finished", "finish_condition"),),
        ("finish_condition", ""),
        extra=_finishes(FinishReason.STOP, _ignores_eos, _has_stop_token_ids),
        history=_committed_a_block_with("block_has_stop_token"),
        requests=1,
        depths=(8, 10, 12),
    ),
    SymbolicMutant(
        "aborts_mid_round_without_commit",
        "under aborts_after_commit, a request is aborted inside a round in which it committed "
        "no block holding a generated token",
        "scheduler_phase",
        dllm_config(kv_pages=2),
        "aborted",
        (Relaxation("aborted", "scheduler_phase"),),
        ("scheduler_phase", ""),
        extra=_aborted_mid_round_without_commit,
        requests=1,
        depths=(4, 6, 8, 10),
        policy=DllmPolicy(aborts_after_commit=True),
    ),
)
