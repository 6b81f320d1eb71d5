"""vLLM 0.34.0's cache-aware admission (`cache_aware_admission_window`) in its engine-core loop
(`LoopOptions.cache_aware_window`, `--cache-aware-window N`; rule `cache_aware_order`,
`integrations.vllm.cache_aware_check`): the programs pass both loops with the window moving the
queue and `admission_order` held to the order it leaves; the finding that a prompt-scoring
request is ranked by cached tokens it may not read reproduces in the loop (the shrunk program
docs/shrunk/vllm-cache-probe.json, both loops) and the fix `bounded-cache-probe` lifts it;
seeded bugs in the window's use fail the rule, each with a message naming the order. Beside
the cap on in-flight KV loads the window orders the plain queue and vLLM merges the two queues
by their heads: `admission_order` holds each queue's order and arrival across them, and seeded
bugs in the merge fail it. The diffusion loop, whose scheduler inherits the window, holds it
too.

These run on 0.34.0 in `test_real_vllm_newest`. On 0.33.0, which has no such setting, each
checks instead that asking for it is a `ConfigError` naming the setting and the release, and
that the scripts refuse the flag with a one-line usage error."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.cache_probe_fix import CACHE_PROBE
from integrations.vllm.diffusion import RULES as DLLM_RULES
from integrations.vllm.diffusion import DllmProgram, dllm_program, run_dllm
from integrations.vllm.diffusion import check_both as dllm_check_both
from integrations.vllm.engine_core import (
    RULES,
    CoreProgram,
    EngineCoreViolation,
    LoopOptions,
    check_both,
    core_program,
    run_loop,
)
from integrations.vllm.kv_load_fixes import apply_kv_load_fixes
from integrations.vllm.loop_arguments import make_fixes
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.test_real_vllm_cache_aware import has_the_setting
from tests.test_real_vllm_inflight_loads import _async_queue_first, _plain_queue_first

PROGRAMS = int(os.environ.get("SCHEDSPEC_VLLM_PROGRAMS", "30"))
#: The window on every call (threshold 0), so that small programs engage it.
WINDOW = LoopOptions(cache_aware_window=3, cache_aware_threshold=0.0)
LIMITED = dataclasses.replace(WINDOW, cache_read_limits=True)
RECORD = Path(__file__).resolve().parents[1] / "docs" / "shrunk" / "vllm-cache-probe.json"


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _has_the_setting() -> bool:
    """Whether the loaded release has cache-aware admission (`has_the_setting`); on one
    without, the loop refuses the window too, naming the setting and the release."""
    if has_the_setting():
        return True
    with pytest.raises(ConfigError, match=r"cache_aware_admission_window.*new in vLLM 0\.34\.0"):
        run_loop(core_program(0), async_scheduling=False, options=WINDOW)
    return False


def _window_programs() -> Iterator[CoreProgram]:
    """`PROGRAMS` generated programs the window applies to: FCFS with prefix caching (half
    their prompts prefixes of one shared prompt)."""
    found, seed = 0, 0
    while found < PROGRAMS:
        program = core_program(seed)
        seed += 1
        config = program.config
        if config.enable_prefix_caching and config.policy is Policy.FCFS:
            found += 1
            yield program


def _first_violation(options: LoopOptions) -> EngineCoreViolation:
    """The violation of the first of `_window_programs` that breaks a rule in the synchronous
    loop under `options` (programs vLLM refuses to start skipped); fails the test if none
    does."""
    for program in _window_programs():
        try:
            run_loop(program, async_scheduling=False, options=options)
        except EngineCoreViolation as err:
            return err
        except ConfigError:
            continue
    pytest.fail(f"no program of {PROGRAMS} broke a rule under {options}")


def test_window_programs_pass_both_loops_and_move_the_queue() -> None:
    """With the window on every call, the programs pass every check in both loops (the
    admission order held to the window's), the window engages and moves the queue; with read
    limits, a KV connector and the fix, it ranks some request below its whole cached prefix,
    and they pass."""
    if not _has_the_setting():
        return
    assert "cache_aware_order" in RULES
    engaged = moved = 0
    for program in _window_programs():
        for run in check_both(program, WINDOW):
            engaged += run.window_engaged
            moved += run.window_moved
    assert engaged > moved > 0, (engaged, moved)
    fixed = dataclasses.replace(LIMITED, kv_connector="fail", fix=make_fixes([CACHE_PROBE]))
    cut = 0
    for program in _window_programs():
        cut += sum(run.window_cut for run in check_both(program, fixed))
    assert cut > 0


def _recorded() -> tuple[CoreProgram, dict[str, Any]]:
    record = json.loads(RECORD.read_text())
    names = {"CoreProgram": CoreProgram, "ArConfig": ArConfig, "ArRequest": ArRequest}
    program = eval(record["program"], names)
    assert isinstance(program, CoreProgram)
    return program, record


def test_finding_a_prompt_scoring_request_is_ranked_by_a_prefix_it_may_not_read() -> None:
    """The shrunk program: r3 leaves the shared prompt's first block cached; r8, scoring its
    3-token prompt from row 1 on, may read no whole block of it, nor may r7, so both rank 0
    and r7 stays ahead; vLLM ranks r8 by the 2 cached tokens and moves it first, in both loops.
    With `bounded-cache-probe` both loops pass."""
    if not _has_the_setting():
        return
    program, record = _recorded()
    options = LoopOptions(**record["options"], draw_seed=record["draw_seed"])
    for async_scheduling in (False, True):
        with pytest.raises(EngineCoreViolation) as caught:
            run_loop(program, async_scheduling=async_scheduling, options=options)
        assert caught.value.rule == "cache_aware_order", caught.value
        detail = caught.value.detail
        # (the asynchronous loop has r6 still waiting ahead of them)
        assert "as ['r8', " in detail, detail
        assert "r7 0, r8 0 (its read limit; 2 cached)" in detail, detail
        assert detail.endswith("'r7', 'r8']"), detail
        fixed = dataclasses.replace(options, fix=make_fixes([CACHE_PROBE]))
        run_loop(program, async_scheduling=async_scheduling, options=fixed)


def _windowed(seed: int) -> DllmProgram:
    """Diffusion program `seed` with prefix caching (half its prompts shared), served with the
    window on every call."""
    program = dllm_program(seed, prefix_caching=True)
    serving = dataclasses.replace(program.serving, cache_aware_window=3, cache_aware_threshold=0)
    return dataclasses.replace(program, serving=serving)


def test_the_diffusion_loop_holds_the_window_too() -> None:
    """vLLM's diffusion scheduler inherits the window: diffusion programs pass both loops with
    it engaged and moving the queue, and a window that never moves fails `cache_aware_order`
    there. On a release without the setting, serving it is a `ConfigError`."""
    if not has_the_setting():
        with pytest.raises(ConfigError, match=r"new in vLLM 0\.34\.0"):
            run_dllm(_windowed(0), async_scheduling=False)
        return
    assert "cache_aware_order" in DLLM_RULES
    engaged = moved = 0
    for seed in range(PROGRAMS):
        for run in dllm_check_both(_windowed(seed)):
            engaged += run.window_engaged
            moved += run.window_moved
    assert engaged > moved > 0, (engaged, moved)
    for seed in range(PROGRAMS):
        try:
            run_dllm(_windowed(seed), async_scheduling=False, mutate=_never_moves)
        except EngineCoreViolation as err:
            assert err.rule == "cache_aware_order", err
            assert "the order is" in err.detail, err.detail
            return
    pytest.fail(f"no diffusion program of {PROGRAMS} caught a window that never moves")


def _engages_below_the_threshold(sched: Any) -> None:
    """Seeded bug: the window engages whatever the pool's usage."""
    sched.cache_aware_threshold = 0.0


def _never_moves(sched: Any) -> None:
    """Seeded bug: the window is asked for but leaves the queue as it is."""
    sched._reorder_waiting_by_cached_prefix = lambda: None


def _reorders_past_the_window(sched: Any) -> None:
    """Seeded bug: the window reorders the whole waiting queue."""
    sched.cache_aware_window = 1000


def _window_off(sched: Any) -> None:
    """Seeded bug: the admission phase never asks for the window."""
    sched.cache_aware_window = 0


def _forgets_the_order(sched: Any) -> None:
    """Seeded bug: after each call the never-scheduled waiting requests go back to arrival
    order (the window's order lasts one call)."""
    original = sched.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        queue = sched.waiting
        slots = [i for i, r in enumerate(queue) if r.status == type(r.status).WAITING]
        fresh = sorted((queue[i] for i in slots), key=lambda r: r.arrival_time)
        order = list(queue)
        for slot, request in zip(slots, fresh, strict=True):
            order[slot] = request
        queue.remove_requests(list(queue))
        for request in reversed(order):
            queue.prepend_request(request)
        return out

    sched.schedule = schedule


#: Each seeded bug, the options it runs under (the loop's threshold, vLLM's), and what the
#: message says.
SEEDED_BUGS: tuple[tuple[Callable[[Any], None], LoopOptions, str], ...] = (
    (_engages_below_the_threshold, dataclasses.replace(WINDOW, cache_aware_threshold=0.5), "<"),
    (_never_moves, WINDOW, "the order is"),
    (_reorders_past_the_window, WINDOW, "the order is"),
    (_window_off, WINDOW, "without the cache-aware window ordering the waiting queue first"),
    (_forgets_the_order, WINDOW, "not in the order ['"),
)


@pytest.mark.parametrize(
    ("bug", "options", "said"), SEEDED_BUGS, ids=[b.__name__.strip("_") for b, _, _ in SEEDED_BUGS]
)
def test_the_window_rule_catches_each_seeded_bug(
    bug: Callable[[Any], None], options: LoopOptions, said: str
) -> None:
    """The first program a seeded bug fails, in the synchronous loop, breaks
    `cache_aware_order` with a message that says what order was due."""
    if not _has_the_setting():
        return
    err = _first_violation(dataclasses.replace(options, fix=bug))
    assert err.rule == "cache_aware_order", err
    assert said in err.detail, err.detail


#: The window beside vLLM's cap on in-flight KV loads: a connector that loads some requests
#: asynchronously, which vLLM queues apart (`async_kv_waiting`), the window ranking the plain
#: queue only.
CAPPED_WINDOW = dataclasses.replace(WINDOW, kv_connector="fail", max_inflight_kv_loads=2)

#: Shrunk from shared-prompts program 669 under `CAPPED_WINDOW` (`scripts/vllm_shrink.py`,
#: with the loop reading the plain queue's heads as they stood before the window): r5 and r7
#: wait; r8 (whose KV the connector may load asynchronously) and r9 (a cached prefix of r0's
#: shared prompt) arrive together, r8 first. The window moves r9 ahead of r5 and r7; vLLM
#: compares the queues' heads, r9 against r8, and starts r8's load, passing r5 and r7, which
#: arrived before r8.
HEAD_MOVED = CoreProgram(
    ArConfig(
        block_size=2,
        num_blocks=3,
        max_num_batched_tokens=1,
        max_num_seqs=1,
        max_model_len=5,
        enable_prefix_caching=True,
    ),
    arrivals=(
        (ArRequest("r0", 4, 1, prompt=tuple(range(100, 104))),),
        (ArRequest("r1", 2, 1),),
        (),
        (ArRequest("r5", 1, 1), ArRequest("r7", 1, 1)),
        (ArRequest("r8", 2, 1), ArRequest("r9", 3, 1, prompt=tuple(range(100, 103)))),
    ),
    aborts=((), (), (), (), ()),
)
HEAD_MOVED_DRAWS = 3149180149


def test_the_window_beside_the_load_cap_orders_the_plain_queue_and_merges_by_heads() -> None:
    """With the in-flight load cap, the programs pass both loops: the window orders the plain
    waiting queue, and a request of the asynchronous-load queue may pass the plain queue's
    requests standing behind a head that arrived after it, a head the window moved there
    (`HEAD_MOVED`: r8 passes r5 and r7, counted in `window_passes`)."""
    if not _has_the_setting():
        return
    moved = 0
    for program in _window_programs():
        moved += sum(run.window_moved for run in check_both(program, CAPPED_WINDOW))
    assert moved > 0
    options = dataclasses.replace(CAPPED_WINDOW, draw_seed=HEAD_MOVED_DRAWS)
    sync_run = run_loop(HEAD_MOVED, async_scheduling=False, options=options)
    assert (sync_run.window_moved, sync_run.window_passes) == (1, 2), sync_run
    run_loop(HEAD_MOVED, async_scheduling=True, options=options)


#: Shrunk from program 320 under the window, the cap and failing loads recomputed with the six
#: KV load fixes: r14's load fails as a whole and the fix `requeue-failed-load` puts it back at
#: the plain queue's head, ahead of r13, which arrived before it. The window then moves r11
#: first of r14, r7 and r11, and r7, after it, stays ahead of r13.
REQUEUED_HEAD = CoreProgram(
    ArConfig(
        block_size=2,
        num_blocks=11,
        max_num_batched_tokens=1,
        max_num_seqs=1,
        max_model_len=8,
        enable_prefix_caching=True,
    ),
    arrivals=(
        (ArRequest("r0", 2, 1),),
        (ArRequest("r3", 5, 1),),
        (ArRequest("r6", 3, 1, prompt=tuple(range(100, 103))), ArRequest("r7", 1, 1)),
        (ArRequest("r9", 7, 1),),
        (ArRequest("r11", 3, 1, prompt=tuple(range(100, 103))),),
        (ArRequest("r13", 1, 1), ArRequest("r14", 6, 1)),
    ),
    aborts=((), (), (), (), (), ()),
)
REQUEUED_HEAD_DRAWS = 2719323373


def test_a_request_put_back_at_the_head_does_not_move_the_order_of_those_behind() -> None:
    """`REQUEUED_HEAD` passes the synchronous loop with the window moving the queue once: the
    window's order is kept among the never-scheduled requests it ranked (r11, r7), not with
    r14's place, which arrived after r13 but stood ahead of it. Giving r7 r14's place (the
    loop's first reading) put r13 ahead of r7 and failed `cache_aware_order` in schedule 10."""
    if not _has_the_setting():
        return
    options = LoopOptions(
        kv_connector="recompute",
        max_inflight_kv_loads=1,
        cache_aware_window=3,
        cache_aware_threshold=0.0,
        fix=apply_kv_load_fixes,
        draw_seed=REQUEUED_HEAD_DRAWS,
    )
    run = run_loop(REQUEUED_HEAD, async_scheduling=False, options=options)
    assert run.window_moved == 1 and run.loads_failed >= 1, run


def _merges_below_the_windows_head(sched: Any) -> None:
    """Seeded bug: the queues are merged by the plain queue's earliest arrival, not its head,
    so a head the window moved ahead goes before an earlier asynchronous load."""

    def merged(take_async_kv: bool) -> Any:
        loads, plain = sched.async_kv_waiting, sched.waiting
        if not take_async_kv or not loads:
            return plain
        if not plain:
            return loads
        earliest = min(r.arrival_time for r in plain)
        return loads if loads.peek_request().arrival_time < earliest else plain

    sched._next_waiting_queue = merged


@pytest.mark.parametrize(
    ("bug", "passed_queue"),
    [
        (_merges_below_the_windows_head, "async_kv_waiting"),
        (_plain_queue_first, "async_kv_waiting"),
        (_async_queue_first, "waiting"),
    ],
    ids=["below-the-head", "plain-first", "async-first"],
)
def test_the_order_across_the_queues_holds_beside_the_window(
    bug: Callable[[Any], None], passed_queue: str
) -> None:
    """With the window on, a merge of the two waiting queues other than by their heads'
    arrivals admits a request while an earlier one of the other queue waits: the first
    program it fails breaks `admission_order`, naming both queues (the window's order holds
    within the plain queue; across the queues, arrival does, as vLLM compares the heads)."""
    if not _has_the_setting():
        return
    err = _first_violation(dataclasses.replace(CAPPED_WINDOW, fix=bug))
    assert err.rule == "admission_order", err
    assert f"(in {passed_queue}, " in err.detail, err.detail


#: The window beside a drafter with lookahead slots (EAGLE: its block hashes take one token of
#: lookahead, so vLLM drops no cached block for it) and the padding fix its programs need.
EAGLE_WINDOW = dataclasses.replace(
    WINDOW, speculative_tokens=2, speculative_method="eagle", fix=make_fixes(["pad-what-fits"])
)


def test_the_window_beside_a_drafter_ranks_whole_hits() -> None:
    """With EAGLE or a draft model the window's programs pass both loops (those whose pool
    cannot hold a sequence with the drafter's lookahead refused as vLLM refuses them), the
    window moving the queue; a probe that drops the last cached block where admission does not
    fails `cache_aware_order`. Beside a KV connector, where admission drops EAGLE's last cached
    block (no lookahead hashes), the programs pass with each rank a block shorter, and a probe
    that keeps the block fails the rule."""
    if not _has_the_setting():
        return
    moved = 0
    for method in ("eagle", "draft_model"):
        options = dataclasses.replace(EAGLE_WINDOW, speculative_method=method)
        for program in _window_programs():
            with contextlib.suppress(ConfigError):
                moved += sum(run.window_moved for run in check_both(program, options))
    assert moved > 0
    pad = make_fixes(["pad-what-fits"])
    assert pad is not None

    def probe_drops_a_block(sched: Any) -> None:
        pad(sched)
        manager = sched.kv_cache_manager
        probe = manager.get_num_cached_tokens
        block = sched.cache_config.block_size
        manager.get_num_cached_tokens = lambda request: max(0, probe(request) - block)

    caught = _first_violation(dataclasses.replace(EAGLE_WINDOW, fix=probe_drops_a_block))
    assert caught.rule == "cache_aware_order", caught
    assert "the order is" in caught.detail, caught.detail

    # beside a KV connector vLLM hashes without lookahead, so admission drops EAGLE's last
    # cached block from every hit: the loop ranks each hit a block shorter
    fixes = make_fixes(["pad-what-fits", "cap-draft-margin", "evict-failed-blocks"])
    assert fixes is not None
    dropping: list[bool] = []

    def record_the_drop(sched: Any) -> None:
        fixes(sched)
        dropping.append(bool(sched.use_eagle_block_drop))

    connected = dataclasses.replace(
        EAGLE_WINDOW, kv_connector="fail", max_inflight_kv_loads=1, fix=record_the_drop
    )
    moved = 0
    for program in _window_programs():
        with contextlib.suppress(ConfigError):
            moved += sum(run.window_moved for run in check_both(program, connected))
    assert moved > 0 and dropping and all(dropping), (moved, dropping[:3])

    def probe_keeps_the_block(sched: Any) -> None:
        """Seeded bug: the window's probe ranks the whole hit, the EAGLE drop turned off."""
        fixes(sched)
        manager = sched.kv_cache_manager
        probe = manager.get_num_cached_tokens
        coordinator = manager.coordinator

        def whole(request: Any) -> Any:
            dropped = coordinator.drop_eagle_group_ids
            coordinator.drop_eagle_group_ids = set()
            try:
                return probe(request)
            finally:
                coordinator.drop_eagle_group_ids = dropped

        manager.get_num_cached_tokens = whole

    caught = _first_violation(dataclasses.replace(connected, fix=probe_keeps_the_block))
    assert caught.rule == "cache_aware_order", caught


def test_the_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    """`--cache-aware-window` below 0, a threshold outside [0, 1] or without the window,
    `--fix bounded-cache-probe` without the window, and, on a release without the setting, the
    window at all: a usage error (exit 2, one line). The window beside the in-flight load cap
    runs."""
    check = load_script("vllm_async_check")
    for argv, said in (
        (["--cache-aware-window", "-1"], "--cache-aware-window: an int >= 1 (0: off)"),
        (["--cache-aware-threshold", "0.2"], "--cache-aware-threshold: a number in [0, 1]"),
        (["--cache-aware-window", "3", "--cache-aware-threshold", "2"], "a number in [0, 1]"),
        (["--fix", CACHE_PROBE], f"--fix {CACHE_PROBE}: edits the probe of --cache-aware-window"),
    ):
        with pytest.raises(SystemExit) as exit_:
            check.main(["--programs", "1", *argv])
        assert exit_.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert said in last, (argv, last)
    if _has_the_setting():  # the cap, a setting of the same release, runs beside it
        argv = ["--cache-aware-window", "3", "--kv-connector", "fail"]
        assert check.main(["--programs", "1", *argv, "--max-inflight-kv-loads", "1"]) == 0
        assert "at most 1 loads holding blocks" in capsys.readouterr().out
        return
    with pytest.raises(SystemExit) as exit_:
        check.main(["--programs", "1", "--cache-aware-window", "3"])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--cache-aware-window: invalid cache_aware_admission_window=3" in last, last
    assert "new in vLLM 0.34.0" in last, last


def test_the_diffusion_check_script_refuses_the_window_where_vllm_does_not_apply_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`scripts/vllm_dllm_check.py --cache-aware-window 3` without `--prefix-caching`, or with
    `--priority`, is a usage error (vLLM applies the window under FCFS with prefix caching
    only); on a release without the setting, so is the window with prefix caching."""
    check = load_script("vllm_dllm_check")
    for argv in (["--cache-aware-window", "3"], ["--prefix-caching", "--priority"]):
        argv = argv if "--cache-aware-window" in argv else [*argv, "--cache-aware-window", "3"]
        with pytest.raises(SystemExit) as exit_:
            check.main(["--programs", "1", *argv])
        assert exit_.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert "--cache-aware-window: with --prefix-caching, not --priority" in last, last
    argv = ["--programs", "1", "--prefix-caching", "--cache-aware-window", "3"]
    if has_the_setting():
        assert check.main(argv) == 0
        assert "cache-aware admission (window 3, usage >= 0.5)" in capsys.readouterr().out
        return
    with pytest.raises(SystemExit) as exit_:
        check.main(argv)
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "invalid cache_aware_admission_window=3" in last and "new in vLLM 0.34.0" in last


def _probe_reads_one_group(sched: Any) -> None:
    """Seeded bug: the window's probe counts the leading blocks cached in the first KV cache
    group alone, not the hit every group of a hybrid cache can serve."""
    manager = sched.kv_cache_manager
    pool = manager.block_pool
    block = int(sched.cache_config.block_size)

    def probe(request: Any) -> int:
        run = 0
        for block_hash in request.block_hashes[: max(0, request.num_tokens - 1) // block]:
            if pool.get_cached_block(block_hash, [0]) is None:
                break
            run += 1
        return run * block

    manager.get_num_cached_tokens = probe


def test_the_window_beside_a_hybrid_cache_ranks_by_every_groups_hit() -> None:
    """Beside a sliding window or a Mamba group the window's programs pass both loops (those
    vLLM refuses for Mamba refused alike), the window moving the queue, each request ranked by
    the hit admission's lookup takes from every group; a probe reading one group alone fails
    `cache_aware_order` with a sliding window."""
    if not _has_the_setting():
        return
    for hybrid in ({"sliding_window": 4}, {"mamba": True}):
        options = dataclasses.replace(WINDOW, **hybrid)
        moved = 0
        for program in _window_programs():
            with contextlib.suppress(ConfigError):
                moved += sum(run.window_moved for run in check_both(program, options))
        assert moved > 0, hybrid
    err = _first_violation(
        dataclasses.replace(WINDOW, sliding_window=4, fix=_probe_reads_one_group)
    )
    assert err.rule == "cache_aware_order", err
    assert "the order is" in err.detail, err.detail
