"""vLLM 0.33.0's engine-core loop over a hybrid KV cache with a Mamba group
(`LoopOptions(mamba=True)`): a full-attention group beside a Mamba (state-space) group sharing
one pool, as vLLM sets one up for Jamba, Nemotron-H or Qwen3-Next, its own
`HybridKVCacheCoordinator` and `MambaManager` deciding.

With prefix caching the Mamba group runs in vLLM's "align" mode: a state checkpoint per block,
the earlier ones the null block or freed, prefill split at block boundaries; without, in "none"
mode: one block of `max_model_len` tokens per request, its state updated in place. Every rule
reads both groups' tables; `kv_covers_scheduled` says what a Mamba step needs: the block its
state is copied from and the one it is written to are real blocks; `kv_written` that a running
request's step finds its own state after exactly its computed tokens there, and
`cache_hit_written` that a hit's checkpoint holds the state its block hash says. Seeded bugs
show the first and the last have teeth in the loop; the second is shown without vLLM.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.adapter import (
    SPACE,
    SPACE_PREFIX,
    GroupTables,
    OffloadingOptions,
    RealVllmScheduler,
    group_block_sizes,
    kv_groups,
    mamba_mode,
)
from integrations.vllm.cache_writes import CacheWrites
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreRun, LoopOptions, run_loop
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.test_real_vllm_hybrid_loop import CONFIG, PROGRAMS  # blocks of 2, prefix caching
from tests.vllm_seeded_bugs import (
    mamba_checkpoint_one_block_early,
    mamba_copy_dropped,
    mamba_state_freed_early,
)

MAMBA = LoopOptions(mamba=True)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _run(seed: int, async_scheduling: bool, options: LoopOptions = MAMBA) -> CoreRun | None:
    """Shared-prompt program `seed` through one loop, or None where vLLM refuses its
    configuration with a Mamba group (prefix caching without chunked prefill)."""
    try:
        return run_loop(
            shared_prompt_program(seed), async_scheduling=async_scheduling, options=options
        )
    except EngineCoreViolation:
        raise
    except ConfigError as err:
        assert err.field == "mamba", err
        return None


def _align_mode_run(options: LoopOptions) -> Callable[[int], CoreRun | None]:
    """Shared-prompt program `seed` through the async loop under `options`, where its Mamba
    group runs in align mode (prefix caching, chunked prefill); else None (none mode, with no
    checkpoint to move, or refused)."""

    def run(seed: int) -> CoreRun | None:
        program = shared_prompt_program(seed)
        if not (program.config.enable_prefix_caching and program.config.enable_chunked_prefill):
            return None
        return run_loop(program, async_scheduling=True, options=options)

    return run


def test_vllm_builds_a_mamba_group_in_align_mode_with_prefix_caching() -> None:
    """Align mode, blocks of the program's size, prefill split at block boundaries."""
    sched = RealVllmScheduler(CONFIG, lambda _event: None, SPACE_PREFIX, mamba=True).sched
    assert kv_groups(sched) == 2
    assert [mamba_mode(sched, g) for g in (0, 1)] == [None, "align"]
    assert group_block_sizes(sched) == (2, 2)
    assert sched.need_mamba_block_aligned_split


def test_vllm_builds_one_state_block_per_request_without_prefix_caching() -> None:
    """None mode: a Mamba block of `max_model_len` tokens, the request's whole state."""
    config = replace(CONFIG, enable_prefix_caching=False)
    sched = RealVllmScheduler(config, lambda _event: None, SPACE, mamba=True).sched
    assert mamba_mode(sched, 1) == "none"
    assert group_block_sizes(sched) == (2, 16)


def test_generated_programs_pass_with_a_mamba_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shared-prompt programs pass both loops; some run in align mode with prefix caching and
    some in none mode, some are preempted with a step in flight, and running requests' steps
    read their Mamba state (each such read checked)."""
    reads: list[int] = []
    check = CacheWrites.check_states

    def counting(
        self: CacheWrites,
        sched: Any,
        out: Any,
        tables: GroupTables,
        starts: dict[str, int],
        hitting: set[str],
        schedule_index: int,
    ) -> None:
        reads.extend(1 for rid in out.num_scheduled_tokens if rid not in hitting and starts[rid])
        check(self, sched, out, tables, starts, hitting, schedule_index)

    monkeypatch.setattr(CacheWrites, "check_states", counting)
    totals: Counter[str] = Counter()
    modes: Counter[bool] = Counter()
    for seed in range(PROGRAMS):
        for async_scheduling in (False, True):
            run = _run(seed, async_scheduling)
            if run is None:
                continue
            modes[shared_prompt_program(seed).config.enable_prefix_caching] += 1
            totals.update({k: v for k, v in asdict(run).items() if isinstance(v, int)})
    assert modes[True] > 0 and modes[False] > 0, modes
    assert totals["schedules"] > 0 and totals["stale"] > 0, totals
    assert reads, "no running request read its Mamba state"


def test_a_state_block_freed_before_its_copy_is_caught() -> None:
    """Seeded bug: the manager frees the block holding a request's state so far in the step
    whose worker copies the state out of it. `kv_covers_scheduled` catches it in the Mamba
    group, naming the block the step reads."""
    options = replace(MAMBA, mutate=mamba_state_freed_early)

    seen = first_violations(PROGRAMS, _align_mode_run(options), until="kv_covers_scheduled")
    assert "kv_covers_scheduled" in seen, seen
    words = ("holds the null block as its block", "in KV cache group 1", "(align mode)")
    assert all(w in seen["kv_covers_scheduled"] for w in words), seen


def test_a_hit_on_the_checkpoint_one_block_short_is_caught_by_its_content() -> None:
    """Seeded bug: a hit ending at block i hands the Mamba group the checkpoint of block
    i - 1. The content record knows that block holds the state after one block fewer (its
    writer's block i - 1), and `cache_hit_written` catches it in the Mamba group: Mamba
    checkpoints are hit in these programs, and checked."""
    options = replace(MAMBA, mutate=mamba_checkpoint_one_block_early)

    seen = first_violations(PROGRAMS, _align_mode_run(options), until="cache_hit_written")
    assert "cache_hit_written" in seen, seen
    message = seen["cache_hit_written"]
    assert "starts from the prefix cache" in message and "(in KV cache group 1)" in message, seen


# ---------------------------------------------------------------- Mamba blocks of K hash blocks
def test_vllm_hashes_by_the_attention_block_when_mamba_blocks_are_larger() -> None:
    """Mamba blocks twice the program's (vLLM's `mamba_block_size`): vLLM schedules by the
    Mamba block and hashes by the attention block, so a hit may end inside a Mamba block."""
    sched = RealVllmScheduler(
        CONFIG, lambda _event: None, SPACE_PREFIX, mamba=True, mamba_block_scale=2
    ).sched
    assert group_block_sizes(sched) == (2, 4)
    assert (sched.block_size, sched.hash_block_size) == (4, 2)


def test_partial_hits_and_their_copies_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """With Mamba blocks twice the program's, programs pass both loops, vLLM hands the worker
    block copies, and hits ending inside a Mamba block read a partial state, each checked."""
    partial: list[int] = []
    copies: list[int] = []
    check, apply = CacheWrites._check_partial_state, CacheWrites.apply_copies

    def counting_check(self: CacheWrites, *args: Any) -> None:
        partial.append(1)
        check(self, *args)

    def counting_apply(self: CacheWrites, done: Any) -> None:
        copies.extend(1 for _ in done)
        apply(self, done)

    monkeypatch.setattr(CacheWrites, "_check_partial_state", counting_check)
    monkeypatch.setattr(CacheWrites, "apply_copies", counting_apply)
    options = replace(MAMBA, mamba_block_scale=2)
    for seed in range(PROGRAMS * 2):
        for async_scheduling in (False, True):
            _run(seed, async_scheduling, options)
    assert partial and copies, (len(partial), len(copies))


def test_block_copies_left_out_of_the_scheduler_output_are_caught() -> None:
    """Seeded bug: the scheduler output leaves out the block copies it owes the worker. A
    request running on from its prompt's end has its cache entry moved to another block, which
    the copy would have filled; a later hit ending inside that Mamba block finds no state
    there (`cache_hit_written`)."""
    options = replace(MAMBA, mamba_block_scale=2, mutate=mamba_copy_dropped)

    seen = first_violations(PROGRAMS * 2, _align_mode_run(options), until="cache_hit_written")
    assert "cache_hit_written" in seen, seen
    words = ("inside its block", "no batch or copy left a state there")
    assert all(w in seen["cache_hit_written"] for w in words), seen


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (
            lambda: RealVllmScheduler(
                CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True, sliding_window=3
            ),
            "mamba",
        ),
        (
            lambda: RealVllmScheduler(
                CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True, kv_connector="recompute"
            ),
            "mamba",
        ),
        (
            lambda: RealVllmScheduler(
                CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True, offloading=OffloadingOptions(8)
            ),
            "mamba",
        ),
        (
            lambda: RealVllmScheduler(
                CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True, speculative_tokens=2
            ),
            "mamba",
        ),
        (
            lambda: RealVllmScheduler(
                replace(CONFIG, enable_chunked_prefill=False, max_num_batched_tokens=16),
                lambda _e: None,
                SPACE_PREFIX,
                mamba=True,
            ),
            "mamba",
        ),
        (
            lambda: RealVllmScheduler(CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True).step(),
            "mamba",
        ),
        (
            lambda: RealVllmScheduler(CONFIG, lambda _e: None, SPACE_PREFIX, retention_interval=4),
            "retention_interval",
        ),
        (
            lambda: RealVllmScheduler(CONFIG, lambda _e: None, SPACE_PREFIX, mamba_block_scale=2),
            "mamba_block_scale",
        ),
        (  # none mode: vLLM's scheduler block is the Mamba block of max_model_len tokens
            lambda: RealVllmScheduler(
                replace(CONFIG, enable_prefix_caching=False),
                lambda _e: None,
                SPACE,
                mamba=True,
                retention_interval=4,
            ),
            "config",
        ),
        (
            lambda: RealVllmScheduler(
                CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True, mamba_block_scale=0
            ),
            "mamba_block_scale",
        ),
    ],
)
def test_bad_mamba_options_are_typed_errors(build: Callable[[], Any], field: str) -> None:
    """Combinations the loop does not model, vLLM's own assert (prefix caching without chunked
    prefill) and its coordinator's refusal (a retention interval not a multiple of its
    scheduler block), `step()` and a retention interval without a sliding-window or Mamba
    group: each a typed error saying what would be valid."""
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.field == field and err.value.valid, err.value


def test_the_check_script_serves_a_mamba_group_and_refuses_bad_combinations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = load_script("vllm_async_check")
    argv = ["--programs", "3", "--programs-from", "shared-prompts", "--mamba"]
    assert script.main([*argv, "--retention-interval", "dense"]) == 0
    out = capsys.readouterr().out
    assert "a hybrid KV cache (a Mamba group beside full attention, dense)" in out, out
    for bad in (
        ["--mamba", "--sliding-window", "3"],
        ["--mamba", "--offload-chunks", "8"],
        ["--mamba", "--speculative-tokens", "2"],
        ["--mamba-block-scale", "2"],
    ):
        with pytest.raises(SystemExit) as leaving:
            script.main(["--programs", "1", *bad])
        assert leaving.value.code == 2, bad
        assert "--mamba" in capsys.readouterr().err.splitlines()[-1], bad


def test_a_running_step_must_find_its_own_state_after_its_computed_tokens() -> None:
    """The Mamba state record without vLLM: a's step from token 0 to 5 leaves its state after
    5 tokens in the block of token 4; a step of a from token 5 finds it there. A step from
    token 6 (a token skipped), or b reading that block as its own, is `kv_written`, naming
    what the block holds. A hit ending inside that block (at token 5, past two hash blocks of
    2) reads the partial state: it passes for c, whose first hash blocks are a's, and is
    `cache_hit_written` for b, whose are not."""

    @dataclass
    class Request:
        request_id: str
        block_hashes: list[bytes] = field(default_factory=list)

    a, b = Request("a", [b"x", b"y"]), Request("b", [b"x", b"z"])
    c = Request("c", [b"x", b"y"])
    sched = SimpleNamespace(requests={"a": a, "b": b, "c": c})
    writes = CacheWrites(2, group_block_sizes=(2, 2), state_groups=frozenset({1}))
    tables: GroupTables = ({}, {rid: (None, None, 7) for rid in "abc"})

    def step(rid: str, start: int, n: int) -> Any:
        return SimpleNamespace(num_scheduled_tokens={rid: n}), {rid: start}

    out, starts = step("a", 0, 5)
    writes.check_states(sched, out, tables, starts, set(), 1)
    writes.record(
        sched,
        SimpleNamespace(**vars(out), scheduled_new_reqs=[], scheduled_cached_reqs=_cached(starts)),
        tables,
    )
    assert writes.states[7] == (a, 5)
    out, starts = step("a", 5, 1)
    writes.check_states(sched, out, tables, starts, set(), 2)
    for rid, start in (("a", 6), ("b", 5)):
        out, starts = step(rid, start, 1)
        with pytest.raises(EngineCoreViolation) as err:
            writes.check_states(sched, out, tables, starts, set(), 3)
        assert err.value.rule == "kv_written", err.value
        assert "it holds the state of 'a' after 5 tokens" in err.value.detail, err.value
    out, starts = step("c", 5, 1)
    writes.check_states(sched, out, tables, starts, {"c"}, 4)
    out, starts = step("b", 5, 1)
    with pytest.raises(EngineCoreViolation) as err:
        writes.check_states(sched, out, tables, starts, {"b"}, 4)
    assert err.value.rule == "cache_hit_written", err.value
    assert "not the state after its first 5 tokens" in err.value.detail, err.value


def _cached(starts: dict[str, int]) -> Any:
    """A `scheduled_cached_reqs` naming `starts`' requests with their computed tokens."""
    return SimpleNamespace(
        req_ids=list(starts), num_computed_tokens=list(starts.values()), resumed_req_ids=[]
    )
