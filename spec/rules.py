"""The named rules of the dLLM scheduling specification, in words.

A `SpecViolation` names one of these. Rules marked as state invariants are predicates over the
abstract state (see `spec.invariants`); the others are guards on events or on the end of a
round. `docs/spec.md` is generated from this table.
"""

from __future__ import annotations

from types import MappingProxyType

_RULES: dict[str, str] = {
    # --- requests and admission
    "unique_submission": "A request id is submitted at most once.",
    "valid_request": "Only requests that pass validation (non-empty prompt, fits the context and "
    "the pool) are accepted.",
    "known_request": "Events refer to requests that were submitted and are not finished or "
    "aborted.",
    "lifecycle": "Every phase change follows the lifecycle tables (request, block, slot, row).",
    "fcfs_admission": "Requests are admitted in submission order: only the head of the queue.",
    "max_running": "At most max_running_requests requests are in the running set.",
    "scheduler_phase": "Admissions, KV allocations and aborts happen in the scheduler phase of a "
    "round, before its first forward (aborts are requested between rounds).",
    "row_exclusive": "A request-pool row is held by at most one request, and a running request "
    "holds exactly one row from admission until it finishes or is aborted.",
    # --- KV slots and pages
    "no_leak": "Every KV slot is either free or owned by exactly one (request, block): "
    "free + owned = total, no slot has two owners.",
    "kv_exclusive": "Allocated slots were free.",
    "whole_block_alloc": "A block is allocated exactly block_size slots, for the request's next "
    "uncommitted block, before the round's first forward.",
    "page_alignment": "A block's slots are contiguous inside one page at the offset of its "
    "position; a block that starts a page takes a wholly free page, any other block continues "
    "the page of the request's previous block (pages are never shared between requests).",
    "free_owned_only": "Only slots owned by the request are freed, each once (no double free).",
    "committed_prefix_kept": "An active request keeps the KV of every committed block (it is the "
    "prefix later blocks attend to).",
    "terminal_owns_nothing": "A finished or aborted request owns no KV slot and no row "
    "(including a retained, unfinished FDFO block).",
    # --- forwards and steps
    "forward_ready": "A forward row is the request's current block, the request holds a row and "
    "the block holds its slots.",
    "whole_block_rows": "Every forward row feeds exactly block_size tokens (no ragged rows).",
    "carrier_continuity": "A block continues from its carried state: the row's mask count equals "
    "the masks left by the block's previous step (incomplete_ids carried between rounds).",
    "batch_stable": "Within a round every forward runs the same rows.",
    "forward_policy": "Sync forwards again only while some row is not done; FDFO runs one "
    "forward per round, or with re-loop another only while no block finished; no forward "
    "follows a commit in the same round.",
    "step_per_row": "Each row of a forward gets exactly one step result before the next "
    "forward, commit or end of round.",
    "accept_length": "A step accepts 0 or block_size tokens, masks never reappear, and a done "
    "step leaves no mask.",
    "final_forward_before_commit": "A block is done only when its step started on a block with "
    "no masks (the forward that writes its final KV), and only done blocks are committed.",
    "prompt_preserved": "A committed block keeps the prompt tokens at prompt positions and "
    "contains no mask token.",
    # --- in-place reuse
    "reuse_keeps_slots": "Under in-place reuse an unfinished block keeps exactly its slots "
    "across rounds (no free, no re-allocation), and its rows are marked reused.",
    "no_reuse_releases": "Without in-place reuse, an unfinished FDFO block's slots are freed at "
    "the end of the round and allocated afresh in the next.",
    # --- end of round
    "sync_yields_when_all_done": "Under sync, control returns only when every block of the "
    "batch is committed.",
    "fdfo_releases_same_round": "A done block is committed, and a request whose finish condition "
    "holds is finished and released, in the same round.",
    "finish_condition": "A request finishes only when it generated max_new_tokens or committed "
    "an end-of-sequence token, with the matching reason.",
    "progress": "A round with running requests runs a forward; an idle system with queued work "
    "admits the head of the queue.",
    "round_order": "Rounds are numbered 0, 1, 2, ... in order.",
    "carriers_iff_unfinished": "A request carries incomplete_ids (and algorithm state) exactly "
    "while its current block is unfinished.",
    # --- cross-run definitions
    "snapshot_matches": "After every round the implementation's own allocator, request pool and "
    "running set equal the abstract state.",
    "fdfo_sync_parity": "A request's output is byte-identical to its output when run alone "
    "under sync at batch size 1.",
}

RULES: MappingProxyType[str, str] = MappingProxyType(_RULES)


def describe(rule: str) -> str:
    """The rule's statement in words; KeyError for an unknown rule name."""
    return RULES[rule]
