"""SGLang 0.5.23's dLLM path with its block-level radix cache on (SGLang's default for dLLM),
checked by outcome and by the dLLM spec with its prefix cache, on the event log an
`SglangEventLog` writes of the run (`integrations.sglang.radix_check`).

What it shows: cache hits land on blocks written whole, with the request's own tokens, by one
forward, and the log of every run conforms to the spec's prefix cache (blocks cached, read,
released and evicted) with the five fixes; the only failures of released SGLang are known
findings (the ragged-row crash, the idle round of the worst-case estimate, and under KV
pressure the refused request's state); our `reserve-future-blocks` fix had to count the
cache's evictable blocks as free, which it did not (it stalled programs with the cache on);
and a tree that never locks a hit's prefix evicts blocks a request still reads.

Needs SGLang installed (`schedspec install-engines sglang`); skipped with
SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integrations.sglang import MANIFEST
from integrations.sglang.engine import Engine
from integrations.sglang.fixes import FIX_NAMES, sglang_fixed
from integrations.sglang.radix_check import (
    RadixCounts,
    RadixProgram,
    RadixRequest,
    RadixViolation,
    check_program,
    expected_output,
    radix_program,
)
from spec.config import DllmConfig, Mode
from tests.engine_gate import require_engine
from tests.script_module import load_script

PROGRAMS = 120
#: Two seats, a pool of 24 blocks of 4; r0 (8 prompt tokens, 8 new) is the request others
#: continue.
SMALL = DllmConfig(
    block_size=4, page_size=4, kv_pages=24, req_pool_rows=2, max_running_requests=2,
    max_context=40, mode=Mode.FDFO, mask_token_id=0, eos_token_id=None,
)  # fmt: skip
R0 = RadixRequest("r0", tuple(range(1, 9)), 8)


@pytest.fixture(autouse=True, scope="module")
def _sglang_installed() -> None:
    require_engine(MANIFEST, "sglang", "SGLang")


def _runs(
    mutate: Callable[[Engine], None] | None = None,
    *,
    radix_cache: bool = True,
    until: str | None = None,
    spec: bool = True,
    pressure: bool = False,
) -> tuple[list[RadixCounts], dict[str, tuple[int, str]]]:
    """Programs 0..PROGRAMS-1: the passing runs' counts and each rule's first failure (seed,
    message), stopping once rule `until` has failed."""
    runs: list[RadixCounts] = []
    failures: dict[str, tuple[int, str]] = {}
    for seed in range(PROGRAMS):
        program = radix_program(seed, pressure=pressure)
        try:
            runs.append(check_program(program, mutate, radix_cache=radix_cache, spec=spec))
        except RadixViolation as err:
            failures.setdefault(err.rule, (seed, str(err)))
            if err.rule == until:
                break
    return runs, failures


def test_a_continuation_hits_the_blocks_its_predecessor_denoised() -> None:
    """r1's prompt is r0's prompt and output: admitted after r0 finished, it takes r0's whole
    blocks from the cache, prompt and denoised output alike, and every one is clean."""
    r1 = RadixRequest("r1", R0.prompt + expected_output(R0, 0), 4)
    program = RadixProgram(SMALL, ((R0,), *((),) * 12, (r1,)))
    counts = check_program(program)
    # all 4 of r1's prompt blocks: r0's 2 prompt blocks and the 2 it denoised (SGLang bounds a
    # match by the committed tokens, and r1's fill adds a mask block after them)
    assert counts.hits == 1 and counts.hit_blocks == 4


def test_generated_programs_with_the_five_fixes_pass_with_the_cache_on_and_off() -> None:
    """With the five SGLang fixes every program passes, by outcome and by the spec on its
    event log, with the cache on and off; with it on they take hundreds of blocks from the
    cache, the log's cache events among them, and the tree evicts."""
    with sglang_fixed(FIX_NAMES):
        on, failed_on = _runs()
        off, failed_off = _runs(radix_cache=False)
    assert failed_on == {} and failed_off == {}
    assert sum(c.hits for c in on) > 200 and sum(c.hit_blocks for c in on) > 500
    assert sum(c.evictions for c in on) > 10 and sum(c.aborts for c in on) > 30
    # every hit block is a `CacheHit` of the log (and SGLang's own copies swapped for cached
    # ones besides); every committed block a `KvCached`
    assert sum(c.log_hits for c in on) >= sum(c.hit_blocks for c in on)
    assert sum(c.log_cached for c in on) > 1000 and sum(c.log_evicted for c in on) > 10
    assert sum(c.hits + c.log_hits + c.log_cached for c in off) == 0


def test_an_aborted_request_that_shares_a_prefix_leaves_the_cache_whole() -> None:
    """r1 continues r0 and is aborted while it runs on r0's cached blocks: its lock on them is
    released (`no_leak`), its output so far is its own, and r2, with the same prompt, still
    hits them."""
    r1 = RadixRequest("r1", R0.prompt + expected_output(R0, 0), 16)
    r2 = RadixRequest("r2", r1.prompt, 4)
    arrivals = ((R0,), *((),) * 12, (r1,), (), (), (r2,))
    aborts = ((), *((),) * 12, (), (), ("r1",), ())
    counts = check_program(RadixProgram(SMALL, arrivals, aborts))
    assert counts.aborts == 1 and counts.hits == 2 and counts.hit_blocks == 8


def test_a_radix_program_needs_one_abort_tuple_per_round() -> None:
    with pytest.raises(ValueError, match="2 rounds of arrivals but 1 of aborts"):
        RadixProgram(DllmConfig(), ((), ()), ((),))


def test_under_kv_pressure_the_five_fixes_pass_with_the_cache_on() -> None:
    """With a pool below what every running request can claim the tree evicts often, and the
    five fixes (ours, the reserve fix counting evictable blocks) keep every program passing."""
    with sglang_fixed(FIX_NAMES):
        runs, failures = _runs(pressure=True)
    assert failures == {}
    assert sum(c.evictions for c in runs) > 30 and sum(c.hits for c in runs) > 200
    assert sum(c.log_evicted for c in runs) > 100


def test_under_kv_pressure_released_sglang_corrupts_the_cache() -> None:
    """Seed 104 under pressure: r4, refused earlier, keeps its prefix match without a lock; the
    allocation for it evicts those pages and it reinserts them as it finishes, so the tree
    holds pages the allocator has free (`pool_accounting`). The refused-request fix, which
    restores what `init_next_round_input` changed, removes it (alone it stalls this program,
    as it does without the other four); the five fixes serve it."""
    program = radix_program(104, pressure=True)
    with pytest.raises(RadixViolation) as caught:
        check_program(program, spec=False)
    assert caught.value.rule == "pool_accounting"
    assert "the tree holds slots [10, 11, 12, 13] that are free" in caught.value.detail
    # the spec sees the refused request's state first: r0 keeps its row and its cache hits
    # while no forward runs for it
    with pytest.raises(RadixViolation) as by_spec:
        check_program(program)
    assert by_spec.value.rule == "spec:progress"
    assert "a round with 1 running requests ran no forward" in by_spec.value.detail
    with sglang_fixed(["refused-stays-incoming"]), pytest.raises(RadixViolation) as alone:
        check_program(program, spec=False)
    assert alone.value.rule == "progress"
    with sglang_fixed(FIX_NAMES):
        check_program(program)


def test_released_sglang_fails_only_known_findings() -> None:
    """Released, a few programs crash on a batch row that is not a whole block (the known
    finding `whole-staged-blocks` fixes): by outcome, that is all, and with that fix alone
    every program passes. The spec also sees the known idle round of SGLang's worst-case
    estimate (`worst-case-estimate`); with the two fixes every log conforms."""
    _, failures = _runs(spec=False)
    assert set(failures) <= {"implementation_error"}, failures
    if failures:
        assert "is invalid for input of size" in failures["implementation_error"][1]
    _, by_spec = _runs()
    assert set(by_spec) <= {"implementation_error", "spec:progress", "spec:whole_block_alloc"}
    assert "idle system with 1 queued requests admitted none" in by_spec["spec:progress"][1]
    with sglang_fixed(["whole-staged-blocks"]):
        _, fixed = _runs(spec=False)
    assert fixed == {}
    with sglang_fixed(["whole-staged-blocks", "worst-case-estimate"]):
        _, fixed = _runs()
    assert fixed == {}


def _no_evictable_cache(engine: Engine) -> None:
    """Our reserve-future-blocks as first written: it counted only the allocator's free slots,
    not the cached blocks the tree would evict for an allocation."""
    engine.tree_cache.full_evictable_size = lambda: 0


def _done_before_the_last_forward(engine: Engine) -> None:
    """Seeded bug: the algorithm reports a block done as soon as its last mask is filled, so
    the block's KV is last written with a mask in it (SGLang reports done only after a forward
    over the whole block)."""
    algorithm = engine.worker.dllm_algorithm
    step = algorithm.step

    def early(forward_batch: Any, logits: Any, states: Any) -> list[bool]:
        step(forward_batch, logits, states)
        b, mask = algorithm.block_size, algorithm.mask_id
        ids = forward_batch.input_ids.view(forward_batch.batch_size, b)
        return [bool((ids[i] != mask).all()) for i in range(forward_batch.batch_size)]

    algorithm.step = early


def _never_unlocked(engine: Engine) -> None:
    """Seeded bug: a finished request never releases its lock on the cached prefix."""
    engine.tree_cache.dec_lock_ref = lambda *args, **kwargs: None


def _prefix_never_locked(engine: Engine) -> None:
    """Seeded bug: the tree never locks the node a request's prefix ends on (a hit's, or what
    it cached), so under KV pressure it evicts blocks a running request still reads."""
    engine.tree_cache.lock = lambda *args, **kwargs: None


#: (seeded bug, rule, words of the first message)
SEEDED_BUGS: tuple[tuple[Callable[[Engine], None], str, str], ...] = (
    (_no_evictable_cache, "progress", "still live"),
    (_done_before_the_last_forward, "cache_hit_clean", "from the cache, last written with"),
    (_never_unlocked, "no_leak", "slots still locked in the tree"),
)


@pytest.mark.parametrize(
    ("mutant", "rule", "words"),
    SEEDED_BUGS,
    ids=[bug.__name__.strip("_") for bug, _, _ in SEEDED_BUGS],
)
def test_the_checks_catch_each_seeded_bug(
    mutant: Callable[[Engine], None], rule: str, words: str
) -> None:
    with sglang_fixed(FIX_NAMES):
        _, failures = _runs(mutant, until=rule, spec=False)
    assert rule in failures, failures
    assert words in failures[rule][1], failures[rule]


#: (seeded bug, KV pressure, the spec's rule, words of the first message)
SPEC_SEEDED_BUGS: tuple[tuple[Callable[[Engine], None], bool, str, str], ...] = (
    (_prefix_never_locked, True, "spec:evict_unread_only", "still reads"),
    (
        _done_before_the_last_forward,
        False,
        "spec:final_forward_before_commit",
        "the final-KV forward has not run",
    ),
)


@pytest.mark.parametrize(
    ("mutant", "pressure", "rule", "words"),
    SPEC_SEEDED_BUGS,
    ids=[bug.__name__.strip("_") for bug, _, _, _ in SPEC_SEEDED_BUGS],
)
def test_the_spec_on_the_event_log_catches_each_seeded_bug(
    mutant: Callable[[Engine], None], pressure: bool, rule: str, words: str
) -> None:
    """The same bugs seen through the event log alone, as `schedspec check-trace` sees a
    server's: the first violation names the rule, the line and the state."""
    with sglang_fixed(FIX_NAMES):
        _, failures = _runs(mutant, until=rule, pressure=pressure)
    assert rule in failures, failures
    assert words in failures[rule][1] and "line " in failures[rule][1], failures[rule]


def test_the_script_reports_the_cache_and_its_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script("sglang_radix_check")
    out = tmp_path / "radix.json"
    assert script.main(["--programs", "40", "--all-fixes", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "40 programs (radix cache on; fixes " in printed and "40 pass" in printed
    assert "event logs checked by the spec" in printed and "log_hits" in printed
    data = json.loads(out.read_text())
    assert data["radix_cache"] is True and data["failures"] == {} and data["counts"]["hits"] > 0
    assert data["spec"] is True and data["counts"]["log_hits"] >= data["counts"]["hit_blocks"]
    assert script.main(["--programs", "40", "--all-fixes", "--cache-off", "--json", str(out)]) == 0
    assert "(radix cache off; fixes " in capsys.readouterr().out
    off = json.loads(out.read_text())
    assert off["radix_cache"] is False and off["counts"]["hits"] == 0
    with pytest.raises(SystemExit) as refused:
        script.main(["--programs", "0"])
    assert refused.value.code == 2


@pytest.mark.parametrize("policy", ["lpm", "random"])
def test_under_sglangs_own_orders_the_five_fixes_pass_under_kv_pressure(
    policy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Served under `--schedule-policy lpm` (the longest cached prefix first) or `random`
    (seeded with each program's seed), the logs declare a free queue order, and with the five
    fixes every program passes under KV pressure, by outcome and by the spec."""
    script = load_script("sglang_radix_check")
    out = tmp_path / "radix.json"
    argv = ["--programs", "40", "--all-fixes", "--pressure", "--schedule-policy", policy]
    assert script.main([*argv, "--json", str(out)]) == 0
    assert f"--schedule-policy {policy}; event logs checked" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["schedule_policy"] == policy and data["failures"] == {}
    assert data["counts"]["log_hits"] > 50 and data["counts"]["log_evicted"] > 10, data
