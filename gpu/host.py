"""The machine a measurement ran on, named without torch (the command line's run metadata
imports this where torch may be absent)."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name: the first "model name" line of /proc/cpuinfo (or of `cpuinfo`,
    its text), else `platform.processor()`; "" when neither names one."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name" and value.strip():
            return " ".join(value.split())
    return platform.processor().strip()


__all__ = ["cpu_model"]
