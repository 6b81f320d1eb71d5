"""A candidate fix for a finding in vLLM 0.33.0's own KV offloading connector with KV cache
events on: a connector reset empties the CPU tier without a word.

The finding (docs/engines/vllm-kv.md, "KV cache events"):
`reset_prefix_cache(reset_connector=True)`, as a weight update calls it, resets the offloading
connector's cache whether or not the prefix cache's own reset succeeds (it fails while KV is in
use). `CPUOffloadingManager.reset_cache` drops every stored chunk and queues no event, so where the
prefix cache's reset failed, and with it its `AllBlocksCleared`, nothing tells a router that the CPU
tier is empty: it keeps counting on CPU-tier hits that are gone (`kv_events`). Each tier is
responsible for its own events, and an eviction of a stored chunk does queue its removal.

The fix: the manager keeps the keys it announced stored and has not announced removed, and a
reset announces their removal before it clears the chunks, as an eviction would. The connector
translates the manager's events with payloads it keeps per chunk (with
`self_describing_kv_events`, a chunk's per-block keys) and drops at a reset: it now translates
the reset's events before it drops them, and publishes them ahead of the next ones (else a
removal would name the chunk's key where its store named per-block keys, and drop the payload
of the chunk's re-offload). It is an edit of vLLM's own `vllm/v1/kv_offload/cpu/manager.py` and
`offloading/scheduler.py` (in `OFFLOADING_FIXES`):
`scripts/engine_fixes_diff.py vllm-offloading` prints it as a patch with the connector's other
fixes, and `apply_announce_cpu_reset(sched)` gives one built scheduler's connector and its
manager the edited methods (`offload_window_fixes.apply_offloading_fixes`, which makes it
together with `forget-stale-window`, the other fix of `_reset_cache`). `FixDoesNotApply` if
vLLM's files no longer have the statements the fix edits, or the scheduler serves no
offloading connector.
"""

from __future__ import annotations

from typing import Any

from integrations.patches import EngineFix, FixDoesNotApply

MANAGER_MODULE = "vllm.v1.kv_offload.cpu.manager"
SCHEDULER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
ANNOUNCE_CPU_RESET = "announce-cpu-reset"
_METHODS = ("prepare_store", "complete_store", "reset_cache")
_CONNECTOR_METHODS = ("_reset_cache", "take_events")

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

# The connector translates the manager's events with payloads it drops at a reset: translate
# the reset's own events first, and publish them ahead of the next ones.
_TRACKER = "        self._events_tracker = OffloadingEventsTracker(\n"
_TRACKER_AND_RESET_EVENTS = (
    "        # Events of a cache reset, translated before the reset dropped their payloads.\n"
    "        self._reset_events: list[KVCacheEvent] = []\n" + _TRACKER
)
_TRACKER_RESET = (
    "        # The manager pool is empty; pending event payloads and announced\n"
    "        # reference counts are stale.\n"
    "        self._events_tracker.reset()\n"
)
_TRACKER_RESET_AFTER_EVENTS = (
    "        # The manager pool is empty. Translate the events that say so while\n"
    "        # their payloads are known; then the payloads are stale.\n"
    "        self._reset_events.extend(\n"
    "            self._events_tracker.take_events(list(self.manager.take_events()))\n"
    "        )\n"
    "        self._events_tracker.reset()\n"
)
_DRAINED = "            manager_events = list(self.manager.take_events())\n"
_DRAINED_AFTER_RESET = _DRAINED + (
    "            reset_events, self._reset_events = self._reset_events, []\n"
    "        yield from reset_events\n"
)

ANNOUNCE_CPU_RESET_FIX = EngineFix(
    ANNOUNCE_CPU_RESET,
    (
        (MANAGER_MODULE, _EVENTS, _EVENTS_AND_ANNOUNCED),
        (MANAGER_MODULE, _EVICTED, _EVICTED_FORGOTTEN),
        (MANAGER_MODULE, _STORED, _STORED_REMEMBERED),
        (MANAGER_MODULE, _CLEARED, _CLEARED_ANNOUNCED),
        (SCHEDULER_MODULE, _TRACKER, _TRACKER_AND_RESET_EVENTS),
        (SCHEDULER_MODULE, _TRACKER_RESET, _TRACKER_RESET_AFTER_EVENTS),
        (SCHEDULER_MODULE, _DRAINED, _DRAINED_AFTER_RESET),
    ),
    tuple((MANAGER_MODULE, f"CPUOffloadingManager.{name}") for name in _METHODS)
    + tuple(
        (SCHEDULER_MODULE, f"OffloadingConnectorScheduler.{name}") for name in _CONNECTOR_METHODS
    ),
    "a connector reset empties the CPU tier without an event (where the prefix cache's reset "
    "fails, nothing says so): announce the removal of every chunk announced stored",
)


def check_cpu_manager(connector: Any) -> None:
    """`FixDoesNotApply` unless the offloading connector's scheduler side `connector` holds
    vLLM's `CPUOffloadingManager` (the class the fix edits)."""
    manager = getattr(connector, "manager", None)
    if type(manager).__name__ != "CPUOffloadingManager":
        raise FixDoesNotApply(
            f"{ANNOUNCE_CPU_RESET} edits the CPU manager of vLLM's offloading connector; this "
            f"scheduler's connector holds {type(manager).__name__}"
        )


def start_announcing(connector: Any) -> None:
    """What the edited `__init__`s start, for a connector and manager built before the fix was
    given to them (and before any store): nothing announced, no reset's events pending."""
    connector.manager._announced_keys = {}
    connector._reset_events = []


def apply_announce_cpu_reset(sched: Any) -> None:
    """`announce-cpu-reset` on the offloading connector of `sched` and its CPU manager (a built
    scheduler, before any store; `offload_window_fixes.apply_offloading_fixes`, which composes
    it with the connector's other fixes); `FixDoesNotApply` for a scheduler without them."""
    from integrations.vllm.offload_window_fixes import apply_offloading_fixes

    apply_offloading_fixes(sched, [ANNOUNCE_CPU_RESET])


__all__ = [
    "ANNOUNCE_CPU_RESET",
    "ANNOUNCE_CPU_RESET_FIX",
    "MANAGER_MODULE",
    "SCHEDULER_MODULE",
    "apply_announce_cpu_reset",
    "check_cpu_manager",
    "start_announcing",
]
