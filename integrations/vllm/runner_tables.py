"""The model runner's block tables, rebuilt from the scheduler's outputs alone (`runner_tables`).

vLLM's workers never read the scheduler's KV cache manager: a model runner keeps each request's
block table from what every `SchedulerOutput` says (`GPUModelRunner._update_states`,
`vllm/v1/worker/gpu_model_runner.py`):

- a request in `finished_req_ids` is dropped;
- a request in `scheduled_new_reqs` gets its `block_ids` (the whole table);
- a request in `scheduled_cached_reqs` that is resumed (`resumed_req_ids`) gets its
  `new_block_ids` as the whole table (vLLM asserts they are given); any other gets them
  appended, group by group, if given;
- a request that is not scheduled keeps what it had (preempted, skipped, or waiting for its
  remote KV), until it is scheduled again.

KV connectors read the same outputs for the same reason: vLLM's offloading connector learns
from them which blocks a step reallocated, and flushes the stores still reading them.

`RunnerTables` is that runner's view; `integrations.vllm.core_loop.BatchQueueLoop` applies every
output to it and, after every `schedule()`, checks the rule `runner_tables` with it: for every
request the call scheduled, the runner's table is the scheduler's
(`kv_cache_manager.coordinator.single_type_managers[g].req_to_blocks`), group by group, the
same length and the same block at every position where the scheduler's is not the null block
(a sliding-window group replaces blocks that left its window with the null block in the
scheduler only, and neither side reads them again). If it did not hold, the step would write or
read KV in blocks its request does not hold. And no request the runner holds has left vLLM
unreported: each is still vLLM's, or its end is in the scheduler's `finished_req_ids` for the
next output (`orphans`, checked after every `schedule()` and once drained); else the runner
would keep its state, and its blocks' ids, for ever.
"""

from __future__ import annotations

from typing import Any

from integrations.vllm.release_api import resumed_req_ids

#: A request's block ids, one list per KV cache group.
Table = list[list[int]]


def _copy(groups: Any) -> Table:
    return [list(ids) for ids in groups]


class RunnerTables:
    """The block tables a model runner builds from the scheduler outputs it is handed, in
    order (`apply`), and how they differ from the scheduler's own (`mismatch`)."""

    def __init__(self) -> None:
        #: Request id -> its table as the runner holds it.
        self.tables: dict[str, Table] = {}

    def apply(self, out: Any) -> str | None:
        """Update the tables from scheduler output `out` as the model runner does; what is
        wrong if the output names a resumed request without its table, or appends blocks to a
        request the runner was never given (the runner would fail), else None."""
        for rid in out.finished_req_ids:
            self.tables.pop(rid, None)
        for new in out.scheduled_new_reqs:
            self.tables[new.req_id] = _copy(new.block_ids)
        cached = out.scheduled_cached_reqs
        resumed = resumed_req_ids(out)
        for rid, new_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            if rid in resumed:
                if new_ids is None:
                    return f"{rid!r} is resumed without its block table"
                self.tables[rid] = _copy(new_ids)
                continue
            if new_ids is None:
                continue
            table = self.tables.get(rid)
            if table is None:
                return (
                    f"{rid!r} is scheduled as a running request with new blocks "
                    f"{_copy(new_ids)}, but the runner was never given its table"
                )
            for ids, more in zip(table, new_ids, strict=True):
                ids.extend(more)
        return None

    def orphans(self, sched: Any) -> str | None:
        """The requests the runner holds that scheduler `sched` neither has nor reports
        finished in its next output, or None."""
        gone = sorted(set(self.tables) - set(sched.requests) - set(sched.finished_req_ids))
        if not gone:
            return None
        return (
            f"the model runner still holds {gone}, which vLLM freed without reporting them finished"
        )

    def mismatch(self, sched: Any, out: Any) -> str | None:
        """How the runner's table of a request `out` schedules differs from the one the
        scheduler `sched` holds (the null block's positions aside), or None."""
        managers = sched.kv_cache_manager.coordinator.single_type_managers
        for rid in out.num_scheduled_tokens:
            runner = self.tables.get(rid)
            if runner is None:
                return f"{rid!r} is scheduled, but no output gave the runner its block table"
            held = [list(m.req_to_blocks.get(rid, ())) for m in managers]
            for group, (ids, blocks) in enumerate(zip(runner, held, strict=True)):
                wrong = len(ids) != len(blocks) or any(
                    not b.is_null and b.block_id != i for i, b in zip(ids, blocks, strict=True)
                )
                if wrong:
                    mine = [None if b.is_null else b.block_id for b in blocks]
                    return (
                        f"{rid!r} is scheduled with blocks {mine} in group {group}, but its "
                        f"outputs gave the runner {ids}"
                    )
        return None


__all__ = ["RunnerTables"]
