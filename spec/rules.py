"""The named rules of the dLLM scheduling specification, in words.

A `SpecViolation` names one of these. Rules marked as state invariants are predicates over the
abstract state (see `spec.invariants`); the others are guards on events or on the end of a
round. `docs/spec.md` is generated from this table.
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType


class Rule(StrEnum):
    """Every rule name of the dLLM spec. A member equals (and hashes like) its string."""

    UNIQUE_SUBMISSION = "unique_submission"
    VALID_REQUEST = "valid_request"
    KNOWN_REQUEST = "known_request"
    LIFECYCLE = "lifecycle"
    FCFS_ADMISSION = "fcfs_admission"
    MAX_RUNNING = "max_running"
    SCHEDULER_PHASE = "scheduler_phase"
    ROW_EXCLUSIVE = "row_exclusive"
    NO_LEAK = "no_leak"
    KV_EXCLUSIVE = "kv_exclusive"
    WHOLE_BLOCK_ALLOC = "whole_block_alloc"
    PAGE_ALIGNMENT = "page_alignment"
    FREE_OWNED_ONLY = "free_owned_only"
    COMMITTED_PREFIX_KEPT = "committed_prefix_kept"
    TERMINAL_OWNS_NOTHING = "terminal_owns_nothing"
    PREFIX_CACHE_ON = "prefix_cache_on"
    CACHE_COMMITTED_ONLY = "cache_committed_only"
    CACHE_HIT_CONTENT = "cache_hit_content"
    EVICT_UNREAD_ONLY = "evict_unread_only"
    FORWARD_READY = "forward_ready"
    WHOLE_BLOCK_ROWS = "whole_block_rows"
    CARRIER_CONTINUITY = "carrier_continuity"
    BATCH_STABLE = "batch_stable"
    FORWARD_POLICY = "forward_policy"
    STEP_PER_ROW = "step_per_row"
    ACCEPT_LENGTH = "accept_length"
    FINAL_FORWARD_BEFORE_COMMIT = "final_forward_before_commit"
    PROMPT_PRESERVED = "prompt_preserved"
    REUSE_KEEPS_SLOTS = "reuse_keeps_slots"
    NO_REUSE_RELEASES = "no_reuse_releases"
    SYNC_YIELDS_WHEN_ALL_DONE = "sync_yields_when_all_done"
    FDFO_RELEASES_SAME_ROUND = "fdfo_releases_same_round"
    FINISH_CONDITION = "finish_condition"
    PROGRESS = "progress"
    ROUND_ORDER = "round_order"
    CARRIERS_IFF_UNFINISHED = "carriers_iff_unfinished"
    SNAPSHOT_MATCHES = "snapshot_matches"
    FDFO_SYNC_PARITY = "fdfo_sync_parity"
    PREFILL_FIRST = "prefill_first"
    WORK_CONSERVING = "work_conserving"
    REPORTED_OUTPUT = "reported_output"
    GOLDEN_OUTPUT = "golden_output"
    TWIN_DECISIONS = "twin_decisions"
    IMPLEMENTATION_ERROR = "implementation_error"


_RULES: dict[Rule, str] = {
    # --- requests and admission
    Rule.UNIQUE_SUBMISSION: "A request id is submitted at most once.",
    Rule.VALID_REQUEST: "Only requests that pass validation (non-empty prompt, fits the context "
    "and the pool) are accepted; an accepted request's `Submitted` event carries it as given "
    "(prompt, max_new_tokens, ignore_eos, stop_token_ids and priority; stop_sampled only for a "
    "request that has it).",
    Rule.KNOWN_REQUEST: "Events refer to requests that were submitted and are not finished or "
    "aborted.",
    Rule.LIFECYCLE: "Every phase change follows the lifecycle tables (request, block, slot, row).",
    Rule.FCFS_ADMISSION: "Requests are admitted in submission order: only the head of the queue "
    "(under DllmPolicy.admission = PREFILL_FIRST, a request whose first block is prompt-only may "
    "also pass queued requests whose first block is not; each kind stays in submission order). "
    "Under DllmPolicy.priority_order the queue is ordered by priority, lower first, and under "
    "DllmPolicy.longest_output_first by max_new_tokens, longest first (after the priority when "
    "both are on); submission order breaks ties, and 'submission order' above reads 'that "
    "order'. Under DllmPolicy.free_queue_order (an engine's own order, e.g. by its prefix "
    "cache's contents) any queued request may be admitted.",
    Rule.MAX_RUNNING: "At most max_running_requests requests are in the running set.",
    Rule.SCHEDULER_PHASE: "Admissions, KV allocations and aborts happen in the scheduler phase "
    "of a round, before its first forward (aborts are requested between rounds). With "
    "DllmPolicy.aborts_after_commit an engine may also abort a request in a round's completion "
    "phase, right after the request committed a block holding a generated token (SGLang's "
    "`to_finish`).",
    Rule.ROW_EXCLUSIVE: "A request-pool row is held by at most one request, and a running request "
    "holds exactly one row from admission until it finishes or is aborted.",
    # --- KV slots and pages
    Rule.NO_LEAK: "Every KV slot is either free, owned by exactly one (request, block), or held "
    "by the prefix cache: free + owned + cached = total, no slot has two owners.",
    Rule.KV_EXCLUSIVE: "Allocated slots were free (neither owned nor held by the prefix cache).",
    Rule.WHOLE_BLOCK_ALLOC: "A block is allocated exactly block_size slots, for the request's next "
    "uncommitted block, before the round's first forward.",
    Rule.PAGE_ALIGNMENT: "A block's slots are contiguous inside one page at the offset of its "
    "position; a block that starts a page takes a wholly free page, any other block continues "
    "the page of the request's previous block, in which no other request owns a slot (pages "
    "are never shared between requests).",
    Rule.FREE_OWNED_ONLY: "Only slots owned by the request are freed, each once (no double free); "
    "a request releases only a cached block it reads, as the block it reads it for.",
    Rule.COMMITTED_PREFIX_KEPT: "An active request keeps the KV of every committed block (it is "
    "the prefix later blocks attend to): it owns the block's slots, or reads the block from the "
    "prefix cache.",
    Rule.TERMINAL_OWNS_NOTHING: "A finished or aborted request owns no KV slot and no row "
    "(including a retained, unfinished FDFO block), and reads no cached block.",
    # --- prefix cache
    Rule.PREFIX_CACHE_ON: "Cache events (`KvCached`, `CacheHit`, `CacheReleased`, "
    "`CacheEvicted`) happen only with `DllmConfig.prefix_cache` on.",
    Rule.CACHE_COMMITTED_ONLY: "Only a block an active request has committed and owns whole "
    "enters the prefix cache (its KV was written by the final-KV forward over the whole block); "
    "its key is the request's tokens from position 0 through the block's end.",
    Rule.CACHE_HIT_CONTENT: "A cache hit reads one whole cached block whose key is exactly the "
    "request's own tokens from position 0 through that block: either its next block (before "
    "the round's first forward, with no current block, the block wholly inside its prompt) or "
    "a block it has committed and does not read already.",
    Rule.EVICT_UNREAD_ONLY: "Only whole cached blocks that no request reads leave the prefix "
    "cache; their slots become free.",
    # --- forwards and steps
    Rule.FORWARD_READY: "A forward row is the request's current block, the request holds a row and "
    "the block holds its slots.",
    Rule.WHOLE_BLOCK_ROWS: "Every forward row feeds exactly block_size tokens (no ragged rows).",
    Rule.CARRIER_CONTINUITY: "A block continues from its carried state: the row's mask count "
    "equals "
    "the masks left by the block's previous step (incomplete_ids carried between rounds).",
    Rule.BATCH_STABLE: "Within a round every forward runs the same rows.",
    Rule.FORWARD_POLICY: "Sync forwards again only while some row is not done; FDFO runs one "
    "forward per round, or with re-loop another only while no block finished; no forward "
    "follows a commit in the same round.",
    Rule.STEP_PER_ROW: "Each row of a forward gets exactly one step result before the next "
    "forward, commit or end of round.",
    Rule.ACCEPT_LENGTH: "A step accepts 0 or block_size tokens, masks never reappear, and a done "
    "step leaves no mask.",
    Rule.FINAL_FORWARD_BEFORE_COMMIT: "A block is done only when its step started on a block with "
    "no masks (the forward that writes its final KV), and only done blocks are committed.",
    Rule.PROMPT_PRESERVED: "A committed block keeps the prompt tokens at prompt positions and "
    "contains no mask token.",
    # --- in-place reuse
    Rule.REUSE_KEEPS_SLOTS: "Under in-place reuse an unfinished block keeps exactly its slots "
    "across rounds (no free, no re-allocation), and its rows are marked reused.",
    Rule.NO_REUSE_RELEASES: "Without in-place reuse, an unfinished FDFO block's slots are freed at "
    "the end of the round and allocated afresh in the next.",
    # --- end of round
    Rule.SYNC_YIELDS_WHEN_ALL_DONE: "Under sync, control returns only when every block of the "
    "batch is committed.",
    Rule.FDFO_RELEASES_SAME_ROUND: "A done block is committed, and a request whose finish "
    "condition "
    "holds is finished and released, in the same round.",
    Rule.FINISH_CONDITION: "A request finishes only when it generated max_new_tokens (LENGTH) or "
    "committed a token that ends it: an end-of-sequence token (EOS) or one of its "
    "`stop_token_ids` (STOP), whichever comes first within max_new_tokens (neither for a "
    "request submitted with `ignore_eos`), with the matching reason; or, when it was submitted "
    "with `stop_sampled` (its engine evaluates a stop condition the spec cannot: stop strings, "
    "a regex, a grammar), with reason STOP in a round in which it committed a block holding a "
    "generated token.",
    Rule.PROGRESS: "A round with running requests runs a forward; an idle system with queued work "
    "admits the head of the queue; a drain ends idle (an implementation that gives up with "
    "SchedulerStalled breaks this rule); every call (submit, abort, a round, drain, snapshot) "
    "returns: one still running at the checker's call deadline is a hang.",
    Rule.WORK_CONSERVING: "A round that admits nothing leaves no seat, row and KV room idle while "
    "the queue head fits: if running < max_running_requests, a row is free and the pages not "
    "claimed by the running requests' worst-case footprints cover the head's, the round admits. "
    "Parameterised by DllmPolicy.work_conserving (off for an engine that deliberately holds "
    "back). Under DllmPolicy.free_queue_order the head is unknown, so the round must admit "
    "when every queued request fits (the largest one's footprint is covered).",
    Rule.PREFILL_FIRST: "With DllmPolicy.admission = PREFILL_FIRST (SGLang 0.5.23 dLLM, "
    "`Scheduler.get_next_batch_to_run`): a forward is prefill-only (rows feeding prompt-only "
    "blocks) or decode-only, and no decode forward runs while a running request has an allocated "
    "prompt block waiting (prefill goes first); admission is FCFS within each kind (rule "
    "fcfs_admission). With a prefix cache, the first block a request computes after cache hits "
    "in the same round counts as a prefill row (SGLang classifies an incoming request by its "
    "prompt length, before the cache match that may cover the whole prompt).",
    Rule.ROUND_ORDER: "Rounds are numbered 0, 1, 2, ... in order.",
    Rule.CARRIERS_IFF_UNFINISHED: "A request carries incomplete_ids (and algorithm state) exactly "
    "while its current block is unfinished.",
    # --- cross-run definitions
    Rule.SNAPSHOT_MATCHES: "After every round the implementation's own allocator, request pool and "
    "running set equal the abstract state.",
    Rule.REPORTED_OUTPUT: "A finished request's output and finish reason, as the implementation "
    "reports them (`SchedulerAdapter.collect_outputs`), equal the spec's `request_output` and "
    "the reason of its `Finished` event; after a STOP the output is a prefix of the generated "
    "tokens (at most max_new_tokens) ending inside the block committed last.",
    Rule.GOLDEN_OUTPUT: "A finished request's output and finish reason equal its golden output: "
    "the request decoded alone, unbatched and unpaged, by the implementation's own model (or "
    "oracle) and algorithm (`spec.golden.GoldenDecoder`; checked when the implementation "
    "provides it), at every batch size and in every mode.",
    Rule.TWIN_DECISIONS: "When a decision twin is declared for the run (a plain-Python "
    "scheduler written to follow the implementation's own policy, replaying the implementation's "
    "step outcomes), the same operations admit the same requests in the same rounds and order, "
    "and every forward runs the same rows, in the implementation as in the twin. A policy that "
    "allows a choice (no work conservation, say) cannot tell a choice from a miscount; the twin "
    "can (`properties.decisions`).",
    Rule.IMPLEMENTATION_ERROR: "The implementation raises nothing but the typed errors the "
    "contract allows (RequestError on submit, UnknownRequest on abort); any other exception from "
    "submit, abort, a round, drain or snapshot is a finding.",
    Rule.FDFO_SYNC_PARITY: "A request's output is byte-identical to its output when run alone "
    "under sync at batch size 1.",
}

RULES: MappingProxyType[Rule, str] = MappingProxyType(_RULES)
"""Rule -> statement, in documentation order (look up by member or by its string)."""

_missing = [r for r in Rule if r not in _RULES]
if _missing:  # pragma: no cover - caught by importing the module in any test
    raise RuntimeError(f"rules without a statement: {_missing}")


def describe(rule: str) -> str:
    """The rule's statement in words; KeyError for an unknown rule name."""
    return _BY_NAME[rule]


_BY_NAME: dict[str, str] = {str(r): text for r, text in _RULES.items()}
