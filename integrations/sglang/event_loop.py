"""SGLang 0.5.23's own scheduler loop (`Scheduler.event_loop_normal`) on the assembled engine.

`serve(engine, ingest)` runs SGLang's real `event_loop_normal` on an engine from
`integrations.sglang.engine.build`: each iteration calls `ingest_requests`, the real
`get_next_batch_to_run`, `run_batch`, the real `process_batch_result` (which dispatches to
`process_batch_result_dllm`) and sets `last_batch`, as a server does. It is how the live event
log (`integrations.sglang.event_log`) is tested under the loop that calls it on a server.

What the loop gets in place of a server's plumbing (instance attributes of this one scheduler;
none decides anything):
- `ingest_requests` is `ingest(engine)`: where a server receives from the tokenizer's socket,
  the callable queues requests (`engine.scheduler.waiting_queue.append`, as
  `handle_generate_request` does) or aborts them (`engine.scheduler.abort_request`, as
  `process_input_requests` does); it returns False once there is nothing more to serve, and
  the loop exits (`gracefully_exit`) when no request is live either;
- `run_batch` calls the worker's real dLLM hook through `run_worker` (a server's `run_batch`
  builds a `ForwardBatch` with a model runner and times the forward);
- observability: no load snapshot writer, publisher or inquirer, no forward-pass metrics, no
  step-time counters (`_record_step_counters`), no health-check replies, no idle self-check
  (`on_idle`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from integrations.sglang.engine import Engine, NoOp, run_worker


def serve(engine: Engine, ingest: Callable[[Engine], bool], *, max_iterations: int) -> int:
    """Run SGLang's `event_loop_normal` on `engine` until `ingest` has returned False and no
    request is waiting or running; returns the iterations run. More than `max_iterations` is a
    RuntimeError naming what is still live (a stalled scheduler must not hang a test)."""
    s = engine.scheduler
    more = True
    iterations = 0

    def ingest_requests() -> None:
        nonlocal more, iterations
        iterations += 1
        if more:
            more = ingest(engine)
        if not more and not _live(s):
            s.gracefully_exit = True
        elif iterations > max_iterations:
            raise RuntimeError(
                f"SGLang's loop still has {len(_live(s))} requests after {max_iterations} "
                f"iterations"
            )

    s.gracefully_exit = False
    s._engine_paused = False
    s.ingest_requests = ingest_requests
    s.run_batch = lambda batch: run_worker(engine, batch)
    s.on_idle = lambda: None
    s.load_snapshot_writer = None
    s.load_publisher = NoOp("load_publisher")
    s.load_inquirer = NoOp("load_inquirer")
    s.enable_fpm = False
    s._record_step_counters = lambda batch, result: None
    s.return_health_check_ipcs = []
    s.event_loop_normal()
    return iterations


def _live(s: Any) -> list[Any]:
    """Requests the scheduler still holds: queued, staged or holding a request-pool row."""
    manager = s.dllm_manager
    held = [r for r in s.running_batch.reqs if r.kv.req_pool_idx is not None]
    return [*s.waiting_queue, *manager.waiting_queue, *manager.staging_queue, *held]


__all__ = ["serve"]
