"""vLLM 0.33.0's engine-core loop over its real scheduler, synchronous or asynchronous, and
the checks that hold of both.

vLLM schedules asynchronously by default (`SchedulerConfig.async_scheduling`; the scheduler is
then `AsyncScheduler`). `EngineCore.step_with_batch_queue` (`vllm/v1/engine/core.py`) keeps a
batch queue of two: it schedules step N+1 while step N still runs, and applies N's output only
afterwards. So a decode request is scheduled for the output token its previous step has not yet
sampled (`Request.num_output_placeholders`); a request preempted while a step of it is in flight
gets that step's output later, as stale output (`num_stale_output_tokens`), and is not resumed
before it drains; an abort can land while a step of the request is in flight; a request that
stops at step N has already been scheduled at N+1, whose work is then thrown away.

The AR spec's step contract has one batch in flight (`spec.ar.events`), so the conformance
suite cannot follow this loop event by event. `EngineCoreLoop` runs it the way the engine core
does (`integrations.vllm.core_loop.BatchQueueLoop`), with the adapter's fabricated model
(`integrations.vllm.adapter`), and checks what must hold whatever the timing:

- content (`output_content`): every request's output tokens are exactly its own tokens
  1..k, k its stop index or max_tokens — an aborted request's a prefix of them — since the
  fabricated model fixes each token by request and index, a token lost, repeated or out of
  order shows; the finish reason is the one k implies (`finish_reason`);
- pool (`pool_accounting`), after every `schedule()`, `update_from_output()` and abort: each
  non-null block is free or held, not both; without prefix caching held by at most one request;
  with it, its reference count is the number of requests holding it;
- cache (`cache_hit_written`, prefix caching, `integrations.vllm.cache_writes`): every cache
  hit lands on blocks a scheduled batch wrote with the hitting request's own content (a hit
  ending inside a block, on that block's first tokens), and no batch writes other tokens over
  a block the prefix cache holds under its content's key;
- cache reads (`cache_read_limit`, `integrations.vllm.cache_reads`): a request with a cache read
  limit (skipping the cache, or scoring its prompt from a row on) is admitted with at most that
  many computed tokens read from the prefix cache or a KV connector;
- cache-aware admission (`cache_aware_order`, vLLM 0.34.0's window where it is set,
  `integrations.vllm.cache_aware_check`): the window orders the waiting queue as the spec's
  order function does, each request ranked by the hit it may take, and the order lasts;
- end (`no_leak`): once the loop is drained, no request is left and every block is free;
- progress (`progress`): the loop drains within a bound;
- vLLM raising is `implementation_error`;
- decisions, after every `schedule()` (what holds of one call whatever is in flight):
  `token_budget` (at most `max_num_batched_tokens` scheduled), `seat_cap` (at most
  `max_num_seqs` running), `admission_order` (a request scheduled for the first time never
  passes a waiting, never-scheduled one that comes before it: arrival order under FCFS,
  (priority, arrival) under the priority policy; a resumed request may be skipped while its
  stale output drains, a fresh one never), `preemption_victim` (the k requests preempted in
  one call are the last k of the running queue as it stood before it under FCFS, the k with
  the largest (priority, arrival) under priority; vLLM admits nothing after a preemption in
  the same call), `kv_covers_scheduled` (every request it scheduled holds blocks for all its
  computed tokens, in-flight ones included), `runner_tables` (the model runner's block table of
  every request it scheduled, rebuilt from the scheduler outputs alone, is the scheduler's:
  `integrations.vllm.runner_tables`);
- with pipeline stages (`pipeline_parallel_size` = p, async only: vLLM's V2 model runner,
  p + 1 batches in flight) two decode steps of one request are at least p schedules apart
  (`pp_cadence`, vLLM's `next_decode_eligible_step`).

With `speculative_tokens` = k > 0 both loops serve speculative decoding (`speculative_method`:
vLLM's `ngram`, or `eagle` / `draft_model` with lookahead slots; async with its V2 model
runner, which may skip drafting in a step whose drafts are sure to go unused): the model is
`integrations.vllm.speculative`'s, which verifies up to k drafts a step and samples 1 to k + 1
tokens, and the synchronous loop hands its drafts to the scheduler after each output
(`update_draft_token_ids`, `EngineCore.post_step`).
Three rules are added: `draft_rows` (a request scheduled n tokens carries at most n - 1
drafts), `drafts_skipped` (no request of a step vLLM marked `skip_drafts` verifies drafts in its
next decode) and, synchronously, `decode_position` (a decode starts at the request's last
sampled token).
`output_content` then also says that vLLM's rollback of rejected drafts and its stop checks
over several tokens a step lose, repeat and reorder nothing, and `cache_hit_written` counts
only the positions a batch wrote with the request's true tokens (a rejected draft's KV is
wrong).

With `structured_output` every other request has a grammar (`integrations.vllm.structured`):
the loop computes its bitmask where the engine core does (after `schedule()`, or, for a batch
vLLM defers because such a request's output is in flight, after that output is applied, its
drafts first checked against the grammar), and two rules are added: `grammar_mask` (every
token such a request samples is sampled under the row of its grammar as it stands,
`integrations.vllm.grammar_rows`) and `draft_grammar` (the drafts vLLM schedules for it are
ones its grammar admits).

With `kv_connector` = a failure policy (`recompute` or `fail`, vLLM's
`kv_load_failure_policy`) both loops serve a KV connector, `integrations.vllm.kv_connector`'s:
vLLM loads its class, the loop runs its worker (asynchronous loads that may fail, sends of
finished requests' KV), and four rules are added: `transfer_blocks_held` (a transfer's blocks
are not free, and an asynchronous load's are its request's alone, until the transfer is
reported), `load_before_compute` (no request is scheduled while its asynchronous load is in
flight) and `kv_written` (every scheduled request reads, below its computed tokens, with drafts
its verified ones, only blocks a batch or a load wrote with its content: a load that failed, or
a step computed over a failed block, writes nothing valid) and `kv_delivered` (a request whose
KV is sent when it stops or reaches its length hands the connector blocks covering its prompt:
with `kv_role="kv_producer"` vLLM frees a preempted request's blocks with its steps in flight,
and must not let their output finish it); `cache_hit_written` then also counts what a load
wrote, and a transfer never reported fails `progress`. `kv_pending_lookups` has the connector
put some lookups off ("ask again later"), which vLLM skips by design.

With `loras` = N the requests run LoRA adapters in turn (`integrations.vllm.adapter.lora_of`)
and `max_loras` is added: the running requests, and those a call schedules, run at most
`max_loras` adapters; a request whose adapter finds no room may be passed (`admission_order`),
and a hit reads only KV its own adapter wrote (`cache_hit_written`). With `pauses` = a mode of
vLLM's `pause_scheduler` the loop pauses generation now and then, clears the caches when idle
and resumes (`integrations.vllm.pauses`), and `pause` is added: a paused scheduler schedules
nothing ("keep") or only what ran or held KV before ("wait", "abort"). With `encoder`
(multimodal items in every prompt) the loop rebuilds the model runner's encoder cache from
the scheduler outputs and checks that every item a step reads is there and the scheduler's
book agrees with it, the encoder budget and cache size, unsplit items where chunked mm input
is off, whole prompts where chunked prefill is off, and no reference left once drained
(`integrations.vllm.encoder_inputs`). With `kv_events` vLLM's KV cache events are read as a
router reads them and two rules are added: `kv_events` (the keys they leave cached are the
prefix cache's, `integrations.vllm.kv_events`) and `kv_event_content` (each store names its
blocks' tokens, parent key, adapter and extra keys, `integrations.vllm.kv_event_content`).

`check_both(program, options)` runs a program through the synchronous loop (the control) and
the asynchronous one, as `LoopOptions` says (seeded bug, candidate fix, stages, drafts,
structured output). The content rule fixes every output and reason, so it also says that both
loops produce the same. Depends on `spec` and the adapter; vLLM is imported when the first
loop is built.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

from integrations.vllm import VLLM_CACHE_READ_LIMITS
from integrations.vllm.adapter import (
    SPACE,
    SPACE_PREFIX,
    GroupTables,
    OffloadingOptions,
    RealVllmScheduler,
    all_group_tables,
    block_tables,
    blocks_held,
    group_block_sizes,
    kv_groups,
    mamba_checkpoint,
    mamba_mode,
    next_output_index,
)
from integrations.vllm.admission_check import ADMISSION_RULES, AdmissionCheck
from integrations.vllm.admission_knobs import VLLM_ADMISSION, AdmissionKnobs
from integrations.vllm.cache_reads import (
    check_cache_reads,
    describe_limit,
    with_cache_read_limits,
)
from integrations.vllm.cache_writes import CacheWrites, batch_starts
from integrations.vllm.core_loop import (
    ABORTED,
    ASYNC_BATCH_QUEUE,
    SCHEDULE_RULES,
    BatchQueueLoop,
    EngineCoreViolation,
    LoopCounts,
    PauseHook,
    call_vllm,
    check_content,
    check_pool,
    check_program_steps,
    run_both,
    run_named,
    waiting_for_grammar,
)
from integrations.vllm.differential import program as decision_program
from integrations.vllm.encoder_inputs import (
    ENCODER_RULES,
    EncoderOptions,
    EncoderRunner,
    configure,
    mm_features,
)
from integrations.vllm.free_queue import free_blocks
from integrations.vllm.grammar_rows import GrammarRows
from integrations.vllm.kv_connector import RemoteKv
from integrations.vllm.kv_event_content import EventContent
from integrations.vllm.kv_events import KvEventView, check_kv_events
from integrations.vllm.lora_rules import check_adapter_limit, waits_for_adapter
from integrations.vllm.offload_store import OffloadStore
from integrations.vllm.offloading_worker import OffloadingWorker
from integrations.vllm.pauses import PauseDriver, check_pause_mode
from integrations.vllm.release_api import resumed_req_ids
from integrations.vllm.sessions import SessionInput, SessionLedger, sessions_of
from integrations.vllm.settings_034 import VLLM_034_DEFAULTS, Vllm034Settings
from integrations.vllm.speculative import SpeculativeModel
from integrations.vllm.structured import LateGrammars
from integrations.vllm.trace import counted, counted_of
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.profile import CacheReadLimits
from spec.errors import ConfigError, RequestError

RULES = (
    "output_content",
    "finish_reason",
    *SCHEDULE_RULES,
    "draft_rows",
    "drafts_skipped",
    "decode_position",
    "grammar_mask",
    "draft_grammar",
    "cache_hit_written",
    "cache_read_limit",
    "cache_aware_order",
    "kv_written",
    "kv_events",
    "kv_event_content",
    "max_loras",
    *ENCODER_RULES,
    *ADMISSION_RULES,
    "pause",
    "session_prompt",
    "session_length",
    "session_kv_kept",
    "load_before_compute",
    "inflight_kv_loads",
    "transfer_blocks_held",
    "kv_delivered",
    "store_content",
    "load_content",
    "pool_accounting",
    "no_leak",
    "idle_step",
    "progress",
    "implementation_error",
)


@dataclass(frozen=True, slots=True)
class CoreProgram:
    """A configuration and, per engine step, the requests that arrive and the ids aborted
    before it (then the loop drains); with `inputs` (one tuple per step, or none at all) the
    later inputs and closes of streaming-input sessions sent after the step's arrivals
    (`integrations.vllm.sessions`): a request named there is submitted as a session."""

    config: ArConfig
    arrivals: tuple[tuple[ArRequest, ...], ...]
    aborts: tuple[tuple[str, ...], ...]
    inputs: tuple[tuple[SessionInput, ...], ...] = ()

    def __post_init__(self) -> None:
        check_program_steps("CoreProgram", self.arrivals, self.aborts)
        if self.inputs and len(self.inputs) != len(self.arrivals):
            raise ValueError(
                f"CoreProgram: {len(self.arrivals)} steps of arrivals but {len(self.inputs)} "
                "of session inputs; give one tuple per step (empty for none), or none at all"
            )


@dataclass(frozen=True, slots=True)
class CoreRun:
    """What one loop did: outputs and reasons per request, and how often the asynchronous
    paths were taken."""

    outputs: dict[str, tuple[int, ...]]
    reasons: dict[str, str]
    engine_steps: int
    schedules: int
    ahead: int  # requests scheduled with an output of theirs still in flight
    stale: int  # preemptions with a step of the request in flight (its output then stale)
    aborts_in_flight: int  # aborts of a request with a step in flight
    discarded: int  # scheduled steps of a request that had finished when their output came
    cadence_waits: int  # running requests held back for the pipeline cadence, per schedule
    drafts_scheduled: int = 0  # draft tokens scheduled for verification (speculative decoding)
    drafts_accepted: int = 0  # of those, accepted
    draft_steps: int = 0  # decode steps that verified at least one draft
    guided_drafts_scheduled: int = 0  # of drafts_scheduled, those of structured-output requests
    guided_drafts_accepted: int = 0  # of those, accepted
    deferred: int = 0  # batches sampled only after the previous output (structured output)
    guided_rows: int = 0  # sampled tokens of structured-output requests whose row was checked
    reasoning_rows: int = 0  # of those, reasoning tokens (their rows unconstrained)
    session_reasoning_rows: int = 0  # of those, in a streaming-input session's later turn
    grammar_waits: int = 0  # requests left waiting for their grammar, per schedule
    grammar_errors: int = 0  # requests ended with an error as their grammar does not compile
    loads: int = 0  # KV loads from the remote store (KV connector)
    sync_loads: int = 0  # of those, done in the forward of the batch that scheduled them
    loads_failed: int = 0  # of those, failed as a whole
    blocks_invalid: int = 0  # of those, failed in one block
    sends: int = 0  # finished requests whose KV was sent
    session_loads: int = 0  # KV loads into a streaming-input session's later turn
    session_sends: int = 0  # sends of a session's KV after more than one turn
    aborted_loading: int = 0  # aborts of a request whose KV load was in flight
    inflight_cap_reached: int = 0  # calls leaving max_num_inflight_kv_loads loads holding blocks
    queue_passes: int = 0  # requests a later one of another waiting queue passed (allowed)
    load_errors: int = 0  # requests ended with an error after a failed load (policy "fail")
    lookups_put_off: int = 0  # connector lookups answered "ask again later"
    stores_refused: int = 0  # sends the offload store had no room for
    blocks_evicted: int = 0  # blocks the offload store evicted to make room
    offload_stores: int = 0  # store jobs of vLLM's offloading connector
    offload_stored_blocks: int = 0  # GPU blocks those jobs read
    offload_flushes: int = 0  # of those jobs, flushed (waited for before a forward)
    offload_loads: int = 0  # load jobs of vLLM's offloading connector
    offload_sync_loads: int = 0  # of those, synchronous
    offload_loaded_blocks: int = 0  # GPU blocks those jobs wrote
    offload_mid_chunk_loads: int = 0  # of those loads, those starting inside a CPU chunk
    offload_window_stored_blocks: int = 0  # of the blocks stored, a sliding window group's
    offload_window_loaded_blocks: int = 0  # of the blocks loaded, a sliding window group's
    offload_unstored_loads: int = 0  # of those, blocks of a chunk their store left out
    offload_deferred_reports: int = 0  # deferred batches whose output carried a worker report
    cache_resets: int = 0  # prefix-cache and connector resets between engine steps
    cache_resets_done: int = 0  # of those, the ones vLLM reported done (no KV in use)
    events_stored: int = 0  # keys KV cache events announced stored (GPU tier)
    events_removed: int = 0  # keys they announced removed
    events_cleared: int = 0  # AllBlocksCleared events
    events_sparse_stores: int = 0  # BlockStored events whose tokens are not one block per key
    events_other_media: int = 0  # events of another tier (the offloading connector's CPU store)
    events_orphan_stores: int = 0  # GPU stores whose parent key the events left uncached
    events_cpu_orphan_stores: int = 0  # the same, of the offloading connector's CPU tier
    events_keys_described: int = 0  # keys of stores whose content was checked, both tiers
    events_without_extra_keys: int = 0  # stores with no extra_keys where their blocks have some
    adapter_waits: int = 0  # requests left waiting for room for their LoRA adapter, per call
    encoder_runs: int = 0  # multimodal items the encoder ran (`encoder`)
    encoder_reads: int = 0  # items a scheduled token range read
    encoder_shared: int = 0  # of those, read by a request that did not compute them
    encoder_evictions: int = 0  # encoder cache entries the runner was told to free
    encoder_waits: int = 0  # requests left waiting as their items found no room, per call
    encoder_saves: int = 0  # items saved to the CPU encoder cache (`offload_blocks`)
    encoder_loads: int = 0  # items loaded from it instead of running the encoder
    pauses: int = 0  # generation paused (`pauses`)
    pause_preempted: int = 0  # running requests a pause's cache reset preempted
    pause_taken_back: int = 0  # waiting requests holding loaded KV whose blocks it took back
    sessions: int = 0  # streaming-input sessions (`integrations.vllm.sessions`)
    session_inputs: int = 0  # later inputs vLLM made turns of
    session_inputs_queued: int = 0  # of those, sent while the session's turn ran
    sessions_closed_waiting: int = 0  # sessions closed while they waited for input
    session_turns_on_kept_kv: int = 0  # turns resumed on the session's kept KV
    session_kv_dropped: int = 0  # resumed sessions whose kept KV was dropped before they ran
    session_inputs_awaiting_grammar: int = 0  # inputs applied before their grammar compiled
    session_grammar_errors: int = 0  # sessions a later input's failed grammar ended
    watermark_admissions: int = 0  # calls that admitted a request while one ran (watermark)
    capped_admissions: int = 0  # calls that admitted a request under max_num_active_seqs
    capped_beside_sessions: int = 0  # of those, with a session waiting for input counted
    held_steps: int = 0  # calls the prefill cadence held (no prefill allowed)
    backed_up_releases: int = 0  # release steps that left requests waiting (cadence lifted)
    emptied_holds: int = 0  # held calls that preempted every decoding request
    bounded_admissions: int = 0  # admissions of a request with a cache read limit
    partial_reads: int = 0  # of those, with a hit within the limit (some tokens read)
    window_engaged: int = 0  # admission phases the cache-aware window engaged in
    window_moved: int = 0  # of those, phases that moved the waiting queue
    window_cut: int = 0  # of those, phases ranking a request below its cached prefix (limit)
    window_passes: int = 0  # requests another queue passed behind a head the window moved


@dataclass
class _Counts(LoopCounts):
    ahead: int = 0
    stale: int = 0
    deferred: int = 0
    guided_rows: int = 0
    reasoning_rows: int = 0
    session_reasoning_rows: int = 0
    grammar_waits: int = 0
    grammar_errors: int = 0
    aborted_loading: int = 0
    inflight_cap_reached: int = 0
    load_errors: int = 0
    cache_resets: int = 0
    cache_resets_done: int = 0
    adapter_waits: int = 0
    offload_deferred_reports: int = 0
    bounded_admissions: int = 0
    partial_reads: int = 0


class EngineCoreLoop(BatchQueueLoop[_Counts]):
    """vLLM's engine core over the real scheduler (`integrations.vllm.core_loop`), the model
    fabricated by the adapter. `mutate`, if given, is applied to the scheduler once built
    (seeded bugs). With `pipeline_parallel_size` = p > 1 (async only) vLLM's scheduler runs p
    pipeline stages with its V2 model runner, the loop keeps vLLM's `max_concurrent_batches` (p
    + 1) batches in flight, and `pp_cadence` binds. With `speculative_tokens` = k > 0 vLLM
    schedules up to k drafts a decode step and `integrations.vllm.speculative.SpeculativeModel`
    (its draws seeded by `draft_seed`) runs the batches. With `kv_connector` (a failure policy)
    vLLM serves `integrations.vllm.kv_connector`'s connector, whose store and worker are
    `remote_kv` (default: a `RemoteKv` seeded by `draft_seed`, with synchronous loads unless
    `kv_sync_loads` is False, no failed load if `kv_load_failures` is False, lookups answered
    "ask again later" if `kv_pending_lookups`, and nothing to load if `kv_role` is
    "kv_producer": the connector only sends; with `kv_store="offload"` an
    `integrations.vllm.offload_store.OffloadStore`, which holds what finished requests stored
    and puts lookups off while its own jobs run, and with `kv_store_blocks` holds at most that
    many blocks, evicting the least recently used). With `sliding_window` (tokens) the cache is
    hybrid: a sliding-window group beside the full-attention one, in blocks of
    `window_block_scale` times the program's (or the full-attention group's blocks
    `full_block_scale` times), each group's blocks checked by its own table; with `mamba` a
    Mamba group too (`integrations.vllm.adapter.mamba_groups`). `admission` sets vLLM's
    admission settings beyond the AR config (`integrations.vllm.admission_knobs`), whose rules
    `integrations.vllm.admission_check` checks where one differs from vLLM's default. With
    `trace` (a list) the loop and the store append a line per event to it. With
    `greedy_outputs` the model samples as a greedy one (equal prompts, equal outputs:
    `RealVllmScheduler.greedy_outputs`)."""

    def __init__(
        self,
        config: ArConfig,
        *,
        async_scheduling: bool,
        mutate: Callable[[Any], None] | None = None,
        pipeline_parallel_size: int = 1,
        speculative_tokens: int = 0,
        speculative_method: str = "ngram",
        structured_output: bool = False,
        keyed_drafts: bool = False,
        late_grammars: bool = False,
        reasoning: bool = False,
        draft_seed: int = 0,
        kv_connector: str | None = None,
        remote_kv: RemoteKv | None = None,
        kv_sync_loads: bool = True,
        kv_pending_lookups: bool = False,
        kv_load_failures: bool = True,
        kv_role: str = "kv_both",
        kv_store: str = "draws",
        kv_store_blocks: int | None = None,
        offloading: OffloadingOptions | None = None,
        cache_resets: bool = False,
        sliding_window: int | None = None,
        retention_interval: int | None = 0,
        window_block_scale: int = 1,
        mamba: bool = False,
        mamba_block_scale: int = 1,
        mamba_checkpoint_alignment: int | None = None,
        full_block_scale: int = 1,
        kv_events: bool = False,
        kv_report_mode: str = "incremental",
        loras: int = 0,
        max_loras: int = 1,
        pauses: str | None = None,
        admission: AdmissionKnobs = VLLM_ADMISSION,
        settings_034: Vllm034Settings = VLLM_034_DEFAULTS,
        encoder: EncoderOptions | None = None,
        trace: list[str] | None = None,
        greedy_outputs: bool = False,
    ) -> None:
        if cache_resets and kv_connector is not None:
            raise ConfigError(
                "cache_resets",
                cache_resets,
                "False with kv_connector (schedspec's connectors keep no cache to reset; "
                "vLLM's offloading connector does)",
            )
        check_pause_mode(pauses)
        #: Reset the prefix cache and the connector's before one engine step in 16.
        self.cache_resets: bool = cache_resets
        self._reset_seed = draft_seed
        space = SPACE_PREFIX if config.enable_prefix_caching else SPACE
        self.impl: RealVllmScheduler = RealVllmScheduler(
            config,
            lambda _event: None,
            space,
            async_scheduling=async_scheduling,
            pipeline_parallel_size=pipeline_parallel_size,
            speculative_tokens=speculative_tokens,
            speculative_method=speculative_method,
            structured_output=structured_output,
            reasoning=reasoning,
            kv_connector=kv_connector,
            kv_role=kv_role,
            offloading=offloading,
            sliding_window=sliding_window,
            retention_interval=retention_interval,
            window_block_scale=window_block_scale,
            mamba=mamba,
            mamba_block_scale=mamba_block_scale,
            mamba_checkpoint_alignment=mamba_checkpoint_alignment,
            full_block_scale=full_block_scale,
            kv_events=kv_events,
            kv_report_mode=kv_report_mode,
            loras=loras,
            max_loras=max_loras,
            admission=admission,
            settings_034=settings_034,
            greedy_outputs=greedy_outputs,
        )
        #: A router's view of the KV cache events vLLM publishes (`kv_events`): it stands in
        #: for the scheduler's publisher, as a ZMQ publisher would feed a router.
        self.events: KvEventView | None = None
        #: What each store event says of its blocks, checked (`kv_event_content`).
        self.event_content: EventContent | None = None
        if kv_events:
            self.events = KvEventView(log=self.note if trace is not None else None)
            self.impl.sched.kv_event_publisher = self.events
            self.event_content = EventContent.for_scheduler(
                self.impl.sched, self.impl.v.kv_utils, self.impl.submitted
            )
        #: The remote KV store and the connector's worker (`kv_connector`: its failure policy).
        self.remote: RemoteKv | None = None
        if kv_connector is not None:
            if kv_store == "offload" and sliding_window:
                raise ConfigError(
                    "kv_store",
                    kv_store,
                    "'draws' beside sliding_window (the offload store keys what it holds by the "
                    "full-attention group's block hashes and holds no window)",
                )
            self.remote = remote_kv or _store(
                kv_store,
                draft_seed,
                config.block_size,
                sync_loads=kv_sync_loads,
                pending_lookups=kv_pending_lookups,
                loads=kv_role != "kv_producer",
                blocks=kv_store_blocks,
            )
            if not kv_load_failures:
                self.remote.failures = False
            # on a hybrid cache every transfer moves each group's blocks of its tokens
            self.remote.serve_groups(group_block_sizes(self.impl.sched))
            self.impl.sched.connector.remote = self.remote
            self.remote.turn_of = self.impl.turn_of
        #: The model runner's encoder cache, rebuilt and checked (`encoder`: multimodal items).
        self.encoder: EncoderRunner | None = None
        if encoder is not None:
            budget, size = configure(self.impl.sched, encoder)
            self.impl.mm_features_of = partial(mm_features, options=encoder)
            self.encoder = EncoderRunner(self.impl.sched, self.impl.submitted, budget, size)
        if mutate is not None:
            mutate(self.impl.sched)
        if self.encoder is not None:
            self.encoder.watch()
        #: The rules of vLLM's admission settings, where any differs from vLLM's default.
        self.admission: AdmissionCheck | None = (
            AdmissionCheck(admission, self.impl.sched) if admission.any else None
        )
        #: Streaming-input sessions: their inputs sent and their turns checked (the watch
        #: wraps what a seeded bug or a fix made of vLLM's scheduler).
        self.sessions: SessionLedger = SessionLedger(
            self.impl, config.max_model_len, self.impl._token
        )
        self.sessions.watch(self.impl.sched)
        self._session_ids: frozenset[str] = frozenset()
        super().__init__(
            self.impl.sched,
            _Counts(),
            async_scheduling=async_scheduling,
            queue_size=self.impl.max_concurrent_batches,
        )
        self.config = config
        self.stages = pipeline_parallel_size
        self.trace = trace
        if trace is not None and self.remote is not None:
            self.remote.log = self.note
        # a KV load's blocks are read as a prefix-cache hit's: checked the same way, and, as a
        # load may fail under a running request, every read (`kv_written`); with drafts only
        # below verified tokens, as a step is scheduled past drafts that vLLM may roll back
        # a hybrid cache's reads too: a sliding window frees the blocks that leave it, and
        # must keep those it still reads
        every_read = (
            kv_connector is not None or offloading is not None or bool(sliding_window) or mamba
        )
        self.writes: CacheWrites | None = (
            CacheWrites(
                config.block_size,
                every_read=every_read,
                verified_reads=speculative_tokens > 0,
                group_block_sizes=group_block_sizes(self.impl.sched),
                state_groups=frozenset(
                    g for g in range(kv_groups(self.impl.sched)) if mamba_mode(self.impl.sched, g)
                ),
                state_checkpoint=partial(mamba_checkpoint, self.impl.sched),
            )
            if config.enable_prefix_caching or every_read
            else None
        )
        #: vLLM's own offloading connector's worker, fabricated (`offloading`).
        self.offload: OffloadingWorker | None = None
        if offloading is not None:
            assert self.writes is not None
            self.offload = OffloadingWorker(
                self.writes,
                self.impl.sched.connector.connector_scheduler,
                draft_seed,
                self.impl.v.outputs,
                log=self.note if trace is not None else None,
            )
            self._watch_lookups(self.impl.sched.connector)
        #: The requests the offloading connector put off in the current `schedule()` call, and
        #: how many lookups it put off in all.
        self._put_off: set[str] = set()
        self._lookups_put_off = 0
        outputs = self.impl.v.outputs
        self.model: SpeculativeModel | None = (
            SpeculativeModel(
                self.impl.sched,
                speculative_tokens,
                seed=draft_seed,
                token=self.impl._token,
                new_output=outputs.ModelRunnerOutput,
                new_drafts=outputs.DraftTokenIds,
                async_scheduling=async_scheduling,
                explicit_drafts=structured_output,
                keyed_drafts=keyed_drafts,
                turn_of=self.impl.turn_of,
                grammar_span=self.sessions.grammar_span,
            )
            if speculative_tokens
            else None
        )
        self.structured: bool = structured_output
        if late_grammars and not structured_output:
            raise ConfigError(
                "late_grammars", True, "False without structured_output (no request has a grammar)"
            )
        self.late: LateGrammars | None = None
        if late_grammars:
            late = LateGrammars(self.sched, draft_seed)
            self.late = late
            self.impl.compile_grammar = lambda req: late.submit(req, self.n.engine_steps)
            self.sessions.compile_grammar = lambda req: late.submit(
                req, self.n.engine_steps, session_input=True
            )
        self._valid: dict[str, tuple[int, int]] | None = None
        #: per batch output (its id): the synchronous loads it ran that failed in a block
        self._failed_sync: dict[int, list[Any]] = {}
        #: per deferred batch (its id) with vLLM's offloading connector: the worker's report
        #: of its forward, which rides with its output once sampled
        self._forward_reports: dict[int, Any] = {}
        self._deferred_tables: GroupTables = ()

        self._stale_before: set[str] = set()
        # vLLM 0.34.0's cache-aware window, where vLLM applies it (FCFS, prefix caching)
        if (
            settings_034.cache_aware_window
            and config.policy is Policy.FCFS
            and config.enable_prefix_caching
        ):
            specs = self.impl.specs
            self.serve_cache_aware(
                settings_034.cache_aware_window,
                settings_034.cache_aware_threshold,
                config.block_size,
                lambda rid: specs[rid].cache_read_limit if rid in specs else None,
            )
        #: Pauses generation before one engine step in 16, in vLLM's mode `pauses`.
        self.pause: PauseHook | None = (
            PauseDriver(self.sched, pauses, draft_seed, note=self.note, abort=self.abort)
            if pauses is not None
            else None
        )

    # ------------------------------------------------------------------ driving
    def submit(self, request: ArRequest) -> bool:
        """Add a request (a session if the program sends it inputs); False if it is refused as
        invalid (both loops refuse alike)."""
        session = request.request_id in self._session_ids
        try:
            self.impl.submit(request, resumable=session)
        except RequestError:
            return False
        if session:
            self.sessions.open(request)
        if self.cache_aware is not None:
            self.cache_aware.submit(request.request_id)
        self.outputs[request.request_id] = []
        if self.trace is not None:
            shared = ", a shared prompt" if request.prompt is not None else ""
            limit = request.cache_read_limit
            if limit is not None:  # e.g. ", skips reading the prefix cache"
                shared += f", {describe_limit(limit).removeprefix('it ')}"
            stop = f", stops at output {request.stop_after}" if request.stop_after else ""
            self.note(
                f"submit {request.request_id}: {request.prompt_len} prompt tokens{shared}, up "
                f"to {request.max_tokens} output{stop}"
            )
        return True

    def abort(self, request_id: str) -> None:
        """Abort a live request (one already finished or never submitted: nothing)."""
        if request_id not in self.outputs or request_id in self.reasons:
            return
        if self.remote is not None and ("load", request_id) in self.remote.in_flight:
            self.n.aborted_loading += 1
        self.finish(request_id, lambda: self.impl.abort(request_id))

    def send_input(self, item: SessionInput) -> None:
        """Send session input `item` (`SessionLedger.send`; nothing for a session that ended or
        was never submitted); a close that ends a session waiting for input ends it here."""
        rid = item.request_id
        if rid not in self.sessions.sessions or rid in self.reasons:
            return
        if not self.sessions.send(item):
            return
        what = (
            "close"
            if item.closes
            else f"{counted(item.prompt_len, 'token')} in, up to {item.max_tokens} out"
        )
        self.note(f"session {rid}: {what}")
        req = self.sched.requests.get(rid)
        if req is None or req.is_finished():
            ended = self.sessions.sessions[rid].reasons
            self.reasons[rid] = ended[-1] if ended else ABORTED
        self.check_pool(f"after session input to {rid!r}")

    def close_sessions(self) -> None:
        """Close every session the program left open: its input stream ends with the program
        (a session never closed would wait for input, holding its seat and KV, for good)."""
        for rid, session in self.sessions.sessions.items():
            if not session.closed:
                self.send_input(SessionInput(rid, 0))

    def stall_detail(self) -> str:
        """The waiting sessions that hold KV, each with its computed tokens and those it still
        has to compute, and the free blocks; the requests the last call left no token as their
        items found no room for the encoder (`progress`)."""
        cut = self.encoder.stall_detail() if self.encoder is not None else ""
        return self._sessions_stall_detail() + cut

    def _sessions_stall_detail(self) -> str:
        held = [
            f"{r.request_id} ({counted_of(r.num_computed_tokens, 'token')} KV kept, "
            f"{r.num_tokens - r.num_computed_tokens} to compute)"
            for r in self.waiting_requests()
            if r.request_id in self.sessions.sessions and r.num_computed_tokens
        ]
        if not held:
            return ""
        free = self.sched.kv_cache_manager.block_pool.get_num_free_blocks()
        return (
            f"; sessions waiting with KV: {', '.join(held)}; {free} blocks free, and no request "
            "runs to free more"
        )

    def finished(self, rid: str, reason: str) -> None:
        """A session's turn ended (`SessionLedger.turn_ended`): the request ends only if vLLM
        ended it (closed), else it waits for input. Any other request ends."""
        if rid in self.sessions.sessions:
            self.sessions.turn_ended(rid, reason)
            req = self.sched.requests.get(rid)
            if req is not None and not req.is_finished():
                # vLLM drops the ended turn's step in flight (`drop_stale_output`) and may
                # start the next turn at once: its first step waits for no output (`pp_cadence`)
                self.last_decode.pop(rid, None)
                return
        self.reasons[rid] = reason

    def run(self, program: CoreProgram) -> CoreRun:
        """The program (`BatchQueueLoop.play`), checked; what the loop did."""
        self._session_ids = sessions_of(program.inputs)
        self.play(
            program.arrivals,
            program.aborts,
            self.submit,
            self.abort,
            inputs=program.inputs,
            send=self.send_input,
            before_drain=self.close_sessions,
        )
        counts: dict[str, int] = dict(self.sessions.counts)
        if self.encoder is not None:
            self.encoder.check_drained()
            counts.update(asdict(self.encoder.counts))
        if self.model is not None:
            counts.update(asdict(self.model.counts))
        if self.offload is not None:
            self.offload.check_done()
            counts.update(asdict(self.offload.counts))
            counts["lookups_put_off"] = self._lookups_put_off
        if self.remote is not None:
            self.remote.check_done()
            transfers = asdict(self.remote.counts)
            del transfers["aborted_loading"]  # the loop counts those (`abort`)
            counts.update(transfers)
        if self.pause is not None:
            counts.update(
                pauses=self.pause.pauses,
                pause_preempted=self.pause.preempted,
                pause_taken_back=self.pause.taken_back,
            )
        if self.events is not None:
            view = self.events
            counts.update(
                events_stored=view.stored,
                events_removed=view.removed,
                events_cleared=view.cleared,
                events_sparse_stores=view.sparse_stores,
                events_other_media=view.other_media,
                events_orphan_stores=view.orphan_stores,
                events_cpu_orphan_stores=view.cpu_orphan_stores,
            )
        if self.admission is not None:
            counts.update(asdict(self.admission.counts))
        if self.cache_aware is not None:
            counts.update(asdict(self.cache_aware.counts))
        if self.event_content is not None:
            counts.update(
                events_keys_described=self.event_content.checked,
                events_without_extra_keys=self.event_content.stores_without_extra_keys,
            )
        return CoreRun(
            {rid: tuple(t) for rid, t in self.outputs.items()},
            dict(self.reasons),
            **asdict(self.n),
            **counts,
            queue_passes=self.queue_passes,
        )

    # ------------------------------------------------------------------ the loop's hooks
    def before_schedule(self) -> None:
        """Count cadence waits and running requests with an output in flight (`ahead`), record the
        running order, and note the waiting requests that already have stale output."""
        self.count_cadence_waits()
        self._put_off.clear()
        if self.encoder is not None:
            sched = self.sched
            # the async loop keeps empty batches in flight: they carry no transfer
            in_flight = any(o.total_num_scheduled_tokens for o, _ in self.queue)
            idle = not in_flight and not sched.has_unfinished_requests()
            self.encoder.before_schedule(idle=idle and not sched.has_finished_requests())
        self._maybe_reset()
        if self.late is not None:
            self.late.complete(self.n.engine_steps)
        self.record_running()
        if self.sessions.sessions:
            self.sessions.before_schedule()
        if self.pause is not None:
            self.pause.before_schedule()
        if self.writes is not None:
            self.writes.before_schedule(self.sched)
        if self.admission is not None:
            self.admission.before_schedule()
        for req in self.sched.running:
            if req.num_output_placeholders > 0:
                self.n.ahead += 1
        self._stale_before = {
            r.request_id for r in self.impl._waiting() if r.num_stale_output_tokens
        }

    def after_schedule(self, out: Any) -> None:
        """Check the call's decisions (`check_decisions`, `check_kv_covers`) and `pp_cadence` over
        the requests it decodes; count the requests newly waiting with stale output (`stale`)."""
        cfg = self.config
        own_kv = self.sessions.resuming()  # before `scheduled` marks them resumed
        self.check_cache_aware(out, held=self.admission is not None and self.admission.held)
        self.check_decisions(
            out,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_num_seqs=cfg.max_num_seqs,
            priority=cfg.policy is Policy.PRIORITY,
        )
        self.check_kv_covers(out)
        self.check_cache_reads(out, own_kv)
        self.check_idle_step(out)
        if self.admission is not None:
            self.admission.after_schedule(out, f"schedule {self.n.schedules}")
        if self.sessions.sessions:
            self.sessions.scheduled(batch_starts(out), f"schedule {self.n.schedules}")
        if self.pause is not None:
            self.pause.check_schedule(out, f"schedule {self.n.schedules}")
        if self.impl.loras:
            self.check_adapters(out)
        if self.encoder is not None:
            self.encoder.after_schedule(out, f"schedule {self.n.schedules}")
        if self.remote is not None:
            self.remote.check_scheduled(out.num_scheduled_tokens, f"schedule {self.n.schedules}")
        self.check_inflight_loads(f"schedule {self.n.schedules}")
        self.n.grammar_waits += sum(map(waiting_for_grammar, self.impl._waiting()))
        # a deferred batch (sampled once the output before it is applied) runs its forward now,
        # as vLLM's `execute_model` does: the offloading worker's loads land before its reads
        forward_now = self.offload is not None and not (self.queue and self.queue[0][0] is out)
        if self.offload is not None and forward_now:
            self.offload.before_forward(out.kv_connector_metadata)
        if self.writes is not None:
            if self.remote is not None:
                # a synchronous load writes its blocks in this batch's forward, before attention
                # reads them (a batch sampled later, deferred, too)
                for t in getattr(out.kv_connector_metadata, "transfers", ()):
                    if t.sync:
                        t.writes_from = self.writes.puts_before_schedule
                        self._record_load(t, failed_too=True)
            self.writes.after_schedule(
                self.sched, out, self.n.schedules, self._valid, own_kv=own_kv
            )
        if self.offload is not None:
            # the worker's transfers done after this batch's forward, reported in its output
            # (a deferred batch's once it is sampled: vLLM keeps the report until then)
            report = self.offload.after_forward(out.kv_connector_metadata)
            if forward_now:
                self._forward_reports[id(out)] = report
                self.n.offload_deferred_reports += report is not None
            else:
                self.queue[0][1].kv_connector_output = report
        requests = self.sched.requests
        decoded = (rid for rid in out.num_scheduled_tokens if not requests[rid].is_prefill_chunk)
        self.check_cadence(decoded, self.stages)
        self.n.stale += sum(
            1
            for r in self.impl._waiting()
            if r.num_stale_output_tokens and r.request_id not in self._stale_before
        )

    def check_cache_reads(self, out: Any, own_kv: Collection[str]) -> None:
        """Rule `cache_read_limit` (`integrations.vllm.cache_reads`) over the requests the call
        admits, new or resumed, but for sessions resuming on their kept KV (`own_kv`)."""
        specs = self.impl.specs
        admitted = {d.req_id for d in out.scheduled_new_reqs} | resumed_req_ids(out)
        limits = {
            rid: limit
            for rid in admitted - set(own_kv)
            if rid in specs and (limit := specs[rid].cache_read_limit) is not None
        }
        if not limits:
            return
        self.n.bounded_admissions += len(limits)
        self.n.partial_reads += check_cache_reads(
            batch_starts(out), limits, f"schedule {self.n.schedules}"
        )

    def execute(self, out: Any) -> Any:
        """Sample the batch as it is scheduled (`sample`), under its grammar bitmask when
        structured output is on (`get_grammar_bitmask`, as `EngineCore.step` and
        `step_with_batch_queue` call it right after scheduling)."""
        grammar = self._grammar(out) if self.structured else None
        return self.transfer(out, self.sample(out, grammar))

    def defers(self, out: Any) -> bool:
        """vLLM's `pending_structured_output_tokens` (async: a structured-output request of the
        batch has an output in flight, so its grammar is not yet where the batch samples).
        Keeps what the batch writes whatever it accepts, and the block tables, for
        `cache_hit_written`."""
        if not (self.async_scheduling and out.pending_structured_output_tokens):
            return False
        self.n.deferred += 1
        self._valid = self.model.certain(out) if self.model is not None else None
        if self.writes is not None:
            self._deferred_tables = all_group_tables(self.sched)
        return True

    def execute_deferred(self, out: Any) -> Any:
        """A deferred batch, once the previous output is applied, as `step_with_batch_queue`
        finishes it: with speculative decoding the scheduler checks the runner's drafts against
        the grammar (`update_draft_token_ids_in_output` with `take_draft_token_ids`); then the
        bitmask, and sampling. The accepted drafts' positions are then recorded as written."""
        model = self.model
        if model is not None:
            drafts = model.take_drafts()
            call_vllm(
                "update_draft_token_ids_in_output",
                lambda: self.sched.update_draft_token_ids_in_output(drafts, out),
            )
        output = self.transfer(out, self.sample(out, self._grammar(out), deferred=True))
        if self.writes is not None and model is not None:
            self.writes.record(self.sched, out, self._deferred_tables, self._valid)
        return output

    def sample(self, out: Any, grammar: Any, *, deferred: bool = False) -> Any:
        """The adapter's fabricated model output for the batch (`RealVllmScheduler._fabricate`),
        or with speculative decoding the speculative model's (which also says what the batch
        wrote correctly, for `cache_hit_written`; `deferred`: sampled once the output before it
        is applied); each structured-output request's token checked against its row of
        `grammar` (`grammar_mask`)."""
        rows = GrammarRows(grammar)
        if self.model is not None:
            ahead: Counter[str] = Counter()
            if deferred:  # the batches in flight before it are applied before it
                for older, _ in self.queue:
                    ahead.update(older.num_scheduled_tokens)
            output, self._valid = self.model.execute(out, rows, deferred=deferred, ahead=ahead)
        else:
            requests = self.sched.requests
            for rid in out.num_scheduled_tokens:
                req = requests.get(rid)  # None: finished by the output applied before (deferred)
                # a session waiting for its next input's grammar ran this batch for the
                # turn that ended (its output dropped): no row (`own-grammar-per-input`)
                if (
                    req is not None
                    and req.use_structured_output
                    and not req.is_prefill_chunk
                    and not waiting_for_grammar(req)
                ):
                    turn = self.impl.turn_of.get(rid, 1)
                    span = self.sessions.grammar_span(req)
                    rows.check(rid, next_output_index(req), 1, span, turn)
            output = self.impl._fabricate(dict(out.num_scheduled_tokens))
        self.n.guided_rows += rows.checked
        self.n.reasoning_rows += rows.reasoning
        self.n.session_reasoning_rows += rows.later_reasoning
        return output

    def transfer(self, out: Any, output: Any) -> Any:
        """With a KV connector, the worker's side of batch `out` (`RemoteKv.execute`): start its
        transfers, report those due in `output` (`kv_connector_output`), and record the blocks
        each reported load wrote, for `cache_hit_written`. With the CPU encoder-cache offload,
        the step's saves and loads done (`ec_connector_output`). Returns `output`."""
        if self.encoder is not None and self.encoder.offload is not None:
            output.ec_connector_output = self.encoder.offload.report(out, self.impl.v.outputs)
        if self.offload is not None:
            if id(out) in self._forward_reports:  # deferred: its forward ran when scheduled
                output.kv_connector_output = self._forward_reports.pop(id(out))
            else:
                self.offload.before_forward(out.kv_connector_metadata)
            return output
        if self.remote is None:
            return output
        meta = out.kv_connector_metadata
        reported, loaded = self.remote.execute(meta, self.impl.v.outputs)
        output.kv_connector_output = reported
        if self.writes is not None:
            for t in loaded:
                # the batch reads a synchronous load's blocks before vLLM can know that one
                # failed: they count as written until its output is applied
                self._record_load(t, failed_too=t.sync)
            failed_sync = [t for t in loaded if t.sync and (t.bad is not None or t.lost)]
            if failed_sync:
                self._failed_sync[id(output)] = failed_sync
        return output

    def _record_load(self, load: Any, *, failed_too: bool) -> None:
        """Record `load`'s blocks as written with its request's content, its failed block
        (`load.bad`) only if `failed_too`, and on a hybrid cache each further group's blocks
        (the null block left out) as that group's."""
        assert self.writes is not None
        for index, block in enumerate(load.blocks):
            if failed_too or index != load.bad:
                self.writes.put(block, (load.request, load.first + index))
        for group in load.groups:
            for index, g_block in enumerate(group.blocks):
                if g_block is not None:
                    self.writes.put(g_block, (load.request, group.first + index), group.group)

    def _grammar(self, out: Any) -> Any:
        """vLLM's `GrammarOutput` for batch `out` (None: no structured request samples)."""
        return call_vllm("get_grammar_bitmask", lambda: self.sched.get_grammar_bitmask(out))

    def runner_output(self, executed: Any) -> Any:
        """What `execute` fabricated, unchanged. With a KV connector, every request that holds
        a block the output reports failed, as vLLM applies it, lost KV (under the "fail"
        policy vLLM ends each with an error); on a hybrid cache, every request holding a
        block of a synchronous load the output reports failed as a whole (`lost_load_holders`)
        did too."""
        reported = getattr(executed, "kv_connector_output", None)
        if self.remote is not None and reported is not None and reported.invalid_block_ids:
            for rid, table in block_tables(self.sched).items():
                if reported.invalid_block_ids.intersection(table):
                    self.remote.failed.add(rid)
        if self.remote is not None:
            for t in self._failed_sync.get(id(executed), ()):
                if t.lost:
                    self.remote.failed |= self.lost_load_holders(t)
        return executed

    def lost_load_holders(self, load: Any) -> set[str]:
        """The requests holding KV that synchronous `load`, failed as a whole, left unwritten:
        its loader, and every request holding one of its blocks or, in any group, one of the
        blocks the loader holds from the load's first on (its batches computed them over the
        load, and the prefix cache offered them at once)."""
        failed = set(load.all_blocks())
        first = load.firsts()
        for group, tables in enumerate(all_group_tables(self.sched)):
            if group in first:
                table = tables.get(load.rid, ())
                failed.update(b for b in table[first[group] :] if b is not None)
        held = blocks_held(self.sched)
        return {load.rid} | {rid for rid, blocks in held.items() if not failed.isdisjoint(blocks)}

    def reason(self, finish_reason: Any) -> str:
        """vLLM's reason as the spec's value, "stop" or "length" (`finish_reason_of`), or
        "error" (vLLM ends a request whose grammar rejects a sampled token so; `finish_reason`
        then fails); any other raises `ConfigError`."""
        if finish_reason == self.impl.v.engine.FinishReason.ERROR:
            return "error"
        return self.impl._reason(finish_reason).value

    def after_output(self, out: Any, executed: Any) -> None:
        """Mark every finished or aborted request as ended in the adapter (`impl.ended`); in the
        synchronous loop with speculative decoding hand the drafts proposed after the batch to
        the scheduler (`EngineCore.post_step`; under async scheduling the model runner keeps
        them)."""
        self.impl.ended.update(self.reasons)
        if self.events is not None:
            # vLLM published this step's events at the end of `update_from_output`
            where = f"after update_from_output() of schedule {self.n.schedules}"
            stores = self.events.take_stores()
            if self.event_content is not None:
                self.event_content.check_stores(stores, where)
            check_kv_events(self.events, self.sched, self.impl.v.kv_utils, where)
        if self.writes is not None:
            for t in self._failed_sync.pop(id(executed), ()):
                if t.lost:
                    # failed as a whole: none of its blocks, in any group, holds what it was
                    # to load, nor what the loader's batches computed over them
                    self.writes.forget_lost_load(t.request, t.firsts(), since=t.writes_from)
                    continue
                # the failed block, and what the loader's batches computed over it, hold
                # nothing valid; the load's other blocks do (the store wrote them)
                assert t.bad is not None
                self.writes.forget_failed_load(
                    t.request, t.blocks[t.bad], after=t.first + len(t.blocks)
                )
        if self.model is not None and self.remote is not None:
            self.model.truncated()
        if self.model is not None and not self.async_scheduling:
            drafts = self.model.drafts(out)
            call_vllm("update_draft_token_ids", lambda: self.sched.update_draft_token_ids(drafts))

    def _maybe_reset(self) -> None:
        """With `cache_resets`, before one engine step in 16 (a hash of the seed and the step)
        reset the prefix cache and the connector's cache, as vLLM's `reset_prefix_cache(
        reset_connector=True)` does after a weight update: between steps, with requests
        running and transfers in flight. vLLM resets the prefix cache only when no KV is in
        use; the connector's it resets anyway."""
        step = self.n.engine_steps
        if not self.cache_resets or zlib.crc32(f"{self._reset_seed}/reset/{step}".encode()) % 16:
            return
        done = call_vllm(
            "reset_prefix_cache", lambda: self.sched.reset_prefix_cache(reset_connector=True)
        )
        self.n.cache_resets += 1
        self.n.cache_resets_done += bool(done)
        self.note(f"reset the prefix cache and the connector's ({'done' if done else 'not done'})")

    def waits_for_adapter(self, request: Any) -> bool:
        """Whether `request` needs a LoRA adapter none of the running requests runs while they
        run `max_loras` adapters already (`lora_rules.waits_for_adapter`)."""
        return waits_for_adapter(self.sched, request, self.impl.max_loras)

    def waits_for_encoder(self, rid: str) -> bool:
        """Whether the current call's encoder scheduling cut request `rid` as its multimodal
        items found no room (`EncoderRunner.cut`; asked of requests it left unscheduled)."""
        return self.encoder is not None and rid in self.encoder.cut

    def check_adapters(self, out: Any) -> None:
        """`max_loras` (`lora_rules.check_adapter_limit`); count the requests waiting for room
        for their adapter."""
        check_adapter_limit(self.sched, out, self.impl.max_loras, f"schedule {self.n.schedules}")
        self.n.adapter_waits += sum(map(self.waits_for_adapter, self.impl._waiting()))

    def admission_queue(self, rid: str) -> str:
        """With `max_num_inflight_kv_loads` (vLLM 0.34.0), vLLM queues the requests its
        connector may load asynchronously apart (`async_kv_waiting`): their loads start while
        the batch is full, and while the cap holds them back the plain queue goes on. Arrival
        order then holds within each queue, and across the two where vLLM held neither back
        (`queue_held`, `came_after_a_head`); the queue is the connector's latest answer to
        vLLM (`RemoteKv.queued_async`)."""
        if self.impl.settings_034.max_inflight_kv_loads is None or self.remote is None:
            return "waiting"
        return "async_kv_waiting" if self.remote.queued_async.get(rid) else "waiting"

    def queue_held(self, queue: str, out: Any) -> bool:
        """vLLM 0.34.0 takes from its two waiting queues in the policy's order
        (`_next_waiting_queue`), but stops taking from the asynchronous one once its head would
        start a load past the cap, and takes from it alone once no running slot or token
        budget is left (a load takes neither). Within a call's admissions loads only start,
        and slots and budget only fill, so a queue held back then is still held when the call
        returns, where this reads it: the asynchronous queue when vLLM's own count of loads
        against the cap admits no new one (`_admits_inflight_kv_load`; whether that count is
        right is `inflight_kv_loads`' and `progress`' to check: the loads this loop's
        connector reports done in the batch's forward still count until vLLM applies the
        report); the plain one when the running requests (and the sessions waiting for input)
        fill `max_num_active_seqs`, or the call's tokens the budget."""
        if queue == "async_kv_waiting":
            limit = self.impl.settings_034.max_inflight_kv_loads
            return limit is not None and not self.sched._admits_inflight_kv_load()
        seats = self.config.max_num_seqs
        if self.admission is not None and self.admission.active_seats is not None:
            seats = self.admission.active_seats
        waiting_input = self.impl.v.request.RequestStatus.WAITING_FOR_STREAMING_REQ
        sessions = sum(r.status == waiting_input for r in self.sched.requests.values())
        budget = self.config.max_num_batched_tokens
        scheduled: int = out.total_num_scheduled_tokens
        return len(self.sched.running) + sessions >= seats or scheduled >= budget

    def lookup_put_off(self, rid: str) -> bool:
        """Whether the connector's latest lookup of `rid` said "ask again later"."""
        if self.offload is not None:
            return rid in self._put_off
        return self.remote is not None and rid in self.remote.asked_later

    def _watch_lookups(self, connector: Any) -> None:
        """Note each request vLLM's offloading connector answers "ask again later" (`None`:
        a transfer of its still runs, or a hit is still being stored), which vLLM skips."""
        lookup = connector.get_num_new_matched_tokens

        def watched(request: Any, *args: Any, **kwargs: Any) -> Any:
            hit, is_async = lookup(request, *args, **kwargs)
            if hit is None:
                self._put_off.add(request.request_id)
                self._lookups_put_off += 1
            return hit, is_async

        connector.get_num_new_matched_tokens = watched

    def check_pool(self, where: str) -> None:
        """`pool_accounting`, counting references when prefix caching is on; with a KV
        connector also `transfer_blocks_held`."""
        check_pool(self.sched, self.config.enable_prefix_caching, where)
        if self.remote is not None:
            pool = self.sched.kv_cache_manager.block_pool
            free = {b.block_id for b in free_blocks(pool)}  # as checked just above
            self.remote.check_held(free, blocks_held(self.sched), where)

    def check_inflight_loads(self, where: str) -> None:
        """`inflight_kv_loads` (vLLM 0.34.0's `max_num_inflight_kv_loads`, where set): the
        requests that hold KV blocks for an asynchronous load, loading or loaded and waiting for
        a running slot, and those aborted while their load is still in flight, are at most the
        cap. Those are the live requests outside the running batch that hold blocks (a
        streaming session waiting for input, or resuming on the KV it kept, aside) and the
        in-flight loads'."""
        limit = self.impl.settings_034.max_inflight_kv_loads
        if limit is None or (self.remote is None and self.offload is None):
            return
        holding = self._load_holders()
        self.n.inflight_cap_reached += len(holding) == limit
        if len(holding) > limit:
            raise EngineCoreViolation(
                "inflight_kv_loads",
                f"{where}: {len(holding)} requests hold KV blocks for an asynchronous load "
                f"({', '.join(sorted(holding))}); max_num_inflight_kv_loads={limit}",
            )

    def _load_holders(self) -> set[str]:
        """The requests holding KV blocks for an asynchronous load (`check_inflight_loads`):
        the test connector's or vLLM's offloading connector's."""
        running = {r.request_id for r in self.sched.running}
        waiting_input = self.impl.v.request.RequestStatus.WAITING_FOR_STREAMING_REQ
        kept = self.sessions.resuming()

        def waits_holding(rid: str) -> bool:
            # live, outside the batch, not a session waiting for input or resuming on the KV
            # it kept (a finished request's blocks kept for its send are not a load's)
            req = self.sched.requests.get(rid)
            return (
                req is not None
                and not req.is_finished()
                and rid not in running
                and req.status != waiting_input
                and rid not in kept
            )

        holding = {
            rid for rid, table in block_tables(self.sched).items() if table and waits_holding(rid)
        }
        if self.remote is not None:
            holding |= {
                t.rid for t in self.remote.in_flight.values() if t.kind == "load" and not t.sync
            }
        if self.offload is not None:
            holding |= self.offload.loading()
        return holding

    def check_request(self, rid: str, tokens: Sequence[int]) -> None:
        """`output_content` / `finish_reason` of `rid` against the adapter's token script
        (`check_content`), a session's turn by turn (`SessionLedger.check`); one whose grammar
        does not compile (`LateGrammars`), a session's first included, ends with an error and
        no token."""
        if self.late is not None and rid in self.late.failed:
            reason = self.reasons.get(rid)
            if tokens or reason not in ("error", ABORTED):
                raise EngineCoreViolation(
                    "finish_reason",
                    f"{rid!r}, whose grammar does not compile, finished with {reason} and "
                    f"{len(tokens)} tokens; expected an error and none",
                )
            self.n.grammar_errors += reason == "error"
            return
        reason = self.reasons.get(rid)
        if (
            reason == "error"
            and self.remote is not None
            and self.impl.kv_connector == "fail"
            and rid in self.remote.failed
        ):
            # vLLM's default policy ends a request whose load failed, with what it had (a
            # session: its turns so far, the error ending none of them)
            self.n.load_errors += 1
            reason = ABORTED
            if rid in self.sessions.sessions:
                self.sessions.ended_by_failed_load(rid)
        if rid in self.sessions.sessions:
            self.sessions.check(rid, list(tokens), reason)
            return
        spec = self.impl.specs[rid]
        check_content(
            rid,
            tokens,
            reason,
            max_tokens=spec.max_tokens,
            stop_after=spec.stop_after,
            token=lambda i: self.impl._token(rid, i),
        )


#: Token i of the prompt that `core_program`'s shared prompts are prefixes of.
SHARED_PROMPT_BASE = 100


def core_program(seed: int) -> CoreProgram:
    """A random program inside vLLM's space: `integrations.vllm.differential.program`'s
    configuration and arrivals, plus aborts of earlier requests before some steps. For a third
    of the seeds prefix caching is on and half the prompts are prefixes of one shared prompt."""
    config, arrivals = decision_program(seed)
    rnd = random.Random(seed * 7919 + 1)
    prefix = rnd.random() < 1 / 3
    if prefix:
        config = replace(config, enable_prefix_caching=True)
    shared = tuple(range(SHARED_PROMPT_BASE, SHARED_PROMPT_BASE + config.max_model_len))
    seen: list[str] = []
    batches: list[tuple[ArRequest, ...]] = []
    aborts: list[tuple[str, ...]] = []
    for batch in arrivals:
        aborts.append(tuple(rid for rid in seen if rnd.random() < 0.15))
        if prefix:
            batch = [
                replace(r, prompt=shared[: r.prompt_len]) if rnd.random() < 0.5 else r
                for r in batch
            ]
        batches.append(tuple(batch))
        seen.extend(r.request_id for r in batch)
    return CoreProgram(config, tuple(batches), tuple(aborts))


#: The connector's stores (`kv_store`): `RemoteKv`'s draws, or a content-addressed store of
#: what finished requests stored (`OffloadStore`).
KV_STORES = ("draws", "offload")


def _store(
    kind: str,
    seed: int,
    block_size: int,
    *,
    sync_loads: bool,
    pending_lookups: bool,
    loads: bool,
    blocks: int | None = None,
) -> RemoteKv:
    """The store `kind` names (`KV_STORES`), an offload store holding at most `blocks` blocks
    (None: unbounded); `ConfigError` for another kind, for an offload store with put-off
    lookups drawn or nothing to load (it decides its own, and loads), or for a capacity of
    the draws (they hold no blocks)."""
    if kind == "draws" and blocks is not None:
        raise ConfigError(
            "kv_store_blocks",
            blocks,
            "None with kv_store='draws' (a capacity is the offload store's)",
        )
    if kind == "draws":
        return RemoteKv(
            seed, block_size, sync_loads=sync_loads, pending_lookups=pending_lookups, loads=loads
        )
    if kind != "offload":
        raise ConfigError("kv_store", kind, f"one of {', '.join(KV_STORES)}")
    if pending_lookups or not loads:
        raise ConfigError(
            "kv_store",
            kind,
            "draws with kv_pending_lookups or kv_role='kv_producer' (the offload store puts "
            "lookups off itself and loads what it stored)",
        )
    return OffloadStore(seed, block_size, sync_loads=sync_loads, capacity=blocks)


def program_seed(program: CoreProgram) -> int:
    """The seed of a program's own draws (speculative drafts, the KV connector's store): a hash
    of its text, so each program draws its own and the same every run (a program without
    session inputs hashes as it did before `inputs` existed, a request without a cache read
    limit, adapter or scripted outputs as before `ArRequest.cache_read_limit`, `lora` and
    `outputs` did, and a configuration
    without drafts or adapters as before `ArConfig.num_speculative_tokens`,
    `num_lookahead_tokens`, `num_drafting_slots` and `max_loras` did)."""
    text = repr(program).replace(", outputs=None)", ")")
    text = text.replace(", lora=None)", ")").replace(", cache_read_limit=None)", ")")
    text = text.replace(", max_loras=0)", ")")
    for field in ("num_drafting_slots", "num_lookahead_tokens", "num_speculative_tokens"):
        text = text.replace(f", {field}=0)", ")")
    if not program.inputs:
        text = text.replace(", inputs=()", "")
    return zlib.crc32(text.encode())


@dataclass(frozen=True, slots=True)
class LoopOptions:
    """How `run_loop` and `check_both` run a program, beyond the program itself.

    `mutate` (a seeded bug) and `pipeline_parallel_size` apply to the asynchronous loop only
    (the synchronous loop is the control); `fix` (a candidate fix such as
    `integrations.vllm.preempted_cache_fix.apply_preempted_cache_fix`), `speculative_tokens`
    drafts by `speculative_method`, and `structured_output` (every other request guided by
    `integrations.vllm.structured`'s grammar) apply to both. `keyed_drafts` makes the
    asynchronous loop's model runner hand back every request's latest drafts for a deferred
    batch rather than the last batch's (`SpeculativeModel.take_drafts`); `late_grammars`
    compiles each grammar some engine steps after submission, and one in six not at all
    (`integrations.vllm.structured.LateGrammars`); `reasoning` gives every guided request 1-3
    reasoning tokens and a reasoning end before its guided content (`ScriptReasoner`);
    `kv_connector` (a `kv_load_failure_policy`) serves both loops with
    `integrations.vllm.kv_connector`'s connector, its store's draws seeded by the program
    (`kv_sync_loads=False`: every load asynchronous; `kv_load_failures=False`: no load fails;
    `kv_pending_lookups`: one request in four
    first told "ask again later"; `kv_role="kv_producer"`: the connector only sends;
    `kv_store="offload"`: a content-addressed store, holding at most `kv_store_blocks` blocks if
    given, refused beside `sliding_window`; beside it the connector moves every group's
    blocks); `offload_chunks` serves both loops with vLLM's own `OffloadingConnector` over a CPU
    store of that many chunks (`offload_outputs`: generated tokens' blocks too;
    `offload_sync_loads`: hits may load synchronously; `offload_blocks_per_chunk`: GPU blocks a
    CPU chunk holds), its worker `integrations.vllm.offloading_worker`'s; `cache_resets` resets
    the prefix cache and the connector's before one engine step in 16, as a weight update does.
    `sliding_window` serves both loops a hybrid KV cache: a sliding-window group of that many
    tokens beside the full-attention one (`integrations.vllm.adapter.hybrid_groups`), each with
    the pool the program names (`hybrid_pool`); `retention_interval` is vLLM's
    `prefix_cache_retention_interval` for it (0, vLLM's default; None: dense), and
    `window_block_scale` the window group's blocks, that many times the program's block size
    (`full_block_scale` the full-attention group's, beside a window of the program's blocks).
    `mamba` serves a Mamba group beside the full-attention one (and the window, if any), the
    blocks `mamba_block_scale` times the program's with prefix caching (every attention
    group's too, as vLLM's platform sizes them), its layers exporting
    internal prefill checkpoints on a grid of `mamba_checkpoint_alignment` tokens (None:
    none). The speculative model and the connector's store draw from `draw_seed`, by default a
    hash of the program's text (`program_seed`); `integrations.vllm.shrink` holds it at the
    original program's while it changes the program. `watermark`, `max_active_seqs`,
    `prefill_interval`, `adaptive_threshold` and `reserve_full_isl` are vLLM's admission
    settings (`admission`; `integrations.vllm.admission_knobs`), their rules checked where one
    is set. `max_inflight_kv_loads` is vLLM 0.34.0's `max_num_inflight_kv_loads` (with a KV
    connector or vLLM's offloading connector; rule `inflight_kv_loads`), `cache_aware_window`
    and `cache_aware_threshold` its cache-aware admission (rule `cache_aware_order`,
    `integrations.vllm.cache_aware_check`). `cache_read_limits`
    gives the program's requests cache read limits in turn (none, skip the cache, score the
    prompt from a row on: `integrations.vllm.cache_reads`; rule `cache_read_limit`).
    `encoder` gives every prompt multimodal items and vLLM's scheduler its encoder budget and
    cache (`integrations.vllm.encoder_inputs`; rules `encoder_output_ready`, `encoder_budget`,
    `encoder_cache_capacity`, `encoder_cache_agrees`, `mm_input_chunked`,
    `no_chunking_when_disabled`, `encoder_refs_released`). With
    `trace` (a list) the loop appends a line per event to it (`integrations.vllm.trace`)."""

    mutate: Callable[[Any], None] | None = None
    fix: Callable[[Any], None] | None = None
    pipeline_parallel_size: int = 1
    speculative_tokens: int = 0
    speculative_method: str = "ngram"
    structured_output: bool = False
    keyed_drafts: bool = False
    late_grammars: bool = False
    reasoning: bool = False
    kv_connector: str | None = None
    kv_sync_loads: bool = True
    kv_pending_lookups: bool = False
    kv_load_failures: bool = True
    kv_role: str = "kv_both"
    kv_store: str = "draws"
    kv_store_blocks: int | None = None
    offload_chunks: int | None = None
    offload_outputs: bool = False
    offload_sync_loads: bool = False
    offload_blocks_per_chunk: int = 1
    offload_self_describing_events: bool = False
    cache_resets: bool = False
    sliding_window: int | None = None
    retention_interval: int | None = 0
    window_block_scale: int = 1
    mamba: bool = False
    mamba_block_scale: int = 1
    mamba_checkpoint_alignment: int | None = None
    full_block_scale: int = 1
    kv_events: bool = False
    kv_report_mode: str = "incremental"
    loras: int = 0
    max_loras: int = 1
    pauses: str | None = None
    watermark: float = 0.0
    max_active_seqs: int | None = None
    prefill_interval: int = 1
    adaptive_threshold: bool = False
    reserve_full_isl: bool = True
    max_inflight_kv_loads: int | None = None
    cache_aware_window: int = 0
    cache_aware_threshold: float = 0.5
    cache_read_limits: bool = False
    encoder: EncoderOptions | None = None
    draw_seed: int | None = None
    trace: list[str] | None = None

    def loop(self, program: CoreProgram, async_scheduling: bool) -> CoreRun:
        """One loop over `program`, checked. The speculative model's and the store's draws are
        seeded by `draw_seed`, else by the program's text."""
        seeded = self.mutate if async_scheduling else None
        fix = self.fix
        program = self.limited(program)

        def patch(sched: Any) -> None:
            for change in (fix, seeded):
                if change is not None:
                    change(sched)

        loop = EngineCoreLoop(
            program.config,
            async_scheduling=async_scheduling,
            mutate=patch,
            pipeline_parallel_size=self.pipeline_parallel_size if async_scheduling else 1,
            speculative_tokens=self.speculative_tokens,
            speculative_method=self.speculative_method,
            structured_output=self.structured_output,
            keyed_drafts=self.keyed_drafts,
            late_grammars=self.late_grammars,
            reasoning=self.reasoning,
            # each program its own draws (one seed for all would reject every first draft alike)
            draft_seed=program_seed(program) if self.draw_seed is None else self.draw_seed,
            kv_connector=self.kv_connector,
            kv_sync_loads=self.kv_sync_loads,
            kv_pending_lookups=self.kv_pending_lookups,
            kv_load_failures=self.kv_load_failures,
            kv_role=self.kv_role,
            kv_store=self.kv_store,
            kv_store_blocks=self.kv_store_blocks,
            offloading=self.offloading,
            cache_resets=self.cache_resets,
            sliding_window=self.sliding_window,
            retention_interval=self.retention_interval,
            window_block_scale=self.window_block_scale,
            mamba=self.mamba,
            mamba_block_scale=self.mamba_block_scale,
            mamba_checkpoint_alignment=self.mamba_checkpoint_alignment,
            full_block_scale=self.full_block_scale,
            kv_events=self.kv_events,
            kv_report_mode=self.kv_report_mode,
            loras=self.loras,
            max_loras=self.max_loras,
            pauses=self.pauses,
            admission=self.admission,
            settings_034=Vllm034Settings(
                cache_aware_window=self.cache_aware_window,
                cache_aware_threshold=self.cache_aware_threshold,
                max_inflight_kv_loads=self.max_inflight_kv_loads,
            ),
            encoder=self.encoder,
            trace=self.trace,
        )
        return loop.run(program)

    def limited(self, program: CoreProgram) -> CoreProgram:
        """`program` as the loop runs it: with `cache_read_limits`, its requests' limits set
        (`with_cache_read_limits`, as the loaded release bounds them); else unchanged. Setting
        them again gives the same limits (each request's turn is its name's)."""
        if not self.cache_read_limits:
            return program
        bounded = VLLM_CACHE_READ_LIMITS is CacheReadLimits.BOUNDED
        limited: CoreProgram = with_cache_read_limits(program, bounded=bounded)
        return limited

    @property
    def admission(self) -> AdmissionKnobs:
        """vLLM's admission settings as `watermark`, `max_active_seqs`, `prefill_interval`,
        `adaptive_threshold` and `reserve_full_isl` say (`integrations.vllm.admission_knobs`)."""
        return AdmissionKnobs.of(self)

    @property
    def offloading(self) -> OffloadingOptions | None:
        """vLLM's own offloading connector as `offload_chunks` (None: not served),
        `offload_outputs` and `offload_sync_loads` say."""
        if self.offload_chunks is None:
            if (
                self.offload_outputs
                or self.offload_sync_loads
                or self.offload_blocks_per_chunk != 1
                or self.offload_self_describing_events
            ):
                raise ConfigError(
                    "offload_chunks",
                    None,
                    "an int >= 1 with offload_outputs, offload_sync_loads, "
                    "offload_blocks_per_chunk or offload_self_describing_events (they are "
                    "options of vLLM's offloading connector)",
                )
            return None
        return OffloadingOptions(
            self.offload_chunks,
            outputs=self.offload_outputs,
            sync_loads=self.offload_sync_loads,
            blocks_per_chunk=self.offload_blocks_per_chunk,
            self_describing_events=self.offload_self_describing_events,
        )


def run_loop(
    program: CoreProgram, *, async_scheduling: bool, options: LoopOptions = LoopOptions()
) -> CoreRun:
    """Run `program` through one loop, as `check_both` runs it; raise `EngineCoreViolation`
    naming the loop on the first rule broken. For checks that want each loop's verdict even
    when the other fails."""
    return run_named(async_scheduling, partial(options.loop, program))


def check_both(
    program: CoreProgram, options: LoopOptions = LoopOptions()
) -> tuple[CoreRun, CoreRun]:
    """Run `program` through the synchronous loop and the asynchronous one, each checked, as
    `options` says; raise `EngineCoreViolation` naming the loop on the first rule broken. The
    synchronous loop is the control: the same checks on vLLM's default-off path."""
    return run_both(partial(options.loop, program))


__all__ = [
    "ABORTED",
    "ASYNC_BATCH_QUEUE",
    "KV_STORES",
    "RULES",
    "SHARED_PROMPT_BASE",
    "CoreProgram",
    "CoreRun",
    "EngineCoreLoop",
    "EngineCoreViolation",
    "LoopOptions",
    "check_both",
    "core_program",
    "program_seed",
    "run_loop",
]
