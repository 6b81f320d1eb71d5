"""The dLLM adapter for SGLang 0.5.23: the spec's `SchedulerAdapter` over SGLang's real path.

Each call drives SGLang's own code (see `integrations.sglang.engine` for what runs for real and
what is stubbed); `integrations.sglang.observer.SglangObserver` turns what happened into the
spec's events (the same derivation the live event log uses, `integrations.sglang.event_log`).

Where SGLang's contract differs from the spec's, the adapter makes the spec's hold and says so:
- SGLang aborts every request whose id *starts with* the given id (`abort_request`,
  managers/scheduler.py:5688; `DllmManager.pop_aborted_reqs`): aborting `r1` would abort `r10`.
  The adapter gives SGLang ids that are never prefixes of each other
  (`<len>:<spec id>|`).
- SGLang ignores an abort of an unknown id; the spec requires `UnknownRequest`. The adapter
  checks its own table of live requests first.
- SGLang finishes a request whose output holds any negative token id
  (`Req._check_vocab_boundary_finish`). The spec's prompts are >= 0 and the scripted step only
  writes tokens in 0..16, so this never fires. Were it to, its `FINISH_MATCHED_STR` is written
  as a stop, which the spec refuses for a request without a sampled stop (`finish_condition`);
  an abort inside the round is reported as an implementation error (`UnnamedFinish`).

Each SGLang `Req` carries its `RequestSpec.priority` (SGLang's `Req.priority`). SGLang reads it
only under priority scheduling: `make_sglang_dllm_priority` (`real-sglang-dllm-priority`)
builds the engine with `--enable-priority-scheduling` and lower values first, the spec's
convention (`integrations.sglang.engine`, "Priority scheduling"). `make_sglang_dllm_lof`
(`real-sglang-dllm-lof`) builds it with `--schedule-policy lof`, which orders the waiting queue
by the `Req`'s `max_new_tokens`, longest first, and `make_sglang_dllm_priority_lof`
(`real-sglang-dllm-priority-lof`) with both. `make_sglang_dllm_lpm` (`real-sglang-dllm-lpm`)
builds it with `--schedule-policy lpm`, which with the radix cache on orders the queue by what
the tree holds: an order the profile declares free (`DllmPolicy.free_queue_order`).

A configuration with `prefix_cache` builds SGLang with its block-level radix cache on (its
default for dLLMs, SGLang PR #18724); the observer then reads the tree's slots and the log
says what is cached, read, released and evicted (`spec.events.KvCached` and the others).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from integrations.instance_hooks import InstanceHooks
from integrations.sglang.engine import (
    Engine,
    attributes_built,
    build,
    new_request,
    queue_request,
    run_worker,
)
from integrations.sglang.observer import SglangObserver
from integrations.sglang.transcript import (
    batch_line,
    construction_line,
    described,
    request_line,
    result_line,
)
from spec.adapter import EventSink
from spec.config import DllmConfig, RequestSpec, validate_request
from spec.errors import DuplicateRequest, SchedulerStalled, UnknownRequest
from spec.snapshot import FinishedOutput, Snapshot


def engine_request_id(request_id: str) -> str:
    """SGLang's id for a spec request id: never a prefix of another such id (SGLang aborts by
    prefix), because the length comes first and `|` ends it."""
    return f"{len(request_id)}:{request_id}|"


def spec_request_id(engine_rid: str) -> str:
    """The spec request id of an SGLang id `engine_request_id` made (any other id as it is)."""
    head, sep, rest = engine_rid.partition(":")
    return rest[: int(head)] if sep and head.isdigit() else engine_rid


class SglangDllmAdapter:
    """Implements `spec.adapter.SchedulerAdapter` (and `ReportsOutputs`) over SGLang 0.5.23;
    with `priority`, SGLang schedules by priority (lower values first); with `lof`, under
    `--schedule-policy lof` (the longest output first); with `schedule_policy`, under that
    `--schedule-policy` (`engine.SCHEDULE_POLICIES`)."""

    def __init__(
        self,
        config: DllmConfig,
        sink: EventSink,
        *,
        priority: bool = False,
        lof: bool = False,
        schedule_policy: str | None = None,
    ) -> None:
        self._config = config
        self._spec_id: dict[int, str] = {}
        self.engine: Engine = build(
            config,
            self._spec_id,
            priority=priority,
            lof=lof,
            radix_cache=config.prefix_cache,
            schedule_policy=schedule_policy,
        )
        self.observer: SglangObserver = SglangObserver(
            config, sink, self.engine.scheduler, lambda req: self._spec_id[id(req)]
        )
        self.observer.attach_worker(self.engine.worker, InstanceHooks())
        self.seen: set[str] = set()
        #: The calls made on SGLang's scheduler, one line each, in SGLang's terms
        #: (`native_calls`): what a failing example is printed with after its spec calls.
        self.transcript: list[str] = [construction_line(config)]

    @property
    def config(self) -> DllmConfig:
        """The `DllmConfig` the SGLang engine was assembled for (`build`)."""
        return self._config

    @property
    def live(self) -> dict[str, Any]:
        """Spec id -> SGLang Req, submitted and not yet terminal."""
        return self.observer.live

    # ------------------------------------------------------------------ API
    def submit(self, request: RequestSpec) -> None:
        """`validate_request`, then `DuplicateRequest` for an id submitted before (both before any
        change); else build SGLang's `Req` under `engine_request_id`, with the request's
        priority, and queue it (`queue_request`: as `handle_generate_request` does); the
        observer emits `Submitted`."""
        validate_request(self.config, request)
        rid = request.request_id
        if rid in self.seen:
            raise DuplicateRequest(rid)
        req = new_request(
            self.engine,
            engine_request_id(rid),
            request.prompt,
            request.max_new_tokens,
            ignore_eos=request.ignore_eos,
            stop_token_ids=tuple(request.stop_token_ids),
            priority=request.priority,
        )
        self.seen.add(rid)
        self._spec_id[id(req)] = rid
        with attributes_built():
            queue_request(self.engine, req)
        self.transcript.append(described(request_line, req, request.prompt, request.max_new_tokens))
        self.observer.submitted(req)

    def abort(self, request_id: str) -> None:
        """`UnknownRequest` for an id not live (SGLang would ignore it); else SGLang's
        `abort_request` with its engine id, and the observer emits the frees read from SGLang's
        pools, then `Aborted`."""
        req = self.live.get(request_id)
        if req is None:  # SGLang would ignore it silently; the spec requires a typed refusal
            raise UnknownRequest(request_id, len(self.live))
        m = self._modules()
        self.transcript.append(
            f"scheduler.abort_request(AbortReq(rid={engine_request_id(request_id)!r}))"
        )
        with attributes_built():
            self.engine.scheduler.abort_request(m["AbortReq"](rid=engine_request_id(request_id)))
        self.observer.aborted([req])

    def run_round(self) -> None:
        """One round as SGLang's event loop runs it: `get_next_batch_to_run`, then for a batch the
        worker (`run_worker`) and `process_batch_result_dllm`, then `last_batch`. The observer
        emits the pool, `Forward`, `StepResult`, commit and finish events and ends with
        `ControlReturned`."""
        s = self.engine.scheduler
        self.observer.begin_round()
        with attributes_built():
            plan = s.get_next_batch_to_run(s.running_batch, s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        self.transcript.append(described(batch_line, batch))
        self.observer.planned(batch)
        if batch is not None:
            with attributes_built():
                result = run_worker(self.engine, batch)
                s.process_batch_result_dllm(batch, result)
            self.transcript.append(described(result_line, batch))
            self.observer.completed(batch)
        s.last_batch = batch
        self.observer.end_round()

    def native_calls(self) -> str:
        """The calls this adapter made on SGLang's scheduler so far, one per line, in SGLang's
        terms (`integrations.sglang.transcript`): the optional adapter method a failing
        example's report prints after its spec calls."""
        return "\n".join(self.transcript)

    def drain(self, max_rounds: int = 100_000) -> None:
        """Run rounds while a request is `live`; `SchedulerStalled` after `max_rounds` rounds with
        some still live."""
        for _ in range(max_rounds):
            if not self.live:
                return
            self.run_round()
        if self.live:
            raise SchedulerStalled(max_rounds, f"{len(self.live)} requests still live")

    def snapshot(self) -> Snapshot:
        """SGLang's pools in the spec's ids, read by the observer (`SglangObserver.snapshot`)."""
        return self.observer.snapshot()

    def collect_outputs(self) -> Mapping[str, FinishedOutput]:
        """The outputs of the requests finished since the previous call, each once, as the
        observer took them from SGLang's `Req`s (`SglangObserver.collect_outputs`)."""
        return self.observer.collect_outputs()

    @staticmethod
    def _modules() -> dict[str, Any]:
        from integrations.sglang.engine import import_engine

        return import_engine()


def make_sglang_dllm(config: DllmConfig, sink: EventSink) -> SglangDllmAdapter:
    """Factory: SGLang 0.5.23's real dLLM scheduler path for `config` (imports SGLang lazily)."""
    return SglangDllmAdapter(config, sink)


def make_sglang_dllm_priority(config: DllmConfig, sink: EventSink) -> SglangDllmAdapter:
    """Factory: the same path under priority scheduling (`--enable-priority-scheduling
    --schedule-low-priority-values-first`; priority preemption off)."""
    return SglangDllmAdapter(config, sink, priority=True)


def make_sglang_dllm_lof(config: DllmConfig, sink: EventSink) -> SglangDllmAdapter:
    """Factory: the same path under `--schedule-policy lof` (the waiting queue by
    `max_new_tokens`, longest first)."""
    return SglangDllmAdapter(config, sink, lof=True)


def make_sglang_dllm_priority_lof(config: DllmConfig, sink: EventSink) -> SglangDllmAdapter:
    """Factory: both, `--schedule-policy lof --enable-priority-scheduling
    --schedule-low-priority-values-first` (the waiting queue by priority, then by
    `max_new_tokens`, longest first)."""
    return SglangDllmAdapter(config, sink, priority=True, lof=True)


def make_sglang_dllm_lpm(config: DllmConfig, sink: EventSink) -> SglangDllmAdapter:
    """Factory: the same path under `--schedule-policy lpm` (with the radix cache on, the
    waiting queue by the longest cached prefix first, requests sharing a short prefix with one
    ahead of them pushed back; FCFS with it off)."""
    return SglangDllmAdapter(config, sink, schedule_policy="lpm")


__all__ = [
    "SglangDllmAdapter",
    "engine_request_id",
    "make_sglang_dllm",
    "make_sglang_dllm_lof",
    "make_sglang_dllm_lpm",
    "make_sglang_dllm_priority",
    "make_sglang_dllm_priority_lof",
    "spec_request_id",
]
