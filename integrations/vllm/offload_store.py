"""A content-addressed KV store for vLLM's connector path, as vLLM's offloading connector keeps
one (`vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`, its CPU manager
`vllm/v1/kv_offload/cpu/manager.py`): it holds what finished requests stored, by block hash,
its "ask again later" follows from its own jobs, and with a capacity it evicts the least
recently used blocks that no job pins.

`OffloadStore` is a `RemoteKv` (`integrations.vllm.kv_connector`) whose contents are full
blocks keyed by vLLM's block hashes (which vLLM computes for every request when a connector is
configured):

- a request that stops or reaches its length stores its computed full blocks the store neither
  holds nor is storing (the manager's `prepare_store` keeps only those); with none to store
  nothing is sent, and vLLM frees the request's blocks at once (`request_finished` False);
- a lookup hits the longest run of the request's leading full prompt blocks the store holds or
  is storing; if a block of that run beyond the request's computed tokens is still being stored
  (its send in flight: the manager's `HIT_PENDING`, "in cache, just not readable yet") or is
  being loaded for another request (the connector's `_chunks_being_loaded`), the lookup is
  answered "ask again later" (`None`), and vLLM skips the request in that `schedule()` call;
- a store's job ends when vLLM is told its send finished; a load's when its load is reported.

With `capacity` (blocks), a store that does not fit evicts the least recently used stored
blocks, never one being loaded (pinned from `prepare_load` to `complete_load`) nor one of the
store's own (`prepare_store` protects its input); if those are too few, nothing is stored
(`prepare_store` returns None: the connector stores nothing, and vLLM frees the blocks). A load
or a store's offer of a block the store holds makes it the most recently used. Evictions happen
only as a finished request stores, between `schedule()` calls, so a hit a lookup reported is
still held when vLLM allocates for it in the same call (as the connector's step lock keeps it).

Loads still fail as `RemoteKv` draws them (as a whole, or in one block), synchronously for one
request in three. Only requests that share a prompt prefix hit: in `core_program`'s programs,
those with prefix caching; in `integrations.vllm.shared_prompt_programs`', every program.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from integrations.vllm.kv_connector import RemoteKv, Transfer
from spec.errors import ConfigError

#: The request states whose blocks are stored (vLLM's connectors store what a request computed
#: when it stops or reaches its length, not when it is aborted or ends with an error).
_STORED_ON = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")


class OffloadStore(RemoteKv):
    """The store: `stored` block hashes in least recently used order, the keys each send in
    flight stores, and the in-flight loads' (`RemoteKv.in_flight`) blocks. `capacity`: at most
    that many blocks held or being stored (None: unbounded)."""

    def __init__(
        self, seed: int, block_size: int, *, sync_loads: bool = True, capacity: int | None = None
    ) -> None:
        if capacity is not None and (
            isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1
        ):
            raise ConfigError(
                "kv_store_blocks", capacity, "None (unbounded) or an int >= 1 (blocks it holds)"
            )
        super().__init__(seed, block_size, sync_loads=sync_loads)
        self.capacity: int | None = capacity
        #: The block hashes whose KV the store holds (their store job done), least recently
        #: used first.
        self.stored: dict[bytes, None] = {}
        #: Per request with a send in flight, the block hashes that send stores.
        self.storing: dict[str, tuple[bytes, ...]] = {}
        #: Lookups answered "ask again later" because a hit block was being stored, or loaded
        #: for another request.
        self.put_off_storing: int = 0
        self.put_off_loading: int = 0

    # ------------------------------------------------------------ what the store holds
    def _hashes(self, transfer: Transfer) -> list[bytes]:
        """The block hashes of `transfer`'s blocks (full blocks only: vLLM hashes no other)."""
        hashes = transfer.request.block_hashes
        end = min(transfer.first + len(transfer.blocks), len(hashes))
        return [bytes(h) for h in hashes[transfer.first : end]]

    def _storing_keys(self) -> set[bytes]:
        """Every block hash a send in flight stores."""
        return {key for keys in self.storing.values() for key in keys}

    def _loading_keys(self, but: str | None = None) -> set[bytes]:
        """The block hashes of the loads in flight (pinned), but request `but`'s."""
        keys: set[bytes] = set()
        for t in self.in_flight.values():
            if t.kind == "load" and t.rid != but:
                keys.update(self._hashes(t))
        return keys

    def _run(self, request: Any, storing: set[bytes]) -> list[bytes]:
        """The leading full prompt blocks of `request` the store holds or is storing."""
        full = request.num_prompt_tokens // self.block_size
        run: list[bytes] = []
        for h in request.block_hashes[:full]:
            key = bytes(h)
            if key not in self.stored and key not in storing:
                break
            run.append(key)
        return run

    def _touch(self, keys: list[bytes]) -> None:
        """Make the held ones of `keys` the most recently used, in order."""
        for key in keys:
            if key in self.stored:
                del self.stored[key]
                self.stored[key] = None

    def remote_tokens(self, request: Any) -> int:
        """The tokens of the leading full prompt blocks the store holds (never a one-token
        prompt whole, as `RemoteKv.matched` explains)."""
        if request.num_prompt_tokens == 1:
            return 0
        return len(self._run(request, set())) * self.block_size

    def produces(self, rid: str) -> bool:
        """Every request offers its blocks when it stops or reaches its length."""
        return True

    # ------------------------------------------------------------ the scheduler side
    def lookup(self, request: Any, num_computed_tokens: int) -> int | None:
        """None ("ask again later") while a block of the request's hit beyond its computed
        tokens is being stored, or loaded for another request; else `matched`."""
        rid = request.request_id
        storing = self._storing_keys()
        loading = self._loading_keys(but=rid)
        beyond = self._run(request, storing)[num_computed_tokens // self.block_size :]
        if any(h in storing for h in beyond):
            self.put_off_storing += 1
            self.say(f"store: lookup of {rid} put off, a block of its hit is being stored")
        elif any(h in loading for h in beyond):
            self.put_off_loading += 1
            self.say(f"store: lookup of {rid} put off, a block of its hit is being loaded")
        else:
            self.asked_later.discard(rid)
            return self.matched(request, num_computed_tokens)
        self.asked_later.add(rid)
        self.counts.lookups_put_off += 1
        return None

    def allocated(
        self,
        request: Any,
        block_ids: Any,
        num_external: int,
        *,
        groups: Sequence[Sequence[int | None]] = (),
    ) -> None:
        """`RemoteKv.allocated`; the loaded blocks become the most recently used (the manager's
        `prepare_load` records the access), and are pinned while the load is in flight."""
        super().allocated(request, block_ids, num_external, groups=groups)
        load = self.in_flight.get(("load", request.request_id))
        if load is not None:
            self._touch(self._hashes(load))

    def finished(
        self, request: Any, block_ids: Any, *, groups: Sequence[Sequence[int]] = ()
    ) -> bool:
        """`request_finished`: a request that stopped or reached its length stores its
        computed full blocks the store neither holds nor is storing, evicting what a capacity
        needs (`_make_room`); True (vLLM keeps the blocks until the send is reported) if any
        is to be stored, False if none is or the store has no room (`stores_refused`)."""
        blocks = tuple(block_ids)
        if request.status.name not in _STORED_ON:
            return False
        self.check_delivered(request, blocks)
        full = min(request.num_computed_tokens // self.block_size, len(blocks))
        offered = [bytes(h) for h in request.block_hashes[:full]]
        self._touch(offered)
        storing = self._storing_keys()
        new = tuple(k for k in dict.fromkeys(offered) if k not in self.stored and k not in storing)
        if not new:
            return False
        if not self._make_room(len(new), protected=set(offered), storing=len(storing)):
            self.counts.stores_refused += 1
            self.say(f"store: no room for {request.request_id}'s {len(new)} new blocks")
            return False
        self._register(Transfer("send", request.request_id, request, blocks, 0))
        self.storing[request.request_id] = new
        self.counts.sends += 1
        self.counts.session_sends += self.turn_of.get(request.request_id, 1) > 1
        return True

    def _make_room(self, needed: int, *, protected: set[bytes], storing: int) -> bool:
        """Evict the least recently used stored blocks, neither pinned by a load nor in
        `protected`, until `needed` more fit under the capacity beside the `storing` blocks
        being stored; False (nothing evicted) if those are too few."""
        if self.capacity is None:
            return True
        excess = len(self.stored) + storing + needed - self.capacity
        if excess <= 0:
            return True
        pinned = self._loading_keys() | protected
        victims = [k for k in self.stored if k not in pinned][:excess]
        if len(victims) < excess:
            return False
        for key in victims:
            del self.stored[key]
        self.counts.blocks_evicted += len(victims)
        self.say(f"store: evicted {len(victims)} least recently used blocks")
        return True

    # ------------------------------------------------------------ the worker
    def execute(self, meta: Any, outputs: Any) -> tuple[Any, list[Transfer]]:
        """`RemoteKv.execute`; the blocks of every send reported in it are then stored, the
        most recently used."""
        reported = super().execute(meta, outputs)
        for rid in [r for r in self.storing if ("send", r) not in self.in_flight]:
            for key in self.storing.pop(rid):
                self.stored[key] = None
        return reported


__all__ = ["OffloadStore"]
