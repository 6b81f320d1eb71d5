"""Vidur's REAL replica schedulers (vLLM, Sarathi, Orca, LightLLM, FasterTransformer and
Mnemosyne FCFS with a fixed chunk) under the AR spec, at a constant execution time.

`REAL_VIDUR_VLLM`, `REAL_VIDUR_SARATHI`, `REAL_VIDUR_ORCA`, `REAL_VIDUR_LIGHTLLM`,
`REAL_VIDUR_FT` and `REAL_VIDUR_MNEMOSYNE` are `ArImplementation`s (built-in names
`real-vidur-vllm|sarathi|orca|lightllm|ft|mnemosyne`). Importing this package does not import
Vidur: a factory activates `MANIFEST` (raising `EngineNotInstalled`, which names
`schedspec install-engines vidur`, when it is missing) and then imports it. See
`integrations.vidur.adapter` for what runs for real and every stub, and
`integrations.vidur.fixes` for the candidate fixes of its findings (edits of Vidur's own files,
which the tests run and `scripts/engine_fixes_diff.py vidur` prints as a patch).

The release is 0.0.25 unless `SCHEDSPEC_VIDUR_VERSION` selects 0.0.26 (`manifest`), whose
vLLM, Sarathi, Orca and Mnemosyne schedulers `build` constructs with its `CacheConfig`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from integrations.vidur.manifest import MANIFEST, VIDUR_VERSION
from integrations.vidur.profiles import PROFILES
from spec.ar.adapter import ArEventSink, ArImplementationFactory, ArSchedulerAdapter
from spec.ar.config import ArConfig
from spec.errors import ConfigError
from spec.implementation import ArImplementation

KINDS: tuple[str, ...] = ("vllm", "sarathi", "orca", "lightllm", "ft", "mnemosyne")


def check_config(kind: str, config: ArConfig) -> None:
    """Refuse, with a `ConfigError` naming the field, what Vidur's `kind` cannot express.

    The profile's space (`ConfigOutsideProfile`: FCFS, one stage, no prefix cache, no prefill
    threshold, LightLLM block size 1, Orca / FasterTransformer a pool that holds one
    max_model_len reservation, as Vidur sizes its pool as a multiple of it), and one replica.
    LightLLM's pool bound is not checked: it keeps the programs the suite draws to requests
    LightLLM's router accepts (`pool_spare_tokens`), and Vidur runs a smaller pool (its
    finding's counterexamples).
    """
    space = PROFILES[kind].space
    if space.pool_spare_tokens:  # LightLLM's request limit, not what Vidur can run
        space = dataclasses.replace(space, pool_holds_max_model_len=False, pool_spare_tokens=0)
    space.check(config)
    if config.num_replicas != 1:
        raise ConfigError("num_replicas", config.num_replicas, "1: one replica scheduler")


def build(kind: str, config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """A `VidurAdapter` driving a fresh, real Vidur `kind` replica scheduler for `config`."""
    check_config(kind, config)
    from integrations.vidur import engine
    from integrations.vidur.adapter import VidurAdapter

    MANIFEST.require_shipped(f"real-vidur-{kind}")
    vidur = engine.load()
    scheduler = replica_scheduler(kind, config, vidur)
    rules = PROFILES[kind].policy.rules_for(config)
    return VidurAdapter(
        config, sink, kind=kind, rules=rules, scheduler=scheduler, request_cls=vidur.Request
    )


def replica_scheduler(
    kind: str,
    config: ArConfig,
    vidur: Any,
    sequence_parallel: bool = False,
    kv_parallel: tuple[int, int] | None = None,
) -> Any:
    """A fresh, real Vidur `kind` replica scheduler (`vidur`: `engine.load()`) for `config`, with
    `config.num_stages` pipeline stages (and sequence pipeline parallelism when asked and there
    are several), built by its own `__init__` from Vidur's config dataclasses, at a constant
    execution time; `kv_parallel`: Mnemosyne's (groups, tokens a group). Checks nothing:
    `check_config` (one stage) and
    `integrations.vidur.pipeline.check_pipeline_config` (several) do."""
    from integrations.vidur.adapter import _ConstantTime
    from integrations.vidur.custom_scheduler import scheduler_class_for

    watermark = PROFILES[kind].policy.watermark_fraction
    generator = vidur.SyntheticRequestGeneratorConfig(
        length_generator_config=vidur.FixedRequestLengthGeneratorConfig(
            max_tokens=config.max_model_len
        )
    )
    options: dict[str, Any] = {"batch_size_cap": config.max_num_seqs}
    if kind in ("vllm", "lightllm"):
        options["max_tokens_in_batch"] = config.max_num_batched_tokens
    if kind == "lightllm":
        options["max_waiting_iters"] = config.max_waiting_iters
    if kind in ("sarathi", "mnemosyne"):
        options["chunk_size"] = config.max_num_batched_tokens
    stage: dict[str, Any] = {
        "num_pipeline_stages": config.num_stages,
        "tensor_parallel_size": 1,
        # with one stage Vidur turns it off itself, logging a warning
        "enable_sequence_pipeline_parallel": sequence_parallel and config.num_stages > 1,
    }
    if kv_parallel is not None:
        stage["kv_parallel_size"], stage["max_num_tokens_per_kvp_group"] = kv_parallel
    if vidur.CacheConfig is None:  # 0.0.25: the pool is the scheduler's, the block the replica's
        replica_config = vidur.ReplicaConfig(**stage, block_size=config.block_size)
        options |= {"num_blocks": config.usable_blocks, "watermark_blocks_fraction": watermark}
        cache: tuple[Any, ...] = ()
        replica = vidur.Replica(replica_config, generator)
    else:  # 0.0.26: both in a CacheConfig, passed beside the scheduler's own
        replica_config = vidur.ReplicaConfig(**stage)
        cache = (
            vidur.CacheConfig(
                block_size=config.block_size,
                num_blocks=config.usable_blocks,
                watermark_blocks_fraction=watermark,
            ),
        )
        replica = vidur.Replica(replica_config)
    # Vidur's class, or a subclass the user named (SCHEDSPEC_VIDUR_SCHEDULER_CLS)
    scheduler = scheduler_class_for(kind, vidur.schedulers[kind])(
        replica_config,
        vidur.scheduler_configs[kind](**options),
        *cache,
        generator,
        replica,
        config.num_stages,
        _ConstantTime(),
    )
    if kind == "ft" and not hasattr(scheduler, "_preempted_batches"):
        scheduler._preempted_batches = []  # vidur 0.0.25 never initialises it (see adapter)
    return scheduler


def factory(kind: str) -> ArImplementationFactory:
    """The `(config, sink) -> adapter` factory of Vidur's `kind` replica scheduler."""
    if kind not in KINDS:
        raise ConfigError("kind", kind, f"one of {', '.join(KINDS)}")

    def make(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        return build(kind, config, sink)

    make.__name__ = make.__qualname__ = f"make_real_vidur_{kind}"
    return make


def _implementation(kind: str, what: str) -> ArImplementation:
    return ArImplementation(
        factory(kind),
        PROFILES[kind],
        f"Vidur {VIDUR_VERSION} {what} replica scheduler (real class, constant batch time)",
    )


REAL_VIDUR_VLLM = _implementation("vllm", "vLLM")
REAL_VIDUR_SARATHI = _implementation("sarathi", "Sarathi")
REAL_VIDUR_ORCA = _implementation("orca", "Orca")
REAL_VIDUR_LIGHTLLM = _implementation("lightllm", "LightLLM")
REAL_VIDUR_FT = _implementation("ft", "FasterTransformer")
REAL_VIDUR_MNEMOSYNE = _implementation("mnemosyne", "Mnemosyne FCFS fixed-chunk")


__all__ = [
    "KINDS",
    "MANIFEST",
    "REAL_VIDUR_FT",
    "REAL_VIDUR_LIGHTLLM",
    "REAL_VIDUR_MNEMOSYNE",
    "REAL_VIDUR_ORCA",
    "REAL_VIDUR_SARATHI",
    "REAL_VIDUR_VLLM",
    "build",
    "check_config",
    "factory",
    "replica_scheduler",
]
