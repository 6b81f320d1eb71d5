"""A content-addressed KV store for vLLM's connector path, as vLLM's offloading connector keeps
one (`vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`): it holds what
finished requests stored, by block hash, and its "ask again later" follows from its own jobs.

`OffloadStore` is a `RemoteKv` (`integrations.vllm.kv_connector`) whose contents are the full
blocks that finished requests' sends stored (every request that stops or reaches its length
stores its computed blocks, as the offloading connector offloads them), keyed by vLLM's block
hashes (which vLLM computes for every request when a connector is configured):

- a lookup hits the longest run of the request's leading full prompt blocks the store holds or
  is storing;
- if a block of that run is still being stored (its send in flight: the connector's
  `HIT_PENDING`, "in cache, just not readable yet") or is being loaded for another request
  (`_chunks_being_loaded`), the lookup is answered "ask again later" (`None`), and vLLM skips
  the request in that `schedule()` call;
- a store's job ends when vLLM is told its send finished; a load's when its load is reported.

Loads still fail as `RemoteKv` draws them (as a whole, or in one block), synchronously for one
request in three. Only requests that share a prompt prefix hit: in the generated programs,
those with prefix caching.
"""

from __future__ import annotations

from typing import Any

from integrations.vllm.kv_connector import RemoteKv, Transfer


class OffloadStore(RemoteKv):
    """The store: `stored` block hashes, and the in-flight transfers' (`RemoteKv.in_flight`)
    blocks being stored or loaded."""

    def __init__(self, seed: int, block_size: int, *, sync_loads: bool = True) -> None:
        super().__init__(seed, block_size, sync_loads=sync_loads)
        #: The block hashes whose KV the store holds (their store job done).
        self.stored: set[bytes] = set()
        #: Lookups answered "ask again later" because a hit block was being stored, or loaded
        #: for another request.
        self.put_off_storing: int = 0
        self.put_off_loading: int = 0

    def _hashes(self, transfer: Transfer) -> list[bytes]:
        """The block hashes of `transfer`'s blocks (full blocks only: vLLM hashes no other)."""
        hashes = transfer.request.block_hashes
        end = min(transfer.first + len(transfer.blocks), len(hashes))
        return [bytes(h) for h in hashes[transfer.first : end]]

    def _busy(self, rid: str) -> tuple[set[bytes], set[bytes]]:
        """The block hashes being stored, and those being loaded for a request other than
        `rid`."""
        storing: set[bytes] = set()
        loading: set[bytes] = set()
        for t in self.in_flight.values():
            if t.kind == "send":
                storing.update(self._hashes(t))
            elif t.rid != rid:
                loading.update(self._hashes(t))
        return storing, loading

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

    def remote_tokens(self, request: Any) -> int:
        """The tokens of the leading full prompt blocks the store holds (never a one-token
        prompt whole, as `RemoteKv.matched` explains)."""
        if request.num_prompt_tokens == 1:
            return 0
        return len(self._run(request, set())) * self.block_size

    def produces(self, rid: str) -> bool:
        """Every request stores its blocks when it stops or reaches its length."""
        return True

    def lookup(self, request: Any, num_computed_tokens: int) -> int | None:
        """None ("ask again later") while a block of the request's hit beyond its computed
        tokens is being stored, or loaded for another request; else `matched`."""
        rid = request.request_id
        storing, loading = self._busy(rid)
        beyond = self._run(request, storing)[num_computed_tokens // self.block_size :]
        if any(h in storing for h in beyond):
            self.put_off_storing += 1
        elif any(h in loading for h in beyond):
            self.put_off_loading += 1
        else:
            self.asked_later.discard(rid)
            return self.matched(request, num_computed_tokens)
        self.asked_later.add(rid)
        self.counts.lookups_put_off += 1
        return None

    def execute(self, meta: Any, outputs: Any) -> tuple[Any, list[Transfer]]:
        """`RemoteKv.execute`; the blocks of every send reported in it are then stored."""
        sends = {key: t for key, t in self.in_flight.items() if t.kind == "send"}
        reported = super().execute(meta, outputs)
        for key, t in sends.items():
            if key not in self.in_flight:
                self.stored.update(self._hashes(t))
        return reported


__all__ = ["OffloadStore"]
