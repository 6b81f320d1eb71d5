"""Streaming-input sessions on vLLM 0.33.0's engine-core loop (`integrations.vllm.sessions`;
`--programs-from sessions`): one request id fed several inputs, its KV kept between turns.

Released vLLM serves them with every rule holding but four findings: resumed sessions holding
the KV pool, each with input and no room for it, stall for good while no request runs
(`progress`; the candidate fix `drop-stalled-session-kv` lifts it); a session's inputs are
checked against `max_model_len` one by one, so a session is resumed with a prompt that leaves
no room for an output (`session_length`; then scheduled past its blocks, or never scheduled
again; the candidate fix `end-session-at-model-len` lifts it); on a hybrid model under async
scheduling a turn's dropped step in flight has already advanced the session's Mamba state,
which the next turn resumes from (`kv_written`; the candidate fix `recompute-session-state`
lifts it); and with structured output a later input's grammar is dropped and the session
keeps its first input's, done after the first turn (`grammar_mask`; the candidate fix
`own-grammar-per-input` lifts it; with a reasoning parser each later turn reasons again or
skips reasoning as its input says). The rules of sessions have seeded bugs: a next input that
keeps the turn's last sampled token (`session_prompt`), one that frees the kept KV
(`session_kv_kept`) and one that carries the earlier grammar's reasoning end over to the next
input's (`grammar_mask`).

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from integrations.patches import EngineFix, FixSet
from integrations.vllm import MANIFEST
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import (
    CoreProgram,
    CoreRun,
    EngineCoreLoop,
    LoopOptions,
    run_loop,
)
from integrations.vllm.kv_load_fixes import KV_LOAD_FIXES
from integrations.vllm.loop_arguments import CONNECTOR_FIXES, FIXES, make_fixes
from integrations.vllm.offload_error_store_fix import STORE_COMPUTED_ON_ERROR, fixed_upstream
from integrations.vllm.offload_hit_fix import OFFLOAD_HIT
from integrations.vllm.offload_window_fixes import apply_offloading_fixes
from integrations.vllm.patches import ScheduleFix
from integrations.vllm.reset_holders_fix import RESET_HOLDERS, RESET_HOLDERS_FIX
from integrations.vllm.session_grammar_fix import (
    SESSION_GRAMMAR,
    SESSION_GRAMMAR_FIX,
    SESSION_GRAMMAR_FIXES,
)
from integrations.vllm.session_length_fix import SESSION_LENGTH, SESSION_LENGTH_FIXES
from integrations.vllm.session_stall_fix import (
    SESSION_STALL,
    SESSION_STALL_FIX,
    SESSION_STALL_FIXES,
)
from integrations.vllm.session_state_fix import SESSION_STATE, SESSION_STATE_FIXES
from integrations.vllm.sessions import (
    SessionInput,
    SessionLedger,
    input_tokens,
    session_program,
    turn_reasoning_end,
)
from integrations.vllm.spec_pad_fix import SPEC_PAD
from integrations.vllm.speculative import SpeculativeModel
from integrations.vllm.structured import REASONING_END, REASONING_START
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.errors import ConfigError
from tests.engine_core_programs import first_violations
from tests.engine_gate import require_engine
from tests.patch_check import git_apply_to_copies
from tests.vllm_seeded_bugs import (
    session_drops_its_kv,
    session_keeps_its_last_token,
    session_keeps_its_reasoning_end,
)

PROGRAMS = 40
RELEASED = LoopOptions()
STALL_FIXED = LoopOptions(fix=make_fixes([SESSION_STALL]))


@pytest.fixture(autouse=True)
def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _both(program: CoreProgram, options: LoopOptions = RELEASED) -> list[CoreRun]:
    return [run_loop(program, async_scheduling=a, options=options) for a in (False, True)]


def test_sessions_take_turns_on_their_kept_kv_and_pass_with_the_stall_fix() -> None:
    """With the stall fix the first programs pass both loops, and every path of a session is
    taken: inputs applied at once and queued behind a running turn, closes of waiting
    sessions, turns resumed on kept KV."""
    totals: dict[str, int] = {}
    for seed in range(PROGRAMS):
        for run in _both(session_program(seed), STALL_FIXED):
            for name in ("session_inputs", "session_inputs_queued", "sessions_closed_waiting"):
                totals[name] = totals.get(name, 0) + getattr(run, name)
            totals["kept"] = totals.get("kept", 0) + run.session_turns_on_kept_kv
    assert all(totals.values()), totals
    assert totals["session_inputs_queued"] < totals["session_inputs"], totals


def test_a_sessions_outputs_are_its_turns_in_turn() -> None:
    """One session, three turns: its outputs are each turn's own tokens (the model's tokens
    depend on the turn), its turns end by length, and its prompt grows by the kept outputs."""
    program = CoreProgram(
        ArConfig(block_size=4, num_blocks=17, max_num_batched_tokens=16, max_model_len=32),
        arrivals=((ArRequest("a", 5, 3),), *(((),) * 11)),
        aborts=((),) * 12,
        inputs=(
            (),
            (SessionInput("a", 3, 2),),
            *(((),) * 5),
            (SessionInput("a", 2, 1),),
            *(((),) * 3),
            (SessionInput("a", 0),),
        ),
    )
    for run in _both(program):
        assert len(run.outputs["a"]) == 3 + 2 + 1, run.outputs
        assert len(set(run.outputs["a"])) == 6  # no turn repeats another's tokens
        assert run.reasons == {"a": "length"}
        assert run.session_inputs == 2 and run.session_turns_on_kept_kv == 2


#: The stall's shrunk program (docs/shrunk/vllm-session-stall.json, from program 51): r14 and
#: r16 are resumed holding 17 of the 21 blocks; r14 heads the queue and needs 5 of the 4 free.
STALL = CoreProgram(
    ArConfig(
        block_size=1,
        num_blocks=22,
        max_num_batched_tokens=2,
        max_num_seqs=2,
        max_model_len=20,
        policy=Policy.PRIORITY,
        enable_prefix_caching=True,
    ),
    arrivals=((ArRequest("r14", 11, 2),), (), (ArRequest("r16", 5, 1),), ()),
    aborts=((), (), (), ()),
    inputs=((), (SessionInput("r14", 5, 1),), (), (SessionInput("r16", 1, 1),)),
)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_finding_resumed_sessions_holding_the_pool_stall_for_good(async_scheduling: bool) -> None:
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(STALL, async_scheduling=async_scheduling)
    assert caught.value.rule == "progress", caught.value
    assert "sessions waiting with KV: r14 (12 tokens' KV kept, 5 to compute)" in str(caught.value)
    assert "4 blocks free, and no request runs to free more" in str(caught.value)
    run = run_loop(STALL, async_scheduling=async_scheduling, options=STALL_FIXED)
    assert run.session_kv_dropped >= 1
    assert run.reasons == {"r14": "length", "r16": "length"}


#: With vLLM's offloading connector (program 630, `--offload-chunks 8 --offload-outputs`,
#: shrunk): r6, a session on its first turn, heads the queue holding the block a CPU-tier load
#: wrote (r2's 2 prompt tokens) and needs 3 of the 2 free; r8, resumed, holds its kept token's.
OFFLOADED_STALL = CoreProgram(
    ArConfig(block_size=2, num_blocks=5, max_num_batched_tokens=1, max_num_seqs=1, max_model_len=8),
    arrivals=(
        (ArRequest("r2", 2, 1, prompt=(100, 101)),),
        (),
        (ArRequest("r6", 7, 1, prompt=tuple(range(100, 107))),),
        (ArRequest("r8", 1, 1),),
        (),
    ),
    aborts=((),) * 5,
    inputs=((), (), (), (), (SessionInput("r6", 0), SessionInput("r8", 1, 1))),
)


def test_with_the_offloading_connector_the_stall_fix_drops_the_last_session_waiting() -> None:
    """The stall with a loaded request at the head: released vLLM stalls (sync loop); the fix
    drops the last session waiting with KV, r8, told as a preemption, and both loops pass, the
    connector's load and stores checked as for any request."""
    offloading = LoopOptions(offload_chunks=8, offload_outputs=True, fix=make_fixes([OFFLOAD_HIT]))
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(OFFLOADED_STALL, async_scheduling=False, options=offloading)
    assert caught.value.rule == "progress", caught.value
    assert (
        "sessions waiting with KV: r6 (2 tokens' KV kept, 5 to compute), r8 (1 token's KV kept, "
        "1 to compute); 2 blocks free" in str(caught.value)
    )
    fixed = replace(offloading, fix=make_fixes([SESSION_STALL, OFFLOAD_HIT]))
    sync, async_ = _both(OFFLOADED_STALL, fixed)
    assert sync.session_kv_dropped == 1 and sync.offload_loads == 1
    for run in (sync, async_):
        assert run.reasons == {"r2": "length", "r6": "length", "r8": "length"}


def _as_installed(fix: EngineFix) -> EngineFix:
    """`fix` as written for the installed vLLM release: what a variant of it is built from."""
    (installed,) = ScheduleFix(fix).installed()
    return installed


def _fix_variant(
    fix: EngineFix, name: str, old: str, new: str, others: Iterable[str] = ()
) -> Callable[[Any], None]:
    """`fix` (a `Scheduler` fix of one edit), as written for the installed release, with `old`
    in its edit made `new` (a seeded bug, or the fix's first version), made with the fixes
    `others` as `make_fixes` makes them: the `Scheduler` ones together, then vLLM's offloading
    connector's."""
    fix = _as_installed(fix)
    module, before, after = fix.edits[0]
    assert after.count(old) == 1
    variant = EngineFix(name, ((module, before, after.replace(old, new)),), fix.methods)
    schedule = [FIXES[n] for n in others if n not in CONNECTOR_FIXES]
    connector = [n for n in others if n in CONNECTOR_FIXES]
    edit = ScheduleFix(variant, *schedule).apply

    def apply(sched: Any) -> None:
        edit(sched)
        apply_offloading_fixes(sched, connector)

    return apply


def test_preemption_victim_holds_a_drop_told_as_a_preemption_to_the_dropped_session() -> None:
    """The fix tells its drop as a preemption: `preemption_victim` accepts a reported request
    that was not running only if it waited holding KV and was left without; a fix that reports
    the request that found no room (which keeps its KV) instead fails it."""
    told = "self.reset_preempted_req_ids.add(session.request_id)"
    wrong = _fix_variant(
        SESSION_STALL_FIX, "reports-the-wrong-request", told, told.replace("session", "request")
    )
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(STALL, async_scheduling=False, options=LoopOptions(fix=wrong))
    assert caught.value.rule == "preemption_victim", caught.value
    assert "preempted 'r14', which was not running []" in str(caught.value)
    assert "kept its KV or was scheduled" in str(caught.value)


def test_a_drop_not_told_as_a_preemption_lets_a_store_job_read_another_requests_kv() -> None:
    """Why the fix tells its drop: untold, vLLM's offloading connector keeps the dropped
    session's store job, which reads blocks the pool has given to another request by then
    (`store_content`, session program 146 with the offloading connector); told, it passes."""
    told = "self.reset_preempted_req_ids.add(session.request_id)"
    untold = _fix_variant(SESSION_STALL_FIX, "drops-untold", told, "pass", [OFFLOAD_HIT])
    options = LoopOptions(offload_chunks=8, offload_outputs=True, fix=untold)
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(session_program(146), async_scheduling=False, options=options)
    assert caught.value.rule == "store_content", caught.value
    assert "not the KV of a key it stores" in str(caught.value)
    fixed = replace(options, fix=make_fixes([SESSION_STALL, OFFLOAD_HIT]))
    assert run_loop(session_program(146), async_scheduling=False, options=fixed).session_kv_dropped


def test_released_vllm_fails_session_programs_only_by_the_stall() -> None:
    """Without the fix, every failure over the first programs is the stall."""
    rules: dict[str, str] = {}
    for seed in range(60):
        for async_scheduling in (False, True):
            try:
                run_loop(session_program(seed), async_scheduling=async_scheduling)
            except EngineCoreViolation as err:
                rules.setdefault(err.rule, str(err))
    assert set(rules) == {"progress"}, rules
    assert "sessions waiting with KV" in rules["progress"], rules


#: A session of 20 prompt tokens and 6 outputs given 10 more tokens: 35 tokens, over
#: max_model_len 32, though each of its inputs is within it.
PAST_CONTEXT = CoreProgram(
    ArConfig(block_size=4, num_blocks=17, max_num_batched_tokens=16, max_model_len=32),
    arrivals=((ArRequest("a", 20, 6),), *(((),) * 10)),
    aborts=((),) * 11,
    inputs=(*(((),) * 10), (SessionInput("a", 10, 4),)),
)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_finding_a_session_is_resumed_past_max_model_len(
    async_scheduling: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`session_length` fails at the input; with the rule lifted, vLLM schedules the session
    past the blocks `allocate_slots` gives it (capped at max_model_len); the candidate fix
    ends the session (length capped) instead."""
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(PAST_CONTEXT, async_scheduling=async_scheduling)
    assert caught.value.rule == "session_length", caught.value
    assert "holds 35 tokens, leaving no room for an output under max_model_len 32" in str(
        caught.value
    )
    fixed = LoopOptions(fix=make_fixes([SESSION_LENGTH]))
    run = run_loop(PAST_CONTEXT, async_scheduling=async_scheduling, options=fixed)
    assert run.reasons == {"a": "length"} and len(run.outputs["a"]) == 6
    assert run.session_inputs == 0
    with monkeypatch.context() as patched:
        patched.setattr(SessionLedger, "prompt_limit", lambda self: 10**9)
        with pytest.raises(EngineCoreViolation) as caught:
            run_loop(PAST_CONTEXT, async_scheduling=async_scheduling)
    assert caught.value.rule == "kv_covers_scheduled", caught.value
    assert "'a' has 35 tokens computed or scheduled but holds 8 blocks of 4" in str(caught.value)


def test_with_both_fixes_sessions_past_the_context_pass() -> None:
    options = LoopOptions(fix=make_fixes([SESSION_STALL, SESSION_LENGTH]))
    inputs = 0
    for seed in range(PROGRAMS):
        inputs += sum(r.session_inputs for r in _both(session_program(seed, True), options))
    assert inputs > 0


@pytest.mark.parametrize(
    ("fixes", "words"),
    [
        (SESSION_STALL_FIXES, "self.reset_preempted_req_ids.add(session.request_id)"),
        (SESSION_LENGTH_FIXES, "RequestStatus.FINISHED_LENGTH_CAPPED"),
        (SESSION_STATE_FIXES, "if self.has_mamba_layers and request.num_in_flight_tokens"),
        (SESSION_GRAMMAR_FIXES, "update.structured_output_request = request.structured_output"),
    ],
    ids=[SESSION_STALL, SESSION_LENGTH, SESSION_STATE, SESSION_GRAMMAR],
)
def test_each_fix_is_one_patch_of_vllms_scheduler(
    tmp_path: Path, fixes: FixSet, words: str
) -> None:
    """`scripts/engine_fixes_diff.py vllm-session` / `vllm-session-length` print the edit the
    tests run: applied with `git apply -p1` to a copy of vLLM's `scheduler.py`, it gives the
    very text they run."""
    sources = fixes.fixed_sources(fixes.names)
    patched = git_apply_to_copies(tmp_path, sources, fixes.as_diff(fixes.names))
    assert patched == {module: fixed for module, (_, fixed) in sources.items()}
    assert words in next(iter(patched.values()))


#: The Mamba finding's shrunk program (docs/shrunk/vllm-session-mamba-state.json, from
#: program 0 with --mamba): r7 stops at its second output while its third step is in flight.
MAMBA_STATE = CoreProgram(
    ArConfig(block_size=2, num_blocks=3, max_num_batched_tokens=1, max_num_seqs=1, max_model_len=4),
    arrivals=((ArRequest("r7", 1, 3, stop_after=2),), ()),
    aborts=((), ()),
    inputs=((), (SessionInput("r7", 1, 1),)),
)


def test_finding_on_a_hybrid_model_the_dropped_step_has_advanced_the_mamba_state() -> None:
    """Async only: the turn's step in flight, dropped, has already advanced the session's Mamba
    state, which the next turn resumes from; the synchronous loop has no step in flight. The
    candidate fix recomputes such a session."""
    hybrid = LoopOptions(mamba=True)
    sync = run_loop(MAMBA_STATE, async_scheduling=False, options=hybrid)
    assert sync.session_turns_on_kept_kv == 1
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(MAMBA_STATE, async_scheduling=True, options=hybrid)
    assert caught.value.rule == "kv_written", caught.value
    assert "reads its Mamba state after 2 tokens" in str(caught.value)
    assert "it holds the state of 'r7' after 3 tokens" in str(caught.value)
    fixed = LoopOptions(mamba=True, fix=make_fixes([SESSION_STATE]))
    run = run_loop(MAMBA_STATE, async_scheduling=True, options=fixed)
    assert run.session_turns_on_kept_kv == 0 and run.session_inputs == 1
    assert run.outputs == sync.outputs


#: A session between turns when generation pauses (docs/shrunk/
#: vllm-pause-session-between-turns.json, from program 0 with --pauses wait): one turn, then
#: a pause at engine step 9 (the driver's draw) and the caches' reset.
PAUSED_BETWEEN_TURNS = CoreProgram(
    ArConfig(block_size=2, num_blocks=2, max_num_batched_tokens=1, max_num_seqs=1, max_model_len=2),
    arrivals=((ArRequest("r7", 1, 1),), *(((),) * 11)),
    aborts=((),) * 12,
    inputs=(*(((),) * 11), (SessionInput("r7", 0),)),
)


@pytest.mark.parametrize("mode", ["keep", "wait"])
def test_a_pause_resets_the_caches_while_a_session_waits_for_input(mode: str) -> None:
    """vLLM's `_finish_pause` reset raises while a session between turns holds its kept KV
    ("... not supported yet"), whether the pause keeps or drains requests (one that aborts
    them ends the session first); the candidate fix `reset-loaded-holders` takes the session's
    blocks back too, and the session ends as it would have."""
    draws = 2724153858  # the recorded program's draw seed: the pause at step 9
    for async_scheduling in (False, True):
        with pytest.raises(EngineCoreViolation) as caught:
            run_loop(
                PAUSED_BETWEEN_TURNS,
                async_scheduling=async_scheduling,
                options=LoopOptions(pauses=mode, draw_seed=draws),
            )
        assert caught.value.rule == "implementation_error", caught.value
        assert "Failed to reset KV cache" in str(caught.value)
        fixed = LoopOptions(pauses=mode, fix=make_fixes([RESET_HOLDERS]), draw_seed=draws)
        run = run_loop(PAUSED_BETWEEN_TURNS, async_scheduling=async_scheduling, options=fixed)
        assert run.pause_taken_back == 1 and run.reasons == {"r7": "length"}


#: (seeded bug, rule, words of the message).
SEEDED_BUGS: list[tuple[Callable[[Any], None], str, tuple[str, ...]]] = [
    (session_keeps_its_last_token, "session_prompt", ("prompt has", "outputs")),
    (session_drops_its_kv, "session_kv_kept", ("changed its computed tokens from",)),
]


@pytest.mark.parametrize(
    ("bug", "rule", "words"), SEEDED_BUGS, ids=[bug.__name__ for bug, _, _ in SEEDED_BUGS]
)
def test_the_session_rules_catch_each_seeded_bug(
    bug: Callable[[Any], None], rule: str, words: tuple[str, ...]
) -> None:
    options = LoopOptions(mutate=bug, fix=make_fixes([SESSION_STALL]))
    seen = first_violations(
        PROGRAMS,
        lambda seed: run_loop(session_program(seed), async_scheduling=True, options=options),
        until=rule,
    )
    assert rule in seen, seen
    assert seen[rule].startswith(f"[{rule}] async loop: ")
    assert all(w in seen[rule] for w in words), seen[rule]


def test_a_session_input_is_a_typed_error_when_malformed() -> None:
    with pytest.raises(ConfigError) as err:
        SessionInput("a", 3, 0)
    assert "prompt_len >= 1 with max_tokens >= 1" in str(err.value)
    with pytest.raises(ValueError, match="2 of session inputs"):
        CoreProgram(ArConfig(), arrivals=((),), aborts=((),), inputs=((), ()))


def _with_late_grammars(
    program: CoreProgram,
    async_scheduling: bool,
    fix: Callable[[Any], None],
    draws: list[tuple[int, bool]],
) -> CoreRun:
    """`program` under `fix` with late grammars whose timing is scripted: the grammars, in the
    order they are compiled, take `draws` (engine steps until compiled, whether they fail)."""
    loop = EngineCoreLoop(
        program.config,
        async_scheduling=async_scheduling,
        mutate=fix,
        structured_output=True,
        late_grammars=True,
    )
    assert loop.late is not None
    scripted = iter(draws)
    loop.late.draw = lambda rid: next(scripted)
    return loop.run(program)


def _late_guided_session(async_scheduling: bool, fix: Callable[[Any], None]) -> CoreRun:
    """`GUIDED_SESSION` with both grammars compiling 3 engine steps late, under `fix`."""
    return _with_late_grammars(GUIDED_SESSION, async_scheduling, fix, [(3, False)] * 2)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_grammar_fix_waits_for_an_inputs_grammar_still_compiling(
    async_scheduling: bool,
) -> None:
    """The input arrives while the session waits for input, so the fix applies it at once,
    its grammar 3 steps from compiled: the session waits for it as a new request does, and
    both turns are guided. A variant that installs the grammar without waiting for it has
    vLLM schedule the turn with no grammar yet, and its bitmask raises (the synchronous loop;
    the asynchronous one applies the input a step later, and the grammar is ready by then)."""
    fixed = make_fixes([SESSION_GRAMMAR])
    assert fixed is not None
    run = _late_guided_session(async_scheduling, fixed)
    assert run.session_inputs_awaiting_grammar == 1 and run.grammar_waits >= 1
    assert run.reasons == {"a": "length"} and len(run.outputs["a"]) == 3
    fix = _as_installed(SESSION_GRAMMAR_FIX)
    module, before, after = fix.edits[2]
    no_wait = EngineFix(
        "installs-without-waiting", (*fix.edits[:2], (module, before, before)), fix.methods
    )
    assert after != before
    if async_scheduling:
        return
    with pytest.raises(EngineCoreViolation) as caught:
        _late_guided_session(async_scheduling, ScheduleFix(no_wait).apply)
    assert caught.value.rule == "implementation_error", caught.value
    assert "vLLM raised in get_grammar_bitmask" in str(caught.value)


#: A guided session whose later input arrives while its first turn (4 outputs) runs: the input
#: waits in vLLM's streaming queue until the turn ends.
QUEUED_INPUT_SESSION = CoreProgram(
    ArConfig(block_size=4, num_blocks=9, max_num_batched_tokens=8, max_model_len=16),
    arrivals=((ArRequest("a", 2, 4),), *(((),) * 7)),
    aborts=((),) * 8,
    inputs=((), (SessionInput("a", 1, 2),), (), (), (), (), (SessionInput("a", 0),), ()),
)


def _failing_input_grammar(
    program: CoreProgram, async_scheduling: bool, fix: Callable[[Any], None]
) -> CoreRun:
    """`program` with the first grammar compiling at once and the later input's failing to
    compile 2 engine steps after it is sent, under `fix`."""
    return _with_late_grammars(program, async_scheduling, fix, [(0, False), (2, True)])


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_later_inputs_grammar_that_does_not_compile_ends_the_session_with_an_error(
    async_scheduling: bool,
) -> None:
    """With the fix, a session whose later input's grammar does not compile ends with an
    error after its earlier turns' outputs, as vLLM ends a new request whose grammar fails:
    whether the input was applied while its grammar compiled (`GUIDED_SESSION`) or queued
    behind the running turn until after it failed (`QUEUED_INPUT_SESSION`). A variant of the
    fix that waits only for a grammar still compiling schedules the queued session with the
    compile error as its grammar, and vLLM's bitmask raises."""
    fixed = make_fixes([SESSION_GRAMMAR])
    assert fixed is not None
    for program, outputs, awaiting in ((GUIDED_SESSION, 1, 1), (QUEUED_INPUT_SESSION, 4, 0)):
        run = _failing_input_grammar(program, async_scheduling, fixed)
        assert run.reasons == {"a": "error"} and len(run.outputs["a"]) == outputs, run.reasons
        assert run.session_grammar_errors == 1
        assert run.session_inputs_awaiting_grammar == awaiting
    fix = _as_installed(SESSION_GRAMMAR_FIX)
    edit, before, after = fix.edits[2]
    waits = "        if session.structured_output_request is not None:\n"
    assert waits in after
    while_compiling = after.replace(
        waits,
        "        grammar = session.structured_output_request\n"
        "        if grammar is not None and grammar.grammar is None:\n",
    )
    edits = (*fix.edits[:2], (edit, before, while_compiling), *fix.edits[3:])
    variant = EngineFix("waits-only-while-compiling", edits, fix.methods)
    with pytest.raises(EngineCoreViolation) as caught:
        _failing_input_grammar(QUEUED_INPUT_SESSION, async_scheduling, ScheduleFix(variant).apply)
    assert caught.value.rule == "implementation_error", caught.value
    assert "vLLM raised in get_grammar_bitmask" in str(caught.value)


def _partial_grammar_fix(
    edits: tuple[Any, ...], methods: tuple[tuple[str, str], ...], others: list[str]
) -> Callable[[Any], None]:
    """The fixes `others`, then the sessions' grammar fix with `edits` alone (a variant that
    lacks one of its edits)."""
    before = make_fixes(others)
    assert before is not None
    partial = ScheduleFix(EngineFix("partial-grammar-fix", edits, methods)).apply

    def fix(sched: Any) -> None:
        before(sched)
        partial(sched)

    return fix


def _vllm_raises_in(method: str, seed: int, async_scheduling: bool, options: LoopOptions) -> None:
    """Session program `seed` under `options` makes vLLM raise in `method`."""
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(session_program(seed), async_scheduling=async_scheduling, options=options)
    assert caught.value.rule == "implementation_error", caught.value
    assert f"vLLM raised in {method}" in str(caught.value)


def test_the_grammar_fix_gives_no_row_to_a_session_whose_next_grammar_compiles() -> None:
    """Under async scheduling a batch scheduled for the turn that ended may be sampled after
    the next input was applied, its grammar still compiling (session program 347 with late
    grammars): the fix's `get_grammar_bitmask` gives that session no row (the batch's output
    is dropped); a variant without that edit has vLLM's bitmask raise on the pending grammar."""
    options = LoopOptions(
        structured_output=True,
        late_grammars=True,
        fix=make_fixes([SESSION_STALL, SESSION_GRAMMAR]),
    )
    run = run_loop(session_program(347), async_scheduling=True, options=options)
    assert run.session_inputs_awaiting_grammar >= 1
    fix = _as_installed(SESSION_GRAMMAR_FIX)
    variant = _partial_grammar_fix(fix.edits[:3], fix.methods[:2], [SESSION_STALL])
    _vllm_raises_in("get_grammar_bitmask", 347, True, replace(options, fix=variant))


def test_the_grammar_fix_drops_the_drafts_of_a_session_whose_next_grammar_compiles() -> None:
    """With drafts, the step of the turn that ended may hand back drafts after the next input
    was applied (session program 55, synchronous loop): the fix drops them rather than check
    them against a grammar still compiling; a variant without that edit has vLLM's
    `update_draft_token_ids` raise."""
    options = LoopOptions(
        structured_output=True,
        late_grammars=True,
        speculative_tokens=2,
        fix=make_fixes([SESSION_STALL, SESSION_GRAMMAR, SPEC_PAD]),
    )
    run = run_loop(session_program(55), async_scheduling=False, options=options)
    assert run.session_inputs_awaiting_grammar >= 1
    fix = _as_installed(SESSION_GRAMMAR_FIX)
    edits = (*fix.edits[:4], *fix.edits[5:])  # all but the edit of `update_draft_token_ids`
    variant = _partial_grammar_fix(edits, fix.methods, [SESSION_STALL, SPEC_PAD])
    _vllm_raises_in("update_draft_token_ids", 55, False, replace(options, fix=variant))


#: The candidate fixes of schedspec's KV connector's findings (`--kv-connector`), with the
#: sessions' stall fix.
CONNECTOR_FIXED = [SESSION_STALL, *KV_LOAD_FIXES.names]


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_sessions_take_turns_beside_schedspecs_kv_connector(policy: str) -> None:
    """With the connector's fixes the first session programs pass both loops beside
    schedspec's KV connector: a session loads its first turn's hit, loads again when its kept
    KV was dropped (a later turn, its whole prompt looked up afresh), and sends its KV when it
    ends; under "fail" a session a failed load ends is checked as an aborted one (its turns so
    far, the error ending none of them)."""
    options = LoopOptions(kv_connector=policy, fix=make_fixes(CONNECTOR_FIXED))
    totals = {"loads": 0, "session_loads": 0, "session_sends": 0, "load_errors": 0}
    for seed in range(2 * PROGRAMS):
        for run in _both(session_program(seed), options):
            for name in totals:
                totals[name] += getattr(run, name)
    assert totals["loads"] > totals["session_loads"] > 0, totals
    assert totals["session_sends"] > 0, totals
    assert (totals["load_errors"] > 0) == (policy == "fail"), totals


def test_the_stall_fix_drops_a_session_waiting_for_its_next_grammar() -> None:
    """Beside schedspec's KV connector a request whose load finished heads the queue of
    requests holding KV and finds no room; behind it waits a guided session whose next input
    was applied (`own-grammar-per-input`: it waits for its grammar until the loop reaches it),
    holding the rest of the pool (session program 524, sync). The stall fix's first version,
    which dropped only sessions already promoted to WAITING, took none, and the engine stepped
    on scheduling nothing; the fix drops that session too."""
    fixes = [*CONNECTOR_FIXED, SESSION_GRAMMAR]
    options = LoopOptions(kv_connector="recompute", structured_output=True, fix=make_fixes(fixes))
    run = run_loop(session_program(524), async_scheduling=False, options=options)
    assert run.session_kv_dropped >= 1, run
    promoted_only = _fix_variant(
        SESSION_STALL_FIX,
        "drops-promoted-sessions-only",
        " " * 28 + "RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,\n",
        "",
        [n for n in fixes if n != SESSION_STALL],
    )
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(
            session_program(524),
            async_scheduling=False,
            options=replace(options, fix=promoted_only),
        )
    assert caught.value.rule == "progress", caught.value
    assert "0 running" in str(caught.value) and "0 blocks free" in str(caught.value)


#: A guided session (the first request submitted is guided): one output, then one input that
#: asks for a grammar of its own turn's output.
GUIDED_SESSION = CoreProgram(
    ArConfig(block_size=4, num_blocks=9, max_num_batched_tokens=8, max_model_len=16),
    arrivals=((ArRequest("a", 2, 1),), *(((),) * 5)),
    aborts=((),) * 6,
    inputs=((), (), (SessionInput("a", 1, 2),), (), (SessionInput("a", 0),), ()),
)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_finding_a_guided_sessions_later_turn_keeps_its_first_inputs_grammar(
    async_scheduling: bool,
) -> None:
    """`EngineCore` compiles each input's grammar, but `StreamingUpdate` carries the prompt,
    `max_tokens` and sampling params alone: the session keeps its first input's grammar, done
    after turn 1, so turn 2 samples unconstrained (`grammar_mask`)."""
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(
            GUIDED_SESSION,
            async_scheduling=async_scheduling,
            options=LoopOptions(structured_output=True),
        )
    assert caught.value.rule == "grammar_mask", caught.value
    assert (
        "'a' samples output 1 under bitmask row 0, which allows every token (unconstrained)"
        in str(caught.value)
    )
    assert "in turn 2 of its session" in str(caught.value)
    # without the later input the session's one turn is guided as any request's
    single = replace(GUIDED_SESSION, inputs=((),) * 4 + ((SessionInput("a", 0),),) + ((),))
    run = run_loop(
        single, async_scheduling=async_scheduling, options=LoopOptions(structured_output=True)
    )
    assert run.guided_rows >= 1 and run.reasons == {"a": "length"}
    # with each input's own grammar the later turn is guided too, and the session drains
    fixed = LoopOptions(structured_output=True, fix=make_fixes([SESSION_GRAMMAR]))
    both = run_loop(GUIDED_SESSION, async_scheduling=async_scheduling, options=fixed)
    assert both.guided_rows == run.guided_rows + 2, (both.guided_rows, run.guided_rows)
    assert both.reasons == {"a": "length"} and len(both.outputs["a"]) == 1 + 2


#: A guided session with reasoning on (submitted first, so guided): turn 1 reasons one token
#: and ends its reasoning at output 2 of 3; turn 2's input opens a reasoning part
#: (`REASONING_START`) and the turn reasons two tokens, its end at output 3 of 4; turn 3's
#: input holds an empty part (`REASONING_START`, `REASONING_END`), and the turn is guided from
#: its first output.
REASONING_SESSION = CoreProgram(
    ArConfig(block_size=4, num_blocks=12, max_num_batched_tokens=8, max_model_len=32),
    arrivals=((ArRequest("a", 2, 3),), *(((),) * 9)),
    aborts=((),) * 10,
    inputs=(
        (),
        (),
        (SessionInput("a", 2, 4),),
        (),
        (SessionInput("a", 2, 2),),
        *(((),) * 3),
        (SessionInput("a", 0),),
        (),
    ),
)
REASONING = LoopOptions(structured_output=True, reasoning=True)


def test_a_later_turns_input_opens_or_skips_its_reasoning_part() -> None:
    """With reasoning on, every other later turn of a guided session reasons (1-3 tokens), and
    its input ends as a thinking model's chat template opens the turn: with the start token,
    or with an empty part when the turn skips reasoning (as far as the input's length
    allows); without reasoning an input carries no marks."""
    assert [turn_reasoning_end(0, t) for t in range(2, 8)] == [3, None, 4, None, 2, None]
    assert [turn_reasoning_end(1, t) for t in range(2, 6)] == [None, 4, None, 2]
    plain = input_tokens(0, 2, 3)
    assert REASONING_START not in plain and REASONING_END not in plain
    assert input_tokens(0, 2, 3, True) == [*plain[:2], REASONING_START]
    assert input_tokens(0, 2, 3, False) == [plain[0], REASONING_START, REASONING_END]
    assert input_tokens(0, 2, 1, True) == [REASONING_START]
    assert input_tokens(0, 2, 1, False) == [REASONING_END]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_guided_sessions_later_turns_reason_again_with_the_grammar_fix(
    async_scheduling: bool,
) -> None:
    """With each input's own grammar a later turn whose input opens a reasoning part reasons
    again (vLLM's parser reads the prompt from its end: a start after the last end), its rows
    unconstrained up to its reasoning end and guided after it, and a turn whose input skips
    reasoning is guided from its first output. Released vLLM keeps the first input's grammar,
    and the later turn's first content token is refused: the session ends with an error."""
    fixed = replace(REASONING, fix=make_fixes([SESSION_GRAMMAR]))
    run = run_loop(REASONING_SESSION, async_scheduling=async_scheduling, options=fixed)
    outputs = run.outputs["a"]
    assert len(outputs) == 3 + 4 + 2 and run.reasons == {"a": "length"}
    # the reasoning ends: turn 1's second output, turn 2's third; turn 3 has none
    assert [i for i, t in enumerate(outputs) if t == REASONING_END] == [1, 3 + 2]
    # every output sampled under a checked row: 2 + 3 reasoning rows (the end's included), 3
    # of them in turn 2, and 1 + 1 + 2 guided ones
    assert (run.guided_rows, run.reasoning_rows, run.session_reasoning_rows) == (9, 5, 3)
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(REASONING_SESSION, async_scheduling=async_scheduling, options=REASONING)
    assert caught.value.rule in {"output_content", "finish_reason"}, caught.value
    assert "session 'a'" in str(caught.value)


def test_a_grammar_that_keeps_the_earlier_turns_reasoning_end_is_caught() -> None:
    """Seeded bug `session_keeps_its_reasoning_end` (the grammar fix applied, the earlier
    grammar's latch carried over): turn 2 reasons again but is constrained from its first
    output (`grammar_mask`), in the directed program and within the first session programs."""
    options = replace(
        REASONING,
        fix=make_fixes([SESSION_STALL, SESSION_GRAMMAR]),
        mutate=session_keeps_its_reasoning_end,
    )
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(REASONING_SESSION, async_scheduling=True, options=options)
    assert caught.value.rule == "grammar_mask", caught.value
    assert (
        "'a' samples output 1, still reasoning (its grammar starts at output 4), under bitmask "
        "row 0, which allows class 4; a reasoning row allows every token"
    ) in str(caught.value)
    seen = first_violations(
        PROGRAMS,
        lambda seed: run_loop(session_program(seed), async_scheduling=True, options=options),
        until="grammar_mask",
    )
    assert "grammar_mask" in seen, seen
    assert "still reasoning" in seen["grammar_mask"], seen
    # the fix alone passes the same programs
    control = replace(options, mutate=None)
    for seed in range(PROGRAMS):
        run_loop(session_program(seed), async_scheduling=True, options=control)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_finding_a_session_ended_by_its_next_grammar_has_uncomputed_blocks_offloaded(
    async_scheduling: bool,
) -> None:
    """With each input its own grammar (`own-grammar-per-input`), a session whose next input
    was applied and whose grammar then fails ends with an error before the input's tokens are
    computed. vLLM's offloading connector stores a finished request's blocks up to the commit
    point of a request that computed its prompt (unless it was aborted), so it stores the
    input's block, which no batch wrote (`store_content`; session program 16 with late
    grammars). The candidate fix `store-computed-on-error` stores what such a request
    computed, as for an abort, and the program passes."""
    fixes = [SESSION_STALL, SESSION_GRAMMAR, OFFLOAD_HIT]
    options = LoopOptions(
        offload_chunks=8,
        offload_outputs=True,
        structured_output=True,
        late_grammars=True,
        fix=make_fixes(fixes),
    )
    if fixed_upstream():  # 0.34.0 stores at most what a finished request computed
        run = run_loop(session_program(16), async_scheduling=async_scheduling, options=options)
        assert run.session_grammar_errors >= 1 and run.offload_stores >= 1, run
        return
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(session_program(16), async_scheduling=async_scheduling, options=options)
    assert caught.value.rule == "store_content", caught.value
    assert "but no batch or load wrote it" in str(caught.value)
    fixed = replace(options, fix=make_fixes([*fixes, STORE_COMPUTED_ON_ERROR]))
    run = run_loop(session_program(16), async_scheduling=async_scheduling, options=fixed)
    assert run.session_grammar_errors >= 1 and run.offload_stores >= 1, run


def test_the_reset_fix_takes_back_a_session_waiting_for_its_next_grammar() -> None:
    """With each input its own grammar, a session whose next input was applied waits for that
    grammar holding its kept KV; a "keep" pause's cache reset then finds its blocks in use
    (session program 0 with vLLM's offloading connector and structured output). The reset fix
    takes those blocks back as it does a session's between turns, keeping its status; its
    version that took back sessions between turns only left the reset raising."""
    fixes = [SESSION_STALL, SESSION_GRAMMAR, OFFLOAD_HIT, RESET_HOLDERS]
    options = LoopOptions(
        offload_chunks=8,
        offload_outputs=True,
        structured_output=True,
        pauses="keep",
        fix=make_fixes(fixes),
    )
    run = run_loop(session_program(0), async_scheduling=False, options=options)
    assert run.pause_taken_back >= 1, run
    variant = _fix_variant(
        RESET_HOLDERS_FIX,
        "takes-back-sessions-between-turns-only",
        " " * 20 + "RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,\n",
        "",
        [SESSION_STALL, SESSION_GRAMMAR, OFFLOAD_HIT],
    )
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(session_program(0), async_scheduling=False, options=replace(options, fix=variant))
    assert caught.value.rule == "implementation_error", caught.value
    assert "vLLM raised in reset_prefix_cache" in str(caught.value)


#: Session program 81 with 2 pipeline stages, 2 drafts and structured output, shrunk: r1's
#: second turn ends (output of schedule 12) with a step of it in flight (schedule 14); its
#: third turn starts at once in a batch deferred behind that step (schedule 15).
TURN_BEHIND_STALE_STEP = CoreProgram(
    ArConfig(
        block_size=4, num_blocks=6, max_num_batched_tokens=4, max_num_seqs=3, max_model_len=11
    ),
    arrivals=(
        (ArRequest("r0", 1, 1), ArRequest("r1", 1, 5)),
        (ArRequest("r2", 1, 1),),
        (ArRequest("r3", 1, 1),),
        *(((),) * 9),
    ),
    aborts=((),) * 12,
    inputs=(
        *(((),) * 7),
        (SessionInput("r1", 1, 3),),
        (),
        (SessionInput("r1", 1, 1),),
        (),
        (SessionInput("r0", 1, 2),),
    ),
)


def test_a_deferred_batch_behind_a_turns_stale_step_samples_the_next_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`TURN_BEHIND_STALE_STEP`, asynchronous loop: when a turn ends vLLM counts its tokens in
    flight as stale and drains them batch by batch as the batches' outputs come in. With 2
    pipeline stages a batch deferred for structured output may be sampled while the ended
    turn's step is still in flight before it, so its own output is not stale: the model
    samples the next turn's token there. The check's first rule (stale while vLLM counts any
    stale token, as if the deferred batch were the oldest in flight) sampled nothing, and
    vLLM then waited for that token for good (`progress`)."""
    options = LoopOptions(
        pipeline_parallel_size=2,
        speculative_tokens=2,
        structured_output=True,
        fix=make_fixes([SPEC_PAD, SESSION_GRAMMAR, SESSION_STALL]),
        draw_seed=3581395674,
    )
    execute = SpeculativeModel.execute
    behind: list[str] = []

    def noting(self: SpeculativeModel, out: Any, *args: Any, **kwargs: Any) -> Any:
        ahead = kwargs.get("ahead") or {}
        for rid in out.num_scheduled_tokens:
            req = self.sched.requests.get(rid)
            stale = 0 if req is None or not req.drop_stale_output else req.num_stale_output_tokens
            if kwargs.get("deferred") and 0 < stale <= ahead.get(rid, 0):
                behind.append(rid)
        return execute(self, out, *args, **kwargs)

    monkeypatch.setattr(SpeculativeModel, "execute", noting)
    run = run_loop(TURN_BEHIND_STALE_STEP, async_scheduling=True, options=options)
    assert behind == ["r1"], behind
    assert run.deferred >= 1, run

    def oldest_in_flight(self: SpeculativeModel, out: Any, *args: Any, **kwargs: Any) -> Any:
        return execute(self, out, *args, **{**kwargs, "ahead": None})

    monkeypatch.setattr(SpeculativeModel, "execute", oldest_in_flight)
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(TURN_BEHIND_STALE_STEP, async_scheduling=True, options=options)
    assert caught.value.rule == "progress", caught.value
    assert "1 running, 0 waiting" in str(caught.value)
