"""A live SGLang 0.5.23 dLLM scheduler writing what it decides as a dLLM event log.

`SglangEventLog(scheduler, write)` attaches to a dLLM `Scheduler` that something else drives
(SGLang's own `event_loop_normal`, a test's loop) and writes, through `write`, one JSON line
per event of `spec.events`: first the header (`spec.trace.config_to_dict`: the SGLang release
and, when it is not SGLang's own, the scheduler's class as the `writer`; the scheduler's
effective configuration and the policy SGLang declares, `SGLANG_DLLM_PROFILE.policy`, with
`priority_order` under priority scheduling and `longest_output_first` under `--schedule-policy
lof`), then what each call decided. `schedspec check-trace LOG` then checks the log under
SGLang's declared policy, and `--twin sglang-dllm-order` (`sglang-dllm-order-priority` under
priority scheduling, `sglang-dllm-order-lof` under lof) compares its admissions and forwards
with that re-implementation's on the log's own operations.

It wraps, on the instances only (nothing of SGLang's classes changes), four methods of the
scheduler and two of its worker (`scheduler.tp_worker` unless `worker=` is given), and derives
the events with `integrations.sglang.observer.SglangObserver`, the derivation the conformance
adapter `real-sglang-dllm` uses:

- `get_next_batch_to_run`: first `Submitted` for each request newly in `waiting_queue` (where
  `handle_generate_request` puts it), then the round's admissions and allocations;
- the model runner's `forward` and the algorithm's `step`: `Forward` and `StepResult`;
- `process_batch_result_dllm`: `BlockCommitted`, the frees, `Finished` and `ControlReturned`;
- `abort_request` and `send_abort_output`: the frees and `Aborted` for each request SGLang
  ended (SGLang aborts every request whose id starts with the one given: the log says so).

A round in which no batch runs is written as its `ControlReturned` only while requests are
live (an idle server writes nothing), and a run of such rounds with nothing in between is
written once (a scheduler that cannot admit would otherwise fill the disk).

Stops: a request's stop token ids other than the id the log names the model's EOS (its own,
the model's other EOS ids, its tokenizer's; `eos_token_of` says which EOS id is named when the
model has several) are written on `Submitted` as `stop_token_ids`, which the spec evaluates
itself; a request with a stop condition the spec cannot evaluate (stop strings, a
stop regex, a grammar) is written with `stop_sampled`. SGLang's `FINISH_MATCHED_STR`,
`FINISHED_MATCHED_REGEX` and a matched token other than the EOS are written as `Finished`
with reason STOP. What a log cannot
describe: a request that SGLang ends inside the round for a reason the spec has no name for
(an abort: `to_finish`, an invalid stop regex) is written as `Aborted` after its frees, where
the spec's aborts happen between rounds (`check-trace` reports `scheduler_phase`).

Priority scheduling (`--enable-priority-scheduling`): SGLang then sorts its waiting queue by
priority before every round, and the header declares `priority_order` on top of SGLang's
policy. The spec's order is lower values first; a scheduler that serves higher values first
(SGLang's default, without `--schedule-low-priority-values-first`) has each request's priority
written negated on `Submitted`, so the order the log describes is the one SGLang follows.

Longest output first (`--schedule-policy lof`): SGLang sorts its waiting queue by
`max_new_tokens`, longest first, before every round (after the priority under priority
scheduling), and the header declares `longest_output_first` (`sglang-dllm-order-lof`, or
`sglang-dllm-order-priority-lof` with both, is then its twin). A cache-aware policy is FCFS
on the dLLM path with the radix cache off, and so is routing-key (it sorts only against a
running batch, which the dLLM path does not pass), priority scheduling included.

Orders of SGLang's own: with the radix cache on, a cache-aware policy (`lpm`, `dfs-weight`,
`hrrn`, `shortest-prefill-first`) sorts the waiting queue by the tree's contents before every
round, and `random` shuffles it with the cache on or off. The header then declares
`free_queue_order`: `check-trace` lets any queued request in and checks everything else as
before (no twin: none re-implements those orders).

Synchronous scheduling only: the overlap scheduler plans a batch while the previous one runs,
which an event log does not describe; attaching to one is a `ConfigError` naming
`enable_overlap` (serve with `--disable-overlap-schedule` to log). With the radix cache on
(SGLang 0.5.23's default for dLLMs, PR #18724) the header declares `prefix_cache` and the log
carries the cache's events (`KvCached`, `CacheHit`, `CacheReleased`, `CacheEvicted`), derived
from the tree's slots by the observer. Each forward and step reads the batch's `input_ids` to
the host once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from integrations.instance_hooks import InstanceHooks
from integrations.log_writer import scheduler_writer
from integrations.sglang.observer import SglangObserver
from integrations.sglang.profile import SGLANG_DLLM_PROFILE
from spec.config import DllmConfig, Mode
from spec.errors import ConfigError
from spec.events import ControlReturned, Event
from spec.profile import DllmPolicy
from spec.trace import config_to_dict, event_to_dict


def eos_token_of(
    model_config: Any, tokenizer: Any = None, *, mask_id: int | None = None
) -> int | None:
    """The id the log names the model's EOS (`DllmConfig.eos_token_id`), None when the model
    has none (`hf_eos_token_id` empty or None, or only `mask_id`).

    A model may list several end-of-sequence ids (Llama 3, and generation configs that add
    their own); SGLang ends a request on any of them alike (`FINISH_MATCHED_TOKEN`). The spec
    names one of them the EOS: the model config's own `eos_token_id` when it is a single id of
    the set, else the tokenizer's, else the smallest. The others end a request as its stop
    token ids (`observer.stop_token_ids` writes them on every `Submitted`), at the same token
    and with the same cut; only the reason differs (STOP rather than EOS), as the observer
    writes it (`FINISH_MATCHED_TOKEN` of a token other than the named EOS).

    The mask id is never named, even when the model lists it among its EOS ids: a step never
    commits it, so it ends nothing, and the spec requires the EOS to differ from the mask."""
    ids = getattr(model_config, "hf_eos_token_id", None)
    if ids is None:
        return None
    found = {int(ids)} if isinstance(ids, int) else {int(i) for i in ids}
    found.discard(-1 if mask_id is None else mask_id)
    if not found:
        return None
    hf_config = getattr(model_config, "hf_config", None)
    for named in (
        getattr(hf_config, "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if isinstance(named, int) and named in found:
            return named
    return min(found)


def radix_cache_on(scheduler: Any) -> bool:
    """Whether `scheduler` keeps committed blocks in its radix cache (SGLang's default for
    dLLMs since its PR #18724; off with `--disable-radix-cache`)."""
    return not bool(getattr(getattr(scheduler, "tree_cache", None), "disable", True))


def dllm_config_of(scheduler: Any) -> DllmConfig:
    """A SGLang dLLM scheduler's effective settings as a `DllmConfig` (a ConfigError when the
    scheduler is not a dLLM one or the spec has no such configuration)."""
    sg = getattr(scheduler, "dllm_config", None)
    if sg is None:
        raise ConfigError(
            "dllm_config", None, "a dLLM scheduler (serve with --dllm-algorithm to log)"
        )
    page = int(scheduler.page_size)
    fdfo = bool(sg.first_done_first_out_mode)
    try:
        return DllmConfig(
            block_size=int(sg.block_size),
            page_size=page,
            kv_pages=int(scheduler.token_to_kv_pool_allocator.size) // page,
            req_pool_rows=int(scheduler.req_to_token_pool.size),
            max_running_requests=int(sg.max_running_requests),
            max_context=int(scheduler.model_config.context_len),
            mode=Mode.FDFO if fdfo else Mode.SYNC,
            prefix_cache=radix_cache_on(scheduler),
            in_place_reuse=fdfo,  # unconditional under FDFO (mem_cache/allocation.py:387)
            reloop=False,  # one forward and one step per FDFO round (dllm/algorithm/base.py)
            mask_token_id=int(sg.mask_id),
            eos_token_id=eos_token_of(
                scheduler.model_config,
                getattr(scheduler, "tokenizer", None),
                mask_id=int(sg.mask_id),
            ),
        )
    except ConfigError as err:
        raise ConfigError(
            "scheduler",
            type(scheduler).__name__,
            f"a configuration the dLLM spec describes ({err})",
        ) from None


#: `--schedule-policy` values whose order the log declares free: by the radix tree's contents
#: (a cache-aware policy, which `SchedulePolicy` keeps only with the tree on) or a shuffle.
FREE_ORDER_POLICIES = ("lpm", "dfs-weight", "hrrn", "shortest-prefill-first", "random")


def schedule_policy_of(scheduler: Any) -> str:
    """The order `scheduler`'s `SchedulePolicy` gives its waiting queue on the dLLM path:
    "fcfs" (a cache-aware policy is FCFS too with the radix cache off:
    `_validate_and_adjust_policy`), "lof", "routing-key" (which sorts nothing there:
    `get_new_batch_dllm` passes `calc_priority` no running batch), or one of
    `FREE_ORDER_POLICIES` (the tree's contents, or a shuffle). Anything else is a
    `ConfigError` naming the policies that can be logged."""
    policy = getattr(getattr(scheduler, "policy", None), "policy", None)
    value = str(getattr(policy, "value", "fcfs"))
    if value not in ("fcfs", "lof", "routing-key", *FREE_ORDER_POLICIES):
        raise ConfigError(
            "schedule_policy",
            value,
            f"one of fcfs, lof, routing-key, {', '.join(FREE_ORDER_POLICIES)} (SGLang "
            "0.5.23's policies on the dLLM path)",
        )
    return value


def free_queue_order(scheduler: Any) -> bool:
    """Whether `scheduler` orders its waiting queue in a way of its own that the log declares
    free (`DllmPolicy.free_queue_order`): its policy is one of `FREE_ORDER_POLICIES`."""
    return schedule_policy_of(scheduler) in FREE_ORDER_POLICIES


def longest_output_first(scheduler: Any) -> bool:
    """Whether `scheduler` orders its waiting queue by the longest output first: its
    `SchedulePolicy`'s policy is `CacheAgnosticPolicy.LOF` (`--schedule-policy lof`)."""
    return schedule_policy_of(scheduler) == "lof"


def schedules_by_priority(scheduler: Any) -> bool:
    """Whether `calc_priority` sorts `scheduler`'s waiting queue by priority: priority
    scheduling is on and its policy is FCFS or LOF (the two that read the priority:
    `_sort_by_priority_and_fcfs`, `_sort_by_longest_output`)."""
    return bool(getattr(scheduler, "enable_priority_scheduling", False)) and (
        schedule_policy_of(scheduler) in ("fcfs", "lof")
    )


def declared_policy(scheduler: Any) -> DllmPolicy:
    """The policy a log of `scheduler` declares: SGLang's (`SGLANG_DLLM_PROFILE.policy`), with
    `priority_order` when it sorts by priority (`schedules_by_priority`) and
    `longest_output_first` under `--schedule-policy lof`, and `free_queue_order` under an
    order of SGLang's own (`free_queue_order`). A `ConfigError` for a policy no log describes
    (`schedule_policy_of`)."""
    return dataclasses.replace(
        SGLANG_DLLM_PROFILE.policy,
        priority_order=schedules_by_priority(scheduler),
        longest_output_first=longest_output_first(scheduler),
        free_queue_order=free_queue_order(scheduler),
    )


def priority_sign(scheduler: Any) -> int:
    """1 when `scheduler` serves lower priority values first (the spec's order) or ignores
    priorities; -1 when it schedules by priority, higher values first (then the log negates
    them)."""
    if not schedules_by_priority(scheduler):
        return 1
    return 1 if bool(getattr(scheduler, "schedule_low_priority_values_first", False)) else -1


class SglangEventLog:
    """Writes the decisions of one live SGLang dLLM scheduler as an event log (see the module)."""

    def __init__(
        self, scheduler: Any, write: Callable[[str], object], *, worker: Any = None
    ) -> None:
        if bool(getattr(scheduler, "enable_overlap", False)):
            raise ConfigError(
                "enable_overlap",
                True,
                "False: the overlap scheduler plans a batch while the previous one runs, which "
                "an event log does not describe (serve with --disable-overlap-schedule to log)",
            )
        self.scheduler = scheduler
        self.config: DllmConfig = dllm_config_of(scheduler)
        self.policy: DllmPolicy = declared_policy(scheduler)
        self._write = write
        self._idle_written = False  # the last line is a round in which nothing ran
        self._ended: list[Any] = []  # requests SGLang reported aborted during the current call
        self.writer: str = scheduler_writer(scheduler, "sglang")
        write(json.dumps(config_to_dict(self.config, self.policy, self.writer)))
        self.observer: SglangObserver = SglangObserver(
            self.config,
            self._emit,
            scheduler,
            lambda req: str(req.rid),
            strict=False,
            keep_outputs=False,
            priority_sign=priority_sign(scheduler),
        )
        self._hooks = InstanceHooks()
        self.observer.attach_worker(scheduler.tp_worker if worker is None else worker, self._hooks)
        # name -> the scheduler's own method, which the wrapper calls
        self._calls = self._hooks.replace_methods(
            scheduler,
            {
                "get_next_batch_to_run": self._get_next_batch_to_run,
                "process_batch_result_dllm": self._process_batch_result_dllm,
                "abort_request": self._abort_request,
                "send_abort_output": self._send_abort_output,
            },
        )

    def detach(self) -> None:
        """Give the scheduler and its worker their own methods back (the log then ends)."""
        self._hooks.restore()

    # ------------------------------------------------------------------ the wrapped calls
    def _get_next_batch_to_run(self, *args: Any, **kwargs: Any) -> Any:
        self._note_new_requests()
        self.observer.begin_round()
        plan = self._calls["get_next_batch_to_run"](*args, **kwargs)
        self._flush_aborts()
        batch = plan.batch_to_run
        self.observer.planned(batch)
        if batch is None and self.observer.live and not self._idle_written:
            self.observer.end_round()
            self._idle_written = True
        return plan

    def _process_batch_result_dllm(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._calls["process_batch_result_dllm"](batch, *args, **kwargs)
        self.observer.completed(batch)
        self._flush_aborts()
        self.observer.end_round()
        return result

    def _abort_request(self, *args: Any, **kwargs: Any) -> Any:
        self._note_new_requests()
        result = self._calls["abort_request"](*args, **kwargs)
        self._flush_aborts()
        return result

    def _send_abort_output(self, abort_req: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._calls["send_abort_output"](abort_req, req, *args, **kwargs)
        self._ended.append(req)
        return result

    # ------------------------------------------------------------------ helpers
    def _note_new_requests(self) -> None:
        """`Submitted` for each request in the waiting queue the log has not seen."""
        for req in list(self.scheduler.waiting_queue):
            if str(req.rid) not in self.observer.live:
                self.observer.submitted(req)

    def _flush_aborts(self) -> None:
        ended, self._ended = self._ended, []
        if ended:
            self.observer.aborted(ended)

    def _emit(self, event: Event) -> None:
        if not isinstance(event, ControlReturned):
            self._idle_written = False
        self._write(json.dumps(event_to_dict(event), separators=(",", ":")))


__all__ = [
    "SglangEventLog",
    "declared_policy",
    "dllm_config_of",
    "eos_token_of",
    "free_queue_order",
    "longest_output_first",
    "priority_sign",
    "schedule_policy_of",
    "schedules_by_priority",
]
