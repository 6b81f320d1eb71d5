"""The live `VllmEventLog` with structured-output grammars that compile late.

vLLM passes over a request whose grammar is still compiling (`WAITING_FOR_STRUCTURED_OUTPUT_
GRAMMAR`) and admits the requests behind it; its waiting pass promotes the request once the
grammar has compiled. The log says so: `ArAwaiting` "grammar" after the request's submission,
`ArReady` with `in_step` at the start of the pass that promoted it. Before the events the
check failed such logs on `fcfs_admission`, `policy_admission` or `progress` where vLLM was
right: the same logs without those lines still do, here. Two seeded vLLM bugs show the rule
`awaiting` and the admission rules catch what vLLM could get wrong.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.admission_knobs import VLLM_ADMISSION, AdmissionKnobs
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreProgram, EngineCoreLoop, core_program
from integrations.vllm.event_log import VllmEventLog, grammar_compiled
from integrations.vllm.multi_turn_programs import multi_turn_program
from integrations.vllm.settings_034 import Vllm034Settings
from properties.ar.trace_check import check_ar_trace
from schedspec_cli.main import main
from spec.ar.config import ArConfig, ArRequest
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.test_real_vllm_event_log_lookahead import checked_logs
from tests.test_real_vllm_event_log_lora import undeclared_progress
from tests.test_real_vllm_structured import LATE
from tests.vllm_seeded_bugs import (
    blocked_grammar_stops_the_pass,
    capacity_escape_counts_deferred,
    compiled_grammar_passed_once,
    compiled_grammar_seen_late,
    grammar_error_forgotten,
    grammar_wait_ignored,
    window_moves_blocked_requests,
)

#: Generated programs (`core_program`, and next turns with prefix caching), every other
#: request guided, each grammar compiling 0 to 3 engine steps late or (one in six) failing.
CORE_SEEDS = range(10)
NEXT_TURN_SEEDS = range(5)
#: What the admission rules say of a log whose awaiting requests are not marked (vLLM passed
#: over a request, or left it waiting, that the log says it could admit).
ADMISSION_RULES = {"fcfs_admission", "policy_admission", "progress", "admission_progress"}


@pytest.fixture(autouse=True)
def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def late_grammar_log(
    program: CoreProgram,
    into: list[str],
    *,
    draw: Callable[[str], tuple[int, bool]] | None = None,
    bug: Callable[[Any], None] | None = None,
    method: str | None = None,
    seed: int = 0,
    window: int = 0,
    admission: AdmissionKnobs = VLLM_ADMISSION,
) -> None:
    """The live log of the engine-core loop serving `program` with structured output and
    grammars compiled late (as `draw` scripts them, when given), into `into`; `bug` is planted
    in the scheduler first; with 3 drafts by `method` (drawn by `seed`) when given, and vLLM
    0.34.0's cache-aware window of `window` (threshold 0) when not 0, and vLLM's admission
    settings `admission`."""

    def attach(scheduler: Any) -> None:
        if bug is not None:
            bug(scheduler)
        VllmEventLog(scheduler, into.append)

    drafts: dict[str, Any] = (
        {"speculative_tokens": 3, "speculative_method": method, "draft_seed": seed}
        if method
        else {}
    )
    if window:
        drafts["settings_034"] = Vllm034Settings(
            cache_aware_window=window, cache_aware_threshold=0.0
        )
    loop = EngineCoreLoop(
        program.config,
        async_scheduling=False,
        structured_output=True,
        late_grammars=True,
        mutate=attach,
        admission=admission,
        **drafts,
    )
    if draw is not None:
        assert loop.late is not None
        loop.late.draw = draw
    loop.run(program)


def tally_late_grammar_logs(
    programs: str, method: str | None, seeds: Iterable[int], window: int = 0
) -> dict[str, int]:
    """For the by-hand runs of docs/engines/vllm.md: over the `seeds`' logs of `programs`
    ("core": `core_program`, "next-turn": `multi_turn_program`) with late grammars (drafts by
    `method`, vLLM 0.34.0's cache-aware `window`), how many conform, are refused at start-up or
    stopped (`checked_logs`), how many `ar_awaiting` and `ar_ready` lines they hold, and by
    which rule the logs without those lines fail."""
    tally: Counter[str] = Counter()

    def write(seed: int, into: list[str]) -> None:
        program = core_program(seed) if programs == "core" else multi_turn_program(seed)
        late_grammar_log(program, into, method=method, seed=seed, window=window)

    for lines, result in checked_logs(write, seeds, tally):
        found = result.violation
        tally["conform" if found is None else f"violation: {found.rule}"] += 1
        events = kinds(lines)
        tally["awaiting"] += sum(kind == "ar_awaiting" for kind, _ in events)
        tally["ready"] += sum(kind == "ar_ready" for kind, _ in events)
        bare = check_ar_trace(without_awaiting(lines)).violation
        tally["without the events: " + ("conform" if bare is None else bare.rule)] += 1
    return dict(tally)


def kinds(lines: list[str]) -> list[tuple[str, str | None]]:
    """Each event line's (kind, request id)."""
    return [(e["kind"], e.get("request_id")) for e in map(json.loads, lines[1:])]


def without_awaiting(lines: list[str]) -> list[str]:
    """The log without its `ar_awaiting`, `ar_ready` and `ar_input_failed` lines: what it was
    before the events."""
    written = ('"ar_awaiting"', '"ar_ready"', '"ar_input_failed"')
    return [line for line in lines if not any(kind in line for kind in written)]


def test_generated_programs_conform_and_fail_without_the_awaiting_lines() -> None:
    """Every log conforms; the programs had requests waiting for their grammars, promoted in
    a pass; and without the events most logs fail an admission rule (all 15 on vLLM 0.33.0),
    none another rule."""
    tally: Counter[str] = Counter()

    def write(seed: int, into: list[str]) -> None:
        program = core_program(seed) if seed >= 0 else multi_turn_program(-1 - seed)
        late_grammar_log(program, into)

    seeds = [*CORE_SEEDS, *(-1 - s for s in NEXT_TURN_SEEDS)]
    for lines, result in checked_logs(write, seeds, tally):
        assert result.violation is None, f"{result.violation}\n{''.join(lines)}"
        tally["conform"] += 1
        events = kinds(lines)
        tally["awaiting"] += sum(kind == "ar_awaiting" for kind, _ in events)
        tally["ready"] += sum(kind == "ar_ready" for kind, _ in events)
        bare = check_ar_trace(without_awaiting(lines)).violation
        if bare is not None:
            assert bare.rule in ADMISSION_RULES, str(bare)
            tally["fail without"] += 1
    assert tally["conform"] == len(seeds), tally
    assert tally["awaiting"] > 40 and tally["ready"] > 25, tally
    assert tally["fail without"] >= len(seeds) * 2 // 3, tally


def test_a_request_waiting_for_its_grammar_is_passed_then_promoted() -> None:
    """`LATE`: r0's grammar compiles 3 engine steps late. The log marks r0 awaiting after its
    submission and admits r1 past it; before the step after the grammar compiled, r0 is
    ready (between steps), and that step's pass promotes it at its start (in_step), right
    before its admission. The log conforms, and fails `fcfs_admission` without those lines."""
    lines: list[str] = []
    late_grammar_log(LATE, lines, draw=lambda rid: (3, False))
    events = kinds(lines)
    assert events[:4] == [
        ("ar_submitted", "r0"),
        ("ar_awaiting", "r0"),
        ("ar_submitted", "r1"),
        ("ar_blocks_allocated", "r1"),
    ]
    ready = [i for i, event in enumerate(events) if event == ("ar_ready", "r0")]
    assert len(ready) == 2, events
    between, promoted = (json.loads(lines[1 + i]) for i in ready)
    assert between == {"kind": "ar_ready", "request_id": "r0"}
    assert promoted == {"kind": "ar_ready", "request_id": "r0", "in_step": True}
    assert events[ready[0] - 1] == ("ar_step_end", None)  # between steps
    assert events[ready[1] + 1] == ("ar_blocks_allocated", "r0")
    assert check_ar_trace(lines).violation is None
    bare = check_ar_trace(without_awaiting(lines)).violation
    assert bare is not None and bare.rule == "fcfs_admission", bare


def test_a_grammar_that_fails_ends_its_request_while_it_awaits() -> None:
    """r0's grammar fails to compile: the log says so between steps (`ar_input_failed`), and
    vLLM ends r0 with an error in the step whose pass reaches it, never admitted, never ready:
    the log conforms."""
    lines: list[str] = []
    late_grammar_log(LATE, lines, draw=lambda rid: (1, True))
    events = kinds(lines)
    failed, aborted = events.index(("ar_input_failed", "r0")), events.index(("ar_aborted", "r0"))
    assert events.index(("ar_awaiting", "r0")) < failed < aborted
    assert events[failed:aborted].count(("ar_step_end", None)) == 1  # ended in that step
    assert ("ar_ready", "r0") not in events
    assert check_ar_trace(lines).violation is None


@pytest.mark.parametrize(
    ("bug", "draw", "rule", "words", "loop_stops"),
    [
        (grammar_wait_ignored, (3, False), "awaiting", "for 'r0', which awaits its grammar", True),
        (compiled_grammar_passed_once, (0, False), "fcfs_admission", "'r1' while 'r0'", True),
        (compiled_grammar_seen_late, (0, False), "fcfs_admission", "'r1' while 'r0'", False),
        (grammar_error_forgotten, (1, True), "awaiting", "['r0'] failed to get their input", True),
    ],
    ids=["admitted-while-compiling", "passed-once-compiled", "compiled-seen-late", "error-lost"],
)
def test_seeded_grammar_bugs_are_caught(
    bug: Callable[[Any], None],
    draw: tuple[int, bool],
    rule: str,
    words: str,
    loop_stops: bool,
) -> None:
    """vLLM admitting a request whose grammar still compiles breaks `awaiting`; vLLM passing
    over a request it has just promoted, or whose compiled grammar it leaves unseen, breaks
    FCFS; vLLM forgetting a failed grammar's error leaves its request waiting past the pass
    that reached it (`awaiting`, at the next step). The loop stops on its own checks (its
    admission order, vLLM's error at the grammar bitmask, the drain), and the log written so
    far is checked; the loop's admission check passes over a request still in the grammar's
    status, so only the log catches the third."""
    lines: list[str] = []
    stopped = False
    try:
        late_grammar_log(LATE, lines, draw=lambda rid: draw, bug=bug)
    except EngineCoreViolation:
        stopped = True
    assert stopped == loop_stops
    found = check_ar_trace(lines).violation
    assert found is not None and found.rule == rule and words in str(found), found


#: x (guided, its grammar at once) runs 10 steps; a (guided, 4 steps late) and b arrive next
BEHIND = CoreProgram(
    ArConfig(block_size=2, num_blocks=16, max_num_batched_tokens=8, max_model_len=16),
    ((ArRequest("x", 2, 10), ArRequest("y", 2, 1)), (ArRequest("a", 2, 2), ArRequest("b", 2, 2))),
    ((), ()),
)


def twin_verdict(lines: list[str], tmp_path: Path, twin: str | None = None) -> tuple[int, str]:
    """`check-trace LOG --twin vllm-v1` (`vllm-v1-prefix` with prefix caching; `twin` when
    given) on the log: its exit code and what it printed."""
    path = tmp_path / "log.jsonl"
    path.write_text("".join(f"{line}\n" for line in lines))
    if twin is None:
        prefix = json.loads(lines[0])["enable_prefix_caching"]
        twin = "vllm-v1-prefix" if prefix else "vllm-v1"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["check-trace", str(path), "--twin", twin])
    return code, out.getvalue()


def test_the_twin_replays_awaiting_requests_and_catches_a_pass_that_stops_at_one(
    tmp_path: Path,
) -> None:
    """The reference vllm-v1 holds an awaiting request back as vLLM does, so `--twin` replays
    late-grammar logs and decides alike. vLLM stopping its pass at a request whose grammar
    still compiles leaves b waiting 3 steps though it fits: the log fails
    `admission_progress` (the log declares it, as vLLM's pass goes on past such a request)
    naming the request passed over; undeclared, the log conforms and the twin, which admits
    b in the step it arrives, differs."""
    for bug in (None, blocked_grammar_stops_the_pass):
        lines: list[str] = []
        late_grammar_log(BEHIND, lines, draw=lambda rid: (4 if rid == "a" else 0, False), bug=bug)
        found = check_ar_trace(lines).violation
        code, said = twin_verdict(undeclared_progress(lines), tmp_path)
        if bug is None:
            assert found is None
            assert code == 0 and "its twin vllm-v1 decides alike" in said, said
        else:
            assert found is not None and found.rule == "admission_progress", found
            assert "left 'b' waiting" in str(found) and "'a', awaiting its grammar" in str(found)
            assert code == 1 and "[twin_decisions]" in said and "'b'" in said, said
    for seed in CORE_SEEDS:  # generated programs: the twin decides alike
        lines = []
        late_grammar_log(core_program(seed), lines)
        code, said = twin_verdict(lines, tmp_path)
        assert code == 0, said


#: Generated programs whose cadence-held steps meet requests deferred for their grammars
#: (found by a review: the twin counted them as left waiting, and gave a false difference)
CADENCE_SEEDS = (6, 11, 12, 17)


def test_the_prefill_cadence_does_not_count_requests_deferred_for_a_grammar(
    tmp_path: Path,
) -> None:
    """With a prefill interval of 3, vLLM's capacity escape counts a request deferred for its
    grammar (`deferred_waiting`, until admitted) as no work left waiting. The logs conform and
    the cadence twin decides alike; the seeded bug that counts them fails `prefill_cadence`
    in the log, and the twin."""
    cadence = AdmissionKnobs(prefill_interval=3)
    twin = "reference.ar.vllm_settings:VLLM_V1_CADENCE"
    for seed in CADENCE_SEEDS:
        lines: list[str] = []
        late_grammar_log(core_program(seed), lines, admission=cadence)
        assert check_ar_trace(lines).violation is None
        code, said = twin_verdict(lines, tmp_path, twin)
        assert code == 0, said
        lines = []
        with pytest.raises(EngineCoreViolation):  # the loop's own cadence check, too
            late_grammar_log(
                core_program(seed), lines, admission=cadence, bug=capacity_escape_counts_deferred
            )
        found = check_ar_trace(lines).violation
        assert found is not None and found.rule == "prefill_cadence", found
        assert twin_verdict(lines, tmp_path, twin)[0] == 1


#: A generated program (found by a search over 800) in which a request that awaited its grammar
#: is admitted, then preempted, and left waiting by a release step of the prefill cadence: no
#: longer deferred, it counts for the capacity escape
PREEMPTED_AFTER_ITS_GRAMMAR = CoreProgram(
    ArConfig(
        block_size=2, num_blocks=11, max_num_batched_tokens=8, max_num_seqs=3, max_model_len=16
    ),
    (
        (ArRequest("r0", 4, 10), ArRequest("r1", 2, 12)),
        (ArRequest("r2", 2, 9),),
        (),
        (),
        (ArRequest("r3", 4, 6), ArRequest("r4", 4, 2)),
    ),
    ((), (), (), (), ()),
)


def test_a_request_preempted_after_its_grammar_counts_for_the_capacity_escape(
    tmp_path: Path,
) -> None:
    """vLLM drops a request from `deferred_waiting` once admitted: preempted later and left
    waiting by a release step, it is work left waiting, and the cadence's capacity escape
    lifts the next hold. The log conforms and the cadence twin (which clears `deferred` at
    admission) decides alike."""
    lines: list[str] = []
    late_grammar_log(
        PREEMPTED_AFTER_ITS_GRAMMAR, lines, admission=AdmissionKnobs(prefill_interval=3)
    )
    events = kinds(lines)
    preempted = {rid for kind, rid in events if kind == "ar_preempted"}
    assert preempted & {rid for kind, rid in events if kind == "ar_awaiting"}, events
    assert check_ar_trace(lines).violation is None
    code, said = twin_verdict(lines, tmp_path, "reference.ar.vllm_settings:VLLM_V1_CADENCE")
    assert code == 0, said


P = (11, 12, 13, 14)  # a prompt the first requests cache (two blocks of 2)
#: x0 (guided) and x1 cache `P` and finish in the first steps; in step 2, a (guided) and then
#: c, whose prompt continues `P`, arrive with one seat between them
WINDOWED = CoreProgram(
    ArConfig(
        block_size=2,
        num_blocks=16,
        max_num_batched_tokens=8,
        max_num_seqs=1,
        max_model_len=12,
        enable_prefix_caching=True,
    ),
    (
        (ArRequest("x0", 4, 1, prompt=P), ArRequest("x1", 4, 1, prompt=P)),
        (),
        (ArRequest("a", 3, 2, prompt=(21, 22, 23)), ArRequest("c", 5, 2, prompt=(*P, 15))),
    ),
    ((), (), ()),
)


def test_a_request_not_yet_promoted_keeps_its_place_through_the_cache_aware_reorder() -> None:
    """vLLM 0.34.0's cache-aware window (3, threshold 0) moves only requests of status
    `WAITING`: when the pass begins, a's grammar has compiled (the log says so between steps)
    but a is still in the grammar's status, so the reorder leaves it ahead of c, whose prefix
    is cached; the pass then promotes a (`ArReady` with in_step, after the reorder) and admits
    it. The log conforms. The seeded window that moves blocked requests puts c ahead of a:
    the loop's own order check stops it, and the log written so far fails FCFS, as a's grammar
    had compiled. (On 0.33.0, which has no window, skipped; `test_real_vllm_newest` runs it on
    0.34.0.)"""
    lines: list[str] = []
    try:
        late_grammar_log(WINDOWED, lines, draw=lambda rid: (0, False), window=3)
    except ConfigError as err:
        assert "new in vLLM 0.34.0" in str(err), err
        pytest.skip("the loaded vLLM has no cache-aware window (0.34.0 has)")
    assert '"cache_aware_window":3' in lines[0].replace(" ", ""), lines[0]
    events = kinds(lines)
    ready = [i for i, event in enumerate(events) if event == ("ar_ready", "a")]
    assert len(ready) == 2 and events[ready[1] + 1] == ("ar_blocks_allocated", "a"), events
    assert '"in_step":true' in lines[1 + ready[1]] and "in_step" not in lines[1 + ready[0]]
    assert check_ar_trace(lines).violation is None
    lines = []
    with pytest.raises(EngineCoreViolation):
        late_grammar_log(
            WINDOWED,
            lines,
            draw=lambda rid: (0, False),
            window=3,
            bug=window_moves_blocked_requests,
        )
    found = check_ar_trace(lines).violation
    assert found is not None and found.rule == "fcfs_admission", found
    assert "admitted 'c' while 'a' is ahead of it" in str(found), found


def test_the_log_reads_a_grammar_without_resolving_it() -> None:
    """`grammar_compiled` is True for a compiled grammar, False for a pending or failed one,
    and leaves vLLM's future in place (vLLM resolves it when its waiting pass looks)."""
    pending: Future[object] = Future()
    request = SimpleNamespace(structured_output_request=SimpleNamespace(_grammar=pending))
    assert not grammar_compiled(request)
    pending.set_result(object())
    assert grammar_compiled(request) and request.structured_output_request._grammar is pending
    failed: Future[object] = Future()
    failed.set_exception(ValueError("does not compile"))
    assert not grammar_compiled(
        SimpleNamespace(structured_output_request=SimpleNamespace(_grammar=failed))
    )
    assert not grammar_compiled(SimpleNamespace(structured_output_request=None))


def compiles_as_the_pass_reaches_it(sched: Any) -> None:
    """r0's grammar compiles the second time vLLM's waiting pass looks at r0: after the log
    read it pending at that `schedule()` call's start, before vLLM's promotion reads it (a
    compile thread finishing mid-pass)."""
    original = sched._handle_blocked_waiting_request
    looks = Counter[str]()

    def handle(request: Any) -> Any:
        looks[request.request_id] += 1
        sor = request.structured_output_request
        if request.request_id == "r0" and looks["r0"] == 2 and not sor._grammar.done():
            backend = sched.structured_output_manager.backend
            sor._grammar.set_result(backend.compile_grammar(*sor.structured_output_key))
        return original(request)

    sched._handle_blocked_waiting_request = handle


def test_a_grammar_that_compiles_during_the_pass_is_ready_once(tmp_path: Path) -> None:
    """`LATE` with r0's grammar compiling inside the pass of its second step (the loop would
    complete it only after the program): r0 gets one ready, in the step that promotes it,
    before its admission, and none between steps after; the log conforms and its twin
    decides alike."""
    lines: list[str] = []
    late_grammar_log(LATE, lines, draw=lambda rid: (99, False), bug=compiles_as_the_pass_reaches_it)
    events = kinds(lines)
    ready = [i for i, event in enumerate(events) if event == ("ar_ready", "r0")]
    assert len(ready) == 1, events
    assert json.loads(lines[1 + ready[0]]) == {
        "kind": "ar_ready",
        "request_id": "r0",
        "in_step": True,
    }
    assert events[ready[0] + 1] == ("ar_blocks_allocated", "r0"), events
    assert sum(event == ("ar_step_end", None) for event in events[: ready[0]]) == 1, events
    assert check_ar_trace(lines).violation is None
    code, said = twin_verdict(lines, tmp_path)
    assert code == 0 and "decides alike" in said, said
