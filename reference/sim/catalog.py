"""Replica schedulers by name, built from one `ReplicaSpec` (pool, seats, token budget).

- `simple`: `SimpleReplica` (full reservation, decode-run fusion; not one of Vidur's schedulers).
- `vidur-vllm`, `vidur-sarathi`, `vidur-orca`, `vidur-lightllm`, `vidur-ft`: the fast replicas
  (`fast_vllm.py`, `fast_vidur.py`), decision-identical to the `reference/ar/vidur.py` classes
  through `ArReplica` (tests/test_sim_fast.py).
- `vidur-vllm-released`, `vidur-sarathi-released`: the fast replicas that take the rules of
  Vidur's releases (`fast_vllm.FastVidurVllmReleased`, `fast_vidur.FastVidurSarathiReleased`),
  decision-identical to `vidur-vllm-released-ref` and `vidur-sarathi-released-ref`. vLLM's is
  not Vidur's own decisions under KV pressure: it follows the idealisation `vllm-decode-block`
  (a decode that needs no new block is never restarted, where Vidur 0.0.25 and 0.0.26 demand a
  free block for every running request and restart one when none is free), so wherever the
  pool runs dry their batches can differ.
- `vidur-*-ref`: those reference classes through `ArReplica` (the slow path, for checks);
  `vidur-vllm-released-ref` and `vidur-sarathi-released-ref` the classes that decide as
  Vidur's releases (`reference/ar/vidur_released.py`), the same way.
- `vllm-v1`: the reference vLLM v1 scheduler through `ArReplica`.

Every name is checked, and its configuration built, before any simulation starts.

Vidur's defaults where a replica has a setting of Vidur's: LightLLM tries a prefill batch every
`max_waiting_iters` = 10 decode batches (`LightllmSchedulerConfig`, vidur/config/config.py of
0.0.25). Orca and FasterTransformer reserve `max_model_len` tokens of blocks per request, and
Vidur reserves its request generator's `max_tokens` (4096 by default; `max_tokens //
block_size` blocks): their figures depend on `max_model_len`, which `ReplicaSpec` takes (1280
by default, `simulate sweep --max-model-len`; `simulate replicas` sets the workload's longest
request unless given `--max-model-len`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from reference.sim.errors import SimConfigError
from reference.sim.replica import ArReplica, ReplicaScheduler, SimpleReplica
from spec.ar.config import MAX_BLOCKS, ArConfig
from spec.errors import ConfigError

# name -> (module:factory of the reference class, chunked prefill, block size)
_AR: dict[str, tuple[str, bool, int]] = {
    "vidur-vllm-ref": ("reference.ar.vidur:make_vidur_vllm", False, 16),
    "vidur-sarathi-ref": ("reference.ar.vidur:make_vidur_sarathi", True, 16),
    "vidur-orca-ref": ("reference.ar.vidur:make_vidur_orca", False, 16),
    "vidur-lightllm-ref": ("reference.ar.vidur:make_vidur_lightllm", False, 1),
    "vidur-ft-ref": ("reference.ar.vidur:make_vidur_ft", False, 16),
    "vidur-vllm-released-ref": (
        "reference.ar.vidur_released:make_vidur_vllm_released",
        False,
        16,
    ),
    "vidur-sarathi-released-ref": (
        "reference.ar.vidur_released:make_vidur_sarathi_released",
        True,
        16,
    ),
    "vllm-v1": ("reference.ar.vllm_v1:make_vllm_v1", True, 16),
}
VIDUR_SCHEDULERS = ("vidur-vllm", "vidur-sarathi", "vidur-orca", "vidur-lightllm", "vidur-ft")
# the fast replicas: Vidur's five as the references decide, vLLM and Sarathi as its releases do
FAST_SCHEDULERS = (*VIDUR_SCHEDULERS, "vidur-vllm-released", "vidur-sarathi-released")
SCHEDULERS = ("simple", *FAST_SCHEDULERS, *_AR)


def _fast_class(name: str) -> Callable[[ArConfig], ReplicaScheduler]:
    from reference.sim import fast_vidur, fast_vllm

    classes: dict[str, Callable[[ArConfig], ReplicaScheduler]] = {
        "vidur-vllm": fast_vllm.FastVidurVllm,
        "vidur-sarathi": fast_vidur.FastVidurSarathi,
        "vidur-orca": fast_vidur.FastVidurOrca,
        "vidur-lightllm": fast_vidur.FastVidurLightLlm,
        "vidur-ft": fast_vidur.FastVidurFt,
        "vidur-vllm-released": fast_vllm.FastVidurVllmReleased,
        "vidur-sarathi-released": fast_vidur.FastVidurSarathiReleased,
    }
    return classes[name]


# Vidur's `LightllmSchedulerConfig.max_waiting_iters` default (0.0.25 and 0.0.26)
VIDUR_MAX_WAITING_ITERS = 10
LIGHTLLM_SCHEDULERS = ("vidur-lightllm", "vidur-lightllm-ref")


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One replica's resources: KV tokens, seats, per-batch token budget, longest request, and
    LightLLM's decode batches between prefill attempts (Vidur's default 10; read by
    `vidur-lightllm` only)."""

    scheduler: str = "vidur-vllm"
    kv_tokens: int = 16_384
    max_batch: int = 32
    budget: int = 2048
    max_model_len: int = 1280
    max_waiting_iters: int = VIDUR_MAX_WAITING_ITERS

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise SimConfigError("scheduler", self.scheduler, f"one of {', '.join(SCHEDULERS)}")
        for name in ("kv_tokens", "max_batch", "budget", "max_model_len", "max_waiting_iters"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SimConfigError(name, v, "an integer >= 1")

    def ar_config(self) -> ArConfig:
        """The `spec.ar` configuration (raises ConfigError naming the bad field; a pool out of
        the spec's range of blocks as `kv_tokens`, with the range in tokens)."""
        # a fast replica takes its reference class's settings
        _, chunked, bs = _AR.get(self.scheduler.removesuffix("-ref") + "-ref", ("", False, 16))
        if self.scheduler in _AR:
            _, chunked, bs = _AR[self.scheduler]
        blocks = self.kv_tokens // bs + 1  # and the null block
        if not 2 <= blocks <= MAX_BLOCKS:
            raise ConfigError(
                "kv_tokens",
                self.kv_tokens,
                f"{bs} to {MAX_BLOCKS * bs - 1} tokens for {self.scheduler} (1 to "
                f"{MAX_BLOCKS - 1} KV blocks of {bs} tokens)",
            )
        return ArConfig(
            block_size=bs,
            num_blocks=blocks,
            max_num_batched_tokens=self.budget,
            max_num_seqs=self.max_batch,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=chunked,
            max_waiting_iters=self.max_waiting_iters,
        )

    def factory(self) -> Callable[[], ReplicaScheduler]:
        """A maker of fresh replicas; builds (and so validates) one first."""
        if self.scheduler == "simple":

            def simple() -> ReplicaScheduler:
                return SimpleReplica(self.max_batch, self.kv_tokens, self.budget)

            maker = simple
        elif self.scheduler in FAST_SCHEDULERS:
            cls = _fast_class(self.scheduler)
            cfg = self.ar_config()

            def fast() -> ReplicaScheduler:
                return cls(cfg)

            maker = fast
        else:
            path = _AR[self.scheduler][0]
            mod, _, attr = path.partition(":")
            ar_factory = getattr(importlib.import_module(mod), attr)
            cfg = self.ar_config()

            def ar() -> ReplicaScheduler:
                return ArReplica(ar_factory, cfg)

            maker = ar
        maker()
        return maker
