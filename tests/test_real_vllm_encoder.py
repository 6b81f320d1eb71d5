"""vLLM 0.33.0's engine-core loop serving multimodal requests (`LoopOptions(encoder=...)`,
`--mm-items N`): every prompt carries items (images named by their placeholder tokens), vLLM's
scheduler decides which the encoder runs and keeps its encoder cache's book, and the loop
rebuilds the model runner's encoder cache from the scheduler outputs
(`integrations.vllm.encoder_inputs`).

What is checked: `encoder_output_ready` (no "Encoder cache miss"), `encoder_budget`,
`encoder_cache_capacity`, `encoder_cache_agrees` (book and runner name the same entries),
`mm_input_chunked` (with chunked mm input disabled), `no_chunking_when_disabled` (with chunked
prefill off) and, once drained, `encoder_refs_released`;
`admission_order` and `idle_step` let vLLM skip a request whose items find no room, by design.
Released vLLM passes the first 40 random and shared-prompt programs; a seeded bug per rule
fails them. Three findings, each with a candidate fix: a request preempted in the step that
scheduled it leaves its never-computed items booked (`unbook-victim-encoder-inputs`); with
chunked mm input disabled a long-prefill cap shorter than an item stalls the request for good
(`whole-item-past-threshold`); a request truncated by a failed KV load keeps its references to
items past its new frontier and may wait for itself for good (`release-items-past-rollback`).
Two more, in 0.33.0 only, that 0.34.0 fixed (an item split after a prefix-cache hit inside
it; a prompt split by encoder pressure with chunked prefill off), 0.34.0's changes backported
as their fixes (`integrations.vllm.mm_upstream_fixes`).

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.encoder_inputs import EncoderOptions, EncoderRunner, identifier, item_ranges
from integrations.vllm.encoder_rollback_fix import (
    ENCODER_ROLLBACK_FIXES,
    RELEASE_ITEMS_PAST_ROLLBACK,
)
from integrations.vllm.encoder_victim_fix import ENCODER_VICTIM_FIXES, apply_encoder_victim_fix
from integrations.vllm.engine_core import CoreProgram, LoopOptions, core_program, run_loop
from integrations.vllm.kv_load_fixes import KV_LOAD_FIXES
from integrations.vllm.loop_arguments import make_fixes
from integrations.vllm.mm_threshold_fix import MM_THRESHOLD_FIXES, apply_mm_threshold_fix
from integrations.vllm.mm_upstream_fixes import (
    FINISH_ITEM_STARTED_INSIDE,
    MM_UPSTREAM_FIXES,
    WHOLE_PROMPT_UNDER_ENCODER_PRESSURE,
    fixed_upstream,
)
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations, passing_runs
from tests.engine_gate import require_engine
from tests.patch_check import apply_fix_set
from tests.script_module import load_script
from tests.vllm_seeded_bugs import (
    chunked_prefill_forced_on,
    encoder_budget_ignored,
    encoder_cache_oversized,
    encoder_evictions_untold,
    encoder_inputs_not_sent,
    encoder_refs_kept,
    mm_input_split,
)

PROGRAMS = 40
ITEMS = LoopOptions(encoder=EncoderOptions())


def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def test_items_are_placed_as_far_as_they_fit_and_named_by_their_tokens() -> None:
    """Without vLLM: items at 1, 1 + 2L, ...; an item that would pass the prompt is left out;
    the same placeholder tokens, the same identifier."""
    options = EncoderOptions(items=3, item_tokens=2)
    assert item_ranges(12, options) == [(1, 2), (5, 2), (9, 2)]
    assert item_ranges(10, options) == [(1, 2), (5, 2)]
    assert item_ranges(2, options) == []
    assert identifier((7, 8)) == identifier([7, 8]) != identifier((8, 7))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"items": 0}, "items"),
        ({"item_tokens": True}, "item_tokens"),
        ({"budget": 0}, "budget"),
        ({"cache": "4"}, "cache"),
    ],
)
def test_bad_encoder_options_are_typed_errors(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        EncoderOptions(**fields)
    assert err.value.field == field, err.value


@pytest.mark.parametrize("generate", [core_program, shared_prompt_program])
def test_released_vllm_serves_items_in_both_loops(generate: Callable[[int], CoreProgram]) -> None:
    """Random and shared-prompt programs pass both loops with two items a prompt; the encoder
    runs, steps read items, the cache evicts, and shared prompts share items across requests."""
    _vllm()
    runs = passing_runs(
        PROGRAMS,
        lambda seed: [
            run_loop(generate(seed), async_scheduling=a, options=ITEMS) for a in (False, True)
        ],
    )
    flat = [run for pair in runs for run in pair]
    assert sum(r.encoder_runs for r in flat) > 0
    assert sum(r.encoder_reads for r in flat) > sum(r.encoder_runs for r in flat) // 2
    assert sum(r.encoder_evictions for r in flat) > 0
    if generate is shared_prompt_program:
        assert sum(r.encoder_shared for r in flat) > 0


#: (seeded bug, its options, the rule it fails, words of the message).
SEEDED_BUGS: list[tuple[Callable[[Any], None], EncoderOptions, str, tuple[str, ...]]] = [
    (encoder_inputs_not_sent, EncoderOptions(), "encoder_output_ready", ("Encoder cache miss",)),
    (
        encoder_budget_ignored,
        EncoderOptions(item_tokens=2, budget=2),
        "encoder_budget",
        ("the compute budget is 2",),
    ),
    (
        encoder_cache_oversized,
        EncoderOptions(item_tokens=2, cache=2),
        "encoder_cache_capacity",
        ("the cache size is 2",),
    ),
    (
        encoder_evictions_untold,
        EncoderOptions(item_tokens=2, cache=2),
        "encoder_cache_agrees",
        ("by the runner only ['image:",),
    ),
    (
        mm_input_split,
        EncoderOptions(chunked=False),
        "mm_input_chunked",
        ("with chunked mm input disabled",),
    ),
    (
        chunked_prefill_forced_on,
        EncoderOptions(),
        "no_chunking_when_disabled",
        ("of its", "prompt with chunked prefill off"),
    ),
    (
        encoder_refs_kept,
        EncoderOptions(cache=1000),
        "encoder_refs_released",
        ("still referenced",),
    ),
]


@pytest.mark.parametrize(
    ("bug", "encoder", "rule", "words"),
    SEEDED_BUGS,
    ids=[bug.__name__ for bug, _, _, _ in SEEDED_BUGS],
)
def test_the_checks_catch_each_seeded_encoder_bug(
    bug: Callable[[Any], None], encoder: EncoderOptions, rule: str, words: tuple[str, ...]
) -> None:
    _vllm()
    options = LoopOptions(encoder=encoder, mutate=bug)

    def run(seed: int) -> object:
        try:
            return run_loop(core_program(seed), async_scheduling=True, options=options)
        except ConfigError:  # an item longer than a step, with chunked mm input disabled
            return None

    seen = first_violations(PROGRAMS, run, until=rule)
    assert rule in seen, seen
    assert all(w in seen[rule] for w in words), seen[rule]


#: The shrunk program of the first finding (`scripts/vllm_shrink.py --seed 122 --loop async
#: --rule encoder_cache_agrees --programs-from same-step --mm-items 3 --mm-tokens 2`): 'r0'
#: (priority 3) prefills its 11 tokens, items at [1, 3), [5, 7), [9, 11), in chunks of 2;
#: 'r1' and 'r2' (priority 0) arrive and 'r2' finds no block in the step that scheduled r0's
#: last item.
VICTIM = CoreProgram(
    ArConfig(
        block_size=1,
        num_blocks=13,
        max_num_batched_tokens=3,
        max_num_seqs=3,
        max_model_len=12,
        long_prefill_token_threshold=2,
        policy=Policy.PRIORITY,
    ),
    arrivals=(
        (ArRequest("r0", 11, 1, priority=3, prompt=tuple(range(100, 111))),),
        (ArRequest("r1", 1, 2),),
        (ArRequest("r2", 1, 2),),
    ),
    aborts=((), (), ()),
)
VICTIM_ITEMS = LoopOptions(encoder=EncoderOptions(items=3, item_tokens=2))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_victim_of_the_step_that_scheduled_it_leaves_its_item_booked(
    async_scheduling: bool,
) -> None:
    """Finding: r0's last item is booked when the step schedules it, then r0 is preempted in
    that step and the item is never computed, yet the book keeps it; the candidate fix drops
    it and the program passes."""
    _vllm()
    seen = first_violations(
        1, lambda _: run_loop(VICTIM, async_scheduling=async_scheduling, options=VICTIM_ITEMS)
    )
    assert set(seen) == {"encoder_cache_agrees"}, seen
    message = seen["encoder_cache_agrees"]
    assert "held by the book only {'image:109,110': []}" in message, message
    fixed = replace(VICTIM_ITEMS, fix=apply_encoder_victim_fix)
    run = run_loop(VICTIM, async_scheduling=async_scheduling, options=fixed)
    assert run.reasons == {"r0": "length", "r1": "length", "r2": "length"}, run.reasons


#: Programs in which the booked item is read, at vLLM's own sizes, shrunk (with the book's rule
#: off, under `--lifted-by unbook-victim-encoder-inputs`) from an ad-hoc search in which two
#: requests prefill one shared prompt side by side (docs/engines/vllm-features.md): in each, the
#: victim, 'r1', resumes and reaches the item the book calls cached.
MISSES = {
    False: CoreProgram(
        ArConfig(
            block_size=2,
            num_blocks=5,
            max_num_batched_tokens=4,
            max_num_seqs=2,
            max_model_len=8,
            long_prefill_token_threshold=2,
            policy=Policy.PRIORITY,
        ),
        arrivals=(
            (
                ArRequest("r0", 1, 1, priority=3),
                ArRequest("r1", 7, 1, priority=2, arrival_time=1.0, prompt=tuple(range(100, 107))),
            ),
            (ArRequest("r2", 2, 2, arrival_time=2.0),),
        ),
        aborts=((), ()),
    ),
    True: CoreProgram(
        ArConfig(
            block_size=2,
            num_blocks=7,
            max_num_batched_tokens=6,
            max_num_seqs=2,
            max_model_len=12,
            long_prefill_token_threshold=2,
            policy=Policy.PRIORITY,
            enable_prefix_caching=True,
        ),
        arrivals=(
            (ArRequest("r1", 11, 1, priority=2, arrival_time=1.0, prompt=tuple(range(100, 111))),),
            (ArRequest("r3", 3, 1, arrival_time=3.0),),
        ),
        aborts=((), ()),
    ),
}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_booked_item_is_a_runner_miss_once_read(
    async_scheduling: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At vLLM's own encoder cache size, with the book's rule off, the victim resumes and reaches
    the item the book calls cached: no step computes it and the model runner misses ("Encoder
    cache miss"). With the candidate fix the item is computed again and the program passes."""
    _vllm()
    monkeypatch.setattr(EncoderRunner, "_check_agrees", lambda self, where: None)
    program = MISSES[async_scheduling]
    seen = first_violations(
        1, lambda _: run_loop(program, async_scheduling=async_scheduling, options=VICTIM_ITEMS)
    )
    assert set(seen) == {"encoder_output_ready"}, seen
    assert "'r1' is scheduled tokens" in seen["encoder_output_ready"], seen
    assert "the runner's encoder cache does not hold it" in seen["encoder_output_ready"]
    fixed = replace(VICTIM_ITEMS, fix=apply_encoder_victim_fix)
    assert run_loop(program, async_scheduling=async_scheduling, options=fixed).encoder_runs > 0


#: The shrunk program of the second finding (`scripts/vllm_shrink.py --seed 4 --loop sync
#: --rule progress --mm-items 2 --no-chunked-mm-input`): one seat, a long-prefill cap of 1, 'r1'
#: with a 3-token item at [1, 4), 'r2' waiting for the seat.
STALL = CoreProgram(
    ArConfig(
        block_size=1,
        num_blocks=5,
        max_num_batched_tokens=3,
        max_num_seqs=1,
        max_model_len=5,
        long_prefill_token_threshold=1,
    ),
    arrivals=((ArRequest("r1", 4, 1),), (ArRequest("r2", 1, 1),)),
    aborts=((), ()),
)
WHOLE_ITEMS = LoopOptions(encoder=EncoderOptions(chunked=False))


def test_a_cap_shorter_than_an_item_stalls_it_with_chunked_mm_input_disabled() -> None:
    """Finding: r1 reaches its item's start, then every step caps it at 1 token, which the
    item may not be split into, while r2 waits for r1's seat: `progress`, naming the item. The
    candidate fix lets the cap reach the item's end and both finish."""
    _vllm()
    seen = first_violations(
        1, lambda _: run_loop(STALL, async_scheduling=False, options=WHOLE_ITEMS)
    )
    assert set(seen) == {"progress"}, seen
    assert "r1 (1 token computed, next item at [1, 4))" in seen["progress"], seen["progress"]
    for async_scheduling in (False, True):
        run = run_loop(
            STALL,
            async_scheduling=async_scheduling,
            options=replace(WHOLE_ITEMS, fix=apply_mm_threshold_fix),
        )
        assert run.reasons == {"r1": "length", "r2": "length"}, run.reasons


#: The shrunk program of the third finding (`scripts/vllm_shrink.py --seed 921 --loop sync
#: --programs-from shared-prompts --mm-items 2 --kv-connector recompute` and the KV connector's
#: six fixes, `--lifted-by release-items-past-rollback`): 'r6' (items at [1, 4) and [7, 10), a
#: cache of 3 embeddings) loads 5 tokens from the connector and runs its second item; the load
#: fails in its first block and truncates it to nothing computed, still holding that item.
ROLLBACK = CoreProgram(
    ArConfig(
        block_size=2,
        num_blocks=6,
        max_num_batched_tokens=3,
        max_num_seqs=1,
        max_model_len=11,
    ),
    arrivals=((ArRequest("r5", 1, 1),), (ArRequest("r6", 10, 1, prompt=tuple(range(100, 110))),)),
    aborts=((), ()),
)


def _rollback_options(*more: str) -> LoopOptions:
    return LoopOptions(
        encoder=EncoderOptions(),
        kv_connector="recompute",
        fix=make_fixes([*KV_LOAD_FIXES.names, *more]),  # found beside the connector's fixes
        draw_seed=1672677917,  # the draws the program was found with: its load fails
    )


def test_a_request_truncated_by_a_failed_load_waits_for_its_own_item() -> None:
    """Finding: truncated to nothing computed, r6 needs its first item, which finds no room
    in a cache its own reference to the second holds: it is given no token for good. The
    candidate fix drops references past the new frontier, and r6 finishes."""
    _vllm()
    seen = first_violations(
        1, lambda _: run_loop(ROLLBACK, async_scheduling=False, options=_rollback_options())
    )
    assert set(seen) == {"progress"}, seen
    assert "r6 (1 token computed, next item at [1, 4))" in seen["progress"], seen["progress"]
    fixed = _rollback_options(RELEASE_ITEMS_PAST_ROLLBACK)
    run = run_loop(ROLLBACK, async_scheduling=False, options=fixed)
    assert run.reasons == {"r5": "length", "r6": "length"}, run.reasons
    assert run.loads_failed + run.blocks_invalid > 0 and run.encoder_evictions > 0, run


#: The shrunk programs of two findings of 0.33.0 that 0.34.0 fixed (`scripts/vllm_shrink.py
#: --seed 1649 --loop sync --mm-items 2 --no-chunked-mm-input --fix whole-item-past-threshold
#: --lifted-by finish-item-started-inside`, and `--seed 1835 --loop async --mm-items 2
#: --lifted-by whole-prompt-under-encoder-pressure`): 'r7' hits r1's cached blocks up to token
#: 8, inside its item at [7, 10), and is scheduled token 8 alone; 'r3', with chunked prefill
#: off, finds its item no room beside r0's and r1's and is scheduled 1 of its 4 tokens.
ITEM_SPLIT = CoreProgram(
    ArConfig(
        block_size=4,
        num_blocks=6,
        max_num_batched_tokens=3,
        max_num_seqs=3,
        max_model_len=12,
        policy=Policy.PRIORITY,
        enable_prefix_caching=True,
    ),
    arrivals=(
        (ArRequest("r1", 11, 1, prompt=tuple(range(100, 111))),),
        (ArRequest("r6", 1, 1), ArRequest("r7", 10, 1, prompt=tuple(range(100, 110)))),
    ),
    aborts=((), ()),
)
PROMPT_SPLIT = CoreProgram(
    ArConfig(
        block_size=4,
        num_blocks=4,
        max_num_batched_tokens=8,
        max_num_seqs=3,
        max_model_len=5,
        enable_chunked_prefill=False,
    ),
    arrivals=((ArRequest("r0", 4, 1), ArRequest("r1", 4, 1)), (ArRequest("r3", 4, 1),)),
    aborts=((), ()),
)
#: (program, its options, its loop, the rule 0.33.0 breaks, words of the message, the fix).
FIXED_IN_0_34: list[tuple[CoreProgram, LoopOptions, bool, str, str, str]] = [
    (
        ITEM_SPLIT,
        replace(WHOLE_ITEMS, fix=apply_mm_threshold_fix),
        False,
        "mm_input_chunked",
        "'r7' is scheduled tokens [8, 9), part of its item at [7, 10)",
        FINISH_ITEM_STARTED_INSIDE,
    ),
    (
        PROMPT_SPLIT,
        ITEMS,
        True,
        "no_chunking_when_disabled",
        "'r3' is scheduled tokens [0, 1) of its 4-token prompt with chunked prefill off",
        WHOLE_PROMPT_UNDER_ENCODER_PRESSURE,
    ),
]


@pytest.mark.parametrize(
    ("program", "options", "async_scheduling", "rule", "words", "fix"),
    FIXED_IN_0_34,
    ids=[case[3] for case in FIXED_IN_0_34],
)
def test_finding_of_0_33_fixed_in_0_34(
    program: CoreProgram,
    options: LoopOptions,
    async_scheduling: bool,
    rule: str,
    words: str,
    fix: str,
) -> None:
    """On 0.33.0 the program breaks its rule (a chunk starting inside an item splits it; the
    encoder's cut splits a prompt with chunked prefill off) and 0.34.0's change, backported as
    the fix, lifts it; on 0.34.0 it passes as released."""
    _vllm()
    if fixed_upstream():
        run_loop(program, async_scheduling=async_scheduling, options=options)
        return
    seen = first_violations(
        1, lambda _: run_loop(program, async_scheduling=async_scheduling, options=options)
    )
    assert set(seen) == {rule} and words in seen[rule], seen
    with_fix = make_fixes([fix])
    assert with_fix is not None
    fixes = [f for f in (options.fix, with_fix) if f is not None]

    def both(sched: Any) -> None:
        for apply in fixes:
            apply(sched)

    run_loop(program, async_scheduling=async_scheduling, options=replace(options, fix=both))


def test_an_item_longer_than_a_step_is_refused_with_chunked_mm_input_disabled() -> None:
    """vLLM's own check (`compute_mm_encoder_budget`) as a typed error naming what is valid."""
    _vllm()
    program = replace(STALL, config=replace(STALL.config, max_num_batched_tokens=2))
    with pytest.raises(ConfigError) as err:
        run_loop(program, async_scheduling=False, options=WHOLE_ITEMS)
    assert err.value.field == "item_tokens"
    assert "at most max_num_batched_tokens (2)" in str(err.value)


def test_the_sweep_takes_items_and_refuses_encoder_settings_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`scripts/vllm_async_check.py --mm-items 2` passes and counts the encoder's work; an
    encoder setting without `--mm-items`, or a bad value, is a usage error (exit 2)."""
    _vllm()
    script = load_script("vllm_async_check")
    assert script.main(["--programs", "6", "--mm-items", "2", "--encoder-cache", "4"]) == 0
    out = capsys.readouterr().out
    assert "up to 2 multimodal items of 3 tokens a prompt (encoder cache 4)" in out
    assert "multimodal items the encoder ran" in out
    for argv, message in (
        (["--encoder-budget", "4"], "--encoder-budget: only with --mm-items"),
        (["--mm-items", "-1"], "--mm-items: an int >= 0"),
        (["--mm-items", "1", "--mm-tokens", "0"], "invalid item_tokens=0"),
    ):
        with pytest.raises(SystemExit) as exit_:
            script.main(["--programs", "1", *argv])
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err


def test_the_fixes_are_edits_of_vllms_scheduler(tmp_path: Path) -> None:
    """Each candidate fix is an edit of the installed vLLM's own `scheduler.py`, applied by
    `git apply` to the very text the fixed scheduler runs (`scripts/engine_fixes_diff.py
    vllm-encoder-victim`, `vllm-mm-threshold`, `vllm-encoder-rollback`, and on 0.33.0
    `vllm-mm-upstream`)."""
    _vllm()
    for fixes, marker in (
        (ENCODER_VICTIM_FIXES, "ec_manager.free(preempted_req)"),
        (MM_THRESHOLD_FIXES, "capped = item_end - chunk_start"),
        (ENCODER_ROLLBACK_FIXES, "ec_manager.free_encoder_input(request, input_id)"),
    ):
        diff, patched = apply_fix_set(tmp_path / fixes.names[0], fixes)
        assert marker in diff
        assert all(marker in text for text in patched.values())
    if not fixed_upstream():  # 0.34.0's own changes, backported: nowhere to go on 0.34.0
        diff, _ = apply_fix_set(tmp_path / "upstream", MM_UPSTREAM_FIXES)
        assert "must be" in diff and "rolls back to nothing until the rest fits" in diff
