"""Built-in implementations, by name, as import strings (`module:factory`).

`properties` never imports an implementation statically: it resolves these strings at run time,
exactly as it resolves a user's own `package.module:factory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from properties.harness import load_factory
from spec.adapter import ImplementationFactory


@dataclass(frozen=True, slots=True)
class BuiltinImpl:
    name: str
    target: str  # module:factory
    family: Literal["dllm", "ar"]
    parity: Literal["always", "bs1", "never"]
    description: str


BUILTINS: dict[str, BuiltinImpl] = {
    b.name: b
    for b in (
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
    )
}


def resolve(name_or_target: str) -> tuple[str, ImplementationFactory, BuiltinImpl | None]:
    """(display name, factory, builtin entry or None) for a built-in name or module:factory."""
    builtin = BUILTINS.get(name_or_target)
    target = builtin.target if builtin else name_or_target
    return name_or_target, load_factory(target), builtin
