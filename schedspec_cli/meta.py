"""What every report records about where and when it was made: date, commit, versions, device
and host (report.md / report.json of `schedspec verify` and the main job)."""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from schedspec_cli import version
from schedspec_cli.loader import module_available

PACKAGES = ("schedspec", "hypothesis", "z3-solver", "numpy", "torch", "matplotlib")


def _commit() -> str:
    """The source tree's git commit (with '+dirty' for local changes), or 'unknown'."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return "unknown (not a git checkout)"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown (git not available)"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _versions() -> dict[str, str]:
    out: dict[str, str] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["schedspec"] = version() if out["schedspec"] == "not installed" else out["schedspec"]
    return out


def device() -> str:
    """The accelerator torch reports ('cpu' when none, or torch is not installed)."""
    if not module_available("torch"):
        return "cpu (torch not installed)"
    import torch

    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    return "cpu"


def device_if_loaded() -> str:
    """The accelerator, if something this run imported loaded torch (an implementation on the
    torch engine, which picks CUDA when there is one); else 'not used'. Importing torch only to
    say so would cost seconds on every run of a pure-Python implementation."""
    if "torch" not in sys.modules:
        return "not used"
    return f"{device()} (torch loaded by an implementation; it may pin itself to the CPU)"


def run_metadata(*, with_device: bool = True) -> dict[str, Any]:
    """Date (UTC, ISO 8601), commit, package versions, device, host and the command line.
    Without `with_device`, the device only if torch was loaded (`device_if_loaded`)."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "versions": _versions(),
        "device": device() if with_device else device_if_loaded(),
        "host": {
            "name": platform.node(),
            "system": f"{platform.system()} {platform.release()}",
            "machine": platform.machine(),
            "cpu": _cpu_model(),
            "cpus": _cpus(),
        },
        "command": "schedspec " + " ".join(sys.argv[1:]),
    }


def _cpu_model() -> str:
    """The CPU's model name ("" when the OS names none): figures move with the CPU."""
    from gpu.host import cpu_model  # torch-free, but gpu is imported lazily (schedspec --help)

    return cpu_model()


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def markdown(meta: dict[str, Any]) -> str:
    """The metadata as a short markdown section."""
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    host = meta["host"]
    return "\n".join(
        [
            "## Run",
            "",
            f"- date: {meta['date']}",
            f"- commit: {meta['commit']}",
            f"- command: `{meta['command']}`",
            f"- versions: {versions}",
            f"- device: {meta['device']}",
            f"- host: {host['name']} ({host['system']}, {host['machine']}, {host['cpus']} CPUs"
            + (f", {host['cpu']})" if host.get("cpu") else ")"),
            "",
        ]
    )


__all__ = ["device", "markdown", "run_metadata"]
