"""SGLang 0.5.23's dLLM path under `--schedule-policy lof` (`real-sglang-dllm-lof`).

The engine is SGLang's real scheduler path (integrations/sglang/engine.py says what is stubbed)
built with `SchedulePolicy("lof", ...)`: `calc_priority` sorts the waiting queue by
`max_new_tokens`, longest first, before every round (a stable sort: ties keep submission
order), the spec's `DllmPolicy.longest_output_first`; with `--enable-priority-scheduling` too
(`real-sglang-dllm-priority-lof`) by (priority, -max_new_tokens). The finding here is a
regression test as in tests/test_sglang_priority.py: it FAILS with its rule on the real code
and PASSES with SGLang's file edited the way its fix would go (`priority-window`, which covers
any order `calc_priority` applies; `integrations.sglang.fixes`).

SGLang must be installed (`schedspec install-engines sglang`); see tests/test_real_sglang.py
(SCHEDSPEC_SKIP_ENGINES=1 skips these tests).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from integrations.sglang import (
    REAL_SGLANG_DLLM,
    REAL_SGLANG_DLLM_LOF,
    REAL_SGLANG_DLLM_PRIORITY_LOF,
    SGLANG_DLLM_LOF_PROFILE,
    SGLANG_DLLM_PRIORITY_LOF_PROFILE,
    SGLANG_DLLM_PROFILE,
)
from integrations.sglang.adapter import SglangDllmAdapter
from integrations.sglang.engine import build, new_request, queue_request
from integrations.sglang.event_log import SglangEventLog, declared_policy
from integrations.sglang.event_loop import serve
from integrations.sglang.fixes import SGLANG_FIXES, sglang_fixed
from properties.conformance import conformance_machine
from properties.decisions import twin_difference
from properties.harness import Harness
from properties.trace_check import check_trace
from reference.sglang_dllm import (
    SGLANG_DLLM_ORDER_LOF,
    SGLANG_DLLM_ORDER_PRIORITY_LOF,
    SGLANG_ORDER_LOF_TWIN,
    SGLANG_ORDER_PRIORITY_LOF_TWIN,
)
from spec.config import RequestSpec
from spec.events import ControlReturned, Event
from tests.test_real_sglang import (  # the module's fixture, and its suite settings
    _roomy_configs,
    _run_suite,
    sglang_installed,  # noqa: F401
)
from tests.test_sglang_priority import (  # the same small configuration and finding check
    _admitted,
    _config,
    assert_the_window_keeps_d_and_the_fix_decides_as_the_twin,
)

PROFILE = REAL_SGLANG_DLLM_LOF.profile
WINDOW = ["priority-window"]


# ---------------------------------------------------------------------------------- basics
def test_a_log_declares_only_the_order_calc_priority_applies_on_the_dllm_path() -> None:
    """Under routing-key `calc_priority` sorts nothing on the dLLM path (no running batch is
    passed), priority scheduling included, so the log declares FCFS; a random order is declared
    free (`free_queue_order`), and priority scheduling, which reads only fcfs and lof, is off."""
    from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy

    s = SglangDllmAdapter(_config(), lambda e: None, priority=True).engine.scheduler
    assert declared_policy(s).priority_order
    s.policy.policy = CacheAgnosticPolicy.ROUTING_KEY
    assert declared_policy(s) == SGLANG_DLLM_PROFILE.policy
    s.policy.policy = CacheAgnosticPolicy.RANDOM
    assert declared_policy(s) == dataclasses.replace(
        SGLANG_DLLM_PROFILE.policy, free_queue_order=True
    )
    adapter = SglangDllmAdapter(_config(), lambda e: None, schedule_policy="random")
    log = SglangEventLog(adapter.engine.scheduler, lambda line: None, worker=adapter.engine.worker)
    assert log.policy.free_queue_order


def test_the_lof_variants_declare_sglangs_profile_with_longest_output_first() -> None:
    """`real-sglang-dllm-lof` is SGLang's profile with `longest_output_first`, and
    `real-sglang-dllm-priority-lof` with `priority_order` too; the engines run SGLang's own
    `CacheAgnosticPolicy.LOF` (which `_validate_and_adjust_policy` keeps with our tree cache),
    with priority scheduling only in the second."""
    policy = SGLANG_DLLM_PROFILE.policy
    lof = dataclasses.replace(policy, longest_output_first=True)
    assert dataclasses.replace(SGLANG_DLLM_PROFILE, policy=lof) == PROFILE
    assert PROFILE is SGLANG_DLLM_LOF_PROFILE
    both = dataclasses.replace(lof, priority_order=True)
    assert REAL_SGLANG_DLLM_PRIORITY_LOF.profile is SGLANG_DLLM_PRIORITY_LOF_PROFILE
    assert SGLANG_DLLM_PRIORITY_LOF_PROFILE.policy == both
    assert SGLANG_DLLM_ORDER_LOF.profile.policy.longest_output_first
    assert not SGLANG_DLLM_ORDER_LOF.profile.policy.priority_order
    assert SGLANG_DLLM_ORDER_PRIORITY_LOF.profile.policy.orders_queue
    for priority in (False, True):
        adapter = SglangDllmAdapter(_config(), lambda e: None, priority=priority, lof=True)
        s = adapter.engine.scheduler
        assert s.policy.policy.value == "lof"
        assert s.enable_priority_scheduling is priority
        assert s.policy.enable_priority_scheduling is priority
        assert declared_policy(s) == (both if priority else lof)
    plain = SglangDllmAdapter(_config(), lambda e: None).engine.scheduler
    assert plain.policy.policy.value == "fcfs" and declared_policy(plain) == policy


def test_one_seat_serves_the_longest_output_first_ties_in_submission_order() -> None:
    """One seat: SGLang sorts its waiting queue by `-max_new_tokens` before each round, a stable
    sort, so `b` and `c` (3 new tokens) go first, in submission order, then `d` (2), then `a`
    (1). The FCFS engine serves them as submitted. With priority scheduling too, the priority
    comes first: `d` and `a` (priority 0) before `b` and `c` (1), each pair longest first."""
    config = _config(req_pool_rows=1, max_running_requests=1)
    requests = [
        RequestSpec("a", (1,), 1),
        RequestSpec("b", (1,), 3, priority=1),
        RequestSpec("c", (1,), 3, priority=1),
        RequestSpec("d", (1,), 2),
    ]
    impls = (
        (REAL_SGLANG_DLLM_LOF, "bcda"),
        (REAL_SGLANG_DLLM_PRIORITY_LOF, "dabc"),
        (REAL_SGLANG_DLLM, "abcd"),
    )
    for impl, order in impls:
        h = Harness(impl.factory, config, profile=impl.profile)
        for request in requests:
            h.submit(request)
        h.drain()
        assert _admitted(h.events) == list(order), impl.description


# ---------------------------------------------------------------------------------- the finding
def _inversion(h: Harness, new_tokens: int = 2) -> Harness:
    """`p` (a whole prompt block) and `d` (a one-token prompt), each with one new token: SGLang
    moves both into its dLLM manager and forms a prefill batch of `p`; `d` waits there. Then
    `c` (one token, `new_tokens` new) arrives: one seat is left, and under lof the spec gives
    it to `c` when `c`'s output is longer than `d`'s, to `d` when they tie."""
    h.submit(RequestSpec("p", (0, 0), 1))
    h.submit(RequestSpec("d", (0,), 1))
    h.round()
    h.submit(RequestSpec("c", (0,), new_tokens))
    h.round()
    h.drain()
    return h


def test_finding_a_fetched_request_keeps_its_place_against_a_longer_output_arrival() -> None:
    """Found by `verify --impl real-sglang-dllm-lof` (2026-11-29), shrunk by hand: the priority
    finding's sticky window under lof. `_fetch_waiting_reqs` moved `d` into the dLLM manager
    in round 0 and nothing moves it back; `calc_priority` sorts only the waiting queue, so in
    round 1 `c` (2 new tokens), sorted ahead of `d` (1) by the spec's order and SGLang's own,
    is not even fetched (the manager is full: `p` and `d`) and `d` takes the last seat. The
    fix `priority-window` sorts the fetched but never admitted requests again with later
    arrivals under any order `calc_priority` applies; then `c` gets the seat and SGLang
    decides as its twin `sglang-dllm-order-lof`."""
    assert_the_window_keeps_d_and_the_fix_decides_as_the_twin(
        _inversion,
        REAL_SGLANG_DLLM_LOF,
        SGLANG_ORDER_LOF_TWIN,
        SGLANG_DLLM_ORDER_LOF.profile,
        "(c: max_new_tokens 2, d: max_new_tokens 1)",
    )


def test_the_fix_keeps_ties_in_submission_order() -> None:
    """The same program with `c` asking as many tokens as `d`: `d`, submitted first, keeps the
    seat, as released and with the fix. The fix puts the requests it takes back from the
    manager at the head of the waiting queue, where they were: put at the tail (the fix's
    first version), `d` would follow `c` into lof's stable sort and lose the tie
    (fcfs_admission, "admitted 'c' while 'd' is ahead of it")."""
    config = _config()
    for fixed in ([], WINDOW):
        with sglang_fixed(fixed):
            h = _inversion(Harness(REAL_SGLANG_DLLM_LOF.factory, config, profile=PROFILE), 1)
        assert _admitted(h.events) == ["p", "d", "c"], fixed
        twin_profile = SGLANG_DLLM_ORDER_LOF.profile
        assert twin_difference(h.events, config, SGLANG_ORDER_LOF_TWIN, twin_profile) is None


def test_the_finding_holds_with_priority_scheduling_too_and_the_fix_covers_it() -> None:
    """With priority scheduling as well (all priorities equal), the same inversion, and the
    same fix: then SGLang decides as `sglang-dllm-order-priority-lof`."""
    assert_the_window_keeps_d_and_the_fix_decides_as_the_twin(
        _inversion,
        REAL_SGLANG_DLLM_PRIORITY_LOF,
        SGLANG_ORDER_PRIORITY_LOF_TWIN,
        SGLANG_DLLM_ORDER_PRIORITY_LOF.profile,
        "(c: priority 0 max_new_tokens 2, d: priority 0 max_new_tokens 1)",
    )


def test_the_suite_passes_under_lof_with_the_fix_and_decides_as_its_twin() -> None:
    """With `priority-window`, SGLang under lof passes the dLLM suite inside its declared space,
    and every example decides as its twin (`sglang-dllm-order-lof`: the window is the head of
    the longest-output order every round)."""
    machine = conformance_machine(
        REAL_SGLANG_DLLM_LOF.factory,
        profile=PROFILE,
        configs=_roomy_configs(),
        parity="always",
        name="LofWindow",
        twin=SGLANG_ORDER_LOF_TWIN,
        twin_profile=SGLANG_DLLM_ORDER_LOF.profile,
    )
    with sglang_fixed(WINDOW):
        _run_suite(machine)


def test_the_fix_acts_under_any_queue_order_calc_priority_applies() -> None:
    """The fix's guard: it takes unadmitted requests back whenever the queue has an order of
    its own (priority scheduling, or a schedule policy other than FCFS), not under FCFS."""
    mixin = SGLANG_FIXES.fixed_sources(WINDOW)
    (text,) = (fixed for _, fixed in mixin.values())
    guard = 'if self.enable_priority_scheduling or self.policy.policy.value != "fcfs":'
    assert guard in text
    assert "self.waiting_queue[:0] = self.dllm_manager.pop_unadmitted_reqs()" in text


# ---------------------------------------------------------------------------------- a live log
def _serve_inversion() -> list[str]:
    """The finding's program served by SGLang's own loop under lof, `SglangEventLog` attached."""
    config = _config()
    spec_id: dict[int, str] = {}
    engine = build(config, spec_id, lof=True)
    lines: list[str] = []
    SglangEventLog(engine.scheduler, lines.append, worker=engine.worker)
    ticks = iter(
        [
            [RequestSpec("p", (0, 0), 1), RequestSpec("d", (0,), 1)],
            [RequestSpec("c", (0,), 2)],
        ]
    )

    def ingest(engine: Any) -> bool:
        tick = next(ticks, None)
        for request in tick or ():
            req = new_request(engine, request.request_id, request.prompt, request.max_new_tokens)
            spec_id[id(req)] = request.request_id
            queue_request(engine, req)
        return tick is not None

    serve(engine, ingest, max_iterations=100)
    return lines


def test_a_live_log_under_lof_declares_it_and_shows_the_inversion() -> None:
    """A live SGLang scheduler under lof writes a log whose header declares
    `longest_output_first` (and not `priority_order`); `check-trace` finds the inversion in
    it, and with `priority-window` the log checks and decides as its twin."""
    lines = _serve_inversion()
    header = json.loads(lines[0])
    assert header["declared_policy"]["longest_output_first"] is True, header
    assert "priority_order" not in header["declared_policy"], header
    result = check_trace(lines)
    assert not result.ok and result.violation is not None
    assert result.violation.rule == "fcfs_admission", result.violation
    assert "admitted 'd' while 'c' is ahead of it" in str(result.violation)
    with sglang_fixed(WINDOW):
        lines = _serve_inversion()
    kept: list[Event] = []
    result = check_trace(lines, keep=kept)
    assert result.ok, (result.line, result.violation)
    assert _admitted(kept) == ["p", "c", "d"]
    twin_profile = SGLANG_DLLM_ORDER_LOF.profile
    assert (
        twin_difference(kept, _config(), SGLANG_ORDER_LOF_TWIN, twin_profile, subject="log") is None
    )
    assert any(isinstance(e, ControlReturned) for e in kept)
