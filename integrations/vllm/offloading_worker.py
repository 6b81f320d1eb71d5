"""The worker side of vLLM's own KV offloading connector, fabricated, with the contents of the GPU
blocks and CPU chunks it moves: so that vLLM's real `OffloadingConnector` scheduler side and its
CPU manager (`vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`,
`vllm/v1/kv_offload/cpu/manager.py`) run in the engine-core loop and what they decide is checked
by what the KV ends up holding.

vLLM's worker (`offloading/worker.py`) does, per engine step, in this order; so does
`OffloadingWorker`:

1. `handle_preemptions`: the step's `jobs_to_flush` (store jobs whose source blocks the step
   reallocated, or of a request it preempted) are submitted with the stores deferred from the
   previous step, and waited for, before the forward;
2. `start_kv_transfers`: the rest of the deferred stores are submitted, and the step's loads; a
   synchronous load is waited for (its request runs in this very forward);
3. the forward writes the KV of the step's tokens (the loop records it, `CacheWrites`);
4. `prepare_store_kv`: the step's store jobs are deferred to the start of the next step;
5. `get_finished`: every job done is reported by id (`OffloadingWorkerMetadata`), and a
   request whose asynchronous load is done in `finished_recving`; the report is every worker's,
   aggregated (one per pipeline stage), as the engine core hands it to the scheduler.

A submitted job is done 0 to 2 steps later (a hash of its id and the seed); a flushed or
synchronous one at once. A store reads its source blocks when it is done (a transfer runs
beside the forwards until then: a block written meanwhile is read as written), and a load
writes its destination blocks when it is done. So vLLM's fences are what keeps the KV right:

- `store_content`: when a store reads a source block, the block holds the KV of one of the keys
  the job stores (a block that was freed, reallocated and written before the store read it, and
  not flushed, fails);
- `load_content`: a load reads only chunks a finished store filled, each with the KV of one of
  the keys the job loads;
- and the loop's `kv_written` / `cache_hit_written`: every block a request reads holds its own
  KV, a loaded block's being what the chunk held;
- `progress`: once drained, no job is left unreported.

On a hybrid cache (`LoopOptions(sliding_window=W)`) a job moves every KV cache group's blocks,
group after group (its GPU spec's `group_sizes`), and an offload key names its group: a chunk
holds one group's KV, and the rules above hold group by group (a block read as another group
last wrote it fails `store_content`; a chunk another group's store filled fails `load_content`).

Needs nothing of vLLM but the metadata classes it is handed; the loop builds the reports with
`vllm.v1.outputs.KVConnectorOutput` and the connector's `OffloadingWorkerMetadata`.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from integrations.vllm.cache_writes import CacheWrites
from integrations.vllm.core_loop import EngineCoreViolation

#: A job is done at most this many steps after it is submitted.
MAX_DELAY = 2
#: vLLM's null block (`BlockPool`'s block 0), which a window holds for a block that left it.
NULL_BLOCK = 0


@dataclass
class OffloadingCounts:
    """How often the offloading paths were taken."""

    offload_stores: int = 0  # store jobs vLLM issued
    offload_stored_blocks: int = 0  # GPU blocks those jobs read
    offload_flushes: int = 0  # store jobs vLLM flushed (waited for before a forward)
    offload_loads: int = 0  # load jobs vLLM issued
    offload_sync_loads: int = 0  # of those, synchronous
    offload_loaded_blocks: int = 0  # GPU blocks those jobs wrote
    offload_mid_chunk_loads: int = 0  # of the loads, those starting inside a chunk
    offload_window_stored_blocks: int = 0  # of the blocks stored, a sliding window's
    offload_window_loaded_blocks: int = 0  # of the blocks loaded, a sliding window's
    offload_unstored_loads: int = 0  # of those, blocks of a chunk their store left out


@dataclass
class _Job:
    """A job the worker holds: vLLM's `TransferJob`, whether it loads, and when it is done."""

    job_id: int
    job: Any
    load: bool
    keys: frozenset[tuple[bytes, int]]  # (block hash, KV cache group) of each key it moves
    due: int | None = None  # the step whose `get_finished` reports it (None: not submitted)


@dataclass
class OffloadingWorker:
    """The fabricated worker over `writes` (what each GPU block holds, by the loop's record),
    `connector` (vLLM's `OffloadingConnectorScheduler`, read for a job's keys and its blocks
    per chunk) and `seed` (the jobs' delays). `chunks`: what each CPU chunk holds, the KV
    cache group that stored it and its blocks' contents, as `writes` says a block does.
    `worker_meta` builds the report of the jobs done (job id -> workers; default vLLM's
    `OffloadingWorkerMetadata`) and `key_parts` reads an offload key's block hash and group
    (default vLLM's `get_offload_block_hash` and `get_offload_group_idx`): a test gives
    stand-ins to run the worker without vLLM."""

    writes: CacheWrites
    connector: Any
    seed: int
    outputs: Any  # vllm.v1.outputs
    log: Callable[[str], None] | None = None
    worker_meta: Callable[[dict[int, int]], Any] | None = None
    key_parts: Callable[[Any], tuple[bytes, int]] | None = None
    chunks: dict[int, tuple[int, tuple[tuple[Any, int] | None, ...]]] = field(default_factory=dict)
    counts: OffloadingCounts = field(default_factory=OffloadingCounts)
    _deferred: list[_Job] = field(default_factory=list)
    _in_flight: dict[int, _Job] = field(default_factory=dict)
    _done: list[_Job] = field(default_factory=list)
    _step: int = 0

    def say(self, line: str) -> None:
        """A line for the loop's trace, if it keeps one."""
        if self.log is not None:
            self.log(f"offload: {line}")

    # ------------------------------------------------------------ one step
    def before_forward(self, meta: Any) -> None:
        """Steps 1 and 2 for the batch whose connector metadata is `meta`."""
        self._step += 1
        flush = set(meta.jobs_to_flush or ()) if meta is not None else set()
        for job_id in sorted(flush):
            job = meta.store_jobs.pop(job_id, None) if meta is not None else None
            if job is not None:
                self._deferred.append(self._job(job_id, job, load=False))
        self._submit(self._deferred)
        self._deferred = []
        if flush:
            self.counts.offload_flushes += len(flush)
            self.say(f"flush jobs {sorted(flush)}")
            for job_id in sorted(flush):
                held = self._in_flight.pop(job_id, None)
                if held is not None:
                    self._complete(held)
        if meta is None:
            return
        loads = [self._job(i, j, load=True) for i, j in sorted(meta.load_jobs.items())]
        self._submit(loads)
        for held in loads:
            self.counts.offload_loads += 1
            if held.job.sync:
                self.counts.offload_sync_loads += 1
                self._complete(self._in_flight.pop(held.job_id))

    def after_forward(self, meta: Any) -> Any:
        """Steps 4 and 5: defer the step's stores, finish the jobs due; the step's
        `KVConnectorOutput`."""
        if meta is not None:
            for job_id, job in sorted(meta.store_jobs.items()):
                self._deferred.append(self._job(job_id, job, load=False))
                self.counts.offload_stores += 1
                self.say(
                    f"store job {job_id} of {job.req_id}: blocks "
                    f"{_ids(job.src_spec)} -> chunks {_ids(job.dst_spec)} (from the next step)"
                )
        for job_id, held in sorted(self._in_flight.items()):
            if held.due is not None and held.due <= self._step:
                del self._in_flight[job_id]
                self._complete(held)
        done, self._done = self._done, []
        if not done:
            return None
        # the output the engine gets is every worker's, aggregated (vLLM's KVOutputAggregator):
        # a job counts once per worker (a pipeline stage is a worker of its own)
        workers = int(self.connector.config.num_workers)
        report = (self.worker_meta or _vllm_worker_meta)({h.job_id: workers for h in done})
        recving = {h.job.req_id for h in done if h.load and not h.job.sync}
        return self.outputs.KVConnectorOutput(
            finished_recving=recving or None, kv_connector_worker_meta=report
        )

    def loading(self) -> set[str]:
        """The requests with an asynchronous load job submitted and not yet reported."""
        return {h.job.req_id for h in self._in_flight.values() if h.load and not h.job.sync}

    def check_done(self) -> None:
        """`progress`: once drained, no job is in flight, deferred or unreported."""
        left = sorted(self._in_flight) + [h.job_id for h in self._deferred + self._done]
        if left:
            raise EngineCoreViolation(
                "progress", f"drained with offloading jobs {sorted(left)} never reported done"
            )

    # ------------------------------------------------------------ jobs
    def _submit(self, jobs: Iterable[_Job]) -> None:
        for held in jobs:
            delay = zlib.crc32(f"{self.seed}/{held.job_id}".encode()) % (MAX_DELAY + 1)
            held.due = self._step + delay
            self._in_flight[held.job_id] = held
            kind = "load" if held.load else "store"
            sync = " (synchronous)" if held.load and held.job.sync else ""
            self.say(f"{kind} job {held.job_id} of {held.job.req_id} submitted{sync}")

    def _complete(self, held: _Job) -> None:
        """Do the job's transfer now: a store reads its blocks into its chunks, a load writes
        its chunks into its blocks."""
        if held.load:
            self._load(held)
        else:
            self._store(held)
        self._done.append(held)
        self.say(f"{'load' if held.load else 'store'} job {held.job_id} done")

    def _store(self, held: _Job) -> None:
        """A chunk holds `per` consecutive blocks of one group. Each group's blocks fill its
        chunks in order from the position its `block_indices` entry gives in the first one:
        a full-attention group's chunks are whole; a sliding window's first chunk may start
        past blocks that left the window (the null block, not stored)."""
        per = self._blocks_per_chunk
        src, dst = _ids(held.job.src_spec), _ids(held.job.dst_spec)
        sizes = _group_sizes(held.job.src_spec, len(src))
        offsets = _offsets(held.job.src_spec, sizes, per)
        pairs = zip(offsets, sizes, strict=True)
        spans = [-(-(offset + size) // per) if size else 0 for offset, size in pairs]
        if sum(spans) != len(dst) or (len(sizes) == 1 and len(src) != per * len(dst)):
            raise EngineCoreViolation(
                "store_content",
                f"store job {held.job_id} of {held.job.req_id!r} reads {len(src)} blocks "
                f"(groups of {sizes}) into {len(dst)} chunks of {per} blocks",
            )
        first_block, first_chunk = 0, 0
        for group, (size, offset, span) in enumerate(zip(sizes, offsets, spans, strict=True)):
            keys = frozenset(h for h, g in held.keys if g == group)
            blocks = src[first_block : first_block + size]
            slots: list[list[tuple[Any, int] | None]] = [[None] * per for _ in range(span)]
            # vLLM 0.34.0 copies the (zeroed) null block into a window chunk's slot of a block
            # that left the window, so the blocks after it keep their offsets: a placeholder,
            # which holds nothing (a load of it writes nothing a request may read)
            placeholders = {offset + j for j, block in enumerate(blocks) if block == NULL_BLOCK}
            for j, block in enumerate(blocks):
                if block != NULL_BLOCK:
                    content = self.writes.content(block, group)
                    slots[(offset + j) // per][(offset + j) % per] = content
            for i, chunk in enumerate(dst[first_chunk : first_chunk + span]):
                lo = offset if i == 0 else 0
                hi = min(per, offset + size - i * per)
                contents = slots[i][lo:hi]
                skip = frozenset(k - lo for k in range(lo, hi) if i * per + k in placeholders)
                wrong = _chunk_fault(contents, keys, self._hasher(group), skip)
                if wrong is not None:
                    j, what = wrong
                    block = blocks[i * per + lo + j - offset]
                    other = self.writes.overwritten_by(block, group)
                    if other is not None:
                        what = what.replace(
                            "no batch or load wrote it",
                            f"KV cache group {other} wrote it last, not group {group}",
                        )
                    raise EngineCoreViolation(
                        "store_content",
                        f"store job {held.job_id} of {held.job.req_id!r} reads block "
                        f"{block}{_in(group)} into chunk {chunk}, but {what}",
                    )
                self.chunks[chunk] = (group, tuple(slots[i]))
            first_block += size
            first_chunk += span
        self.counts.offload_stored_blocks += len(src)
        self.counts.offload_window_stored_blocks += sum(sizes[1:])

    def _load(self, held: _Job) -> None:
        """The blocks a load writes are, group by group, the request's blocks from that
        group's `block_indices` entry on; when that is inside a chunk, the group's load starts
        at that block of its first chunk."""
        per = self._blocks_per_chunk
        src, dst = _ids(held.job.src_spec), _ids(held.job.dst_spec)
        spec = held.job.dst_spec
        sizes = _group_sizes(spec, len(dst))
        offsets = _offsets(spec, sizes, per)
        first_block, first_chunk = 0, 0
        for group, (size, offset) in enumerate(zip(sizes, offsets, strict=True)):
            if size == 0:
                continue
            self.counts.offload_mid_chunk_loads += offset > 0
            chunks = src[first_chunk : first_chunk + -(-(offset + size) // per)]
            keys = frozenset(h for h, g in held.keys if g == group)
            for chunk in chunks:
                what = self._chunk_not_loadable(chunk, group, keys)
                if what is not None:
                    raise EngineCoreViolation(
                        "load_content",
                        f"load job {held.job_id} of {held.job.req_id!r} reads chunk "
                        f"{chunk}{_in(group)}, but {what}",
                    )
            for j, block in enumerate(dst[first_block : first_block + size]):
                chunk = chunks[(offset + j) // per]
                content = self.chunks[chunk][1][(offset + j) % per]
                if content is None:
                    # the store left this part of the chunk out (a block that had left the
                    # window): the block gets whatever the chunk held there, which is wrong
                    # only if the request reads it (`kv_written`)
                    self.writes.forget([block])
                    self.counts.offload_unstored_loads += 1
                    continue
                self.writes.put(block, content, group)
            first_block += size
            first_chunk += len(chunks)
        self.counts.offload_loaded_blocks += len(dst)
        self.counts.offload_window_loaded_blocks += sum(sizes[1:])

    def _chunk_not_loadable(self, chunk: int, group: int, keys: frozenset[bytes]) -> str | None:
        """Why a load of `group`'s `keys` may not read `chunk`, or None."""
        held_there = self.chunks.get(chunk)
        if held_there is None:
            return "no finished store filled it"
        stored_by, slots = held_there
        if stored_by != group:
            return f"a store of KV cache group {stored_by} filled it"
        last = next(c for c in reversed(slots) if c is not None)
        if self.writes.block_hash(last, group) in keys:
            return None
        return f"it holds block {last[1]} of {last[0].request_id!r} last, not a key of the job"

    def _hasher(self, group: int) -> Callable[[tuple[Any, int]], bytes | None]:
        """The block hash of a block's content (a request, its block index) in `group`."""
        return lambda content: self.writes.block_hash(content, group)

    @property
    def _blocks_per_chunk(self) -> int:
        return int(self.connector.config.blocks_per_chunk)

    def _job(self, job_id: int, job: Any, *, load: bool) -> _Job:
        """Job `job_id` as the worker holds it, with its keys read now: a cache reset drops
        the connector's record of the jobs in flight, which the worker still runs."""
        return _Job(job_id, job, load, self._key_hashes(job_id))

    def _key_hashes(self, job_id: int) -> frozenset[tuple[bytes, int]]:
        """The (block hash, group) of the keys job `job_id` moves, as the connector recorded
        them."""
        status = self.connector._jobs.get(job_id)
        if status is None:
            raise EngineCoreViolation(
                "implementation_error", f"the connector has no record of job {job_id}"
            )
        key_parts = self.key_parts or _vllm_key_parts
        return frozenset(key_parts(key) for key in status.keys)


def _vllm_worker_meta(completed_jobs: dict[int, int]) -> Any:
    """vLLM's `OffloadingWorkerMetadata` reporting `completed_jobs`."""
    common = importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading.common"
    )
    return common.OffloadingWorkerMetadata(completed_jobs=completed_jobs)


def _vllm_key_parts(key: Any) -> tuple[bytes, int]:
    """The block hash and KV cache group of vLLM offload key `key`."""
    base = importlib.import_module("vllm.v1.kv_offload.base")
    return bytes(base.get_offload_block_hash(key)), int(base.get_offload_group_idx(key))


def _group_sizes(spec: Any, blocks: int) -> list[int]:
    """A GPU spec's blocks per KV cache group (one group when it names none)."""
    sizes = getattr(spec, "group_sizes", None)
    return [blocks] if sizes is None else [int(n) for n in sizes]


def _offsets(spec: Any, sizes: list[int], per: int) -> list[int]:
    """Where each group's first block sits in its first chunk (`block_indices`; 0 for a
    spec without them, or a group that moves no block)."""
    indices = getattr(spec, "block_indices", None)
    if indices is None:
        return [0] * len(sizes)
    return [int(i) % per if n else 0 for i, n in zip(indices, sizes, strict=True)]


def _in(group: int) -> str:
    """Words naming a KV cache group other than the first, for a message."""
    return f" of KV cache group {group}" if group else ""


def _chunk_fault(
    contents: list[tuple[Any, int] | None],
    keys: frozenset[bytes],
    block_hash: Callable[[tuple[Any, int]], bytes | None],
    placeholders: frozenset[int] = frozenset(),
) -> tuple[int, str] | None:
    """Why a chunk read from blocks holding `contents` is not the KV of one of `keys` (the
    position of the first wrong block and what it holds), or None. A key is the block hash of
    its chunk's last block (`block_hash` of its content), and block hashes chain, so the last
    block's content must have one of `keys` as hash and each block before it the hash of the
    same request's block before, except at `placeholders` (the null block, read in place of
    a block that left the window)."""
    last = contents[-1]
    if last is None or block_hash(last) not in keys:
        j = len(contents) - 1
        return j, _what(last, "not the KV of a key it stores")
    request, index = last
    for j, content in enumerate(contents):
        want = index - (len(contents) - 1 - j)
        if j in placeholders:
            continue
        if (
            content is None
            or want < 0
            or block_hash(content) is None
            or block_hash(content) != block_hash((request, want))
        ):
            return j, _what(content, f"not block {want} of {request.request_id!r}, as its key says")
    return None


def _what(content: tuple[Any, int] | None, after: str) -> str:
    if content is None:
        return f"no batch or load wrote it, {after}"
    return f"it holds block {content[1]} of {content[0].request_id!r}, {after}"


def _ids(spec: Any) -> list[int]:
    """A load/store spec's block (GPU) or chunk (CPU) ids."""
    return [int(i) for i in spec.block_ids]


__all__ = ["MAX_DELAY", "OffloadingCounts", "OffloadingWorker"]
