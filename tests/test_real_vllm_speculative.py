"""vLLM 0.33.0's engine-core loop with speculative decoding (`integrations.vllm.speculative`),
and its finding: the padding of a newly admitted decode request to 1 + k tokens.

With k drafts, `Scheduler.schedule` pads a waiting request that has one token left to compute
(here: a full prefix-cache hit) to 1 + k tokens. A long-prefill threshold below 1 + k cuts the
padded request, and vLLM's own assert then fails in `schedule()`; a token budget below 1 + k
never fits it, and the request waits for ever. The programs: r0 (prompt P, 5 tokens, block
size 2) runs; r1 with the same prompt arrives later and hits 4 cached tokens.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.adapter import SPACE_PREFIX, RealVllmScheduler
from integrations.vllm.engine_core import (
    CoreProgram,
    EngineCoreLoop,
    EngineCoreViolation,
    LoopOptions,
    core_program,
    run_loop,
)
from integrations.vllm.patches import ScheduleFix
from integrations.vllm.preempted_cache_fix import PREEMPTED_CACHE_FIX
from integrations.vllm.same_step_programs import same_step_program
from integrations.vllm.spec_pad_fix import SPEC_PAD_FIX, apply_spec_pad_fix, fix_as_diff
from spec.ar.config import ArConfig, ArRequest
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.tier import depth, full_tier

ROOT = Path(__file__).resolve().parent.parent
PROMPT = (100, 101, 102, 103, 104)
ASSERT = "AssertionError at vllm/v1/core/sched/scheduler.py:"
PAD_ASSERT = "(assert num_new_tokens == 1 + self.num_spec_tokens)"
LOOPS = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _program(*, budget: int, threshold: int, gap: int) -> CoreProgram:
    """r0 (prompt PROMPT, 10 new tokens), `gap` steps, then r1 (the same prompt, 2 new)."""
    config = ArConfig(
        block_size=2,
        num_blocks=16,
        max_num_batched_tokens=budget,
        max_num_seqs=2,
        max_model_len=16,
        long_prefill_token_threshold=threshold,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
    )
    arrivals = (
        (ArRequest("r0", 5, 10, prompt=PROMPT),),
        *((),) * gap,
        (ArRequest("r1", 5, 2, prompt=PROMPT),),
    )
    return CoreProgram(config, arrivals, tuple(() for _ in arrivals))


#: threshold 1 < 1 + k: the padded full hit is cut, vLLM's assert fails
THRESHOLD = _program(budget=8, threshold=1, gap=2)
#: budget 2 < 1 + k: the padded full hit never fits
BUDGET = _program(budget=2, threshold=0, gap=4)


def _violation(program: CoreProgram, async_scheduling: bool, **kw: Any) -> EngineCoreViolation:
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(
            program,
            async_scheduling=async_scheduling,
            options=LoopOptions(speculative_tokens=2, **kw),
        )
    return caught.value


@LOOPS
def test_finding_a_threshold_below_the_padding_crashes_schedule(async_scheduling: bool) -> None:
    """Threshold 1, two drafts: `schedule()` pads r1's full hit to 3 tokens, the threshold
    cuts it to 1, and vLLM's own assert raises; the message names the statement."""
    err = _violation(THRESHOLD, async_scheduling)
    assert err.rule == "implementation_error"
    assert "vLLM raised in schedule: " + ASSERT in err.detail and PAD_ASSERT in err.detail, err


@LOOPS
def test_finding_a_budget_below_the_padding_never_admits_the_request(
    async_scheduling: bool,
) -> None:
    """Budget 2, two drafts: r1's padded size 3 never fits a step, so vLLM stops admitting at
    it in every step, after r0 has finished too: the loop never drains."""
    err = _violation(BUDGET, async_scheduling)
    assert err.rule == "progress"
    assert "0 running, 1 waiting" in err.detail, err


@LOOPS
@pytest.mark.parametrize("program", [THRESHOLD, BUDGET], ids=["threshold", "budget"])
def test_the_fix_serves_both_programs(program: CoreProgram, async_scheduling: bool) -> None:
    """With `pad-what-fits` both programs drain with every output right (the loop's checks)."""
    run = run_loop(
        program,
        async_scheduling=async_scheduling,
        options=LoopOptions(speculative_tokens=2, fix=apply_spec_pad_fix),
    )
    assert len(run.outputs["r0"]) == 10 and len(run.outputs["r1"]) == 2
    assert run.reasons == {"r0": "length", "r1": "length"}
    assert run.drafts_scheduled > 0


@LOOPS
def test_a_new_decodes_padding_is_never_accepted(async_scheduling: bool) -> None:
    """With room for it (threshold 0, budget 8) r1's full hit is padded with two draft
    placeholders. No draft was proposed for them, so the model rejects both and samples one
    token, whatever its draws (ten seeds): accepting padding would count unwritten positions as
    computed."""
    padded = _program(budget=8, threshold=0, gap=2)
    seen = 0
    for draft_seed in range(10):
        loop = EngineCoreLoop(
            padded.config,
            async_scheduling=async_scheduling,
            speculative_tokens=2,
            draft_seed=draft_seed,
        )
        assert loop.model is not None
        execute = loop.model.execute

        def watched(out: Any, rows: Any = None, execute: Any = execute, **kwargs: Any) -> Any:
            output, valid = execute(out, rows, **kwargs)
            for data in out.scheduled_new_reqs:
                if out.scheduled_spec_decode_tokens.get(data.req_id):
                    nonlocal seen
                    seen += 1
                    index = output.req_ids.index(data.req_id)
                    assert len(output.sampled_token_ids[index]) == 1
            return output, valid

        loop.model.execute = watched  # type: ignore[method-assign]
        loop.run(padded)
    assert seen == 10


@pytest.mark.parametrize("k", [1, 3])
def test_random_programs_with_drafts_pass_with_the_fix(k: int) -> None:
    """40 random engine-core programs (20 per push; priority, prefix caching, aborts,
    preemption) with up to k drafts a step pass every rule in both loops with the fix; drafts
    were verified, and some were accepted and some rejected."""
    scheduled = accepted = 0
    for seed in range(depth(20, 40)):
        for async_scheduling in (False, True):
            run = run_loop(
                core_program(seed),
                async_scheduling=async_scheduling,
                options=LoopOptions(speculative_tokens=k, fix=apply_spec_pad_fix),
            )
            scheduled += run.drafts_scheduled
            accepted += run.drafts_accepted
    assert 0 < accepted < scheduled, (accepted, scheduled)


@pytest.mark.parametrize(
    ("seed", "k", "async_scheduling", "rule"),
    [
        (132, 1, False, "implementation_error"),
        (503, 1, True, "implementation_error"),
        (172, 3, False, "progress"),
        (172, 3, True, "progress"),
    ],
)
def test_random_programs_reach_the_finding(
    seed: int, k: int, async_scheduling: bool, rule: str
) -> None:
    """Random programs reach both failures as released (seeds found by
    `scripts/vllm_async_check.py --speculative-tokens K`), and pass with the fix."""
    program = core_program(seed)
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(
            program, async_scheduling=async_scheduling, options=LoopOptions(speculative_tokens=k)
        )
    assert caught.value.rule == rule
    if rule == "implementation_error":
        assert PAD_ASSERT in caught.value.detail
    run_loop(
        program,
        async_scheduling=async_scheduling,
        options=LoopOptions(speculative_tokens=k, fix=apply_spec_pad_fix),
    )


def _keep_rejected(sched: Any) -> None:
    """Seeded bug: `update_from_output` forgets to roll `num_computed_tokens` back by the
    rejected drafts (the rest of vLLM, and the fix, as they are)."""
    apply_spec_pad_fix(sched)
    update = sched.update_from_output

    def update_from_output(out: Any, model_output: Any) -> Any:
        result = update(out, model_output)
        for rid, drafts in out.scheduled_spec_decode_tokens.items():
            req = sched.requests.get(rid)
            if req is None or req.is_finished():
                continue
            sampled = model_output.sampled_token_ids[model_output.req_ids.index(rid)]
            if sampled:
                req.num_computed_tokens += len(drafts) - (len(sampled) - 1)
        return result

    sched.update_from_output = update_from_output


def test_the_checks_catch_a_scheduler_that_keeps_rejected_drafts() -> None:
    """Over 20 random programs the seeded bug fails the synchronous loop with `decode_position`
    (the next decode starts past the last sampled token) or, where the drifted count leaves
    nothing to schedule, `idle_step` (a call that schedules nothing while the request stays
    running) or `progress`; and the asynchronous loop, where the model runner corrects
    positions, with drafts without rows, a stall or a cache hit no batch wrote."""
    seen: dict[bool, dict[str, str]] = {False: {}, True: {}}
    for seed in range(20):
        for async_scheduling in (False, True):
            try:
                run_loop(
                    core_program(seed),
                    async_scheduling=async_scheduling,
                    options=LoopOptions(speculative_tokens=2, fix=_keep_rejected),
                )
            except EngineCoreViolation as err:
                seen[async_scheduling].setdefault(err.rule, err.detail)
    assert "decode_position" in seen[False]
    assert set(seen[False]) <= {"decode_position", "idle_step", "progress"}
    assert re.fullmatch(
        r"sync loop: 'r\d+' is scheduled a decode from position (\d+), but its last sampled "
        r"token \(output \d+\) lies at position (\d+)",
        seen[False]["decode_position"],
    ), seen[False]
    assert seen[True] and set(seen[True]) <= {"progress", "cache_hit_written", "draft_rows"}


def _extra_draft(sched: Any) -> None:
    """Seeded bug: `schedule()` hands the first request it schedules drafts one more placeholder
    than it has rows for."""
    schedule = sched.schedule

    def extra(*args: Any) -> Any:
        out = schedule(*args)
        for drafts in out.scheduled_spec_decode_tokens.values():
            drafts.append(-1)
            break
        return out

    sched.schedule = extra


@LOOPS
def test_the_checks_catch_a_draft_without_a_row(async_scheduling: bool) -> None:
    """`draft_rows` fails on the seeded bug, naming the counts."""
    err = _violation(core_program(0), async_scheduling, fix=_extra_draft)
    assert err.rule == "draft_rows"
    assert "drafts: each draft needs a row of its own" in err.detail, err


#: Compiles vLLM's two scheduler modules as `python -O` does (asserts gone) when a fresh
#: interpreter imports them; every other module loads as usual, from its cached bytecode (a
#: whole `python -O` run compiles all of vLLM and torch from source first: 35 s or more).
_SCHEDULERS_AS_UNDER_O = """
import importlib.machinery, sys
OPTIMIZED = {"vllm.v1.core.sched.scheduler", "vllm.v1.core.sched.async_scheduler"}
class Optimized(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return compile(self.get_data(path), path, "exec", dont_inherit=True, optimize=1)
class Finder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in OPTIMIZED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = Optimized(name, spec.origin)
        return spec
sys.meta_path.insert(0, Finder)
"""


def test_without_asserts_the_padding_schedules_drafts_without_rows() -> None:
    """Under `python -O` vLLM's assert is gone: the threshold program then schedules r1 one
    token with two draft placeholders, and `draft_rows` fails in both loops instead. (A fresh
    interpreter compiles vLLM's scheduler modules as `-O` does; without that the program raises
    the assert, `test_finding_a_threshold_below_the_padding_crashes_schedule`.)"""
    code = _SCHEDULERS_AS_UNDER_O + (
        "from tests.test_real_vllm_speculative import THRESHOLD\n"
        "from integrations.vllm.engine_core import EngineCoreViolation, LoopOptions, run_loop\n"
        "for a in (False, True):\n"
        "    try:\n"
        "        drafts = LoopOptions(speculative_tokens=2)\n"
        "        run_loop(THRESHOLD, async_scheduling=a, options=drafts)\n"
        "    except EngineCoreViolation as err:\n"
        "        print(err)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    for line, mode in zip(lines, ("sync", "async"), strict=True):
        assert line.startswith(f"[draft_rows] {mode} loop: 'r1' is scheduled 1 token(s) with 2"), (
            line
        )


@pytest.mark.parametrize("method", ["eagle", "draft_model"])
def test_drafters_with_lookahead_pass_random_programs(method: str) -> None:
    """With a drafter of its own (lookahead slots; async: the V2 runner, which may skip
    drafting) 40 random programs (20 per push) pass every rule in both loops, or are refused
    as vLLM's start-up refuses them (a budget no larger than the lookahead, a pool below one
    max_model_len sequence); drafts are verified and some accepted."""
    passed = accepted = 0
    programs = depth(20, 40)
    for seed in range(programs):
        try:
            runs = [
                run_loop(
                    core_program(seed),
                    async_scheduling=a,
                    options=LoopOptions(
                        speculative_tokens=3, speculative_method=method, fix=apply_spec_pad_fix
                    ),
                )
                for a in (False, True)
            ]
        except ConfigError as err:
            assert "vLLM" in str(err), err
            continue
        passed += 1
        accepted += sum(run.drafts_accepted for run in runs)
    # at least three in four run (the rest refused at start-up)
    assert passed >= programs * 3 // 4 and accepted > 0, (passed, accepted)


@LOOPS
def test_a_draft_models_slot_counts_against_the_padding(async_scheduling: bool) -> None:
    """`draft_model` keeps a draft slot per request out of the budget: with budget 4 and three
    drafts the padded size 4 never fits the 3 tokens left, so r1 waits for ever as released,
    and is served with the fix (which counts that slot)."""
    program = _program(budget=4, threshold=0, gap=4)
    released = LoopOptions(speculative_tokens=3, speculative_method="draft_model")
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(program, async_scheduling=async_scheduling, options=released)
    assert caught.value.rule == "progress" and "0 running, 1 waiting" in caught.value.detail
    fixed = replace(released, fix=apply_spec_pad_fix)
    run = run_loop(program, async_scheduling=async_scheduling, options=fixed)
    assert len(run.outputs["r1"]) == 2
    ngram = LoopOptions(speculative_tokens=3)  # fits
    run_loop(program, async_scheduling=async_scheduling, options=ngram)


def _skip_always(sched: Any) -> None:
    """Seeded bug: every step tells the runner to skip drafting."""
    schedule = sched.schedule

    def skipping(*args: Any) -> Any:
        out = schedule(*args)
        out.skip_drafts = True
        return out

    sched.schedule = skipping


def test_the_checks_catch_drafts_verified_after_a_skipped_step() -> None:
    """`drafts_skipped` fails when vLLM skips drafting for a request that decodes next."""
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(
            core_program(0),
            async_scheduling=True,
            options=LoopOptions(speculative_tokens=3, speculative_method="eagle", fix=_skip_always),
        )
    assert caught.value.rule == "drafts_skipped"
    assert "right after a step vLLM marked skip_drafts" in caught.value.detail


def test_a_drafter_with_lookahead_needs_a_pool_for_one_sequence() -> None:
    """vLLM's start-up refuses a KV cache below one max_model_len sequence; with lookahead
    slots the adapter does too (a `ConfigError` naming the smallest valid pool)."""
    config = ArConfig(block_size=4, num_blocks=2, max_num_batched_tokens=5, max_model_len=5)
    with pytest.raises(ConfigError, match=r"num_blocks=2.*>= 3 with a drafter's lookahead"):
        RealVllmScheduler(config, lambda _e: None, speculative_tokens=3, speculative_method="eagle")
    RealVllmScheduler(config, lambda _e: None, speculative_tokens=3)  # ngram: no lookahead
    with pytest.raises(ConfigError, match="one of ngram, eagle, draft_model"):
        RealVllmScheduler(config, lambda _e: None, speculative_tokens=3, speculative_method="x")


def test_the_adapter_refuses_step_and_a_bad_draft_count() -> None:
    """`step()` refuses a speculative scheduler (the AR step contract samples one token);
    a negative or non-integer `speculative_tokens` is a `ConfigError` naming valid values."""
    config = THRESHOLD.config
    adapter = RealVllmScheduler(config, lambda _e: None, SPACE_PREFIX, speculative_tokens=2)
    assert adapter.sched.num_spec_tokens == 2
    with pytest.raises(ConfigError, match="0 for step"):
        adapter.step()
    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigError, match="an integer >= 0"):
            RealVllmScheduler(config, lambda _e: None, SPACE_PREFIX, speculative_tokens=bad)  # type: ignore[arg-type]


def test_the_fix_is_an_edit_of_vllms_scheduler() -> None:
    """One hunk of vLLM's `scheduler.py`, in the padding's condition."""
    diff = fix_as_diff()
    assert diff.startswith("--- a/vllm/v1/core/sched/scheduler.py\n")
    assert diff.count("@@ ") == 1
    assert "+                            and not 0 < long_prefill_token_threshold < padded" in diff


@LOOPS
def test_the_two_schedule_fixes_compose(async_scheduling: bool) -> None:
    """`uncache-preempted` and `pad-what-fits` edit different statements of `schedule`; made
    together (one patch, two hunks) they pass same-step programs that fail one finding each
    with two drafts: program 1 (`cache_hit_written`) and program 58 (the padding assert)."""
    both = ScheduleFix(PREEMPTED_CACHE_FIX, SPEC_PAD_FIX)
    assert both.as_diff().count("@@ ") == 2
    for seed, rule in ((1, "cache_hit_written"), (58, "implementation_error")):
        program = same_step_program(seed)
        err = _violation(program, async_scheduling)
        assert err.rule == rule, err
        run_loop(
            program,
            async_scheduling=async_scheduling,
            options=LoopOptions(speculative_tokens=2, fix=both.apply),
        )


# the full tier's: the script over 2 x 173 programs; per push the padding findings and
# their fix run in-process above
@full_tier
def test_the_async_check_script_takes_drafts_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--speculative-tokens 3`: program 172 of 173 fails `progress` in each loop (exit 1);
    with `--fix pad-what-fits` all pass (exit 0); drafts are counted per loop."""
    script = load_script("vllm_async_check")
    out_json = tmp_path / "spec.json"
    argv = ["--programs", "173", "--speculative-tokens", "3"]
    assert script.main(argv) == 1
    out = capsys.readouterr().out
    assert "up to 3 drafts a step" in out, out
    for mode in ("sync", "async"):
        assert f"FAIL [progress, {mode} loop]" in out and "first seeds [172]" in out, out
    assert script.main([*argv, "--fix", "pad-what-fits", "--json", str(out_json)]) == 0
    assert "173 pass both loops" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["speculative_tokens"] == 3 and data["failures"] == {}
    both = ["--fix", "uncache-preempted", "--fix", "pad-what-fits", "--json", str(out_json)]
    assert script.main(["--programs", "3", "--programs-from", "same-step", *both]) == 0
    assert "fix pad-what-fits + uncache-preempted), 3 pass" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["fix"] == "pad-what-fits + uncache-preempted"
    assert (
        data["counts"]["sync"]["drafts_scheduled"] > data["counts"]["sync"]["drafts_accepted"] > 0
    )
    with pytest.raises(SystemExit) as refused:
        script.main(["--programs", "1", "--speculative-tokens", "-1"])
    assert refused.value.code == 2
