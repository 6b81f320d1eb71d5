"""What an engine's event log names as its writer (the header's `writer`, `spec.trace.writer_of`).

A log is checked long after it was written, often by someone who did not run the server; the
verdict is about one engine release, and a finding of that release reads differently once it
is fixed. So the live-scheduler logs (`integrations.sglang.event_log`,
`integrations.vllm.event_log`) write the release the scheduler came from, and the class when it
is not the engine's own (a maintainer serving a subclass of their own).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


def engine_release(package: str) -> str:
    """The `__version__` of the imported engine `package` (its `package.version` module when
    the package does not set one), or "unknown" when neither says."""
    module = sys.modules.get(package)
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = getattr(importlib.import_module(f"{package}.version"), "__version__", None)
        except Exception:  # a version module that fails to import says nothing
            version = None
    return str(version) if version is not None else "unknown"


def scheduler_writer(scheduler: Any, package: str) -> str:
    """`"<package> <release>"` for a scheduler of the engine's own classes, and
    `"<package> <release>, scheduler_cls <module>.<class>"` for one whose class is defined
    outside `package` (a subclass the server was given)."""
    cls = type(scheduler)
    writer = f"{package} {engine_release(package)}"
    if cls.__module__ == package or cls.__module__.startswith(f"{package}."):
        return writer
    return f"{writer}, scheduler_cls {cls.__module__}.{cls.__qualname__}"
