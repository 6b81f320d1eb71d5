"""The abstract AR state as frozen values, and its readable rendering."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from spec.ar.config import ArConfig, ArRules
from spec.ar.lifecycles import ArPhase


@dataclass(frozen=True, slots=True)
class ArRequestState:
    """One AR request as the spec sees it: its sizes, phase, computed and output tokens, the
    blocks it holds, and the service and waiting it has had (for LAS and aging)."""

    request_id: str
    arrival: int  # submission order
    prompt_len: int
    max_tokens: int
    stop_after: int | None
    priority: int
    predicted_len: int | None
    phase: ArPhase
    num_computed: int
    num_output: int
    blocks: tuple[int, ...]
    attained: int  # tokens ever computed, recomputation included (LAS)
    waited: int  # steps waited since it last entered the queue
    cache_read_limit: int | None = None  # `ArRequest.cache_read_limit`
    awaiting: str | None = None  # why it may not be admitted yet (`ArAwaiting`), or None
    lora: int | None = None  # its LoRA adapter (`ArRequest.lora`), or None

    @property
    def known_tokens(self) -> int:
        """Prompt plus sampled outputs: the tokens whose KV can be computed."""
        return self.prompt_len + self.num_output

    @property
    def job_len(self) -> int:
        """Prompt plus known or predicted output: the job length SJF and SRPT order by."""
        out = self.max_tokens if self.predicted_len is None else self.predicted_len
        return self.prompt_len + out


@dataclass(frozen=True, slots=True)
class ArState:
    """The AR spec's abstract state: requests, queues, block holders and the current step."""

    config: ArConfig
    rules: ArRules
    requests: Mapping[str, ArRequestState]
    waiting: tuple[str, ...]  # queue order (head first)
    running: tuple[str, ...]  # order they became running
    block_holders: Mapping[int, frozenset[str]]  # referenced blocks: every request holding it
    step_index: int
    scheduled: Mapping[str, int]  # this step so far
    preempted: tuple[str, ...]  # this step so far
    cached: Mapping[int, int] = field(default_factory=dict)  # block -> cached content key
    pause: str = "unpaused"  # the operator's pause state (`ArPauseSet`)

    @property
    def block_owners(self) -> Mapping[int, str]:
        """One holder per referenced block (the only one unless prefix caching shares it)."""
        return {b: min(h) for b, h in self.block_holders.items()}

    @property
    def free_blocks(self) -> frozenset[int]:
        """Blocks no request references (cached ones included: they can be allocated)."""
        null = self.config.null_block
        return frozenset(
            b for b in range(self.config.num_blocks) if b != null and b not in self.block_holders
        )


def render(s: ArState) -> str:
    """The state in words: the step, the pool, the queues and every request."""
    c = s.config
    lines = [
        f"step {s.step_index}: scheduled {dict(s.scheduled)} "
        f"({sum(s.scheduled.values())}/{c.max_num_batched_tokens} tokens), "
        f"preempted {list(s.preempted)}" + ("" if s.pause == "unpaused" else f"; {s.pause}"),
        f"pool: {len(s.free_blocks)} free of {c.usable_blocks} usable blocks "
        f"(block_size {c.block_size}{', null block 0' if c.reserve_null_block else ''}"
        f"{f', {len(s.cached)} cached' if c.enable_prefix_caching else ''}); "
        f"seats {len(s.running)}/{c.max_num_seqs}",
        f"waiting: {list(s.waiting)}",
        f"running: {list(s.running)}",
    ]
    for rid, r in s.requests.items():
        lines.append(
            f"  {rid}: {r.phase.value} arrival={r.arrival} prompt={r.prompt_len} "
            f"max_tokens={r.max_tokens} stop_after={r.stop_after} prio={r.priority} "
            f"computed={r.num_computed} outputs={r.num_output} blocks={list(r.blocks)}"
            + ("" if r.cache_read_limit is None else f" cache_read_limit={r.cache_read_limit}")
            + ("" if r.awaiting is None else f" awaiting={r.awaiting}")
            + ("" if r.lora is None else f" lora={r.lora}")
        )
    shared = {b: sorted(h) for b, h in s.block_holders.items() if len(h) > 1}
    if shared:
        lines.append(f"shared blocks (block: holders): {shared}")
    return "\n".join(lines)
