"""A candidate fix for a finding in vLLM 0.33.0's offloading connector with
`self_describing_kv_events`: a CPU chunk evicted and stored again before the eviction's events
are translated is announced without its blocks.

The finding (docs/engines/vllm-kv.md, "KV cache events"): the connector's `OffloadingEventsTracker`
keeps, per chunk key, the payload its `BlockStored` and `BlockRemoved` name (the chunk's
per-block keys and tokens) and the tiers the chunk is resident in, a set. A store records the
primary tier there when it is scheduled; a removal takes it away when it is translated, and a
batch of events drops the payload of every removed chunk left resident nowhere. When the CPU
tier evicts a chunk and a request stores the same chunk again before the eviction's events are
translated, the second store adds a residency the set already holds; the eviction then takes
the only one, and the batch drops the second store's payload. The completed store is announced
by the chunk's own key with no tokens, and a reader of blocks' keys never learns those blocks
again (`kv_events`).

The fix (`count-recorded-stores`): the tracker also counts, per chunk, the primary-tier stores
it recorded whose removal (an eviction, or a failed store's metadata-only removal) it has not
translated. A primary-tier removal takes the residency only when it ends the last of them. It
is an edit of vLLM's own `offloading/events.py` (in `OFFLOADING_FIXES`):
`scripts/engine_fixes_diff.py vllm-offloading --fix count-recorded-stores` prints it, and
`apply_count_recorded_stores(sched)` gives one built scheduler's event tracker the edited
methods. `FixDoesNotApply` if vLLM's file no longer has the statements the fix edits, or the
scheduler serves no offloading connector.

vLLM 0.34.0 rebuilt the tracker (`tracker_rebuilt`): it builds a complete chunk's store from
its request's context and keeps residencies as a bitmask. The finding's programs pass there,
and the fix's place is gone.
"""

from __future__ import annotations

from typing import Any

from integrations.patches import EngineFix

EVENTS_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.events"


def tracker_rebuilt() -> bool:
    """Whether the installed vLLM's offloading event tracker is 0.34.0's, which builds a
    complete chunk's store from its request's context (`on_new_request`): there the finding
    does not reproduce and this fix does not apply."""
    from integrations.vllm.patches import installed_text

    return "    def on_new_request(\n" in installed_text(EVENTS_MODULE)


COUNT_RECORDED_STORES = "count-recorded-stores"
_TRACKER = "OffloadingEventsTracker"
_METHODS = ("record_store", "record_partial_store", "reset", "_take_removed_event")

_PAYLOADS = "        self._pending_event_metadata: dict[OffloadKey, _OffloadEventMetadata] = {}\n"
_PAYLOADS_AND_STORES = _PAYLOADS + (
    "        # OffloadKey -> primary-tier stores recorded whose removal is not translated\n"
    "        # yet: a chunk evicted and stored again before the eviction is translated\n"
    "        # stays resident (its new payload kept) until its last removal.\n"
    "        self._primary_stores: dict[OffloadKey, int] = {}\n"
)
_STORE_RECORDED = (
    "        meta = self._build_event_metadata(req, group_config, chunk_idx)\n"
    "        if existing := self._pending_event_metadata.get(offload_key):\n"
    "            meta.active_residencies.update(existing.active_residencies)\n"
    "        self._pending_event_metadata[offload_key] = meta\n"
)
_STORE_COUNTED = _STORE_RECORDED + (
    "        self._primary_stores[offload_key] = self._primary_stores.get(offload_key, 0) + 1\n"
)
_PARTIAL_RECORDED = (
    "            return\n"
    "        self._record_partial_tail(req, group_config, boundary_tokens, offload_key)\n"
)
_PARTIAL_COUNTED = _PARTIAL_RECORDED + (
    "        if offload_key in self._pending_event_metadata:\n"
    "            self._primary_stores[offload_key] = self._primary_stores.get(offload_key, 0) + 1\n"
)
_CLEARED = "        self._pending_event_metadata.clear()\n"
_CLEARED_COUNTS = _CLEARED + "        self._primary_stores.clear()\n"
_METADATA_ONLY = (
    "            if event.metadata_only:\n"
    "                if meta is not None:\n"
    "                    meta.active_residencies.discard((event.medium, event.ownership))\n"
    "                continue\n"
)
_METADATA_ONLY_COUNTED = (
    "            if event.metadata_only:\n"
    "                if meta is not None and self._last_recorded_store(key, event):\n"
    "                    meta.active_residencies.discard((event.medium, event.ownership))\n"
    "                continue\n"
)
_REMOVED = (
    "                    maybe_convert_block_hash(h) for h in meta.block_hashes\n"
    "                )\n"
    "                meta.active_residencies.discard((event.medium, event.ownership))\n"
)
_REMOVED_COUNTED = (
    "                    maybe_convert_block_hash(h) for h in meta.block_hashes\n"
    "                )\n"
    "                if self._last_recorded_store(key, event):\n"
    "                    meta.active_residencies.discard((event.medium, event.ownership))\n"
)
_REMOVED_METHOD = (
    "    def _take_removed_event(self, event: OffloadingEvent) -> Iterable[KVCacheEvent]:\n"
)
_COUNTING_METHOD_AND_REMOVED = (
    "    def _last_recorded_store(self, key: OffloadKey, event: OffloadingEvent) -> bool:\n"
    '        """Count a translated removal of `key` in `event`\'s tier: whether it leaves\n'
    "        the chunk resident there no more (a store recorded since keeps the primary\n"
    '        tier, whose removal is that store\'s)."""\n'
    "        if (event.medium, event.ownership) != _PRIMARY_RESIDENCY:\n"
    "            return True\n"
    "        left = self._primary_stores.pop(key, 0) - 1\n"
    "        if left > 0:\n"
    "            self._primary_stores[key] = left\n"
    "        return left <= 0\n"
    "\n" + _REMOVED_METHOD
)

COUNT_RECORDED_STORES_FIX = EngineFix(
    COUNT_RECORDED_STORES,
    (
        (EVENTS_MODULE, _PAYLOADS, _PAYLOADS_AND_STORES),
        (EVENTS_MODULE, _STORE_RECORDED, _STORE_COUNTED),
        (EVENTS_MODULE, _PARTIAL_RECORDED, _PARTIAL_COUNTED),
        (EVENTS_MODULE, _CLEARED, _CLEARED_COUNTS),
        (EVENTS_MODULE, _METADATA_ONLY, _METADATA_ONLY_COUNTED),
        (EVENTS_MODULE, _REMOVED, _REMOVED_COUNTED),
        (EVENTS_MODULE, _REMOVED_METHOD, _COUNTING_METHOD_AND_REMOVED),
    ),
    tuple((EVENTS_MODULE, f"{_TRACKER}.{name}") for name in (*_METHODS, "_last_recorded_store")),
    "with self-describing KV events, a CPU chunk evicted and stored again before the eviction "
    "is translated loses its payload and is announced without its blocks: count the stores "
    "recorded, and let a removal take the residency only at the last",
    state=(("_primary_stores", dict),),
)


def events_tracker(connector: Any) -> Any:
    """The KV event tracker of the offloading connector's scheduler side `connector`."""
    return connector._events_tracker


def start_counting(tracker: Any) -> None:
    """What the edited `__init__` starts, for a tracker built before the fix was given to it
    (and before any store): no store recorded."""
    for attribute, factory in COUNT_RECORDED_STORES_FIX.state:
        setattr(tracker, attribute, factory())


def apply_count_recorded_stores(sched: Any) -> None:
    """`count-recorded-stores` on the event tracker of the offloading connector of `sched` (a
    built scheduler, before any store; `offload_window_fixes.apply_offloading_fixes`, which
    composes it with the connector's other fixes); `FixDoesNotApply` for a scheduler without
    that connector."""
    from integrations.vllm.offload_window_fixes import apply_offloading_fixes

    apply_offloading_fixes(sched, [COUNT_RECORDED_STORES])


__all__ = [
    "COUNT_RECORDED_STORES",
    "COUNT_RECORDED_STORES_FIX",
    "EVENTS_MODULE",
    "apply_count_recorded_stores",
    "events_tracker",
    "start_counting",
    "tracker_rebuilt",
]
