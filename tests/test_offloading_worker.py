"""The fabricated worker of vLLM's offloading connector (`integrations.vllm.offloading_worker`),
without vLLM: it is the oracle the engine-core loop's offloading checks rest on, so its order
of events is pinned here step by step, with stand-ins for the connector and its metadata.

What it must do, as vLLM's worker does: a store is deferred to the next step and read when it
is done; a flushed store is done before the forward of the step that flushes it; a synchronous
load writes its blocks before the forward and is not in `finished_recving`, an asynchronous one
is; every job done is reported once, counted once per worker; and what it reads or writes is
checked (`store_content`, `load_content`, `progress`). On a hybrid cache a job moves each KV
cache group's blocks into chunks of that group, a sliding window's first chunk possibly in part,
and a block read as another group wrote it fails.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from integrations.vllm.cache_writes import CacheWrites
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.offloading_worker import MAX_DELAY, OffloadingWorker

_OUTPUTS = SimpleNamespace(KVConnectorOutput=lambda **fields: SimpleNamespace(**fields))


class _Req:
    """A request as the worker reads it: its id and its blocks' hashes."""

    def __init__(self, rid: str, hashes: list[bytes]) -> None:
        self.request_id = rid
        self.block_hashes = hashes


A = _Req("a", [b"a0", b"a1"])
B = _Req("b", [b"b0"])


def _spec(ids: list[int], first: int = 0) -> Any:
    return SimpleNamespace(block_ids=ids, block_indices=[first])


def _job(rid: str, src: list[int], dst: list[int], *, sync: bool = False) -> Any:
    return SimpleNamespace(req_id=rid, src_spec=_spec(src), dst_spec=_spec(dst), sync=sync)


def _meta(
    store: dict[int, Any] | None = None,
    load: dict[int, Any] | None = None,
    flush: set[int] | None = None,
) -> Any:
    return SimpleNamespace(store_jobs=store or {}, load_jobs=load or {}, jobs_to_flush=flush)


class _Harness:
    """A worker over stand-ins: a connector recording each job's keys (by block hash), two
    workers (pipeline stages), chunks of one block, and a seed whose delays `delay` finds."""

    def __init__(self, seed: int = 0) -> None:
        self.connector = SimpleNamespace(
            config=SimpleNamespace(num_workers=2, blocks_per_chunk=1), _jobs={}
        )
        self.writes = CacheWrites(block_size=4)
        self.worker = OffloadingWorker(
            self.writes,
            self.connector,
            seed,
            _OUTPUTS,
            worker_meta=lambda done: SimpleNamespace(completed_jobs=done),
            key_parts=lambda key: (key, 0),
        )
        self.reports: list[dict[int, int]] = []
        self.recving: list[set[str]] = []

    def job(self, job_id: int, *keys: bytes) -> None:
        self.connector._jobs[job_id] = SimpleNamespace(keys=set(keys))

    def step(self, meta: Any = None, *, forward: dict[int, tuple[Any, int]] | None = None) -> None:
        """One engine step: before the forward, the forward's writes, after it."""
        self.worker.before_forward(meta)
        self.writes.written.update(forward or {})
        out = self.worker.after_forward(meta)
        self.reports.append(dict(out.kv_connector_worker_meta.completed_jobs) if out else {})
        self.recving.append(set(out.finished_recving or ()) if out else set())

    def reported(self, job_id: int) -> list[int]:
        """The steps (0-based) whose report names `job_id`."""
        return [i for i, report in enumerate(self.reports) if job_id in report]


def _seed_with_delay(job_id: int, delay: int) -> int:
    """A seed under which job `job_id` is done `delay` steps after it is submitted."""
    import zlib

    return next(
        s for s in range(1000) if zlib.crc32(f"{s}/{job_id}".encode()) % (MAX_DELAY + 1) == delay
    )


def test_a_store_is_deferred_a_step_read_when_done_and_reported_once_per_worker() -> None:
    """Issued in step 0, submitted in step 1, done `delay` steps later: reported once, counted
    twice (two workers), and its chunk holds what the block held when it was done."""
    for delay in range(MAX_DELAY + 1):
        h = _Harness(_seed_with_delay(7, delay))
        h.writes.written[3] = (A, 1)
        h.job(7, b"a1")
        h.step(_meta(store={7: _job("a", [3], [0])}))
        for _ in range(MAX_DELAY + 1):
            h.step()
        assert h.reported(7) == [1 + delay], (delay, h.reports)
        assert h.reports[1 + delay][7] == 2
        assert h.worker.chunks[0] == (0, ((A, 1),))
        h.worker.check_done()


def test_a_flushed_store_is_done_before_the_forward_that_overwrites_its_block() -> None:
    """Block 3 is freed, given to b and written by the forward of step 1. Flushed in step 1,
    the store reads a's KV before that forward; not flushed and done after it, it reads b's,
    and `store_content` says so."""
    late = _seed_with_delay(7, 0)  # done in step 1's report, after its forward
    for flushed in (True, False):
        h = _Harness(late)
        h.writes.written[3] = (A, 1)
        h.job(7, b"a1")
        h.step(_meta(store={7: _job("a", [3], [0])}))
        flush = {7} if flushed else None
        if flushed:
            h.step(_meta(flush=flush), forward={3: (B, 0)})
            assert h.worker.chunks[0] == (0, ((A, 1),)) and h.reported(7) == [1]
            continue
        with pytest.raises(EngineCoreViolation) as err:
            h.step(_meta(flush=flush), forward={3: (B, 0)})
        assert err.value.rule == "store_content"
        assert "reads block 3 into chunk 0, but it holds block 0 of 'b'" in err.value.detail


def test_loads_write_their_blocks_and_only_asynchronous_ones_are_received() -> None:
    """A synchronous load writes its block before the step's forward and is reported done
    without `finished_recving`; an asynchronous one is reported in `finished_recving` when done.
    A loaded block holds the chunk's KV."""
    h = _Harness(_seed_with_delay(2, 0))
    h.writes.written[3] = (A, 0)
    h.job(1, b"a0")
    h.step(_meta(store={1: _job("a", [3], [5])}))
    for _ in range(MAX_DELAY + 1):
        h.step()
    h.job(2, b"a0")
    seen: list[Any] = []
    h.worker.before_forward(_meta(load={2: _job("c", [5], [9], sync=True)}))
    seen.append(h.writes.written.get(9))
    h.worker.after_forward(None)
    assert seen == [(A, 0)]
    h.job(3, b"a0")
    h.step(_meta(load={3: _job("d", [5], [11])}))
    for _ in range(MAX_DELAY + 1):
        h.step()
    assert h.writes.written[11] == (A, 0)
    assert {"d"} in h.recving and not any("c" in r for r in h.recving)
    h.worker.check_done()


def test_a_load_of_a_chunk_no_store_filled_or_of_another_key_is_caught() -> None:
    h = _Harness()
    h.job(1, b"a0")
    with pytest.raises(EngineCoreViolation) as err:
        h.step(_meta(load={1: _job("a", [4], [9], sync=True)}))
    assert err.value.rule == "load_content" and "no finished store filled it" in err.value.detail
    h = _Harness(_seed_with_delay(1, 0))
    h.writes.written[3] = (B, 0)
    h.job(1, b"b0")
    h.step(_meta(store={1: _job("b", [3], [4])}))
    h.step()
    h.job(2, b"a0")
    with pytest.raises(EngineCoreViolation) as err:
        h.step(_meta(load={2: _job("a", [4], [9], sync=True)}))
    assert err.value.rule == "load_content" and "not a key of the job" in err.value.detail


def test_a_job_left_in_flight_fails_progress() -> None:
    h = _Harness(_seed_with_delay(7, MAX_DELAY))
    h.writes.written[3] = (A, 1)
    h.job(7, b"a1")
    h.step(_meta(store={7: _job("a", [3], [0])}))
    with pytest.raises(EngineCoreViolation) as err:
        h.worker.check_done()
    assert err.value.rule == "progress" and "[7]" in err.value.detail


# ---------------------------------------------------------------- a hybrid cache's two groups
C = _Req("c", [b"c0", b"c1", b"c2"])


def _groups(ids: list[int], sizes: list[int], firsts: list[int]) -> Any:
    """A GPU spec moving `sizes[g]` blocks of group g, its first at block index `firsts[g]`."""
    return SimpleNamespace(block_ids=ids, group_sizes=sizes, block_indices=firsts)


def _hybrid_harness() -> _Harness:
    """Chunks of 3 blocks; keys are (block hash, group) pairs, read as they are."""
    h = _Harness(_seed_with_delay(1, 0))
    h.connector.config.blocks_per_chunk = 3
    h.worker.key_parts = lambda key: key
    for block, k in ((1, 0), (2, 1), (3, 2)):
        h.writes.put(block, (C, k))  # full attention: tokens 0-2
    for block, k in ((6, 1), (7, 2)):
        h.writes.put(block, (C, k), 1)  # the window: token 0 left it
    return h


def _store_both_groups(h: _Harness) -> None:
    h.connector._jobs[1] = SimpleNamespace(keys={(b"c2", 0), (b"c2", 1)})
    store = SimpleNamespace(
        req_id="c",
        src_spec=_groups([1, 2, 3, 6, 7], [3, 2], [0, 1]),
        dst_spec=_spec([0, 1]),
        sync=False,
    )
    h.step(_meta(store={1: store}))
    h.step()


def test_a_store_moves_each_groups_blocks_into_its_own_chunks() -> None:
    """Group 0's three blocks fill chunk 0; the window's two, starting at block index 1, fill
    chunk 1 from its second block on: the first is left out, and the worker knows it."""
    h = _hybrid_harness()
    _store_both_groups(h)
    assert h.reported(1) == [1]
    assert h.worker.chunks[0] == (0, ((C, 0), (C, 1), (C, 2)))
    assert h.worker.chunks[1] == (1, (None, (C, 1), (C, 2)))
    assert h.worker.counts.offload_window_stored_blocks == 2


def test_a_store_reading_a_block_another_group_wrote_last_is_caught() -> None:
    h = _hybrid_harness()
    h.writes.put(7, (C, 2))  # the full-attention group took block 7 and wrote it
    with pytest.raises(EngineCoreViolation) as err:
        _store_both_groups(h)
    assert err.value.rule == "store_content"
    assert "block 7 of KV cache group 1" in err.value.detail, err.value
    assert "KV cache group 0 wrote it last, not group 1" in err.value.detail, err.value


def test_a_load_of_a_part_its_store_left_out_writes_nothing_valid() -> None:
    """A load of the window's chunk from block index 0 writes blocks 10-12: block 10 from the
    part the store left out holds nothing valid (a read of it fails `kv_written`), blocks 11
    and 12 the window's KV of tokens 1 and 2, as group 1 wrote it."""
    h = _hybrid_harness()
    _store_both_groups(h)
    h.connector._jobs[2] = SimpleNamespace(keys={(b"c2", 1)})
    load = SimpleNamespace(
        req_id="d", src_spec=_spec([1]), dst_spec=_groups([10, 11, 12], [0, 3], [0, 0]), sync=True
    )
    h.step(_meta(load={2: load}))
    assert h.writes.content(10, 1) is None and h.worker.counts.offload_unstored_loads == 1
    assert [h.writes.content(b, 1) for b in (11, 12)] == [(C, 1), (C, 2)]
    assert h.writes.content(11) is None  # not the full-attention group's KV


def test_a_load_of_a_chunk_another_group_stored_is_caught() -> None:
    h = _hybrid_harness()
    _store_both_groups(h)
    h.connector._jobs[2] = SimpleNamespace(keys={(b"c2", 1)})
    load = SimpleNamespace(
        req_id="d", src_spec=_spec([0]), dst_spec=_groups([10, 11, 12], [0, 3], [0, 0]), sync=True
    )
    with pytest.raises(EngineCoreViolation) as err:
        h.step(_meta(load={2: load}))
    assert err.value.rule == "load_content"
    assert "a store of KV cache group 0 filled it" in err.value.detail, err.value
