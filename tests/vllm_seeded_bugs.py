"""Seeded bugs in vLLM's scheduler that both engine-core test modules (AR async and dLLM) plant
in a built scheduler's instance, to show the shared schedule() checks have teeth."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from integrations.patches import EngineFix
from integrations.vllm.core_loop import waiting_for_grammar
from integrations.vllm.event_log import grammar_compiled, grammar_failed
from integrations.vllm.patches import SCHEDULER_MODULE, ScheduleFix


def under_allocate(sched: Any) -> None:
    """Seeded bug: every allocation reserves one token less than it schedules."""
    manager = sched.kv_cache_manager
    original = manager.allocate_slots

    def allocate(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        return original(request, max(1, num_new_tokens - 1), *args, **kwargs)

    manager.allocate_slots = allocate


def hit_bound_a_block_short(sched: Any) -> None:
    """Seeded bug: the prefix-cache lookup bounds a hit one block below what the request may
    read, so a hit misses its last cached block (and a one-block hit misses altogether)."""
    coordinator = sched.kv_cache_manager.coordinator
    original = coordinator.find_longest_cache_hit
    block_size = sched.block_size

    def find(block_hashes: Any, max_cache_hit_length: int, *args: Any, **kwargs: Any) -> Any:
        shorter = max(0, max_cache_hit_length - block_size)
        return original(block_hashes, shorter, *args, **kwargs)

    coordinator.find_longest_cache_hit = find


def extra_seat(sched: Any) -> None:
    """Seeded bug: one more request may run than max_num_seqs allows."""
    sched.max_num_active_reqs += 1
    sched.max_num_running_reqs += 1


def lifo_admission(sched: Any) -> None:
    """Seeded bug: under FCFS a new request joins the front of the waiting queue."""
    queue = sched.waiting
    if type(queue).__name__ == "FCFSRequestQueue":
        queue.add_request = queue.prepend_request


def stop_reported_as_length(sched: Any) -> None:
    """Seeded bug: a stop token sampled as the last allowed output is reported as length."""
    original = sched._update_request_with_output

    def update(request: Any, new_token_ids: list[int], is_stale: bool = False) -> Any:
        tokens, stopped = original(request, new_token_ids, is_stale)
        status = type(request.status)
        last = request.num_output_tokens >= request.max_tokens
        if stopped and request.status == status.FINISHED_STOPPED and last:
            request.status = status.FINISHED_LENGTH_CAPPED
        return tokens, stopped

    sched._update_request_with_output = update


def preemption_in_flight_raises(sched: Any) -> None:
    """Seeded bug: preempting a request with a step in flight trips an assertion."""
    original = sched._preempt_request

    def preempt(request: Any, *args: Any, **kwargs: Any) -> None:
        if request.num_in_flight_tokens > 0:
            raise AssertionError("preempted with a step in flight")
        original(request, *args, **kwargs)

    sched._preempt_request = preempt


def budget_raised(sched: Any) -> None:
    """Seeded bug: the scheduler's token budget is 3 tokens over the configured one."""
    sched.max_num_scheduled_tokens += 3
    sched.scheduler_config.max_num_batched_tokens += 3


def abort_in_flight_leaks(sched: Any) -> None:
    """Seeded bug: aborting a request with a step in flight drops its block table unfreed."""
    original = sched._free_blocks
    tables = sched.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks

    def free(request: Any) -> None:
        if request.num_in_flight_tokens > 0 and request.status.name == "FINISHED_ABORTED":
            tables.pop(request.request_id, None)
            return
        original(request)

    sched._free_blocks = free


def stale_hash_on_reuse(sched: Any) -> None:
    """Seeded bug (prefix caching): a cached block handed out again stays findable under the
    hash of what it held, so a later request with that prefix hits KV another request has
    overwritten since."""
    pool = sched.kv_cache_manager.block_pool
    original = pool.get_new_blocks

    def get_new_blocks(num_blocks: int) -> Any:
        free = pool.free_block_queue.get_all_free_blocks()[:num_blocks]
        held = [(b, b.block_hash) for b in free if b.block_hash is not None]
        blocks = original(num_blocks)
        for block, block_hash in held:
            if block in blocks:
                pool.cached_block_hash_to_block.insert(block_hash, block)
        return blocks

    pool.get_new_blocks = get_new_blocks


def reused_block_keeps_its_key(sched: Any) -> None:
    """Seeded bug (prefix caching): a cached block handed out again keeps its prefix-cache key
    (on the block and in the lookup), so the new owner writes its tokens over content a later
    hit on that key would read. Unlike `stale_hash_on_reuse` the block itself still names the
    key, which vLLM's own assertion trips over when the new owner caches the block in the
    same step."""
    pool = sched.kv_cache_manager.block_pool
    original = pool.get_new_blocks

    def get_new_blocks(num_blocks: int) -> Any:
        free = pool.free_block_queue.get_all_free_blocks()[:num_blocks]
        held = [(b, b.block_hash, b.block_hash_num_tokens) for b in free if b.block_hash]
        blocks = original(num_blocks)
        for block, key, num_tokens in held:
            if block in blocks:
                block.set_block_hash(key, num_tokens)
                pool.cached_block_hash_to_block.insert(key, block)
        return blocks

    pool.get_new_blocks = get_new_blocks


def new_blocks_not_announced(sched: Any) -> None:
    """Seeded bug: a running request's newly allocated blocks are left out of the scheduler
    output (`new_block_ids` None), so the model runner never learns of them."""
    original = sched._make_cached_request_data

    def cached_request_data(*args: Any, **kwargs: Any) -> Any:
        data = original(*args, **kwargs)
        resumed = getattr(data, "resumed_req_ids", ())  # vLLM 0.34.0 resumes as new requests
        data.new_block_ids = [
            ids if rid in resumed else None
            for rid, ids in zip(data.req_ids, data.new_block_ids, strict=True)
        ]
        return data

    sched._make_cached_request_data = cached_request_data


def finished_not_reported(sched: Any) -> None:
    """Seeded bug: a request that stops or reaches its length is freed without its id going
    into `finished_req_ids`, so no output tells the model runner it ended."""
    original = sched._free_request

    def free(request: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(request, *args, **kwargs)
        if request.status.name in ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"):
            sched.finished_req_ids.discard(request.request_id)
        return result

    sched._free_request = free


def offload_flush_dropped(sched: Any) -> None:
    """Seeded bug (vLLM's offloading connector): no store job is ever flushed, so a store whose
    source blocks were reallocated runs on beside the forward that overwrites them."""
    connector = sched.connector.connector_scheduler
    original = connector._build_connector_meta

    def build(scheduler_output: Any) -> Any:
        meta = original(scheduler_output)
        meta.jobs_to_flush = set()
        return meta

    connector._build_connector_meta = build


def offload_load_from_chunk_start(sched: Any) -> None:
    """Seeded bug (vLLM's offloading connector, chunks of several blocks): a load's
    `block_indices` says it starts at a chunk's first block even where the request computed
    that chunk's first blocks itself, so a load that starts inside a chunk writes each block
    with its neighbour's KV."""
    connector = sched.connector.connector_scheduler
    original = connector.update_state_after_alloc
    per = connector.config.blocks_per_chunk

    def update_state_after_alloc(request: Any, blocks: Any, num_external_tokens: int) -> Any:
        result = original(request, blocks, num_external_tokens)
        for job in connector._current_batch_load_jobs.values():
            spec = job.dst_spec
            spec.block_indices = [i - i % per for i in spec.block_indices]
        return result

    connector.update_state_after_alloc = update_state_after_alloc


def offload_load_off_by_one(sched: Any) -> None:
    """Seeded bug (vLLM's offloading connector): every load reads the CPU chunk after the one
    its key was stored in."""
    manager = sched.connector.connector_scheduler.manager
    original = manager.prepare_load

    def prepare_load(keys: Any, req_context: Any) -> Any:
        spec = original(keys, req_context)
        spec.block_ids = (spec.block_ids + 1) % manager._num_chunks
        return spec

    manager.prepare_load = prepare_load


def offload_reset_without_flush(sched: Any) -> None:
    """Seeded bug (vLLM's offloading connector): a cache reset drops the jobs in flight
    without flushing them, so a store from before the reset writes a chunk the reset freed
    for new keys."""
    connector = sched.connector.connector_scheduler
    original = connector._reset_cache

    def reset() -> None:
        original()
        connector._current_batch_jobs_to_flush.clear()

    connector._reset_cache = reset


def _window_manager(sched: Any) -> Any:
    """The sliding-window group's manager of a hybrid cache (`LoopOptions(sliding_window=W)`)."""
    managers = sched.kv_cache_manager.coordinator.single_type_managers
    return next(m for m in managers if hasattr(m, "sliding_window"))


def window_freed_early(sched: Any) -> None:
    """Seeded bug: a sliding window frees its blocks one block too early, one its attention
    still reads among them."""
    manager = _window_manager(sched)
    original = manager.get_num_skipped_tokens
    block_size = int(manager.block_size)

    def skipped(num_computed_tokens: int) -> int:
        return int(original(num_computed_tokens)) + block_size

    manager.get_num_skipped_tokens = skipped


def window_blocks_counted_in_hash_blocks(sched: Any) -> None:
    """Seeded bug (a window group of larger blocks, `LoopOptions(window_block_scale=K)`): the
    window counts the blocks that left it in hash blocks (the groups' greatest common
    divisor), not in its own, so it frees K times as many, some its attention still reads.
    Harmless where the groups' blocks are of one size."""
    manager = _window_manager(sched)
    hash_block_size = int(sched.hash_block_size)

    def remove(
        request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        skipped = int(manager.get_num_skipped_tokens(processed_computed_tokens))
        if skipped > 0:
            blocks = manager.req_to_blocks[request_id]
            manager._remove_blocks_in_range(
                request_id, 0, min(skipped // hash_block_size, len(blocks))
            )

    manager.remove_skipped_blocks = remove


def _align_mamba_manager(sched: Any) -> Any:
    """The scheduler's Mamba manager in align mode (the group a Mamba seeded bug edits)."""
    managers = sched.kv_cache_manager.coordinator.single_type_managers
    return next(m for m in managers if getattr(m, "mamba_cache_mode", None) == "align")


def mamba_state_freed_early(sched: Any) -> None:
    """Seeded bug (a Mamba group in align mode, `LoopOptions(mamba=True)`): when a request
    moves its state to a new block, the manager frees the block holding the state so far at
    once, in the very step whose worker copies the state out of it, not a step later."""
    manager = _align_mamba_manager(sched)
    original = manager.allocate_new_blocks

    def allocate(request_id: str, *args: Any, **kwargs: Any) -> Any:
        new = original(request_id, *args, **kwargs)
        last = manager.last_state_block_idx.get(request_id)
        blocks = manager.req_to_blocks.get(request_id, [])
        # a cached checkpoint stays for later hits: only a private state block is freed
        private = last is not None and last < len(blocks) - 1 and blocks[last].block_hash is None
        if new and private and last is not None and not blocks[last].is_null:
            manager.block_pool.free_blocks([blocks[last]])
            blocks[last] = manager._null_block
        return new

    manager.allocate_new_blocks = allocate


def mamba_copy_dropped(sched: Any) -> None:
    """Seeded bug (a Mamba group of larger blocks, `LoopOptions(mamba=True,
    mamba_block_scale=K)`): the scheduler output leaves out the block copies the step owes
    the worker, so a prompt-end state whose cache entry moved to another block as its request
    ran on is never copied there."""
    original = sched.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        out.kv_cache_block_copies = None
        return out

    sched.schedule = schedule


def attention_copy_dropped(sched: Any) -> None:
    """Seeded bug (Mamba blocks larger than the hash block, `LoopOptions(mamba=True,
    mamba_block_scale=K)`, where hits may end inside a block): the scheduler output leaves out
    the full-attention group's block copies, keeping the Mamba group's, so a hit ending inside
    an attention block gets a private block that never receives the shared block's first
    tokens (copy-on-write without the copy)."""
    attention = sched.kv_cache_manager.coordinator.single_type_managers[0]
    original = sched.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        held = {b.block_id for blocks in attention.req_to_blocks.values() for b in blocks}
        kept = [c for c in out.kv_cache_block_copies or () if int(c.dst_block_id) not in held]
        out.kv_cache_block_copies = kept or None
        return out

    sched.schedule = schedule


def attention_block_shared(sched: Any) -> None:
    """Seeded bug (Mamba blocks larger than the hash block, `LoopOptions(mamba=True,
    mamba_block_scale=K)`, where hits may end inside a block): the full-attention group never
    sees a hit end inside its block, so a request whose hit does so takes the cached block
    itself, not a private copy (no copy-on-write), and writes its next tokens into it."""
    attention = sched.kv_cache_manager.coordinator.single_type_managers[0]
    attention._has_partial_local_hit = lambda blocks, computed_tokens: False


def mamba_checkpoint_one_block_early(sched: Any) -> None:
    """Seeded bug (a Mamba group in align mode, `LoopOptions(mamba=True)`): a prefix-cache hit
    ending at block i hands the Mamba group the checkpoint cached for block i - 1 (the state
    one block short of the hit) where vLLM finds one."""
    coordinator = sched.kv_cache_manager.coordinator
    for index, group in enumerate(coordinator.attention_groups):
        if type(group.spec).__name__ != "MambaSpec":
            continue
        base = group.manager_cls

        class OneBlockEarly(base):  # type: ignore[misc, valid-type]
            @classmethod
            def find_longest_cache_hit(
                cls,
                block_hashes: Any,
                max_length: int,
                kv_cache_group_ids: list[int],
                block_pool: Any,
                **kwargs: Any,
            ) -> Any:
                blocks, length = super().find_longest_cache_hit(
                    block_hashes, max_length, kv_cache_group_ids, block_pool, **kwargs
                )
                last = length // int(kwargs["kv_cache_spec"].block_size) - 1
                if last < 1:
                    return blocks, length
                earlier = block_pool.get_cached_block(block_hashes[last - 1], kv_cache_group_ids)
                if earlier is not None:
                    for computed, block in zip(blocks, earlier, strict=True):
                        computed[last] = block
                return blocks, length

        coordinator.attention_groups[index] = group._replace(manager_cls=OneBlockEarly)


def window_freed_but_held(sched: Any) -> None:
    """Seeded bug: a sliding window frees the blocks that left it but keeps them in the
    request's table (not replaced by the null block)."""
    manager = _window_manager(sched)

    def remove(request_id: str, first_block: int, last_block: int) -> None:
        blocks = manager.req_to_blocks.get(request_id, [])
        freed = [b for b in blocks[first_block:last_block] if not b.is_null and b.ref_cnt > 0]
        if freed:
            manager.block_pool.free_blocks(freed)

    manager._remove_blocks_in_range = remove


def cross_group_hit(sched: Any) -> None:
    """Seeded bug: a prefix-cache lookup ignores the KV cache group, so every group's hit is
    the block the first group cached (its layers' KV, not theirs)."""
    pool = sched.kv_cache_manager.block_pool
    original = pool.get_cached_block

    def lookup(block_hash: Any, kv_cache_group_ids: list[int]) -> Any:
        found = original(block_hash, [0])
        return None if found is None else found * len(kv_cache_group_ids)

    pool.get_cached_block = lookup


def offload_groups_swapped(sched: Any) -> None:
    """Seeded bug (vLLM's offloading connector, a hybrid cache): a store's GPU spec lists its
    groups' block counts and first indices in the wrong order, so the worker copies a
    sliding window's blocks as full-attention KV and the other way round."""
    connector = sched.connector.connector_scheduler
    original = connector._build_connector_meta

    def build(scheduler_output: Any) -> Any:
        meta = original(scheduler_output)
        for job in meta.store_jobs.values():
            spec = job.src_spec
            if len(set(spec.group_sizes)) > 1:
                spec.group_sizes = list(reversed(spec.group_sizes))
                spec.block_indices = list(reversed(spec.block_indices))
        return meta

    connector._build_connector_meta = build


def mamba_checkpoint_keyed_one_column_late(sched: Any) -> None:
    """Seeded bug (a Mamba group whose layers export prefill checkpoints, `LoopOptions(
    mamba=True, mamba_checkpoint_alignment=A)`): the manager keys the block after the one the
    worker exports the checkpoint into, the block of the step's last token, under the
    checkpoint's block hash, so a hit there reads the state after the whole step."""
    manager = _align_mamba_manager(sched)
    original = manager.get_num_blocks_to_allocate

    def allocate(request_id: str, *args: Any, **kwargs: Any) -> Any:
        blocks = original(request_id, *args, **kwargs)
        checkpoint = manager._checkpoints.get(request_id)
        if checkpoint is not None:
            position, column = checkpoint
            manager._checkpoints[request_id] = (position, column + 1)
        return blocks

    manager.get_num_blocks_to_allocate = allocate


def removal_not_announced(sched: Any) -> None:
    """Seeded bug (KV cache events on, `LoopOptions(kv_events=True)`): the block pool evicts a
    cached block without queueing its `BlockRemoved` event, so a router keeps the key."""
    pool = sched.kv_cache_manager.block_pool
    original = pool._maybe_evict_cached_block

    def evict(block: Any) -> Any:
        queued = len(pool.kv_event_queue)
        evicted = original(block)
        del pool.kv_event_queue[queued:]
        return evicted

    pool._maybe_evict_cached_block = evict


def later_stores_not_announced(sched: Any) -> None:
    """Seeded bug (KV cache events on): the block pool announces only the first blocks a
    request caches; a `BlockStored` for blocks cached after others of the request is never
    queued, so a router never learns those keys."""
    pool = sched.kv_cache_manager.block_pool
    original = pool.cache_full_blocks

    def cache(request: Any, blocks: Any, num_cached_blocks: int, *args: Any, **kw: Any) -> Any:
        queued = len(pool.kv_event_queue)
        result = original(request, blocks, num_cached_blocks, *args, **kw)
        if num_cached_blocks > 0:
            del pool.kv_event_queue[queued:]
        return result

    pool.cache_full_blocks = cache


def _edit_stores(sched: Any, edit: Callable[[Any, Any, dict[str, Any]], None]) -> None:
    """Have the block pool's every `BlockStored` edited by `edit(event, request, kwargs)` (the
    arguments of `_build_block_stored_event`) before it is queued."""
    pool = sched.kv_cache_manager.block_pool
    original = pool._build_block_stored_event

    def build(request: Any, **kwargs: Any) -> Any:
        event = original(request, **kwargs)
        edit(event, request, kwargs)
        return event

    pool._build_block_stored_event = build


def stores_name_no_adapter(sched: Any) -> None:
    """Seeded bug (KV cache events on, LoRA adapters): the block pool announces a store with no
    LoRA fields, as if the base model wrote it."""

    def edit(event: Any, _request: Any, _kwargs: dict[str, Any]) -> None:
        event.lora_id = event.lora_name = None

    _edit_stores(sched, edit)


def stored_tokens_one_late(sched: Any) -> None:
    """Seeded bug (KV cache events on): a store's token ids are read one token late (the range
    of its blocks shifted by one, as an off-by-one slice would)."""

    def edit(event: Any, request: Any, kwargs: dict[str, Any]) -> None:
        start, end = kwargs["start_token_idx"], kwargs["end_token_idx"]
        event.token_ids = request.all_token_ids[start + 1 : end + 1]

    _edit_stores(sched, edit)


def stores_unchained(sched: Any) -> None:
    """Seeded bug (KV cache events on): every store names no parent, as if each started a
    prompt."""

    def edit(event: Any, _request: Any, _kwargs: dict[str, Any]) -> None:
        event.parent_block_hash = None

    _edit_stores(sched, edit)


def adapters_past_max_loras(sched: Any) -> None:
    """Seeded bug: the scheduler admits requests whatever LoRA adapters run already (it reads a
    `max_loras` far above the configured one)."""
    sched.lora_config = SimpleNamespace(max_loras=1_000_000)


def adapters_never_admitted(sched: Any) -> None:
    """Seeded bug: a request with a LoRA adapter waits while no adapter runs (the scheduler
    reads `max_loras` as 0), and the base model's requests pass it."""
    sched.lora_config = SimpleNamespace(max_loras=0)


def adapter_not_hashed(sched: Any) -> None:
    """Seeded bug: block hashes leave the request's LoRA adapter out, so equal tokens under
    two adapters share prefix-cache blocks (vLLM puts the adapter's name and path in them)."""
    add = sched.add_request

    def add_without_adapter(request: Any) -> None:
        hasher = request._block_hasher

        def hash_without_adapter(req: Any) -> Any:
            adapter, req.lora_request = req.lora_request, None
            try:
                return hasher(req)
            finally:
                req.lora_request = adapter

        request._block_hasher = hash_without_adapter
        request.block_hashes = []
        request.update_block_hashes()
        add(request)

    sched.add_request = add_without_adapter


def pause_ignored(sched: Any) -> None:
    """Seeded bug: the scheduler ignores a pause (`set_pause_state` changes nothing)."""
    sched.set_pause_state = lambda state: None


def keep_pause_runs_the_running(sched: Any) -> None:
    """Seeded bug: a pause that keeps requests ("keep", `PAUSED_ALL`) is taken as one that
    drains them (`PAUSED_NEW`): the running requests go on being scheduled."""
    set_state = sched.set_pause_state

    def set_pause_state(state: Any) -> None:
        set_state(type(state).PAUSED_NEW if state.name == "PAUSED_ALL" else state)

    sched.set_pause_state = set_pause_state


def session_keeps_its_last_token(sched: Any) -> None:
    """Seeded bug: a streaming-input session's next input keeps the turn's last sampled token,
    which vLLM never fed to the model, in the session's prompt."""
    apply = sched._update_request_as_session

    def update(session: Any, next_input: Any) -> None:
        last = session._all_token_ids[-1]
        keep_end = session.num_tokens - 1
        apply(session, next_input)
        session._all_token_ids.insert(keep_end, last)
        session.prompt_token_ids.insert(keep_end, last)
        session.num_prompt_tokens += 1

    sched._update_request_as_session = update


def session_keeps_its_reasoning_end(sched: Any) -> None:
    """Seeded bug: a streaming-input session's next input takes its own grammar (the
    `own-grammar-per-input` fix applied) but carries over the earlier grammar's latch that
    reasoning has ended, so a later turn that reasons again is constrained from its first
    output."""
    apply = sched._update_request_as_session

    def update(session: Any, next_input: Any) -> None:
        earlier = session.structured_output_request
        apply(session, next_input)
        grammar = session.structured_output_request
        if earlier is not None and grammar is not None:
            grammar.reasoning_ended = earlier.reasoning_ended

    sched._update_request_as_session = update


def session_drops_its_kv(sched: Any) -> None:
    """Seeded bug: a streaming-input session's next input frees the KV of its kept tokens and
    recomputes them."""
    apply = sched._update_request_as_session

    def update(session: Any, next_input: Any) -> None:
        apply(session, next_input)
        sched.kv_cache_manager.free(session)
        session.num_computed_tokens = 0

    sched._update_request_as_session = update


def active_seat_past_the_cap(sched: Any) -> None:
    """Seeded bug: one more request may be admitted into RUNNING than max_num_active_seqs."""
    sched.max_num_active_reqs += 1


def watermark_ignored(sched: Any) -> None:
    """Seeded bug: admissions keep no watermark free."""
    sched.kv_cache_manager.watermark_blocks = 0


def cadence_counts_empty_calls(sched: Any) -> None:
    """Seeded bug: the prefill cadence counts a schedule() call that scheduled nothing as an
    executed step, so a hold ends early."""
    original = sched.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if out.total_num_scheduled_tokens == 0:
            sched.num_executed_steps += 1
        return out

    sched.schedule = schedule


#: `held_step_defers_decodes` as an edit of vLLM's `Scheduler.schedule` (compiled on first use).
_DEFER_DECODES = ScheduleFix(
    EngineFix(
        "held-step-defers-decodes",
        (
            (
                SCHEDULER_MODULE,
                "            if defer_prefills and request.is_prefill_chunk:\n",
                "            if defer_prefills:\n",
            ),
        ),
        ((SCHEDULER_MODULE, "Scheduler.schedule"),),
        "seeded bug: a step the prefill cadence holds skips every running request",
    )
)


def held_step_defers_decodes(sched: Any) -> None:
    """Seeded bug: a step the prefill cadence holds skips every running request, decodes
    too (the hold's test loses `request.is_prefill_chunk`), so it schedules nothing."""
    _DEFER_DECODES.apply(sched)


#: `whole_prompts_only` as an edit of vLLM's `Scheduler.schedule` (compiled on first use).
_WHOLE_PROMPTS_ONLY = ScheduleFix(
    EngineFix(
        "whole-prompts-only",
        (
            (
                SCHEDULER_MODULE,
                "                        not self.scheduler_config.enable_chunked_prefill\n"
                "                        and num_new_tokens > request_token_budget\n",
                "                        num_new_tokens > request_token_budget\n",
            ),
        ),
        ((SCHEDULER_MODULE, "Scheduler.schedule"),),
        "seeded bug: the waiting pass stops at a prompt longer than the budget left",
    )
)


def whole_prompts_only(sched: Any) -> None:
    """Seeded bug: with chunked prefill on, the waiting pass stops at a prompt longer than
    the budget left, as vLLM does only with chunked prefill off: a chunk of it would fit,
    and running requests are still chunked."""
    _WHOLE_PROMPTS_ONLY.apply(sched)


def waiting_sessions_not_counted(sched: Any) -> None:
    """Seeded bug: schedule() counts no streaming-input session waiting for its next input
    against max_num_active_seqs (they keep a model-runner slot)."""
    original = sched.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        waiting = sched.num_waiting_for_streaming_input
        sched.num_waiting_for_streaming_input = 0
        try:
            return original(*args, **kwargs)
        finally:
            sched.num_waiting_for_streaming_input += waiting

    sched.schedule = schedule


def _read_unbounded(request: Any) -> Callable[[], None]:
    """Lift `request`'s cache read limit (0.34.0's `prefix_cache_hit_limit`, 0.33.0's
    `skip_reading_prefix_cache`); returns what puts it back."""
    if hasattr(request, "prefix_cache_hit_limit"):
        limit = request.prefix_cache_hit_limit
        request.prefix_cache_hit_limit = None
        return lambda: setattr(request, "prefix_cache_hit_limit", limit)
    skip = request.skip_reading_prefix_cache
    request.skip_reading_prefix_cache = False
    return lambda: setattr(request, "skip_reading_prefix_cache", skip)


def cache_limit_ignored(sched: Any) -> None:
    """Seeded bug: the prefix-cache lookup ignores a request's cache read limit (it reads the
    rows a prompt-scoring request must compute, or a cache it was told to skip)."""
    manager = sched.kv_cache_manager
    original = manager.get_computed_blocks

    def computed(request: Any, *args: Any, **kwargs: Any) -> Any:
        restore = _read_unbounded(request)
        try:
            return original(request, *args, **kwargs)
        finally:
            restore()

    manager.get_computed_blocks = computed


def connector_limit_ignored(sched: Any) -> None:
    """Seeded bug: the scheduler takes a KV connector's hit for a request with a cache read
    limit (vLLM drops it: `skip_reading_external_kv`); the local lookup still honours it."""
    connector = sched.connector
    original_lookup = connector.get_num_new_matched_tokens
    original_schedule = sched.schedule
    lifted: list[Callable[[], None]] = []

    def lookup(request: Any, *args: Any, **kwargs: Any) -> Any:
        lifted.append(_read_unbounded(request))  # the guard after the lookup reads no limit
        return original_lookup(request, *args, **kwargs)

    def schedule(*args: Any, **kwargs: Any) -> Any:
        try:
            return original_schedule(*args, **kwargs)
        finally:
            while lifted:
                lifted.pop()()

    connector.get_num_new_matched_tokens = lookup
    sched.schedule = schedule


def connector_loads_first_group_only(sched: Any) -> None:
    """Seeded bug (schedspec's connector on a hybrid cache): a load writes the full-attention
    group's blocks only, as a connector without `SupportsHMA` moves one group, so the sliding
    window reads blocks nothing wrote."""
    remote = sched.connector.remote
    original = remote.allocated

    def allocated(request: Any, block_ids: Any, num_external: int, **_groups: Any) -> None:
        original(request, block_ids, num_external)

    remote.allocated = allocated


def window_freed_under_a_send(sched: Any) -> None:
    """Seeded bug (a hybrid cache with a KV connector): a finished request whose KV is being
    sent keeps its full-attention blocks but gives the sliding window's back to the pool while
    the send still reads them."""
    original = sched._connector_finished

    def connector_finished(request: Any) -> Any:
        delay_free, params = original(request)
        if delay_free:
            sched.kv_cache_manager.coordinator.single_type_managers[1].free(request.request_id)
        return delay_free, params

    sched._connector_finished = connector_finished


def failed_load_fails_a_bystander(sched: Any) -> None:
    """Seeded bug (the candidate fix `hear-failed-sync-load` made): when a synchronous load
    fails, every running request ends with an error under the "fail" policy, not only those
    holding a block of the load (an engine failing the batch for one request's KV)."""
    original = sched._handle_failed_sync_loads

    def handle_failed_sync_loads(failed_loads: Any) -> set[str]:
        holders: set[str] = original(failed_loads)
        if sched.recompute_kv_load_failures:
            return holders
        return holders | {req.request_id for req in sched.running}

    sched._handle_failed_sync_loads = handle_failed_sync_loads


def restart_skips_the_drain(sched: Any) -> None:
    """Seeded bug (the candidate fix `hear-failed-sync-load` made, recompute policy): a request
    preempted after its synchronous load failed resumes at once, its dropped steps still in
    flight, not once they have drained."""
    original = sched._handle_failed_sync_loads

    def handle_failed_sync_loads(failed_loads: Any) -> set[str]:
        skipped: set[str] = original(failed_loads)
        sched._failed_load_restarts.clear()
        return skipped

    sched._handle_failed_sync_loads = handle_failed_sync_loads


def encoder_inputs_not_sent(sched: Any) -> None:
    """Seeded bug: the scheduler books the encoder inputs it schedules but leaves them out of
    its output, so the model runner never runs the encoder over them."""
    schedule = sched.schedule

    def without_encoder_inputs() -> Any:
        out = schedule()
        out.scheduled_encoder_inputs = {}
        return out

    sched.schedule = without_encoder_inputs


def encoder_budget_ignored(sched: Any) -> None:
    """Seeded bug: the scheduler reads an encoder compute budget far above the configured
    one, so one step may run any number of items."""
    sched.max_num_encoder_input_tokens = 1_000_000


def encoder_cache_oversized(sched: Any) -> None:
    """Seeded bug: the scheduler's encoder cache book is sized far above the runner's cache,
    so it keeps entries the cache has no room for."""
    manager = type(sched.encoder_cache_manager)
    sched.encoder_cache_manager = manager(cache_size=1_000_000)


def encoder_evictions_untold(sched: Any) -> None:
    """Seeded bug: the scheduler evicts encoder cache entries from its book but never tells
    the runner (`free_encoder_mm_hashes` always empty), which keeps them."""
    sched.encoder_cache_manager.get_freed_mm_hashes = lambda: []


def mm_input_split(sched: Any) -> None:
    """Seeded bug: the scheduler ignores `disable_chunked_mm_input` and splits an item across
    steps."""
    sched.scheduler_config.disable_chunked_mm_input = False


def encoder_refs_kept(sched: Any) -> None:
    """Seeded bug: the encoder cache never drops a request's reference to an entry (neither
    once the request has read it nor when it ends)."""
    sched.encoder_cache_manager.free_encoder_input = lambda request, input_id: None


def chunked_prefill_forced_on(sched: Any) -> None:
    """Seeded bug: the scheduler reads chunked prefill as on, with a long-prefill threshold of
    one token, and splits a prompt that must be prefilled whole (a multimodal request's too)."""
    sched.scheduler_config.enable_chunked_prefill = True
    sched.scheduler_config.long_prefill_token_threshold = 1


def ec_blocks_handed_out_twice(sched: Any) -> None:
    """Seeded bug: the CPU encoder cache hands an entry's blocks out and keeps them free, so a
    later save writes over an entry a load then reads (`ec_load_content`)."""
    cache = sched.ec_connector.connector_scheduler._cache
    alloc = cache.alloc

    def alloc_keeping_blocks_free(key: str, n_blocks: int, shape: Any = None) -> Any:
        entry = alloc(key, n_blocks, shape)
        if entry is not None:
            cache._free_blocks.extend(entry.block_ids)
        return entry

    cache.alloc = alloc_keeping_blocks_free


def ec_loads_saved_again(sched: Any) -> None:
    """Seeded bug: the connector also saves every item it loads, though the encoder does not
    run it (`ec_save_lands`)."""
    delegate = sched.ec_connector.connector_scheduler
    after_alloc = delegate.update_state_after_alloc

    def after_alloc_saving_loads(request: Any, index: int) -> None:
        after_alloc(request, index)
        mm_hash = request.mm_features[index].identifier
        if mm_hash in delegate._pending_loads:
            delegate._pending_saves[mm_hash] = list(delegate._pending_loads[mm_hash][1])

    delegate.update_state_after_alloc = after_alloc_saving_loads


def ec_load_reports_ignored(sched: Any) -> None:
    """Seeded bug: the connector ignores the worker's completed loads, so every loaded entry
    stays pinned (`ec_offload_settled`)."""
    delegate = sched.ec_connector.connector_scheduler
    update = delegate.update_connector_output

    def update_without_loads(connector_output: Any) -> None:
        meta = connector_output.ec_connector_worker_meta
        if meta is not None:
            meta.completed_loads = []
        update(connector_output)

    delegate.update_connector_output = update_without_loads


def _grammar_pending(request: Any) -> bool:
    """vLLM request `request` waits for a grammar that has not compiled (nor failed) yet."""
    settled = grammar_compiled(request) or grammar_failed(request)
    return waiting_for_grammar(request) and not settled


def grammar_wait_ignored(sched: Any) -> None:
    """Seeded bug: the waiting pass promotes and admits a structured-output request whose
    grammar is still compiling, as if it had compiled."""
    original = sched._handle_blocked_waiting_request

    def handle(request: Any) -> bool:
        if _grammar_pending(request):
            request.status = type(request.status).WAITING
            return True
        return bool(original(request))

    sched._handle_blocked_waiting_request = handle


def compiled_grammar_passed_once(sched: Any) -> None:
    """Seeded bug: the waiting pass promotes a request whose grammar has compiled but passes
    over it in that step, admitting the requests behind it (it is admitted a step later)."""
    original = sched._handle_blocked_waiting_request

    def handle(request: Any) -> bool:
        blocked = waiting_for_grammar(request)
        return bool(original(request)) and not blocked

    sched._handle_blocked_waiting_request = handle


def compiled_grammar_seen_late(sched: Any) -> None:
    """Seeded bug: the waiting pass leaves a request whose grammar has compiled waiting for
    it the first time it looks (its status unchanged), and admits the requests behind it; the
    next pass promotes it."""
    original = sched._handle_blocked_waiting_request
    looked: set[str] = set()

    def handle(request: Any) -> bool:
        waits = waiting_for_grammar(request)
        if waits and request.request_id not in looked and grammar_compiled(request):
            looked.add(request.request_id)
            return False
        return bool(original(request))

    sched._handle_blocked_waiting_request = handle


def blocked_grammar_stops_the_pass(sched: Any) -> None:
    """Seeded bug: the waiting pass stops at a request whose grammar still compiles, as a
    `break` where vLLM skips it: the requests behind it wait though they fit (head-of-line
    blocking). No admission-order rule sees it; the decision twin does."""
    handle_own, schedule_own = sched._handle_blocked_waiting_request, sched.schedule
    stopped = [False]  # this pass has met a request still waiting for its grammar

    def handle(request: Any) -> bool:
        if stopped[0]:
            return False
        ready = bool(handle_own(request))
        stopped[0] = not ready and waiting_for_grammar(request)
        return ready

    def schedule(*args: Any, **kwargs: Any) -> Any:
        stopped[0] = False
        return schedule_own(*args, **kwargs)

    sched._handle_blocked_waiting_request = handle
    sched.schedule = schedule


class _CountedAsNothing(set[Any]):
    """A set whose size reads 0."""

    def __len__(self) -> int:
        return 0


def capacity_escape_counts_deferred(sched: Any) -> None:
    """Seeded bug: the prefill cadence's capacity escape counts the requests deferred for
    their grammar as work left waiting (`deferred_waiting` read as empty), so a step whose
    only waiting requests await their grammars lifts the next hold."""
    sched.deferred_waiting = _CountedAsNothing(sched.deferred_waiting)


def window_moves_blocked_requests(sched: Any) -> None:
    """Seeded bug (vLLM 0.34.0): the cache-aware window moves requests still in the grammar's
    blocked status too, as if they were `WAITING`: one whose grammar has compiled but that no
    pass has reached yet can be moved behind a request with a cached prefix."""
    own = sched._reorder_waiting_by_cached_prefix

    def reorder() -> None:
        blocked = [r for r in sched.waiting if waiting_for_grammar(r)]
        for request in blocked:
            request.status = type(request.status).WAITING
        try:
            own()
        finally:
            for request in blocked:
                request.status = type(request.status).WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR

    sched._reorder_waiting_by_cached_prefix = reorder


def grammar_error_forgotten(sched: Any) -> None:
    """Seeded bug: the waiting pass forgets the error of a grammar that failed to compile, so
    vLLM never ends the request: it waits for ever."""
    own = sched._handle_blocked_waiting_request

    def handle(request: Any) -> bool:
        ready = bool(own(request))
        sched.grammar_compile_error_reqs.pop(request.request_id, None)
        return ready

    sched._handle_blocked_waiting_request = handle
