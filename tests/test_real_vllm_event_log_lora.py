"""Live vLLM logs with LoRA adapters (`VllmEventLog`; the AR spec's `max_loras`, rule
`lora_slots`): vLLM passes over a waiting request whose adapter finds no room beside the
running requests' and admits those behind it, and keys cached blocks by adapter. The header
declares `max_loras` and each `ar_submitted` its adapter, so generated programs conform (and
fail an admission or cache rule without their adapters), the vllm-v1 twins decide alike,
seeded bugs in vLLM's adapter slots and block hashes are caught; beside a prefill cadence the
spec and the cadence twin follow which requests each pass skipped for their adapter (vLLM's
capacity escape leaves them out), and a vLLM that counts them is caught."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from integrations.patches import EngineFix
from integrations.vllm import MANIFEST, REAL_VLLM, REAL_VLLM_CADENCE_FIXED
from integrations.vllm.adapter import adapter_of
from integrations.vllm.admission_knobs import AdmissionKnobs
from integrations.vllm.cadence_fix import apply_cadence_fix
from integrations.vllm.engine_core import (
    CoreProgram,
    EngineCoreLoop,
    EngineCoreViolation,
    core_program,
)
from integrations.vllm.event_log import VllmEventLog
from integrations.vllm.lora_rules import waits_for_adapter
from integrations.vllm.patches import SCHEDULER_MODULE, ScheduleFix
from integrations.vllm.settings_034 import Vllm034Settings
from properties.ar.conformance import ar_conformance_machine
from properties.ar.trace_check import check_ar_trace
from reference.ar.vllm_settings import VLLM_V1_CADENCE_FIXED
from reference.ar.vllm_v1 import VLLM_V1
from spec.implementation import ArImplementation
from tests.engine_gate import require_engine
from tests.test_ar_lora import run_suite
from tests.test_real_vllm_cache_aware import has_the_setting
from tests.test_twin_settings import check
from tests.tier import depth

PROGRAMS = int(os.environ.get("SCHEDSPEC_VLLM_PROGRAMS", depth(20, 80)))
ADAPTERS = 3  # the programs' requests run adapters 1..3 and the base model in turn
#: Examples of the AR suite with adapters drawn on real vLLM.
SUITE_EXAMPLES = int(os.environ.get("SCHEDSPEC_VLLM_EXAMPLES", depth(40, 150)))
#: What the admission rules say of a log without its adapters: vLLM passed over a request, or
#: left it waiting, that the log says it could admit.
BARE_RULES = ("fcfs_admission", "policy_admission", "admission_progress")


@pytest.fixture(autouse=True)
def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def lora_log(
    program: CoreProgram,
    into: list[str],
    max_loras: int = 1,
    bug: Callable[[Any], None] | None = None,
    **options: Any,
) -> None:
    """The live log of the engine-core loop serving `program` with LoRA adapters (`max_loras`
    at once), into `into`; `bug` planted in the scheduler first. With prefix caching the log
    declares `longest_cache_hit` (every hit vLLM could take is asked of it)."""

    def attach(scheduler: Any) -> None:
        if bug is not None:
            bug(scheduler)
        VllmEventLog(scheduler, into.append, longest_cache_hit=program.config.enable_prefix_caching)

    EngineCoreLoop(
        program.config,
        async_scheduling=False,
        loras=ADAPTERS,
        max_loras=max_loras,
        mutate=attach,
        **options,
    ).run(program)


def lora_programs(count: int, prefix_caching: bool = False) -> Iterator[CoreProgram]:
    """The first `count` generated programs with prefix caching on or off, as asked."""
    seed = 0
    found = 0
    while found < count:
        program = core_program(seed)
        seed += 1
        if program.config.enable_prefix_caching == prefix_caching:
            found += 1
            yield program


def without_adapters(lines: list[str]) -> list[str]:
    """The log as it would read without adapters: no `max_loras`, no `lora`."""
    out = []
    for line in lines:
        data = json.loads(line)
        data.pop("max_loras", None)
        data.pop("lora", None)
        out.append(json.dumps(data))
    return out


def undeclared_progress(lines: list[str]) -> list[str]:
    """The log with its header no longer declaring `admission_progress`: what only a twin
    then finds of a pass that stops early."""
    header = json.loads(lines[0])
    del header["declared_policy"]["admission_progress"]
    return [json.dumps(header), *lines[1:]]


def twin_agrees(lines: list[str], tmp_path: Path, twin: str = "vllm-v1") -> tuple[int, str]:
    """`check-trace LOG --twin TWIN`: its exit code and what it printed."""
    path = tmp_path / "log.jsonl"
    path.write_text("".join(f"{line}\n" for line in lines))
    return check(str(path), "--twin", twin)


@pytest.mark.parametrize("max_loras", [1, 2])
def test_generated_programs_conform_and_decide_as_the_twin(max_loras: int, tmp_path: Path) -> None:
    """Every program's log conforms and the twin decides alike; the log declares the slots
    and the adapters; with one slot, several logs break an admission rule without their
    adapters (vLLM passed over a request whose adapter found no room)."""
    bare_fails = 0
    for program in lora_programs(PROGRAMS):
        lines: list[str] = []
        lora_log(program, lines, max_loras)
        assert json.loads(lines[0])["max_loras"] == max_loras
        assert check_ar_trace(lines).violation is None
        code, said = twin_agrees(lines, tmp_path)
        assert code == 0, said
        bare = check_ar_trace(without_adapters(lines)).violation
        if bare is not None:
            assert bare.rule in BARE_RULES, bare
            bare_fails += 1
    if max_loras == 1:
        assert bare_fails >= 3, bare_fails


def test_prefix_caching_programs_conform_with_the_longest_hit(tmp_path: Path) -> None:
    """With prefix caching (vLLM's default) each log declares `longest_cache_hit` and
    conforms: a request takes every cached block of its prefix under its own adapter, and none
    of another's; vllm-v1-prefix decides alike. Without their adapters several logs fail,
    most at a request that took no hit where another adapter had cached its prefix."""
    bare_rules: Counter[str] = Counter()
    for program in lora_programs(PROGRAMS, prefix_caching=True):
        lines: list[str] = []
        lora_log(program, lines)
        assert check_ar_trace(lines).violation is None
        code, said = twin_agrees(lines, tmp_path, "vllm-v1-prefix")
        assert code == 0, said
        bare = check_ar_trace(without_adapters(lines)).violation
        if bare is not None:
            bare_rules[bare.rule] += 1
    assert bare_rules["cache_hit_longest"] >= 3, bare_rules


def test_blocks_hashed_without_their_adapter_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vLLM that leaves the adapter out of its block hashes shares one adapter's cached
    prefix with another's requests: some generated program's log fails `cache_hit_cached`,
    naming the request that read it."""
    hashing = importlib.import_module("vllm.v1.core.kv_cache_utils")
    monkeypatch.setattr(hashing, "_gen_lora_extra_hash_keys", lambda request: [])
    for program in lora_programs(PROGRAMS, prefix_caching=True):
        lines: list[str] = []
        with contextlib.suppress(EngineCoreViolation):
            lora_log(program, lines)
        found = check_ar_trace(lines).violation
        if found is not None:
            assert found.rule == "cache_hit_cached", found
            assert "caches other content: the same tokens under " in str(found), found
            assert "cached blocks are keyed by adapter" in str(found), found
            return
    pytest.fail("no program's log caught blocks hashed without their adapter")


def more_slots_in_the_pass(sched: Any) -> None:
    """A vLLM that lets its waiting pass admit one adapter more than `max_loras`."""
    original = sched.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        sched.lora_config.max_loras += 1
        try:
            return original(*args, **kwargs)
        finally:
            sched.lora_config.max_loras -= 1

    sched.schedule = schedule


def skips_a_running_adapter(sched: Any) -> None:
    """A vLLM whose pass skips every request with an adapter once the slots are full, its
    adapter running or not."""
    original = sched._handle_blocked_waiting_request

    def handle(request: Any) -> Any:
        running = {adapter_of(r) for r in sched.running} - {0}
        if adapter_of(request) and len(running) >= sched.lora_config.max_loras:
            return False
        return original(request)

    sched._handle_blocked_waiting_request = handle


def requeues_skipped_last(sched: Any) -> None:
    """A vLLM that puts the requests its pass skipped for their adapter back at the tail of
    the queue instead of its head."""
    original = sched.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        limit = sched.lora_config.max_loras
        skipped = [r for r in sched.waiting if waits_for_adapter(sched, r, limit)]
        if skipped and len(skipped) < len(sched.waiting):
            sched.waiting.remove_requests(skipped)
            for request in skipped:
                sched.waiting.add_request(request)
        return out

    sched.schedule = schedule


def stops_at_a_blocked_adapter(sched: Any) -> None:
    """A vLLM whose pass stops at a request whose adapter finds no room instead of skipping
    it (every request after it is skipped too: head-of-line blocking)."""
    original_schedule = sched.schedule
    original_handle = sched._handle_blocked_waiting_request
    stopped = [False]

    def schedule(*args: Any, **kwargs: Any) -> Any:
        stopped[0] = False
        return original_schedule(*args, **kwargs)

    def handle(request: Any) -> Any:
        blocked = waits_for_adapter(sched, request, sched.lora_config.max_loras)
        stopped[0] = stopped[0] or blocked
        return False if stopped[0] else original_handle(request)

    sched.schedule = schedule
    sched._handle_blocked_waiting_request = handle


#: `adapter_skips_not_deferred` as an edit of vLLM's `Scheduler.schedule`.
_ADAPTER_SKIPS_NOT_DEFERRED = ScheduleFix(
    EngineFix(
        "adapter-skips-not-deferred",
        (
            (
                SCHEDULER_MODULE,
                "                    # Scheduling would exceed max_loras, skip.\n"
                "                    skip_request(request_queue)\n",
                "                    # Scheduling would exceed max_loras, skip.\n"
                "                    step_skipped_waiting.appendleft("
                "request_queue.pop_request())\n",
            ),
        ),
        ((SCHEDULER_MODULE, "Scheduler.schedule"),),
        "seeded bug: a request skipped for its LoRA adapter is not deferred",
    )
)


def adapter_skips_not_deferred(sched: Any) -> None:
    """Seeded bug: the waiting pass re-queues a request it skipped for its LoRA adapter
    without adding it to `deferred_waiting`, so the prefill cadence's capacity escape counts
    it as work left waiting and lifts the next hold."""
    _ADAPTER_SKIPS_NOT_DEFERRED.apply(sched)


def test_a_pass_that_stops_at_a_blocked_adapter_is_caught(tmp_path: Path) -> None:
    """vLLM's pass goes on past a request whose adapter finds no room, and the log declares
    it (`admission_progress`): a vLLM that stops there instead fails that rule on several
    programs, naming the request it stopped at, wherever the next request fits whole; the
    twin (which admits the request behind it when it fits at all) finds such steps too, in
    the logs undeclared."""
    by_spec = by_twin = 0
    for program in lora_programs(PROGRAMS):
        lines: list[str] = []
        lora_log(program, lines, bug=stops_at_a_blocked_adapter)
        found = check_ar_trace(lines).violation
        if found is not None:
            assert found.rule == "admission_progress", found
            assert re.search(r"\(past 'r\d+', whose adapter \d finds no room[;)]", str(found)), (
                found
            )
            by_spec += 1
        code, said = twin_agrees(undeclared_progress(lines), tmp_path)
        if code:
            assert "[twin_decisions] against vllm-v1: step " in said, said
            by_twin += 1
    assert by_spec >= 3 and by_twin >= 1, (by_spec, by_twin)


@pytest.mark.parametrize(
    ("bug", "rules"),
    [
        (more_slots_in_the_pass, ("lora_slots",)),
        (skips_a_running_adapter, BARE_RULES),
        (requeues_skipped_last, ("fcfs_admission", "policy_admission")),
    ],
    ids=["more-slots", "skips-a-running-adapter", "requeues-skipped-last"],
)
def test_seeded_adapter_bugs_are_caught(bug: Callable[[Any], None], rules: tuple[str, ...]) -> None:
    """Each seeded bug fails its rule on some generated program's log (the loop's own check
    stops the first at the slot it breaks; the log so far is checked)."""
    for program in lora_programs(PROGRAMS):
        lines: list[str] = []
        with contextlib.suppress(EngineCoreViolation):  # the loop's own check: checked so far
            lora_log(program, lines, bug=bug)
        found = check_ar_trace(lines).violation
        if found is not None:
            assert found.rule in rules, found
            return
    pytest.fail(f"no program's log caught {bug.__name__}")


#: The prefill cadence vLLM runs beside adapters in these tests, and its twin; with the fix of
#: vLLM's empty held step (`lift-empty-hold`, which the loop's own check otherwise stops at on
#: some programs: docs/engines/vllm.md), the twin with that fix.
CADENCE = AdmissionKnobs(prefill_interval=3)
CADENCE_TWIN = "reference.ar.vllm_settings:VLLM_V1_CADENCE"
CADENCE_FIXED_TWIN = "reference.ar.vllm_settings:VLLM_V1_CADENCE_FIXED"
#: Programs (of `lora_programs`, prefix caching off) whose logs, served with one adapter slot
#: beside the cadence, fail `prefill_cadence` under `adapter_skips_not_deferred`: 14 of the
#: first 100, on 0.33.0 and 0.34.0 alike (these are the first five).
UNDEFERRED_SEEDS = (7, 19, 29, 34, 41)


@pytest.mark.parametrize("max_loras", [1, 2])
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["plain", "prefix"])
def test_adapters_beside_a_cadence_conform_and_decide_as_the_twin(
    max_loras: int, prefix_caching: bool, tmp_path: Path
) -> None:
    """Beside a prefill cadence (interval 3), vLLM's capacity escape leaves out the requests
    its pass skipped for their adapter (`deferred_waiting`); the spec and the cadence twin
    follow which requests each pass reached. With the fix of vLLM's empty held step, every
    program's log conforms and the twin with that fix decides alike."""
    for program in lora_programs(PROGRAMS, prefix_caching):
        lines: list[str] = []
        lora_log(program, lines, max_loras, bug=apply_cadence_fix, admission=CADENCE)
        header = json.loads(lines[0])
        assert header["max_loras"] == max_loras
        assert header["declared_policy"]["prefill_interval"] == 3
        assert check_ar_trace(lines).violation is None
        code, said = twin_agrees(lines, tmp_path, CADENCE_FIXED_TWIN)
        assert code == 0, said


@pytest.mark.parametrize("seed", UNDEFERRED_SEEDS)
def test_a_request_skipped_for_its_adapter_but_not_deferred_is_caught(
    seed: int, tmp_path: Path
) -> None:
    """The seeded `adapter_skips_not_deferred` (the pass re-queues a request it skipped for
    its adapter without deferring it) lets the capacity escape lift a hold vLLM keeps: the
    log fails `prefill_cadence`, naming the deferred request the escape left out, and the
    twin differs; released vLLM conforms on the same program, and `--twin vllm-v1`, rebuilt
    with the cadence the log declares, decides alike."""
    program = list(lora_programs(seed + 1))[seed]
    lines: list[str] = []
    lora_log(program, lines, admission=CADENCE)
    assert check_ar_trace(lines).violation is None
    code, said = twin_agrees(lines, tmp_path)
    assert code == 0, said
    lines = []
    with contextlib.suppress(EngineCoreViolation):  # the loop's own cadence check, too
        lora_log(program, lines, bug=adapter_skips_not_deferred, admission=CADENCE)
    found = check_ar_trace(lines).violation
    assert found is not None and found.rule == "prefill_cadence", found
    assert "(skipped for its adapter)" in str(found), found
    assert twin_agrees(lines, tmp_path, CADENCE_TWIN)[0] == 1


def tally_lora_logs(count: int, max_loras: int, prefix_caching: bool = False) -> dict[str, int]:
    """For the by-hand runs of docs/engines/vllm.md: over the first `count` programs with
    prefix caching on or off, served with LoRA adapters (`max_loras` at once), how many logs
    conform, how many the twin (vllm-v1, or vllm-v1-prefix) decides alike, and by which rule
    the logs without their adapters fail."""
    tally: Counter[str] = Counter()
    twin = "vllm-v1-prefix" if prefix_caching else "vllm-v1"
    with tempfile.TemporaryDirectory() as scratch:
        for program in lora_programs(count, prefix_caching):
            lines: list[str] = []
            lora_log(program, lines, max_loras)
            found = check_ar_trace(lines).violation
            tally["conform" if found is None else f"violation: {found.rule}"] += 1
            code, _ = twin_agrees(lines, Path(scratch), twin)
            tally["twin decides alike" if code == 0 else f"twin exit {code}"] += 1
            bare = check_ar_trace(without_adapters(lines)).violation
            tally["without adapters: " + ("conform" if bare is None else bare.rule)] += 1
    return dict(tally)


def tally_cadence_logs(count: int, max_loras: int, prefix_caching: bool = False) -> dict[str, int]:
    """For the by-hand runs of docs/engines/vllm.md: over the first `count` programs with
    prefix caching on or off, served with LoRA adapters (`max_loras` at once) beside the
    prefill cadence (`CADENCE`): released vLLM, whose loop's own check may stop a run at the
    empty held step (a known finding; the log so far is checked), then vLLM with that
    finding's fix: how many logs conform and how many the cadence twin (with the fix, for
    the second) decides alike; then the same programs under the seeded
    `adapter_skips_not_deferred`: by which rule their logs fail, and how often the twin
    differs."""
    tally: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as scratch:
        for program in lora_programs(count, prefix_caching):
            lines: list[str] = []
            try:
                lora_log(program, lines, max_loras, admission=CADENCE)
            except EngineCoreViolation as stopped:
                tally[f"released: stopped by the loop's {stopped.rule}"] += 1
            found = check_ar_trace(lines).violation
            tally["released: " + ("conform" if found is None else found.rule)] += 1
            code, _ = twin_agrees(lines, Path(scratch), CADENCE_TWIN)
            tally["released: twin decides alike" if code == 0 else f"twin exit {code}"] += 1
            lines = []
            lora_log(program, lines, max_loras, bug=apply_cadence_fix, admission=CADENCE)
            found = check_ar_trace(lines).violation
            tally["fixed: " + ("conform" if found is None else found.rule)] += 1
            code, _ = twin_agrees(lines, Path(scratch), CADENCE_FIXED_TWIN)
            tally["fixed: twin decides alike" if code == 0 else f"fixed: twin exit {code}"] += 1
            lines = []
            with contextlib.suppress(EngineCoreViolation):
                lora_log(
                    program, lines, max_loras, bug=adapter_skips_not_deferred, admission=CADENCE
                )
            found = check_ar_trace(lines).violation
            tally["seeded: " + ("conform" if found is None else found.rule)] += 1
            code, _ = twin_agrees(lines, Path(scratch), CADENCE_TWIN)
            tally["seeded: twin differs" if code == 1 else f"seeded: twin exit {code}"] += 1
    return dict(tally)


@pytest.mark.parametrize(
    ("target", "twin"),
    [(REAL_VLLM, VLLM_V1), (REAL_VLLM_CADENCE_FIXED, VLLM_V1_CADENCE_FIXED)],
    ids=["real-vllm", "cadence"],
)
def test_the_suite_with_adapters_passes_on_real_vllm_beside_its_twin(
    target: ArImplementation, twin: ArImplementation
) -> None:
    """The AR suite draws adapter slots and each request's adapter (`loras=True`) for
    real-vllm, whose adapter hands them to vLLM (`LoRAConfig(max_loras)`, a `LoRARequest` per
    request): every example conforms, `lora_slots` and `admission_progress` included, and the
    vllm-v1 twin decides alike; so with vLLM's prefill cadence (with the fix of its empty
    held step), whose capacity escape leaves out the requests skipped for their adapter."""
    machine = ar_conformance_machine(
        target.factory,
        profile=target.profile,
        loras=True,
        twin=twin.factory,
        twin_policy=twin.profile.policy,
    )
    assert run_suite(machine, SUITE_EXAMPLES) is None


def test_the_cache_aware_window_ranks_by_each_adapters_hits(tmp_path: Path) -> None:
    """vLLM 0.34.0's cache-aware window (3, threshold 0) ranks waiting requests by the hit
    each would take under its own adapter, as the spec's window does: the logs of
    prefix-caching programs with adapters conform and the window twin, rebuilt with the log's
    threshold, decides alike. On 0.33.0, which has no window, the setting is refused."""
    if not has_the_setting():
        return
    window = Vllm034Settings(cache_aware_window=3, cache_aware_threshold=0.0)
    declared = 0
    for program in lora_programs(PROGRAMS, prefix_caching=True):
        lines: list[str] = []
        lora_log(program, lines, settings_034=window)
        assert check_ar_trace(lines).violation is None
        code, said = twin_agrees(lines, tmp_path, "reference.ar.vllm_settings:VLLM_V1_CACHE_AWARE")
        assert code == 0, said
        declared += '"cache_aware_window": 3' in lines[0]
    assert declared >= PROGRAMS // 3, declared
