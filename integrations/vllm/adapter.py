"""The AR adapter that drives vLLM 0.33.0's real v1 `Scheduler` (synchronous scheduling; with
`async_scheduling=True` it builds vLLM's `AsyncScheduler` for `integrations.vllm.engine_core`).

Nothing in this module imports vLLM at import time: `RealVllmScheduler(config, sink)` first calls
`MANIFEST.activate()` (the `site-packages/` of the engine's own install on `sys.path`;
`EngineNotInstalled`, exit 2, naming `schedspec install-engines vllm` when it is missing) and
then imports vLLM.

What runs for real: `vllm.v1.core.sched.scheduler.Scheduler` built from a real `VllmConfig`
(`SchedulerConfig`, `ModelConfig`, `CacheConfig`), its `KVCacheManager`, `BlockPool` (block 0 is
its null block), request queues (`fcfs` deque or `priority` heap), `add_request`, `schedule()`,
`update_from_output()` (its stop checks and frees) and `finish_requests(...,
FINISHED_ABORTED)`. The model is the only thing we replace:

Stubs and substitutes (every one):
- the model: a directory holding only the `config.json` of a tiny Llama with no weights,
  written at run time under the engine directory (`ModelConfig` reads it; nothing downloaded).
  vLLM inspects the architecture once in a subprocess (`ModelRegistry`), caching the result in
  `VLLM_CACHE_ROOT`, which we point at the engine directory; that subprocess needs the engine on
  `PYTHONPATH`, so building a `ModelConfig` prepends it there for that call only.
- the forward pass: a fabricated `ModelRunnerOutput` per step. A request whose computed tokens
  reach its known tokens samples one token: the request's own end token (declared as its
  `stop_token_ids`) as output number `stop_after`, else a token fixed by the request and the
  output index (deterministic; never shared between requests, as in the spec's content model,
  so prefix caching shares blocks only through common prompts).
- the KV cache layout: a `KVCacheConfig` with one full-attention group (`FullAttentionSpec`,
  one KV head of size 1, float32) and `num_blocks` blocks; no tensors are allocated (the
  scheduler never touches them).
- `StructuredOutputManager(vllm_config)`: the real one; no request uses structured output
  unless `structured_output` is on, and then with `integrations.vllm.structured`'s grammar.

Read, not called (attributes of the real objects, for the snapshot and the event
reconstruction): `scheduler.running`, `scheduler.waiting` (and `kv_holding_waiting`, always
empty without a KV connector), `scheduler.requests[rid].num_computed_tokens`,
`kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks` (block tables),
the free block queue's links and `num_free_blocks` (walked by `integrations.vllm.free_queue`,
which refuses a queue a double free broke where vLLM's own `get_all_free_blocks` may loop),
`block_pool.blocks[i].ref_cnt` (every count other than 0, with or without prefix caching:
a block freed twice has -1), `.block_hash` and `requests[rid].block_hashes` (prefix
caching). No private method of vLLM is called or wrapped.

Events: vLLM emits none. Each `step()` takes a view of the pools before and after
`schedule()` and derives the scheduling-phase events with `spec.ar.reconstruct.
scheduling_events` (preemptions first — valid for FCFS's tail victim and for vLLM's
priority victim among all running requests; a victim vLLM had scheduled earlier in the same
call, told from the hash it left (`integrations.vllm.unscheduled`), is scheduled right before
its preemption —, then allocations and scheduled tokens in running order, cache hits for
admitted requests); then `ArStepEnd`; then views around
`update_from_output()` give `ArBlocksFreed` (`release_events`) and the adapter adds `ArFinished`
with vLLM's own finish reason. `abort` does the same around `finish_requests`, and reads the
status vLLM set (`FINISHED_ABORTED`, else `finish_condition`).

Every view first checks vLLM's queues (`check_queues`): nothing is rebuilt from a `running`
queue with more entries than `max_num_seqs` (`seat_cap`), a request listed twice or on a
queue that vLLM's `requests` map no longer holds (`snapshot_matches`); the `SpecViolation`
names the call just made and vLLM's queues.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import mmap
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from integrations.vllm import (
    REAL_VLLM_PREFIX_PROFILE,
    REAL_VLLM_PROFILE,
    SETTINGS_SPACE,
    VLLM_CACHE_AWARE_THRESHOLD,
    VLLM_CACHE_AWARE_WINDOW,
    VLLM_PREFILL_INTERVAL,
    VLLM_WATERMARK,
    structured,
)
from integrations.vllm.admission_knobs import VLLM_ADMISSION, AdmissionKnobs
from integrations.vllm.custom_scheduler import scheduler_class_for
from integrations.vllm.free_queue import free_block_ids
from integrations.vllm.manifest import MANIFEST, VERSIONS
from integrations.vllm.release_api import (
    bounded_reads,
    cache_read_limit,
    cache_read_params,
    check_scheduler_settings,
    configs_as_with_triton,
    runner_output,
)
from integrations.vllm.settings_034 import VLLM_034_DEFAULTS, Vllm034Settings
from integrations.vllm.token_ids import (
    OUTPUT_BASE,
    REASONING_END,
    STOP_BASE,
    output_token_id,
    prompt_stream,
    stop_token_id,
    unshared_prompt_token,
    wrong_draft,
)
from integrations.vllm.trace import output_line, schedule_line
from integrations.vllm.transcript import construction_line, request_line, update_line
from integrations.vllm.unscheduled import block_hashes, unscheduled_victims
from spec.ar.adapter import ArEventSink, check_proposal, drain_steps
from spec.ar.config import ArConfig, ArRequest, ArRules, Policy, VictimOrder, rules_for
from spec.ar.config import validate_ar_request as _validate
from spec.ar.events import (
    ArAborted,
    ArDraftsProposed,
    ArDraftsVerified,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArOutputTokens,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.profile import ArConfigSpace
from spec.ar.reconstruct import ArPoolView, release_events, scheduling_events
from spec.ar.rules import ArRule
from spec.ar.snapshot import ArSnapshot
from spec.errors import (
    ConfigError,
    DuplicateRequest,
    InvalidRequest,
    SpecViolation,
    UnknownRequest,
)

# Token ids (`integrations.vllm.token_ids`). Prompts we invent for requests that share nothing
# use one id per request. Sampled tokens are the request's own too (as in the spec's content
# model: outputs are never shared), so two requests share a cached block only through a common
# prompt.
#: vLLM's per-request `kv_cache_report_mode`s: announce the blocks a request caches
#: ("incremental", the default), or those its prefix-cache hit reuses too ("full").
KV_REPORT_MODES = ("incremental", "full")

TINY_LLAMA: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "vocab_size": 128,
    "max_position_embeddings": 1 << 20,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@dataclass(frozen=True, slots=True)
class VllmModules:
    """The vLLM modules the adapter uses (imported after activation)."""

    torch: ModuleType
    config: ModuleType
    sampling: ModuleType
    scheduler: ModuleType
    kv_iface: ModuleType
    kv_utils: ModuleType
    request: ModuleType
    outputs: ModuleType
    structured: ModuleType
    engine: ModuleType
    hashing: ModuleType
    lora: ModuleType


_MODULES: VllmModules | None = None


def model_dir(*, diffusion: bool = False) -> Path:
    """The weightless tiny-Llama model directory (written once, under the engine directory).
    With `diffusion`, its config also names a `canvas_length`, which is what makes vLLM's
    `ModelConfig.is_diffusion` true (the served canvas itself comes from `DiffusionConfig`)."""
    name = "schedspec-tiny-dllm" if diffusion else "schedspec-tiny-llama"
    path = MANIFEST.directory / name
    config = path / "config.json"
    if not config.is_file():
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / f"config.json.{os.getpid()}.tmp"
        body = {**TINY_LLAMA, "canvas_length": 32} if diffusion else TINY_LLAMA
        tmp.write_text(json.dumps(body, indent=1))
        tmp.replace(config)  # atomic: parallel workers never read half a file
    return path


def load_vllm() -> VllmModules:
    """Activate the engine install and import the vLLM modules (once per process).

    In a process that already imported a vLLM of its own (a server that attaches
    `integrations.vllm.event_log.VllmEventLog` to its scheduler), that vLLM is used as it is:
    nothing is activated, and nothing of its process-wide state (the prefix-cache hash seed,
    logging) is set. It must be a release the adapter reads (`VERSIONS`), else `ConfigError`."""
    global _MODULES
    if _MODULES is not None:
        return _MODULES
    served = sys.modules.get("vllm")
    if served is not None and not _from_install(served):
        check_served_release(served)
        _MODULES = _import_modules()
        return _MODULES
    MANIFEST.activate()
    os.environ.setdefault("VLLM_CACHE_ROOT", str(MANIFEST.directory / "schedspec-vllm-cache"))
    with MANIFEST.importing():
        _MODULES = _import_modules()
        triton_utils = importlib.import_module("vllm.triton_utils")
    configs_as_with_triton(_MODULES.config, triton_utils)
    # Prefix caching's block hashes: vLLM's own sha256 (its default `prefix_caching_hash_algo`).
    _MODULES.kv_utils.init_none_hash(_MODULES.hashing.sha256)
    # Platform notes on every build (block size not a multiple of 32, ...): not findings.
    logging.getLogger("vllm").setLevel(logging.ERROR)
    return _MODULES


#: The speculative-decoding methods the adapter configures (`RealVllmScheduler`).
SPECULATIVE_METHODS = ("ngram", "eagle", "draft_model")


def _import_modules() -> VllmModules:
    imp = importlib.import_module
    return VllmModules(
        torch=imp("torch"),
        config=imp("vllm.config"),
        sampling=imp("vllm.sampling_params"),
        scheduler=imp("vllm.v1.core.sched.scheduler"),
        kv_iface=imp("vllm.v1.kv_cache_interface"),
        kv_utils=imp("vllm.v1.core.kv_cache_utils"),
        request=imp("vllm.v1.request"),
        outputs=imp("vllm.v1.outputs"),
        structured=imp("vllm.v1.structured_output"),
        engine=imp("vllm.v1.engine"),
        hashing=imp("vllm.utils.hashing"),
        lora=imp("vllm.lora.request"),
    )


def _from_install(vllm: ModuleType) -> bool:
    """Whether the imported `vllm` is the engine install's (`MANIFEST.site_packages`)."""
    where = getattr(vllm, "__file__", None)
    return where is not None and Path(where).resolve().is_relative_to(
        MANIFEST.site_packages.resolve()
    )


def check_served_release(vllm: ModuleType) -> None:
    """`ConfigError` unless the vLLM a process imported itself is a release whose internals
    the adapter reads (`VERSIONS`; they differ only where `release_api` tells them apart)."""
    version = str(getattr(vllm, "__version__", "unknown"))
    if version not in VERSIONS:
        where = getattr(vllm, "__file__", None) or "an unknown place"
        raise ConfigError(
            "vllm",
            version,
            f"a vLLM release whose scheduler internals the adapter reads ({', '.join(VERSIONS)}); "
            f"this process imported vllm {version} from {where}",
        )


#: What the adapter can run (the profiles' spaces): vLLM's two scheduling policies; block 0 is
#: always vLLM's null block; prefix caching off (`real-vllm`) or on (`real-vllm-prefix`), or
#: either (`integrations.vllm.SETTINGS_SPACE`).
SPACE = REAL_VLLM_PROFILE.space
SPACE_PREFIX = REAL_VLLM_PREFIX_PROFILE.space


def check_loras(loras: int, max_loras: int) -> None:
    """`ConfigError` unless `loras` is an int >= 0 and `max_loras` an int >= 1, and 1 where no
    adapter is served."""
    if isinstance(loras, bool) or not isinstance(loras, int) or loras < 0:
        raise ConfigError("loras", loras, "an integer >= 0 (LoRA adapters served; 0: none)")
    if isinstance(max_loras, bool) or not isinstance(max_loras, int) or max_loras < 1:
        raise ConfigError("max_loras", max_loras, "an integer >= 1")
    if max_loras != 1 and not loras:
        raise ConfigError("max_loras", max_loras, "1 where no LoRA adapter is served (loras=0)")


def lora_of(arrival: int, loras: int) -> int:
    """The LoRA adapter of the request submitted `arrival`-th when `loras` adapters are served:
    arrival mod (loras + 1), 0 being the base model (no adapter)."""
    return arrival % (loras + 1) if loras else 0


def adapter_of(request: Any) -> int:
    """A vLLM `Request`'s LoRA adapter id (0: the base model)."""
    lora = request.lora_request
    return int(lora.lora_int_id) if lora is not None else 0


def vllm_rules(config: ArConfig) -> ArRules:
    """The ordering rules vLLM 0.33 follows: FCFS (victim: the tail of running), or priority
    with the victim chosen among *all* running requests (`Scheduler.schedule`:
    `max(self.running, key=lambda r: (r.priority, r.arrival_time))`)."""
    rules = rules_for(config)
    if config.policy is Policy.PRIORITY:
        return ArRules(rules.admission, VictimOrder.LOWEST_PRIORITY_ANY)
    return rules


class RealVllmScheduler:
    """`spec.ar.adapter.ArSchedulerAdapter` over vLLM 0.33.0's v1 `Scheduler`.

    With `async_scheduling=True` it builds vLLM's `AsyncScheduler` (vLLM's default) instead;
    that scheduler runs a step ahead of the model, which the AR step contract does not
    describe, so `step()` then refuses and `integrations.vllm.engine_core` drives it.
    `pipeline_parallel_size` > 1 (async only) builds it with that many pipeline stages and
    vLLM's V2 model runner, the one that runs pipeline parallelism with async scheduling;
    `max_concurrent_batches` is then what vLLM's engine core keeps in flight.
    `speculative_tokens` = k > 0 configures speculative decoding with up to k drafts a step
    by `speculative_method` (`SPECULATIVE_METHODS`: `ngram`, which needs no draft model, or
    `eagle` / `draft_model`, drafters with a forward pass of their own, here the same weightless
    tiny Llama, which reserve lookahead slots; with async scheduling vLLM serves ngram only
    with its V2 model runner, which is then used for every method): a step may sample several tokens
    of a request, which the AR step contract does not describe either, so `step()` refuses and
    `integrations.vllm.engine_core` drives it with `integrations.vllm.speculative`'s model.
    `structured_output=True` gives every other request (even submission index) structured
    output under `integrations.vllm.structured`'s grammar (its own tokens, in order); the
    bitmask then constrains the model, which `step()` does not model, so it refuses and
    `integrations.vllm.engine_core` drives it. `kv_connector` (a `kv_load_failure_policy`,
    `KV_FAILURE_POLICIES`) configures `integrations.vllm.kv_connector`'s connector in
    `kv_role` (`KV_ROLES`), whose worker side `integrations.vllm.engine_core` runs."""

    name = "real-vllm"
    #: It runs each request's LoRA adapter where the AR config serves them (`max_loras`).
    serves_loras = True
    #: vLLM's request block hasher with prefix caching or a KV connector (as `EngineCore`
    #: sets one), else None (set by `_build`)
    hasher: Any

    def __init__(
        self,
        config: ArConfig,
        sink: ArEventSink,
        space: ArConfigSpace = SPACE,
        *,
        async_scheduling: bool = False,
        pipeline_parallel_size: int = 1,
        speculative_tokens: int = 0,
        speculative_method: str = "ngram",
        structured_output: bool = False,
        reasoning: bool = False,
        kv_connector: str | None = None,
        kv_role: str = "kv_both",
        offloading: OffloadingOptions | None = None,
        sliding_window: int | None = None,
        greedy_outputs: bool = False,
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
        admission: AdmissionKnobs = VLLM_ADMISSION,
        settings_034: Vllm034Settings = VLLM_034_DEFAULTS,
    ) -> None:
        space.check(config)
        #: vLLM's admission settings beyond the AR config (`integrations.vllm.
        #: admission_knobs`): the engine-core loop checks them all; the AR suite the
        #: watermark, the whole-sequence reservation, the adaptive threshold and the prefill
        #: cadence, as the profile declares them (`real-vllm-watermark`,
        #: `real-vllm-no-reserve`, `real-vllm-adaptive`, `REAL_VLLM_CADENCE`).
        self.admission: AdmissionKnobs = admission
        #: vLLM 0.34.0's new settings (`integrations.vllm.settings_034`; off by default).
        self.settings_034: Vllm034Settings = settings_034
        if (
            isinstance(pipeline_parallel_size, bool)
            or not isinstance(pipeline_parallel_size, int)
            or pipeline_parallel_size < 1
        ):
            raise ConfigError("pipeline_parallel_size", pipeline_parallel_size, "an integer >= 1")
        if pipeline_parallel_size > 1 and not async_scheduling:
            raise ConfigError(
                "pipeline_parallel_size",
                pipeline_parallel_size,
                "1 without async scheduling (pipeline stages are checked in the asynchronous "
                "engine-core loop, with vLLM's V2 model runner)",
            )
        if (
            isinstance(speculative_tokens, bool)
            or not isinstance(speculative_tokens, int)
            or speculative_tokens < 0
        ):
            raise ConfigError(
                "speculative_tokens", speculative_tokens, "an integer >= 0 (0: no drafts)"
            )
        if speculative_method not in SPECULATIVE_METHODS:
            raise ConfigError(
                "speculative_method", speculative_method, f"one of {', '.join(SPECULATIVE_METHODS)}"
            )
        self._config = config
        self.async_scheduling = async_scheduling
        self.pipeline_parallel_size = pipeline_parallel_size
        #: The configuration's drafts (`ArConfig.num_speculative_tokens`), which `step()`
        #: verifies as `propose_drafts` scripts them (ngram: no slots of the drafter's own).
        self.scripted_drafts: bool = bool(config.num_speculative_tokens)
        if self.scripted_drafts:
            speculative_tokens, speculative_method = _scripted_drafter(config, speculative_tokens)
        self.speculative_tokens = speculative_tokens
        self.speculative_method = speculative_method
        #: Request id -> how many of its proposed drafts the model accepts (`propose_drafts`).
        self._accepts: dict[str, int] = {}
        self.structured_output: bool = structured_output
        if reasoning and not structured_output:
            raise ConfigError(
                "reasoning", True, "False without structured_output (no request has a grammar)"
            )
        self.reasoning: bool = reasoning
        if greedy_outputs and structured_output:
            raise ConfigError(
                "greedy_outputs",
                True,
                "False with structured_output (a grammar's script numbers the outputs by arrival)",
            )
        #: The model samples as a greedy one would: a request's outputs follow from its prompt
        #: (`token_ids.prompt_stream`), so equal prompts sample equal outputs (its stop token
        #: stays its own).
        self.greedy_outputs: bool = greedy_outputs
        if kv_connector is not None and kv_connector not in KV_FAILURE_POLICIES:
            raise ConfigError(
                "kv_connector",
                kv_connector,
                f"None or a load failure policy: {', '.join(KV_FAILURE_POLICIES)}",
            )
        self.kv_connector: str | None = kv_connector
        if offloading is not None and kv_connector is not None:
            raise ConfigError(
                "offloading",
                offloading,
                "None with kv_connector (vLLM serves one connector: its own offloading one, or "
                "schedspec's)",
            )
        #: vLLM's own `OffloadingConnector` with a CPU store of `offloading.chunks` chunks.
        self.offloading: OffloadingOptions | None = offloading
        if kv_role not in KV_ROLES:
            raise ConfigError("kv_role", kv_role, f"one of {', '.join(KV_ROLES)}")
        check_sliding_window(sliding_window)
        #: A sliding-window KV cache group of this many tokens beside the full-attention one
        #: (a hybrid cache, `hybrid_groups`), or None: one full-attention group.
        self.sliding_window: int | None = sliding_window
        check_window_block_scale(window_block_scale, sliding_window)
        #: The sliding-window group's blocks are this many times the program's block size.
        self.window_block_scale: int = window_block_scale
        check_full_block_scale(full_block_scale, sliding_window, window_block_scale, mamba)
        #: Beside a window, the full-attention group's blocks are this many times the
        #: program's block size.
        self.full_block_scale: int = full_block_scale
        check_mamba(
            mamba,
            sliding_window=sliding_window,
            window_block_scale=window_block_scale,
            kv_connector=kv_connector,
            offloading=offloading,
            speculative_tokens=speculative_tokens,
            block_scale=mamba_block_scale,
            checkpoint_alignment=mamba_checkpoint_alignment,
        )
        #: A Mamba group beside the full-attention one (`mamba_groups`), and beside the window
        #: when there is one.
        self.mamba: bool = mamba
        #: The Mamba group's blocks in align mode, this many times the program's block size.
        self.mamba_block_scale: int = mamba_block_scale
        #: Its layers export internal prefill checkpoints on this token grid (Mamba2's 1), or
        #: None: they export none (`mamba_groups`).
        self.mamba_checkpoint_alignment: int | None = mamba_checkpoint_alignment
        check_retention_interval(
            retention_interval,
            sliding_window is not None or mamba,
            # vLLM's scheduler block size: the larger group block
            config.block_size
            * max(window_block_scale, full_block_scale, mamba_block_scale if mamba else 1),
            offloading,
        )
        #: vLLM's `prefix_cache_retention_interval` (its default 0; None: dense).
        self.retention_interval: int | None = retention_interval
        #: vLLM's block pool queues KV cache events and its scheduler publishes them
        #: (`KVEventsConfig(enable_kv_cache_events=True)`, the null publisher until replaced).
        if not isinstance(kv_events, bool):
            raise ConfigError("kv_events", kv_events, "True or False")
        self.kv_events: bool = kv_events
        if kv_report_mode not in KV_REPORT_MODES or (
            kv_report_mode != "incremental" and not kv_events
        ):
            raise ConfigError(
                "kv_report_mode",
                kv_report_mode,
                "'incremental', or with kv_events 'full' (every request's sampling params ask "
                "vLLM to announce the blocks its prefix-cache hit reuses too)",
            )
        #: Each request's `kv_cache_report_mode` (its sampling params' `extra_args`).
        self.kv_report_mode: str = kv_report_mode
        check_loras(loras, max_loras)
        if loras and config.max_loras:
            raise ConfigError(
                "loras",
                loras,
                f"0 where the AR config serves adapters itself (max_loras={config.max_loras}: "
                "each request names its own, ArRequest.lora)",
            )
        #: LoRA adapters served (`lora_of`: request i runs adapter i mod (loras + 1), 0 being
        #: the base model), at most `max_loras` of them among the running requests (vLLM's
        #: `LoRAConfig`; no LoRA config at 0).
        self.loras: int = loras
        self.max_loras: int = max_loras
        #: vLLM's adapter slots: the AR config's `max_loras`, where it declares them (each
        #: request then runs its `ArRequest.lora`), else `max_loras` beside `loras`, else 0.
        self.lora_slots: int = config.max_loras or (max_loras if loras else 0)
        #: The connector's role: "kv_both" (it loads and sends) or "kv_producer" (it sends).
        self.kv_role: str = kv_role
        #: guided request id -> the output index of its reasoning end in its current turn
        #: (reasoning on; `integrations.vllm.sessions` sets a later turn's)
        self.reasoning_end_at: dict[str, int] = {}
        #: Compiles a guided request's grammar at submission (None: vLLM's `grammar_init`,
        #: synchronous here); `integrations.vllm.engine_core` sets it to compile later.
        self.compile_grammar: Callable[[Any], object] | None = None
        #: A prompt's multimodal items (vLLM `MultiModalFeatureSpec`s; None: text only);
        #: `integrations.vllm.encoder_inputs` sets it for the engine-core loop.
        self.mm_features_of: Callable[[list[int]], list[Any]] | None = None
        self.max_concurrent_batches: int = 1
        self.sink = sink
        self.v: VllmModules = load_vllm()
        self.sched: Any = self._build(config)
        #: The calls made on vLLM's scheduler, one line each, in vLLM's own terms
        #: (`native_calls`): what a failing example is printed with after its spec calls.
        self.transcript: list[str] = [construction_line(self.sched, config)]
        self.specs: dict[str, ArRequest] = {}
        #: Every vLLM `Request` given to the scheduler, by id, kept after it ends (what a
        #: reader of the KV events resolves a block key against).
        self.submitted: dict[str, Any] = {}
        self.arrival_of: dict[str, int] = {}
        #: With `greedy_outputs`, each request's output stream (`token_ids.prompt_stream`).
        self.stream_of: dict[str, int] = {}
        #: A streaming-input session's turn (1-based; `integrations.vllm.sessions` counts the
        #: inputs vLLM applied), which the model's output tokens depend on; 1 for any other.
        self.turn_of: dict[str, int] = {}
        self.arrivals: int = 0
        self.step_index: int = 0
        self.ended: set[str] = set()

    # ------------------------------------------------------------------ construction
    def _build(self, config: ArConfig) -> Any:
        # vLLM runs pipeline stages, and ngram drafts, under async scheduling only with V2
        v2 = self.pipeline_parallel_size > 1 or (
            self.async_scheduling and self.speculative_tokens > 0
        )
        with v2_model_runner() if v2 else contextlib.nullcontext():
            return self._build_scheduler(config)

    def _build_scheduler(self, config: ArConfig) -> Any:
        v = self.v
        cfg = v.config
        settings = {
            **self.admission.scheduler_settings(config.max_num_seqs),
            **self.settings_034.scheduler_settings(),
        }
        check_scheduler_settings(cfg.SchedulerConfig, settings)
        try:
            scheduler_config = cfg.SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_model_len=config.max_model_len,
                is_encoder_decoder=False,
                long_prefill_token_threshold=config.long_prefill_token_threshold,
                enable_chunked_prefill=config.enable_chunked_prefill,
                policy=config.policy.value,
                async_scheduling=self.async_scheduling,
                **settings,
            )
            model_config = tiny_model_config(v, config.max_model_len)
            cache_config = cfg.CacheConfig(
                block_size=config.block_size,
                enable_prefix_caching=config.enable_prefix_caching,
                prefix_cache_retention_interval=self.retention_interval,
            )
            vllm_config = cfg.VllmConfig(
                scheduler_config=scheduler_config,
                model_config=model_config,
                cache_config=cache_config,
                parallel_config=cfg.ParallelConfig(
                    pipeline_parallel_size=self.pipeline_parallel_size
                ),
                speculative_config=self._speculative_config(model_config),
                lora_config=(
                    cfg.LoRAConfig(max_loras=self.lora_slots, max_lora_rank=8)
                    if self.lora_slots
                    else None
                ),
                kv_events_config=(
                    cfg.KVEventsConfig(enable_kv_cache_events=True, publisher="null")
                    if self.kv_events
                    else None
                ),
                kv_transfer_config=(
                    _kv_transfer_config(cfg, self.kv_connector, self.kv_role)
                    if self.kv_connector is not None
                    else _offloading_config(cfg, self.offloading, config.block_size)
                    if self.offloading is not None
                    else None
                ),
            )
        except ValueError as err:  # pydantic's ValidationError is a ValueError
            raise ConfigError(
                "config", config, f"a configuration vLLM accepts ({vllm_config_error(err)})"
            ) from None
        window = self.sliding_window
        # Mamba blocks of k hash blocks beside a window (align mode): vLLM's platform raises
        # the block size of every attention layer, the window's too, to the Mamba block
        attention_block = config.block_size * (
            self.mamba_block_scale if self.mamba and config.enable_prefix_caching else 1
        )
        groups = (
            hybrid_groups(
                v, attention_block, window, self.window_block_scale, self.full_block_scale
            )
            if window is not None
            else None
        )
        if self.mamba:
            state_groups = mamba_groups(
                v,
                config,
                cache_config,
                self.mamba_block_scale,
                checkpoint_alignment=self.mamba_checkpoint_alignment,
            )
            # a model with all three kinds of layer (Samba, Phi-4-mini-flash): one attention
            # group, the window's, the Mamba group
            groups = state_groups if groups is None else [*groups, state_groups[1]]
        try:
            sched = build_scheduler(
                v,
                vllm_config,
                scheduler_config,
                cache_config,
                num_blocks=(
                    config.num_blocks
                    if groups is None
                    else hybrid_pool(config.num_blocks, len(groups))
                ),
                async_scheduling=self.async_scheduling,
                kv_cache_groups=groups,
            )
        except ValueError as err:  # vLLM's KV cache coordinator validates its configuration
            raise ConfigError(
                "config", config, f"a KV cache configuration vLLM accepts ({err})"
            ) from None
        _check_effective(sched, config, self.async_scheduling, self.speculative_tokens)
        if self.offloading is not None:
            _check_offloading(sched, self.offloading)
        _check_lookahead_pool(sched, config)
        if self.structured_output:
            structured.install(sched, v.torch)
        if self.reasoning:
            structured.install_reasoner(sched, importlib.import_module("vllm.reasoning"))
        self.max_concurrent_batches = int(vllm_config.max_concurrent_batches)
        # as vLLM's engine core builds it: with an EAGLE drafter and prefix caching a block's
        # hash also covers the token after it (`num_hash_lookahead_tokens`, 0 otherwise)
        self.hasher = (
            v.kv_utils.get_request_block_hasher(
                config.block_size,
                v.hashing.sha256,
                int(getattr(vllm_config, "num_hash_lookahead_tokens", 0)),
            )
            if config.enable_prefix_caching
            or self.kv_connector is not None
            or self.offloading is not None
            else None
        )
        return sched

    def _speculative_config(self, model_config: Any) -> Any:
        """vLLM's `SpeculativeConfig` for `speculative_tokens` drafts by `speculative_method`
        (`ngram`: prompt lookup; `eagle`, `draft_model`: the weightless tiny Llama as the draft
        model, read like the target's config, nothing loaded), or None."""
        k, method = self.speculative_tokens, self.speculative_method
        if k == 0:
            return None
        spec = self.v.config.SpeculativeConfig
        if method == "ngram":
            return spec(
                method="ngram", num_speculative_tokens=k, prompt_lookup_min=1, prompt_lookup_max=k
            )
        with engine_on_pythonpath():
            return spec(
                method=method,
                model=str(model_dir()),
                num_speculative_tokens=k,
                target_model_config=model_config,
                target_parallel_config=self.v.config.ParallelConfig(),
            )

    # ------------------------------------------------------------------ adapter API
    @property
    def config(self) -> ArConfig:
        """The `ArConfig` vLLM's scheduler was built for."""
        return self._config

    @property
    def rules(self) -> ArRules:
        """vLLM 0.33's ordering for the configured policy (`vllm_rules`)."""
        return vllm_rules(self._config)

    def submit(self, request: ArRequest, *, resumable: bool = False) -> None:
        """`validate_ar_request`, then `DuplicateRequest` for an id submitted before (both before
        any change); else `add_request` a vLLM `Request` (its prompt, or one unshared token
        repeated; its own stop token; arrival time: its submission index; `resumable`: a
        streaming-input session, `integrations.vllm.sessions`) and emit `ArSubmitted`."""
        _validate(self._config, request)
        rid = request.request_id
        if rid in self.specs:
            raise DuplicateRequest(rid)
        if resumable and self.greedy_outputs:
            raise ConfigError(
                "greedy_outputs",
                True,
                "False with streaming-input sessions (a session's later turns number their "
                "outputs by arrival)",
            )
        limit = request.cache_read_limit
        if limit and not bounded_reads(self.v.request.Request):
            raise InvalidRequest(
                rid,
                "cache_read_limit",
                limit,
                f"0 or None on vLLM {MANIFEST.version}: a request there reads its whole prefix "
                "from the cache or none of it (a hit bounded at a scored prompt row, "
                "prompt_logprob_start, is new in vLLM 0.34.0)",
            )
        prompt = (
            list(request.prompt)
            if request.prompt is not None
            else [unshared_prompt_token(self.arrivals)] * request.prompt_len
        )
        guided = self.structured_output and self.arrivals % 2 == 0
        # with reasoning: 1-3 reasoning tokens, then the end token, then the guided content
        end_at = 2 + (self.arrivals // 2) % 3 if guided and self.reasoning else None
        first, script = guided_script(request, self.arrivals, end_at)
        params = self.v.sampling.SamplingParams(
            max_tokens=request.max_tokens,
            stop_token_ids=[stop_token_id(self.arrivals)],
            ignore_eos=True,
            structured_outputs=(
                structured.grammar_params(self.v, script, first) if guided else None
            ),
            extra_args=(
                {"kv_cache_report_mode": self.kv_report_mode}
                if self.kv_report_mode != "incremental"
                else None
            ),
            **cache_read_params(limit),
        )
        adapter = lora_of(self.arrivals, self.loras) if self.loras else (request.lora or 0)
        req = self.v.request.Request(
            request_id=rid,
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            arrival_time=float(self.arrivals),  # arrival order = submission order
            priority=request.priority,
            block_hasher=self.hasher,
            lora_request=(
                self.v.lora.LoRARequest(f"adapter-{adapter}", adapter, f"/adapters/{adapter}")
                if adapter
                else None
            ),
            resumable=resumable,
            mm_features=self.mm_features_of(prompt) if self.mm_features_of is not None else None,
        )
        self.specs[rid] = request
        self.submitted[rid] = req
        self.arrival_of[rid] = self.arrivals
        if self.greedy_outputs:
            self.stream_of[rid] = prompt_stream(prompt)
        if end_at is not None:
            self.reasoning_end_at[rid] = end_at
        self.arrivals += 1
        if guided:  # as `EngineCore.add_request` does before the scheduler sees it
            (self.compile_grammar or self.sched.structured_output_manager.grammar_init)(req)
        self.sched.add_request(req)
        self.transcript.append(request_line(req))
        s = request
        self.sink(
            ArSubmitted(
                rid,
                s.prompt_len,
                s.max_tokens,
                s.stop_after,
                s.priority,
                s.predicted_len,
                prompt=s.prompt,
                # as vLLM's request holds it: the harness checks it is the one asked for
                cache_read_limit=cache_read_limit(req),
                lora=s.lora,
            )
        )

    def abort(self, request_id: str) -> None:
        """vLLM's `finish_requests` with `FINISHED_ABORTED`, emitting the blocks it freed
        (`release_events`) and `ArAborted`; an id never submitted or already ended raises
        `UnknownRequest`, changing nothing. A request the call left with another status than
        `FINISHED_ABORTED` (a scheduler class of the user's own that ends an abort as stopped,
        say) is a `SpecViolation` of `finish_condition`, with no `ArAborted`; vLLM's queues are
        checked before and after the call (`check_queues`)."""
        if request_id not in self.specs or request_id in self.ended:
            raise UnknownRequest(request_id, len(self.sched.requests))
        call = f"finish_requests([{request_id!r}], FINISHED_ABORTED)"
        before = self._view(where=f"before {call}")
        status = self.v.request.RequestStatus.FINISHED_ABORTED
        self.transcript.append(f"sched.{call}")
        req = self.sched.requests.get(request_id)
        ending = req is not None and not req.is_finished()  # this call is to end it
        self.sched.finish_requests([request_id], status)
        self._emit(release_events(before, self._view(where=f"after {call}")))
        self.ended.add(request_id)
        if ending and req.status != status:
            raise SpecViolation(
                ArRule.FINISH_CONDITION,
                f"after {call}: vLLM left its status {req.status.name}, not FINISHED_ABORTED, so "
                f"its client is told {request_id!r} finished ({_reason_name(req.status)}); an "
                "active request is never at its finish condition (it would have finished in the "
                "step that produced its last token): an abort must end it aborted",
            )
        self.sink(ArAborted(request_id))

    def step(self) -> None:
        """`schedule()` with its scheduling-phase events derived from views around it
        (`scheduling_events`), `ArStepEnd`, then `update_from_output()` on the fabricated model
        output, emitting the blocks it freed and `ArFinished` with vLLM's reason. Under
        `async_scheduling` or with `speculative_tokens` it raises `ConfigError`
        (`integrations.vllm.engine_core` drives those)."""
        if self.async_scheduling:
            raise ConfigError(
                "async_scheduling",
                True,
                "False for step() (an async scheduler runs a step ahead of the model: drive it "
                "with integrations.vllm.engine_core)",
            )
        if self.sliding_window is not None or self.mamba:
            field, value = (
                ("sliding_window", self.sliding_window)
                if self.sliding_window is not None
                else ("mamba", True)
            )
            raise ConfigError(
                field,
                value,
                "None for step() (the AR spec's pool is one KV cache group: drive a hybrid "
                "cache with integrations.vllm.engine_core)",
            )
        if self.speculative_tokens and not self.scripted_drafts:
            raise ConfigError(
                "speculative_tokens",
                self.speculative_tokens,
                "0 for step() (a speculative step samples several tokens of a request: drive it "
                "with integrations.vllm.engine_core, or script the drafts through the "
                "configuration's num_speculative_tokens and propose_drafts)",
            )
        if self.structured_output:
            raise ConfigError(
                "structured_output",
                True,
                "False for step() (a grammar bitmask constrains the model: drive it with "
                "integrations.vllm.engine_core)",
            )
        sched = self.sched
        before = self._view(where=f"before schedule() in step {self.step_index}")
        hashes = block_hashes(sched) if self._config.enable_prefix_caching else {}
        self.transcript.append("out = sched.schedule()")
        out = sched.schedule()
        self.transcript[-1] += f"  # {schedule_line(out)}"
        scheduled: dict[str, int] = dict(out.num_scheduled_tokens)
        drafted = {
            str(rid): list(ids) for rid, ids in out.scheduled_spec_decode_tokens.items() if ids
        }
        after = self._view(scheduled, where=f"after schedule() in step {self.step_index}")
        unscheduled = (
            unscheduled_victims(
                sched.requests,
                out.preempted_req_ids or (),
                before,
                after,
                hashes,
                block_hashes(sched),
                self._config.block_size,
                self.v.kv_utils.get_block_hash,
            )
            if self._config.enable_prefix_caching
            else {}
        )
        phase = scheduling_events(
            before,
            after,
            scheduled,
            self._config.block_size,
            preempted_order=self._victim_order(before),
            unscheduled=unscheduled,
        )
        self._emit(
            [
                ArScheduled(e.request_id, e.num_tokens, len(drafted[e.request_id]))
                if isinstance(e, ArScheduled) and e.request_id in drafted
                else e
                for e in phase
            ]
        )
        self.sink(ArStepEnd(self.step_index))
        runner_output = self._fabricate(scheduled, drafted)
        before = self._view(where=f"before update_from_output() in step {self.step_index}")
        outputs = {
            rid: (req, len(req.output_token_ids))
            for rid in scheduled
            if (req := sched.requests.get(rid)) is not None
        }
        self.transcript.append(update_line(runner_output))
        engine_outputs = sched.update_from_output(out, runner_output)
        self.transcript[-1] += f"  # {output_line(engine_outputs)}"
        for rid in drafted:  # vLLM rolled the rejected drafts back in its loop, before freeing
            if rid in outputs:
                req, known = outputs[rid]
                self.sink(ArDraftsVerified(rid, len(req.output_token_ids) - known - 1))
        if self._config.enable_prefix_caching:
            for rid, (req, known) in outputs.items():
                if ids := appended_outputs(req, known):
                    self.sink(ArOutputTokens(rid, ids))
        after_update = f"after update_from_output() in step {self.step_index}"
        self._emit(release_events(before, self._view(where=after_update)))
        for reqs in engine_outputs.values():
            for o in reqs.outputs:
                if o.finish_reason is not None:
                    self.ended.add(o.request_id)
                    self.sink(ArFinished(o.request_id, self._reason(o.finish_reason)))
        self.step_index += 1

    def native_calls(self) -> str:
        """The calls this adapter made on vLLM's scheduler so far, one per line, as vLLM's own
        tests write them (`sched.add_request(Request(...))`, `out = sched.schedule()`,
        `sched.update_from_output(out, ModelRunnerOutput(...))`), each with what vLLM answered
        in a comment: a failing example's spec calls, said in vLLM's terms (the optional
        adapter method `properties.conformance_base` prints after them)."""
        return "\n".join(self.transcript)

    def drain(self, max_steps: int = 100_000) -> None:
        """`drain_steps` over `step` and `is_idle`; `SchedulerStalled` names the waiting and running
        counts vLLM reports."""
        drain_steps(self.step, self.is_idle, self._queue_counts, max_steps)

    def _queue_counts(self) -> tuple[int, int]:
        running, waiting = self.sched.get_request_counts()
        return int(waiting), int(running)

    def is_idle(self) -> bool:
        """vLLM's `get_request_counts()` reports no running and no waiting request."""
        running, waiting = self.sched.get_request_counts()
        return bool(running == 0 and waiting == 0)

    def snapshot(self) -> ArSnapshot:
        """Read from vLLM's scheduler: free blocks (its free queue, the null block left out), block
        tables, the running and waiting queues in order, `num_computed_tokens`; with prefix caching,
        holders, reference counts and cached blocks in place of single owners."""
        sched = self.sched
        check_queues(sched, "snapshot()", self._config.max_num_seqs)
        pool = sched.kv_cache_manager.block_pool
        tables = self._tables()
        running = tuple(r.request_id for r in sched.running)
        waiting = tuple(r.request_id for r in self._waiting())
        computed = {rid: sched.requests[rid].num_computed_tokens for rid in running + waiting}
        free = free_block_ids(pool)  # refuses a queue a double free broke (it may cycle)
        # every count other than 0: a block freed twice has -1 (`refcount_matches`)
        refcounts = {b.block_id: b.ref_cnt for b in pool.blocks if b.ref_cnt and not b.is_null}
        if not self._config.enable_prefix_caching:
            owners = {b: rid for rid, table in tables.items() for b in table}
            return ArSnapshot(free, owners, running, waiting, computed, block_refcounts=refcounts)
        holders: dict[int, set[str]] = {}
        for rid, table in tables.items():
            for b in table:
                holders.setdefault(b, set()).add(rid)
        return ArSnapshot(
            free,
            {},
            running,
            waiting,
            computed,
            block_holders={b: frozenset(h) for b, h in holders.items()},
            block_refcounts=refcounts,
            cached_blocks=self._cached(),
        )

    # ------------------------------------------------------------------ helpers
    def _emit(self, events: list[ArEvent]) -> None:
        for e in events:
            self.sink(e)

    def _waiting(self) -> Iterator[Any]:
        return waiting_requests(self.sched)

    def _tables(self) -> dict[str, tuple[int, ...]]:
        return block_tables(self.sched)

    def _cached(self) -> frozenset[int]:
        return cached_blocks(self.sched)

    def _view(
        self, scheduled: dict[str, int] | None = None, *, where: str = "reading vLLM's queues"
    ) -> ArPoolView:
        cfg = self._config
        return pool_view(
            self.sched,
            cfg.enable_prefix_caching,
            scheduled,
            where=where,
            max_num_seqs=cfg.max_num_seqs,
        )

    def _victim_order(self, before: ArPoolView) -> list[str]:
        return victim_order(self.sched, before, self._config.policy)

    def _fabricate(
        self, scheduled: dict[str, int], drafted: dict[str, list[int]] | None = None
    ) -> Any:
        """The model's output for the batch just scheduled: one sampled token per request past
        its prefill (vLLM's own `is_prefill_chunk`, set by `schedule()`: the request caught up
        with its known tokens), numbered after its outputs, then, for a request whose `drafted`
        tokens the step verified, the next outputs its proposal's accepted drafts were (none
        of vLLM's padding: placeholders). Under async scheduling the outputs still in flight
        count too (`num_output_placeholders`, this step's included); synchronously there are
        none."""
        reqs = self.sched.requests
        ids = list(scheduled)
        drafted = drafted or {}
        sampled: list[list[int]] = []
        for rid in ids:
            req = reqs.get(rid)  # None: finished before a deferred batch is sampled; unused
            if req is None or req.is_prefill_chunk:
                sampled.append([])
                continue
            first = next_output_index(req)
            drafts = drafted.get(rid, [])
            accepted = 0 if -1 in drafts else min(self._accepts.pop(rid, 0), len(drafts))
            sampled.append([self._token(rid, first + j) for j in range(1 + accepted)])
        return runner_output(self.v.outputs.ModelRunnerOutput, ids, sampled_token_ids=sampled)

    def propose_drafts(self, request_id: str, drafts: int, accepted: int) -> None:
        """`spec.ar.ArDraftingAdapter`, for a configuration with `num_speculative_tokens`:
        between steps, hand vLLM's scheduler the drafter's proposal for the running request's
        next step as the engine core does (`update_draft_token_ids`): `drafts` token ids, the
        first `accepted` of them the request's true next outputs (the step samples them), the
        rest tokens of no request. Emits `ArDraftsProposed` with the drafts vLLM kept.
        `ConfigError` without drafts configured or for counts out of range; `UnknownRequest`
        for an id that is not running."""
        k = self._config.num_speculative_tokens
        if not self.scripted_drafts:
            raise ConfigError("num_speculative_tokens", k, "> 0 to script drafts")
        check_proposal(k, drafts, accepted)
        req = next((r for r in self.sched.running if r.request_id == request_id), None)
        if req is None:
            running, waiting = self.sched.get_request_counts()
            raise UnknownRequest(request_id, int(running) + int(waiting))
        first = next_output_index(req) + 1  # after the token its next step samples
        ids = [
            self._token(request_id, first + j) if j < accepted else wrong_draft(j)
            for j in range(drafts)
        ]
        proposal = self.v.outputs.DraftTokenIds([request_id], [ids])
        self.transcript.append(f"sched.update_draft_token_ids({proposal!r})")
        self.sched.update_draft_token_ids(proposal)
        kept = len(req.spec_token_ids)
        self._accepts[request_id] = accepted
        if kept:
            self.sink(ArDraftsProposed(request_id, kept))

    def _token(self, rid: str, index: int) -> int:
        """Output token number `index` (1-based) of request `rid` in its current turn."""
        return output_token(
            self.specs[rid],
            self.arrival_of[rid],
            index,
            self.reasoning_end_at.get(rid),
            turn=self.turn_of.get(rid, 1),
            stream=self.stream_of.get(rid),
        )

    def _reason(self, finish_reason: Any) -> ArFinishReason:
        return finish_reason_of(self.v, finish_reason)


def _scripted_drafter(config: ArConfig, speculative_tokens: int) -> tuple[int, str]:
    """(drafts, method) vLLM is configured with for a configuration that scripts its drafts
    (`num_speculative_tokens` = k > 0): ngram's without slots of the drafter's own, EAGLE's
    with k lookahead slots, a draft model's with k slots and one input row per scheduled
    request. `ConfigError` for other slots or rows, for a drafter's slots beside prefix
    caching (EAGLE's cache keys cover the token after each block, which the profiles here do
    not declare; and a victim vLLM schedules and unschedules in one call, which only prefix
    caching's block hashes tell, had lookahead blocks allocated and freed that no view shows:
    both checked in the engine-core loop's logs, `integrations.vllm.event_log`), or for a
    `speculative_tokens` of another count."""
    k = config.num_speculative_tokens
    if speculative_tokens not in (0, k):
        raise ConfigError(
            "speculative_tokens", speculative_tokens, f"0 or num_speculative_tokens={k}"
        )
    slots, rows = config.num_lookahead_tokens, config.num_drafting_slots
    if not slots and not rows:
        return k, "ngram"
    if slots != k or rows > 1:
        raise ConfigError(
            "num_lookahead_tokens",
            slots,
            f"0 (ngram) or num_speculative_tokens={k} (EAGLE; a draft model with "
            "num_drafting_slots=1)",
        )
    if config.enable_prefix_caching:
        raise ConfigError(
            "enable_prefix_caching",
            True,
            "False beside a drafter's lookahead slots where step() scripts the drafts (EAGLE's "
            "and a draft model's logs with prefix caching are checked in the engine-core loop, "
            "integrations.vllm.event_log)",
        )
    return k, "draft_model" if rows else "eagle"


def appended_outputs(request: Any, known: int) -> tuple[int, ...]:
    """The ids of the outputs vLLM appended to `request` past its first `known` (what a step's
    `update_from_output` sampled, and accepted of its drafts)."""
    return tuple(int(t) for t in list(request.output_token_ids)[known:])


def next_output_index(req: Any) -> int:
    """The number (1-based) of the output vLLM request `req` samples in the batch just
    scheduled: after its outputs, and under async scheduling after those still in flight
    (`num_output_placeholders`, this step's included; synchronously there are none)."""
    return int(req.num_output_tokens + max(req.num_output_placeholders, 1))


def output_token(
    request: ArRequest,
    arrival: int,
    index: int,
    reasoning_end_at: int | None = None,
    *,
    turn: int = 1,
    stream: int | None = None,
) -> int:
    """Output token number `index` (1-based) of `request`, submitted `arrival`-th, in turn
    `turn` (a streaming-input session's; 1 for any request): in its first turn its stop token
    at `stop_after`, else the reasoning end token at `reasoning_end_at` (the turn's), else one
    fixed by the index and `stream` (a greedy model's: `token_ids.prompt_stream`; None: the
    arrival); in a later turn (no stop token) `session_output_token`."""
    if turn > 1:
        return session_output_token(arrival, turn, index, reasoning_end_at)
    if request.stop_after is not None and index == request.stop_after:
        return stop_token_id(arrival)
    if index == reasoning_end_at:
        return REASONING_END
    return output_token_id(arrival if stream is None else stream, index)


def session_output_token(
    arrival: int, turn: int, index: int, reasoning_end_at: int | None = None
) -> int:
    """Output token number `index` (1-based) of turn `turn` > 1 of the streaming-input session
    submitted `arrival`-th: the reasoning end token at `reasoning_end_at` (a turn that
    reasons), else one fixed by the arrival, the turn and the index."""
    if index == reasoning_end_at:
        return REASONING_END
    return output_token_id(arrival, index, turn)


def guided_script(
    request: ArRequest, arrival: int, reasoning_end_at: int | None = None
) -> tuple[int, list[int]]:
    """The outputs `request`'s grammar admits, as (number of the first, tokens): all of them,
    1..end (end: its stop index, else `max_tokens`), or those after its reasoning end."""
    end = request.max_tokens
    if request.stop_after is not None:
        end = min(end, request.stop_after)
    first = 1 if reasoning_end_at is None else reasoning_end_at + 1
    tokens = [output_token(request, arrival, i, reasoning_end_at) for i in range(first, end + 1)]
    return first, tokens


def _reason_name(status: Any) -> str:
    """What vLLM tells the client of a request that ended with `status` (its finish reason's
    name, e.g. `stop`), or the status's name where vLLM names none."""
    reason = status.get_finished_reason(status) if hasattr(status, "get_finished_reason") else None
    return f"finish reason {str(reason).lower()!r}" if reason is not None else str(status.name)


def finish_reason_of(v: VllmModules, finish_reason: Any) -> ArFinishReason:
    """vLLM's finish reason of a finished request as the spec's (stop or length)."""
    reasons = v.engine.FinishReason
    if finish_reason == reasons.STOP:
        return ArFinishReason.STOP
    if finish_reason == reasons.LENGTH:
        return ArFinishReason.LENGTH
    raise ConfigError(  # vLLM finished a request for a reason the spec has no name for
        "finish_reason", finish_reason, "stop or length (a request's own; aborts are apart)"
    )


def vllm_config_error(err: ValueError) -> str:
    """vLLM's own words from a config it refused (pydantic's "Value error, ..." line, without
    pydantic's input echo and help link)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Value error,"):
            return line.removeprefix("Value error,").split(" [type=")[0].strip()[:200]
    return (lines[1] if len(lines) > 1 else lines[0] if lines else type(err).__name__)[:200]


#: vLLM's `kv_load_failure_policy` values: retry a failed KV load by recomputing, or end the
#: request with an error (vLLM's default).
KV_FAILURE_POLICIES = ("recompute", "fail")
#: The connector roles checked: loading and sending, or sending only (a P/D prefill instance,
#: whose scheduler then frees a request's blocks at once with steps in flight).
KV_ROLES = ("kv_both", "kv_producer")
#: Where vLLM's `KVConnectorFactory` finds the connector `kv_connector=` configures.
KV_CONNECTOR_MODULE = "integrations.vllm.kv_connector"
KV_CONNECTOR_NAME = "SchedspecKvConnector"


def _kv_transfer_config(cfg: Any, policy: str, role: str) -> Any:
    """vLLM's `KVTransferConfig` for `integrations.vllm.kv_connector`'s connector in `role`
    (`KV_ROLES`), with `kv_load_failure_policy` `policy`."""
    return cfg.KVTransferConfig(
        kv_connector=KV_CONNECTOR_NAME,
        kv_connector_module_path=KV_CONNECTOR_MODULE,
        kv_role=role,
        kv_load_failure_policy=policy,
    )


@dataclass(frozen=True, slots=True)
class OffloadingOptions:
    """vLLM's own KV offloading (`OffloadingConnector` with its `CPUOffloadingSpec`, the CPU
    manager's LRU policy): `chunks` CPU chunks of `blocks_per_chunk` GPU blocks each (vLLM's
    `blocks_per_chunk`; a chunk is stored whole and keyed by its last block; vLLM sizes the store by
    `cpu_bytes_to_use`; this sets the bytes that make `chunks`), `outputs` also offloads the
    blocks of generated tokens (vLLM's `offload_prompt_only` False; by default only prompt
    blocks), `sync_loads` lets a hit load in the forward of the step that schedules it (a
    `sync_load_budget_bytes` large enough for any hit; by default every load is
    asynchronous), `self_describing_events` has it announce a stored chunk by the per-block
    keys of its blocks, with their tokens (vLLM's `self_describing_kv_events`; inert unless KV
    cache events are on; by default a chunk is announced by its own key alone)."""

    chunks: int
    outputs: bool = False
    sync_loads: bool = False
    blocks_per_chunk: int = 1
    self_describing_events: bool = False

    def __post_init__(self) -> None:
        for name in ("chunks", "blocks_per_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"offloading.{name}", value, "an integer >= 1")
        if not isinstance(self.self_describing_events, bool):
            raise ConfigError(
                "offloading.self_describing_events", self.self_describing_events, "True or False"
            )


#: The bytes one CPU chunk of the fabricated model takes: K and V, one head of size 1, float32
#: (vLLM rounds a chunk up to the page size, `CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT`).
_KV_BYTES_PER_TOKEN = 2 * 4


def _offloading_config(cfg: Any, options: OffloadingOptions, block_size: int) -> Any:
    """vLLM's `KVTransferConfig` for its `OffloadingConnector` over a CPU store of
    `options.chunks` chunks."""
    page = mmap.PAGESIZE
    chunk_bytes = -(-(_KV_BYTES_PER_TOKEN * block_size * options.blocks_per_chunk) // page) * page
    return cfg.KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "cpu_bytes_to_use": options.chunks * chunk_bytes,
            "offload_prompt_only": not options.outputs,
            "sync_load_budget_bytes": (1 << 40) if options.sync_loads else 0,
            "blocks_per_chunk": options.blocks_per_chunk,
            "self_describing_kv_events": options.self_describing_events,
        },
    )


def _check_offloading(sched: Any, options: OffloadingOptions) -> None:
    """The built scheduler serves vLLM's offloading connector with the CPU chunks asked for."""
    connector = getattr(sched, "connector", None)
    manager = getattr(getattr(connector, "connector_scheduler", None), "manager", None)
    chunks = getattr(manager, "_num_chunks", None)
    if type(connector).__name__ != "OffloadingConnector" or chunks != options.chunks:
        raise ConfigError(
            "offloading",
            options,
            f"a configuration vLLM serves with its OffloadingConnector and {options.chunks} CPU "
            f"chunks (it built {type(connector).__name__} with {chunks})",
        )


def build_scheduler(
    v: VllmModules,
    vllm_config: Any,
    scheduler_config: Any,
    cache_config: Any,
    *,
    num_blocks: int,
    async_scheduling: bool,
    kv_cache_groups: Sequence[Any] | None = None,
) -> Any:
    """vLLM's own choice of scheduler class for `vllm_config` (`AsyncScheduler` or a diffusion
    scheduler as its config says), over a KV pool of `num_blocks` blocks in one full-attention
    group (one KV head of size 1: no tensors are allocated; the scheduler never touches them).

    `kv_cache_groups` (vLLM `KVCacheGroupSpec`s sharing the pool) replaces that group, for a
    hybrid cache. The KV cache configuration is completed as vLLM's engine core completes it:
    the retention interval from `cache_config`, and the scheduler block size (for groups of
    several block sizes, their least common multiple), the hash block size (their greatest
    common divisor) and the hit alignment by vLLM's own resolvers. Where
    `SCHEDSPEC_VLLM_SCHEDULER_CLS` names a subclass of that class, it is built instead
    (`integrations.vllm.custom_scheduler`), as vLLM's `scheduler_cls` does.

    vLLM's CPU platform turns async scheduling off ("not required on CPU",
    `CpuPlatform.check_and_update_config`); the CUDA platform keeps vLLM's default, on. The
    scheduler is platform-independent, so with `async_scheduling` the flag is set back as a GPU
    build leaves it."""
    if async_scheduling:
        scheduler_config.async_scheduling = True
    block_size = cache_config.block_size
    if kv_cache_groups is None:
        spec = v.kv_iface.FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=v.torch.float32
        )
        kv_cache_groups = [v.kv_iface.KVCacheGroupSpec(["layer"], spec)]
    kv_cache_config = v.kv_iface.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=list(kv_cache_groups),
        # as vLLM's KV cache planning copies it (`get_kv_cache_config_from_groups`): the
        # coordinator reads it here, the offloading connector from `cache_config`
        prefix_cache_retention_interval=cache_config.prefix_cache_retention_interval,
    )
    # the block sizes and hit alignment as vLLM's engine core resolves them (`EngineCore`)
    scheduler_block_size, hash_block_size = v.kv_utils.resolve_kv_cache_block_sizes(
        kv_cache_config, vllm_config
    )
    kv_cache_config.hash_block_size = hash_block_size
    kv_cache_config.cache_hit_alignment_tokens = v.kv_utils.resolve_cache_hit_alignment_tokens(
        kv_cache_config, vllm_config, scheduler_block_size, hash_block_size
    )
    cache_config.num_gpu_blocks = num_blocks
    # a class of the user's own where vLLM would build its own (`SCHEDSPEC_VLLM_SCHEDULER_CLS`)
    scheduler_cls = scheduler_class_for(scheduler_config.get_scheduler_cls())
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=v.structured.StructuredOutputManager(vllm_config),
        block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
        log_stats=False,
    )


@contextlib.contextmanager
def v2_model_runner() -> Iterator[None]:
    """`VLLM_USE_V2_MODEL_RUNNER=1` while a config and scheduler are built (the scheduler reads
    it once, in its constructor). vLLM serves diffusion models only with its V2 model runner
    (`VllmConfig._get_v2_model_runner_unsupported_features`), and runs pipeline parallelism with
    async scheduling only with it; without triton it picks V2 only when told to."""
    with environment_variable("VLLM_USE_V2_MODEL_RUNNER", "1"):
        yield


@contextlib.contextmanager
def environment_variable(name: str, value: str) -> Iterator[None]:
    """Environment variable `name` set to `value` for the block, then as it was."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def check_sliding_window(sliding_window: object) -> None:
    """`ConfigError` unless `sliding_window` is None or a window of at least one token."""
    if sliding_window is not None and (
        isinstance(sliding_window, bool)
        or not isinstance(sliding_window, int)
        or sliding_window < 1
    ):
        raise ConfigError(
            "sliding_window", sliding_window, "None or an integer >= 1 (tokens in the window)"
        )


def check_retention_interval(
    retention_interval: object,
    hybrid: bool,
    block_size: int,
    offloading: OffloadingOptions | None,
) -> None:
    """`ConfigError` unless `retention_interval` is one vLLM serves here: 0 (its default: only
    the replay boundary and shared-prefix junctions are kept), None (dense) or a positive
    multiple of `block_size`, the sliding-window group's (vLLM's scheduler block size, the
    least common multiple of the groups'; with offloading, of a window CPU chunk's tokens);
    other than 0 only with a `hybrid` cache, a sliding-window or Mamba group (it applies to
    those groups alone)."""
    if retention_interval == 0 and not isinstance(retention_interval, bool):
        return
    unit = block_size * (offloading.blocks_per_chunk if offloading is not None else 1)
    valid = (
        f"0 (vLLM's default), None (dense) or a positive multiple of {unit} (the "
        f"{'CPU chunk' if offloading is not None else 'block'} size in tokens), with a "
        "sliding window or a Mamba group"
    )
    if retention_interval is not None and (
        isinstance(retention_interval, bool)
        or not isinstance(retention_interval, int)
        or retention_interval < 0
        or retention_interval % unit
    ):
        raise ConfigError("retention_interval", retention_interval, valid)
    if not hybrid:
        raise ConfigError("retention_interval", retention_interval, valid)


def check_window_block_scale(window_block_scale: object, sliding_window: int | None) -> None:
    """`ConfigError` unless `window_block_scale` is 1, or an integer above 1 with a sliding
    window. A multiple of the program's block size keeps it the groups' greatest common
    divisor, vLLM's hash block size, by which the adapter's request block hasher hashes."""
    _check_block_scale(
        "window_block_scale",
        window_block_scale,
        sliding_window is not None,
        "1, or with a sliding window an integer >= 1 (the window group's blocks are that many "
        "times the block size)",
    )


def _check_block_scale(field: str, scale: object, group_served: bool, valid: str) -> None:
    """`ConfigError(field, scale, valid)` unless `scale` is 1, or an integer >= 1 where the
    group it sizes is served (`group_served`)."""
    if scale == 1 and not isinstance(scale, bool):
        return
    if not group_served or isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ConfigError(field, scale, valid)


def check_full_block_scale(
    full_block_scale: object, sliding_window: int | None, window_block_scale: int, mamba: bool
) -> None:
    """`ConfigError` unless `full_block_scale` is 1, or an integer above 1 beside a sliding
    window whose blocks are the program's (`window_block_scale` 1) and no Mamba group (whose
    block vLLM's platform keeps equal to the attention block, one size for both)."""
    _check_block_scale(
        "full_block_scale",
        full_block_scale,
        sliding_window is not None and window_block_scale == 1 and not mamba,
        "1, or with a sliding window of window_block_scale 1 and no Mamba group an integer "
        ">= 1 (the full-attention group's blocks are that many times the block size)",
    )


def hybrid_groups(
    v: VllmModules,
    block_size: int,
    sliding_window: int,
    window_block_scale: int = 1,
    full_block_scale: int = 1,
) -> list[Any]:
    """A hybrid KV cache's groups, as a model with full-attention and sliding-window layers
    gets them (Gemma, Mistral): group 0 full attention in blocks of `full_block_scale` x
    `block_size` tokens, group 1 a sliding window of `sliding_window` tokens in blocks of
    `window_block_scale` x `block_size` tokens (at most one scale above 1); distinct head
    sizes, so vLLM keeps the groups apart. vLLM puts the null block where a sliding-window
    block left the window.

    In a real engine the groups' blocks are pages of one size, so where one group's KV per
    token is smaller (fewer KV heads), vLLM gives that group larger blocks
    (`unify_kv_cache_spec_page_size`): a block of k > 1 times `block_size` tokens is such a
    group, its head size 1 beside the other group's k (pages of one size). vLLM then
    schedules and caches by the groups' least common multiple and hashes by their greatest
    common divisor."""
    dtype = v.torch.float32
    if window_block_scale == full_block_scale == 1:
        full_heads, window_heads = 1, 2
    else:  # the group of larger blocks has the smaller head: pages of one size
        full_heads, window_heads = window_block_scale, full_block_scale
    full = v.kv_iface.FullAttentionSpec(
        block_size=block_size * full_block_scale,
        num_kv_heads=1,
        head_size=full_heads,
        dtype=dtype,
    )
    window = v.kv_iface.SlidingWindowSpec(
        block_size=block_size * window_block_scale,
        num_kv_heads=1,
        head_size=window_heads,
        dtype=dtype,
        sliding_window=sliding_window,
    )
    return [
        v.kv_iface.KVCacheGroupSpec(["full_attention"], full),
        v.kv_iface.KVCacheGroupSpec(["sliding_window"], window),
    ]


def check_mamba(
    mamba: object,
    *,
    sliding_window: int | None,
    kv_connector: str | None,
    offloading: OffloadingOptions | None,
    speculative_tokens: int,
    window_block_scale: int = 1,
    block_scale: object = 1,
    checkpoint_alignment: object = None,
) -> None:
    """`ConfigError` unless `mamba` is False, or True without what the loop does not model
    beside a Mamba group: a KV connector or vLLM's offloading connector (it hands a Mamba
    state's partial tails over), drafts (speculative state blocks, relocated in place), and,
    beside a sliding window, both the window's blocks larger (`window_block_scale`) and the
    Mamba blocks (`block_scale`, which scales every attention group's blocks with them);
    unless `block_scale` is 1, or with a Mamba group an integer >= 1; and unless
    `checkpoint_alignment` is None, or with a Mamba group an integer >= 1."""
    _check_block_scale(
        "mamba_block_scale",
        block_scale,
        mamba is True,
        "1, or with a Mamba group an integer >= 1 (its blocks are that many times the block size)",
    )
    if checkpoint_alignment is not None and (
        mamba is not True
        or isinstance(checkpoint_alignment, bool)
        or not isinstance(checkpoint_alignment, int)
        or checkpoint_alignment < 1
    ):
        raise ConfigError(
            "mamba_checkpoint_alignment",
            checkpoint_alignment,
            "None, or with a Mamba group an integer >= 1 (the token grid its layers export "
            "prefill checkpoints on: Mamba2's 1, a gated-delta-net layer's Mamba block size)",
        )
    if mamba is False:
        return
    valid = (
        "False, or True without kv_connector, offloading or speculative_tokens (a Mamba group "
        "beside full attention, and a sliding window if given, no drafts, no connector), and "
        "beside a sliding window with mamba_block_scale 1 or window_block_scale 1 (the "
        "window's blocks larger than the others, or every group's blocks mamba_block_scale "
        "times the block size)"
    )
    if mamba is not True or (
        kv_connector is not None
        or offloading is not None
        or speculative_tokens
        or (sliding_window is not None and block_scale != 1 and window_block_scale != 1)
    ):
        raise ConfigError("mamba", mamba, valid)


def mamba_groups(
    v: VllmModules,
    config: ArConfig,
    cache_config: Any,
    block_scale: int = 1,
    *,
    checkpoint_alignment: int | None = None,
) -> list[Any]:
    """A hybrid KV cache's groups as a model with attention and Mamba (state-space) layers gets
    them (Jamba, Nemotron-H, Qwen3-Next), as vLLM's `MambaModelConfig.verify_and_update_config`
    sets them up: group 0 full attention in blocks of `config.block_size`; group 1 a Mamba
    group whose blocks hold a layer's recurrent state. With prefix caching it runs in vLLM's
    "align" mode, its blocks of the attention group's size (vLLM's platform sets
    `mamba_block_size` to `block_size`; a state checkpoint per block, the earlier ones the
    null block or freed, prefill split at block boundaries), and vLLM asserts chunked prefill
    (`ConfigError` without). Without prefix caching, "none" mode: one block of
    `max_model_len` tokens per request holding its state, updated in place. Sets
    `cache_config.mamba_cache_mode` to match.

    With `block_scale` = k > 1 (prefix caching) both groups' blocks are k times
    `config.block_size` (`cache_config.block_size`, as vLLM's engine core sets it to the
    groups' block size) and prefix-cache keys are computed every `config.block_size` tokens
    (`cache_config.prefix_match_unit`, vLLM's fine-grained hits): a hit may end inside a
    Mamba block and read a partial state, which vLLM keeps for a prompt's end and hands over
    by copy-on-write (`kv_cache_block_copies`).

    With `checkpoint_alignment` the Mamba layers also export internal prefill checkpoints, as
    vLLM's Mamba2 (alignment 1) and gated-delta-net layers (their Mamba block size) declare
    (`num_prefill_checkpoint_blocks=1`): in align mode a prompt step that crosses a hash block
    boundary reserves the block before its last and has the worker write there the state at
    the last hash block boundary it may reuse (`mamba_checkpoint`), which vLLM then caches
    under that boundary's block hash, so a later request with the same prompt hits it."""
    align = bool(cache_config.enable_prefix_caching)
    if align and not config.enable_chunked_prefill:
        raise ConfigError(
            "mamba",
            True,
            "a program with chunked prefill where prefix caching is on (vLLM asserts "
            "'Chunked prefill is required for Mamba prefix caching')",
        )
    mode = "align" if align else "none"
    cache_config.mamba_cache_mode = mode
    scale = block_scale if align else 1  # none mode has no prefix cache to hash finer
    block_size = config.block_size * scale
    if scale > 1:
        cache_config.block_size = block_size
        cache_config.prefix_match_unit = config.block_size
    cache_config.mamba_block_size = block_size if align else config.max_model_len
    full = v.kv_iface.FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=v.torch.float32
    )
    state = v.kv_iface.MambaSpec(
        block_size=cache_config.mamba_block_size,
        shapes=((2,),),
        dtypes=(v.torch.float32,),
        mamba_cache_mode=mode,
        num_prefill_checkpoint_blocks=int(checkpoint_alignment is not None),
        prefill_checkpoint_alignment=checkpoint_alignment,
    )
    return [
        v.kv_iface.KVCacheGroupSpec(["full_attention"], full),
        v.kv_iface.KVCacheGroupSpec(["mamba"], state),
    ]


def mamba_mode(sched: Any, group: int) -> str | None:
    """KV cache group `group`'s Mamba cache mode ("align" or "none") of a vLLM scheduler; None
    for a group that is not Mamba."""
    manager = sched.kv_cache_manager.coordinator.single_type_managers[group]
    mode = getattr(manager, "mamba_cache_mode", None)
    return None if mode is None else str(mode)


def mamba_checkpoint(sched: Any, group: int, seq_len: int, query_len: int) -> tuple[int, int]:
    """Where vLLM's worker exports an internal prefill checkpoint for a row of KV cache group
    `group` that computes tokens `seq_len - query_len` to `seq_len`: (the tokens the state has
    taken in, its block-table column), or (0, -1) where it exports none (a group without
    checkpoint blocks, or not in align mode, or a row the rule declines). The worker's own
    rule, vLLM's `compute_mamba_prefill_checkpoints`, which its scheduler follows in lockstep
    (no drafts, so no EAGLE block drop and no lookahead tokens)."""
    manager = sched.kv_cache_manager.coordinator.single_type_managers[group]
    spec = manager.kv_cache_spec
    if (
        getattr(manager, "mamba_cache_mode", None) != "align"
        or not getattr(spec, "num_prefill_checkpoint_blocks", 0)
        or query_len <= 0
    ):
        return 0, -1
    worker = importlib.import_module("vllm.model_executor.layers.mamba.checkpoint")
    offsets, cols = worker.compute_mamba_prefill_checkpoints(
        [seq_len],
        [query_len],
        hash_block_size=int(manager.block_pool.hash_block_size),
        mamba_block_size=int(spec.block_size),
        checkpoint_alignment=spec.prefill_checkpoint_alignment,
        drop_eagle_block=False,
        cache_hit_alignment_tokens=int(manager.cache_hit_alignment_tokens),
    )
    if not offsets[0]:
        return 0, -1
    return seq_len - query_len + int(offsets[0]), int(cols[0])


def hybrid_pool(num_blocks: int, groups: int = 2) -> int:
    """The pool of a hybrid cache of `groups` KV cache groups for a program that names
    `num_blocks` (the null block included): that many usable blocks for each group, so that
    every request the program's configuration admits fits, as it does in one group."""
    return groups * (num_blocks - 1) + 1


def kv_groups(sched: Any) -> int:
    """How many KV cache groups a vLLM scheduler's pool serves."""
    return len(sched.kv_cache_manager.coordinator.single_type_managers)


def group_block_sizes(sched: Any) -> tuple[int, ...]:
    """Each KV cache group's block size in tokens, group by group, of a vLLM scheduler."""
    return tuple(int(m.block_size) for m in sched.kv_cache_manager.coordinator.single_type_managers)


def window_tokens(sched: Any, group: int) -> int | None:
    """The sliding window, in tokens, of KV cache group `group` of a vLLM scheduler; None for
    a group whose attention reads every earlier token."""
    manager = sched.kv_cache_manager.coordinator.single_type_managers[group]
    window = getattr(manager, "sliding_window", None)
    return None if window is None else int(window)


def group_tables(sched: Any, group: int) -> dict[str, tuple[int | None, ...]]:
    """Each request's blocks in KV cache group `group`, position by position: None where it
    holds the null block (a sliding-window group's blocks that left the window); requests
    holding none are absent."""
    manager = sched.kv_cache_manager.coordinator.single_type_managers[group]
    # list comprehensions, not generators: this runs several times an engine step
    return {
        rid: tuple([None if b.is_null else b.block_id for b in blocks])
        for rid, blocks in manager.req_to_blocks.items()
        if blocks
    }


#: Each KV cache group's block tables, group by group: request id -> its block ids position by
#: position, None where it holds the null block (`group_tables`).
GroupTables = tuple[dict[str, tuple[int | None, ...]], ...]


def all_group_tables(sched: Any) -> GroupTables:
    """Every KV cache group's block tables of a vLLM scheduler, as they stand now."""
    return tuple(group_tables(sched, group) for group in range(kv_groups(sched)))


def block_tables(sched: Any) -> dict[str, tuple[int, ...]]:
    """Each request's KV blocks in a vLLM scheduler (its first, full-attention group), the null
    block left out; requests holding none are absent."""
    return {
        rid: tuple([b for b in table if b is not None])
        for rid, table in group_tables(sched, 0).items()
    }


def blocks_held(sched: Any) -> dict[str, tuple[int, ...]]:
    """Each request's KV blocks in every KV cache group of a vLLM scheduler, group by group
    (the null block left out; `block_tables` is the first group's); requests holding none are
    absent."""
    held: dict[str, tuple[int, ...]] = {}
    for tables in all_group_tables(sched):
        for rid, table in tables.items():
            held[rid] = held.get(rid, ()) + tuple(b for b in table if b is not None)
    return held


def waiting_requests(sched: Any) -> Iterator[Any]:
    """A vLLM scheduler's waiting requests, queue by queue, each in its order: those holding KV
    for a connector (always none here) first, as vLLM admits them, then the plain queue, then
    (vLLM 0.34.0 with `max_num_inflight_kv_loads`) the requests its connector may load
    asynchronously, which vLLM takes from in turn with the plain queue by the policy's order."""
    yield from sched.kv_holding_waiting
    yield from sched.waiting
    yield from getattr(sched, "async_kv_waiting", ())


def cached_blocks(sched: Any) -> frozenset[int]:
    """The blocks whose content the prefix cache holds (the null block left out)."""
    pool = sched.kv_cache_manager.block_pool
    return frozenset(b.block_id for b in pool.blocks if b.block_hash is not None and not b.is_null)


def check_queues(sched: Any, where: str, max_num_seqs: int | None = None) -> None:
    """`SpecViolation` unless a vLLM scheduler's queues can be read as the AR spec's state,
    checked before anything is rebuilt from them (a queue a scheduler of the user's own broke
    would otherwise be read as decisions vLLM never made, or crash the reading): with
    `max_num_seqs`, at most that many entries on `running` (`seat_cap`); each request once
    on one queue, `running` or waiting, and each held in vLLM's `requests` map
    (`snapshot_matches`: no state of the spec's lists a request twice, or one vLLM dropped
    when it ended). `where` names the call just made (`after schedule() in step 3`)."""
    running = [str(r.request_id) for r in sched.running]
    waiting = [str(r.request_id) for r in waiting_requests(sched)]
    queues = f"running {running}, waiting {waiting}"
    seen = Counter(running + waiting)
    twice = [rid for rid, n in seen.items() if n > 1]
    if max_num_seqs is not None and len(running) > max_num_seqs:
        repeated = Counter(running)
        note = ", ".join(f"{rid} {_times(n)}" for rid, n in repeated.items() if n > 1)
        raise SpecViolation(
            ArRule.SEAT_CAP,
            f"{where}: vLLM's running queue has {len(running)} entries {running}"
            f"{f' ({note})' if note else ''}; max_num_seqs={max_num_seqs}",
        )
    if twice:
        rid = twice[0]
        on_running, on_waiting = running.count(rid), waiting.count(rid)
        if not on_waiting:
            what = f"vLLM's running queue lists {rid} {_times(on_running)}: {running}"
        elif not on_running:
            what = f"vLLM's waiting queues list {rid} {_times(on_waiting)}: {waiting}"
        else:
            what = f"vLLM lists {rid} both as running and as waiting: {queues}"
        raise SpecViolation(
            ArRule.SNAPSHOT_MATCHES,
            f"{where}: {what} (a request is on one queue, once; the adapter rebuilds no event "
            "from queues that disagree with themselves)",
        )
    held = sched.requests
    lost = [rid for rid in running + waiting if rid not in held]
    if lost:
        rid = lost[0]
        queue = "running" if rid in running else "waiting"
        raise SpecViolation(
            ArRule.SNAPSHOT_MATCHES,
            f"{where}: vLLM's {queue} queue holds {rid}, which its requests map no longer "
            f"holds (vLLM drops a request from it when it ends and its blocks are freed): "
            f"{queues}",
        )


def _times(n: int) -> str:
    return "twice" if n == 2 else f"{n} times"


def pool_view(
    sched: Any,
    prefix_caching: bool,
    scheduled: dict[str, int] | None = None,
    *,
    where: str = "reading vLLM's queues",
    max_num_seqs: int | None = None,
) -> ArPoolView:
    """A vLLM scheduler's pools now, for `spec.ar.reconstruct`; `scheduled` (after
    `schedule()`): computed tokens before the forward (vLLM already added this step's tokens to
    `num_computed_tokens`). Its queues are checked first (`check_queues`, with `where` and
    `max_num_seqs`): `SpecViolation` where they cannot be read as a state of the spec's."""
    check_queues(sched, where, max_num_seqs)
    done = scheduled or {}
    running = tuple(r.request_id for r in sched.running)
    waiting = tuple(r.request_id for r in waiting_requests(sched))
    computed = {
        rid: sched.requests[rid].num_computed_tokens - done.get(rid, 0) for rid in running + waiting
    }
    cached = cached_blocks(sched) if prefix_caching else frozenset()
    return ArPoolView(block_tables(sched), computed, running, waiting, cached)


def victim_order(sched: Any, before: ArPoolView, policy: Policy) -> list[str]:
    """The order vLLM picks victims in: the tail of running first (FCFS), or the lowest
    priority then latest arrival first (priority)."""
    order = list(reversed(before.running))
    if policy is Policy.PRIORITY:
        reqs = sched.requests
        order.sort(key=lambda rid: (reqs[rid].priority, reqs[rid].arrival_time), reverse=True)
    return order


_MODEL_CONFIGS: dict[tuple[int, bool], Any] = {}


def tiny_model_config(v: VllmModules, max_model_len: int, *, diffusion: bool = False) -> Any:
    """The tiny Llama's `ModelConfig` for `max_model_len`, a diffusion model with `diffusion`
    (built once per pair: it reads config.json and validates; the scheduler only reads it)."""
    key = (max_model_len, diffusion)
    mc = _MODEL_CONFIGS.get(key)
    if mc is None:
        with engine_on_pythonpath():
            mc = v.config.ModelConfig(
                model=str(model_dir(diffusion=diffusion)),
                skip_tokenizer_init=True,
                max_model_len=max_model_len,
                dtype="float32",
                seed=0,
            )
        _MODEL_CONFIGS[key] = mc
    return mc


@contextlib.contextmanager
def engine_on_pythonpath() -> Iterator[None]:
    """vLLM inspects the model class in a subprocess (once; the result is cached under
    VLLM_CACHE_ROOT): that subprocess must find vLLM too. Only for that call, so no other
    subprocess of this process sees the engine's packages."""
    old = os.environ.get("PYTHONPATH")
    with environment_variable(
        "PYTHONPATH", os.pathsep.join([str(MANIFEST.site_packages), *([old] if old else [])])
    ):
        yield


def _check_effective(
    sched: Any, config: ArConfig, async_scheduling: bool, speculative_tokens: int = 0
) -> None:
    """vLLM may adjust a setting while building its config (a platform default): refuse to
    check a scheduler whose effective settings are not the ones asked for."""
    sc = sched.scheduler_config
    effective = {
        "max_num_seqs": sched.max_num_running_reqs,
        "max_num_batched_tokens": sched.max_num_scheduled_tokens,
        "max_model_len": sched.max_model_len,
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        "enable_chunked_prefill": sc.enable_chunked_prefill,
    }
    for name, value in effective.items():
        wanted = getattr(config, name)
        if value != wanted:
            raise ConfigError(name, wanted, f"a value vLLM keeps (it made it {value!r})")
    effective_async = bool(sched.vllm_config.scheduler_config.async_scheduling)
    if effective_async != async_scheduling:
        raise ConfigError(
            "async_scheduling",
            async_scheduling,
            f"a value vLLM keeps (it made it {effective_async})",
        )
    if sched.num_spec_tokens != speculative_tokens:
        raise ConfigError(
            "speculative_tokens",
            speculative_tokens,
            f"a value vLLM keeps (it made it {sched.num_spec_tokens})",
        )


def _check_lookahead_pool(sched: Any, config: ArConfig) -> None:
    """With a drafter's lookahead slots, refuse a pool that cannot hold one `max_model_len`
    sequence, as vLLM's start-up does (`_check_enough_kv_cache_memory`: "To serve at least
    one request with the model's max seq len"). The adapter builds the scheduler past that
    check; without lookahead a smaller pool is harmless (every request still fits it), but
    lookahead slots (capped at `max_model_len`) can make a fitting request unadmittable."""
    if sched.num_lookahead_tokens == 0:
        return
    needed = -(-config.max_model_len // config.block_size) + 1  # and the null block
    if config.num_blocks < needed:
        raise ConfigError(
            "num_blocks",
            config.num_blocks,
            f">= {needed} with a drafter's lookahead (vLLM refuses at start-up a KV cache that "
            f"cannot hold one max_model_len={config.max_model_len} sequence)",
        )


def make_real_vllm(config: ArConfig, sink: ArEventSink) -> RealVllmScheduler:
    """Factory: vLLM 0.33.0's real v1 Scheduler, prefix caching off."""
    return RealVllmScheduler(config, sink, SPACE)


def make_real_vllm_prefix(config: ArConfig, sink: ArEventSink) -> RealVllmScheduler:
    """Factory: vLLM 0.33.0's real v1 Scheduler with prefix caching on."""
    return RealVllmScheduler(config, sink, SPACE_PREFIX)


def make_real_vllm_watermark(config: ArConfig, sink: ArEventSink) -> RealVllmScheduler:
    """Factory: vLLM 0.33.0's real v1 Scheduler with `watermark=VLLM_WATERMARK`, prefix
    caching as the config says."""
    return RealVllmScheduler(
        config, sink, SETTINGS_SPACE, admission=AdmissionKnobs(watermark=VLLM_WATERMARK)
    )


def make_real_vllm_adaptive(config: ArConfig, sink: ArEventSink) -> RealVllmScheduler:
    """Factory: vLLM 0.33.0's real v1 Scheduler with `long_prefill_token_threshold_adaptive=
    True`, prefix caching as the config says."""
    return RealVllmScheduler(
        config, sink, SETTINGS_SPACE, admission=AdmissionKnobs(adaptive_threshold=True)
    )


def make_real_vllm_cadence(config: ArConfig, sink: ArEventSink) -> RealVllmScheduler:
    """Factory: vLLM 0.33.0's real v1 Scheduler with `prefill_schedule_interval=
    VLLM_PREFILL_INTERVAL`, prefix caching as the config says."""
    return RealVllmScheduler(
        config,
        sink,
        SETTINGS_SPACE,
        admission=AdmissionKnobs(prefill_interval=VLLM_PREFILL_INTERVAL),
    )


def make_real_vllm_cache_aware(config: ArConfig, sink: ArEventSink) -> RealVllmScheduler:
    """Factory: vLLM 0.34.0's real v1 Scheduler with `cache_aware_admission_window=
    VLLM_CACHE_AWARE_WINDOW` (threshold `VLLM_CACHE_AWARE_THRESHOLD`), prefix caching as the
    config says; on 0.33.0, which lacks the setting, `ConfigError`."""
    return RealVllmScheduler(
        config,
        sink,
        SETTINGS_SPACE,
        settings_034=Vllm034Settings(VLLM_CACHE_AWARE_WINDOW, VLLM_CACHE_AWARE_THRESHOLD),
    )


def make_real_vllm_no_reserve(config: ArConfig, sink: ArEventSink) -> RealVllmScheduler:
    """Factory: vLLM 0.33.0's real v1 Scheduler with `scheduler_reserve_full_isl=False`,
    prefix caching as the config says."""
    return RealVllmScheduler(
        config, sink, SETTINGS_SPACE, admission=AdmissionKnobs(reserve_full_isl=False)
    )


__all__ = [
    "OUTPUT_BASE",
    "SPACE",
    "SPACE_PREFIX",
    "SPECULATIVE_METHODS",
    "STOP_BASE",
    "GroupTables",
    "OffloadingOptions",
    "RealVllmScheduler",
    "adapter_of",
    "all_group_tables",
    "appended_outputs",
    "block_tables",
    "blocks_held",
    "build_scheduler",
    "cached_blocks",
    "check_full_block_scale",
    "check_loras",
    "check_mamba",
    "check_queues",
    "check_retention_interval",
    "check_sliding_window",
    "check_window_block_scale",
    "engine_on_pythonpath",
    "environment_variable",
    "finish_reason_of",
    "group_block_sizes",
    "group_tables",
    "hybrid_groups",
    "hybrid_pool",
    "kv_groups",
    "load_vllm",
    "lora_of",
    "make_real_vllm",
    "make_real_vllm_adaptive",
    "make_real_vllm_cadence",
    "make_real_vllm_no_reserve",
    "make_real_vllm_prefix",
    "make_real_vllm_watermark",
    "mamba_checkpoint",
    "mamba_groups",
    "mamba_mode",
    "model_dir",
    "pool_view",
    "tiny_model_config",
    "v2_model_runner",
    "victim_order",
    "vllm_config_error",
    "vllm_rules",
    "waiting_requests",
    "window_tokens",
]
