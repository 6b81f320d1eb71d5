"""A candidate fix for a finding in vLLM 0.33.0's own KV offloading connector with KV cache
events on: a connector reset empties the CPU tier without a word.

The finding (docs/engines.md, "KV cache events"): `reset_prefix_cache(reset_connector=True)`,
as a weight update calls it, resets the offloading connector's cache whether or not the prefix
cache's own reset succeeds (it fails while KV is in use). `CPUOffloadingManager.reset_cache`
drops every stored chunk and queues no event, so where the prefix cache's reset failed, and
with it its `AllBlocksCleared`, nothing tells a router that the CPU tier is empty: it keeps
counting on CPU-tier hits that are gone (`kv_events`). Each tier is responsible for its own
events, and an eviction of a stored chunk does queue its removal.

The fix: the manager keeps the keys it announced stored and has not announced removed, and a
reset announces their removal before it clears the chunks, as an eviction would. It is an edit
of vLLM's own `vllm/v1/kv_offload/cpu/manager.py` (`OFFLOAD_EVENTS_FIXES`):
`scripts/engine_fixes_diff.py vllm-offloading` prints it as a patch with the connector's other
fixes, and `apply_announce_cpu_reset(sched)` gives one built scheduler's manager the edited
methods. `FixDoesNotApply` if vLLM's file no longer has the statements the fix edits, or the
scheduler serves no offloading connector.
"""

from __future__ import annotations

import functools
from typing import Any

from integrations.patches import EngineFix, FixDoesNotApply

MANAGER_MODULE = "vllm.v1.kv_offload.cpu.manager"
ANNOUNCE_CPU_RESET = "announce-cpu-reset"
_METHODS = ("prepare_store", "complete_store", "reset_cache")

_EVENTS = "        self.events: list[OffloadingEvent] | None = [] if enable_events else None\n"
_EVENTS_AND_ANNOUNCED = _EVENTS + (
    "        # Keys announced stored and not removed since: a reset owes their removal.\n"
    "        self._announced_keys: dict[OffloadKey, None] = {}\n"
)
_EVICTED = "        if to_evict and self.events is not None:\n"
_EVICTED_FORGOTTEN = _EVICTED + (
    "            for key in to_evict:\n                self._announced_keys.pop(key, None)\n"
)
_STORED = "        if stored_keys and self.events is not None:\n"
_STORED_REMEMBERED = (
    _STORED + "            self._announced_keys.update(dict.fromkeys(stored_keys))\n"
)
_CLEARED = "        self._policy.clear()\n        self._cache_generation += 1\n"
_CLEARED_ANNOUNCED = (
    "        if self._announced_keys and self.events is not None:\n"
    "            # Every stored chunk goes: announce its removal, as an eviction does.\n"
    "            self.events.append(\n"
    "                OffloadingEvent(\n"
    "                    keys=list(self._announced_keys),\n"
    "                    medium=self.medium,\n"
    "                    removed=True,\n"
    "                )\n"
    "            )\n"
    "        self._announced_keys.clear()\n" + _CLEARED
)

ANNOUNCE_CPU_RESET_FIX = EngineFix(
    ANNOUNCE_CPU_RESET,
    (
        (MANAGER_MODULE, _EVENTS, _EVENTS_AND_ANNOUNCED),
        (MANAGER_MODULE, _EVICTED, _EVICTED_FORGOTTEN),
        (MANAGER_MODULE, _STORED, _STORED_REMEMBERED),
        (MANAGER_MODULE, _CLEARED, _CLEARED_ANNOUNCED),
    ),
    tuple((MANAGER_MODULE, f"CPUOffloadingManager.{name}") for name in _METHODS),
    "a connector reset empties the CPU tier without an event (where the prefix cache's reset "
    "fails, nothing says so): announce the removal of every chunk announced stored",
)


@functools.cache
def _fixed_methods() -> dict[str, Any]:
    from integrations.vllm.offload_window_fixes import OFFLOADING_FIXES

    methods = OFFLOADING_FIXES.fixed_methods((ANNOUNCE_CPU_RESET,))
    return {name: methods[(MANAGER_MODULE, f"CPUOffloadingManager.{name}")] for name in _METHODS}


def apply_announce_cpu_reset(sched: Any) -> None:
    """Give the CPU manager of the offloading connector of `sched` (a built scheduler, before
    any store) the edited methods, and the record the edited `__init__` starts;
    `FixDoesNotApply` for a scheduler without vLLM's offloading connector and its CPU manager."""
    connector = getattr(getattr(sched, "connector", None), "connector_scheduler", None)
    manager: Any = getattr(connector, "manager", None)
    if type(manager).__name__ != "CPUOffloadingManager":
        raise FixDoesNotApply(
            f"{ANNOUNCE_CPU_RESET} edits the CPU manager of vLLM's offloading connector; this "
            f"scheduler's connector holds {type(manager).__name__}"
        )
    cls = type(manager)
    manager.__class__ = type(cls.__name__, (cls,), _fixed_methods())
    manager._announced_keys = {}


__all__ = [
    "ANNOUNCE_CPU_RESET",
    "ANNOUNCE_CPU_RESET_FIX",
    "MANAGER_MODULE",
    "apply_announce_cpu_reset",
]
