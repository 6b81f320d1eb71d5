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
show the first and the last have teeth in the loop; the second is shown without vLLM. Also:
Mamba blocks larger than the hash block (`mamba_block_scale`), layers that export prefill
checkpoints (`mamba_checkpoint_alignment`, with a finding of vLLM's and its candidate fix),
and a sliding window beside the Mamba group (three groups).

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
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
    mamba_checkpoint,
    mamba_mode,
    window_tokens,
)
from integrations.vllm.branching_prompt_programs import branching_prompt_program
from integrations.vllm.cache_writes import CacheWrites
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreProgram, CoreRun, LoopOptions, run_loop
from integrations.vllm.mamba_split_fix import apply_mamba_split_fix
from integrations.vllm.mamba_split_fix import fix_as_diff as mamba_split_diff
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.test_real_vllm_hybrid_loop import CONFIG, PROGRAMS  # blocks of 2, prefix caching
from tests.vllm_seeded_bugs import (
    attention_block_shared,
    attention_copy_dropped,
    mamba_checkpoint_keyed_one_column_late,
    mamba_checkpoint_one_block_early,
    mamba_copy_dropped,
    mamba_state_freed_early,
    window_freed_early,
)

MAMBA = LoopOptions(mamba=True)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _run(
    seed: int,
    async_scheduling: bool,
    options: LoopOptions = MAMBA,
    programs: Callable[[int], CoreProgram] = shared_prompt_program,
) -> CoreRun | None:
    """Program `seed` of `programs` (shared prompts) through one loop, or None where vLLM
    refuses its configuration with a Mamba group (prefix caching without chunked prefill)."""
    try:
        return run_loop(programs(seed), async_scheduling=async_scheduling, options=options)
    except EngineCoreViolation:
        raise
    except ConfigError as err:
        assert err.field == "mamba", err
        return None


def _passes_in_both_modes(
    options: LoopOptions, programs: Callable[[int], CoreProgram] = shared_prompt_program
) -> None:
    """The first `PROGRAMS` programs of `programs` (shared prompts) pass both loops under
    `options` (or are refused as vLLM refuses them), some with prefix caching (align mode) and
    some without (none mode), and some are preempted with a step in flight."""
    totals: Counter[str] = Counter()
    modes: Counter[bool] = Counter()
    for seed in range(PROGRAMS):
        for async_scheduling in (False, True):
            run = _run(seed, async_scheduling, options, programs)
            if run is None:
                continue
            modes[programs(seed).config.enable_prefix_caching] += 1
            totals.update({k: v for k, v in asdict(run).items() if isinstance(v, int)})
    assert modes[True] > 0 and modes[False] > 0, modes
    assert totals["schedules"] > 0 and totals["stale"] > 0, totals


def _align_mode_run(
    options: LoopOptions, programs: Callable[[int], CoreProgram] = shared_prompt_program
) -> Callable[[int], CoreRun | None]:
    """Program `seed` of `programs` (shared prompts) through the async loop under `options`,
    where its Mamba group runs in align mode (prefix caching, chunked prefill); else None (none
    mode, with no checkpoint to move, or refused)."""

    def run(seed: int) -> CoreRun | None:
        program = programs(seed)
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
    _passes_in_both_modes(MAMBA)
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
    words = ("starts from the prefix cache", "at the end of its block", "of KV cache group 1")
    assert all(w in seen["cache_hit_written"] for w in words), seen
    assert "it holds the state of" in seen["cache_hit_written"], seen  # a state, a block short


# ---------------------------------------------------------------- Mamba blocks of K hash blocks
def test_vllm_hashes_finer_than_its_blocks_with_a_block_scale() -> None:
    """Blocks twice the program's in both groups, as vLLM's platform keeps the Mamba block the
    attention block (`mamba_block_size = block_size`), and prefix-cache keys every program
    block (`prefix_match_unit`): vLLM schedules by the block and hashes by the program's, so a
    hit may end inside a Mamba block, and splits prefill at the Mamba block."""
    impl = RealVllmScheduler(
        CONFIG, lambda _event: None, SPACE_PREFIX, mamba=True, mamba_block_scale=2
    )
    sched = impl.sched
    assert group_block_sizes(sched) == (4, 4)
    assert (sched.block_size, sched.hash_block_size) == (4, 2)
    assert sched.cache_config.block_size == sched.cache_config.mamba_block_size == 4
    assert sched.mamba_partial_cache_hit


def test_partial_hits_and_their_copies_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """With Mamba blocks twice the program's, programs pass both loops, vLLM hands the worker
    block copies, and hits ending inside a Mamba block read a partial state, each checked;
    so are the full-attention group's blocks such hits end inside (copy-on-write there too)."""
    partial: list[int] = []
    copies: list[int] = []
    attention: list[int] = []
    check, apply = CacheWrites._check_hit_state, CacheWrites.apply_copies
    check_attention = CacheWrites._check_partial_hit

    def counting_check(
        self: CacheWrites, sched: Any, rid: str, start: int, table: Any, bs: int, *args: Any
    ) -> None:
        partial.extend([1] if start % bs else [])
        check(self, sched, rid, start, table, bs, *args)

    def counting_attention(self: CacheWrites, *args: Any) -> None:
        attention.append(1)
        check_attention(self, *args)

    def counting_apply(self: CacheWrites, done: Any) -> None:
        copies.extend(1 for _ in done)
        apply(self, done)

    monkeypatch.setattr(CacheWrites, "_check_hit_state", counting_check)
    monkeypatch.setattr(CacheWrites, "apply_copies", counting_apply)
    monkeypatch.setattr(CacheWrites, "_check_partial_hit", counting_attention)
    options = replace(MAMBA, mamba_block_scale=2)
    for seed in range(PROGRAMS * 2):
        for async_scheduling in (False, True):
            _run(seed, async_scheduling, options)
    assert partial and copies and attention, (len(partial), len(copies), len(attention))


def test_block_copies_left_out_of_the_scheduler_output_are_caught() -> None:
    """Seeded bug: the scheduler output leaves out the block copies it owes the worker. A
    request running on from its prompt's end has its cache entry moved to another block, which
    the copy would have filled; a later hit ending inside that Mamba block finds another
    state there, or none (`cache_hit_written`)."""
    options = replace(MAMBA, mamba_block_scale=2, mutate=mamba_copy_dropped)

    seen = first_violations(PROGRAMS * 2, _align_mode_run(options), until="cache_hit_written")
    assert "cache_hit_written" in seen, seen
    # the copy's destination holds what it held before, if anything: not this state
    words = ("inside its block", "not the state after its first")
    assert all(w in seen["cache_hit_written"] for w in words), seen


def test_attention_copies_left_out_are_caught_inside_the_block() -> None:
    """Seeded bug: the scheduler output leaves out the full-attention group's block copies and
    keeps the Mamba group's. A hit ending inside an attention block gets its private block
    without the shared block's first tokens; the check of that block, before the batch
    writes the rest of it, catches it (`cache_hit_written`). Checking only the whole blocks
    below a hit, as the record did before, the same programs pass."""
    options = replace(MAMBA, mamba_block_scale=2, mutate=attention_copy_dropped)
    seen = first_violations(PROGRAMS * 3, _align_mode_run(options), until="cache_hit_written")
    assert "cache_hit_written" in seen, seen
    words = ("inside its block", "of KV cache group 0", "no batch or copy wrote its first tokens")
    assert all(w in seen["cache_hit_written"] for w in words), seen


@pytest.mark.parametrize("mamba_block_scale", [1, 2])
def test_branching_prompts_pass(mamba_block_scale: int) -> None:
    """Prompts that share a start and then differ (`branching_prompt_program`) pass both
    loops, with Mamba blocks of the hash block and twice it: where a hit ends inside a block,
    vLLM copies it before the request writes its own tokens."""
    _passes_in_both_modes(
        replace(MAMBA, mamba_block_scale=mamba_block_scale), branching_prompt_program
    )


def test_a_block_shared_instead_of_copied_is_caught_where_prompts_branch() -> None:
    """Seeded bug: a hit ending inside a full-attention block takes the cached block itself,
    not a private copy, and the request writes its next tokens into it. Where prompts only
    extend a shared prompt those are the tokens the block holds, the same KV; where they
    branch off inside the block (`branching_prompt_program`) the request overwrites another
    request's cached tokens, and the write is caught (`cache_hit_written`)."""
    options = replace(MAMBA, mamba_block_scale=2, mutate=attention_block_shared)
    run = _align_mode_run(options, branching_prompt_program)
    seen = first_violations(PROGRAMS * 3, run, until="cache_hit_written")
    assert "cache_hit_written" in seen, seen
    words = ("writes its tokens", "under a prefix-cache key", "with other tokens")
    assert all(w in seen["cache_hit_written"] for w in words), seen


def _hashed(rid: str, hashes: bytes) -> Any:
    """A stand-in for vLLM's `Request`: an id and one block hash per hash block."""
    return SimpleNamespace(request_id=rid, block_hashes=[bytes([h]) for h in hashes])


@pytest.mark.parametrize(
    ("written", "words"),
    [
        (None, "no batch or copy wrote its first tokens there"),
        (("partial", "r1", 1, 5), "wrote block 1 of 'r1' up to token 5 there"),
        (("full", "r2", 1, 8), "wrote block 1 of 'r2' there"),
        (("partial", "r3", 0, 3), "wrote block 0 of 'r3' up to token 3 there"),
    ],
    ids=["nothing", "too-short", "other-tokens", "other-block"],
)
def test_a_hit_inside_an_attention_block_reads_what_the_block_holds(
    written: tuple[str, str, int, int] | None, words: str
) -> None:
    """Hash blocks of 1 token, attention blocks of 4: a hit ending at token 6 reads block 1's
    first 2 tokens. A write of them by a request sharing them passes (partial up to token 6
    or beyond, or completed, or copied from such a block); nothing written, a write that
    stops short, another prefix ('r2' shares 5 tokens), or another block index fails with
    what the block holds."""
    hit = _hashed("r0", bytes(range(8)))
    sharer = _hashed("r9", bytes([0, 1, 2, 3, 4, 5, 9, 9]))
    writes = CacheWrites(1, group_block_sizes=(4,))
    writes._put_partial(5, sharer, 1, 6, 0)
    writes.apply_copies([SimpleNamespace(src_block_id=5, dst_block_id=6)])
    writes._check_partial_hit("r0", hit, 6, 6, 0, 0)  # copied from a sharer's partial write
    writes.put(7, (sharer, 1))
    writes._check_partial_hit("r0", hit, 6, 7, 0, 0)  # a sharer's completed block
    others = {
        "r1": _hashed("r1", bytes([0, 1, 2, 3, 4, 5, 9, 9])),
        "r2": _hashed("r2", bytes([0, 1, 2, 3, 4, 8, 8, 8])),
        "r3": _hashed("r3", bytes(range(8))),
    }
    if written is not None:
        kind, rid, k, end = written
        if kind == "full":
            writes.put(8, (others[rid], k))
        else:
            writes._put_partial(8, others[rid], k, end, 0)
    with pytest.raises(EngineCoreViolation) as err:
        writes._check_partial_hit("r0", hit, 6, 8, 4, 0)
    assert err.value.rule == "cache_hit_written", err.value
    assert "'r0' starts from the prefix cache at token 6, inside its block 1" in str(err.value)
    assert words in str(err.value), err.value


def _tokens(rid: str, tokens: list[int]) -> Any:
    """A stand-in for vLLM's `Request` in hash blocks of 1 token: its tokens, and a block
    hash per token that names the prefix through it (hashes chain)."""
    hashes = [bytes(str(tokens[: i + 1]), "ascii") for i in range(len(tokens))]
    return SimpleNamespace(request_id=rid, all_token_ids=tokens, block_hashes=hashes)


@pytest.mark.parametrize(
    ("hit_tokens", "key_of", "fails"),
    [
        ([1, 2, 3, 4, 5, 9], "writer", True),
        ([1, 2, 3, 4, 5, 6], "writer", False),
        ([1, 2, 3, 4, 5, 6], None, False),
        ([1, 2, 3, 4, 5, 6], "writer-prefix", False),
    ],
    ids=["other-tokens", "same-tokens", "no-key", "key-of-other-content"],
)
def test_a_write_over_a_cached_blocks_tokens_is_caught(
    hit_tokens: list[int], key_of: str | None, fails: bool
) -> None:
    """Hash blocks of 1 token, attention blocks of 4: 'r1' completed its block 1 (tokens 4 to
    7) in block 8, which the prefix cache holds under the key of that content. 'r0' writing
    its tokens 5 and 6 there (a hit ending inside the block, shared instead of copied) breaks
    `cache_hit_written` where its tokens differ from 'r1's: a later hit on the key would read
    them. The same tokens (the same KV), no key on the block, or a key that names other
    content (vLLM keys a block for a step's tokens before the step writes them) pass."""
    writer = _tokens("r1", [1, 2, 3, 4, 5, 6, 7, 8])
    hit = _tokens("r0", [*hit_tokens, 7, 8])
    writes = CacheWrites(1, group_block_sizes=(4,))
    writes.put(8, (writer, 1))
    key = {
        "writer": writer.block_hashes[7] + b"\x00",
        "writer-prefix": writer.block_hashes[5] + b"\x00",
        None: None,
    }[key_of]
    blocks = {8: SimpleNamespace(block_hash=key)}
    sched = SimpleNamespace(
        kv_cache_manager=SimpleNamespace(block_pool=SimpleNamespace(blocks=blocks))
    )
    table = (3, 8)
    if not fails:
        writes._check_overwrite(sched, hit, 5, 7, table, 0)
        return
    with pytest.raises(EngineCoreViolation) as err:
        writes._check_overwrite(sched, hit, 5, 7, table, 0)
    assert err.value.rule == "cache_hit_written", err.value
    words = "'r0' writes its tokens 5 to 6 into block 8 (its block 1 in KV cache group 0), which "
    assert words + "holds block 1 of 'r1' under a prefix-cache key, with other tokens" in str(
        err.value
    ), err.value


# ------------------------------------------------------------ internal prefill checkpoints
CHECKPOINTS = replace(MAMBA, mamba_checkpoint_alignment=1)  # as vLLM's Mamba2 layers declare
SHRUNK_FINDING = "docs/shrunk/vllm-mamba-mid-block-hit.json"


def test_vllm_reserves_prefill_checkpoint_blocks_for_layers_that_export_them() -> None:
    """With a checkpoint alignment the Mamba group declares a prefill checkpoint block, and the
    worker's rule exports the state at the prompt's last reusable hash block boundary into
    the column before the step's last: a prompt of 6 tokens in blocks of 2, run in one step,
    leaves the state after 4 tokens (one token short of the last is held back for the
    logits) in column 1."""
    sched = RealVllmScheduler(
        CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True, mamba_checkpoint_alignment=1
    ).sched
    assert sched.mamba_has_prefill_checkpoint_blocks
    assert mamba_checkpoint(sched, 1, 6, 6) == (4, 1)
    assert mamba_checkpoint(sched, 1, 6, 1) == (0, -1)  # a decode step exports none
    plain = RealVllmScheduler(CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True).sched
    assert mamba_checkpoint(plain, 1, 6, 6) == (0, -1)


def test_prefill_checkpoints_are_written_hit_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Programs pass both loops with checkpoint-exporting layers; the record keeps each
    checkpoint the worker writes into a real block, and hits read such checkpoints, each
    checked against the state after exactly the hit's tokens."""
    exported: dict[int, int] = {}
    hits: list[int] = []
    record, check = CacheWrites._record_states, CacheWrites._check_hit_state

    def recording(self: CacheWrites, req: Any, start: int, n: int, table: Any, group: int) -> None:
        record(self, req, start, n, table, group)
        assert self.state_checkpoint is not None
        tokens, column = self.state_checkpoint(group, start + n, n)
        if tokens and 0 <= column < len(table) and table[column] is not None:
            exported[table[column]] = tokens
        exported.pop(table[(start + n - 1) // self.group_block_size(group)] or -1, None)

    def checking(
        self: CacheWrites, sched: Any, rid: str, start: int, table: Any, bs: int, *args: Any
    ) -> None:
        block = table[(start - 1) // bs]
        hits.extend([1] if block is not None and exported.get(block) == start else [])
        check(self, sched, rid, start, table, bs, *args)

    monkeypatch.setattr(CacheWrites, "_record_states", recording)
    monkeypatch.setattr(CacheWrites, "_check_hit_state", checking)
    for seed in range(PROGRAMS):
        for async_scheduling in (False, True):
            _run(seed, async_scheduling, CHECKPOINTS)
    assert exported and hits, (len(exported), len(hits))


def test_a_checkpoint_keyed_on_the_wrong_block_is_caught() -> None:
    """Seeded bug: the manager keys the block of the step's last token, not the one the
    worker exported the checkpoint into, under the checkpoint's block hash. A later hit on
    it reads the state after the whole step (`cache_hit_written`)."""
    options = replace(CHECKPOINTS, mutate=mamba_checkpoint_keyed_one_column_late)

    seen = first_violations(PROGRAMS, _align_mode_run(options), until="cache_hit_written")
    assert "cache_hit_written" in seen, seen
    words = ("starts from the prefix cache", "it holds the state of", "not the state after")
    assert all(w in seen["cache_hit_written"] for w in words), seen


#: The finding's shrunk program (docs/shrunk/vllm-mamba-mid-block-hit.json, from shared-prompt
#: program 51): Mamba blocks of 2 tokens hashed every token.
FINE_HIT_PROGRAM = eval(
    json.loads((Path(__file__).resolve().parents[1] / SHRUNK_FINDING).read_text())["program"],
    {"CoreProgram": CoreProgram, "ArConfig": ArConfig, "ArRequest": ArRequest, "Policy": Policy},
)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_finding_a_copied_partial_hit_is_cached_as_the_full_block_it_never_became(
    async_scheduling: bool,
) -> None:
    """vLLM 0.33.0, Mamba blocks larger than the hash block, layers that export prefill
    checkpoints (Mamba2's): r10 hits r2's checkpoint after 3 tokens, inside its Mamba block 1,
    and vLLM copies it into a private block (copy-on-write). As the backend saves the next
    checkpoint itself, vLLM does not stop r10's chunk at the block's end: the step runs from 3
    to 7, so its state after 7 lands in block 3 and block 1 keeps the state after 3. vLLM
    still caches block 1 as a full block, under the hash of 4 tokens, and r16's hit of 4
    tokens reads the state after 3 (`cache_hit_written`): its output would skip a token.
    Without the checkpoints vLLM stops the chunk at 4 and the program passes, as it does with
    the Mamba block the hash block, and with the candidate fix `stop-mid-block-chunks`, which
    stops it there with them too."""
    options = replace(CHECKPOINTS, mamba_block_scale=2)
    with pytest.raises(EngineCoreViolation) as err:
        run_loop(FINE_HIT_PROGRAM, async_scheduling=async_scheduling, options=options)
    assert err.value.rule == "cache_hit_written", err.value
    words = ("'r16' starts from the prefix cache at token 4", "after 3 tokens")
    assert all(w in err.value.detail for w in words), err.value
    for passing in (
        replace(options, mamba_checkpoint_alignment=None),
        CHECKPOINTS,
        replace(options, fix=apply_mamba_split_fix),
    ):
        run_loop(FINE_HIT_PROGRAM, async_scheduling=async_scheduling, options=passing)


def test_the_mid_block_fix_is_a_patch_of_vllms_scheduler() -> None:
    """The fix prints as a diff of vLLM's `scheduler.py` that drops the exemption, and
    generated programs with fine-grained hits and checkpoints pass with it."""
    diff = mamba_split_diff()
    assert "-            if start % block_size != 0 and not use_internal_checkpoint" in diff
    assert "+            if start % block_size != 0\n" in diff
    options = replace(CHECKPOINTS, mamba_block_scale=2, fix=apply_mamba_split_fix)
    for seed in range(PROGRAMS):
        _run(seed, True, options)


# ------------------------------------------------- a sliding window and a Mamba group together
WINDOW_AND_MAMBA = replace(MAMBA, sliding_window=3)


def test_vllm_builds_three_groups_for_a_window_and_a_mamba_group() -> None:
    """Attention, sliding-window and Mamba layers in one model (Samba, Phi-4-mini-flash):
    three KV cache groups sharing one pool, the pool three groups' worth; the window's blocks
    may be larger, the Mamba block stays the attention block."""
    impl = RealVllmScheduler(CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True, sliding_window=3)
    sched = impl.sched
    assert kv_groups(sched) == 3
    assert [mamba_mode(sched, g) for g in range(3)] == [None, None, "align"]
    assert [window_tokens(sched, g) for g in range(3)] == [None, 3, None]
    assert sched.kv_cache_manager.block_pool.num_gpu_blocks == 3 * (CONFIG.num_blocks - 1) + 1
    larger = RealVllmScheduler(
        CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True, sliding_window=3, window_block_scale=2
    ).sched
    assert group_block_sizes(larger) == (2, 4, 2)
    assert (larger.block_size, larger.hash_block_size) == (4, 2)


def test_mamba_blocks_of_two_hash_blocks_beside_a_window_scale_every_group() -> None:
    """Mamba blocks twice the program's beside a window: vLLM's platform raises every attention
    layer's block to the Mamba block, the window's too, and hashes by the program's block. Its
    sliding-window manager looks hits up by whole blocks only, so vLLM turns fine-grained hits
    off for the whole cache: hits end on a block of 4, never inside one."""
    sched = RealVllmScheduler(
        CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True, sliding_window=3, mamba_block_scale=2
    ).sched
    assert group_block_sizes(sched) == (4, 4, 4)
    assert [window_tokens(sched, g) for g in range(3)] == [None, 3, None]
    assert (sched.block_size, sched.hash_block_size) == (4, 2)
    assert not sched.mamba_partial_cache_hit
    assert sched.kv_cache_manager.coordinator._cache_hit_alignment_tokens == 4


@pytest.mark.parametrize(
    ("window_block_scale", "mamba_block_scale"), [(1, 1), (2, 1), (1, 2)], ids=str
)
def test_generated_programs_pass_with_a_window_and_a_mamba_group(
    window_block_scale: int, mamba_block_scale: int
) -> None:
    """Shared-prompt programs pass both loops over the three groups, with prefix caching and
    without, preemptions with a step in flight among them; also with the window's blocks twice
    the others' (a window layer of less KV per token), and with every group's blocks twice
    the hash block (Mamba blocks of two hash blocks)."""
    _passes_in_both_modes(
        replace(
            WINDOW_AND_MAMBA,
            window_block_scale=window_block_scale,
            mamba_block_scale=mamba_block_scale,
        )
    )


@pytest.mark.parametrize(
    ("bug", "words"),
    [
        (window_freed_early, ("holds the null block as its block", "in KV cache group 1")),
        (mamba_state_freed_early, ("in KV cache group 2", "a Mamba state block")),
    ],
    ids=["window", "mamba"],
)
@pytest.mark.parametrize("mamba_block_scale", [1, 2])
def test_each_group_of_three_is_checked(
    bug: Callable[[Any], None], words: tuple[str, ...], mamba_block_scale: int
) -> None:
    """A seeded bug in the window's manager, or in the Mamba group's, is caught in its own
    group of the three (`kv_covers_scheduled`), with every group's blocks the hash block or
    twice it."""
    options = replace(WINDOW_AND_MAMBA, mamba_block_scale=mamba_block_scale, mutate=bug)

    seen = first_violations(PROGRAMS, _align_mode_run(options), until="kv_covers_scheduled")
    assert "kv_covers_scheduled" in seen, seen
    assert all(w in seen["kv_covers_scheduled"] for w in words), seen


@pytest.mark.parametrize(
    ("build", "field"),
    [
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
        (  # one group of larger blocks at a time: the window's, or every group's
            lambda: RealVllmScheduler(
                CONFIG,
                lambda _e: None,
                SPACE_PREFIX,
                mamba=True,
                sliding_window=3,
                window_block_scale=2,
                mamba_block_scale=2,
            ),
            "mamba",
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
        (
            lambda: RealVllmScheduler(
                CONFIG, lambda _e: None, SPACE_PREFIX, mamba_checkpoint_alignment=1
            ),
            "mamba_checkpoint_alignment",
        ),
        (
            lambda: RealVllmScheduler(
                CONFIG, lambda _e: None, SPACE_PREFIX, mamba=True, mamba_checkpoint_alignment=0
            ),
            "mamba_checkpoint_alignment",
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
    both = ["--sliding-window", "3", "--mamba-checkpoint-alignment", "1"]
    assert script.main([*argv, *both]) == 0
    out = capsys.readouterr().out
    words = "(a Mamba group, with prefill checkpoints on a grid of 1, and a sliding window of 3"
    assert words in out, out
    branching = ["--programs", "3", "--programs-from", "branching-prompts", "--mamba"]
    assert script.main([*branching, "--mamba-block-scale", "2"]) == 0
    assert "3 branching-prompts programs" in capsys.readouterr().out
    for bad in (
        [
            "--mamba",
            "--sliding-window",
            "3",
            "--window-block-scale",
            "2",
            "--mamba-block-scale",
            "2",
        ],
        ["--mamba", "--offload-chunks", "8"],
        ["--mamba", "--speculative-tokens", "2"],
        ["--mamba-block-scale", "2"],
        ["--mamba-checkpoint-alignment", "1"],
        ["--mamba", "--mamba-checkpoint-alignment", "0"],
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
