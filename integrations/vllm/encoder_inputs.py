"""Multimodal encoder inputs in vLLM's engine-core loop: what the requests carry, how vLLM's
scheduler is configured for them, and the rules its encoder cache must keep.

A multimodal request's prompt holds placeholder tokens for each item (an image, say): the
model runner runs the vision encoder over the item and writes its output over those tokens'
embeddings. vLLM's scheduler decides which items the encoder runs in a step
(`Scheduler._try_schedule_encoder_inputs`: those the step's token range overlaps, not already
cached, within the encoder compute budget and the encoder cache) and keeps the cache's
book (`EncoderCacheManager`: entries by item identifier, the requests referencing each, entries
no request references kept until room is needed, then evicted and reported to the runner in
`free_encoder_mm_hashes`). The runner trusts that book: an item a step reads but the runner
does not hold raises "Encoder cache miss" (`GPUModelRunner._gather_mm_embeddings`).

Here (`EncoderOptions`) each prompt carries `items` items of `item_tokens` placeholder tokens
(at offsets 1, 1 + 2 * item_tokens, ...: as many as fit), every position an embedding; an
item is named by its placeholder tokens, so two requests whose prompts share those tokens
share the item, and the prefix cache's block hashes (vLLM adds each item's identifier to them)
stay a function of the content the harness checks. vLLM's own `compute_mm_encoder_budget`
sizes the compute budget and the cache from the scheduler's settings (both
`max_num_batched_tokens` by default, at least one item), as the multimodal profile of a
model would; with `chunked=False` vLLM's `disable_chunked_mm_input` is set. The scheduler is
otherwise the text model's: the budget and a fresh `EncoderCacheManager` are set on it after
it is built (vLLM derives them from a multimodal model's processor, which a CPU-only
checkout cannot load).

`EncoderRunner` rebuilds the runner's encoder cache from the scheduler outputs alone (freed
entries dropped, then the step's encoder inputs computed, as `execute_model` does; the runner
takes outputs in the order they were scheduled, so this holds in the asynchronous loop too) and
checks, after every `schedule()`:

- `encoder_output_ready`: every item a scheduled token range overlaps is in the runner's cache
  (computed in this step or an earlier one, not freed since): no "Encoder cache miss";
- `encoder_budget`: the encoder inputs of one step have at most the compute budget's
  embeddings;
- `encoder_cache_capacity`: the runner's cache holds at most the cache size's embeddings;
- `encoder_cache_agrees`: the scheduler's book and the runner's cache name the same entries
  (an entry the book holds that no step computed would be read as a hit and miss);
- `mm_input_chunked` (`chunked=False`): a step whose range reaches into an item reaches its
  end (vLLM 0.34.0's reading: a chunk that starts inside an item, after a prefix-cache hit that
  ends there, waits until the rest fits; 0.33.0 splits it);
- `no_chunking_when_disabled` (the AR spec's rule, checked here for requests with items, with
  `enable_chunked_prefill` off): a step that schedules a request's prefill schedules all of its
  prompt's uncomputed tokens (0.34.0: "encoder cache pressure must not split a prompt that
  requires full prefill"; 0.33.0 splits it);

and, once the loop is drained, `encoder_refs_released`: no request references an entry and
every entry is reclaimable.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from integrations.vllm.cache_writes import batch_starts
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.encoder_offload import OFFLOAD_RULES, EncoderOffload, attach
from integrations.vllm.trace import counted
from spec.errors import ConfigError

ENCODER_RULES = (
    "encoder_output_ready",
    "encoder_budget",
    "encoder_cache_capacity",
    "encoder_cache_agrees",
    "mm_input_chunked",
    "no_chunking_when_disabled",
    "encoder_refs_released",
    *OFFLOAD_RULES,
)


@dataclass(frozen=True, slots=True)
class EncoderOptions:
    """Multimodal items per prompt and vLLM's encoder settings for them.

    `items` (>= 1): items per prompt, as many as fit; `item_tokens` (>= 1): placeholder tokens
    (and encoder embeddings) per item; `budget` / `cache`: vLLM's
    `max_num_encoder_input_tokens` / `encoder_cache_size` in embeddings (None: vLLM's default,
    `max_num_batched_tokens`; vLLM raises either to one item); `chunked` False: vLLM's
    `disable_chunked_mm_input`; `offload_blocks` (>= 1): vLLM's CPU encoder-cache offload
    (`ECCPUConnector`, role `ec_both`) with a region of that many embeddings
    (`integrations.vllm.encoder_offload`; None: no EC connector)."""

    items: int = 2
    item_tokens: int = 3
    budget: int | None = None
    cache: int | None = None
    chunked: bool = True
    offload_blocks: int | None = None

    def __post_init__(self) -> None:
        for name, value, low in (("items", self.items, 1), ("item_tokens", self.item_tokens, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(name, value, f"an integer >= {low}")
        for name, size in (
            ("budget", self.budget),
            ("cache", self.cache),
            ("offload_blocks", self.offload_blocks),
        ):
            if size is None:
                continue
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ConfigError(name, size, "an integer >= 1, or None for vLLM's default")
        if self.offload_blocks is not None and self.offload_blocks < self.item_tokens:
            # vLLM's EmbeddingCache.alloc asserts an item fits the region: its scheduler
            # would stop with an AssertionError at the first save
            raise ConfigError(
                "offload_blocks",
                self.offload_blocks,
                f"at least one item's embeddings ({self.item_tokens}): vLLM's CPU encoder "
                "cache asserts every item fits its region",
            )

    def describe(self) -> str:
        """These options in words."""
        sizes = ", ".join(
            f"{what} {size}"
            for what, size in (("encoder budget", self.budget), ("encoder cache", self.cache))
            if size is not None
        )
        return (
            f"up to {self.items} multimodal items of {self.item_tokens} tokens a prompt"
            + (f" ({sizes})" if sizes else "")
            + ("" if self.chunked else ", chunked mm input disabled")
            + (
                ""
                if self.offload_blocks is None
                else f", offloaded to a CPU encoder cache of {self.offload_blocks} embeddings"
            )
        )


def item_ranges(prompt_len: int, options: EncoderOptions) -> list[tuple[int, int]]:
    """The (offset, length) of each item of a prompt of `prompt_len` tokens: at offsets 1,
    1 + 2 * item_tokens, ..., as many of `options.items` as fit."""
    size = options.item_tokens
    ranges: list[tuple[int, int]] = []
    offset = 1
    while len(ranges) < options.items and offset + size <= prompt_len:
        ranges.append((offset, size))
        offset += 2 * size
    return ranges


def identifier(tokens: Sequence[int]) -> str:
    """An item's identifier: its placeholder tokens (the same tokens, the same item)."""
    return "image:" + ",".join(map(str, tokens))


def mm_features(prompt: Sequence[int], options: EncoderOptions) -> list[Any]:
    """vLLM `MultiModalFeatureSpec`s of `prompt`'s items (no data: the runner is fabricated)."""
    inputs = importlib.import_module("vllm.multimodal.inputs")
    return [
        inputs.MultiModalFeatureSpec(
            data=None,
            modality="image",
            identifier=identifier(prompt[offset : offset + length]),
            mm_position=inputs.PlaceholderRange(offset=offset, length=length),
        )
        for offset, length in item_ranges(len(prompt), options)
    ]


def configure(sched: Any, options: EncoderOptions) -> tuple[int, int]:
    """Set vLLM's encoder settings on the built scheduler `sched` as `options` say; its
    (compute budget, cache size) as vLLM's `compute_mm_encoder_budget` makes them. A
    `ConfigError` where vLLM refuses the settings (an item longer than a step's tokens with
    chunked mm input disabled)."""
    manager = importlib.import_module("vllm.v1.core.encoder_cache_manager")
    cfg = sched.scheduler_config
    cfg.disable_chunked_mm_input = not options.chunked
    if options.budget is not None:
        cfg.max_num_encoder_input_tokens = options.budget
    if options.cache is not None:
        cfg.encoder_cache_size = options.cache
    try:
        budget, size = manager.compute_mm_encoder_budget(cfg, {"image": options.item_tokens})
    except ValueError as err:
        raise ConfigError(
            "item_tokens",
            options.item_tokens,
            f"at most max_num_batched_tokens ({cfg.max_num_batched_tokens}) with chunked mm "
            f"input disabled (vLLM: {err})",
        ) from None
    sched.max_num_encoder_input_tokens = budget
    sched.encoder_cache_manager = manager.EncoderCacheManager(cache_size=size)
    if options.offload_blocks is not None:
        attach(sched, options.offload_blocks)
    return int(budget), int(size)


@dataclass
class EncoderCounts:
    """What the encoder did in one loop."""

    encoder_runs: int = 0  # items the encoder ran (scheduled encoder inputs)
    encoder_reads: int = 0  # items a scheduled range read
    encoder_shared: int = 0  # of those, read by a request that did not compute them
    encoder_evictions: int = 0  # entries the scheduler told the runner to free
    encoder_waits: int = 0  # requests left waiting as their items found no room, per call
    encoder_saves: int = 0  # items saved to the CPU encoder cache (`offload_blocks`)
    encoder_loads: int = 0  # items loaded from it instead of running the encoder


def _overlaps(feature: Any, start: int, end: int) -> bool:
    offset = int(feature.mm_position.offset)
    return offset < end and start < offset + int(feature.mm_position.length)


class EncoderRunner:
    """The model runner's encoder cache, rebuilt from the scheduler outputs alone, and the
    rules above. `requests` maps a request id to vLLM's `Request` (the loop's submitted
    requests: one ended before its output is applied is still found)."""

    def __init__(self, sched: Any, requests: dict[str, Any], budget: int, size: int) -> None:
        self.sched: Any = sched
        self.requests: dict[str, Any] = requests
        #: the encoder compute budget and the cache size, in embeddings
        self.budget: int = budget
        self.size: int = size
        #: False: chunked mm input disabled (`mm_input_chunked`), as `configure` set it
        self.chunked: bool = not sched.scheduler_config.disable_chunked_mm_input
        #: vLLM's `enable_chunked_prefill` (`no_chunking_when_disabled` when False)
        self.chunked_prefill: bool = bool(sched.scheduler_config.enable_chunked_prefill)
        #: identifier -> embeddings, as the runner holds them
        self.cache: dict[str, int] = {}
        #: identifier -> the request whose step computed it last
        self.computed_by: dict[str, str] = {}
        self.counts: EncoderCounts = EncoderCounts()
        #: requests the current `schedule()` call's encoder scheduling cut (fewer tokens, or
        #: none): those it did not schedule waited for room for their items
        self.cut: set[str] = set()
        #: of those, the ones the last call did not schedule
        self.left_waiting: set[str] = set()
        #: the worker's side of vLLM's CPU encoder-cache offload, where `configure` attached it
        self.offload: EncoderOffload | None = (
            EncoderOffload(sched, self.counts) if sched.ec_connector is not None else None
        )

    def watch(self) -> None:
        """Note the requests `_try_schedule_encoder_inputs` cuts (their items find no room for
        the encoder), as vLLM then requeues a waiting one it leaves no token, or, with chunked
        prefill off, one it would leave part of its prompt (0.34.0), by design (wraps what a
        seeded bug or a fix made of the scheduler)."""
        original = self.sched._try_schedule_encoder_inputs

        def watched(request: Any, computed: int, new_tokens: int, *args: Any, **kw: Any) -> Any:
            result = original(request, computed, new_tokens, *args, **kw)
            if new_tokens > 0 and result[1] < new_tokens:
                self.cut.add(request.request_id)
            return result

        self.sched._try_schedule_encoder_inputs = watched

    def before_schedule(self, *, idle: bool = False) -> None:
        """A new `schedule()` call: no request cut yet. `idle`: no request is left and no step
        is in flight (the offload must then have settled, `ec_offload_settled`)."""
        self.cut.clear()
        if idle and self.offload is not None:
            self.offload.check_settled("before the next schedule()")

    def after_schedule(self, out: Any, where: str) -> None:
        """Apply `out` as the runner does (free, then compute) and check every rule."""
        self.left_waiting = self.cut - set(out.num_scheduled_tokens)
        self.counts.encoder_waits += len(self.left_waiting)
        for mm_hash in out.free_encoder_mm_hashes:
            self.cache.pop(mm_hash, None)
            self.counts.encoder_evictions += 1
        if self.offload is not None:
            # the worker loads before the encoder runs (`ActiveECConnector.maybe_get_output`)
            self.offload.load(out, self.cache, where)
        computed = 0
        ran: set[str] = set()
        for rid, input_ids in out.scheduled_encoder_inputs.items():
            features = self.requests[rid].mm_features
            for i in input_ids:
                feature = features[i]
                embeds = int(feature.mm_position.get_num_embeds())
                computed += embeds
                self.cache[feature.identifier] = embeds
                self.computed_by[feature.identifier] = rid
                ran.add(feature.identifier)
                self.counts.encoder_runs += 1
        if self.offload is not None:
            self.offload.save(out, ran, where)
        if computed > self.budget:
            raise EngineCoreViolation(
                "encoder_budget",
                f"{where}: the encoder runs {computed} embeddings "
                f"({dict(out.scheduled_encoder_inputs)}); the compute budget is {self.budget}",
            )
        held = sum(self.cache.values())
        if held > self.size:
            raise EngineCoreViolation(
                "encoder_cache_capacity",
                f"{where}: the runner's encoder cache holds {held} embeddings "
                f"({sorted(self.cache)}); the cache size is {self.size}",
            )
        starts = batch_starts(out)
        for rid, n in out.num_scheduled_tokens.items():
            self._check_reads(rid, starts[rid], starts[rid] + n, where)
            self._check_whole_prompt(rid, starts[rid], starts[rid] + n, where)
        self._check_agrees(where)

    def _check_whole_prompt(self, rid: str, start: int, end: int, where: str) -> None:
        request = self.requests[rid]
        prompt = int(request.num_prompt_tokens)
        if self.chunked_prefill or not request.mm_features or not start < prompt:
            return
        if end < prompt:
            why = " (its items found no room for all of it)" if rid in self.cut else ""
            raise EngineCoreViolation(
                "no_chunking_when_disabled",
                f"{where}: {rid!r} is scheduled tokens [{start}, {end}) of its {prompt}-token "
                f"prompt with chunked prefill off{why}",
            )

    def _check_reads(self, rid: str, start: int, end: int, where: str) -> None:
        for feature in self.requests[rid].mm_features:
            if not _overlaps(feature, start, end):
                continue
            offset = int(feature.mm_position.offset)
            length = int(feature.mm_position.length)
            if feature.identifier not in self.cache:
                raise EngineCoreViolation(
                    "encoder_output_ready",
                    f"{where}: {rid!r} is scheduled tokens [{start}, {end}), which read its "
                    f"item at [{offset}, {offset + length}) ({feature.identifier!r}), but the "
                    "runner's encoder cache does not hold it (vLLM's runner: 'Encoder cache "
                    "miss'); no step computed it since it was last freed",
                )
            self.counts.encoder_reads += 1
            self.counts.encoder_shared += self.computed_by.get(feature.identifier) != rid
            if not self.chunked and end < offset + length:
                raise EngineCoreViolation(
                    "mm_input_chunked",
                    f"{where}: {rid!r} is scheduled tokens [{start}, {end}), part of its item "
                    f"at [{offset}, {offset + length}), with chunked mm input disabled",
                )

    def _check_agrees(self, where: str) -> None:
        book = set(self.sched.encoder_cache_manager.cached)
        held = set(self.cache)
        if book != held:
            only_book = sorted(book - held)
            only_runner = sorted(held - book)
            owners = {h: sorted(self.sched.encoder_cache_manager.cached[h]) for h in only_book}
            raise EngineCoreViolation(
                "encoder_cache_agrees",
                f"{where}: the scheduler's encoder cache book and the runner's cache differ: "
                f"held by the book only {owners} (a later read would be taken as a hit the "
                f"runner misses), by the runner only {only_runner}",
            )

    def stall_detail(self) -> str:
        """What `progress` adds: the CPU encoder cache's held entries (with the offload), and each
        request the last `schedule()` call left no token as its items found no room, with its
        computed tokens and the item it stopped at."""
        stopped = []
        for rid in sorted(self.left_waiting):
            request = self.requests[rid]
            computed = int(request.num_computed_tokens)
            items = [
                (int(f.mm_position.offset), int(f.mm_position.offset + f.mm_position.length))
                for f in request.mm_features
                if f.mm_position.offset + f.mm_position.length > computed
            ]
            at = f", next item at [{items[0][0]}, {items[0][1]})" if items else ""
            stopped.append(f"{rid} ({counted(computed, 'token')} computed{at})")
        held = self.offload.held() if self.offload is not None else {}
        entries = f"; CPU encoder cache entries held: {held}" if held else ""
        if not stopped:
            return entries
        return (
            entries
            + "; the last call left no token, as their items found no room, to "
            + ", ".join(stopped)
        )

    def check_drained(self) -> None:
        """`encoder_refs_released`: once the loop is drained no request references an entry
        and every entry is reclaimable. (`ec_offload_settled` is checked before a schedule with
        nothing left: the loop drains only once the connector reports no push work.)"""
        manager = self.sched.encoder_cache_manager
        referenced = {h: sorted(rids) for h, rids in manager.cached.items() if rids}
        if referenced or manager.request_cached_ids:
            raise EngineCoreViolation(
                "encoder_refs_released",
                f"drained, but encoder cache entries are still referenced: {referenced} "
                f"(per request: {dict(manager.request_cached_ids)})",
            )
        if manager.num_freeable_slots != manager.cache_size:
            raise EngineCoreViolation(
                "encoder_refs_released",
                f"drained, but {manager.cache_size - manager.num_freeable_slots} of "
                f"{manager.cache_size} encoder cache embeddings are not reclaimable",
            )


__all__ = [
    "ENCODER_RULES",
    "EncoderCounts",
    "EncoderOptions",
    "EncoderRunner",
    "configure",
    "identifier",
    "item_ranges",
    "mm_features",
]
