"""Built-in implementations, by name, as import strings (`module:factory`).

`properties` never imports an implementation statically: it resolves these strings at run time,
exactly as it resolves a user's own `package.module:factory`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Literal

from properties.harness import load_factory
from spec.adapter import ImplementationFactory
from spec.errors import ConfigError


@dataclass(frozen=True, slots=True)
class BuiltinImpl:
    name: str
    target: str  # module:factory
    family: Literal["dllm", "ar"]
    parity: Literal["always", "bs1", "never"]
    description: str
    machine: str = ""  # module:builder of its conformance machine ("" = the dLLM machine)
    default_verify: bool = True  # part of `schedspec verify` with no --impl


DLLM_BUILTINS: tuple[BuiltinImpl, ...] = (
    BuiltinImpl(
        "reference-dllm",
        "reference.dllm:make_scheduler",
        "dllm",
        "always",
        "plain-Python reference dLLM scheduler, LowConfidence over pseudo-logits",
    ),
    BuiltinImpl(
        "reference-dllm-joint",
        "reference.dllm:make_joint_threshold_scheduler",
        "dllm",
        "always",
        "the reference driven by JointThreshold (carries algorithm state between rounds)",
    ),
    BuiltinImpl(
        "reference-dllm-scripted",
        "reference.dllm:make_scripted_scheduler",
        "dllm",
        "always",
        "the reference with step-count patterns (1 to block_size+1 steps per block)",
    ),
    BuiltinImpl(
        "engine",
        "gpu.engine:make_small_engine",
        "dllm",
        "bs1",
        "the torch engine: trained block-diffusion model, paged KV tensors (CPU or CUDA)",
    ),
)


def all_builtins() -> dict[str, BuiltinImpl]:
    """Every built-in implementation: the dLLM ones and, when present, the autoregressive ones
    (`properties.ar.registry.AR_BUILTINS`)."""
    out = {b.name: b for b in DLLM_BUILTINS}
    try:
        ar = importlib.import_module("properties.ar.registry")
    except ImportError:
        return out
    for name, target in getattr(ar, "AR_BUILTINS", {}).items():
        out[name] = BuiltinImpl(
            name,
            target,
            "ar",
            "never",
            f"autoregressive scheduler ({target})",
            machine="properties.ar.conformance:ar_conformance_machine",
        )
    return out


BUILTINS = {b.name: b for b in DLLM_BUILTINS}


def resolve(name_or_target: str) -> tuple[str, ImplementationFactory, BuiltinImpl | None]:
    """(display name, factory, builtin entry or None) for a built-in name or module:factory."""
    builtins = all_builtins()
    builtin = builtins.get(name_or_target)
    if builtin is None and ":" not in name_or_target:
        raise ConfigError(
            "impl", name_or_target, f"a built-in name {sorted(builtins)} or 'module:factory'"
        )
    target = builtin.target if builtin else name_or_target
    return name_or_target, load_factory(target), builtin
