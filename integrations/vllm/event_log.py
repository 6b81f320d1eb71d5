"""A live vLLM 0.33.0 v1 `Scheduler` writing what it decides as an AR event log.

`VllmEventLog(scheduler, write)` attaches to a scheduler that something else drives (vLLM's own
`EngineCore`, a test's loop) and writes, through `write`, one JSON line per event of
`spec.ar.events`: first the header (`spec.ar.trace.ar_config_to_dict`: the vLLM release and,
when it is not vLLM's own, the scheduler's class as the `writer`; the scheduler's effective
configuration and the policy vLLM declares, `REAL_VLLM_PROFILE` with the ordering rules of
`vllm_rules`), then what each call decided. `schedspec check-trace LOG` then checks the log
under vLLM's declared policy, and `--twin vllm-v1` compares its decisions with the
re-implementation's on the log's own operations.

It wraps seven methods of that one scheduler instance (nothing of vLLM's classes changes), and
derives the events from the pools around each call, as `RealVllmScheduler` does
(`spec.ar.reconstruct`):

- `add_request`: `ArSubmitted`, with `stop_sampled` (a live scheduler cannot know when the
  model will sample a stop token; the request's prompt ids when prefix caching is on), then,
  for a structured-output request (status `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`: vLLM
  passes over it until its waiting pass finds the grammar compiled), `ArAwaiting` "grammar";
- `schedule`: first `ArReady` for each awaiting request whose grammar has compiled since
  (between steps: it may be admitted from now on), then the scheduling phase (preemptions,
  allocations and cache hits, scheduled tokens, with their `drafts` under speculative
  decoding) and `ArStepEnd`; `ArReady` with `in_step` for each request the waiting pass
  promoted (its status no longer the grammar's, its grammar compiled), at the pass's start:
  before the first event of a request that waited, else before `ArStepEnd`;
- `update_from_output`: `ArDraftsVerified` for each request whose drafts the step verified
  (before any free: vLLM rolls back the rejected drafts in its loop over the batch), with
  prefix caching `ArOutputTokens` with the ids of each request's new outputs (vLLM's block
  hashes cover them, so a conversation's next turn hits the blocks holding them), the
  blocks it freed, and `ArFinished` with vLLM's reason;
- `finish_requests`: the blocks it freed and `ArAborted` for each request it ended (vLLM passes
  `FINISHED_ABORTED` both for a client's abort and for a stop string its front end found);
- `reset_prefix_cache`: with `reset_running_requests` (a pause for a weight update clears the
  caches so), `ArPreempted` with `reset` for every running request it preempted, then
  `ArCacheReset` where the cache was emptied;
- `set_pause_state` (`pause_scheduler`, `resume_scheduler`): `ArPauseSet` with the new state;
- `update_draft_token_ids` (speculative decoding, after each step): `ArDraftsProposed` with
  the drafts vLLM kept for each running request's next step (a twin replays them).

Each call's events are derived only from queues that can be read as a state of the spec's
(`integrations.vllm.adapter.check_queues`): where a scheduler of one's own left a request on
`running` twice, more entries there than `max_num_seqs`, or a request on a queue that vLLM's
`requests` map no longer holds, the wrapped call raises the `SpecViolation` that names the rule
(`seat_cap`, `snapshot_matches`) and vLLM's queues, and the log gets no line for it, rather than
events vLLM never decided.

In a server's process it reads the server's own vLLM (`load_vllm`: no engine install needed, a
release other than 0.33.0 and 0.34.0 refused).

Synchronous scheduling only: an asynchronous scheduler (vLLM's default on CUDA) schedules a
step ahead of the model, which an AR event log does not describe; attaching to one is a
`ConfigError` naming `async_scheduling` (serve with `--no-async-scheduling` to log).
So is a streaming-input session's request (`resumable`, refused before vLLM sees it), and
attaching to a scheduler whose KV cache is not one full-attention group (a sliding
window or Mamba group frees and recycles blocks of running requests, which one block table
cannot show), one with a KV connector (it loads KV into waiting requests and frees finished
ones' blocks late), or one with a multi-module MTP drafter (it shortens prefill chunks near the
prefill end): `loggable` says which. Drafts by ngram, EAGLE or a draft model are logged; the
header declares the KV slots the last two reserve past the step's tokens
(`num_lookahead_tokens`, which the blocks must cover up to `max_model_len`) and a draft
model's input row per request (`num_drafting_slots`, charged against the token budget).
With EAGLE and prefix caching it declares vLLM's lookahead block hashes
(`ArPolicy.hash_lookahead_tokens`). Refused there: another method, parallel drafting, a token
budget set apart from the input budget, and an EAGLE drafter whose hits drop their last block
beside 0.34.0's cache-aware window.

A request vLLM ends inside `update_from_output` (a grammar that failed to compile, an encoder
cache mismatch: vLLM calls `finish_requests` from there with `FINISHED_ERROR`) is logged once,
as `ArAborted` after its blocks: the nested call's frees are the nested call's, and its
request's error output is not also a finish.

vLLM's admission settings are read from the live scheduler: a `watermark` is declared in the
header as vLLM keeps it (`watermark_of_pool`, `watermark_beside_running`);
`scheduler_reserve_full_isl=False` drops `full_sequence_admission`;
`long_prefill_token_threshold_adaptive` is declared as `adaptive_long_prefill_threshold`; the
prefill cadence vLLM applies as `prefill_interval` (the rule `prefill_cadence`);
`max_num_active_seqs` is the seat cap (`max_num_seqs` of the header); and vLLM 0.34.0's
cache-aware admission, where the scheduler applies it (FCFS with prefix caching), as
`cache_aware_window` and `cache_aware_threshold`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from integrations.instance_hooks import InstanceHooks
from integrations.log_writer import scheduler_writer
from integrations.vllm import REAL_VLLM_PROFILE
from integrations.vllm.adapter import (
    adapter_of,
    appended_outputs,
    finish_reason_of,
    load_vllm,
    pool_view,
    victim_order,
    vllm_rules,
)
from integrations.vllm.core_loop import waiting_for_grammar
from integrations.vllm.release_api import cache_read_limit
from spec.ar.config import ArConfig, Policy
from spec.ar.events import (
    ArAborted,
    ArAwaiting,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheHit,
    ArCacheReset,
    ArDraftsProposed,
    ArDraftsVerified,
    ArEvent,
    ArFinished,
    ArInputFailed,
    ArOutputTokens,
    ArPauseSet,
    ArPreempted,
    ArReady,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.profile import ArPolicy
from spec.ar.reconstruct import ArPoolView, release_events, scheduling_events
from spec.ar.trace import ar_config_to_dict, ar_event_to_dict
from spec.errors import ConfigError

#: The speculative methods whose schedules the log describes: those the engine-core loop drives
#: (`integrations.vllm.adapter.SPECULATIVE_METHODS`), and EAGLE-3, not driven here, which takes
#: the scheduler's EAGLE paths (`use_eagle()`) with the same lookahead and no drafting rows.
LOGGED_SPECULATIVE_METHODS = ("ngram", "eagle", "eagle3", "draft_model")


def drafting_slots(scheduler: Any) -> int:
    """The input rows vLLM's drafter adds per scheduled request (its speculative config's
    `max_num_new_slots_for_drafting`: 1 for a draft model, 0 for ngram and EAGLE), charged
    against `max_num_batched_tokens` beside the scheduled tokens; 0 without drafts."""
    spec = scheduler.vllm_config.speculative_config
    return 0 if spec is None else int(spec.max_num_new_slots_for_drafting)


#: The settings the header writes out at any value (`ar_config_to_dict`'s `stated`): vLLM's
#: whole-sequence reservation (`scheduler_reserve_full_isl`), on by default in vLLM and off
#: in the idealised spec, so that a header leaving it out would not say which vLLM ran.
STATED_SETTINGS = ("full_sequence_admission",)


def token_budget_of(scheduler: Any) -> int:
    """The one token budget of a step a vLLM scheduler without a drafter's input rows keeps:
    it spends each scheduled token from both `max_num_scheduled_tokens` (the tokens it may
    issue) and `max_num_batched_tokens` (the input rows), so the smaller binds. Nothing in
    vLLM keeps the first at most the second without a drafter. (With a drafter's rows the two
    differ in kind, and `loggable` refuses two budgets.)"""
    issued = int(scheduler.max_num_scheduled_tokens)
    if drafting_slots(scheduler):
        return issued
    return min(issued, int(scheduler.scheduler_config.max_num_batched_tokens))


def ar_config_of(scheduler: Any) -> ArConfig:
    """A vLLM scheduler's effective settings as an `ArConfig` (ConfigError when the AR spec
    has no such configuration)."""
    sc = scheduler.scheduler_config
    try:
        return ArConfig(
            block_size=int(scheduler.cache_config.block_size),
            num_blocks=int(scheduler.kv_cache_config.num_blocks),
            reserve_null_block=True,  # vLLM's block 0 is its null block
            max_num_batched_tokens=token_budget_of(scheduler),
            # admission into RUNNING stops at max_num_active_reqs (the runner's slots are
            # max_num_running_reqs, at least as many)
            max_num_seqs=int(scheduler.max_num_active_reqs),
            max_model_len=int(scheduler.max_model_len),
            long_prefill_token_threshold=int(sc.long_prefill_token_threshold),
            enable_chunked_prefill=bool(sc.enable_chunked_prefill),
            policy=Policy(str(sc.policy)),
            enable_prefix_caching=bool(scheduler.cache_config.enable_prefix_caching),
            num_speculative_tokens=int(getattr(scheduler, "num_spec_tokens", 0) or 0),
            num_lookahead_tokens=int(getattr(scheduler, "num_lookahead_tokens", 0) or 0),
            num_drafting_slots=drafting_slots(scheduler),
            max_loras=max_loras_of(scheduler),
        )
    except (ConfigError, ValueError) as err:
        issued = int(scheduler.max_num_scheduled_tokens)
        rows = int(sc.max_num_batched_tokens)
        budgets = (
            f"; the budget is the smaller of vLLM's max_num_scheduled_tokens={issued} and "
            f"max_num_batched_tokens={rows}"
            if issued != rows and not drafting_slots(scheduler)
            else ""
        )
        raise ConfigError(
            "scheduler",
            type(scheduler).__name__,
            f"a configuration the AR spec describes ({err}{budgets})",
        ) from None


def max_loras_of(scheduler: Any) -> int:
    """The LoRA adapters a vLLM scheduler's running requests may use at once (`max_loras`; 0
    without LoRA)."""
    lora_config = getattr(scheduler, "lora_config", None)
    return int(lora_config.max_loras) if lora_config is not None else 0


def declared_policy(config: ArConfig, scheduler: Any = None) -> ArPolicy:
    """What vLLM 0.33 declares for `config`: its profile's options with its ordering rules;
    given the live scheduler, its watermark (as vLLM keeps it: of the whole pool, beside a
    running request), its adaptive long-prefill threshold, its prefill cadence, off, its
    whole-sequence reservation and (vLLM 0.34.0) its cache-aware admission window."""
    policy = dataclasses.replace(REAL_VLLM_PROFILE.policy, rules=vllm_rules(config))
    if scheduler is None:
        return policy
    scheduler_config = scheduler.scheduler_config
    watermark = float(scheduler_config.watermark)
    if watermark:
        policy = dataclasses.replace(
            policy,
            watermark_fraction=watermark,
            watermark_of_pool=True,
            watermark_beside_running=True,
        )
    if bool(scheduler_config.long_prefill_token_threshold_adaptive):
        policy = dataclasses.replace(policy, adaptive_long_prefill_threshold=True)
    # the cadence vLLM applies (1 on a rank a data-parallel engine core coordinates)
    interval = int(scheduler.local_prefill_interval)
    if interval > 1:
        policy = dataclasses.replace(policy, prefill_interval=interval)
    if not bool(scheduler_config.scheduler_reserve_full_isl):
        policy = dataclasses.replace(policy, full_sequence_admission=False)
    # an EAGLE drafter with prefix caching: block hashes cover the token after each block
    ahead = int(getattr(scheduler, "num_hash_lookahead_tokens", 0) or 0)
    if ahead and config.enable_prefix_caching:
        policy = dataclasses.replace(policy, hash_lookahead_tokens=ahead)
    # vLLM 0.34.0: the window the scheduler applies (0 unless FCFS with prefix caching)
    window = int(getattr(scheduler, "cache_aware_window", 0))
    if window:
        policy = dataclasses.replace(
            policy,
            cache_aware_window=window,
            cache_aware_threshold=float(scheduler.cache_aware_threshold),
        )
    return policy


def loggable(scheduler: Any, v: Any) -> None:
    """`ConfigError` naming what makes a live scheduler's decisions something an AR event log
    cannot describe: asynchronous scheduling, more than one batch in flight (pipeline stages),
    a KV cache other than one full-attention group, a KV connector, a multi-module MTP
    drafter (prefill lookahead past one token), a drafter `_loggable_drafter` refuses, or
    other than one sampled token per step (`v`: `load_vllm()`'s modules). LoRA adapters are
    logged beside a prefill cadence too. Speculative decoding by ngram, EAGLE or a draft
    model is logged, the header declaring the drafts (`num_speculative_tokens`), the lookahead slots
    EAGLE and a draft model reserve past the step's tokens (`num_lookahead_tokens`) and a draft
    model's input row per request (`num_drafting_slots`)."""
    if bool(scheduler.scheduler_config.async_scheduling):
        raise ConfigError(
            "async_scheduling",
            True,
            "False: an asynchronous scheduler runs a step ahead of the model, which an AR "
            "event log does not describe (serve with --no-async-scheduling to log)",
        )
    in_flight = int(scheduler.vllm_config.max_concurrent_batches)
    if in_flight > 1:  # synchronous pipeline stages: the engine core's batch queue
        raise ConfigError(
            "max_concurrent_batches",
            in_flight,
            "1: with pipeline stages (pipeline_parallel_size > 1) the engine core schedules "
            "the next step before the last one's output is applied, which an AR event log "
            "does not describe",
        )
    groups = list(scheduler.kv_cache_config.kv_cache_groups)
    kinds = [type(g.kv_cache_spec).__name__ for g in groups]
    if len(groups) != 1 or not isinstance(groups[0].kv_cache_spec, v.kv_iface.FullAttentionSpec):
        raise ConfigError(
            "kv_cache_groups",
            kinds,
            "one full-attention group: a sliding-window or Mamba group frees and recycles a "
            "running request's blocks, which the AR event log's one block table cannot show",
        )
    if scheduler.connector is not None:
        raise ConfigError(
            "kv_connector",
            type(scheduler.connector).__name__,
            "None: a connector loads KV into waiting requests and frees finished requests' "
            "blocks after their finish, which the AR event log does not describe",
        )
    # EAGLE's and a draft model's lookahead slots are blocks past the step's tokens, within
    # max_model_len, which the header declares (`num_lookahead_tokens`): the spec bounds a
    # step's allocation by them from below and above.
    # A multi-module MTP drafter also shortens prefill chunks near the prefill end and passes
    # over a request it cannot so schedule; no adapter drives one, so none is vouched for.
    prefill_lookahead = int(getattr(scheduler, "num_prefill_lookahead", 0) or 0)
    if prefill_lookahead > 1:
        raise ConfigError(
            "num_prefill_lookahead",
            prefill_lookahead,
            "0 or 1 (ngram, EAGLE, a draft model): a multi-module MTP drafter ends no prefill "
            "chunk within its lookahead of the prefill end and passes over a request it "
            "cannot so schedule, which no AR event log here has been checked to describe",
        )
    spec = scheduler.vllm_config.speculative_config
    if spec is not None:
        _loggable_drafter(scheduler, spec)
    sampled = int(getattr(scheduler, "num_sampled_tokens_per_step", 1))
    if sampled != 1:
        raise ConfigError(
            "num_sampled_tokens_per_step",
            sampled,
            "1: the AR events count one sampled token per step and request, then the drafts "
            "accepted",
        )


def _loggable_drafter(scheduler: Any, spec: Any) -> None:
    """`ConfigError` for a drafter whose schedules no log here has been checked against: a
    method not driven (`LOGGED_SPECULATIVE_METHODS`), parallel drafting (P-EAGLE, PARD), a
    drafting-row budget the header cannot state, or an EAGLE drafter whose hits drop their
    last block beside vLLM 0.34.0's cache-aware window."""
    method = str(spec.method)
    if method not in LOGGED_SPECULATIVE_METHODS:
        raise ConfigError(
            "speculative_method",
            method,
            f"one of {', '.join(LOGGED_SPECULATIVE_METHODS)}: the log has not been checked "
            "against another drafter's schedules (DFlash and DSpark reserve k + 1 lookahead "
            "slots and may lower the seat cap, MTP shortens prefill chunks)",
        )
    if getattr(spec, "parallel_drafting", False):
        raise ConfigError(
            "parallel_drafting",
            True,
            "False: a parallel drafter (P-EAGLE, PARD) adds k - 1 or k input rows per request, "
            "which no log here has been checked with",
        )
    token_budget = int(scheduler.max_num_scheduled_tokens)
    input_budget = int(scheduler.scheduler_config.max_num_batched_tokens)
    if drafting_slots(scheduler) and token_budget != input_budget:
        raise ConfigError(
            "max_num_scheduled_tokens",
            token_budget,
            f"max_num_batched_tokens={input_budget} (unset): with a drafter's input rows vLLM "
            "keeps two budgets, and the log's header states one",
        )
    window = int(getattr(scheduler, "cache_aware_window", 0))
    if window and bool(getattr(scheduler, "use_eagle_block_drop", False)):
        raise ConfigError(
            "cache_aware_admission_window",
            window,
            "0 beside an EAGLE drafter whose hits drop their last block "
            "(disable_lookahead_block_hashes): vLLM then ranks a waiting request's hit a "
            "block short, which the spec's cache-aware order does not model",
        )


#: The request fields that put a vLLM request's block hashes apart from the same tokens' (its
#: extra hash keys, or hashes of embeddings), with the value each must have under
#: `longest_cache_hit`. Not `lora_request`: the log names each request's adapter, and the AR
#: spec keys cached blocks by it as vLLM does.
HASHED_APART = {
    "cache_salt": "None",
    "mm_features": "empty",
    "prompt_embeds": "None",
}


def hashed_apart(request: Any) -> dict[str, object]:
    """The fields of `HASHED_APART` that vLLM request `request` sets (a tensor of embeddings is
    set whatever it holds; a list of features or a salt, when not empty: vLLM keys no empty
    salt)."""
    found: dict[str, object] = {}
    for name in HASHED_APART:
        value = getattr(request, name, None)
        if value is not None and not (isinstance(value, list | tuple | str) and not value):
            found[name] = value
    return found


def grammar_compiled(request: Any) -> bool:
    """Whether vLLM request `request`'s structured-output grammar has compiled (read without
    resolving vLLM's future: the log only observes)."""
    grammar = _grammar_of(request)
    if isinstance(grammar, Future):
        return grammar.done() and grammar.exception() is None
    return grammar is not None and not isinstance(grammar, BaseException)


def grammar_failed(request: Any) -> bool:
    """Whether vLLM request `request`'s structured-output grammar failed to compile (read as
    `grammar_compiled` reads it)."""
    grammar = _grammar_of(request)
    if isinstance(grammar, Future):
        return grammar.done() and grammar.exception() is not None
    return isinstance(grammar, BaseException)


def _grammar_of(request: Any) -> Any:
    sor = request.structured_output_request
    return getattr(sor, "_grammar", None) if sor is not None else None


class VllmEventLog:
    """Writes the decisions of one live vLLM scheduler as an AR event log (see the module)."""

    def __init__(
        self,
        scheduler: Any,
        write: Callable[[str], object],
        *,
        longest_cache_hit: bool = False,
    ) -> None:
        self._v = load_vllm()
        loggable(scheduler, self._v)
        self.scheduler = scheduler
        self.config: ArConfig = ar_config_of(scheduler)
        self.policy: ArPolicy = declared_policy(self.config, scheduler)
        if longest_cache_hit and bool(getattr(scheduler, "use_eagle_block_drop", False)):
            raise ConfigError(
                "longest_cache_hit",
                True,
                "False beside an EAGLE drafter whose hits drop their last block "
                "(disable_lookahead_block_hashes): vLLM then takes a block less than the "
                "longest cached prefix, by design",
            )
        if longest_cache_hit and self.config.enable_prefix_caching:
            # every hit must be vLLM's longest: requests whose hashes carry more than their
            # tokens are refused (`_add_request`)
            self.policy = dataclasses.replace(self.policy, longest_cache_hit=True)
        self._write = write
        self._prefix = self.config.enable_prefix_caching
        self._step = 0
        # the views a wrapped call's frees are read from, one per call under way (vLLM's
        # update_from_output calls finish_requests), and the requests a nested call ended
        self._open: list[ArPoolView] = []
        self._ended_inside: set[str] = set()
        # while update_from_output runs: each request the step scheduled -> (the request, its
        # outputs before the call, whether it had drafts), logged once by `_log_outputs`
        self._sampling: dict[str, tuple[Any, int, bool]] = {}
        # requests logged as awaiting their grammar (`ArAwaiting`), until ready or ended
        self._awaiting: set[str] = set()
        # ... and those not promoted yet (vLLM's blocked status): awaiting, or with their grammar
        # compiled (`ArReady` between steps) and not yet reached by a waiting pass
        self._unpromoted: set[str] = set()
        self._hooks = InstanceHooks()
        self.writer: str = scheduler_writer(scheduler, "vllm")
        # written out even off: a vLLM that reserves no whole sequence says so, and a twin
        # that reserves one by default (`vllm-v1`) is rebuilt without it
        header = ar_config_to_dict(self.config, self.policy, self.writer, STATED_SETTINGS)
        write(json.dumps(header))
        # name -> the scheduler's own method, which the wrapper calls
        self._calls = self._hooks.replace_methods(
            scheduler,
            {
                "add_request": self._add_request,
                "schedule": self._schedule,
                "update_from_output": self._update_from_output,
                "finish_requests": self._finish_requests,
                "reset_prefix_cache": self._reset_prefix_cache,
                "set_pause_state": self._set_pause_state,
                "update_draft_token_ids": self._update_draft_token_ids,
            },
        )
        paused = self._pause_name(scheduler.pause_state)
        if paused != "unpaused":  # attached to a scheduler paused already
            self._emit(ArPauseSet(paused))

    def detach(self) -> None:
        """Give the scheduler its own methods back (the log then ends)."""
        self._hooks.restore()

    # ------------------------------------------------------------------ the wrapped calls
    def _add_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if bool(getattr(request, "resumable", False)):  # refused before vLLM sees it
            raise ConfigError(
                "resumable",
                True,
                "False while an AR event log is attached: a streaming-input session keeps its "
                "KV between turns and re-adds its request id each turn, which the AR events do "
                "not describe (detach the log to serve sessions)",
            )
        apart = hashed_apart(request) if self.policy.longest_cache_hit else {}
        for name, value in apart.items():  # the first refuses it
            raise ConfigError(
                name,
                value,
                f"{HASHED_APART[name]} while the log declares longest_cache_hit: vLLM hashes "
                "such a request's blocks apart from the same tokens', which the AR events do "
                "not describe (attach the log without longest_cache_hit to log it)",
            )
        result = self._calls["add_request"](request, *args, **kwargs)
        prompt = tuple(int(t) for t in request.prompt_token_ids or ())
        self._emit(
            ArSubmitted(
                request.request_id,
                len(prompt),
                int(request.max_tokens),
                None,
                int(request.priority),
                prompt=prompt if self._prefix else None,
                stop_sampled=True,
                cache_read_limit=cache_read_limit(request) if self._prefix else None,
                lora=adapter_of(request) or None,
            )
        )
        if waiting_for_grammar(request):
            self._awaiting.add(str(request.request_id))
            self._unpromoted.add(str(request.request_id))
            self._emit(ArAwaiting(request.request_id, "grammar"))
        return result

    def _schedule(self, *args: Any, **kwargs: Any) -> Any:
        sched = self.scheduler
        before = self._view(f"before schedule() in step {self._step}")
        self._log_grammars_settled()
        out = self._calls["schedule"](*args, **kwargs)
        scheduled = {str(rid): int(n) for rid, n in out.num_scheduled_tokens.items()}
        after = self._view(f"after schedule() in step {self._step}", scheduled)
        order = victim_order(sched, before, self.config.policy)
        drafts = {str(rid): len(ids) for rid, ids in out.scheduled_spec_decode_tokens.items()}
        promoted = self._promoted_by_the_pass()
        # the promotions are logged at the pass's start, before the first event of a request
        # that waited (vLLM admits past a request only after promoting or skipping it)
        queued = [rid for rid in before.waiting if rid in promoted]
        ready = [ArReady(rid, in_step=True) for rid in queued + sorted(promoted - set(queued))]
        waited = set(before.waiting)
        for e in scheduling_events(
            before, after, scheduled, self.config.block_size, preempted_order=order
        ):
            if isinstance(e, ArScheduled) and drafts.get(e.request_id):
                e = ArScheduled(e.request_id, e.num_tokens, drafts[e.request_id])
            if (
                ready
                and isinstance(e, ArCacheHit | ArBlocksAllocated | ArScheduled)
                and e.request_id in waited
            ):
                for r in ready:
                    self._emit(r)
                ready = []
            self._emit(e)
        for r in ready:  # the pass admitted nothing
            self._emit(r)
        self._emit(ArStepEnd(self._step))
        self._step += 1
        return out

    def _log_grammars_settled(self) -> None:
        """Before a `schedule()` call, between steps: `ArReady` for each awaiting request whose
        grammar has compiled since (it may be admitted from now on: vLLM's pass must not pass
        over it; still unpromoted), `ArInputFailed` for one whose grammar failed (vLLM's pass
        that reaches it ends it with an error)."""
        for rid in sorted(self._awaiting):
            request = self.scheduler.requests.get(rid)
            if request is not None and grammar_compiled(request):
                self._awaiting.discard(rid)
                self._emit(ArReady(rid))
            elif request is not None and grammar_failed(request):
                self._awaiting.discard(rid)
                self._emit(ArInputFailed(rid))

    def _promoted_by_the_pass(self) -> set[str]:
        """After a `schedule()` call: the unpromoted requests its waiting pass promoted (vLLM
        promotes only there), their grammars compiled. One promoted while its grammar is not
        stays awaiting in the log, and its admission fails `awaiting`; one whose grammar
        compiled during the pass is ready with its promotion."""
        promoted = {
            rid
            for rid in self._unpromoted
            if (request := self.scheduler.requests.get(rid)) is not None
            and not waiting_for_grammar(request)
            and grammar_compiled(request)
        }
        self._unpromoted -= promoted
        self._awaiting -= promoted
        return promoted

    def _update_from_output(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        self._ended_inside.clear()
        drafted = scheduler_output.scheduled_spec_decode_tokens
        self._sampling = {
            str(rid): (request, len(request.output_token_ids), bool(drafted.get(rid)))
            for rid in scheduler_output.num_scheduled_tokens
            if (request := self.scheduler.requests.get(rid)) is not None
        }
        try:
            outputs = self._releasing("update_from_output", scheduler_output, *args, **kwargs)
        finally:
            self._sampling = {}
        ended, self._ended_inside = self._ended_inside, set()
        for per_client in outputs.values():
            for o in per_client.outputs:
                if o.finish_reason is not None and o.request_id not in ended:
                    reason = finish_reason_of(self._v, o.finish_reason)
                    self._emit(ArFinished(o.request_id, reason))
        return outputs

    def _finish_requests(self, *args: Any, **kwargs: Any) -> Any:
        nested = bool(self._open)
        ended = self._releasing("finish_requests", *args, **kwargs)
        for request in ended or ():
            self._awaiting.discard(str(request.request_id))
            self._unpromoted.discard(str(request.request_id))
            self._emit(ArAborted(request.request_id))
            if nested:  # ended by vLLM inside update_from_output (FINISHED_ERROR)
                self._ended_inside.add(str(request.request_id))
        return ended

    @staticmethod
    def _pause_name(state: Any) -> str:
        """vLLM's `PauseState` as the spec's pause state (`AR_PAUSE_STATES`)."""
        return str(state.name).lower()

    def _update_draft_token_ids(self, draft_token_ids: Any, *args: Any, **kwargs: Any) -> Any:
        """The drafter's proposals after a step (`EngineCore.post_step`): `ArDraftsProposed`
        for each running request that vLLM kept drafts for (not a prefill chunk's; a
        grammar's check may have cut them), so a twin schedules what vLLM could."""
        result = self._calls["update_draft_token_ids"](draft_token_ids, *args, **kwargs)
        running = {str(r.request_id) for r in self.scheduler.running}
        for rid in dict.fromkeys(str(r) for r in draft_token_ids.req_ids):
            request = self.scheduler.requests.get(rid)
            kept = len(request.spec_token_ids) if request is not None else 0
            if rid in running and kept:
                self._emit(ArDraftsProposed(rid, kept))
        return result

    def _set_pause_state(self, state: Any, *args: Any, **kwargs: Any) -> Any:
        """vLLM's pause (`pause_scheduler`, between steps): `ArPauseSet` with the new state."""
        result = self._calls["set_pause_state"](state, *args, **kwargs)
        self._emit(ArPauseSet(self._pause_name(self.scheduler.pause_state)))
        return result

    def _reset_prefix_cache(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's cache reset: with `reset_running_requests` it first preempts every running
        request, the last first (so they wait in their running order): `ArPreempted` with
        `reset` for each; then, where vLLM reports the reset done, `ArCacheReset`. The
        preemptions are logged even when vLLM then raises (its reset failing after them): the
        check names the missing reset, not the steps after."""
        before = self._view("before reset_prefix_cache()")
        reset = False
        try:
            result = self._calls["reset_prefix_cache"](*args, **kwargs)
            reset = bool(result)  # vLLM says whether it emptied the cache
            return result
        finally:
            after = self._view("after reset_prefix_cache()")
            preempted = [rid for rid in reversed(before.running) if rid not in after.running]
            for rid in preempted:
                self._emit(ArPreempted(rid, before.table(rid), reset=True))
            gone = set(preempted)
            for freed in release_events(before, after):
                if isinstance(freed, ArBlocksFreed) and freed.request_id not in gone:
                    self._emit(freed)
            if reset:
                self._emit(ArCacheReset())

    def _releasing(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call the scheduler's `name`, then log the step's outputs (`_log_outputs`) and the
        blocks the call freed. Called inside another wrapped call, it first logs those of the
        outer call so far, and the outer call then reads its frees from where this one ended
        (each free logged once)."""
        before = self._view(f"before {name}()")
        if self._open:
            self._log_outputs()
            for e in release_events(self._open[-1], before):
                self._emit(e)
            self._open[-1] = before
        self._open.append(before)
        try:
            result = self._calls[name](*args, **kwargs)
        finally:
            start = self._open.pop()
        self._log_outputs()
        after = self._view(f"after {name}()")
        for e in release_events(start, after):
            self._emit(e)
        if self._open:
            self._open[-1] = after
        return result

    def _log_outputs(self) -> None:
        """Per request the step scheduled, once, before the first free after
        `update_from_output`'s loop (nothing when no update is under way): `ArDraftsVerified`
        where it had drafts, then, with prefix caching, `ArOutputTokens` with the ids of the
        outputs the loop appended (vLLM's block hashes cover them: a later prompt that
        continues them hits their blocks). vLLM rolls the computed tokens back (rejected
        drafts, and tokens cut at a stop) in its loop over the batch, before it frees what
        stopped and before it ends a request in error (`finish_requests`, after the loop). The
        accepted drafts are the outputs it appended past the sampled token."""
        sampling, self._sampling = self._sampling, {}
        for rid, (request, outputs, drafted) in sampling.items():
            appended = len(request.output_token_ids) - outputs
            if drafted and appended:
                self._emit(ArDraftsVerified(rid, appended - 1))
            if self._prefix and appended:
                self._emit(ArOutputTokens(rid, appended_outputs(request, outputs)))

    def _view(self, where: str, scheduled: dict[str, int] | None = None) -> ArPoolView:
        """The scheduler's pools (`pool_view`), its queues checked first: `SpecViolation`,
        out of the wrapped call, where they cannot be read as a state of the spec's, with
        nothing written for that call (see the module)."""
        return pool_view(
            self.scheduler,
            self._prefix,
            scheduled,
            where=where,
            max_num_seqs=self.config.max_num_seqs,
        )

    def _emit(self, event: ArEvent) -> None:
        self._write(json.dumps(ar_event_to_dict(event), separators=(",", ":")))


__all__ = [
    "VllmEventLog",
    "ar_config_of",
    "declared_policy",
    "loggable",
    "max_loras_of",
    "token_budget_of",
]
