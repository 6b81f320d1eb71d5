"""Check your own vLLM scheduler class: `SCHEDSPEC_VLLM_SCHEDULER_CLS=pkg.module.Class`.

vLLM's own extension point for a scheduler of one's own is `SchedulerConfig.scheduler_cls`
(the server's `--scheduler-cls`): a class, or its qualified name `pkg.module.Class`, that the
engine core builds in place of `Scheduler` / `AsyncScheduler`. Setting the variable does the same
for every vLLM built-in of this project (`real-vllm`, `real-vllm-prefix`, the engine-core loops,
...): the adapter sets `scheduler_cls` before vLLM picks its class, so the suite checks yours,
with the adapter's snapshot, events and rules unchanged. A vLLM maintainer checking a change to
`Scheduler.schedule` writes it as a subclass and runs

    SCHEDSPEC_VLLM_SCHEDULER_CLS=my_sched.MyScheduler schedspec verify --impl real-vllm

The module is imported after the engine install is activated, so it may import vLLM at its top.
The class must subclass the class vLLM would build for the configuration (`Scheduler` for the
synchronous built-ins, `AsyncScheduler` for the asynchronous engine-core loops, vLLM's diffusion
schedulers for its dLLM built-ins): a class that is not one is a `ConfigError` naming the
variable (exit 2), as is a name that does not import. `verify`'s JSON records the class beside
the release (`"engine": {..., "scheduler_cls": "my_sched.MyScheduler"}`).
"""

from __future__ import annotations

import importlib
from typing import Any

from integrations.scheduler_class import resolve_class, selected_class
from spec.errors import ConfigError

#: The environment variable naming the scheduler class (vLLM's `--scheduler-cls` form).
SCHEDULER_VARIABLE = "SCHEDSPEC_VLLM_SCHEDULER_CLS"

_FORM = (
    "a scheduler class named as vLLM's --scheduler-cls takes it, 'package.module.Class', "
    "importable here"
)


def selected_scheduler_cls() -> str | None:
    """The class `SCHEDSPEC_VLLM_SCHEDULER_CLS` names, or None when it is unset or empty."""
    return selected_class(SCHEDULER_VARIABLE)


def resolve_scheduler_cls(qualname: str) -> type[Any]:
    """Import the class `qualname` names (vLLM must be importable: call after the install is
    activated). A `ConfigError` naming the variable when the name is malformed, its module does
    not import, or the attribute is not a class."""
    return resolve_class(SCHEDULER_VARIABLE, qualname, _FORM)


def check_selected(builtin: str | None = None) -> None:
    """Up front, before a run: when the variable is set, its class imports and subclasses
    vLLM's `Scheduler` (or `SchedulerInterface`, for a scheduler written from scratch). The
    engine must already be activated (`MANIFEST.load()`). `builtin`, the built-in about to
    run, changes nothing: the class each built-in needs is checked where it is built."""
    qualname = selected_scheduler_cls()
    if qualname is None:
        return
    cls = resolve_scheduler_cls(qualname)
    interface = importlib.import_module("vllm.v1.core.sched.interface").SchedulerInterface
    if not issubclass(cls, interface):
        raise ConfigError(
            SCHEDULER_VARIABLE,
            qualname,
            "a subclass of vLLM's Scheduler (vllm.v1.core.sched.scheduler.Scheduler), or of its "
            "SchedulerInterface",
        )


def scheduler_class_for(default: type[Any]) -> type[Any]:
    """The class to build where vLLM would build `default`: the variable's class when set (it
    must subclass `default`: a `ConfigError` saying which class the configuration runs
    otherwise), else `default`."""
    qualname = selected_scheduler_cls()
    if qualname is None:
        return default
    cls = resolve_scheduler_cls(qualname)
    if not issubclass(cls, default):
        raise ConfigError(
            SCHEDULER_VARIABLE,
            qualname,
            f"a subclass of {default.__module__}.{default.__qualname__}, the class vLLM builds "
            f"for this configuration ({qualname} is not one); the synchronous built-ins "
            "(real-vllm, real-vllm-prefix, ...) run Scheduler",
        )
    return cls
