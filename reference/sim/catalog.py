"""Replica schedulers by name, built from one `ReplicaSpec` (pool, seats, token budget).

- `simple`: `SimpleReplica` (full reservation, decode-run fusion; not one of Vidur's schedulers).
- `vidur-vllm`: `FastVidurVllm`, decision-identical to the reference class (tested).
- `vidur-sarathi`, `vidur-orca`, `vidur-lightllm`, `vidur-ft`: the `reference/ar/vidur.py`
  classes through `ArReplica`.
- `vidur-vllm-ref`: the reference vLLM class through `ArReplica` (the slow path, for checks).
- `vllm-v1`: the reference vLLM v1 scheduler through `ArReplica`.

Every name is checked, and its configuration built, before any simulation starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from reference.sim.errors import SimConfigError
from reference.sim.replica import ArReplica, ReplicaScheduler, SimpleReplica
from spec.ar.config import ArConfig

# name -> (module:factory of the reference class, chunked prefill, block size)
_AR: dict[str, tuple[str, bool, int]] = {
    "vidur-vllm-ref": ("reference.ar.vidur:make_vidur_vllm", False, 16),
    "vidur-sarathi": ("reference.ar.vidur:make_vidur_sarathi", True, 16),
    "vidur-orca": ("reference.ar.vidur:make_vidur_orca", False, 16),
    "vidur-lightllm": ("reference.ar.vidur:make_vidur_lightllm", False, 1),
    "vidur-ft": ("reference.ar.vidur:make_vidur_ft", False, 16),
    "vllm-v1": ("reference.ar.vllm_v1:make_vllm_v1", True, 16),
}
SCHEDULERS = ("simple", "vidur-vllm", *_AR)
VIDUR_SCHEDULERS = ("vidur-vllm", "vidur-sarathi", "vidur-orca", "vidur-lightllm", "vidur-ft")


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One replica's resources: KV tokens, seats, per-batch token budget, longest request."""

    scheduler: str = "vidur-vllm"
    kv_tokens: int = 16_384
    max_batch: int = 32
    budget: int = 2048
    max_model_len: int = 1280

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise SimConfigError("scheduler", self.scheduler, f"one of {', '.join(SCHEDULERS)}")
        for name in ("kv_tokens", "max_batch", "budget", "max_model_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SimConfigError(name, v, "an integer >= 1")

    def ar_config(self) -> ArConfig:
        """The `spec.ar` configuration (raises ConfigError naming the bad field)."""
        _, chunked, bs = _AR.get(self.scheduler, ("", False, 16))
        return ArConfig(
            block_size=bs,
            num_blocks=self.kv_tokens // bs + 1,
            max_num_batched_tokens=self.budget,
            max_num_seqs=self.max_batch,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=chunked,
        )

    def factory(self) -> Callable[[], ReplicaScheduler]:
        """A maker of fresh replicas; builds (and so validates) one first."""
        if self.scheduler == "simple":

            def simple() -> ReplicaScheduler:
                return SimpleReplica(self.max_batch, self.kv_tokens, self.budget)

            maker = simple
        elif self.scheduler == "vidur-vllm":
            from reference.sim.fast_vllm import FastVidurVllm

            cfg = self.ar_config()

            def fast() -> ReplicaScheduler:
                return FastVidurVllm(cfg)

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
