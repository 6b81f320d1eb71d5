"""The candidate fix `uncache-preempted` (`integrations.vllm.preempted_cache_fix`) on hybrid KV
caches: vLLM 0.33.0's scheduler over two KV cache groups sharing one pool.

vLLM's scheduler block size is a multiple of every group's, and a group's block index is the
token index over *that group's* block size, so the fix cuts each group at its own block size:
it evicts the victim's blocks from its first uncomputed token on and keeps the ones written in
earlier steps.

Three layouts:

- `full-1+full-2`: full-attention groups of 1-token and 2-token blocks, scheduler block 2; a
  pool of 12 blocks, budget 3, long-prefill threshold 2, two seats. A (priority 1, a 6-token
  prompt) prefills 3 tokens, then 2 beside B (priority 0, 1 prompt token). In the third step
  vLLM schedules A's token 5 first: it fills A's block 5 of the 1-token group and completes
  its block 2 of the 2-token group (tokens 4 and 5), both hashed at once; then B finds no
  block and the victim is A, already scheduled, with 5 tokens computed.
- `full+sliding-window`: a full-attention group beside a sliding-window one (a window of 3
  tokens; vLLM nulls the blocks that fall out of it), blocks of 1, the same program with a
  7-token prompt and 15 blocks, under dense retention (`prefix_cache_retention_interval=None`:
  under vLLM's default 0 the window's interior blocks are not cached at all): A is preempted
  with 5 tokens computed and tokens 5 and 6 scheduled, their blocks hashed in both groups;
- `full+mamba-align`: a full-attention group and a Mamba group in "align" mode (one state
  block per 4-token checkpoint, the earlier ones null), blocks of 4, dense retention as
  above; a pool of 9 blocks,
  budget 8, three seats. A (priority 1, a 16-token prompt) prefills 8 tokens, then 4 beside B
  (priority 0, 4 tokens); the next call schedules A's last 4 prompt tokens first, registering
  the attention block and the Mamba checkpoint of tokens 12-15, then preempts A (12 tokens
  computed) for B. This is the shape vLLM issue #57580 reports for Mamba checkpoints.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm import adapter as vllm_adapter
from integrations.vllm.preempted_cache_fix import apply_preempted_cache_fix
from integrations.vllm.runner_tables import RunnerTables
from spec.ar.config import ArConfig, ArRequest
from tests.engine_gate import require_engine
from tests.same_step_preemption import CONFIG as SAME_STEP_CONFIG


def _full(v: Any, size: int, index: int) -> Any:
    """A full-attention group's spec (distinct head sizes, so vLLM keeps the groups apart)."""
    return v.kv_iface.FullAttentionSpec(
        block_size=size, num_kv_heads=1, head_size=1 + index, dtype=v.torch.float32
    )


def _sliding_window(v: Any, size: int, index: int) -> Any:
    """A sliding-window attention group's spec (a window of 3 tokens)."""
    return v.kv_iface.SlidingWindowSpec(
        block_size=size,
        num_kv_heads=1,
        head_size=1 + index,
        dtype=v.torch.float32,
        sliding_window=3,
    )


def _mamba_align(v: Any, size: int, index: int) -> Any:
    """A Mamba group's spec in "align" mode (the mode vLLM's prefix caching needs)."""
    return v.kv_iface.MambaSpec(
        block_size=size, shapes=((1 + index,),), dtypes=(v.torch.float32,), mamba_cache_mode="align"
    )


@dataclass(frozen=True)
class Layout:
    """A hybrid KV cache and the program that preempts A in the call that scheduled it."""

    groups: tuple[tuple[Callable[[Any, int, int], Any], int], ...]  # (spec, block size)
    scheduler_block_size: int  # vLLM's resolution: the least common multiple of the groups'
    config: ArConfig  # block_size: the hash block size (the adapter hashes prompts by it)
    a: ArRequest
    b: ArRequest
    computed: int  # A's tokens computed when it is preempted
    written: int  # blocks of those tokens A holds then (null blocks left out)
    stale_group: int  # a group where, as released, an unwritten block stays cached, unheld
    #: vLLM's `prefix_cache_retention_interval`: None (dense) where a sliding window's or a
    #: Mamba group's interior blocks must be cached for the shape to show; under vLLM's
    #: default 0 they are not (only the replay boundary is kept)
    retention_interval: int | None = 0

    @property
    def mamba(self) -> bool:
        return any(spec is _mamba_align for spec, _ in self.groups)


def _config(**fields: Any) -> ArConfig:
    """The same-step program's configuration (tests/same_step_preemption.py) with `fields`."""
    return SAME_STEP_CONFIG.replace(**fields)


LAYOUTS = {
    "full-1+full-2": Layout(
        groups=((_full, 1), (_full, 2)),
        scheduler_block_size=2,
        config=_config(num_blocks=12),
        a=ArRequest("A", 6, 1, arrival_time=0.0, priority=1, prompt=tuple(range(100, 106))),
        b=ArRequest("B", 1, 2, arrival_time=1.0, priority=0),
        computed=5,
        written=5 + 2,  # five 1-token blocks, two 2-token blocks
        stale_group=1,  # the 2-token block of tokens 4-5 (B takes the 1-token one)
    ),
    "full+sliding-window": Layout(
        groups=((_full, 1), (_sliding_window, 1)),
        scheduler_block_size=1,
        config=_config(num_blocks=15),
        a=ArRequest("A", 7, 1, arrival_time=0.0, priority=1, prompt=tuple(range(100, 107))),
        b=ArRequest("B", 1, 2, arrival_time=1.0, priority=0),
        computed=5,
        written=5 + 2,  # five full-attention blocks; the window's blocks of tokens 3 and 4
        stale_group=1,  # the window's block of token 5 (the full-attention one's stays too)
        retention_interval=None,
    ),
    "full+mamba-align": Layout(
        groups=((_full, 4), (_mamba_align, 4)),
        scheduler_block_size=4,
        config=_config(
            block_size=4,
            num_blocks=9,
            max_num_batched_tokens=8,
            max_num_seqs=3,
            max_model_len=64,
            long_prefill_token_threshold=0,
        ),
        a=ArRequest("A", 16, 2, arrival_time=0.0, priority=1, prompt=tuple(range(100, 116))),
        b=ArRequest("B", 4, 2, arrival_time=1.0, priority=0),
        computed=12,
        written=3 + 1,  # three attention blocks; the Mamba state after token 12
        stale_group=1,  # the Mamba checkpoint after token 16 (B takes the attention block)
        retention_interval=None,
    ),
}


#: The adapter's scheduler builder, before a test replaces it with `_builder`'s.
BUILD_SCHEDULER = vllm_adapter.build_scheduler


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _builder(layout: Layout) -> Callable[..., Any]:
    """`integrations.vllm.adapter.build_scheduler` over `layout`'s groups sharing one pool (the
    adapter builds the rest as always)."""

    def build(
        v: Any, vllm_config: Any, scheduler_config: Any, cache_config: Any, **kwargs: Any
    ) -> Any:
        if layout.mamba:
            cache_config.mamba_cache_mode = "align"
        cache_config.prefix_cache_retention_interval = layout.retention_interval
        kwargs.pop("kv_cache_groups")  # the adapter's one group (no sliding_window given)
        groups = [
            v.kv_iface.KVCacheGroupSpec([f"layer{i}"], spec(v, size, i))
            for i, (spec, size) in enumerate(layout.groups)
        ]
        return BUILD_SCHEDULER(
            v,
            vllm_config,
            scheduler_config,
            cache_config,
            kv_cache_groups=groups,
            **kwargs,
        )

    return build


@dataclass(frozen=True)
class _Preemption:
    """A's blocks when vLLM preempts it in the call that scheduled it (after the fix's
    eviction, before A is freed): those holding KV written in earlier steps and those of this
    call's tokens, each group cut at its own block size (null blocks left out), and which of
    them are cached then; and the blocks cached and held right after that call."""

    computed: int
    written: frozenset[int]
    unwritten: tuple[frozenset[int], ...]  # per group
    cached_at_preemption: frozenset[int]
    cached_after: frozenset[int]
    held_after: frozenset[int]


def _preempt_a(monkeypatch: pytest.MonkeyPatch, layout: Layout, *, fixed: bool) -> _Preemption:
    monkeypatch.setattr(vllm_adapter, "build_scheduler", _builder(layout))
    adapter = vllm_adapter.RealVllmScheduler(
        layout.config, lambda _event: None, vllm_adapter.SPACE_PREFIX
    )
    sched = adapter.sched
    sizes = tuple(size for _, size in layout.groups)
    assert sched.kv_cache_manager.coordinator.group_block_sizes == sizes
    assert sched.block_size == layout.scheduler_block_size  # as vLLM's engine core resolves it
    assert sched.need_mamba_block_aligned_split == layout.mamba
    if fixed:
        apply_preempted_cache_fix(sched)
    seen: list[tuple[int, frozenset[int], tuple[frozenset[int], ...], frozenset[int]]] = []
    preempt = sched._preempt_request

    def recording(request: Any, *args: Any, **kwargs: Any) -> Any:
        # vLLM calls this after the fix's eviction: `seen` is what the victim holds then
        computed = request.num_computed_tokens
        written: set[int] = set()
        unwritten: list[frozenset[int]] = []
        cached: set[int] = set()
        groups = sched.kv_cache_manager.get_blocks(request.request_id).blocks
        for group, size in zip(groups, sizes, strict=True):
            cut = computed // size
            written.update(b.block_id for b in group[:cut] if not b.is_null)
            unwritten.append(frozenset(b.block_id for b in group[cut:] if not b.is_null))
            cached.update(b.block_id for b in group if b.block_hash is not None)
        seen.append((computed, frozenset(written), tuple(unwritten), frozenset(cached)))
        return preempt(request, *args, **kwargs)

    sched._preempt_request = recording
    adapter.submit(layout.a)
    out = sched.schedule()
    sched.update_from_output(out, adapter._fabricate(dict(out.num_scheduled_tokens)))
    adapter.submit(layout.b)
    for _ in range(6):
        out = sched.schedule()
        if out.preempted_req_ids:
            break
        sched.update_from_output(out, adapter._fabricate(dict(out.num_scheduled_tokens)))
    assert out.preempted_req_ids == {"A"} and "A" not in out.num_scheduled_tokens
    assert len(seen) == 1, seen
    computed, written, unwritten, cached = seen[0]
    manager = sched.kv_cache_manager
    held = {b.block_id for rid in sched.requests for g in manager.get_blocks(rid).blocks for b in g}
    return _Preemption(
        computed,
        written,
        unwritten,
        cached,
        frozenset(b.block_id for b in manager.block_pool.blocks if b.block_hash is not None),
        frozenset(held),
    )


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_finding_on_a_hybrid_cache_unwritten_blocks_stay_cached(
    monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """As released: A is freed with blocks of its unwritten tokens cached, and after the call
    one that nobody holds still carries its hash, so a later request with A's prefix can hit
    it; in `full+mamba-align` it is the Mamba checkpoint after token 16, a state never
    computed."""
    case = LAYOUTS[layout]
    run = _preempt_a(monkeypatch, case, fixed=False)
    assert run.computed == case.computed
    assert run.unwritten[case.stale_group] & run.cached_at_preemption
    assert (run.unwritten[case.stale_group] - run.held_after) & run.cached_after


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_fix_evicts_per_group_and_keeps_what_was_written(
    monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """With the fix, A is freed with no block of its unwritten tokens cached and every block
    of its computed tokens cached; after the call no unwritten block that nobody holds is
    cached, and every written one that nobody else took still is. In the 1-token group of
    `full-1+full-2` the written blocks are blocks 0-4, which a cut taken over the scheduler's
    block size (5 // 2 = 2) would have evicted from block 2 on."""
    run = _preempt_a(monkeypatch, LAYOUTS[layout], fixed=True)
    assert run.computed == LAYOUTS[layout].computed
    for unwritten in run.unwritten:
        assert not unwritten & run.cached_at_preemption
    assert run.written <= run.cached_at_preemption, sorted(run.written - run.cached_at_preemption)
    for unwritten in run.unwritten:
        assert not (unwritten - run.held_after) & run.cached_after
    kept = run.written - run.held_after
    assert len(kept) == len(run.written) == LAYOUTS[layout].written
    assert kept <= run.cached_after, sorted(kept - run.cached_after)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_runner_tables_match_on_a_hybrid_cache(
    monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """`runner_tables` over two groups: A and B, run to the end as released (A preempted and
    resumed), hand the model runner, through the scheduler outputs alone, each group's table
    the scheduler holds at every call. In `full+sliding-window` the scheduler nulls the
    blocks that left the window, and in `full+mamba-align` the checkpoints before the latest,
    while the runner keeps their ids: the check passes over those positions, and they occur
    (never with two full-attention groups)."""
    case = LAYOUTS[layout]
    monkeypatch.setattr(vllm_adapter, "build_scheduler", _builder(case))
    adapter = vllm_adapter.RealVllmScheduler(
        case.config, lambda _event: None, vllm_adapter.SPACE_PREFIX
    )
    sched = adapter.sched
    runner = RunnerTables()
    nulled = 0
    adapter.submit(case.a)
    for step in range(40):
        if step == 1:
            adapter.submit(case.b)
        if not sched.has_requests():
            break
        out = sched.schedule()
        assert runner.apply(out) is None
        assert runner.mismatch(sched, out) is None, step
        for rid in out.num_scheduled_tokens:
            groups = sched.kv_cache_manager.get_blocks(rid).blocks
            for held, ids in zip(groups, runner.tables[rid], strict=True):
                nulled += sum(b.is_null and i != b.block_id for b, i in zip(held, ids, strict=True))
        sched.update_from_output(out, adapter._fabricate(dict(out.num_scheduled_tokens)))
    assert not sched.has_requests()
    assert (nulled > 0) == (layout != "full-1+full-2"), nulled
