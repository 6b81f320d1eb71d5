"""SGLang 0.5.23's real dLLM scheduler path, assembled on CPU for one `DllmConfig`.

What runs for real (SGLang's own code, unmodified):
- `Scheduler.get_next_batch_to_run` (managers/scheduler.py:3894) with the dLLM mixin
  (dllm/mixin/scheduler.py): `get_new_batch_dllm`, `DllmManager`, `PrefillAdder`
  (managers/schedule_policy.py, `add_one_req`, `add_dllm_staging_req`), `ScheduleBatch.init_new`
  and `prepare_for_extend`, `alloc_for_extend` with its in-place KV reuse
  (mem_cache/allocation.py:374), `finish_dllm_forward` / `stash_chunked_request`;
- the pools: `ReqToTokenPool` (row 0 reserved for padding), `PagedTokenToKVPoolAllocator`
  (page_size > 1) or `TokenToKVPoolAllocator` (page_size 1) on device `cpu` (page 0 reserved),
  and `UnifiedRadixCache`, disabled unless `build(..., radix_cache=True)` (SGLang 0.5.23
  turns it on for dLLM by default since its PR #18724; a configuration with
  `DllmConfig.prefix_cache` asks for it);
- `TpModelWorker._forward_batch_generation_dllm` (managers/tp_worker.py:593) and the base
  `DllmAlgorithm.run` (dllm/algorithm/base.py: `_run_sync` / `_run_fdfo`) with a scripted
  `step` (`ScriptedStep`) in place of a model's logits;
- `Scheduler.process_batch_result_dllm` (commit, carry `dllm_incomplete_ids`, finish, release)
  and `Scheduler.abort_request` (managers/scheduler.py:5675).

What is stubbed, and why (each is plumbing, never a scheduling decision):
- the Scheduler and TpModelWorker are built with `__new__`; the attributes they read are set by
  hand in `build` (their `__init__` starts processes, loads a model and opens sockets);
- observability and I/O attributes (`scheduler_stage_metrics`, `metrics_reporter`,
  `output_streamer`, `ipc_channels`, `grammar_manager`, `beam_coordinator`) are no-op objects;
  `dp_attn_adapter` / `ngram_embedding_manager` pass the batch through unchanged (no data
  parallelism, no n-gram embedding);
- the model runner: `forward` returns no logits (the scripted step does not read them; the
  observer sees each forward by wrapping it, as on a live server); the forward batch is a
  minimal object (`batch_size`, `input_ids` = the batch's own `prefill_input_ids_cpu`,
  `dllm_prompt_mask=None`) because `ForwardBatch.init_new` needs a model runner;
- the runtime context: a dummy `ServerArgs` published once with `override_server_args`
  (dllm_algorithm set, device cpu, radix cache disabled), and `pp_max_micro_batch_size` =
  max_running_requests published per build, exactly as `Scheduler.__init__` does
  (managers/scheduler.py:1237);
- requests are built as `Req` objects and appended to `waiting_queue` (what
  `handle_generate_request` does after tokenisation, which is not on the path), each stamped
  with an increasing `wait_queue_entry_time` (1, 2, ...: `_add_request_to_queue` stamps the
  wall clock, which two quick submissions can share; the counter keeps ties in submission
  order).

Priority scheduling (`build(..., priority=True)`, `--enable-priority-scheduling` with
`--schedule-low-priority-values-first`): `enable_priority_scheduling` is set and the policy is
`SchedulePolicy("fcfs", tree, False, True, True)`, so `calc_priority` sorts `waiting_queue` by
(priority, wait_queue_entry_time) every round, lower values first
(managers/schedule_policy.py `_sort_by_priority_and_fcfs`). Priority preemption stays off: on
the dLLM path it could never act, since `PrefillAdder.preempt_to_schedule` only preempts
requests of `running_batch`, which the dLLM path leaves empty (its running requests live in the
`DllmManager`).

Longest output first (`build(..., lof=True)`, `--schedule-policy lof`): the policy is
`SchedulePolicy("lof", tree, False, priority, priority)` (`_validate_and_adjust_policy` takes
it as `CacheAgnosticPolicy.LOF` whatever the tree cache), so `calc_priority` sorts
`waiting_queue` by `-max_new_tokens` every round, after the priority under priority scheduling
(managers/schedule_policy.py `_sort_by_longest_output`). That sort is stable and the queue only
grows at its tail, so ties stay in submission order.

Any other `--schedule-policy` (`build(..., schedule_policy=...)`): `lpm`, `dfs-weight`, `hrrn`
and `shortest-prefill-first` sort `waiting_queue` by what the radix tree holds
(`_compute_prefix_matches` matches every waiting request first; with the tree off the first
three are FCFS, `_validate_and_adjust_policy`), and `random` shuffles it. No event log can
check such an order, so their profile declares it free (`DllmPolicy.free_queue_order`).
"""

from __future__ import annotations

import contextlib
import importlib
import traceback
import types
import warnings
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from integrations.sglang import stubs
from integrations.sglang.manifest import MANIFEST
from spec.config import DllmConfig, Mode
from spec.errors import CannotDrive, ConfigError

_modules: dict[str, Any] = {}

# What the adapter uses from SGLang: name -> (module, attribute or None for the module itself).
_ENGINE_NAMES: dict[str, tuple[str, str | None]] = {
    "torch": ("torch", None),
    "DllmAlgorithm": ("sglang.srt.dllm.algorithm.base", "DllmAlgorithm"),
    "SgDllmConfig": ("sglang.srt.dllm.config", "DllmConfig"),
    "DllmManager": ("sglang.srt.dllm.mixin.scheduler", "DllmManager"),
    "AbortReq": ("sglang.srt.managers.io_struct", "AbortReq"),
    "Req": ("sglang.srt.managers.schedule_batch", "Req"),
    "FINISH_ABORT": ("sglang.srt.managers.schedule_batch", "FINISH_ABORT"),
    "ScheduleBatch": ("sglang.srt.managers.schedule_batch", "ScheduleBatch"),
    "SchedulePolicy": ("sglang.srt.managers.schedule_policy", "SchedulePolicy"),
    "CacheAwarePolicy": ("sglang.srt.managers.schedule_policy", "CacheAwarePolicy"),
    "Scheduler": ("sglang.srt.managers.scheduler", "Scheduler"),
    "NewTokenRatioTracker": (
        "sglang.srt.managers.scheduler_components.new_token_ratio_tracker",
        "NewTokenRatioTracker",
    ),
    "TpModelWorker": ("sglang.srt.managers.tp_worker", "TpModelWorker"),
    "PagedTokenToKVPoolAllocator": (
        "sglang.srt.mem_cache.allocator.paged",
        "PagedTokenToKVPoolAllocator",
    ),
    "TokenToKVPoolAllocator": ("sglang.srt.mem_cache.allocator.token", "TokenToKVPoolAllocator"),
    "CacheInitParams": ("sglang.srt.mem_cache.cache_init_params", "CacheInitParams"),
    "ReqToTokenPool": ("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool"),
    "ComponentType": ("sglang.srt.mem_cache.unified_cache.components", "ComponentType"),
    "UnifiedRadixCache": ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache"),
    "get_context": ("sglang.srt.runtime_context", "get_context"),
    "SamplingParams": ("sglang.srt.sampling.sampling_params", "SamplingParams"),
    "SpeculativeAlgorithm": ("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm"),
    "DisaggregationMode": ("sglang.srt.disaggregation.utils", "DisaggregationMode"),
}


@contextlib.contextmanager
def quiet_stubbed_imports() -> Iterator[None]:
    """SGLang's imports as `import_engine` makes them: the plumbing stubs in place
    (`stubs.importing`), and SGLang's kernel modules' import warnings silenced (they warn that
    this device has no AWQ, GGUF or Triton kernels; the scheduler path never calls them, so the
    user is not told)."""
    with stubs.importing(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"sglang\.")
        yield


def import_engine(activate: bool = True) -> dict[str, Any]:
    """Activate the install, put the stubs in place and import SGLang's scheduler path (once).

    Raises `integrations.manifest.EngineNotInstalled` (a ConfigError naming the install
    command) when SGLang is not installed, and `EngineImportFailed` when it is but does not
    import in this environment (a module it needs is missing here). `activate=False` is for
    the installer's import check, which runs before the install is stamped complete, with the
    engine directory already on PYTHONPATH.
    """
    if _modules:
        return _modules
    if activate:
        MANIFEST.activate()
    loaded: dict[str, Any] = {}
    # The installer's check reports an ImportError itself; a run gets the typed error.
    with MANIFEST.importing() if activate else contextlib.nullcontext(), quiet_stubbed_imports():
        for key, (module, attr) in _ENGINE_NAMES.items():
            imported = importlib.import_module(module)
            loaded[key] = imported if attr is None else getattr(imported, attr)
    _modules.update(loaded)  # only a complete import is kept: a failed one is retried whole
    _modules["get_context"]().override_server_args(
        dllm_algorithm="LowConfidence", device="cpu", disable_radix_cache=True
    ).install()
    return _modules


class NoOp:
    """An observability / I/O collaborator: every call does nothing."""

    def __init__(self, name: str = "noop") -> None:
        self._name = name

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return NoOp(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __bool__(self) -> bool:
        return False


class _Passthrough:
    """A batch transformer that is the identity (no DP attention, no n-gram embedding)."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: args[0] if args else None


#: SGLang 0.5.23's `--schedule-policy` choices (arg_groups/fields/schedule.py) that `build`
#: takes; `priority` is the one it leaves out (a deprecated alias of priority scheduling).
SCHEDULE_POLICIES = (
    "fcfs",
    "lof",
    "lpm",
    "dfs-weight",
    "hrrn",
    "shortest-prefill-first",
    "random",
    "routing-key",
)

SCRIPTED_VOCAB = 16
"""The scripted step writes ids 0..15: the ids the property suites draw prompts, the EOS (15)
and stop token ids (0..14) from, so a generated token is the EOS one time in sixteen and a
drawn stop token id about as often: the suites see requests end at both."""


class AttributeNotBuilt(CannotDrive, AttributeError):
    """SGLang's code read an attribute of the `Scheduler` or `TpModelWorker` the adapter built
    without its `__init__` (`build`), one it does not set: a change to SGLang that reads a new
    attribute, which a real server's `__init__` would set, says where to set it. The adapter's
    limit, not SGLang's fault: `verify` refuses the run with it (exit 2)."""


#: The classes `build` makes with `__new__`, setting by hand the attributes 0.5.23 reads.
_HAND_BUILT = ("Scheduler", "TpModelWorker")


@contextlib.contextmanager
def attributes_built() -> Iterator[None]:
    """Around the adapter's calls into SGLang: an `AttributeError` of a hand-built object's
    missing attribute becomes `AttributeNotBuilt`, naming the attribute, the line that read it
    and where the adapter sets such attributes, instead of reading as a bug of SGLang's."""
    try:
        yield
    except AttributeError as err:
        owner = type(getattr(err, "obj", None)).__name__
        if owner not in _HAND_BUILT or err.name is None:
            raise
        frames = traceback.extract_tb(err.__traceback__)
        read = f" (read at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})"
        raise AttributeNotBuilt(
            f"SGLang's {owner} has no attribute {err.name!r}{read}: the adapter builds it without "
            "its __init__ (no GPU, no server arguments) and sets what 0.5.23's dLLM path reads; "
            "a change that reads a new attribute needs it set in integrations/sglang/engine.py "
            f"(`build`), as your {owner}.__init__ would (or the name is misspelt)"
        ) from err


def scripted_token(rid: str, position: int, mask: int) -> int:
    """The token the scripted step writes at `position` of request `rid` (never the mask)."""
    tok = zlib.crc32(f"{rid}@{position}".encode()) % SCRIPTED_VOCAB
    return tok + 1 if tok == mask else tok


def unmask_per_step(rid: str, block_index: int, block_size: int) -> int:
    """Masks the scripted step fills per step for this block: 1 .. block_size, fixed per
    (request, block), so a block needs between 1 and block_size steps to unmask."""
    return 1 + zlib.crc32(f"{rid}#{block_index}".encode()) % block_size


@dataclass(slots=True)
class Engine:
    """One assembled SGLang scheduler, its pools and its worker, for one config."""

    config: DllmConfig
    scheduler: Any
    worker: Any
    req_to_token_pool: Any
    allocator: Any
    tree_cache: Any
    sg_config: Any
    spec_id: dict[int, str]  # id(Req) -> the spec's request id
    queued: int = 0  # requests queued so far (`queue_request`: their entry times)

    @property
    def page_size(self) -> int:
        """Tokens per KV page (`config.page_size`; the allocator's and the scheduler's)."""
        return self.config.page_size


def build(
    config: DllmConfig,
    spec_id: dict[int, str],
    *,
    priority: bool = False,
    lof: bool = False,
    radix_cache: bool = False,
    schedule_policy: str | None = None,
) -> Engine:
    """Assemble SGLang's scheduler path for `config` (see the module docstring); with
    `priority`, under priority scheduling, lower priority values first; with `lof`, under
    `--schedule-policy lof` (longest output first); with `radix_cache`, its block-level radix
    cache on (SGLang's default for dLLM); with `schedule_policy`, under that
    `--schedule-policy` instead (one of `SCHEDULE_POLICIES`; priority scheduling takes only
    `fcfs` or `lof`, as SGLang's own argument check says). A `ConfigError` otherwise."""
    policy_name = schedule_policy if schedule_policy is not None else ("lof" if lof else "fcfs")
    if policy_name not in SCHEDULE_POLICIES or (lof and policy_name != "lof"):
        raise ConfigError(
            "schedule_policy",
            policy_name if not lof else f"{policy_name} with lof",
            f"one of {', '.join(SCHEDULE_POLICIES)} (lof=True means lof)",
        )
    if priority and policy_name not in ("fcfs", "lof"):
        raise ConfigError(
            "schedule_policy",
            policy_name,
            "fcfs or lof under priority scheduling (SGLang: 'To use priority scheduling, "
            "schedule_policy must be 'fcfs' or 'lof'')",
        )
    if policy_name == "shortest-prefill-first" and not radix_cache:
        raise ConfigError(
            "schedule_policy",
            policy_name,
            "a policy other than shortest-prefill-first with the radix cache off (SGLang: "
            "'Experimental shortest-prefill-first requires prefix caching')",
        )
    m = import_engine()
    torch = m["torch"]
    b, p = config.block_size, config.page_size
    m["get_context"]().override(
        "schedspec.pp_max_micro_batch_size", pp_max_micro_batch_size=config.max_running_requests
    )
    rtp = m["ReqToTokenPool"](
        size=config.req_pool_rows,
        max_context_len=config.max_context + b,
        device="cpu",
        enable_memory_saver=False,
    )
    slots = config.kv_pages * p
    if p == 1:
        allocator = m["TokenToKVPoolAllocator"](
            size=slots, dtype=torch.float32, device="cpu", kvcache=None, need_sort=True
        )
    else:
        allocator = m["PagedTokenToKVPoolAllocator"](
            size=slots,
            page_size=p,
            dtype=torch.float32,
            device="cpu",
            kvcache=None,
            need_sort=True,
        )
    params = m["CacheInitParams"](
        disable=not radix_cache,
        req_to_token_pool=rtp,
        token_to_kv_pool_allocator=allocator,
        page_size=p,
    )
    params.tree_components = (m["ComponentType"].FULL,)
    tree = m["UnifiedRadixCache"](params)
    sg_config = m["SgDllmConfig"](
        algorithm="LowConfidence",
        algorithm_config={},
        block_size=b,
        mask_id=config.mask_token_id,
        max_running_requests=config.max_running_requests,
        first_done_first_out_mode=config.mode is Mode.FDFO,
    )
    s = m["Scheduler"].__new__(m["Scheduler"])
    s.dllm_config = sg_config
    s.dllm_manager = m["DllmManager"](sg_config)
    s.waiting_queue = []
    s.req_to_token_pool = rtp
    s.token_to_kv_pool_allocator = allocator
    s.tree_cache = tree
    s.page_size = p
    s.chunked_req = None
    s._pending_chunked_abort_req = None
    s.running_batch = m["ScheduleBatch"](reqs=[], batch_is_full=False)
    s.last_batch = None
    # (policy, tree, enable_hierarchical_cache, enable_priority_scheduling,
    #  schedule_low_priority_values_first)
    s.policy = m["SchedulePolicy"](policy_name, tree, False, priority, priority)
    s.new_token_ratio_tracker = m["NewTokenRatioTracker"].from_config()
    s.max_prefill_tokens = 1 << 30
    s.chunked_prefill_size = None
    s.is_mixed_chunk = False
    s.priority_scheduling_preemption_threshold = 0
    s.truncation_align_size = None
    eos = config.eos_token_id
    s.model_config = types.SimpleNamespace(
        context_len=config.max_context,
        vocab_size=1 << 30,
        is_encoder_decoder=False,
        hf_eos_token_id=None if eos is None else {eos},
    )
    s.enable_overlap = False
    s.spec_algorithm = m["SpeculativeAlgorithm"].from_string(None)
    s.disaggregation_mode = m["DisaggregationMode"].NULL
    for flag in (
        "enable_hierarchical_cache",
        "enable_hisparse",
        "enable_priority_preemption",
        "enable_unified_cache_external_linker",
        "enable_lmcache",
        "require_mlp_sync",
        "enable_continuous_input_polling",
    ):
        setattr(s, flag, False)
    s.enable_priority_scheduling = priority
    s.schedule_low_priority_values_first = priority
    for name in (
        "scheduler_stage_metrics",
        "output_streamer",
        "ipc_channels",
        "grammar_manager",
    ):
        setattr(s, name, NoOp(name))
    s.metrics_reporter = NoOp("metrics_reporter")
    s.metrics_reporter.num_generated_tokens = 0
    s.beam_coordinator = NoOp("beam_coordinator")
    s.beam_coordinator.pending_member_rows = lambda batch: 0
    s.dp_attn_adapter = _Passthrough()
    s.ngram_embedding_manager = _Passthrough()
    s._arm_prefill_decode_interval = lambda batch: None
    s.mm_receiver = None
    s.rust_server = None

    algorithm = _scripted_algorithm(m, sg_config, spec_id)
    worker = m["TpModelWorker"].__new__(m["TpModelWorker"])
    worker.dllm_algorithm = algorithm
    worker._model_runner = _Runner()
    return Engine(config, s, worker, rtp, allocator, tree, sg_config, spec_id)


class _Runner:
    """The model runner: computes no logits (the scripted step does not read them)."""

    def forward(self, forward_batch: Any, pp_proxy_tensors: Any = None) -> Any:
        return types.SimpleNamespace(
            logits_output=types.SimpleNamespace(full_logits=None), can_run_graph=False
        )


def _scripted_algorithm(m: dict[str, Any], sg_config: Any, spec_id: dict[int, str]) -> Any:
    base = m["DllmAlgorithm"]

    class ScriptedStep(base):  # type: ignore[misc, valid-type]
        """`DllmAlgorithm` whose `step` fills masks by a fixed script instead of a model's
        confidences: per (request, block) a fixed number of masks per step, left to right,
        with a fixed token per position. Like every SGLang algorithm it reports a row done
        only when its block had no mask when the step started (dllm/algorithm/base.py)."""

        def step(self, forward_batch: Any, full_logits: Any, states: list[Any]) -> list[bool]:
            b = self.block_size
            ids = forward_batch.input_ids.view(forward_batch.batch_size, b)
            done: list[bool] = []
            for i, req in enumerate(forward_batch.reqs):
                rid = spec_id[id(req)]
                start = req.extend_end - b
                masked = [j for j in range(b) if int(ids[i, j]) == self.mask_id]
                fill = masked[: unmask_per_step(rid, start // b, b)]
                for j in fill:
                    ids[i, j] = scripted_token(rid, start + j, self.mask_id)
                done.append(not masked)
            return done

    return ScriptedStep(sg_config)


def new_request(
    engine: Engine,
    rid: str,
    prompt: tuple[int, ...],
    max_new_tokens: int,
    *,
    stop: tuple[str, ...] = (),
    stop_token_ids: tuple[int, ...] = (),
    ignore_eos: bool = False,
    priority: int | None = None,
    tokenizer: Any = None,
) -> Any:
    """A greedy SGLang `Req` for `engine`, as `handle_generate_request` builds one after
    tokenisation (EOS the model config's, vocabulary unbounded); the caller queues it
    (`queue_request`). `stop`, `stop_token_ids` and `ignore_eos` are the request's
    `SamplingParams` of those names; stop strings are matched on text, so they need a
    `tokenizer`. `priority` is the `Req`'s own (its scheduling priority, read only under
    priority scheduling)."""
    m = import_engine()
    params = m["SamplingParams"](
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        stop=list(stop) or None,
        stop_token_ids=list(stop_token_ids) or None,
        ignore_eos=ignore_eos,
    )
    params.normalize(tokenizer)
    req = m["Req"](
        rid,
        "",
        array("q", prompt),
        params,
        dllm_config=engine.sg_config,
        vocab_size=1 << 30,
        eos_token_ids=engine.scheduler.model_config.hf_eos_token_id,
        priority=priority,
    )
    req.tokenizer = tokenizer
    return req


def queue_request(engine: Engine, req: Any) -> None:
    """Append `req` to the scheduler's `waiting_queue` and stamp its `wait_queue_entry_time`
    as `Scheduler._add_request_to_queue` does, with the count of requests queued so far
    (1, 2, ...) in place of the wall clock: priority scheduling breaks ties by that time, and
    the count keeps them in submission order."""
    engine.queued += 1
    engine.scheduler.waiting_queue.append(req)
    req.time_stats.set_wait_queue_entry_time(float(engine.queued))


def run_worker(engine: Engine, batch: Any) -> Any:
    """`TpModelWorker._forward_batch_generation_dllm` on `batch` (the real hook and the real
    `DllmAlgorithm.run`), with the minimal forward batch described in the module docstring."""
    forward_batch = types.SimpleNamespace(
        batch_size=len(batch.reqs),
        input_ids=batch.prefill_input_ids_cpu.clone(),
        dllm_prompt_mask=None,
        reqs=list(batch.reqs),
    )
    return engine.worker._forward_batch_generation_dllm(forward_batch, batch)


__all__ = [
    "Engine",
    "build",
    "import_engine",
    "new_request",
    "queue_request",
    "run_worker",
    "scripted_token",
]
