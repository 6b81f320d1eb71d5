"""The seeded symbolic mutants: the relation with one labelled guard relaxed, or replaced by
the buggy behaviour (`Relaxation`), plus constraints on the bad step that say what the bug
looks like (`extra`). `bmc.find_mutant_counterexample` searches a trace for each; the matching
reference mutants of the seeded-bug catalogue (`tests/mutants.py`) are named in `reference`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import z3

from properties.symbolic.codes import (
    ADMITTED,
    COMPLETE,
    DENOISING,
    DONE,
    EOS_TOKEN,
    KIND,
    MASKED,
    QUEUED,
    REASON,
    RUNNING,
)
from properties.symbolic.encoding import Encoding
from properties.symbolic.guard import Relaxation
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import Z
from properties.symbolic.workloads import dllm_config
from spec.config import DllmConfig, Mode
from spec.events import FinishReason
from spec.profile import DllmAdmission, DllmPolicy

Extra = Callable[[Encoding, State, Params], Z]
History = Callable[[Encoding, Sequence[State], Sequence[Params]], Z]


@dataclass(frozen=True)
class SymbolicMutant:
    """A seeded bug as a relaxed guard of one event kind."""

    name: str
    description: str
    rule: str  # the rule SpecMachine names on the bad event
    config: DllmConfig
    kind: str  # event kind of the bad step
    relax: tuple[Relaxation, ...]
    violated: tuple[str, str]  # (rule, tag) of the spec guard the bad step breaks
    extra: Extra | None = None  # more constraints on the bad step (what the bug looks like)
    # constraints on the steps before the bad one (states s0..sk, params p0..p(k-1))
    history: History | None = None
    reference: tuple[str, ...] = ()  # matching entries of tests/mutants.py MUTANTS
    requests: int = 2
    depths: tuple[int, ...] = (4, 6, 8, 10, 12, 14)
    policy: DllmPolicy = field(default_factory=DllmPolicy)  # the policy the trace runs under


def _abort_keeps_current(enc: Encoding, s: State, p: Params) -> Z:
    """The buggy abort: row and committed blocks released, the current block's KV kept."""
    return z3.And(
        [
            z3.Implies(
                p.request == i,
                z3.And(
                    s.row[i] == -1,
                    *[
                        z3.Implies(
                            s.owner_request[t] == i, s.owner_block[t] == s.committed_blocks[i]
                        )
                        for t in range(enc.S)
                    ],
                ),
            )
            for i in range(enc.N)
        ]
    )


def _mid_block(enc: Encoding, s: State, p: Params) -> Z:
    """Between rounds, with a stepped block that still has masks retained in place.

    Masks must remain (DENOISING, not COMPLETE): a complete-but-uncommitted block may be a
    prompt-only block that a JointThreshold-style step keeps open, which the reference's
    LowConfidence oracle commits in the same round — the workload would then retain nothing
    and the reference mutant could not leak. A block with masks is retained by any oracle."""
    return z3.And(
        s.round_forwards == 0,
        s.round_index >= 1,
        z3.Or(
            [
                z3.And(
                    p.request == i,
                    s.phase[i] == RUNNING,
                    s.block_start[i] != -1,
                    s.block_phase[i] == DENOISING,
                )
                for i in range(enc.N)
            ]
        ),
    )


def _double_free_guard(enc: Encoding, s: State, p: Params) -> Z:
    """The buggy free: slots the request owns, or slots it freed already."""
    return z3.And(
        [
            z3.Implies(
                p.request == i,
                z3.And(
                    [
                        z3.Implies(
                            p.freed[t],
                            z3.Or(
                                s.owner_request[t] == i,
                                z3.And(s.owner_request[t] == -1, s.freed_by[t] == i),
                            ),
                        )
                        for t in range(enc.S)
                    ]
                ),
            )
            for i in range(enc.N)
        ]
    )


def _reservation_skip(enc: Encoding, s: State, p: Params) -> Z:
    """AdmitsOutOfOrder: every queued request ahead does not fit the reserved pages; this one
    does (the reference reserves worst-case pages at admission)."""
    k = enc.geom.kv_pages
    res = enc.reserved_pages(s)
    parts = []
    for i in range(enc.N):
        ahead = [z3.Implies(s.phase[j] == QUEUED, res + s.reserved_pages[j] > k) for j in range(i)]
        parts.append(z3.Implies(p.request == i, z3.And(res + s.reserved_pages[i] <= k, *ahead)))
    return z3.And(parts)


def _first_fit(enc: Encoding, s: State, p: Params) -> Z:
    """The first-fit allocator: the block starts at the lowest free slot (and the running
    requests fit the pool's worst-case reservation, as the reference admits them)."""
    return z3.And(
        [enc.reserved_pages(s) <= enc.geom.kv_pages]
        + [z3.Implies(t < p.first_slot, s.owner_request[t] != -1) for t in range(enc.S)]
        + [
            z3.Implies(
                p.request == i,
                z3.Or(s.phase[i] == ADMITTED, s.phase[i] == RUNNING),
            )
            for i in range(enc.N)
        ]
    )


def _done_at_round_end(enc: Encoding, s: State, p: Params) -> Z:
    return z3.Or([s.block_phase[i] == DONE for i in range(enc.N)])


def _lost_slots(enc: Encoding, s: State, p: Params) -> Z:
    return z3.Or(
        [
            z3.And(
                s.phase[i] == RUNNING,
                s.block_start[i] == -1,
                z3.Or(
                    s.block_phase[i] == MASKED,
                    s.block_phase[i] == DENOISING,
                    s.block_phase[i] == COMPLETE,
                ),
            )
            for i in range(enc.N)
        ]
    )


def _partial_prompt_row(enc: Encoding, s: State, p: Params) -> Z:
    """RaggedRow: the row feeds only the prompt tokens of a partial last prompt block."""
    b = enc.B
    return z3.Or(
        [
            z3.And(
                p.forwarded[i],
                p.row_num_tokens[i] == s.prompt_len[i] - s.committed_blocks[i] * b,
                p.row_num_tokens[i] > 0,
                p.row_num_tokens[i] < b,
            )
            for i in range(enc.N)
        ]
    )


def _prefill_passes_prefill(enc: Encoding, s: State, p: Params) -> Z:
    """The admitted request's first block is prompt-only, and so is that of a request queued
    ahead of it: PREFILL_FIRST lets a prefill request pass only decode requests."""
    zero = z3.IntVal(0)
    return z3.Or(
        [
            z3.And(
                p.request == i,
                enc.prefill_block(s, i, zero),
                z3.Or(
                    [z3.And(s.phase[j] == QUEUED, enc.prefill_block(s, j, zero)) for j in range(i)]
                ),
            )
            for i in range(enc.N)
        ]
    )


def _running_without_row(enc: Encoding, s: State, p: Params) -> Z:
    """A running request ends the round holding no row."""
    return z3.Or([z3.And(s.phase[i] == RUNNING, s.row[i] == -1) for i in range(enc.N)])


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


_PREFILL_FIRST = DllmPolicy(admission=DllmAdmission.PREFILL_FIRST)
_ABORTS_AFTER_COMMIT = DllmPolicy(aborts_after_commit=True)

SYMBOLIC_MUTANTS: tuple[SymbolicMutant, ...] = (
    SymbolicMutant(
        "no_free_on_finish",
        "a request finishes (its row released) while it still owns KV slots",
        "terminal_owns_nothing",
        dllm_config(mode=Mode.SYNC, in_place_reuse=False, kv_pages=2),
        "finished",
        (Relaxation("finished", "terminal_owns_nothing", "slots"),),
        ("terminal_owns_nothing", "slots"),
        reference=("no_free_on_finish",),
        requests=1,
        depths=(8, 10, 12),
    ),
    SymbolicMutant(
        "abort_leaks_retained_block",
        "SGLang #32992: aborting mid-block frees the committed blocks and the row but not the "
        "retained (in-place reused) block",
        "terminal_owns_nothing",
        dllm_config(kv_pages=2),
        "aborted",
        (
            Relaxation(
                "aborted",
                "terminal_owns_nothing",
                "slots",
                lambda s, p: z3.BoolVal(True),
            ),
        ),
        ("terminal_owns_nothing", "slots"),
        extra=lambda enc, s, p: z3.And(_abort_keeps_current(enc, s, p), _mid_block(enc, s, p)),
        reference=("abort_leaks_retained_block",),
        requests=1,
        depths=(6, 8, 10),
    ),
    SymbolicMutant(
        "double_free",
        "a request frees KV slots it already freed",
        "free_owned_only",
        dllm_config(kv_pages=2),
        "kv_freed",
        (Relaxation("kv_freed", "free_owned_only", "owned"),),
        ("free_owned_only", "owned"),
        extra=_double_free_guard,
        reference=("double_free",),
        requests=1,
        depths=(5, 7, 9),
    ),
    SymbolicMutant(
        "admits_beyond_max_running",
        "admission while max_running_requests requests already run",
        "max_running",
        dllm_config(max_running_requests=1, req_pool_rows=2, kv_pages=4),
        "admitted",
        (Relaxation("admitted", "max_running"),),
        ("max_running", ""),
        reference=("admits_beyond_max_running",),
        depths=(4, 6, 8),
    ),
    SymbolicMutant(
        "admits_out_of_order",
        "a queued request that does not fit the reserved KV is skipped for a later one that does",
        "fcfs_admission",
        dllm_config(
            block_size=2,
            page_size=2,
            kv_pages=4,
            max_context=8,
            max_running_requests=3,
            req_pool_rows=3,
        ),
        "admitted",
        (Relaxation("admitted", "fcfs_admission"),),
        ("fcfs_admission", ""),
        extra=_reservation_skip,
        reference=("admits_out_of_order",),
        requests=3,
        depths=(5, 7, 9),
    ),
    SymbolicMutant(
        "commits_before_final_forward",
        "a step reports done as soon as the last mask is filled, before the final-KV forward",
        "final_forward_before_commit",
        dllm_config(kv_pages=2),
        "step_result",
        (Relaxation("step_result", "final_forward_before_commit"),),
        ("final_forward_before_commit", ""),
        reference=("commits_before_final_forward",),
        requests=1,
        depths=(5, 7),
    ),
    SymbolicMutant(
        "misaligned_page",
        "the allocator hands out the first free slots, ignoring page offsets",
        "page_alignment",
        dllm_config(block_size=2, page_size=4, kv_pages=2),
        "kv_allocated",
        (
            Relaxation("kv_allocated", "page_alignment", "aligned"),
            Relaxation("kv_allocated", "page_alignment", "continues"),
        ),
        ("page_alignment", ""),
        extra=_first_fit,
        reference=("misaligned_page",),
        depths=(6, 8),
    ),
    SymbolicMutant(
        "sync_returns_early",
        "sync returns control while a block of the batch is unfinished",
        "sync_yields_when_all_done",
        dllm_config(mode=Mode.SYNC, in_place_reuse=False, kv_pages=2),
        "control_returned",
        (Relaxation("control_returned", "sync_yields_when_all_done"),),
        ("sync_yields_when_all_done", ""),
        reference=("sync_returns_early",),
        requests=1,
        depths=(6, 8),
    ),
    SymbolicMutant(
        "fdfo_keeps_done_request",
        "a done block is not committed in the round it finished",
        "fdfo_releases_same_round",
        dllm_config(kv_pages=2),
        "control_returned",
        (Relaxation("control_returned", "fdfo_releases_same_round", "done"),),
        ("fdfo_releases_same_round", "done"),
        extra=_done_at_round_end,
        reference=("fdfo_keeps_done_request",),
        requests=1,
        depths=(6, 8),
    ),
    SymbolicMutant(
        "unfinished_block_loses_slots",
        "under in-place reuse an unfinished block's KV is freed before the round ends",
        "reuse_keeps_slots",
        dllm_config(kv_pages=2),
        "control_returned",
        (Relaxation("control_returned", "reuse_keeps_slots"),),
        ("reuse_keeps_slots", ""),
        extra=_lost_slots,
        reference=("reallocates_instead_of_reusing", "free_unfinished_block_in_batch"),
        requests=1,
        depths=(7, 9),
    ),
    SymbolicMutant(
        "ragged_row",
        "a partial prompt block is fed without its masks (not a whole block)",
        "whole_block_rows",
        dllm_config(kv_pages=2),
        "forward",
        (Relaxation("forward", "whole_block_rows"),),
        ("whole_block_rows", ""),
        extra=_partial_prompt_row,
        reference=("ragged_row",),
        requests=1,
        depths=(4, 6),
    ),
    SymbolicMutant(
        "idles_with_the_head_fitting",
        "a round admits nothing while a seat, a row and the head's worst-case pages are free",
        "work_conserving",
        dllm_config(),
        "forward",
        (Relaxation("forward", "work_conserving"),),
        ("work_conserving", ""),
        depths=(8, 10, 12),
    ),
    SymbolicMutant(
        "mixes_prefill_and_decode",
        "under PREFILL_FIRST a forward feeds a prompt-only block and a block with masks together",
        "prefill_first",
        dllm_config(),
        "forward",
        (Relaxation("forward", "prefill_first", "mixed"),),
        ("prefill_first", "mixed"),
        reference=("mixes_prefill_and_decode",),
        depths=(7, 9),
        policy=_PREFILL_FIRST,
    ),
    SymbolicMutant(
        "decodes_while_a_prompt_waits",
        "under PREFILL_FIRST a decode forward runs while an allocated prompt block waits",
        "prefill_first",
        dllm_config(),
        "forward",
        (Relaxation("forward", "prefill_first", "waiting"),),
        ("prefill_first", "waiting"),
        reference=("decodes_first",),
        depths=(7, 9),
        policy=_PREFILL_FIRST,
    ),
    SymbolicMutant(
        "prefill_passes_prefill",
        "under PREFILL_FIRST a prefill request is admitted ahead of an earlier prefill request",
        "fcfs_admission",
        dllm_config(),
        "admitted",
        (Relaxation("admitted", "fcfs_admission"),),
        ("fcfs_admission", ""),
        extra=_prefill_passes_prefill,
        reference=("admits_last_prefill_first",),
        depths=(3, 4, 6),
        policy=_PREFILL_FIRST,
    ),
    SymbolicMutant(
        "releases_row_under_reuse",
        "rows are released between rounds, but also under in-place reuse, where a carried block "
        "keeps its KV and so must keep its row",
        "row_exclusive",
        dllm_config(),
        "control_returned",
        (Relaxation("control_returned", "row_exclusive"),),
        ("row_exclusive", ""),
        extra=_running_without_row,
        reference=("releases_row_under_reuse",),
        requests=1,
        depths=(8, 10),
        policy=DllmPolicy(rows_released_between_rounds=True),
    ),
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
        policy=_ABORTS_AFTER_COMMIT,
    ),
)
