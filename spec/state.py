"""The abstract state of the specification, as frozen values, and its readable rendering."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from spec.config import DllmConfig
from spec.lifecycles import BlockPhase, RequestPhase

SlotOwner = tuple[str, int]  # (request id, block index)

ACTIVE_PHASES = frozenset({RequestPhase.ADMITTED, RequestPhase.RUNNING})
TERMINAL_PHASES = frozenset({RequestPhase.FINISHED, RequestPhase.ABORTED})
UNFINISHED_BLOCK_PHASES = frozenset({BlockPhase.MASKED, BlockPhase.DENOISING, BlockPhase.COMPLETE})
CARRIED_BLOCK_PHASES = frozenset({BlockPhase.DENOISING, BlockPhase.COMPLETE})


@dataclass(frozen=True, slots=True)
class BlockState:
    """The request's current (uncommitted) block.

    slots: the KV slots it holds, or None when it holds none (carried without KV: FDFO without
        in-place reuse between rounds).
    alloc_round: the round its current slots were allocated in.
    masks: masks left after its latest step (None before its first step).
    """

    index: int
    phase: BlockPhase
    slots: tuple[int, ...] | None
    alloc_round: int | None
    masks: int | None


@dataclass(frozen=True, slots=True)
class RequestState:
    """One dLLM request as the spec sees it: prompt, limits and stop options, phase, row,
    committed tokens and its current block."""

    request_id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    phase: RequestPhase
    row: int | None
    committed_blocks: int
    tokens: tuple[int, ...]  # every committed token, prompt positions included
    current: BlockState | None
    stop_sampled: bool = False  # it may finish with STOP (`Submitted.stop_sampled`)
    last_commit_round: int | None = None  # the round of its latest commit (None: none yet)
    ignore_eos: bool = False  # no token ends it (`Submitted.ignore_eos`)
    stop_token_ids: tuple[int, ...] = ()  # they end it with STOP (`Submitted.stop_token_ids`)
    priority: int = 0  # as submitted (`Submitted.priority`; orders the queue only by policy)
    # prefix cache: block index -> the cached slots it reads that block from (`CacheHit`,
    # `KvCached`); those blocks' KV is the cache's, not the request's
    cache_reads: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    hit_round: int | None = None  # the round of its latest cache hit on its next block

    @property
    def generated(self) -> tuple[int, ...]:
        """Committed tokens after the prompt (untruncated)."""
        return self.tokens[len(self.prompt) :]


@dataclass(frozen=True, slots=True)
class RoundState:
    """Progress inside the current round."""

    index: int
    forwards: int
    batch: tuple[SlotOwner, ...]  # (request, block) rows of this round's forwards
    pending_steps: tuple[SlotOwner, ...]  # rows of the latest forward still awaiting a step
    committed: int  # blocks committed this round
    # input mask count of each row in `pending_steps` (what its step result is checked against)
    pending_masks: Mapping[SlotOwner, int] = field(default_factory=dict)
    newly_done_in_last_forward: bool = False  # a block became done in the latest forward
    admitted: int = 0  # requests admitted this round (rule work_conserving reads it)


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """A block in the prefix cache (`DllmConfig.prefix_cache`): its slots (position order), its
    content key (its block index, its own tokens, and the hex SHA-256 chained over every token
    from position 0 through its end: `spec.prefix_cache.chain`) and the (request, block
    index) pairs that read it."""

    slots: tuple[int, ...]
    block_index: int
    tokens: tuple[int, ...]
    digest: str
    readers: frozenset[SlotOwner]


@dataclass(frozen=True, slots=True)
class AbstractState:
    """The dLLM spec's abstract state: the queue, every request, the owners of the KV slots
    and of the rows, and the round in progress."""

    config: DllmConfig
    queue: tuple[str, ...]
    requests: Mapping[str, RequestState]
    slot_owners: Mapping[int, SlotOwner]
    rows: Mapping[int, str]
    round: RoundState
    cache: tuple[CachedBlock, ...] = ()  # the prefix cache's blocks (empty without one)

    @property
    def cached_slots(self) -> frozenset[int]:
        """KV slots the prefix cache holds."""
        return frozenset(s for block in self.cache for s in block.slots)

    @property
    def free_slots(self) -> frozenset[int]:
        """KV slots no (request, block) owns and the prefix cache does not hold."""
        return (
            frozenset(range(self.config.kv_slots)) - frozenset(self.slot_owners) - self.cached_slots
        )

    @property
    def running(self) -> frozenset[str]:
        """Requests admitted or running (the running set)."""
        return frozenset(r.request_id for r in self.requests.values() if r.phase in ACTIVE_PHASES)

    @property
    def carrying(self) -> frozenset[str]:
        """Running requests whose current block has been stepped and is not done yet (FDFO
        carries it into the next round)."""
        return frozenset(
            r.request_id
            for r in self.requests.values()
            if r.phase in ACTIVE_PHASES
            and r.current is not None
            and r.current.phase in CARRIED_BLOCK_PHASES
        )


def _ranges(values: frozenset[int] | set[int]) -> str:
    """Compact rendering of a set of ints: '0-3,8,10-11'."""
    out: list[str] = []
    items = sorted(values)
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out) if out else "-"


def _queue_priorities(state: AbstractState) -> str:
    """The queued requests' priorities, when any is set (they order the queue under
    `DllmPolicy.priority_order`)."""
    priorities = [state.requests[rid].priority for rid in state.queue]
    return f" priorities {priorities}" if any(priorities) else ""


def _cache_text(cache: tuple[CachedBlock, ...]) -> str:
    """The cached blocks: slots, block index and tokens, readers (`4-5 b1 [3, 4] read by
    r1:b1`)."""
    parts = []
    for block in sorted(cache, key=lambda c: c.slots):
        readers = ",".join(f"{rid}:b{k}" for rid, k in sorted(block.readers)) or "none"
        parts.append(
            f"{_ranges(set(block.slots))} b{block.block_index} {list(block.tokens)} read by "
            f"{readers}"
        )
    return "; ".join(parts) or "-"


def render(state: AbstractState) -> str:
    """A readable, multi-line rendering of the abstract state (used in violations)."""
    c = state.config
    lines = [
        f"config: mode={c.mode.value} block={c.block_size} page={c.page_size} "
        f"kv_slots={c.kv_slots} rows={c.req_pool_rows} max_running={c.max_running_requests} "
        f"reuse={c.in_place_reuse} reloop={c.reloop}",
        f"round {state.round.index}: forwards={state.round.forwards} "
        f"batch={list(state.round.batch)} pending_steps={list(state.round.pending_steps)}",
        f"queue: {list(state.queue)}" + _queue_priorities(state),
        f"free slots ({len(state.free_slots)}): {_ranges(state.free_slots)}",
    ]
    if c.prefix_cache:
        lines.append(f"cache ({len(state.cache)} blocks): " + _cache_text(state.cache))
    by_owner: dict[SlotOwner, set[int]] = {}
    for slot, owner in state.slot_owners.items():
        by_owner.setdefault(owner, set()).add(slot)
    for rid, r in state.requests.items():
        if r.phase is RequestPhase.QUEUED:
            continue
        owned = {o: s for o, s in by_owner.items() if o[0] == rid}
        own_txt = " ".join(f"b{o[1]}:{_ranges(s)}" for o, s in sorted(owned.items())) or "-"
        cur = r.current
        cur_txt = (
            "-"
            if cur is None
            else f"b{cur.index} {cur.phase.value} masks={cur.masks} "
            f"slots={'-' if cur.slots is None else _ranges(set(cur.slots))}"
        )
        lines.append(
            f"request {rid}: {r.phase.value} row={r.row} committed={r.committed_blocks} "
            f"prompt_len={len(r.prompt)} generated={len(r.generated)}/{r.max_new_tokens} "
            f"current=[{cur_txt}] owns=[{own_txt}]"
            + (" stop_sampled" if r.stop_sampled else "")
            + (" ignore_eos" if r.ignore_eos else "")
            + (f" stop_token_ids={list(r.stop_token_ids)}" if r.stop_token_ids else "")
            + (f" priority={r.priority}" if r.priority else "")
            + (
                " reads=["
                + " ".join(f"b{k}:{_ranges(set(v))}" for k, v in sorted(r.cache_reads.items()))
                + "]"
                if r.cache_reads
                else ""
            )
        )
    return "\n".join(lines)
