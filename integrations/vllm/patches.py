"""What the candidate fixes of vLLM's code share: the installed vLLM file a fix edits, plus the
engine-neutral parts (`integrations.patches`: the error when the file no longer has the place a
fix edits, the fix as a patch of that file, and the scripts that print it)."""

from __future__ import annotations

from integrations.patches import FixDoesNotApply, module_text, print_patch, unified_patch
from integrations.vllm.adapter import load_vllm


def installed_text(module: str) -> str:
    """The text of the installed vLLM's file of `module` (vLLM loaded first, so a missing
    install is the usual typed error)."""
    load_vllm()
    return module_text(module)


__all__ = ["FixDoesNotApply", "installed_text", "print_patch", "unified_patch"]
