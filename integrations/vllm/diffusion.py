"""vLLM 0.33.0's diffusion-LLM (dLLM) path: its own `DiffusionScheduler` and
`DiffusionAsyncScheduler` in the engine-core loop, with a fabricated denoising model, and the
checks that hold of both.

How vLLM serves a dLLM (`vllm/v1/core/sched/diffusion_scheduler.py`, `vllm/config/diffusion.py`,
the DiffusionGemma runner in `vllm/model_executor/models/diffusion_gemma.py`): a request's prompt
is prefilled causally (chunked by the token budget, no token sampled); then it generates through
a *canvas* of `canvas_length` positions (or the request's own narrower
`diffusion_canvas_length`), carried on the speculative-decoding path: each engine step schedules
the canvas as the request's spec tokens. A denoise step reads the KV and samples nothing, so vLLM
rolls `num_computed_tokens` back by the whole canvas; once the canvas converges (stable and
confident, or `max_denoising_steps`), the next step is a commit: it writes the canvas's KV and
emits it as `canvas` sampled tokens; then a new canvas starts. A read-only request emits its one
canvas on the converging step, without a commit. With async scheduling (vLLM's default on CUDA)
the scheduler runs a step ahead with placeholder spec tokens.

`DllmCoreLoop` drives vLLM's real scheduler (the class vLLM itself picks for a diffusion model)
the way `EngineCore` does: `step()` then `post_step()` (the runner's canvas handed back through
`update_draft_token_ids`) synchronously, `step_with_batch_queue` with a batch queue of two
asynchronously. The runner is fabricated (`_Runner`): per request it counts prefill tokens, then
denoise steps per canvas (the request's `converge_after`, capped by `diffusion_max_steps` and
the served `max_denoising_steps`, as the runner caps it), commits on the step after convergence,
and fixes each output token by request and output index. Checked, whatever the timing:

- `output_content` / `finish_reason`: every request's output is exactly its own tokens 1..k (k
  its stop index or max_tokens; an aborted request's a prefix) with the reason k implies;
- `canvas_whole`: every canvas vLLM schedules is the request's whole canvas, cut only where it
  reaches `max_model_len` (the one cut vLLM's runner is written for: "Equals CL except when a
  canvas was truncated near max_model_len"), and only after the request's prefill;
- `kv_bounded`: denoising never grows a request's KV: it holds at most its tokens (prompt and
  accepted outputs) plus one canvas per batch in flight, in whole blocks;
- `token_budget`, `seat_cap`, `admission_order`, `preemption_victim`, `kv_covers_scheduled`,
  `runner_tables`: the decisions of each `schedule()` call, the KV they need and the block
  tables the model runner is handed, as `integrations.vllm.core_loop.BatchQueueLoop`'s
  `check_decisions` / `check_kv_covers` / `check_runner_tables` state them (vLLM's diffusion
  path schedules FCFS);
- `pp_cadence`: with `pipeline_parallel_size` = p, two canvas steps of one request are at least
  p schedules apart (vLLM: "V2+PP+async: enforce `pp_size` steps between same-req decodes to
  match worker-side sampled-tokens broadcast slot ring cadence");
- `kv_writes`: a canvas's positions lie in blocks the request holds alone and the prefix cache
  does not hold: a denoise step writes provisional KV there (rewritten by the next step), which
  no other request may read. (A prefill chunk may write a block that a request admitted in the
  same step already hits: vLLM caches a block when it is scheduled, and each layer writes its
  KV before attending, so that is by design.)
- `pool_accounting`, `no_leak`, `idle_step` (the synchronous loop), `progress`,
  `implementation_error`: as in `integrations.vllm.engine_core`.

With `pipeline_parallel_size` = p > 1 (asynchronous loop only) the batch queue holds p + 1
batches, vLLM's `max_concurrent_batches` for its V2 model runner, and the scheduler holds a
request back until p steps after its last canvas step (`next_decode_eligible_step`); the
checks are the same, with `pp_cadence` binding.

With `enable_prefix_caching` (vLLM's default for a decoder; `dllm_program(...,
prefix_caching=True)` shares prompt prefixes) requests hit blocks other requests filled, and
`pool_accounting` counts references; `kv_writes` is what binds.

`policy="priority"` serves under vLLM's priority policy (`dllm_program(...,
priority_policy=True)`): `admission_order` and `preemption_victim` follow (priority, arrival).

With `kv_events` vLLM's KV cache events are read as a router reads them: `kv_events` (the keys
they leave cached are the prefix cache's) and `kv_event_content` (each store names its blocks'
tokens, parent key and adapter). With `loras` = N the requests run LoRA adapters in turn and
`max_loras` is checked (`integrations.vllm.lora_rules`): a request whose adapter finds no room
may be passed (`admission_order`).

Structured output and seeded or pinned canvases are off.
"""

from __future__ import annotations

import importlib
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from integrations.vllm.adapter import (
    VllmModules,
    block_tables,
    build_scheduler,
    check_loras,
    load_vllm,
    lora_of,
    tiny_model_config,
    v2_model_runner,
    vllm_config_error,
)
from integrations.vllm.admission_check import ADMISSION_RULES, AdmissionCheck
from integrations.vllm.admission_knobs import AdmissionKnobs
from integrations.vllm.core_loop import (
    ABORTED,
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
)
from integrations.vllm.custom_scheduler import loop_class
from integrations.vllm.kv_event_content import EventContent
from integrations.vllm.kv_events import KvEventView, check_kv_events
from integrations.vllm.lora_rules import check_adapter_limit, waits_for_adapter
from integrations.vllm.pauses import PauseDriver, check_pause_mode
from integrations.vllm.release_api import (
    check_scheduler_settings,
    resumed_req_ids,
    runner_output,
)
from integrations.vllm.settings_034 import Vllm034Settings
from integrations.vllm.token_ids import output_token_id, stop_token_id, unshared_prompt_token
from spec.errors import (
    ConfigError,
    DuplicateRequest,
    InvalidRequest,
    PromptTooLong,
    RequestTooLarge,
    UnknownRequest,
)

RULES = (
    "output_content",
    "finish_reason",
    "canvas_whole",
    "kv_bounded",
    *SCHEDULE_RULES,
    "kv_writes",
    "kv_events",
    "kv_event_content",
    "max_loras",
    *ADMISSION_RULES,
    "cache_aware_order",
    "pause",
    "pool_accounting",
    "no_leak",
    "idle_step",
    "progress",
    "implementation_error",
)

#: Token i of the prompt that requests with `shared_prompt` share is SHARED_PROMPT_BASE + i.
SHARED_PROMPT_BASE = 2_000_000

#: The id every fabricated canvas position holds (vLLM only counts them: no grammar is set).
CANVAS_TOKEN = 3


@dataclass(frozen=True, slots=True)
class DllmServing:
    """How the dLLM is served: vLLM's `DiffusionConfig` (`canvas_length`,
    `max_denoising_steps`), its KV cache (`block_size` tokens a block, `num_blocks` blocks, block
    0 the null block), its scheduler limits, and its pipeline-parallel stages (vLLM's
    `ParallelConfig.pipeline_parallel_size`; only the asynchronous loop runs more than one), and
    whether prefix caching is on (vLLM's default for a decoder; off unless asked here), the
    scheduling policy (`fcfs`, vLLM's default, or `priority`), whether vLLM publishes KV
    cache events (`kv_events`: the loop then reads them as a router does and checks them,
    `integrations.vllm.kv_events`), and the LoRA adapters served (`loras`: request i runs
    adapter i mod (loras + 1), 0 the base model, `integrations.vllm.adapter.lora_of`; at most
    `max_loras` at once, vLLM's `LoRAConfig`), and whether generation is paused now and then,
    as RL trainers pause it around a weight update (`pauses`: a mode of vLLM's
    `pause_scheduler`, `integrations.vllm.pauses`), and vLLM's admission settings (`watermark`,
    `max_active_seqs`, `prefill_interval`, `adaptive_threshold`, `reserve_full_isl`:
    `admission`, checked by `integrations.vllm.admission_check` where one is set), and vLLM
    0.34.0's cache-aware admission (`cache_aware_window`, `cache_aware_threshold`:
    `settings_034`; with prefix caching under FCFS, rule `cache_aware_order`,
    `integrations.vllm.cache_aware_check`). Chunked prefill is on (vLLM's default)."""

    canvas_length: int
    max_denoising_steps: int
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    pipeline_parallel_size: int = 1
    enable_prefix_caching: bool = False
    policy: str = "fcfs"
    kv_events: bool = False
    loras: int = 0
    max_loras: int = 1
    pauses: str | None = None
    watermark: float = 0.0
    max_active_seqs: int | None = None
    prefill_interval: int = 1
    adaptive_threshold: bool = False
    reserve_full_isl: bool = True
    cache_aware_window: int = 0
    cache_aware_threshold: float = 0.5

    def __post_init__(self) -> None:
        check_loras(self.loras, self.max_loras)
        check_pause_mode(self.pauses)
        _ = self.admission, self.settings_034  # the settings validate themselves (ConfigError)
        for name in (
            "canvas_length",
            "max_denoising_steps",
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "pipeline_parallel_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, "an integer >= 1")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ConfigError("enable_prefix_caching", self.enable_prefix_caching, "True or False")
        if not isinstance(self.kv_events, bool):
            raise ConfigError("kv_events", self.kv_events, "True or False")
        if self.policy not in ("fcfs", "priority"):
            raise ConfigError("policy", self.policy, "'fcfs' or 'priority' (vLLM's policies)")
        if isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int):
            raise ConfigError("num_blocks", self.num_blocks, "an integer >= 2")
        if self.num_blocks < 2:
            raise ConfigError("num_blocks", self.num_blocks, ">= 2 (block 0 is vLLM's null block)")
        if self.max_num_batched_tokens < self.canvas_length:
            raise ConfigError(
                "max_num_batched_tokens",
                self.max_num_batched_tokens,
                f">= canvas_length ({self.canvas_length}): one canvas must fit a step",
            )

    def blocks_for(self, tokens: int) -> int:
        """The KV blocks `tokens` tokens take (rounded up)."""
        return -(-tokens // self.block_size)

    @property
    def admission(self) -> AdmissionKnobs:
        """vLLM's admission settings as the fields of those names say (`integrations.vllm.
        admission_knobs`)."""
        return AdmissionKnobs.of(self)

    @property
    def settings_034(self) -> Vllm034Settings:
        """vLLM 0.34.0's settings as `cache_aware_window` and `cache_aware_threshold` say
        (`integrations.vllm.settings_034`)."""
        return Vllm034Settings(
            cache_aware_window=self.cache_aware_window,
            cache_aware_threshold=self.cache_aware_threshold,
        )

    @property
    def async_batch_queue(self) -> int:
        """Batches in flight under async scheduling: vLLM's `max_concurrent_batches` with its
        V2 model runner (which diffusion needs), `pipeline_parallel_size + 1`."""
        return self.pipeline_parallel_size + 1


@dataclass(frozen=True, slots=True)
class DllmRequest:
    """A request and the fabricated model's script for it.

    converge_after: denoise steps until each canvas converges (canvas j uses entry j, cycled;
        the runner caps it at `max_steps` and the served `max_denoising_steps`).
    stop_after: the output index whose token is the request's stop token (None: none).
    width: `diffusion_canvas_length` (None: the served canvas).
    read_only: `diffusion_read_only` (one canvas, emitted on the converging step).
    max_steps: `diffusion_max_steps`.
    shared_prompt: the prompt is the first `prompt_len` tokens of one prompt all such requests
        share (`SHARED_PROMPT_BASE + i`), so with prefix caching they hit each other's blocks;
        otherwise its tokens are the request's own.
    priority: vLLM's request priority (smaller first), used under the priority policy.
    """

    request_id: str
    prompt_len: int
    max_tokens: int
    converge_after: tuple[int, ...] = (1,)
    stop_after: int | None = None
    width: int | None = None
    read_only: bool = False
    max_steps: int | None = None
    shared_prompt: bool = False
    priority: int = 0


@dataclass(frozen=True, slots=True)
class DllmProgram:
    """A serving configuration and, per engine step, the requests that arrive and the ids
    aborted before it (then the loop drains)."""

    serving: DllmServing
    arrivals: tuple[tuple[DllmRequest, ...], ...]
    aborts: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        check_program_steps("DllmProgram", self.arrivals, self.aborts)


@dataclass(frozen=True, slots=True)
class DllmRun:
    """What one loop did: outputs and reasons per request, and how often each path was taken."""

    outputs: dict[str, tuple[int, ...]]
    reasons: dict[str, str]
    engine_steps: int
    schedules: int
    denoise_steps: int  # canvas steps that sampled nothing
    commits: int  # canvas steps that emitted their canvas (read-only emissions included)
    cut_canvas_steps: int  # canvas steps cut where the canvas reaches max_model_len
    preemptions: int
    cadence_waits: int  # running requests held back for the pipeline cadence, summed per schedule
    prefix_hit_tokens: int  # prompt tokens found in the prefix cache at (re)admission
    aborts_in_flight: int  # aborts of a request with a step in flight
    discarded: int  # scheduled steps of a request that had finished when their output came
    discarded_read_only: int  # of those, steps of a read-only request
    short_canvas_steps: int  # canvases cut below their whole width (only when tolerated)
    scheduled_tokens: int  # tokens of every schedule() call, prefill chunks and canvases
    canvas_waits: int  # schedule() calls that left out a running request past its prefill
    longest_canvas_wait: int  # the most such calls in a row for one request
    #: engine steps from each request's arrival to the step whose output finished it (requests
    #: that finished; aborted ones are left out)
    latencies: dict[str, int] = field(default_factory=dict)
    events_stored: int = 0  # keys KV cache events announced stored (`kv_events`)
    events_removed: int = 0  # keys they announced removed
    events_keys_described: int = 0  # keys of stores checked against their blocks' content
    adapter_waits: int = 0  # requests left waiting for room for their LoRA adapter, per call
    pauses: int = 0  # generation paused (`pauses`)
    pause_preempted: int = 0  # running requests a pause's cache reset preempted
    watermark_admissions: int = 0  # calls that admitted a request while one ran (watermark)
    capped_admissions: int = 0  # calls that admitted a request under max_num_active_seqs
    capped_beside_sessions: int = 0  # of those, with a session waiting for input counted
    held_steps: int = 0  # calls the prefill cadence held (no prefill allowed)
    backed_up_releases: int = 0  # release steps that left requests waiting (cadence lifted)
    emptied_holds: int = 0  # held calls that preempted every decoding request
    window_engaged: int = 0  # admission phases the cache-aware window engaged in
    window_moved: int = 0  # of those, phases that moved the waiting queue
    window_cut: int = 0  # of those, phases ranking a request below its cached prefix (limit)
    window_passes: int = 0  # requests another queue passed behind a head the window moved


@dataclass
class _Counts(LoopCounts):
    denoise_steps: int = 0
    commits: int = 0
    cut_canvas_steps: int = 0
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    discarded_read_only: int = 0
    short_canvas_steps: int = 0
    scheduled_tokens: int = 0
    canvas_waits: int = 0
    longest_canvas_wait: int = 0
    adapter_waits: int = 0


@dataclass
class _Slot:
    """The fabricated runner's state of one request (the runner's own, ahead of the scheduler
    under async scheduling)."""

    prefill_len: int
    computed: int
    emitted: int
    denoising: bool = False
    steps: int = 0
    commit_next: bool = False


@dataclass
class _Runner:
    """The fabricated DiffusionGemma runner: what it does with each scheduled batch, in
    execution order."""

    loop: DllmCoreLoop
    slots: dict[str, _Slot] = field(default_factory=dict)

    def execute(self, out: Any) -> tuple[Any, Any]:
        """The model output of batch `out` and the canvases it leaves (`DraftTokenIds`)."""
        loop, v = self.loop, self.loop.v
        reqs = loop.sched.requests
        for rid in (out.preempted_req_ids or set()) | set(out.finished_req_ids):
            self.slots.pop(rid, None)
        fresh = [r.req_id for r in out.scheduled_new_reqs]
        fresh += sorted(resumed_req_ids(out))
        for rid in fresh:
            req = reqs[rid]
            done = req.num_computed_tokens - out.num_scheduled_tokens[rid]
            loop.n.prefix_hit_tokens += done
            self.slots[rid] = _Slot(req.num_tokens, done, req.num_output_tokens)
        ids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in ids:
            canvas = out.scheduled_spec_decode_tokens.get(rid)
            sampled.append(self._step(rid, out.num_scheduled_tokens[rid], len(canvas or ())))
        width = loop.serving.canvas_length
        output = runner_output(v.outputs.ModelRunnerOutput, ids, sampled_token_ids=sampled)
        drafts = v.outputs.DraftTokenIds(ids, [[CANVAS_TOKEN] * width for _ in ids])
        return output, drafts

    def _step(self, rid: str, scheduled: int, canvas: int) -> list[int]:
        loop = self.loop
        slot = self.slots[rid]
        spec = loop.specs[rid]
        if canvas == 0:  # a prefill chunk: no token sampled; the canvas starts when it ends
            slot.computed += scheduled
            slot.denoising = slot.computed >= slot.prefill_len
            return []
        loop.check_canvas(rid, slot, canvas)
        if not slot.commit_next:
            slot.steps += 1
            converged = slot.steps >= loop.converge_after(spec, slot.emitted)
            if not (converged and spec.read_only):
                slot.commit_next = converged
                loop.n.denoise_steps += 1
                return []
        slot.commit_next, slot.steps = False, 0
        loop.n.commits += 1
        tokens = [loop.token(rid, slot.emitted + i) for i in range(1, canvas + 1)]
        slot.emitted += canvas
        return tokens


class DllmCoreLoop(BatchQueueLoop[_Counts]):
    """vLLM's engine core over its real diffusion scheduler (`integrations.vllm.core_loop`):
    `DiffusionAsyncScheduler` with a batch queue of 2 (p + 1 with p pipeline stages), or
    `DiffusionScheduler` with 1 and `post_step`'s canvas hand-back; the runner fabricated.
    `mutate`, if given, is applied to the scheduler once built (seeded bugs, or the candidate
    fix of `integrations.vllm.whole_canvas_fix`).

    `tolerate_short_canvases=True` relaxes `canvas_whole` for one purpose, measuring what vLLM
    as released does where it cuts canvases (`scripts/vllm_whole_canvas_cost.py`): a canvas
    shorter than its whole width is counted (`short_canvas_steps`) and served as scheduled;
    a canvas before the prefill, or wider than whole, still fails. Every other rule holds."""

    drain_limit = 20_000

    def __init__(
        self,
        serving: DllmServing,
        *,
        async_scheduling: bool,
        mutate: Callable[[Any], None] | None = None,
        tolerate_short_canvases: bool = False,
    ) -> None:
        if serving.pipeline_parallel_size > 1 and not async_scheduling:
            raise ConfigError(
                "pipeline_parallel_size",
                serving.pipeline_parallel_size,
                "1 in the synchronous loop (pipeline parallelism is checked with async "
                "scheduling: vLLM's V2 model runner, which diffusion needs, runs it that way)",
            )
        self.serving = serving
        self.v: VllmModules = load_vllm()
        sched = _build(self.v, serving, async_scheduling)
        #: A router's view of the KV cache events vLLM publishes (`serving.kv_events`).
        self.events: KvEventView | None = None
        #: Every vLLM `Request` given to the scheduler, by id, kept after it ends, and what each
        #: store event says of its blocks, checked against them (`kv_event_content`).
        self.submitted: dict[str, Any] = {}
        self.event_content: EventContent | None = None
        if serving.kv_events:
            self.events = KvEventView()
            sched.kv_event_publisher = self.events
            self.event_content = EventContent.for_scheduler(sched, self.v.kv_utils, self.submitted)
        if mutate is not None:
            mutate(sched)
        #: The rules of vLLM's admission settings, where any differs from vLLM's default.
        self.admission: AdmissionCheck | None = (
            AdmissionCheck(serving.admission, sched) if serving.admission.any else None
        )
        super().__init__(
            sched,
            _Counts(),
            async_scheduling=async_scheduling,
            queue_size=serving.async_batch_queue if async_scheduling else 1,
        )
        self.runner: _Runner = _Runner(self)
        self.canvas_trace = True
        self.tolerate_short_canvases = tolerate_short_canvases
        self.specs: dict[str, DllmRequest] = {}
        self.arrival_of: dict[str, int] = {}
        self.arrived_at: dict[str, int] = {}  # engine steps run before the request arrived
        self.latencies: dict[str, int] = {}
        self.wait_streak: dict[str, int] = {}
        if (
            serving.cache_aware_window
            and serving.policy == "fcfs"
            and serving.enable_prefix_caching
        ):
            # a diffusion request has no read limit: it reads its whole hit
            self.serve_cache_aware(
                serving.cache_aware_window, serving.cache_aware_threshold, serving.block_size
            )
        # prefix caching's block hashes: vLLM's own, as its input processor attaches them
        self.hasher: Any = (
            self.v.kv_utils.get_request_block_hasher(serving.block_size, self.v.hashing.sha256)
            if serving.enable_prefix_caching
            else None
        )

    # ------------------------------------------------------------------ requests
    def submit(self, request: DllmRequest) -> None:
        """Add a request as vLLM's input processor would hand it over (its diffusion options
        validated and normalised by vLLM's own `validate_diffusion_sampling_params`). Raises a
        `RequestError` for one vLLM would refuse or that can never fit."""
        rid = request.request_id
        if rid in self.specs:
            raise DuplicateRequest(rid)
        _validate(self.serving, request)
        arrival = len(self.specs)
        extra: dict[str, Any] = {}
        if request.width is not None:
            extra["diffusion_canvas_length"] = request.width
        if request.read_only:
            extra["diffusion_read_only"] = True
        if request.max_steps is not None:
            extra["diffusion_max_steps"] = request.max_steps
        params = self.v.sampling.SamplingParams(
            max_tokens=request.max_tokens,
            stop_token_ids=[stop_token_id(arrival)],
            ignore_eos=True,
            extra_args=extra or None,
        )
        diffusion_utils = importlib.import_module("vllm.utils.diffusion")
        refused = importlib.import_module("vllm.exceptions").VLLMValidationError
        try:
            diffusion_utils.validate_diffusion_sampling_params(
                params, canvas_length=self.serving.canvas_length, vocab_size=128
            )
        except refused as err:
            raise InvalidRequest(rid, "diffusion options", extra, str(err)) from None
        _check_fits(self.serving, request)
        req = self.v.request.Request(
            request_id=rid,
            prompt_token_ids=[SHARED_PROMPT_BASE + i for i in range(request.prompt_len)]
            if request.shared_prompt
            else [unshared_prompt_token(arrival)] * request.prompt_len,
            sampling_params=params,
            pooling_params=None,
            arrival_time=float(arrival),
            priority=request.priority,
            block_hasher=self.hasher,
            lora_request=(
                self.v.lora.LoRARequest(f"adapter-{adapter}", adapter, f"/adapters/{adapter}")
                if (adapter := lora_of(arrival, self.serving.loras))
                else None
            ),
        )
        self.specs[rid] = request
        self.submitted[rid] = req
        self.arrival_of[rid] = arrival
        self.arrived_at[rid] = self.n.engine_steps
        self.outputs[rid] = []
        self.sched.add_request(req)
        if self.cache_aware is not None:
            self.cache_aware.submit(rid)
        if self.trace is not None:
            self.note(f"submit {rid}: {_describe(request)}")

    def abort(self, request_id: str) -> None:
        """Abort a live request (`EngineCore.abort_requests`); an unknown id is refused, one
        already finished is ignored (as vLLM ignores it)."""
        if request_id not in self.specs:
            raise UnknownRequest(request_id, len(self.specs))
        if request_id in self.reasons:
            return
        status = self.v.request.RequestStatus.FINISHED_ABORTED
        self.finish(request_id, lambda: self.sched.finish_requests([request_id], status))

    def run(self, program: DllmProgram) -> DllmRun:
        """The program (`BatchQueueLoop.play`), checked; what the loop did. With `pauses`,
        generation is paused before one engine step in 16 (a hash of the program and the
        step)."""
        if self.serving.pauses is not None:
            seed = zlib.crc32(repr(program.arrivals).encode())
            self.pause: PauseHook | None = PauseDriver(
                self.sched, self.serving.pauses, seed, note=self.note, abort=self.abort
            )
        self.play(program.arrivals, program.aborts, self.submit, self.abort)
        view, pause = self.events, self.pause
        return DllmRun(
            {rid: tuple(t) for rid, t in self.outputs.items()},
            dict(self.reasons),
            latencies=dict(self.latencies),
            events_stored=view.stored if view is not None else 0,
            events_removed=view.removed if view is not None else 0,
            events_keys_described=(
                self.event_content.checked if self.event_content is not None else 0
            ),
            pauses=pause.pauses if pause is not None else 0,
            pause_preempted=pause.preempted if pause is not None else 0,
            **(asdict(self.admission.counts) if self.admission is not None else {}),
            **(asdict(self.cache_aware.counts) if self.cache_aware is not None else {}),
            **asdict(self.n),
        )

    # ------------------------------------------------------------------ the loop's hooks
    def execute(self, out: Any) -> Any:
        """Count the batch's preemptions and run it on the fabricated runner: (the model output, the
        canvases it leaves as `DraftTokenIds`)."""
        self.n.preemptions += len(out.preempted_req_ids or ())
        return self.runner.execute(out)

    def check_pool(self, where: str) -> None:
        """`pool_accounting`, counting references when prefix caching is on."""
        check_pool(self.sched, self.serving.enable_prefix_caching, where)

    def before_schedule(self) -> None:
        """Count cadence waits and record the running order (for `check_decisions`)."""
        self.count_cadence_waits()
        self.record_running()
        if self.pause is not None:
            self.pause.before_schedule()
        if self.admission is not None:
            self.admission.before_schedule()

    def after_schedule(self, out: Any) -> None:
        """Check the call: `check_decisions`, `check_kv_covers`, `kv_writes`, `kv_bounded`, and
        `pp_cadence` over the requests scheduled a canvas; count its tokens and canvas waits."""
        s = self.serving
        self.check_cache_aware(out, held=self.admission is not None and self.admission.held)
        self.check_decisions(
            out,
            max_num_batched_tokens=s.max_num_batched_tokens,
            max_num_seqs=s.max_num_seqs,
            priority=s.policy == "priority",
        )
        self.check_kv_covers(out)
        self.check_idle_step(out)
        if self.admission is not None:
            self.admission.after_schedule(out, f"schedule {self.n.schedules}")
        if self.pause is not None:
            self.pause.check_schedule(out, f"schedule {self.n.schedules}")
        if s.loras:
            check_adapter_limit(self.sched, out, s.max_loras, f"schedule {self.n.schedules}")
            self.n.adapter_waits += sum(map(self.waits_for_adapter, self.waiting_requests()))
        self.check_writes(out)
        self.check_kv(f"after schedule() {self.n.schedules}")
        self.check_cadence(out.scheduled_spec_decode_tokens, self.serving.pipeline_parallel_size)
        self.n.scheduled_tokens += out.total_num_scheduled_tokens
        self.count_waits(out)

    def waits_for_adapter(self, request: Any) -> bool:
        """Whether `request` needs a LoRA adapter that the running requests' leave no room
        for (`lora_rules.waits_for_adapter`): `admission_order` lets it be passed."""
        return waits_for_adapter(self.sched, request, self.serving.max_loras)

    def count_waits(self, out: Any) -> None:
        """`canvas_waits` / `longest_canvas_wait`: running requests past their prefill (as the
        runner stands) that batch `out` leaves out."""
        for req in self.sched.running:
            rid = req.request_id
            slot = self.runner.slots.get(rid)
            if rid in out.num_scheduled_tokens or slot is None or not slot.denoising:
                self.wait_streak.pop(rid, None)
                continue
            streak = self.wait_streak[rid] = self.wait_streak.get(rid, 0) + 1
            self.n.canvas_waits += 1
            self.n.longest_canvas_wait = max(self.n.longest_canvas_wait, streak)

    def runner_output(self, executed: Any) -> Any:
        """The model output of the executed batch (its canvases go to `after_output`)."""
        return executed[0]

    def after_output(self, out: Any, executed: Any) -> None:
        """Synchronously, after a non-empty batch, hand the runner's canvases to
        `update_draft_token_ids` (`EngineCore.post_step`); check `kv_bounded`; record the latency of
        each request newly finished (not aborted)."""
        if not self.async_scheduling and out.total_num_scheduled_tokens > 0:
            # EngineCore.post_step: the runner's canvases become the requests' spec tokens
            drafts = executed[1]
            call_vllm("update_draft_token_ids", lambda: self.sched.update_draft_token_ids(drafts))
        where = f"after update_from_output() of schedule {self.n.schedules}"
        self.check_kv(where)
        if self.events is not None:
            stores = self.events.take_stores()
            if self.event_content is not None:
                self.event_content.check_stores(stores, where)
            check_kv_events(self.events, self.sched, self.v.kv_utils, where)
        for rid, reason in self.reasons.items():
            if reason != ABORTED and rid not in self.latencies:
                self.latencies[rid] = self.n.engine_steps - self.arrived_at[rid]

    def on_discarded(self, rid: str) -> None:
        """Count the discarded step when the request is read-only (`discarded_read_only`)."""
        self.n.discarded_read_only += self.specs[rid].read_only

    def reason(self, finish_reason: Any) -> str:
        """vLLM's `STOP` / `LENGTH` as "stop" / "length"; any other reason raises
        `EngineCoreViolation` (`finish_reason`)."""
        reasons = self.v.engine.FinishReason
        if finish_reason == reasons.STOP:
            return "stop"
        if finish_reason == reasons.LENGTH:
            return "length"
        raise EngineCoreViolation(
            "finish_reason",
            f"vLLM finished a request with {finish_reason!r} (the model gives none)",
        )

    # ------------------------------------------------------------------ the model's script
    def converge_after(self, spec: DllmRequest, emitted: int) -> int:
        """Denoise steps until the canvas after `emitted` outputs converges (the runner caps
        the request's `diffusion_max_steps` at the served `max_denoising_steps`)."""
        steps = spec.converge_after[(emitted // self.width(spec)) % len(spec.converge_after)]
        cap = self.serving.max_denoising_steps
        if spec.max_steps is not None:
            cap = max(1, min(spec.max_steps, cap))
        return min(steps, cap)

    def width(self, spec: DllmRequest) -> int:
        """`spec`'s canvas width: its `width` (`diffusion_canvas_length`), else the served one."""
        return spec.width if spec.width is not None else self.serving.canvas_length

    def token(self, rid: str, index: int) -> int:
        """Output token number `index` (1-based) of request `rid`."""
        spec, a = self.specs[rid], self.arrival_of[rid]
        if spec.stop_after is not None and index == spec.stop_after:
            return stop_token_id(a)
        return output_token_id(a, index)

    # ------------------------------------------------------------------ checks
    def check_canvas(self, rid: str, slot: _Slot, canvas: int) -> None:
        """`canvas_whole`: a canvas only after the prefill, and the request's whole canvas
        unless it reaches max_model_len from where the runner stands."""
        if not slot.denoising:
            raise EngineCoreViolation(
                "canvas_whole",
                f"{rid!r} was scheduled a canvas of {canvas} before its prefill finished "
                f"({slot.computed} of {slot.prefill_len} tokens)",
            )
        spec = self.specs[rid]
        position = spec.prompt_len + slot.emitted
        room = self.serving.max_model_len - position
        whole = min(self.width(spec), room)
        if canvas < whole and self.tolerate_short_canvases:
            self.n.short_canvas_steps += 1
            return
        if canvas != whole:
            raise EngineCoreViolation(
                "canvas_whole",
                f"{rid!r} was scheduled a canvas of {canvas} at position {position}, but its "
                f"canvas is {self.width(spec)} wide and {room} positions remain before "
                f"max_model_len={self.serving.max_model_len} (so {whole}); "
                f"schedule {self.n.schedules}",
            )
        if canvas < self.width(spec):
            self.n.cut_canvas_steps += 1

    def check_writes(self, out: Any) -> None:
        """`kv_writes`: the canvas positions batch `out` computes for a request (the `n` before
        its `num_computed_tokens`, which `schedule()` has advanced) lie in blocks it holds, each
        with a reference count of 1 and no block hash."""
        blocks = self.sched.kv_cache_manager.block_pool.blocks
        tables = block_tables(self.sched)
        size = self.serving.block_size
        for rid in out.scheduled_spec_decode_tokens:
            n = out.num_scheduled_tokens[rid]
            end = self.sched.requests[rid].num_computed_tokens
            table = tables.get(rid, ())
            for index in range((end - n) // size, (end - 1) // size + 1):
                block = blocks[table[index]] if index < len(table) else None
                if block is None or block.ref_cnt != 1 or block.block_hash is not None:
                    held = (
                        f"block {block.block_id} (reference count {block.ref_cnt}, "
                        f"{'in' if block.block_hash is not None else 'not in'} the prefix cache)"
                        if block is not None
                        else f"missing (it holds {len(table)} blocks)"
                    )
                    raise EngineCoreViolation(
                        "kv_writes",
                        f"schedule {self.n.schedules}: {rid!r} denoises canvas positions "
                        f"{end - n}..{end - 1}, but its block {index} is {held}",
                    )

    def check_kv(self, where: str) -> None:
        """`kv_bounded`: a request holds at most its tokens plus one canvas per batch in flight
        (as many as the batch queue holds), in whole blocks."""
        s = self.serving
        for rid, table in block_tables(self.sched).items():
            req = self.sched.requests[rid]
            spec = self.specs[rid]
            bound = s.blocks_for(
                min(req.num_tokens + self.queue_size * self.width(spec), s.max_model_len)
            )
            if len(table) > bound:
                raise EngineCoreViolation(
                    "kv_bounded",
                    f"{where}: {rid!r} holds {len(table)} blocks ({len(table) * s.block_size} "
                    f"slots) for {req.num_tokens} tokens and at most {self.queue_size} canvas(es) "
                    f"of {self.width(spec)} in flight (at most {bound} blocks)",
                )

    def check_request(self, rid: str, tokens: Sequence[int]) -> None:
        """`output_content` / `finish_reason` of `rid` (`check_content`), max_tokens capped by the
        canvas for a read-only request (as vLLM caps it)."""
        spec = self.specs[rid]
        check_content(
            rid,
            tokens,
            self.reasons.get(rid),
            # vLLM caps a read-only request's max_tokens to its canvas
            max_tokens=min(spec.max_tokens, self.width(spec))
            if spec.read_only
            else spec.max_tokens,
            stop_after=spec.stop_after,
            token=lambda i: self.token(rid, i),
        )


def _describe(r: DllmRequest) -> str:
    """A request in a trace line: its sizes and the diffusion options it sets."""
    parts = [f"{r.prompt_len} prompt tokens", f"up to {r.max_tokens} output"]
    parts.append(f"canvases converge after {', '.join(map(str, r.converge_after))} steps")
    if r.stop_after is not None:
        parts.append(f"stops at output {r.stop_after}")
    if r.width is not None:
        parts.append(f"canvas {r.width} wide")
    if r.read_only:
        parts.append("read-only")
    if r.max_steps is not None:
        parts.append(f"at most {r.max_steps} denoise steps")
    if r.shared_prompt:
        parts.append("a shared prompt")
    if r.priority:
        parts.append(f"priority {r.priority}")
    return ", ".join(parts)


def validate_dllm_request(serving: DllmServing, request: DllmRequest) -> None:
    """Raise the `RequestError` `DllmCoreLoop.submit` would for `request` under `serving`
    before it asks vLLM (a bad field, longer than max_model_len, or more KV than the pool
    holds); vLLM's own check of the diffusion options runs only in `submit`."""
    _validate(serving, request)
    _check_fits(serving, request)


def _validate(serving: DllmServing, request: DllmRequest) -> None:
    rid = request.request_id
    if not isinstance(rid, str) or not rid:
        raise InvalidRequest(str(rid), "request_id", rid, "must be a non-empty string")
    for name in ("prompt_len", "max_tokens"):
        value = getattr(request, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequest(rid, name, value, "an integer >= 1")
    if not request.converge_after or any(
        isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in request.converge_after
    ):
        raise InvalidRequest(
            rid, "converge_after", request.converge_after, "a non-empty tuple of integers >= 1"
        )
    total = request.prompt_len + request.max_tokens
    if total > serving.max_model_len:
        raise PromptTooLong(rid, total, serving.max_model_len)


def _check_fits(serving: DllmServing, request: DllmRequest) -> None:
    """RequestTooLarge unless the pool holds the request's KV at most: every position up to
    max_model_len that its canvases in flight can reach."""
    rid, total = request.request_id, request.prompt_len + request.max_tokens
    width = request.width or serving.canvas_length
    in_flight = serving.async_batch_queue
    need = serving.blocks_for(min(total + in_flight * width, serving.max_model_len))
    if need > serving.num_blocks - 1:
        raise RequestTooLarge(
            rid, need * serving.block_size, (serving.num_blocks - 1) * serving.block_size
        )


def _build(v: Any, serving: DllmServing, async_scheduling: bool) -> Any:
    """vLLM's own scheduler for a diffusion model: `VllmConfig` resolves `scheduler_cls` to
    `DiffusionScheduler` or `DiffusionAsyncScheduler` by `async_scheduling`."""
    cfg = v.config
    diffusion = importlib.import_module("vllm.config.diffusion")
    newer = serving.settings_034.scheduler_settings()
    check_scheduler_settings(cfg.SchedulerConfig, newer)  # a setting this release lacks
    with v2_model_runner():
        try:
            scheduler_config = cfg.SchedulerConfig(
                max_num_seqs=serving.max_num_seqs,
                max_num_batched_tokens=serving.max_num_batched_tokens,
                max_model_len=serving.max_model_len,
                is_encoder_decoder=False,
                enable_chunked_prefill=True,
                async_scheduling=async_scheduling,
                policy=serving.policy,
                **serving.admission.scheduler_settings(serving.max_num_seqs),
                **newer,
            )
            cache_config = cfg.CacheConfig(
                block_size=serving.block_size,
                enable_prefix_caching=serving.enable_prefix_caching,
            )
            if async_scheduling:
                # vLLM's CPU platform turns async scheduling off ("not required on CPU"); the CUDA
                # platform keeps it. The scheduler class is chosen after the platform hook, so
                # name the one a GPU build picks.
                scheduler_config.scheduler_cls = (
                    "vllm.v1.core.sched.diffusion_scheduler.DiffusionAsyncScheduler"
                )
            vllm_config = cfg.VllmConfig(
                scheduler_config=scheduler_config,
                model_config=tiny_model_config(v, serving.max_model_len, diffusion=True),
                cache_config=cache_config,
                parallel_config=cfg.ParallelConfig(
                    pipeline_parallel_size=serving.pipeline_parallel_size
                ),
                diffusion_config=diffusion.DiffusionConfig(
                    canvas_length=serving.canvas_length,
                    max_denoising_steps=serving.max_denoising_steps,
                ),
                kv_events_config=(
                    cfg.KVEventsConfig(enable_kv_cache_events=True, publisher="null")
                    if serving.kv_events
                    else None
                ),
                lora_config=(
                    cfg.LoRAConfig(max_loras=serving.max_loras, max_lora_rank=8)
                    if serving.loras
                    else None
                ),
            )
        except ValueError as err:  # pydantic's ValidationError is a ValueError
            raise ConfigError(
                "serving", serving, f"a configuration vLLM accepts ({vllm_config_error(err)})"
            ) from None
        sched = build_scheduler(
            v,
            vllm_config,
            scheduler_config,
            cache_config,
            num_blocks=serving.num_blocks,
            async_scheduling=async_scheduling,
        )
        queue = vllm_config.max_concurrent_batches
    # vLLM's own class, or a subclass of it the user named (SCHEDSPEC_VLLM_SCHEDULER_CLS)
    want = loop_class(async_scheduling=async_scheduling, diffusion=True)
    if async_scheduling and queue != serving.async_batch_queue:
        raise ConfigError(
            "serving",
            serving,
            f"a configuration vLLM runs with {serving.async_batch_queue} batches in flight "
            f"(its max_concurrent_batches is {queue})",
        )
    if not isinstance(sched, want) or sched.num_spec_tokens != serving.canvas_length:
        raise ConfigError(
            "serving",
            serving,
            f"a configuration vLLM serves with its {want.__name__} and a canvas of "
            f"{serving.canvas_length} (it built {type(sched).__name__}, canvas "
            f"{sched.num_spec_tokens})",
        )
    return sched


#: Canvases of room every generated request leaves before max_model_len (see `dllm_program`).
END_MARGIN_CANVASES = 3


def dllm_program(
    seed: int,
    *,
    budget_binds: bool = False,
    reach_model_len: bool = False,
    prefix_caching: bool = False,
    priority_policy: bool = False,
) -> DllmProgram:
    """A random program: a small serving configuration, requests arriving over the first steps
    (some with a narrower canvas, some read-only, some with a stop token), and aborts of earlier
    requests before some steps.

    Drawn just inside the two findings (each tested on its own, in tests/test_real_vllm_dllm.py):
    the token budget never binds (`max_num_batched_tokens >= max_model_len + max_num_seqs *
    canvas_length`: a budget shared by the running requests cuts a canvas), and every request
    ends `END_MARGIN_CANVASES` canvases before max_model_len (asynchronously, vLLM cuts a canvas
    near max_model_len too early). The cut vLLM's runner is written for, at max_model_len
    itself, has its own test as well.

    `budget_binds=True` draws the same program with a token budget that binds instead: from one
    canvas (or `max_num_seqs`, vLLM's floor) up to one token short of every seat's canvas, with
    at least two seats. That is the space of the first finding, where unpatched vLLM cuts
    canvases and `integrations.vllm.whole_canvas_fix` is checked.

    `reach_model_len=True` draws requests with no margin: a prompt of up to half of
    max_model_len and max_tokens up to the rest, so a long request runs into max_model_len (the
    space of the second finding, where the async loop cuts a canvas early and
    `integrations.vllm.async_hold_fixes`' model-len hold is checked).

    `prefix_caching=True` draws the same program served with prefix caching on, and about half
    of its requests' prompts prefixes of one shared prompt (`DllmRequest.shared_prompt`; drawn
    from a second generator, so the rest of the program is the same).

    `priority_policy=True` serves the same program under vLLM's priority policy, each request
    given a priority in 0..2 (from a third generator)."""
    rnd = random.Random(seed)
    canvas = rnd.choice([2, 4, 8])
    block = rnd.choice([2, 4, 8, 16])
    max_model_len = rnd.choice([48, 64, 96])
    seqs = rnd.randint(1, 4)
    worst = -(-max_model_len // block)  # blocks for one request at max_model_len
    steps = rnd.randint(1, 4)
    num_blocks = 1 + worst + rnd.randint(0, 3 * worst)
    budget = rnd.choice([1, 2]) * (max_model_len + seqs * canvas)
    if budget_binds:
        seqs = max(seqs, 2)
        floor = max(canvas, seqs)
        budget = rnd.randint(floor, max(floor, seqs * canvas - 1))
    serving = DllmServing(
        canvas_length=canvas,
        max_denoising_steps=steps,
        block_size=block,
        num_blocks=num_blocks,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_prefix_caching=prefix_caching,
        policy="priority" if priority_policy else "fcfs",
    )
    sharing = random.Random(f"{seed}/shared-prompt")
    ranking = random.Random(f"{seed}/priority")
    arrivals: list[tuple[DllmRequest, ...]] = []
    aborts: list[tuple[str, ...]] = []
    seen: list[str] = []
    for step in range(rnd.randint(1, 6)):
        batch = tuple(
            replace(
                r,
                shared_prompt=prefix_caching and sharing.random() < 0.5,
                priority=ranking.randint(0, 2) if priority_policy else 0,
            )
            for r in (
                _request(
                    rnd, serving, f"r{step}_{i}", 0 if reach_model_len else END_MARGIN_CANVASES
                )
                for i in range(rnd.randint(0, 3))
            )
        )
        aborts.append(tuple(rid for rid in seen if rnd.random() < 0.1))
        arrivals.append(batch)
        seen.extend(r.request_id for r in batch)
    return DllmProgram(serving, tuple(arrivals), tuple(aborts))


def _request(rnd: random.Random, s: DllmServing, rid: str, margin: int) -> DllmRequest:
    room = s.max_model_len - margin * s.canvas_length
    prompt = rnd.randint(1, room // 2)
    max_tokens = rnd.randint(1, room - prompt)
    read_only = rnd.random() < 0.15
    return DllmRequest(
        request_id=rid,
        prompt_len=prompt,
        max_tokens=max_tokens,
        converge_after=tuple(rnd.randint(1, 5) for _ in range(rnd.randint(1, 3))),
        stop_after=rnd.randint(1, max_tokens) if not read_only and rnd.random() < 0.3 else None,
        width=rnd.randint(1, s.canvas_length) if rnd.random() < 0.25 else None,
        read_only=read_only,
        max_steps=rnd.randint(1, 4) if rnd.random() < 0.3 else None,
    )


def check_both(
    program: DllmProgram,
    mutate: Callable[[Any], None] | None = None,
    *,
    pipeline_parallel_size: int = 1,
    kv_events: bool = False,
) -> tuple[DllmRun, DllmRun]:
    """Run `program` through the synchronous loop and the asynchronous one (`mutate` applied to
    both), each checked; raise `EngineCoreViolation` naming the loop on the first rule broken.
    The asynchronous loop runs `pipeline_parallel_size` stages; the synchronous one, the
    control, one. With `kv_events` both publish KV cache events, checked (`kv_events`)."""

    def run(async_scheduling: bool) -> DllmRun:
        stages = pipeline_parallel_size if async_scheduling else 1
        events = kv_events or program.serving.kv_events
        serving = replace(program.serving, pipeline_parallel_size=stages, kv_events=events)
        return run_dllm(
            replace(program, serving=serving), async_scheduling=async_scheduling, mutate=mutate
        )

    return run_both(run)


def run_dllm(
    program: DllmProgram,
    *,
    async_scheduling: bool,
    mutate: Callable[[Any], None] | None = None,
    trace: list[str] | None = None,
) -> DllmRun:
    """`program` through one loop, served as its `serving` says (pipeline stages included,
    asynchronous only), `mutate` applied to the scheduler, checked; raises the first
    `EngineCoreViolation`. With `trace` (a list) the loop appends a line per event to it
    (`integrations.vllm.trace`)."""
    loop = DllmCoreLoop(program.serving, async_scheduling=async_scheduling, mutate=mutate)
    loop.trace = trace
    return loop.run(program)


__all__ = [
    "CANVAS_TOKEN",
    "END_MARGIN_CANVASES",
    "RULES",
    "DllmCoreLoop",
    "DllmProgram",
    "DllmRequest",
    "DllmRun",
    "DllmServing",
    "check_both",
    "dllm_program",
    "run_dllm",
    "validate_dllm_request",
]
