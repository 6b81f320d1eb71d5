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
synchronous built-ins and loop, `AsyncScheduler` for the asynchronous engine-core loop,
`DiffusionScheduler` / `DiffusionAsyncScheduler` for the diffusion loops of
`scripts/vllm_dllm_check.py`): a class that is not one is a `ConfigError` naming the variable
(exit 2), as is a name that does not import. The scripts check it up front for the loops they
run (`check_for_loops`), before any program, so a class of the wrong kind is never counted as a
configuration vLLM refuses. `verify`'s JSON records the class beside the release (`"engine":
{..., "scheduler_cls": "my_sched.MyScheduler"}`), as the scripts' output and JSON do, and every
command a script prints to rerun a finding starts with the variable.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
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


def is_scheduler_cls_error(err: BaseException) -> bool:
    """Whether `err` is about the class the variable names (the user's to fix: exit 2), not a
    configuration vLLM refuses: a `ConfigError` naming the variable, or one whose message
    carries such an error (the adapter words a `ValueError` of the scheduler's build as a KV
    cache configuration vLLM refuses)."""
    return isinstance(err, ConfigError) and (
        err.field == SCHEDULER_VARIABLE or f"invalid {SCHEDULER_VARIABLE}=" in str(err)
    )


def loop_class(*, async_scheduling: bool, diffusion: bool = False) -> type[Any]:
    """The class vLLM builds for an engine-core loop: `Scheduler` / `AsyncScheduler`, or, for a
    diffusion model, `DiffusionScheduler` / `DiffusionAsyncScheduler` (vLLM imported)."""
    if diffusion:
        module = importlib.import_module("vllm.v1.core.sched.diffusion_scheduler")
        name = "DiffusionAsyncScheduler" if async_scheduling else "DiffusionScheduler"
        return getattr(module, name)  # type: ignore[no-any-return]
    if async_scheduling:
        module = importlib.import_module("vllm.v1.core.sched.async_scheduler")
        return module.AsyncScheduler  # type: ignore[no-any-return]
    return importlib.import_module("vllm.v1.core.sched.scheduler").Scheduler  # type: ignore[no-any-return]


def check_for_loops(
    loops: Collection[str], *, diffusion: bool = False, sync_alone: str = ""
) -> str | None:
    """Up front, for a script that runs vLLM's engine-core `loops` ("sync", "async"; with
    `diffusion`, its diffusion loops): the class the variable names, or None when it is unset.
    vLLM is activated to import it. A `ConfigError` naming the variable when the class does not
    subclass the class vLLM builds in each loop run (`loop_class`), or when an autoregressive
    loop is given a diffusion scheduler; `sync_alone` (e.g. "--loop sync") says how to run the
    synchronous loop alone, for a class that serves only there."""
    qualname = selected_scheduler_cls()
    if qualname is None:
        return None
    from integrations.vllm.adapter import load_vllm  # the adapter imports this module

    load_vllm()
    cls = resolve_scheduler_cls(qualname)
    if not diffusion and issubclass(cls, loop_class(async_scheduling=False, diffusion=True)):
        raise ConfigError(
            SCHEDULER_VARIABLE,
            qualname,
            "a subclass of vLLM's Scheduler or AsyncScheduler for these autoregressive loops "
            f"({qualname} is a diffusion scheduler: scripts/vllm_dllm_check.py runs those)",
        )
    for mode in ("sync", "async"):
        want = loop_class(async_scheduling=mode == "async", diffusion=diffusion)
        if mode not in loops or issubclass(cls, want):
            continue
        note = ""
        sync_class = loop_class(async_scheduling=False, diffusion=diffusion)
        if mode == "async" and issubclass(cls, sync_class):
            alone = f" ({sync_alone})" if sync_alone else ""
            note = (
                f"; it serves the sync loop alone{alone}; a class of both, e.g. "
                f"class Both({want.__name__}, {cls.__name__}), serves both"
            )
        raise ConfigError(
            SCHEDULER_VARIABLE,
            qualname,
            f"a subclass of {want.__module__}.{want.__qualname__}, the class vLLM builds for the "
            f"{mode} loop{' of a diffusion model' if diffusion else ''} this runs ({qualname} is "
            f"not one{note})",
        )
    return qualname
