"""The seeded symbolic mutants (`SYMBOLIC_MUTANTS`, each a `mutant.SymbolicMutant`): those of
the pool, admission and round rules here, those of the finish and abort rules in
`finish_mutants`, those of the prefix cache in `cache_mutants`.
`bmc.find_mutant_counterexample` searches a trace for each; the matching reference mutants
of the seeded-bug catalogue (`tests/mutants.py`) are named in `reference`.
"""

from __future__ import annotations

import z3

from properties.symbolic.cache_mutants import CACHE_MUTANTS
from properties.symbolic.codes import (
    ADMITTED,
    COMPLETE,
    DENOISING,
    DONE,
    MASKED,
    QUEUED,
    RUNNING,
)
from properties.symbolic.encoding import Encoding
from properties.symbolic.finish_mutants import FINISH_MUTANTS
from properties.symbolic.guard import Relaxation
from properties.symbolic.mutant import SymbolicMutant
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import Z
from properties.symbolic.workloads import dllm_config
from spec.config import Mode
from spec.profile import DllmAdmission, DllmPolicy


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


def _passes_a_lower_priority_value(enc: Encoding, s: State, p: Params) -> Z:
    """The admitted request was submitted before a queued request of a lower priority value,
    which the queue puts ahead of it: an admission by submission order under a priority
    order."""
    return z3.Or(
        [
            z3.And(
                p.request == i,
                z3.Or(
                    [
                        z3.And(s.phase[j] == QUEUED, s.priority[j] < s.priority[i])
                        for j in range(i + 1, enc.N)
                    ]
                ),
            )
            for i in range(enc.N)
        ]
    )


def _passes_a_longer_output(enc: Encoding, s: State, p: Params) -> Z:
    """The admitted request was submitted before a queued request of a longer output (more
    `max_new_tokens`), which the queue puts ahead of it: an admission by submission order
    under longest-output-first."""
    return z3.Or(
        [
            z3.And(
                p.request == i,
                z3.Or(
                    [
                        z3.And(s.phase[j] == QUEUED, s.max_new_tokens[j] > s.max_new_tokens[i])
                        for j in range(i + 1, enc.N)
                    ]
                ),
            )
            for i in range(enc.N)
        ]
    )


def _running_without_row(enc: Encoding, s: State, p: Params) -> Z:
    """A running request ends the round holding no row."""
    return z3.Or([z3.And(s.phase[i] == RUNNING, s.row[i] == -1) for i in range(enc.N)])


_PREFILL_FIRST = DllmPolicy(admission=DllmAdmission.PREFILL_FIRST)

_POOL_AND_POLICY_MUTANTS: tuple[SymbolicMutant, ...] = (
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
            Relaxation("kv_allocated", "page_alignment", "one_request"),
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
        "admits_by_submission_under_priority",
        "under a priority order a request is admitted ahead of a later one of a lower priority "
        "value",
        "fcfs_admission",
        dllm_config(),
        "admitted",
        (Relaxation("admitted", "fcfs_admission"),),
        ("fcfs_admission", ""),
        extra=_passes_a_lower_priority_value,
        reference=("priority_values_inverted",),
        depths=(3, 4, 6),
        policy=DllmPolicy(priority_order=True),
    ),
    SymbolicMutant(
        "admits_by_submission_under_longest_output_first",
        "under longest-output-first a request is admitted ahead of a later one with a longer "
        "output",
        "fcfs_admission",
        dllm_config(),
        "admitted",
        (Relaxation("admitted", "fcfs_admission"),),
        ("fcfs_admission", ""),
        extra=_passes_a_longer_output,
        reference=("shortest_output_first",),
        depths=(3, 4, 6),
        policy=DllmPolicy(longest_output_first=True),
    ),
    SymbolicMutant(
        "idles_with_every_queued_request_fitting_under_free_order",
        "under a free queue order a round admits nothing while a seat, a row and every queued "
        "request's worst-case pages are free",
        "work_conserving",
        dllm_config(),
        "forward",
        (Relaxation("forward", "work_conserving"),),
        ("work_conserving", ""),
        depths=(8, 10, 12),
        policy=DllmPolicy(free_queue_order=True),
    ),
)

SYMBOLIC_MUTANTS: tuple[SymbolicMutant, ...] = (
    _POOL_AND_POLICY_MUTANTS + FINISH_MUTANTS + CACHE_MUTANTS
)

__all__ = ["SYMBOLIC_MUTANTS"]
