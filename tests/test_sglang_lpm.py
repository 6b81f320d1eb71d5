"""SGLang 0.5.23's dLLM path under its cache-aware policies (`real-sglang-dllm-lpm`).

With the radix cache on, `--schedule-policy lpm` sorts the waiting queue by each request's
cached prefix, longest first, before every round (`_sort_by_longest_prefix`), pushing back a
request whose short match another queued request shares (`_compute_prefix_matches`);
`dfs-weight`, `hrrn` and `shortest-prefill-first` sort it by the tree too, and `random`
shuffles it. That is SGLang's choice, so the profile declares the order free
(`DllmPolicy.free_queue_order`): any queued request may be admitted, and every other rule,
the prefix cache's included, binds as before. Without the option the spec refuses these runs on
`fcfs_admission`, which the tests below show on SGLang's own decisions.

SGLang must be installed (`schedspec install-engines sglang`); see tests/test_real_sglang.py
(SCHEDSPEC_SKIP_ENGINES=1 skips these tests).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Iterator

import pytest

from integrations.sglang import (
    REAL_SGLANG_DLLM_LPM,
    SGLANG_DLLM_FREE_ORDER_PROFILE,
    SGLANG_DLLM_PROFILE,
)
from integrations.sglang.adapter import SglangDllmAdapter
from integrations.sglang.engine import build
from integrations.sglang.event_log import FREE_ORDER_POLICIES, declared_policy
from properties.trace_check import check_trace
from properties.verify import verify_implementation
from schedspec_cli.impls import resolve
from spec.adapter import EventSink, ImplementationFactory, SchedulerAdapter
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError, SpecViolation
from spec.events import Aborted, Admitted, CacheHit, Event, Submitted
from spec.implementation import DllmImplementation
from spec.machine import SpecMachine
from tests.test_real_sglang import (  # the module's fixture, and its suite settings
    _run_suite,
    radix_cache_machine,
    sglang_installed,  # noqa: F401
)
from tests.test_sglang_event_log import Program, Tick, serve_logged

FREE = SGLANG_DLLM_FREE_ORDER_PROFILE.policy
ONE_SEAT = DllmConfig(
    block_size=2,
    page_size=2,
    kv_pages=40,
    req_pool_rows=1,
    max_running_requests=1,
    max_context=16,
    mode=Mode.FDFO,
    in_place_reuse=True,
    mask_token_id=99,
    prefix_cache=True,
)
STEM = (5, 6, 7, 8, 9, 10)


def _served(schedule_policy: str, config: DllmConfig = ONE_SEAT) -> list[Event]:
    """r0 (prompt STEM) served alone; then r1 (an unrelated prompt) and r2 (STEM and one token
    more) queued together behind one seat."""
    events: list[Event] = []
    adapter = SglangDllmAdapter(config, events.append, schedule_policy=schedule_policy)
    adapter.submit(RequestSpec("r0", STEM, 2))
    adapter.drain()
    adapter.submit(RequestSpec("r1", (1, 2, 3, 4), 2))
    adapter.submit(RequestSpec("r2", (*STEM, 11), 2))
    adapter.drain()
    return events


def _admitted(events: list[Event]) -> list[str]:
    return [e.request_id for e in events if isinstance(e, Admitted)]


def test_the_profile_is_sglangs_with_the_radix_cache_on_and_a_free_queue_order() -> None:
    """With the cache off SGLang makes lpm FCFS, which `real-sglang-dllm` checks already: the
    built-in runs the cache alone (a space with both would draw it off: a review found the
    built-in never ran lpm's order)."""
    expected = dataclasses.replace(SGLANG_DLLM_PROFILE.policy, free_queue_order=True)
    assert REAL_SGLANG_DLLM_LPM.profile.policy == expected
    assert REAL_SGLANG_DLLM_LPM.profile.space == dataclasses.replace(
        SGLANG_DLLM_PROFILE.space, prefix_cache=frozenset({True})
    )


def test_lpm_admits_the_longest_cached_prefix_first_which_only_a_free_order_allows() -> None:
    """r2 hits r0's three cached blocks, r1 none: lpm seats r2 first. The spec under SGLang's
    FCFS policy refuses that admission by name; declared free, the run conforms (its cache
    events included)."""
    events = _served("lpm")
    assert _admitted(events) == ["r0", "r2", "r1"]
    assert any(isinstance(e, CacheHit) and e.request_id == "r2" for e in events)
    fcfs = SpecMachine(ONE_SEAT, SGLANG_DLLM_PROFILE.policy)
    with pytest.raises(SpecViolation) as info:
        fcfs.apply_all(events)
    assert info.value.rule == "fcfs_admission"
    assert "admitted 'r2' while 'r1' is ahead of it" in str(info.value)
    SpecMachine(ONE_SEAT, FREE).apply_all(events)


def test_with_the_radix_cache_off_lpm_is_fcfs_and_logs_as_fcfs() -> None:
    """SGLang keeps a cache-aware policy only with its tree on (`_validate_and_adjust_policy`):
    without it, lpm admits in arrival order, and a log declares no free order."""
    off = ONE_SEAT.replace(prefix_cache=False)
    events = _served("lpm", off)
    assert _admitted(events) == ["r0", "r1", "r2"]
    SpecMachine(off, SGLANG_DLLM_PROFILE.policy).apply_all(events)
    scheduler = build(off, {}, schedule_policy="lpm").scheduler
    assert declared_policy(scheduler) == SGLANG_DLLM_PROFILE.policy


@pytest.mark.parametrize("policy", FREE_ORDER_POLICIES)
def test_every_order_of_sglangs_own_is_declared_free(policy: str) -> None:
    scheduler = build(ONE_SEAT, {}, radix_cache=True, schedule_policy=policy).scheduler
    assert declared_policy(scheduler) == FREE


def test_the_engine_refuses_a_policy_sglang_would_refuse() -> None:
    with pytest.raises(ConfigError, match="fcfs or lof under priority scheduling"):
        build(ONE_SEAT, {}, priority=True, schedule_policy="lpm")
    with pytest.raises(ConfigError, match="requires prefix caching"):
        build(ONE_SEAT.replace(prefix_cache=False), {}, schedule_policy="shortest-prefill-first")
    with pytest.raises(ConfigError, match="schedule_policy='priority': one of fcfs"):
        build(ONE_SEAT, {}, schedule_policy="priority")


def _counting(
    factory: ImplementationFactory, seen: Counter[str], caches: set[bool]
) -> ImplementationFactory:
    """`factory`, counting in `seen` each admission that passed an earlier arrival still queued
    (an aborted request leaves the queue: counted as queued, nearly every admission passed one,
    a review found) and each cache hit, and adding each configuration's `prefix_cache` to
    `caches`."""

    def counting(config: DllmConfig, sink: EventSink) -> SchedulerAdapter:
        caches.add(config.prefix_cache)
        queued: list[str] = []

        def counted(event: Event) -> None:
            if isinstance(event, Submitted):
                queued.append(event.request_id)
            elif isinstance(event, Admitted):
                seen["passed an earlier arrival"] += queued.index(event.request_id) > 0
                queued.remove(event.request_id)
            elif isinstance(event, Aborted) and event.request_id in queued:
                queued.remove(event.request_id)
            elif isinstance(event, CacheHit):
                seen["cache_hit"] += 1
            sink(event)

        return factory(config, counted)

    return counting


def test_lpm_passes_the_dllm_suite_with_the_radix_cache_on() -> None:
    """Under its profile SGLang with lpm passes 40 derandomized examples of the dLLM suite with
    prompts sharing stems, snapshots comparing the tree with the spec's cache every round; in
    them lpm admits requests ahead of earlier arrivals, and requests read cached blocks."""
    seen: Counter[str] = Counter()
    counting = _counting(REAL_SGLANG_DLLM_LPM.factory, seen, set())
    _run_suite(radix_cache_machine(counting, "Lpm", SGLANG_DLLM_FREE_ORDER_PROFILE), examples=40)
    assert seen["passed an earlier arrival"] > 0 and seen["cache_hit"] > 0, seen


def test_the_built_in_verify_runs_reorders_by_cached_prefix() -> None:
    """`verify --impl real-sglang-dllm-lpm` as the command runs it (the built-in resolved by
    name, the suite drawing in its space): every example runs the radix cache, requests read
    cached blocks, it passes, and lpm seats more requests ahead of an earlier arrival than the
    radix built-in (FCFS, the same space, so the same programs) does: its prefill-first
    admission passes some too, so the count alone would not show lpm's order."""
    counts: dict[str, Counter[str]] = {}
    for name in ("real-sglang-dllm-lpm", "real-sglang-dllm-radix"):
        implementation = resolve(name, None).implementation
        assert isinstance(implementation, DllmImplementation)
        caches: set[bool] = set()
        seen: Counter[str] = Counter()
        counting = _counting(implementation.factory, seen, caches)
        result = verify_implementation(
            name,
            DllmImplementation(counting, implementation.profile, "counted"),
            40,
            parity="never",
        )
        assert not result.failures, result.failures[0].message
        assert caches == {True}, (name, caches)
        assert seen["cache_hit"] > 0, (name, seen)
        counts[name] = seen
    lpm, fcfs = (counts[n]["passed an earlier arrival"] for n in counts)
    assert lpm > 2 * fcfs, counts


def test_under_sglangs_fcfs_profile_the_same_suite_refuses_lpm_by_name() -> None:
    """The option is what lets lpm pass: under SGLang's FCFS profile the same suite fails it
    on `fcfs_admission` (derandomized, unshrunk: shrinking SGLang programs takes minutes)."""
    machine = radix_cache_machine(REAL_SGLANG_DLLM_LPM.factory, "LpmUnderFcfs", SGLANG_DLLM_PROFILE)
    with pytest.raises(SpecViolation) as caught:
        _run_suite(machine, examples=200, shrink=False)
    assert caught.value.rule == "fcfs_admission", caught.value
    assert "is ahead of it" in str(caught.value), caught.value


def _shared_stem_program() -> Program:
    """Two seats; arrivals over time whose prompts share two stems, so the tree holds what
    later requests match."""
    config = ONE_SEAT.replace(
        req_pool_rows=2, max_running_requests=2, kv_pages=24, eos_token_id=None
    )
    stems = ((5, 6, 7, 8), (1, 2, 3, 4, 9, 9))
    ticks = []
    for i in range(8):
        stem = stems[i % 2]
        ticks.append(
            Tick(
                tuple(
                    RequestSpec(f"r{i}{j}", (*stem, (i + j) % 7 + 10)[: 3 + (i + j) % 4], 3)
                    for j in range(1 + i % 3)
                )
            )
        )
    return Program(config, tuple(ticks))


@pytest.fixture
def seeded_shuffle() -> Iterator[None]:
    """`random` shuffles with Python's global generator (`_sort_randomly`): seeded here, and
    put back after."""
    state = random.getstate()
    random.seed(32)
    yield
    random.setstate(state)


@pytest.mark.parametrize("policy", FREE_ORDER_POLICIES)
def test_a_live_log_under_an_order_of_sglangs_own_declares_it_free_and_conforms(
    policy: str, seeded_shuffle: None
) -> None:
    """SGLang's own loop serves arrivals sharing stems under each such policy with
    `SglangEventLog` attached: the header declares `free_queue_order` (and the cache), and the
    log conforms. Under `random` with the shuffle seeded 32 two requests commit the same block
    in one round and the one SGLang seated in the higher row is cached first; the log used to
    write the other's duplicate insert (a read of that block) before the block was cached,
    which the spec refuses (`cache_hit_content`): `spec.reconstruct` now writes every caching
    of an interval first (tests/test_spec_reconstruct.py)."""
    lines = serve_logged(_shared_stem_program(), radix_cache=True, schedule_policy=policy)
    header = json.loads(lines[0])
    assert header["declared_policy"]["free_queue_order"] is True
    assert header["prefix_cache"] is True
    result = check_trace(lines)
    assert result.violation is None, result.violation
    if policy == "random":
        kinds = [json.loads(line)["kind"] for line in lines[1:]]
        assert "cache_hit" in kinds and "kv_cached" in kinds


def test_a_live_lpm_log_without_the_declaration_fails_fcfs_admission() -> None:
    """The log's declaration is what passes it: the lpm log with `free_queue_order` taken out
    of its header fails `fcfs_admission`, naming the line."""
    lines = serve_logged(_shared_stem_program(), radix_cache=True, schedule_policy="lpm")
    header = json.loads(lines[0])
    del header["declared_policy"]["free_queue_order"]
    result = check_trace([json.dumps(header), *lines[1:]])
    assert result.violation is not None and result.violation.rule == "fcfs_admission"
    assert result.line is not None and json.loads(lines[result.line - 1])["kind"] == "admitted"
