"""A vLLM 0.33.0 finding: under the priority policy, a request preempted in the step that
scheduled it leaves the blocks of that step's tokens in the prefix cache, although their KV is
never written; a later request with that prefix (the victim itself, resuming) gets them as a
cache hit. Also the candidate fix (`integrations.vllm.preempted_cache_fix`) and the seed-53
counterexample of `verify --impl real-vllm-prefix` (docs/real-vllm-prefix-s53-failure.txt),
which is this finding.

The program (block size 1, 8 usable blocks, budget 3, long-prefill threshold 2, priority;
steps numbered from 0): A (priority 1, 7 prompt tokens) prefills 3 tokens, then 2 with B
(priority 0, 1 token) beside it. In step 2 vLLM schedules A's last 2 prompt tokens first
(blocks 7 and 8, both hashed at once), then B needs a block for its next token, none is free,
and the lowest-priority victim is A, already scheduled: A leaves the step with its KV for
tokens 5 and 6 unwritten. B takes block 8 (its hash goes); block 7 keeps A's hash for token 5.
When A resumes, vLLM hands it 6 cached tokens, block 7 among them, and computes only token 6.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from integrations.vllm import MANIFEST, REAL_VLLM_PREFIX, REAL_VLLM_PREFIX_PROFILE
from integrations.vllm.adapter import RealVllmScheduler, make_real_vllm_prefix, vllm_rules
from integrations.vllm.engine_core import (
    CoreProgram,
    EngineCoreLoop,
    EngineCoreViolation,
    LoopOptions,
    check_both,
    core_program,
    run_loop,
)
from integrations.vllm.preempted_cache_fix import (
    REAL_VLLM_PREFIX_FIXED,
    apply_preempted_cache_fix,
    fix_as_diff,
)
from integrations.vllm.program_tally import release_selector
from integrations.vllm.same_step_programs import same_step_program
from properties.ar.conformance import ar_conformance_machine
from properties.ar.harness import ArHarness
from properties.verify import machine_for, run_machine
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.events import ArBlocksAllocated, ArCacheHit, ArEvent, ArScheduled
from spec.errors import SpecViolation
from spec.implementation import ArImplementation
from tests.ar_mutants import AR_MUTANTS
from tests.engine_core_programs import first_violations, passing_runs
from tests.engine_gate import require_engine
from tests.same_step_preemption import CONFIG
from tests.script_module import load_script
from tests.test_ar_mutants import HUNT
from tests.vllm_seeded_bugs import stale_hash_on_reuse

ROOT = Path(__file__).resolve().parent.parent
COUNTEREXAMPLE = ROOT / "docs" / "real-vllm-prefix-s53-failure.txt"

FIXED = REAL_VLLM_PREFIX_FIXED
RULE = "cache_hit_written"


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _program(impl: ArImplementation, *, stepwise: bool) -> SpecViolation | None:
    """A, then B a step later, then steps until both are done; the first violation, if any.
    `stepwise`: one `step()` at a time, the snapshot compared after each; else one `drain()`,
    which compares it only at the end."""
    policy = dataclasses.replace(impl.profile.policy, rules=vllm_rules(CONFIG))
    h = ArHarness(impl.factory, CONFIG, policy=policy)
    try:
        assert h.submit(ArRequest("A", 7, 1, arrival_time=0.0, priority=1)) is None
        h.step()
        assert h.submit(ArRequest("B", 1, 2, arrival_time=1.0, priority=0)) is None
        if stepwise:
            for _ in range(6):
                h.step()
        h.drain(max_steps=20)
    except SpecViolation as err:
        return err
    return None


def test_finding_a_request_preempted_in_the_step_that_scheduled_it_stays_cached() -> None:
    """As released, the step that preempts A ends with block 7 cached by vLLM and by nobody
    in the spec (the snapshot after that step); left to run, A resumes with a cache hit on
    block 7, whose content was never computed. The adapter tells A's scheduling in step 2 from
    the hash it left on block 7 (`integrations.vllm.unscheduled`), so both messages say so."""
    err = _program(REAL_VLLM_PREFIX, stepwise=True)
    assert err is not None
    assert err.rule == "snapshot_matches"
    assert "cached blocks differ: implementation [1, 2, 3, 4, 5, 6, 7, 8], spec " in str(err)
    why = (
        "prefix block 5 of 'A' (token 5), cached when 'A' was scheduled in step 2 and never "
        "computed: it was preempted in that step"
    )
    assert f"[1, 2, 3, 4, 5, 6, 8] (block 7: {why})" in str(err)
    err = _program(REAL_VLLM_PREFIX, stepwise=False)
    assert err is not None
    assert err.rule == "cache_hit_cached"
    assert "'A' claims block 7 as its prefix block 5, but block 7 is not cached" in str(err)
    assert why in str(err)


def _scheduled(events: list[ArEvent], rid: str) -> list[int]:
    return [e.num_tokens for e in events if isinstance(e, ArScheduled) and e.request_id == rid]


def _cached(adapter: RealVllmScheduler) -> dict[int, bytes]:
    """vLLM's cached blocks now: block id -> its hash (the request's block hash + group id)."""
    pool = adapter.sched.kv_cache_manager.block_pool
    return {b.block_id: bytes(b.block_hash) for b in pool.blocks if b.block_hash is not None}


@dataclasses.dataclass
class _Run:
    """The program on a bare adapter: its events; for steps 1 to 3 (from 0) vLLM's own
    `SchedulerOutput` and its cached blocks after the step; A's `Request` (kept: vLLM drops a
    finished request)."""

    events: list[ArEvent]
    outputs: list[Any]
    cached: list[dict[int, bytes]]
    a: Any


def _a_and_b(fixed: bool) -> _Run:
    events: list[ArEvent] = []
    adapter = make_real_vllm_prefix(CONFIG, events.append)
    if fixed:
        apply_preempted_cache_fix(adapter.sched)
    adapter.submit(ArRequest("A", 7, 1, arrival_time=0.0, priority=1))
    adapter.step()
    run = _Run(events, [], [], adapter.sched.requests["A"])
    adapter.submit(ArRequest("B", 1, 2, arrival_time=1.0, priority=0))
    schedule = adapter.sched.schedule

    def recording() -> Any:
        run.outputs.append(schedule())
        return run.outputs[-1]

    adapter.sched.schedule = recording
    for _ in range(3):
        adapter.step()
        run.cached.append(_cached(adapter))
    return run


def test_finding_the_resumed_request_reads_kv_that_was_never_written() -> None:
    """vLLM's own objects, no spec: in the step that preempts A, A's tokens are not in the
    batch, yet block 7 carries A's hash for token 5 afterwards; when A resumes, vLLM counts 6
    of its 7 tokens as cached (block 7 among them) and computes only the last."""
    run = _a_and_b(fixed=False)
    preempting, resuming = run.outputs[1], run.outputs[2]
    assert "A" in preempting.preempted_req_ids
    assert "A" not in preempting.num_scheduled_tokens  # its KV for tokens 5, 6: never written
    assert run.cached[1][7].startswith(bytes(run.a.block_hashes[5]))  # A's token 5 (+ group)
    assert dict(resuming.num_scheduled_tokens) == {"A": 1}
    # step 2: vLLM scheduled 2 tokens; the hash left on block 7 shows the first of them
    assert _scheduled(run.events, "A") == [3, 2, 1, 1]
    assert ArBlocksAllocated("A", (7,)) in run.events
    hits = [e for e in run.events if isinstance(e, ArCacheHit) and e.request_id == "A"]
    assert hits == [ArCacheHit("A", (1, 2, 3, 4, 5, 7))]


def test_fixed_by_evicting_the_unwritten_blocks() -> None:
    """With the fix, block 7 leaves the prefix cache when A is taken out of the step: A
    resumes with the 5 tokens it computed and computes tokens 5 and 6 again."""
    run = _a_and_b(fixed=True)
    assert "A" in run.outputs[1].preempted_req_ids
    assert 7 not in run.cached[1]  # evicted with A's preemption
    assert dict(run.outputs[2].num_scheduled_tokens) == {"A": 2}
    hits = [e for e in run.events if isinstance(e, ArCacheHit) and e.request_id == "A"]
    assert hits == [ArCacheHit("A", (1, 2, 3, 4, 5))]
    assert _scheduled(run.events, "A") == [3, 2, 2]
    assert run.cached[2][7].startswith(bytes(run.a.block_hashes[5]))  # written this time
    assert _program(FIXED, stepwise=True) is None
    assert _program(FIXED, stepwise=False) is None


def _recorded_program(text: str) -> tuple[ArConfig, list[tuple[int, list[object]]]]:
    """The configuration and the `submit_arrivals` calls (n, the draws) of a printed program
    whose rules are `configure` and `submit_arrivals` only."""
    found = re.search(r"state\.configure\(config=(ArConfig\(.*?\))\)\n", text, re.S)
    assert found is not None
    call = ast.parse(found.group(1), mode="eval").body
    assert isinstance(call, ast.Call)
    fields: dict[str, Any] = {}
    for kw in call.keywords:
        assert kw.arg is not None
        if isinstance(kw.value, ast.Attribute):  # Policy.PRIORITY
            fields[kw.arg] = Policy[kw.value.attr]
        else:
            fields[kw.arg] = ast.literal_eval(kw.value)
    calls: list[tuple[int, list[object]]] = []
    draws: list[object] = []
    for line in text.splitlines():
        if m := re.match(r"Draw \d+ \(\w+\): (.*)", line):
            draws.append(ast.literal_eval(m.group(1)))
        elif m := re.match(r"state\.submit_arrivals\(data=data\(\.\.\.\), n=(\d+)\)", line):
            calls.append((int(m.group(1)), draws))
            draws = []
        else:
            assert not line.startswith("state.") or line.split("(")[0] in (
                "state.configure",
                "state.ends_are_checked",
                "state.teardown",
            ), line
    return ArConfig(**fields), calls


class _Recorded:
    """Stands in for Hypothesis's `data`: hands out the recorded draws in order. The program
    was recorded before requests drew a cache read limit (`ArRequest.cache_read_limit`): each
    of its requests has none."""

    def __init__(self, draws: list[object]) -> None:
        self.draws = list(draws)

    def draw(self, strategy: object, label: object = None) -> object:
        if label == "cache_read_limit":
            return None
        return self.draws.pop(0)


def _replay(impl: ArImplementation) -> SpecViolation | None:
    config, calls = _recorded_program(COUNTEREXAMPLE.read_text())
    machine: Any = machine_for(impl)()
    machine.configure(config=config)
    try:
        for n, draws in calls:
            data = _Recorded(draws)
            machine.submit_arrivals(data=data, n=n)
            assert data.draws == []
            machine.ends_are_checked()
        machine.teardown()
    except SpecViolation as err:
        return err
    return None


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_the_seed_53_counterexample_is_this_finding() -> None:
    """The program `verify --impl real-vllm-prefix --seed 53` printed replays, in a fresh
    harness, to the violation it reported; with the fix it passes."""
    err = _replay(REAL_VLLM_PREFIX)
    assert err is not None
    assert err.rule == "cache_hit_cached"
    assert "'r18' claims block 8 as its prefix block 5, but block 8 is not cached" in str(err)
    assert (
        "prefix block 5 of 'r18' (token 5), cached when 'r18' was scheduled in step 27 and never "
        "computed: it was preempted in that step" in str(err)
    )
    assert _replay(FIXED) is None


def _machine(impl: ArImplementation, *, narrowed: bool) -> type:
    configs = AR_MUTANTS["keeps_unwritten_cached"].configs if narrowed else None
    return ar_conformance_machine(impl.factory, profile=REAL_VLLM_PREFIX_PROFILE, configs=configs)


def test_the_suite_finds_it_where_it_can_show() -> None:
    """The property suite itself, on configurations narrowed to where the finding can show
    (the seeded bug's, tests/ar_mutants.py: priority, one-token blocks, small prefill chunks, a
    pool of one request's worst case), catches vLLM as released within the hunt's 1000
    examples, with the reason in the message. Measured: after 13 examples under the dev
    profile, 112 under the ci profile (which stops Hypothesis drawing mined constants,
    properties/profiles.py)."""
    err, _ = run_machine(_machine(REAL_VLLM_PREFIX, narrowed=True), HUNT)
    assert isinstance(err, SpecViolation), err
    assert err.rule == "snapshot_matches"
    assert "never computed: it was preempted in that step" in str(err)


@pytest.mark.parametrize("narrowed", [False, True], ids=["prefix-suite", "narrowed"])
def test_the_fixed_scheduler_passes_the_prefix_suite(narrowed: bool) -> None:
    """With the fix, vLLM passes the prefix suite (both policies) and the narrowed one."""
    err, printed = run_machine(
        _machine(FIXED, narrowed=narrowed), settings(HUNT, max_examples=200 if narrowed else 40)
    )
    assert err is None, printed


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_engine_core_loop_catches_it_and_passes_the_fix(async_scheduling: bool) -> None:
    """vLLM's engine-core loop (asynchronous scheduling is vLLM's default) has no spec to
    follow; its `cache_hit_written` check (every cache hit lands on blocks a scheduled batch
    wrote with that content) fails the same program as released, in both loops, and passes it
    with the fix."""
    program = CoreProgram(
        CONFIG,
        (
            (ArRequest("A", 7, 1, arrival_time=0.0, priority=1),),
            (ArRequest("B", 1, 2, arrival_time=1.0, priority=0),),
        ),
        ((), ()),
    )
    loop = EngineCoreLoop(CONFIG, async_scheduling=async_scheduling)
    with pytest.raises(EngineCoreViolation) as caught:
        loop.run(program)
    assert caught.value.rule == "cache_hit_written"
    assert (
        "'A' starts from the prefix cache with block 7 as its block 5, but no batch wrote it "
        "(schedule 3 hashed it as block 5 of 'A', scheduling its tokens, and preempted 'A' in "
        "the same call: those tokens never ran)" in caught.value.detail
    ), caught.value.detail
    fixed = EngineCoreLoop(
        CONFIG, async_scheduling=async_scheduling, mutate=apply_preempted_cache_fix
    )
    assert fixed.run(program).reasons == {"A": "length", "B": "length"}


#: Narrowed engine-core programs run per test: 100 take about a second a loop.
NARROWED_PROGRAMS = 100


def _loop_failures(async_scheduling: bool) -> dict[int, EngineCoreViolation]:
    failures = {}
    for seed in range(NARROWED_PROGRAMS):
        try:
            run_loop(same_step_program(seed), async_scheduling=async_scheduling)
        except EngineCoreViolation as err:
            failures[seed] = err
    return failures


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_narrowed_engine_core_programs_reach_the_finding(async_scheduling: bool) -> None:
    """Random engine-core programs narrowed to the finding's shape
    (`integrations.vllm.same_step_programs`) reach it on their own in either loop: some of
    them break `cache_hit_written` as vLLM is released, each naming a request that starts from
    a block hashed for a request preempted in the call that scheduled it (no batch wrote the
    block since, or only another request's content), and no other rule breaks."""
    failures = _loop_failures(async_scheduling)
    mode = "async" if async_scheduling else "sync"
    assert failures, f"none of {NARROWED_PROGRAMS} narrowed programs reached the finding"
    for seed, err in failures.items():
        assert err.rule == "cache_hit_written", (seed, str(err))
        assert err.detail.startswith(f"{mode} loop: "), err.detail
        assert "starts from the prefix cache with block" in err.detail, err.detail
        assert re.search(
            r"\(schedule \d+ hashed it as block \d+ of '(r\d+)', scheduling its tokens, and "
            r"preempted '\1' in the same call: those tokens never ran\)$",
            err.detail,
        ), err.detail


def test_narrowed_engine_core_programs_pass_with_the_fix() -> None:
    """The same narrowed programs with the fix applied to the scheduler of both loops: every
    one passes every rule, in both loops."""
    passing_runs(
        NARROWED_PROGRAMS,
        lambda seed: check_both(
            same_step_program(seed), LoopOptions(fix=apply_preempted_cache_fix)
        ),
        "with the fix: ",
    )


def test_the_preemption_reason_is_given_only_where_a_victim_was_hashed() -> None:
    """A stale hit of another cause (the seeded bug `stale_hash_on_reuse`: a reused block
    stays findable under its old hash) fails `cache_hit_written` without the same-call
    preemption reason."""
    seen = first_violations(
        20,
        lambda seed: check_both(core_program(seed), LoopOptions(mutate=stale_hash_on_reuse)),
        until=RULE,
    )
    assert RULE in seen, seen
    assert "starts from the prefix cache with block" in seen[RULE], seen[RULE]
    assert "hashed it as block" not in seen[RULE], seen[RULE]


def test_the_async_check_script_reports_each_loop_and_takes_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`scripts/vllm_async_check.py --programs-from same-step`: program 1 fails in each loop
    as released, reported per loop (exit 1), each with the command that shrinks it under the
    same options; with `--fix uncache-preempted` every program passes (exit 0). The JSON says
    which programs and which fix."""
    script = load_script("vllm_async_check")
    released, fixed = tmp_path / "released.json", tmp_path / "fixed.json"
    argv = ["--programs", "3", "--programs-from", "same-step"]
    assert script.main([*argv, "--json", str(released)]) == 1
    out = capsys.readouterr().out
    assert "3 same-step programs" in out and "2 pass both loops" in out, out
    for mode in ("sync", "async"):
        assert f"FAIL [cache_hit_written, {mode} loop] 1 programs, first seeds [1]" in out, out
        shrink = (
            f"shrink [cache_hit_written, {mode} loop]: {release_selector()}.venv/bin/python "
            "scripts/vllm_shrink.py "
            f"--seed 1 --loop {mode} --rule cache_hit_written --programs-from same-step"
        )
        assert shrink in out.splitlines(), out
    data = json.loads(released.read_text())
    assert data["programs_from"] == "same-step" and data["fix"] is None
    assert data["failures"]["cache_hit_written, async loop"]["seeds"] == [1]
    assert script.main([*argv, "--fix", "uncache-preempted", "--json", str(fixed)]) == 0
    assert "fix uncache-preempted), 3 pass both loops" in capsys.readouterr().out
    data = json.loads(fixed.read_text())
    assert data["fix"] == "uncache-preempted" and data["failures"] == {}


def test_the_fix_is_an_edit_of_vllms_scheduler() -> None:
    """The fix prints as a patch of vLLM's own `scheduler.py`: one hunk, in the priority
    branch that takes an already scheduled victim out of the step."""
    diff = fix_as_diff()
    assert diff.startswith("--- a/vllm/v1/core/sched/scheduler.py\n")
    assert diff.count("@@ ") == 1
    assert "+                            self.kv_cache_manager.block_pool.evict_blocks(" in diff
    assert " scheduled_running_reqs.remove(preempted_req)" in diff
