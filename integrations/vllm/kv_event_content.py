"""The rule `kv_event_content`: every `BlockStored` event vLLM publishes describes the blocks its
keys name, as a router that keys blocks itself reads it.

`integrations.vllm.kv_events` checks which keys the events leave cached. A router that does not
trust vLLM's keys (llm-d's KV-cache indexer hashes token ids itself, chained by the parent, and
partitions by LoRA adapter) reads more of each store: its `token_ids`, `parent_block_hash`,
`lora_id` / `lora_name` and `extra_keys`. So for each store, of either tier (the GPU block
pool's, or the CPU tier of vLLM's offloading connector with self-describing events), each key
it names is found among the block hashes of the requests the engine was given (`KeyOrigins`:
equal block hashes mean equal tokens under an equal adapter, as vLLM chains them), and:

- the key is the hash of a request's block: a store naming a key no request's blocks have
  breaks the rule;
- its LoRA fields name that request's adapter (`lora_id` its `adapter_id`, `lora_name` its
  name; None for the base model);
- where the store's `token_ids` are one block per key (`block_size` each; not the sparse
  stores of a sliding window or Mamba group, vLLM issue #44451, nor the placeholder stores of
  the CPU tier without self-describing events, which carry no tokens), key i's tokens are the
  request's tokens of that block, and the keys chain: the first key's parent is
  `parent_block_hash` (None for a request's first block), each next key's parent is the key
  before it;
- where the store carries `extra_keys`, entry i is what vLLM publishes for that block
  (`to_event_extra_keys` of its `generate_block_hash_extra_keys`: the LoRA name here).

Both engine-core loops check it after every `update_from_output`: the autoregressive one
(`integrations.vllm.engine_core`) and the diffusion one (`integrations.vllm.diffusion`).

A store that carries no `extra_keys` while its blocks have some (a LoRA adapter's) is counted,
not a rule (`stores_without_extra_keys`): the field is optional, and the LoRA fields say the
same.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from integrations.vllm.core_loop import EngineCoreViolation, first_difference

#: A placeholder store (no tokens, `block_size` 0), as the offloading connector announces a
#: CPU chunk without self-describing events.
_PLACEHOLDER_BLOCK_SIZE = 0


class KeyOrigins:
    """Where each external block key comes from: the first request of `requests` (every vLLM
    `Request` the engine was given, by id, kept after it ends) whose block hashes include it,
    and the number of tokens up to the end of that hash block. Indexes new hashes on a miss (a
    request's block hashes grow, or, when a streaming-input session's next input replaces its
    last sampled token, are cut back and grow again); `hash_block_size` is the tokens per
    block hash, `convert` vLLM's `maybe_convert_block_hash`."""

    def __init__(
        self,
        requests: Mapping[str, Any],
        hash_block_size: int,
        convert: Callable[[Any], Hashable],
    ) -> None:
        self.requests: Mapping[str, Any] = requests
        self.hash_block_size: int = hash_block_size
        self.convert: Callable[[Any], Hashable] = convert
        self._origin: dict[Hashable, tuple[Any, int]] = {}
        self._indexed: dict[str, list[Any]] = {}  # each request's hashes as last indexed

    def find(self, key: Hashable) -> tuple[Any, int] | None:
        """(request, tokens up to the key's block's end), or None for a key no request has."""
        if key not in self._origin:
            self._index()
        return self._origin.get(key)

    def key_before(self, request: Any, start: int) -> Hashable | None:
        """The key of `request`'s hash block that ends at token `start` (None at 0)."""
        if start <= 0:
            return None
        return self.convert(request.block_hashes[start // self.hash_block_size - 1])

    def _index(self) -> None:
        for rid, request in self.requests.items():
            hashes = request.block_hashes
            seen = self._indexed.setdefault(rid, [])
            same = first_difference(seen, hashes)
            for j in range(same, len(hashes)):
                self._origin.setdefault(
                    self.convert(hashes[j]), (request, (j + 1) * self.hash_block_size)
                )
            seen[same:] = hashes[same:]


class EventContent:
    """`check_store(event)`: the rule `kv_event_content` for one `BlockStored` (module doc);
    `extra_keys_of(request, start, end)` is what vLLM publishes as a block's extra keys."""

    def __init__(self, origins: KeyOrigins, extra_keys_of: Callable[[Any, int, int], Any]):
        self.origins: KeyOrigins = origins
        self.extra_keys_of: Callable[[Any, int, int], Any] = extra_keys_of
        self.checked: int = 0  # keys of stores checked
        self.stores_without_extra_keys: int = 0  # stores with extra keys due, carrying none

    @classmethod
    def for_scheduler(cls, sched: Any, kv_utils: Any, requests: Mapping[str, Any]) -> EventContent:
        """The checker of vLLM scheduler `sched`'s stores against `requests` (every `Request`
        it was given, by id, kept after it ends; `kv_utils`: vLLM's `kv_cache_utils`)."""
        origins = KeyOrigins(
            requests,
            int(sched.kv_cache_manager.block_pool.hash_block_size),
            kv_utils.maybe_convert_block_hash,
        )
        return cls(origins, vllm_extra_keys(kv_utils))

    def check_stores(self, stores: Iterable[tuple[Any, str]], where: str) -> None:
        """`check_store` for each (store, medium) of `stores`, in order."""
        for event, medium in stores:
            self.check_store(event, medium, where)

    def check_store(self, event: Any, medium: str, where: str) -> None:
        """`EngineCoreViolation("kv_event_content", ...)` for the first key of `event` (a
        `BlockStored` of tier `medium`) that it does not describe."""
        size = int(event.block_size)
        if size == _PLACEHOLDER_BLOCK_SIZE:
            return
        keys = list(event.block_hashes)
        tokens = list(event.token_ids)
        whole = len(tokens) == len(keys) * size
        missing_extra = False
        for i, key in enumerate(keys):
            origin = self.origins.find(key)
            what = f"{where}: a {medium} BlockStored's key {i} (of {len(keys)})"
            if origin is None:
                raise EngineCoreViolation(
                    "kv_event_content",
                    f"{what} is the hash of no block of any request the engine was given",
                )
            request, end = origin
            lora = request.lora_request
            adapter = (lora.adapter_id, lora.name) if lora is not None else (None, None)
            if (event.lora_id, event.lora_name) != adapter:
                raise EngineCoreViolation(
                    "kv_event_content",
                    f"{what}, a block of {request.request_id!r}, names LoRA adapter "
                    f"(lora_id, lora_name) = {(event.lora_id, event.lora_name)}, but "
                    f"{request.request_id!r} runs {adapter}: a router partitioning by "
                    "adapter files the block under another",
                )
            due = self.extra_keys_of(request, end - size, end)
            if event.extra_keys is None:
                missing_extra = missing_extra or due is not None
            elif event.extra_keys[i] != due:
                raise EngineCoreViolation(
                    "kv_event_content",
                    f"{what}, a block of {request.request_id!r}, carries extra keys "
                    f"{event.extra_keys[i]!r}, not {due!r}",
                )
            if whole:
                self._check_tokens(what, request, end, size, tokens[i * size : (i + 1) * size])
                parent = event.parent_block_hash if i == 0 else keys[i - 1]
                if (end - size) % self.origins.hash_block_size == 0 and parent != (
                    expected := self.origins.key_before(request, end - size)
                ):
                    said = "parent_block_hash" if i == 0 else f"key {i - 1}"
                    raise EngineCoreViolation(
                        "kv_event_content",
                        f"{what}, block of tokens {end - size}..{end - 1} of "
                        f"{request.request_id!r}, follows {said} {parent!r}, but the block "
                        f"before it has key {expected!r}: a router chaining keys by parent "
                        "files it under another prefix",
                    )
            self.checked += 1
        self.stores_without_extra_keys += missing_extra

    def _check_tokens(
        self, what: str, request: Any, end: int, size: int, tokens: list[int]
    ) -> None:
        expected = list(request.all_token_ids[end - size : end])
        if tokens != expected:
            raise EngineCoreViolation(
                "kv_event_content",
                f"{what}, block of tokens {end - size}..{end - 1} of {request.request_id!r}, "
                f"carries token ids {tokens}, but that block holds {expected}: a router "
                "hashing token ids keys it as other content",
            )


def vllm_extra_keys(kv_utils: Any) -> Callable[[Any, int, int], Any]:
    """What vLLM publishes as the extra keys of `request`'s block of tokens [start, end):
    `to_event_extra_keys` of `generate_block_hash_extra_keys` (`kv_utils`: vLLM's
    `kv_cache_utils`), one entry."""

    def extra_keys_of(request: Any, start: int, end: int) -> Any:
        keys, _ = kv_utils.generate_block_hash_extra_keys(request, start, end, 0)
        published = kv_utils.to_event_extra_keys([keys])
        return None if published is None else published[0]

    return extra_keys_of


__all__ = ["EventContent", "KeyOrigins", "vllm_extra_keys"]
