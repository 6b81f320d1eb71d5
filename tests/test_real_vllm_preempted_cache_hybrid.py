"""The candidate fix `uncache-preempted` (`integrations.vllm.preempted_cache_fix`) on a hybrid
KV cache: vLLM 0.33.0's scheduler over two full-attention groups sharing one pool, of 1-token
and 2-token blocks. vLLM's scheduler block size is a multiple of every group's (here 2), so a
group's block index is the token index over *that group's* block size: the fix evicts, in each
group, the victim's blocks from its first uncomputed token on, and keeps the ones written in
earlier steps.

The program (priority, prefix caching, a pool of 12 blocks, budget 3, long-prefill threshold 2,
two seats): A (priority 1, a 6-token prompt) prefills 3 tokens, then 2 beside B (priority 0, 1
prompt token). In the third step vLLM schedules A's token 5 first: in the 1-token group it
fills A's block 5, in the 2-token group it completes A's block 2 (tokens 4 and 5), and both
are hashed; then B finds no block and the victim is A, already scheduled. A's KV for token 5
is never written. Earlier tokens' blocks hold KV written in steps 0 and 1.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm import adapter as vllm_adapter
from integrations.vllm.preempted_cache_fix import apply_preempted_cache_fix
from spec.ar.config import ArConfig, ArRequest, Policy
from tests.engine_gate import require_engine

#: The two groups' block sizes, and the scheduler's (their least common multiple).
GROUP_BLOCK_SIZES = (1, 2)
SCHEDULER_BLOCK_SIZE = 2

CONFIG = ArConfig(
    block_size=1,  # the hash block size: the adapter hashes prompts per token
    num_blocks=12,
    reserve_null_block=True,
    max_num_batched_tokens=3,
    max_num_seqs=2,
    max_model_len=16,
    long_prefill_token_threshold=2,
    enable_chunked_prefill=True,
    policy=Policy.PRIORITY,
    enable_prefix_caching=True,
)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _hybrid_scheduler(
    v: Any,
    vllm_config: Any,
    scheduler_config: Any,
    cache_config: Any,
    *,
    num_blocks: int,
    async_scheduling: bool,
) -> Any:
    """`integrations.vllm.adapter.build_scheduler`'s stand-in: vLLM's own scheduler class over
    one pool shared by a full-attention group per entry of `GROUP_BLOCK_SIZES` (distinct head
    sizes, so vLLM keeps them apart)."""
    groups = [
        v.kv_iface.KVCacheGroupSpec(
            [f"layer{i}"],
            v.kv_iface.FullAttentionSpec(
                block_size=size, num_kv_heads=1, head_size=1 + i, dtype=v.torch.float32
            ),
        )
        for i, size in enumerate(GROUP_BLOCK_SIZES)
    ]
    kv_cache_config = v.kv_iface.KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )
    cache_config.num_gpu_blocks = num_blocks
    return scheduler_config.get_scheduler_cls()(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=v.structured.StructuredOutputManager(vllm_config),
        block_size=SCHEDULER_BLOCK_SIZE,
        hash_block_size=CONFIG.block_size,
        log_stats=False,
    )


@dataclass(frozen=True)
class _Preemption:
    """A's blocks when vLLM preempts it in the step that scheduled it: per group those
    holding KV written in earlier steps and those of this step's tokens; and the blocks
    cached and held right after that `schedule()` call."""

    computed: int
    written: frozenset[int]
    unwritten: frozenset[int]
    cached_after: frozenset[int]
    held_after: frozenset[int]


def _preempt_a(monkeypatch: pytest.MonkeyPatch, *, fixed: bool) -> _Preemption:
    monkeypatch.setattr(vllm_adapter, "build_scheduler", _hybrid_scheduler)
    adapter = vllm_adapter.RealVllmScheduler(CONFIG, lambda _event: None, vllm_adapter.SPACE_PREFIX)
    sched = adapter.sched
    assert sched.kv_cache_manager.coordinator.group_block_sizes == GROUP_BLOCK_SIZES
    if fixed:
        apply_preempted_cache_fix(sched)
    seen: list[tuple[int, frozenset[int], frozenset[int]]] = []
    preempt = sched._preempt_request

    def recording(request: Any, *args: Any, **kwargs: Any) -> Any:
        computed = request.num_computed_tokens
        written: set[int] = set()
        unwritten: set[int] = set()
        groups = sched.kv_cache_manager.get_blocks(request.request_id).blocks
        for group, size in zip(groups, GROUP_BLOCK_SIZES, strict=True):
            cut = computed // size
            written.update(b.block_id for b in group[:cut])
            unwritten.update(b.block_id for b in group[cut:])
        seen.append((computed, frozenset(written), frozenset(unwritten)))
        return preempt(request, *args, **kwargs)

    sched._preempt_request = recording

    def step() -> None:
        out = sched.schedule()
        sched.update_from_output(out, adapter._fabricate(dict(out.num_scheduled_tokens)))

    shared = tuple(range(100, 106))
    adapter.submit(ArRequest("A", 6, 1, arrival_time=0.0, priority=1, prompt=shared))
    step()
    adapter.submit(ArRequest("B", 1, 2, arrival_time=1.0, priority=0))
    step()
    out = sched.schedule()
    assert out.preempted_req_ids == {"A"} and "A" not in out.num_scheduled_tokens
    assert len(seen) == 1, seen
    computed, written, unwritten = seen[0]
    pool = sched.kv_cache_manager.block_pool
    held = {
        b.block_id
        for rid in sched.requests
        for g in sched.kv_cache_manager.get_blocks(rid).blocks
        for b in g
    }
    return _Preemption(
        computed,
        written,
        unwritten,
        frozenset(b.block_id for b in pool.blocks if b.block_hash is not None),
        frozenset(held),
    )


def test_finding_on_a_hybrid_cache_an_unwritten_block_stays_cached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As released: after the call, a block of A's token 5 (unwritten), held by nobody, still
    carries its hash, so a later request with A's prefix can hit it."""
    run = _preempt_a(monkeypatch, fixed=False)
    assert run.computed == 5
    assert (run.unwritten - run.held_after) & run.cached_after


def test_the_fix_evicts_per_group_and_keeps_what_was_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the fix, no block of A's token 5 that nobody holds is cached after the call, and
    every block of A's tokens 0-4 that nobody else took stays cached: in the 1-token group
    that is blocks 0-4, which an index taken over the scheduler's block size (5 // 2 = 2)
    would have evicted from block 2 on."""
    run = _preempt_a(monkeypatch, fixed=True)
    assert run.computed == 5
    assert not (run.unwritten - run.held_after) & run.cached_after
    kept = run.written - run.held_after
    assert len(kept) == len(run.written) == 5 + 2  # 5 one-token blocks, 2 two-token blocks
    assert kept <= run.cached_after, sorted(kept - run.cached_after)
