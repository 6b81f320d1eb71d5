"""`cache_hit_written` for vLLM's engine-core loop: every prefix-cache hit lands on blocks that a
scheduled batch wrote with that very content.

The AR conformance suite checks what the prefix cache claims against the spec step by step;
the engine-core loop (`integrations.vllm.engine_core`, asynchronous scheduling with batches in
flight) has no spec to follow, so this records writes instead. A batch writes the KV of the
tokens it schedules: the block a batch completes (the block of its last token in it, full)
holds the content of that request's block k. A request scheduled with computed tokens it did
not compute in an earlier batch, a new one or one resumed after preemption, got them from the
prefix cache; each such block must hold, as written, the request's own block k: the same
block hash (the writer's block hash read when the check runs: under asynchronous scheduling a
block's last token may still be a placeholder when its batch is scheduled). The current
batch's writes count (its forward writes the KV before attention reads it). A block written by
no batch, or with other content, breaks the rule: vLLM 0.33.0 does that under the priority
policy when it preempts a request it already scheduled in the same call (docs/engines/vllm.md).

With speculative decoding a batch writes a rejected draft's KV too, which is wrong; the loop
then passes what each request's step wrote correctly (`valid`: first position and count, from
`integrations.vllm.speculative`), and only blocks those positions complete count as written.

When the block no batch wrote got its hash in a `schedule()` call that also preempted the
request it was hashed for (its tokens scheduled, then taken out of the step), the message says
so: `before_schedule` keeps the pool's block hashes, and `after_schedule` notes the blocks whose
hash changed in the call to a block hash of one of its victims, until a batch writes them;
the reason is given when a hit finds such a block under that very hash.

With a KV connector (`every_read`) the same record checks every scheduled request, not only a
hit: its blocks below its computed tokens must hold, as written by a batch or a load, its own
content (`kv_written`); a load's blocks are recorded by the loop (`written`), and
`forget_failed_load` drops what a failed synchronous load, and its request's steps computed
over it, left wrong. With drafts (`verified_reads`), a running request's blocks are checked
below its verified tokens only: under asynchronous scheduling a step is scheduled past the
drafts of its steps in flight, and where vLLM rejects them it drops what read their KV.

On a hybrid cache (several KV cache groups sharing the pool, `integrations.vllm.adapter.
hybrid_groups`) each group's blocks are recorded and checked by that group's table, in blocks of
that group's size: a block holds what the group that wrote it last wrote there (a full-attention
layer's KV is not a sliding-window layer's), and a sliding window's null blocks are neither
written nor read. A group's block k of a request, in blocks of s hash blocks
(`Request.block_hashes` are by the groups' greatest common divisor), has the request's block
hash s(k + 1) - 1 (`block_hash`): block hashes chain, so equal hashes mean equal content. A
batch that writes into such a block without completing it leaves a partial write (`partial`: the
request, its block index, the tokens its prefix reaches there), except where it writes back the
KV the block holds completed (the same block index, tokens and adapter: a holder of a shared
block recomputing its prefix there, as `every-sharer-recomputes` makes it). Where vLLM looks
hits up finer than a group's blocks (a Mamba group's blocks larger than the hash block:
`supports_fine_grained_hash_lookup`), a hit may end at token s inside an attention block: that
block, the private copy vLLM hands the hit (copy-on-write, `kv_cache_block_copies`), must hold
the first s tokens of a request sharing them, as a completed write or a partial one reaching s.
The rule is also checked at the write (`_check_overwrite`): a batch writes no block that holds
another request's completed block under that content's prefix-cache key, unless its tokens up to
there are that request's, since a later hit on the key would read what it wrote.

A Mamba group (`state_groups`) holds a recurrent state, not per-token KV. vLLM's worker
(`preprocess_mamba`) runs a request's step from token s to token e by copying the state out of
the block of token s - 1 into the block of token e - 1 and updating it there, so that block
then holds the state after e tokens (`states`); nothing else of the step lands in the group.
Where the layers export internal prefill checkpoints (`state_checkpoint`, the worker's rule)
the step also writes the state after the checkpoint's tokens into the block-table column the
rule names. A running request's step must find the state after exactly s of its own tokens in
the block of token s - 1 (`kv_written`); a hit ending at token s must find there the state
after exactly s tokens of a request with the same first s tokens (`cache_hit_written`): a
checkpoint at a block's end, or, where the Mamba block is larger than the hash block and the
hit ends inside it, a partial state. vLLM keeps such a state for a prompt's end and, when its
request runs on, moves the cache entry to another block and has the worker copy it there
before the forward (`kv_cache_block_copies`, `apply_copies`).

Reads vLLM's `SchedulerOutput` (`num_scheduled_tokens`, `scheduled_new_reqs`,
`scheduled_cached_reqs`, `preempted_req_ids`), the block tables, the pool's block hashes and
`Request.block_hashes`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, TypeVar

from integrations.vllm.adapter import GroupTables, adapter_of, all_group_tables
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.release_api import resumed_req_ids
from integrations.vllm.unscheduled import block_hashes

V = TypeVar("V")


class CacheWrites:
    """What each block holds as written: block id -> (the writing `Request`, its block index),
    and the KV cache group that wrote it when not group 0 (`content`, `put`); and the blocks a
    call hashed for a request it preempted, not written since: block id -> (request id, its
    block index, the schedule index of that call, that block hash)."""

    def __init__(
        self,
        block_size: int,
        *,
        every_read: bool = False,
        verified_reads: bool = False,
        group_block_sizes: tuple[int, ...] = (),
        state_groups: frozenset[int] = frozenset(),
        state_checkpoint: Callable[[int, int, int], tuple[int, int]] | None = None,
    ) -> None:
        #: The hash block size: `Request.block_hashes` are of blocks of this many tokens.
        self.block_size: int = block_size
        #: Each KV cache group's block size, a multiple of `block_size` (a group not named:
        #: `block_size`).
        self.group_block_sizes: tuple[int, ...] = group_block_sizes
        #: The KV cache groups whose blocks hold a Mamba state (`integrations.vllm.adapter.
        #: mamba_mode`), and what each such block holds: block id -> (the request, the tokens
        #: its state has taken in).
        self.state_groups: frozenset[int] = state_groups
        self.states: dict[int, tuple[Any, int]] = {}
        #: The worker's internal prefill checkpoint rule: (group, the row's tokens after its
        #: step, the tokens it schedules) -> (the tokens the exported state has taken in, its
        #: block-table column), or (0, -1) for none (`integrations.vllm.adapter.
        #: mamba_checkpoint`); None: no layer exports one.
        self.state_checkpoint: Callable[[int, int, int], tuple[int, int]] | None = state_checkpoint
        #: Also check every scheduled request's computed blocks, not only a hit's (`kv_written`;
        #: with a KV connector, whose loads may fail under a running request).
        self.every_read: bool = every_read
        #: With drafts: check a running request's reads only below its verified tokens (those
        #: of its processed steps), as a step is scheduled past drafts still in flight, whose
        #: KV is wrong where vLLM later rejects them (it then drops what read them).
        self.verified_reads: bool = verified_reads
        self.written: dict[int, tuple[Any, int]] = {}
        #: How many writes were recorded (`put`), block id -> the number of its last, and how
        #: many were recorded before the latest `schedule()` call (`before_schedule`): what
        #: tells a request's writes since a batch was scheduled from those of its earlier
        #: runs (`forget_lost_load`).
        self.puts: int = 0
        self.put_order: dict[int, int] = {}
        self.puts_before_schedule: int = 0
        #: block id -> the KV cache group that wrote it, for groups other than 0
        self.written_in: dict[int, int] = {}
        #: An attention block a batch wrote without completing it: block id -> (the request,
        #: its block index, the request's tokens the block holds through, its KV cache group).
        self.partial: dict[int, tuple[Any, int, int, int]] = {}
        self.hashed_for_victims: dict[int, tuple[str, int, int, bytes]] = {}
        self._hashes_before: dict[int, bytes] = {}

    def group_block_size(self, group: int) -> int:
        """KV cache group `group`'s block size in tokens."""
        sizes = self.group_block_sizes
        return sizes[group] if group < len(sizes) else self.block_size

    def block_hash(self, content: tuple[Any, int], group: int = 0) -> bytes | None:
        """The block hash of `content` (a request and its block index in group `group`): that
        of the request's last hash block in it; None past its hashed blocks."""
        request, index = content
        last = (index + 1) * (self.group_block_size(group) // self.block_size) - 1
        hashes = request.block_hashes
        return bytes(hashes[last]) if last < len(hashes) else None

    def content(self, block: int, group: int = 0) -> tuple[Any, int] | None:
        """What `block` holds as KV cache group `group` wrote it, or None (no batch or load
        wrote it, or another group did since)."""
        if self.written_in.get(block, 0) != group:
            return None
        return self.written.get(block)

    def overwritten_by(self, block: int, group: int) -> int | None:
        """The KV cache group that wrote `block` last when that is not `group`, else None."""
        if block not in self.written:
            return None
        last = self.written_in.get(block, 0)
        return None if last == group else last

    def put(self, block: int, content: tuple[Any, int], group: int = 0) -> None:
        """`block` now holds `content` (a request and its block index), as group `group`
        wrote it."""
        self.written[block] = content
        self.put_order[block] = self.puts
        self.puts += 1
        self.partial.pop(block, None)
        if group not in self.state_groups:
            self.states.pop(block, None)
        if group:
            self.written_in[block] = group
        else:
            self.written_in.pop(block, None)

    def before_schedule(self, sched: Any) -> None:
        """Keep the pool's block hashes as they stand before the call, and the count of writes
        recorded (`puts_before_schedule`)."""
        self._hashes_before = block_hashes(sched)
        self.puts_before_schedule = self.puts

    def after_schedule(
        self,
        sched: Any,
        out: Any,
        schedule_index: int,
        valid: Mapping[str, tuple[int, int]] | None = None,
        own_kv: Collection[str] = (),
    ) -> None:
        """Note the blocks the call hashed for its victims, record the blocks `out`'s batch
        completes (each request's scheduled tokens from its computed ones, or the positions
        `valid` names for it: first position and count written with its true tokens), then
        check the cache hits it takes (`EngineCoreViolation("cache_hit_written", ...)`).
        `own_kv`: requests scheduled as new that resume on KV they kept (streaming-input
        sessions), not on a hit: what they read is checked as a running request's
        (`kv_written`)."""
        self._note_hashed_for_victims(sched, out, schedule_index)
        starts = batch_starts(out)
        hitting = {d.req_id for d in out.scheduled_new_reqs} | resumed_req_ids(out)
        hitting -= set(own_kv)
        tables = all_group_tables(sched)
        # the worker copies blocks before the forward; a Mamba step reads its state before
        # its forward writes the next one
        self.apply_copies(getattr(out, "kv_cache_block_copies", None) or ())
        self.check_states(sched, out, tables, starts, hitting, schedule_index)
        # a hit ending inside a block reads what the block held before this batch: the batch
        # writes the rest of that block
        self.check_partial_hits(sched, tables, starts, hitting, schedule_index)
        self.record(sched, out, tables, valid)
        scheduled = set(out.num_scheduled_tokens)
        reading = scheduled if self.every_read else hitting | (set(own_kv) & scheduled)
        for rid in sorted(reading):
            req, start = sched.requests[rid], starts[rid]
            if self.verified_reads and rid not in hitting:
                # vLLM has counted this step's tokens, and those of its steps in flight
                start = min(start, req.num_computed_tokens - req.num_in_flight_tokens)
            for group, group_table in enumerate(tables):
                if group in self.state_groups:
                    continue  # `check_states`: a Mamba step reads one state
                table = group_table.get(rid, ())
                bs = self.group_block_size(group)
                for k in range(min(start // bs, len(table))):
                    block = table[k]
                    if block is not None:
                        self._check(rid, req, k, block, schedule_index, rid in hitting, group)

    def apply_copies(self, copies: Iterable[Any]) -> None:
        """The worker's block copies before a forward (vLLM's `KVCacheBlockCopy`: each
        destination block then holds what its source held)."""
        for copy in copies:
            src, dst = int(copy.src_block_id), int(copy.dst_block_id)
            _copy_entry(self.written, src, dst)
            _copy_entry(self.put_order, src, dst)
            _copy_entry(self.written_in, src, dst)
            _copy_entry(self.states, src, dst)
            _copy_entry(self.partial, src, dst)

    def check_states(
        self,
        sched: Any,
        out: Any,
        tables: GroupTables,
        starts: Mapping[str, int],
        hitting: set[str],
        schedule_index: int,
    ) -> None:
        """`kv_written` in a Mamba group: a running request scheduled from token s > 0 finds,
        in the block of token s - 1, its own state after exactly s tokens. A hit ending at
        token s finds there the state after exactly s tokens of a request whose first s tokens
        are the hit's (`cache_hit_written`): a checkpoint at a Mamba block's end, or a partial
        state inside a larger Mamba block."""
        for group in sorted(self.state_groups):
            bs = self.group_block_size(group)
            for rid in out.num_scheduled_tokens:
                start = starts[rid]
                table = tables[group].get(rid, ())
                if start == 0 or (start - 1) // bs >= len(table):
                    continue
                if rid in hitting:
                    self._check_hit_state(sched, rid, start, table, bs, group, schedule_index)
                    continue
                k = (start - 1) // bs
                block = table[k]
                if block is None:
                    continue  # `kv_covers_scheduled` says so
                held = self.states.get(block)
                req = sched.requests[rid]
                if held is not None and held[0] is req and held[1] == start:
                    continue
                raise EngineCoreViolation(
                    "kv_written",
                    f"schedule {schedule_index}: {rid!r}, running, reads its Mamba state after "
                    f"{start} tokens from block {block} (its block {k} in KV cache group "
                    f"{group}), but {_held(held, 'no batch left a state there')}",
                )

    def _check_hit_state(
        self,
        sched: Any,
        rid: str,
        start: int,
        table: tuple[int | None, ...],
        bs: int,
        group: int,
        schedule_index: int,
    ) -> None:
        """A hit of `rid` ending at token `start` reads its Mamba block (start - 1) // bs: that
        block holds the state after exactly `start` tokens of a request sharing them."""
        k = (start - 1) // bs
        block = table[k]
        if block is None:
            return  # `kv_covers_scheduled` says so
        req = sched.requests[rid]
        held = self.states.get(block)
        if held is not None and held[1] == start:
            writer = held[0]
            last = start // self.block_size - 1
            if writer is req or (
                last < min(len(writer.block_hashes), len(req.block_hashes))
                and bytes(writer.block_hashes[last]) == bytes(req.block_hashes[last])
            ):
                return
        where = "inside" if start % bs else "at the end of"
        raise EngineCoreViolation(
            "cache_hit_written",
            f"schedule {schedule_index}: {rid!r} starts from the prefix cache at token {start}, "
            f"{where} its block {k} (block {block} of KV cache group {group}), but "
            f"{_held(held, 'no batch or copy left a state there')}, not the state after its "
            f"first {start} tokens",
        )

    def record(
        self,
        sched: Any,
        out: Any,
        tables: GroupTables,
        valid: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        """Record the blocks `out`'s batch completes, and the attention block it writes
        without completing (`partial`), over every group's block `tables` as they stood when
        it was scheduled: each request's scheduled tokens from its computed
        ones, or the positions `valid` names for it. `after_schedule` calls it; a loop that
        samples a batch later (deferred) calls it again once the batch's accepted drafts are
        known (recording a block again is harmless: no batch ran in between)."""
        starts = batch_starts(out)
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests.get(rid)
            if req is None:  # finished and freed before a deferred batch was sampled
                continue
            start = starts[rid]
            if valid is not None and rid in valid:
                start, n = valid[rid]
            for group, group_table in enumerate(tables):
                table = group_table.get(rid, ())
                if group in self.state_groups:
                    self._record_states(req, start, n, table, group)
                    continue
                bs = self.group_block_size(group)
                end = start + n
                self._check_overwrite(sched, req, start, end, table, group)
                for k in range(start // bs, min(end // bs, len(table))):
                    block = table[k]
                    if block is not None:
                        self.put(block, (req, k), group)
                        self.hashed_for_victims.pop(block, None)
                k = end // bs
                if n and end % bs and k < len(table) and table[k] is not None:
                    self._put_partial(table[k], req, k, end, group)

    def _check_overwrite(
        self,
        sched: Any,
        req: Any,
        start: int,
        end: int,
        table: tuple[int | None, ...],
        group: int,
    ) -> None:
        """`cache_hit_written` at the write: a batch writing `req`'s tokens `start` to `end`
        writes no block that a batch completed with another request's block and the prefix
        cache holds under a key, unless its tokens up to there are that request's (the same
        KV). Such a block is shared content: vLLM hands a hit ending inside it a private copy
        (copy-on-write), and a later hit on its key would read what this write left."""
        bs = self.group_block_size(group)
        for k in range(start // bs, min(-(-end // bs), len(table))):
            block = table[k]
            held = None if block is None else self.content(block, group)
            if block is None or held is None:
                continue
            writer, wk = held
            key = sched.kv_cache_manager.block_pool.blocks[block].block_hash
            written_hash = self.block_hash(held, group)
            # a key of the block's recorded content (vLLM also keys a block for the tokens a
            # step is about to write into it, before the write)
            if writer is req or key is None or written_hash is None:
                continue
            if not bytes(key).startswith(written_hash):
                continue
            reach = min(end, (k + 1) * bs)
            mine, theirs = req.all_token_ids, writer.all_token_ids
            known = min(reach, len(mine), len(theirs))
            if wk == k and list(mine[:known]) == list(theirs[:known]):
                continue
            first = max(start, k * bs)
            raise EngineCoreViolation(
                "cache_hit_written",
                f"{req.request_id!r} writes its tokens {first} to {reach - 1} into block {block} "
                f"(its block {k} in KV cache group {group}), which holds block {wk} of "
                f"{writer.request_id!r} under a prefix-cache key, with other tokens: a later "
                "hit on that key reads them",
            )

    def _record_states(
        self, req: Any, start: int, n: int, table: tuple[int | None, ...], group: int
    ) -> None:
        """A Mamba step of `req` from token `start` over `n` tokens: the state after
        `start + n` tokens in the block of its last token, and an internal prefill checkpoint
        where the worker's rule exports one (`state_checkpoint`)."""
        if not n:
            return
        end = start + n
        written = [((end - 1) // self.group_block_size(group), end)]
        if self.state_checkpoint is not None:
            tokens, column = self.state_checkpoint(group, end, n)
            if tokens:
                written.append((column, tokens))
        for k, tokens in written:
            block = table[k] if 0 <= k < len(table) else None
            if block is None:
                # the worker writes no state into the null block: a checkpoint column vLLM
                # did not reserve, or a state block `kv_covers_scheduled` reports
                continue
            self.forget([block])  # what any earlier write left there is gone
            self.states[block] = (req, tokens)
            self.hashed_for_victims.pop(block, None)

    def _note_hashed_for_victims(self, sched: Any, out: Any, schedule_index: int) -> None:
        victims = [sched.requests[r] for r in out.preempted_req_ids or () if r in sched.requests]
        if not victims:
            return
        own = [(r.request_id, k, bytes(h)) for r in victims for k, h in enumerate(r.block_hashes)]
        for block, key in block_hashes(sched).items():
            if self._hashes_before.get(block) == key:
                continue
            # a prefix-cache key is the block hash followed by the group id
            found = next(((rid, k, h) for rid, k, h in own if key.startswith(h)), None)
            if found is not None:
                rid, index, block_hash = found
                self.hashed_for_victims[block] = (rid, index, schedule_index, block_hash)

    def _victim_reason(self, block: int, req: Any, k: int, group: int) -> str:
        """Why, when the block was hashed for a victim after its last write and the hit found
        it under that very hash; else ""."""
        victim = self.hashed_for_victims.get(block)
        if victim is None:
            return ""
        vid, vk, call, block_hash = victim
        if self.block_hash((req, k), group) != block_hash:
            return ""
        vk = (vk + 1) // (self.group_block_size(group) // self.block_size) - 1  # group's index
        return (
            f" (schedule {call} hashed it as block {vk} of {vid!r}, scheduling its tokens, "
            f"and preempted {vid!r} in the same call: those tokens never ran)"
        )

    def _put_partial(self, block: int, req: Any, k: int, end: int, group: int) -> None:
        """A batch wrote `req`'s tokens up to token `end` into `block`, its block `k` in
        `group`, without completing it: what the block held completed is gone, unless it held
        block `k` of a request with `req`'s tokens up to `end` and its LoRA adapter (a sharer
        recomputing its prefix into a shared block writes back the KV already there)."""
        held = self.content(block, group)
        if held is not None and _same_kv(held, req, k, end):
            return
        self.forget([block])
        self.partial[block] = (req, k, end, group)
        self.hashed_for_victims.pop(block, None)

    def check_partial_hits(
        self,
        sched: Any,
        tables: GroupTables,
        starts: Mapping[str, int],
        hitting: set[str],
        schedule_index: int,
    ) -> None:
        """`cache_hit_written` for each hit ending inside an attention block of its
        (`_check_partial_hit`), before the batch writes the rest of that block."""
        for rid in sorted(hitting):
            start = starts[rid]
            for group, group_table in enumerate(tables):
                bs = self.group_block_size(group)
                if group in self.state_groups or not start % bs:
                    continue
                table, k = group_table.get(rid, ()), start // bs
                block = table[k] if k < len(table) else None
                if block is not None:
                    req = sched.requests[rid]
                    self._check_partial_hit(rid, req, start, block, schedule_index, group)

    def _check_partial_hit(
        self, rid: str, req: Any, start: int, block: int, schedule_index: int, group: int
    ) -> None:
        """A hit of `rid` ending at token `start` inside its attention block k (vLLM's
        fine-grained lookups) reads that block's first tokens: the block holds the first
        `start` tokens of a request sharing them, completed or written partly up to `start`.
        A hit ending inside a hash block is not compared (no block hash names it)."""
        k = start // self.group_block_size(group)
        if start % self.block_size:
            return
        full = self.content(block, group)
        partial = self.partial.get(block)
        if full is not None:
            writer, wk, reaches = full[0], full[1], start
        elif partial is not None and partial[3] == group:
            writer, wk, reaches, _ = partial
        else:
            writer = None
        if writer is not None and wk == k and reaches >= start:
            last = start // self.block_size - 1
            if writer is req or (
                last < min(len(writer.block_hashes), len(req.block_hashes))
                and bytes(writer.block_hashes[last]) == bytes(req.block_hashes[last])
            ):
                return
        other = self.overwritten_by(block, group)
        if other is not None and full is None:
            what = f"KV cache group {other} wrote it last, not group {group}"
        elif writer is None:
            what = "no batch or copy wrote its first tokens there"
        else:
            held = "" if full is not None else f"up to token {reaches} "
            what = f"a batch wrote block {wk} of {writer.request_id!r} {held}there"
        raise EngineCoreViolation(
            "cache_hit_written",
            f"schedule {schedule_index}: {rid!r} starts from the prefix cache at token {start}, "
            f"inside its block {k} (block {block} of KV cache group {group}), but {what}, not "
            f"its first {start} tokens",
        )

    def forget(self, blocks: Iterable[int]) -> None:
        """`blocks` no longer hold what was recorded (a KV load into them failed, or a batch
        computed them over such a block)."""
        for block in blocks:
            self.written.pop(block, None)
            self.put_order.pop(block, None)
            self.written_in.pop(block, None)
            self.states.pop(block, None)
            self.partial.pop(block, None)

    def forget_failed_load(self, loader: Any, failed: int, *, after: int) -> None:
        """A synchronous load of `loader` (vLLM's `Request`) failed in block `failed`: forget
        it, and every block still recorded as written by `loader` at block index `after` or
        beyond (the first block past the load: its batches computed those over the failed
        block). Found by writer, not by block table, so it holds when the loader has ended
        before its failure is reported; a block another request wrote since keeps that write.
        The load's blocks before and after the failed one keep theirs (the store wrote them)."""
        if self.written.get(failed, (loader, 0))[0] is loader:
            self.forget([failed])
        self.forget(b for b, (req, k) in list(self.written.items()) if req is loader and k >= after)

    def forget_lost_load(self, loader: Any, firsts: Mapping[int, int], *, since: int) -> None:
        """A synchronous load of `loader` failed as a whole (a hybrid cache's connector reports
        no single block): forget every block recorded as written by `loader` in group g at its
        block index `firsts[g]` or beyond, the load's own and what the loader's batches
        computed over them (found by writer, as `forget_failed_load` does), among the writes
        recorded since the load's batch was scheduled (`since`: `puts_before_schedule` then).
        What an earlier run of the loader wrote (before a preemption) keeps its write: a
        candidate fix that restarts the loader lets it hit those blocks."""
        self.forget(
            b
            for b, (req, k) in list(self.written.items())
            if req is loader
            and k >= firsts.get(self.written_in.get(b, 0), 0)
            and self.put_order.get(b, 0) >= since
        )

    def _check(
        self,
        rid: str,
        req: Any,
        k: int,
        block: int,
        schedule_index: int,
        hit: bool = True,
        group: int = 0,
    ) -> None:
        writer = self.content(block, group)
        adapters = ""
        if writer is not None:
            wreq, wk = writer
            if wreq is req and wk == k:
                return
            written_hash = self.block_hash(writer, group)
            if written_hash is not None and written_hash == self.block_hash((req, k), group):
                # KV is the model's with the request's LoRA adapter: equal tokens under
                # another adapter are other KV, whatever the block hashes say
                if adapter_of(wreq) == adapter_of(req):
                    return
                adapters = (
                    f" under LoRA adapter {adapter_of(wreq)}, while {rid!r} runs adapter "
                    f"{adapter_of(req)} (0: the base model): the same block hash"
                )
        other = self.overwritten_by(block, group)
        what = (
            f"KV cache group {other} wrote it last, not group {group}"
            if other is not None
            else "no batch wrote it"
            if writer is None
            else f"a batch wrote block {writer[1]} of {writer[0].request_id!r} there{adapters}"
        )
        what += self._victim_reason(block, req, k, group)
        if group and other is None:
            what += f" (in KV cache group {group})"
        if not hit:
            raise EngineCoreViolation(
                "kv_written",
                f"schedule {schedule_index}: {rid!r}, running, reads block {block} as its block "
                f"{k}, but {what.replace('no batch wrote it', 'no batch or load wrote it')}",
            )
        raise EngineCoreViolation(
            "cache_hit_written",
            f"schedule {schedule_index}: {rid!r} starts from the prefix cache with block {block} "
            f"as its block {k}, but {what}",
        )


def _held(held: tuple[Any, int] | None, nothing: str) -> str:
    """What a Mamba block holds, in words (`nothing` where no state was left there)."""
    if held is None:
        return nothing
    return f"it holds the state of {held[0].request_id!r} after {held[1]} tokens"


def _same_kv(held: tuple[Any, int], req: Any, k: int, end: int) -> bool:
    """Whether a write of `req`'s tokens up to token `end` into its block `k` writes the KV
    that `held` (a request and its block index) left there: the same block index, tokens and
    adapter. Tokens not yet known (a step's output still in flight) count as other tokens."""
    writer, wk = held
    if wk != k or adapter_of(writer) != adapter_of(req):
        return False
    mine, theirs = list(req.all_token_ids[:end]), list(writer.all_token_ids[:end])
    return len(mine) == end and mine == theirs


def _copy_entry(record: dict[int, V], src: int, dst: int) -> None:
    """`record`'s entry for block `dst` becomes block `src`'s (none where `src` has none)."""
    if src in record:
        record[dst] = record[src]
    else:
        record.pop(dst, None)


def batch_starts(out: Any) -> dict[str, int]:
    """Each scheduled request's computed tokens before batch `out`."""
    starts = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    starts.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    return starts


__all__ = ["CacheWrites", "batch_starts"]
