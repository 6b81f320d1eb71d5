"""vLLM 0.33.0's engine-core loop with structured output (`integrations.vllm.structured`,
`integrations.vllm.grammar_rows`): every bitmask row a structured-output request samples under
stands where its grammar stands (`grammar_mask`), and the drafts vLLM schedules for it are ones
its grammar admits (`draft_grammar`), synchronously and asynchronously, with drafts and
pipeline stages; each rule with seeded bugs that fail it.

And what it shows of vLLM with pipeline stages: a structured-output request's drafts are never
accepted. The engine core checks a deferred batch's drafts against the grammar with the drafts
the model runner hands back, which are those of the last batch it sampled; the pipeline cadence
keeps a request out of consecutive batches, so its drafts stay unchecked placeholders and vLLM's
V2 runner rejects them all (vLLM issue #54437, fix proposed in PR #56802; the runner that hands
back every request's latest drafts, `keyed_drafts`, accepts them as without a grammar).

vLLM 0.34.0 removed 0.33.0's draft guard, and a guided request's drafts verified under a row
that allows every token break `grammar_mask` there (the finding of
`test_finding_on_0_34_a_guided_token_is_sampled_under_a_row_that_allows_every_token`). On it
the tests of generated programs and seeded bugs run with that finding's candidate fix (and
under stages the keyed hand-off), and #54437 shows as that break rather than as drafts never
accepted.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from integrations.vllm import MANIFEST, core_loop
from integrations.vllm.adapter import SPACE, RealVllmScheduler, load_vllm
from integrations.vllm.engine_core import (
    CoreProgram,
    CoreRun,
    EngineCoreLoop,
    EngineCoreViolation,
    LoopOptions,
    check_both,
    core_program,
    run_loop,
)
from integrations.vllm.grammar_rows import GrammarRows, allowed_classes
from integrations.vllm.guided_drafts_fix import GUIDED_DRAFTS_FIX
from integrations.vllm.patches import ScheduleFix
from integrations.vllm.release_api import trims_to_first_rejected
from integrations.vllm.spec_pad_fix import SPEC_PAD_FIX, apply_spec_pad_fix
from integrations.vllm.structured import (
    GRAMMAR_VOCAB,
    ScriptBackend,
    ScriptGrammar,
    token_class,
)
from spec.ar.config import ArConfig, ArRequest
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations, passing_runs
from tests.engine_gate import require_engine
from tests.script_module import load_script

PROGRAMS = 150
GUIDED = LoopOptions(structured_output=True)
DRAFTS = replace(GUIDED, speculative_tokens=2, fix=apply_spec_pad_fix)
STAGES = replace(DRAFTS, pipeline_parallel_size=2)
LOOPS = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def draft_guard_removed() -> bool:
    """Whether the installed vLLM lacks 0.33.0's draft guard (0.34.0: it trims a guided
    request's drafts after the first its grammar rejects, and its runner verifies them all)."""
    return trims_to_first_rejected(load_vllm().structured.StructuredOutputManager)


def _for_installed(options: LoopOptions) -> LoopOptions:
    """`options` as the installed release passes them: on 0.34.0, with drafts, the padding fix
    with its guided-drafts finding's candidate fix `no-placeholder-drafts`, and under stages the
    keyed hand-off of vLLM PR #56802 too (the finding's test shows the release failing without
    them); on 0.33.0, `options`."""
    if not options.speculative_tokens or not draft_guard_removed():
        return options
    fixed = ScheduleFix(SPEC_PAD_FIX, GUIDED_DRAFTS_FIX, engine="vLLM 0.34.0").apply
    return replace(options, fix=fixed, keyed_drafts=options.pipeline_parallel_size > 1)


# ---------------------------------------------------------------- the grammar
def test_the_script_grammar_admits_its_tokens_in_order_and_rolls_back() -> None:
    grammar = ScriptGrammar([7, 8, 9])
    assert grammar.validate_tokens([7, 8, 5, 9]) == [7, 8] and grammar.accepted == 0
    assert grammar.accept_tokens("r", [7, 8])
    assert not grammar.accept_tokens("r", [4]) and grammar.accepted == 2
    grammar.rollback(1)
    assert grammar.accepted == 1 and grammar.validate_tokens([8, 9, 10]) == [8, 9]
    assert grammar.accept_tokens("r", [8, 9]) and grammar.is_terminated()
    assert not grammar.accept_tokens("r", [10]) and grammar.validate_tokens([10]) == []
    with pytest.raises(ValueError, match="rollback of 4 tokens after 3 accepted"):
        grammar.rollback(4)
    grammar.reset()
    assert grammar.accepted == 0 and not grammar.is_terminated()


@pytest.mark.parametrize("accepted", [0, 30, 31, 62, GRAMMAR_VOCAB - 2, GRAMMAR_VOCAB - 1])
def test_a_row_allows_the_next_outputs_class_alone(accepted: int) -> None:
    """Every class round-trips through the int32 words, the sign bit's included."""
    backend = ScriptBackend(torch)
    bitmask = backend.allocate_token_bitmask(2)
    assert allowed_classes(bitmask[1].numpy()) == list(range(GRAMMAR_VOCAB))
    grammar = backend.compile_grammar(None, "1:" + ",".join(str(t) for t in range(1, accepted + 3)))
    grammar.accepted = accepted
    grammar.fill_bitmask(bitmask, 1)
    assert allowed_classes(bitmask[1].numpy()) == [token_class(accepted + 1)]
    assert allowed_classes(bitmask[0].numpy()) == list(range(GRAMMAR_VOCAB))


def test_grammar_rows_name_a_stale_row_and_let_rows_past_the_end_be() -> None:
    """A row of the grammar one output behind fails `grammar_mask` with both states named; a
    row for a token past the grammar's end (vLLM drops that token) may allow anything."""
    bitmask = ScriptBackend(torch).allocate_token_bitmask(2)
    grammar = ScriptGrammar(list(range(10)))
    grammar.accepted = 4
    grammar.fill_bitmask(bitmask, 0)  # the row for output 5; row 1 stays unconstrained
    output = type("GrammarOutput", (), {})()
    output.structured_output_request_ids = ["r"]
    output.grammar_bitmask = bitmask.numpy()
    output.num_acceptable_drafts = [1]
    rows = GrammarRows(output)
    rows.check("r", 5, 1, (1, 10))
    with pytest.raises(EngineCoreViolation) as caught:
        rows.check("r", 6, 1, (1, 10))
    assert caught.value.rule == "grammar_mask"
    assert "output 6 under bitmask row 0, which allows class 5" in caught.value.detail
    with pytest.raises(EngineCoreViolation, match=r"allows every token \(unconstrained\)"):
        rows.check("r", 5, 2, (1, 10))
    rows.check("r", 5, 2, (1, 5))  # output 6 lies past the end
    assert rows.checked == 3 and rows.limit("r", 2) == 1 and rows.limit("other", 2) == 2
    with pytest.raises(EngineCoreViolation, match="with no bitmask row"):
        GrammarRows(None).check("r", 1, 1, (1, 3))


# ---------------------------------------------------------------- the loops
def test_a_guided_request_defers_its_batch_and_both_loops_agree() -> None:
    """r0 is guided (even submission index), r1 not. Asynchronously each decode of r0 is
    planned with its previous output in flight, so the engine core applies that output before
    sampling (deferred batches); every token r0 samples is checked against its row."""
    config = ArConfig(block_size=2, num_blocks=12, max_num_batched_tokens=8, max_model_len=12)
    program = CoreProgram(
        config, ((ArRequest("r0", 3, 6), ArRequest("r1", 2, 5, stop_after=3)),), ((),)
    )
    sync, run = check_both(program, GUIDED)
    assert sync.outputs == run.outputs and len(run.outputs["r0"]) == 6
    assert run.reasons == {"r0": "length", "r1": "stop"}
    assert sync.deferred == 0 and run.deferred >= 4
    assert sync.guided_rows == run.guided_rows == 6


@pytest.mark.parametrize(
    "options",
    [
        GUIDED,
        DRAFTS,
        replace(DRAFTS, speculative_method="eagle", speculative_tokens=3),
        STAGES,
        replace(STAGES, late_grammars=True),
        replace(DRAFTS, reasoning=True),
    ],
    ids=["plain", "drafts", "eagle", "stages", "late", "reasoning"],
)
def test_generated_programs_keep_every_row_and_draft_to_the_grammar(
    options: LoopOptions,
) -> None:
    """Programs over vLLM's whole space, every other request guided: both loops pass every
    rule, the grammar ones included, and the checks did check (rows, deferred batches). (On
    vLLM 0.34.0 with drafts, under `_for_installed`'s fixes.)"""
    options = _for_installed(options)

    def run(seed: int) -> tuple[CoreRun, CoreRun] | None:
        try:
            return check_both(core_program(seed), options)
        except ConfigError:  # a budget no larger than eagle's lookahead: vLLM refuses it
            return None

    runs = [r for r in passing_runs(PROGRAMS, run) if r is not None]
    assert len(runs) > PROGRAMS // 2
    assert sum(s.guided_rows for s, _ in runs) > 1000
    assert sum(a.guided_rows for _, a in runs) > 1000
    assert sum(a.deferred for _, a in runs) > 100
    if options.speculative_tokens:
        assert sum(s.guided_drafts_accepted for s, _ in runs) > 100
    if options.reasoning:
        assert sum(a.reasoning_rows for _, a in runs) > 200
        assert sum(a.guided_rows - a.reasoning_rows for _, a in runs) > 200
    if options.late_grammars:
        assert sum(a.grammar_waits for _, a in runs) > 100
        assert sum(s.grammar_errors for s, _ in runs) > 10


def test_step_refuses_structured_output() -> None:
    impl = RealVllmScheduler(ArConfig(), lambda _event: None, SPACE, structured_output=True)
    with pytest.raises(ConfigError, match="False for step"):
        impl.step()


# ---------------------------------------------------------------- grammars compiled late
LATE = CoreProgram(
    ArConfig(block_size=2, num_blocks=12, max_num_batched_tokens=8, max_model_len=12),
    ((ArRequest("r0", 3, 4), ArRequest("r1", 2, 3)),),
    ((),),
)


def _late_run(async_scheduling: bool, delay: int, fails: bool) -> CoreRun:
    """`LATE` with r0 (guided) compiling `delay` engine steps late, or failing to."""
    loop = EngineCoreLoop(
        LATE.config, async_scheduling=async_scheduling, structured_output=True, late_grammars=True
    )
    assert loop.late is not None
    loop.late.draw = lambda rid: (delay, fails)
    return loop.run(LATE)


@LOOPS
def test_a_request_waiting_for_its_grammar_is_passed_and_served_later(
    async_scheduling: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM skips r0 while its grammar compiles and admits r1 behind it; r0 is served once
    the grammar is ready. `admission_order` lets a request waiting for its grammar be passed;
    without that allowance the rule fails on exactly this."""
    run = _late_run(async_scheduling, delay=3, fails=False)
    assert run.reasons == {"r0": "length", "r1": "length"} and len(run.outputs["r0"]) == 4
    assert run.grammar_waits >= 2 and run.guided_rows == 4
    monkeypatch.setattr(core_loop, "waiting_for_grammar", lambda request: False)
    with pytest.raises(EngineCoreViolation) as caught:
        _late_run(async_scheduling, delay=3, fails=False)
    assert caught.value.rule == "admission_order"
    assert "admitted 'r1' for the first time while ['r0']" in caught.value.detail


@LOOPS
def test_a_grammar_that_does_not_compile_ends_its_request_with_an_error(
    async_scheduling: bool,
) -> None:
    run = _late_run(async_scheduling, delay=1, fails=True)
    assert run.reasons == {"r0": "error", "r1": "length"}
    assert run.outputs["r0"] == () and run.grammar_errors == 1


def _compile_errors_dropped(sched: Any) -> None:
    """Seeded bug: the scheduler forgets the requests whose grammar failed to compile."""
    update = sched.update_from_output

    def updated(out: Any, model_output: Any) -> Any:
        sched.grammar_compile_error_reqs.clear()
        return update(out, model_output)

    sched.update_from_output = updated


def test_the_checks_catch_a_compile_error_never_reported() -> None:
    """The request waits for ever: `progress` fails."""
    seen = first_violations(
        PROGRAMS,
        lambda seed: check_both(
            core_program(seed), replace(GUIDED, late_grammars=True, mutate=_compile_errors_dropped)
        ),
    )
    assert set(seen) == {"progress"}, seen
    assert "async loop: not drained after" in seen["progress"]


def test_late_grammars_need_structured_output() -> None:
    with pytest.raises(ConfigError, match="False without structured_output"):
        EngineCoreLoop(ArConfig(), async_scheduling=False, late_grammars=True)


# ---------------------------------------------------------------- the finding
def test_finding_with_pipeline_stages_guided_drafts_are_never_accepted() -> None:
    """With 2 pipeline stages the async loop schedules thousands of drafts for guided requests
    and accepts none (unguided ones: about half), while every rule holds; with one stage, or
    with the runner handing back every request's latest drafts, guided drafts fare as the
    others do. vLLM issue #54437 (open); PR #56802 proposes the keyed hand-off.

    On vLLM 0.34.0, which verifies the drafts handed back with no guard, the other batch's
    drafts break `grammar_mask` instead, with the candidate fix of its own guided-drafts
    finding too; the keyed hand-off passes there, guided drafts accepted as the others."""
    if draft_guard_removed():
        fixed = replace(_for_installed(STAGES), keyed_drafts=False)
        seen = first_violations(
            PROGRAMS,
            lambda seed: run_loop(core_program(seed), async_scheduling=True, options=fixed),
            until="grammar_mask",
        )
        assert "which allows every token (unconstrained)" in seen["grammar_mask"], seen
    else:
        released = _async_totals(STAGES)
        assert released["guided_drafts_scheduled"] > 1000
        assert released["guided_drafts_accepted"] == 0
        unguided = released["drafts_accepted"] / (
            released["drafts_scheduled"] - released["guided_drafts_scheduled"]
        )
        assert unguided > 0.3
    for options in (DRAFTS, replace(STAGES, keyed_drafts=True)):
        totals = _async_totals(_for_installed(options))
        guided = totals["guided_drafts_accepted"] / totals["guided_drafts_scheduled"]
        assert guided > 0.3, (options, totals)


# A guided request with nothing in flight, its drafts placeholders (`scripts/vllm_shrink.py
# --seed 56 --loop async --rule grammar_mask --speculative-tokens 2 --structured-output --fix
# pad-what-fits` on vLLM 0.34.0): r6 (guided) runs in step 6, nothing is scheduled in step 7,
# and step 8 schedules r6 with one placeholder draft while its output has drained.
IDLE_GUIDED = CoreProgram(
    ArConfig(
        block_size=4,
        num_blocks=3,
        max_num_batched_tokens=4,
        max_num_seqs=2,
        max_model_len=4,
        enable_chunked_prefill=False,
    ),
    (
        (ArRequest("r1", 1, 1), ArRequest("r2", 1, 1), ArRequest("r3", 1, 2)),
        (ArRequest("r4", 1, 3), ArRequest("r6", 1, 3)),
    ),
    ((), ()),
)
IDLE_GUIDED_DRAWS = replace(DRAFTS, draw_seed=3111347617)
# One guided request under two pipeline stages (the same script, `--seed 0 --pipeline-parallel
# 2`): its step-3 batch defers for the step-1 output, and the drafts handed back are not its.
STAGED_GUIDED = CoreProgram(
    ArConfig(block_size=2, num_blocks=3, max_num_batched_tokens=2, max_num_seqs=1, max_model_len=4),
    ((ArRequest("r0", 1, 3),),),
    ((),),
)
STAGED_GUIDED_DRAWS = replace(STAGES, draw_seed=2896518988)


def test_finding_on_0_34_a_guided_token_is_sampled_under_a_row_that_allows_every_token() -> None:
    """vLLM 0.34.0 removed 0.33.0's guard against verifying drafts under a permissive bitmask
    row (`num_acceptable_drafts`, `grammar_invalid_drafts`). Under async scheduling a guided
    request's drafts are placeholders in the scheduler; with nothing of it in flight its batch
    does not defer, so the bitmask is made from them and every row after the first allows
    every token. The runner verifies its real first draft under the first row and samples the
    next token under the second: r6's output 3. Under two stages the drafts handed back for a
    deferred batch are another batch's (vLLM #54437), with the same effect. On 0.33.0 both
    programs pass (the drafts are not accepted). The candidate fix `no-placeholder-drafts`
    (no drafts for such a request) makes the first pass on 0.34.0, and the second with the
    keyed hand-off of vLLM PR #56802 (`keyed_drafts`)."""
    released = draft_guard_removed()
    cases = (
        (IDLE_GUIDED, IDLE_GUIDED_DRAWS, "'r6' samples output 3 under bitmask row 1"),
        (STAGED_GUIDED, STAGED_GUIDED_DRAWS, "'r0' samples output 3 under bitmask row 1"),
    )
    for program, options, message in cases:
        control = run_loop(program, async_scheduling=False, options=options).outputs
        if not released:  # 0.33.0 keeps its guard: the async loop passes, with the same outputs
            assert run_loop(program, async_scheduling=True, options=options).outputs == control
            continue
        with pytest.raises(EngineCoreViolation) as err:
            run_loop(program, async_scheduling=True, options=options)
        assert err.value.rule == "grammar_mask", err.value
        assert message in str(err.value) and "allows every token" in str(err.value)
    fixed = ScheduleFix(SPEC_PAD_FIX, GUIDED_DRAFTS_FIX, engine="vLLM 0.34.0").apply
    for program, options, keyed in (
        (IDLE_GUIDED, IDLE_GUIDED_DRAWS, False),
        (STAGED_GUIDED, STAGED_GUIDED_DRAWS, True),
    ):
        options = replace(options, fix=fixed, keyed_drafts=keyed)
        control = run_loop(program, async_scheduling=False, options=options).outputs
        assert run_loop(program, async_scheduling=True, options=options).outputs == control


def _async_totals(options: LoopOptions) -> dict[str, int]:
    keys = [
        "drafts_scheduled",
        "drafts_accepted",
        "guided_drafts_scheduled",
        "guided_drafts_accepted",
    ]
    totals = dict.fromkeys(keys, 0)
    for seed in range(PROGRAMS):
        run = run_loop(core_program(seed), async_scheduling=True, options=options)
        for key in keys:
            totals[key] += getattr(run, key)
    return totals


# ---------------------------------------------------------------- seeded bugs
def _never_deferred(sched: Any) -> None:
    """Seeded bug: the scheduler never asks to defer sampling for an output in flight."""
    update = sched._update_after_schedule

    def updated(out: Any) -> None:
        update(out)
        out.pending_structured_output_tokens = False

    sched._update_after_schedule = updated


def _grammar_never_advanced(sched: Any) -> None:
    """Seeded bug: sampled tokens are never fed to the grammar."""
    sched.structured_output_manager.accept_tokens = lambda request, tokens: True


def _fails_open(sched: Any) -> None:
    """Seeded bug: unchecked draft placeholders count as acceptable (the rows after them are
    unconstrained): vLLM issue #54437 as reported, before its fail-closed half."""
    bitmask = sched.get_grammar_bitmask

    def fill(out: Any) -> Any:
        grammar = bitmask(out)
        if grammar is not None:
            spec = out.scheduled_spec_decode_tokens
            grammar.num_acceptable_drafts = [
                len(spec.get(rid, ())) for rid in grammar.structured_output_request_ids
            ]
        return grammar

    sched.get_grammar_bitmask = fill


def _reasoning_ignored(sched: Any) -> None:
    """Seeded bug: the grammar constrains a request from its first output, reasoning or not."""
    from_start = load_vllm().structured.ConstraintBounds(0, 0)
    manager = sched.structured_output_manager
    manager._get_constraint_bounds = lambda request, spec_tokens, *args, **kw: from_start


def _drafts_unchecked(sched: Any) -> None:
    """Seeded bug: drafts are not checked against the grammar before they are scheduled."""
    sched.structured_output_manager.validate_tokens = lambda request, tokens: list(tokens)


#: The seeded bugs of a check vLLM 0.34.0 no longer makes, with why: 0.33.0's draft guard
#: (`num_acceptable_drafts`), and its check of a deferred batch's drafts against the grammar
#: (seeded bugs are made in the asynchronous loop, where 0.34.0 checks no drafts at all).
GONE_IN_0_34 = {
    _fails_open: "vLLM 0.34.0 has no draft guard to fail open: that is its finding",
    _drafts_unchecked: "vLLM 0.34.0 checks no drafts under async scheduling, by design",
}


#: (seeded bug, rule, words of the message, options): each fails its rule in the async loop.
SEEDED_BUGS: tuple[tuple[Callable[[Any], None], str, str, LoopOptions], ...] = (
    (_never_deferred, "grammar_mask", "which allows class", GUIDED),
    (_grammar_never_advanced, "grammar_mask", "which allows class", GUIDED),
    (_fails_open, "grammar_mask", "which allows every token (unconstrained)", STAGES),
    (_drafts_unchecked, "draft_grammar", "which its grammar does not admit", DRAFTS),
    (
        _reasoning_ignored,
        "grammar_mask",
        "still reasoning (its grammar starts at output",
        replace(GUIDED, reasoning=True),
    ),
)


@pytest.mark.parametrize(
    ("mutant", "rule", "words", "options"),
    SEEDED_BUGS,
    ids=[bug.__name__.strip("_") for bug, _, _, _ in SEEDED_BUGS],
)
def test_the_grammar_checks_catch_each_seeded_bug(
    mutant: Callable[[Any], None], rule: str, words: str, options: LoopOptions
) -> None:
    """Each seeded bug fails its rule in the asynchronous loop (on vLLM 0.34.0 under
    `_for_installed`'s fixes, those of a check it still makes)."""
    if draft_guard_removed():
        if mutant in GONE_IN_0_34:
            pytest.skip(GONE_IN_0_34[mutant])
        options = _for_installed(options)
    seen = first_violations(
        PROGRAMS,
        lambda seed: check_both(core_program(seed), replace(options, mutate=mutant)),
        until=rule,
    )
    assert rule in seen, f"no program failed [{rule}]; failures seen: {seen}"
    assert seen[rule].startswith(f"[{rule}] async loop: ") and words in seen[rule], seen[rule]


def test_a_runner_that_ignores_the_acceptable_drafts_fails_open_with_one_stage() -> None:
    """vLLM's V1 model runner never reads `num_acceptable_drafts` (what `_fails_open` seeds):
    even with one stage a guided request's drafts can go unchecked, and such a runner samples
    a guided token from an unconstrained row."""
    seen = first_violations(
        400,
        lambda seed: run_loop(
            core_program(seed), async_scheduling=True, options=replace(DRAFTS, mutate=_fails_open)
        ),
        until="grammar_mask",
    )
    assert "which allows every token (unconstrained)" in seen["grammar_mask"], seen


# ---------------------------------------------------------------- the script
def test_the_async_check_script_reproduces_the_finding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--structured-output` with drafts and 2 stages: all pass (exit 0), no guided draft is
    accepted asynchronously; with `--keyed-drafts` they are. On vLLM 0.34.0 the released
    hand-off breaks `grammar_mask` (exit 1, the command to shrink it printed), and the keyed
    one passes with the candidate fix of its guided-drafts finding."""
    script = load_script("vllm_async_check")
    out_json = tmp_path / "structured.json"
    argv = ["--programs", "40", "--structured-output", "--speculative-tokens", "2"]
    argv += ["--pipeline-parallel", "2", "--fix", "pad-what-fits", "--json", str(out_json)]
    if draft_guard_removed():
        assert script.main(argv) == 1
        out = capsys.readouterr().out
        assert "FAIL [grammar_mask, async loop]" in out and "allows every token" in out, out
        assert "scripts/vllm_shrink.py --seed " in out, out
        argv += ["--fix", "no-placeholder-drafts"]
    else:
        assert script.main(argv) == 0
        out = capsys.readouterr().out
        assert "structured output" in out and "40 pass both loops" in out, out
        released = json.loads(out_json.read_text())
        assert released["structured_output"] is True and released["keyed_drafts"] is False
        counts = released["counts"]["async"]
        assert counts["guided_drafts_scheduled"] > 0 and counts["guided_drafts_accepted"] == 0
    assert script.main([*argv, "--keyed-drafts"]) == 0
    assert "(drafts handed back by request)" in capsys.readouterr().out
    keyed = json.loads(out_json.read_text())["counts"]["async"]
    assert keyed["guided_drafts_accepted"] > 0 and keyed["guided_rows"] > 0


def test_the_guided_drafts_fix_is_one_patch_of_vllms_scheduler(tmp_path: Path) -> None:
    """`scripts/engine_fixes_diff.py vllm-guided-drafts` prints the edit the finding's test
    runs (one insertion in `Scheduler.schedule`'s running loop): applied with `git apply -p1`
    to a copy of the installed vLLM's `scheduler.py`, it gives the very text the test runs."""
    from integrations.vllm.guided_drafts_fix import GUIDED_DRAFTS_FIXES
    from tests.patch_check import apply_fix_set

    diff, patched = apply_fix_set(tmp_path, GUIDED_DRAFTS_FIXES)
    assert "\n-    " not in diff, diff  # an insertion only
    assert "request.spec_token_ids = []" in next(iter(patched.values()))
