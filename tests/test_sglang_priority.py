"""SGLang 0.5.23's dLLM path under priority scheduling (`real-sglang-dllm-priority`).

The engine is SGLang's real scheduler path (integrations/sglang/engine.py says what is stubbed)
built with `--enable-priority-scheduling --schedule-low-priority-values-first` (lower values
first, the spec's `DllmPolicy.priority_order`; priority preemption off, see below). The finding
here is a regression test as in tests/test_real_sglang.py: it FAILS with its rule on the real
code and PASSES with SGLang's file edited the way its fix would go (`priority-window`,
`integrations.sglang.fixes`).

SGLang must be installed (`schedspec install-engines sglang`); see tests/test_real_sglang.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integrations.patches import module_file
from integrations.sglang import (
    REAL_SGLANG_DLLM,
    REAL_SGLANG_DLLM_PRIORITY,
    SGLANG_DLLM_PRIORITY_PROFILE,
    SGLANG_DLLM_PROFILE,
    fixes,
)
from integrations.sglang.adapter import SglangDllmAdapter
from integrations.sglang.engine import build, import_engine, new_request, queue_request
from integrations.sglang.event_log import SglangEventLog
from integrations.sglang.event_loop import serve
from integrations.sglang.fixes import FIX_NAMES, SGLANG_FIXES, sglang_fixed
from properties.conformance import conformance_machine
from properties.decisions import DecisionTwin, twin_difference
from properties.harness import Harness
from properties.trace_check import check_trace
from reference.sglang_dllm import SGLANG_DLLM_ORDER_PRIORITY, SGLANG_ORDER_PRIORITY_TWIN
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SchedSpecError, SpecViolation
from spec.events import Admitted, ControlReturned, Event, Submitted
from spec.implementation import DllmImplementation
from spec.profile import DllmProfile
from tests.patch_check import git_apply_to_copies
from tests.test_real_sglang import (  # the module's fixture, and its suite settings
    FINDINGS,
    _roomy_configs,
    _run_suite,
    drive,
    sglang_installed,  # noqa: F401
)
from tests.tier import depth

PROFILE = REAL_SGLANG_DLLM_PRIORITY.profile
WINDOW = ["priority-window"]


def _config(**changes: Any) -> DllmConfig:
    """Two seats and rows, block = page = 2, a roomy pool (inside the declared space): the
    inversion finding's configuration (`scripts/sglang_findings.py`), with `changes`."""
    config: DllmConfig = FINDINGS["priority-window"].config
    return config.replace(**changes)


def _admitted(events: list[Event]) -> list[str]:
    return [e.request_id for e in events if isinstance(e, Admitted)]


# ---------------------------------------------------------------------------------- basics
def test_the_priority_variant_declares_sglangs_profile_with_priority_order() -> None:
    declared = dataclasses.replace(
        SGLANG_DLLM_PROFILE,
        policy=dataclasses.replace(SGLANG_DLLM_PROFILE.policy, priority_order=True),
    )
    assert declared == PROFILE
    assert PROFILE is SGLANG_DLLM_PRIORITY_PROFILE
    assert SGLANG_DLLM_ORDER_PRIORITY.profile.policy.priority_order
    engine = SglangDllmAdapter(_config(), lambda e: None, priority=True).engine.scheduler
    assert engine.enable_priority_scheduling and not engine.enable_priority_preemption
    assert engine.policy.enable_priority_scheduling and engine.policy.priority_sign == 1


def test_one_seat_serves_lower_priority_values_first_ties_in_submission_order() -> None:
    """One seat: SGLang sorts its waiting queue by (priority, entry time) before each round, so
    `b` and `c` (0) go first, in submission order, then `d` (1), then `a` (2). Every
    `Submitted` carries the request's priority; the FCFS engine logs it too, and ignores it."""
    config = _config(req_pool_rows=1, max_running_requests=1)
    requests = [
        RequestSpec("a", (1,), 2, priority=2),
        RequestSpec("b", (1,), 2),
        RequestSpec("c", (1,), 2),
        RequestSpec("d", (1,), 2, priority=1),
    ]
    for impl, order in ((REAL_SGLANG_DLLM_PRIORITY, "bcda"), (REAL_SGLANG_DLLM, "abcd")):
        h = Harness(impl.factory, config, profile=impl.profile)
        for request in requests:
            h.submit(request)
        h.drain()
        assert _admitted(h.events) == list(order), impl.description
        submitted = {e.request_id: e.priority for e in h.events if isinstance(e, Submitted)}
        assert submitted == {"a": 2, "b": 0, "c": 0, "d": 1}


# ---------------------------------------------------------------------------------- the finding
def _inversion(h: Harness) -> Harness:
    """`p` (a whole prompt block) and `d` (a one-token prompt), both of priority 1: SGLang moves
    both into its dLLM manager and forms a prefill batch of `p`; `d` waits there. Then `c`
    (priority 0) arrives: one seat is left, and the spec gives it to `c`."""
    drive(h, FINDINGS["priority-window"].ops)  # scripts/sglang_findings.py's program
    return h


def test_finding_a_fetched_request_keeps_its_place_against_a_higher_priority_arrival() -> None:
    """Found by `verify --impl real-sglang-dllm-priority` (2026-11-29), shrunk by hand: a
    priority inversion. `_fetch_waiting_reqs` moved `d` into the dLLM manager in round 0 and
    nothing moves it back; `calc_priority` sorts only the waiting queue, so in round 1 `c`,
    sorted ahead of `d` by the spec's order and SGLang's own, is not even fetched (the manager
    is full: `p` and `d`) and `d` takes the last seat. The fix `priority-window` sorts the
    fetched but never admitted requests again with later arrivals; then `c` gets the seat and
    SGLang decides as its twin `sglang-dllm-order-priority`."""
    assert_the_window_keeps_d_and_the_fix_decides_as_the_twin(
        _inversion,
        REAL_SGLANG_DLLM_PRIORITY,
        SGLANG_ORDER_PRIORITY_TWIN,
        SGLANG_DLLM_ORDER_PRIORITY.profile,
        "(c: priority 0, d: priority 1)",
    )


def assert_the_window_keeps_d_and_the_fix_decides_as_the_twin(
    inversion: Callable[[Harness], Harness],
    impl: DllmImplementation,
    twin: DecisionTwin,
    twin_profile: DllmProfile,
    keys: str,
) -> None:
    """The sticky-window finding under one queue order: `inversion` (`p` and `d` fetched,
    then `c`, ordered ahead of `d`) run on `impl` in `_config()`, inside its declared space,
    breaks `fcfs_admission` with `d` admitted while `c` heads the queue, the message naming
    both requests' `keys`; with `priority-window` it admits `p, c, d` and decides as `twin`."""
    config = _config()
    assert impl.profile.space.outside(config) is None  # inside the declared space
    with pytest.raises(SpecViolation) as info:
        inversion(Harness(impl.factory, config, profile=impl.profile))
    v = info.value
    assert v.rule == "fcfs_admission", v
    assert "admitted 'd' while 'c' is ahead of it (queue ['c', 'd'])" in str(v), v
    assert keys in str(v), v
    with sglang_fixed(WINDOW):
        h = inversion(Harness(impl.factory, config, profile=impl.profile))
    assert _admitted(h.events) == ["p", "c", "d"]
    assert twin_difference(h.events, config, twin, twin_profile) is None


def test_the_suite_passes_under_priority_with_the_fix_and_decides_as_its_twin() -> None:
    """With `priority-window`, SGLang under priority scheduling passes the dLLM suite inside
    its declared space (priorities 0..2 drawn), and every example decides as its twin
    (`sglang-dllm-order-priority`: the window is the head of the priority order every
    round)."""
    machine = conformance_machine(
        REAL_SGLANG_DLLM_PRIORITY.factory,
        profile=PROFILE,
        configs=_roomy_configs(),
        parity="always",
        name="PriorityWindow",
        twin=SGLANG_ORDER_PRIORITY_TWIN,
        twin_profile=SGLANG_DLLM_ORDER_PRIORITY.profile,
    )
    with sglang_fixed(WINDOW):
        _run_suite(machine)


def test_the_fixed_priority_path_passes_with_its_twin_through_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`schedspec verify --impl real-sglang-dllm-priority --twin sglang-dllm-order-priority` in a
    process running SGLang with `priority-window` (what docs/engines/sglang.md runs for 5000
    examples)."""
    from schedspec_cli.main import main

    argv = ["verify", "--impl", "real-sglang-dllm-priority", "--twin", "sglang-dllm-order-priority"]
    with sglang_fixed(WINDOW):
        assert main([*argv, "--examples", str(depth(20, 40))]) == 0, capsys.readouterr().out
    assert "PASS" in capsys.readouterr().out


# ---------------------------------------------------------------------------------- the fix
def _program(seed: int, tight: bool = False) -> tuple[DllmConfig, list[tuple[str, Any]]]:
    """A configuration (inside the declared space, or with `tight` a pool of a few pages) and
    submissions with priorities 0..2, aborts and rounds."""
    rng = random.Random(seed)
    b, seats = rng.choice([1, 2, 4]), rng.randrange(1, 4)
    mode = rng.choice([Mode.SYNC, Mode.FDFO])
    config = DllmConfig(
        block_size=b,
        page_size=b,
        kv_pages=1,
        req_pool_rows=seats,
        max_running_requests=seats,
        max_context=6 * b,
        mode=mode,
        in_place_reuse=mode is Mode.FDFO,
    )
    least = SGLANG_DLLM_PROFILE.space.min_kv_pages(config)
    kv_pages = rng.randrange(2, 12) * seats + 2 if tight else least + rng.randrange(0, 6)
    ops: list[tuple[str, Any]] = []
    n = 0
    for _ in range(rng.randrange(3, 15)):
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            prompt = (0,) * rng.randrange(1, 3 * b)
            new = rng.randrange(1, 3 * b)
            ops.append(("submit", RequestSpec(f"r{n}", prompt, new, priority=rng.randrange(3))))
            n += 1
        if rng.random() < 0.1:
            ops.append(("abort", rng.randrange(n) if n else 0))
        ops.append(("round", None))
    return config.replace(kv_pages=kv_pages), ops


def _events(
    config: DllmConfig,
    ops: list[tuple[str, Any]],
    mutate: Callable[[Any], None] | None = None,
    *,
    priority: bool = True,
) -> list[object]:
    """Run `ops` on SGLang (under priority scheduling unless `priority` is False; `mutate`
    changes its scheduler first) and drain: the events, and how it ended if it raised."""
    events: list[object] = []
    adapter = SglangDllmAdapter(config, events.append, priority=priority)
    if mutate is not None:
        mutate(adapter.engine.scheduler)
    try:
        for op, arg in ops:
            if op == "submit":
                # one too long for the context is refused, as the spec refuses it
                with contextlib.suppress(SchedSpecError):
                    adapter.submit(arg)
            elif op == "abort" and f"r{arg}" in adapter.live:
                adapter.abort(f"r{arg}")
            elif op == "round":
                adapter.run_round()
        adapter.drain(2_000)
    except Exception as err:  # an engine error ends both runs alike, or they differ
        events.append((type(err).__name__, str(err)[:80]))
    return events


def test_the_fix_changes_nothing_under_fcfs() -> None:
    """`priority-window` acts only under priority scheduling: on FCFS SGLang (which ignores
    the priorities), as released or with the five fixes, the same programs give the same events
    with and without it."""
    for seed in range(20):
        config, ops = _program(seed)
        released = _events(config, ops, priority=False)
        with sglang_fixed(WINDOW):
            assert _events(config, ops, priority=False) == released, seed
        with sglang_fixed(FIX_NAMES):
            fixed = _events(config, ops, priority=False)
        with sglang_fixed([*FIX_NAMES, *WINDOW]):
            assert _events(config, ops, priority=False) == fixed, seed


def test_the_fix_is_a_patch_of_sglangs_mixin(tmp_path: Path) -> None:
    """`scripts/engine_fixes_diff.py sglang --fix priority-window`: one patch of
    dllm/mixin/scheduler.py that `git apply -p1` makes into the file the tests run, adding
    lines only; with the five it composes (their edits and its own are all made)."""
    diff = SGLANG_FIXES.as_diff(WINDOW)
    sources = SGLANG_FIXES.fixed_sources(WINDOW)
    assert set(sources) == {fixes.MIXIN}
    assert git_apply_to_copies(tmp_path, sources, diff) == {
        module: fixed for module, (_, fixed) in sources.items()
    }
    compile(sources[fixes.MIXIN][1], module_file(fixes.MIXIN), "exec")
    assert not [
        line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")
    ]
    every = SGLANG_FIXES.fixed_sources([*FIX_NAMES, *WINDOW])[fixes.MIXIN][1]
    assert "pop_unadmitted_reqs" in every and "_dllm_decode_fallback_reqs" in every


# ---------------------------------------------------------------------------------- preemption
def _preempting(scheduler: Any) -> None:
    """`--enable-priority-scheduling` without `--disable-priority-preemption` (SGLang's
    default), preempting at any priority difference."""
    scheduler.enable_priority_preemption = True
    scheduler.priority_scheduling_preemption_threshold = 0


def test_priority_preemption_never_preempts_on_the_dllm_path() -> None:
    """Why `real-sglang-dllm-priority` leaves priority preemption off: on the dLLM path it
    preempts nothing (`PrefillAdder.preempt_to_schedule` looks only at `running_batch`, which
    the dLLM path leaves empty), and its other effect, clearing `batch_is_full` every round,
    changes no decision inside the declared space or with the five fixes: the same events on
    the same programs. Only as released below the headroom does that reset admit a request
    earlier (one refused for KV re-enters as staging a round sooner, the ragged-row finding's
    path): program 97 of the tight ones."""
    for seed in range(20):
        config, ops = _program(seed)
        assert _events(config, ops) == _events(config, ops, _preempting), seed
    with sglang_fixed([*FIX_NAMES, *WINDOW]):
        for seed in range(20):
            config, ops = _program(seed, tight=True)
            assert _events(config, ops) == _events(config, ops, _preempting), seed
    config, ops = _program(97, tight=True)
    assert _events(config, ops) != _events(config, ops, _preempting)


# ---------------------------------------------------------------------------------- a live log
def _serve_inversion(low_first: bool) -> list[str]:
    """The finding's program served by SGLang's own loop with `SglangEventLog` attached; with
    `low_first` False the scheduler serves higher values first (SGLang's default) and gets the
    priorities negated, so it decides as the low-first one does."""
    config = _config()
    spec_id: dict[int, str] = {}
    engine = build(config, spec_id, priority=True)
    if not low_first:
        m = import_engine()
        s = engine.scheduler
        s.policy = m["SchedulePolicy"]("fcfs", engine.tree_cache, False, True, False)
        s.schedule_low_priority_values_first = False
    sign = 1 if low_first else -1
    lines: list[str] = []
    SglangEventLog(engine.scheduler, lines.append, worker=engine.worker)
    ticks = iter(
        [
            [RequestSpec("p", (0, 0), 1, priority=1), RequestSpec("d", (0,), 1, priority=1)],
            [RequestSpec("c", (0,), 1, priority=0)],
        ]
    )

    def ingest(engine: Any) -> bool:
        tick = next(ticks, None)
        for request in tick or ():
            req = new_request(engine, request.request_id, request.prompt, 1)
            req.priority = sign * request.priority
            spec_id[id(req)] = request.request_id
            queue_request(engine, req)
        return tick is not None

    serve(engine, ingest, max_iterations=100)
    return lines


@pytest.mark.parametrize("low_first", [True, False])
def test_a_live_log_under_priority_scheduling_shows_the_inversion(low_first: bool) -> None:
    """A live SGLang scheduler with priority scheduling writes a log whose header declares
    `priority_order` and whose `Submitted` lines carry the priorities in the spec's order
    (negated for a scheduler that serves higher values first); `check-trace` finds the
    inversion in it, and with `priority-window` the log checks and decides as its twin."""
    lines = _serve_inversion(low_first)
    header = json.loads(lines[0])
    assert header["declared_policy"]["priority_order"] is True, header
    result = check_trace(lines)
    assert not result.ok and result.violation is not None
    assert result.violation.rule == "fcfs_admission", result.violation
    assert "admitted 'd' while 'c' is ahead of it" in str(result.violation)
    with sglang_fixed(WINDOW):
        lines = _serve_inversion(low_first)
    kept: list[Event] = []
    result = check_trace(lines, keep=kept)
    assert result.ok, (result.line, result.violation)
    assert {e.request_id: e.priority for e in kept if isinstance(e, Submitted)} == {
        "p": 1,
        "d": 1,
        "c": 0,
    }
    twin_profile: DllmProfile = SGLANG_DLLM_ORDER_PRIORITY.profile
    assert (
        twin_difference(kept, _config(), SGLANG_ORDER_PRIORITY_TWIN, twin_profile, subject="log")
        is None
    )
    assert any(isinstance(e, ControlReturned) for e in kept)
