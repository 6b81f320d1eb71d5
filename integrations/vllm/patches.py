"""What the candidate fixes of vLLM's code share: the installed vLLM file a fix edits, plus the
engine-neutral parts (`integrations.patches`: the error when the file no longer has the place a
fix edits, the fix as a patch of that file, and the scripts that print it)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeAlias

from integrations.patches import (
    EngineFix,
    FixDoesNotApply,
    FixSet,
    module_text,
    print_patch,
    unified_patch,
)
from integrations.vllm.adapter import load_vllm

#: The module of vLLM's `Scheduler` (`vllm/v1/core/sched/scheduler.py`).
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
#: Text only vLLM 0.34.0's `scheduler.py` has (a parked KV load's reservation, kept apart from
#: `_inflight_prefills`): what tells a fix written for 0.34.0 (`EngineFix.releases`) is made.
SCHEDULER_034 = "    def _reserve_parked(self, request: Request) -> None:\n"

#: `ScheduleFix.apply` of one fix set, as a fix module exports it (`apply_<name>_fix`): give one
#: built `Scheduler` or `AsyncScheduler` the fixed methods.
ApplyFix: TypeAlias = Callable[[Any], None]
#: `ScheduleFix.as_diff` of one fix set, as a fix module exports it (`fix_as_diff`): the fixes as
#: a unified diff of the installed vLLM's `scheduler.py`.
FixDiff: TypeAlias = Callable[[], str]


def installed_text(module: str) -> str:
    """The text of the installed vLLM's file of `module` (vLLM loaded first, so a missing
    install is the usual typed error)."""
    load_vllm()
    return module_text(module)


class ScheduleFix:
    """Candidate fixes of vLLM's `Scheduler` (most of them of `schedule`), edits of its
    `scheduler.py` (`fixes`, made in the order given), given to one built scheduler at a time:
    `fix_set` is their `FixSet` (what `scripts/engine_fixes_diff.py` prints), `methods()` the
    fixed `Scheduler` methods the fixes declare, by name (compiled once, on first use),
    `schedule()` the fixed `schedule`, `as_diff()` the patch, `apply(sched)` gives `sched` the
    fixed methods through a subclass of its class (no other scheduler changes). Two fixes that
    edit different statements compose: `ScheduleFix(a, b)`. `engine` names the release the
    fixes are written against, in the error when the installed file lacks a place they edit."""

    def __init__(self, *fixes: EngineFix, engine: str = "vLLM 0.33.0") -> None:
        if not fixes:
            raise ValueError("ScheduleFix needs at least one fix")
        self.names: tuple[str, ...] = tuple(f.name for f in fixes)
        self.fix_set: FixSet = FixSet(
            engine=engine,
            modules=(SCHEDULER_MODULE,),
            fixes=fixes,
            exclusive=(),
            load=load_vllm,
            importing=contextlib.nullcontext,
        )

    @functools.cached_property
    def _methods(self) -> dict[str, Any]:
        methods = self.fix_set.fixed_methods(self.names)
        prefix = "Scheduler."
        return {
            dotted.removeprefix(prefix): method
            for (module, dotted), method in methods.items()
            if module == SCHEDULER_MODULE and dotted.startswith(prefix)
        }

    def methods(self) -> dict[str, Any]:
        """The fixed `Scheduler` methods by name, reading vLLM's module globals."""
        return dict(self._methods)

    def schedule(self) -> Any:
        """vLLM's `Scheduler.schedule` with the fixes made, reading vLLM's module globals."""
        return self._methods["schedule"]

    def as_diff(self) -> str:
        """The fixes as a unified diff of the installed vLLM's `scheduler.py` (paths as `git
        apply -p1` in a vLLM checkout wants), made from that file when called."""
        return self.fix_set.as_diff(self.names)

    def installed(self) -> tuple[EngineFix, ...]:
        """The fixes as written for the installed vLLM (`FixSet.installed_variant`): what a
        caller building a variant of one edits."""
        return self.fix_set.installed_variant(self.names)

    def apply(self, sched: Any) -> None:
        """Give `sched` (a built `Scheduler` or `AsyncScheduler`) the fixed methods, and the
        attributes the fixes' `__init__` edits would have given it (`EngineFix.state`)."""
        cls = type(sched)
        sched.__class__ = type(cls.__name__, (cls,), self.methods())
        for fix in self.fix_set.fixes:
            for attribute, factory in fix.state:
                setattr(sched, attribute, factory())


__all__ = [
    "SCHEDULER_034",
    "SCHEDULER_MODULE",
    "ApplyFix",
    "FixDiff",
    "FixDoesNotApply",
    "ScheduleFix",
    "installed_text",
    "print_patch",
    "unified_patch",
]
