"""SGLang 0.5.23's real dLLM scheduler path under the spec (integrations.sglang).

Everything here drives SGLang's own code (see integrations/sglang/engine.py for what runs for
real and what is stubbed). The findings are regression tests: each FAILS with its rule on the
real code and PASSES with SGLang's files edited the way its fix would go
(`integrations.sglang.fixes`: the edited files run, and their changed methods are put on
SGLang's classes for the test; `scripts/engine_fixes_diff.py sglang` prints the edits as a
patch).

SGLang must be installed (`schedspec install-engines sglang`); without it these tests fail
with that command in the message, unless SCHEDSPEC_SKIP_ENGINES=1 (then they are skipped).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    MultipleResults,
    RuleBasedStateMachine,
    multiple,
    rule,
    run_state_machine_as_test,
)

from integrations.patches import FixDoesNotApply, FixSet, module_file
from integrations.sglang import (
    MANIFEST,
    REAL_SGLANG_DLLM,
    SGLANG_DLLM_UNDER_PRESSURE_PROFILE,
    fixes,
)
from integrations.sglang.adapter import SglangDllmAdapter, engine_request_id, spec_request_id
from integrations.sglang.engine import AttributeNotBuilt, scripted_token
from integrations.sglang.fixes import FIXES, SGLANG_FIXES, fix_as_diff, sglang_fixed
from properties.conformance import conformance_machine
from properties.conformance_base import ConformanceBase
from properties.decisions import twin_difference
from properties.harness import Harness
from properties.strategies import EOS, shared_stem_prompts
from reference.sglang_dllm import SGLANG_DLLM_ORDER, SGLANG_ORDER_TWIN
from spec.adapter import EventSink, ImplementationFactory
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SpecViolation
from spec.events import CacheEvicted, CacheHit, Event, Finished, FinishReason, Forward, KvCached
from spec.implementation import DllmImplementation
from spec.profile import DllmAdmission, DllmConfigSpace, DllmProfile
from spec.snapshot import Snapshot
from tests.patch_check import git_apply_to_copies
from tests.script_module import load_script
from tests.tier import depth

PROFILE = REAL_SGLANG_DLLM.profile

#: The open findings' programs (`scripts/sglang_findings.py`, whose records docs/upstream-reports.md
#: renders); the tests below run them with spies that show each cause.
_findings = load_script("sglang_findings")
FINDINGS = _findings.BY_KEY
drive = _findings.drive


@pytest.fixture(scope="module", autouse=True)
def sglang_installed() -> Iterator[None]:
    if os.environ.get("SCHEDSPEC_SKIP_ENGINES") == "1":
        pytest.skip("SCHEDSPEC_SKIP_ENGINES=1: real-engine tests skipped")
    if not MANIFEST.installed():
        pytest.fail(
            f"SGLang {MANIFEST.version} is not installed in {MANIFEST.directory}: run "
            f"`schedspec install-engines sglang`",
            pytrace=False,
        )
    from integrations.sglang.engine import import_engine

    import_engine()
    yield


def _config(**changes: Any) -> DllmConfig:
    """The findings' base (`scripts/sglang_findings.py`): block = page = 4, 16 pages, 2 rows
    and seats, FDFO, in-place reuse; with `changes`."""
    config: DllmConfig = _findings._config(**changes)
    return config


# The findings run below the profile's pool headroom on purpose (that is where SGLang 0.5.23
# overcommits, stalls or truncates blocks); the suite itself stays inside the declared space.
BELOW_HEADROOM = dataclasses.replace(
    PROFILE, space=dataclasses.replace(PROFILE.space, kv_headroom_pages=None)
)


def _harness(config: DllmConfig, profile: DllmProfile = BELOW_HEADROOM) -> Harness:
    return Harness(REAL_SGLANG_DLLM.factory, config, profile=profile)


def _violation(run: Any) -> SpecViolation:
    with pytest.raises(SpecViolation) as info:
        run()
    return info.value


# ---------------------------------------------------------------------------------- basics
@pytest.mark.parametrize("mode", [Mode.FDFO, Mode.SYNC])
def test_requests_finish_with_the_spec_outputs_and_leave_nothing(mode: Mode) -> None:
    """Three requests (one a prompt-only block first) run to completion on the real path; the
    harness checks every event, every snapshot, the reported outputs and no leak."""
    cfg = _config(mode=mode, in_place_reuse=mode is Mode.FDFO)
    h = _harness(cfg)
    h.submit(RequestSpec("a", (5, 6, 7, 8, 9), 6))
    h.submit(RequestSpec("b", (1, 2), 3))
    h.drain()
    h.submit(RequestSpec("c", (3,), 9))
    h.drain()
    assert set(h.outputs()) == {"a", "b", "c"}
    assert len(h.outputs()["a"]) == 6 and len(h.outputs()["c"]) == 9
    impl = h.impl
    assert isinstance(impl, SglangDllmAdapter)
    assert impl.engine.allocator.available_size() == cfg.kv_slots


@pytest.mark.parametrize("mode", [Mode.FDFO, Mode.SYNC])
def test_a_request_stops_at_its_stop_token_id_through_the_adapter(mode: Mode) -> None:
    """The adapter passes `stop_token_ids` to SGLang (`SamplingParams.stop_token_ids`): `a`
    ends with STOP at its third generated token, the scripted one at position 7, and its
    output is cut there; `b`, given the same id with `ignore_eos`, runs to max_new_tokens (SGLang
    matches no token then, as the spec says). The harness checks every event, the outputs and
    that the `Submitted` events carry the ids as given."""
    cfg = _config(mode=mode, in_place_reuse=mode is Mode.FDFO)
    stop = scripted_token("a", 7, cfg.mask_token_id)
    assert stop not in (
        scripted_token("a", 5, cfg.mask_token_id),
        scripted_token("a", 6, cfg.mask_token_id),
    )
    h = _harness(cfg)
    h.submit(RequestSpec("a", (5, 6, 7, 8, 9), 9, stop_token_ids=(stop,)))
    h.submit(RequestSpec("b", (5, 6, 7, 8, 9), 9, ignore_eos=True, stop_token_ids=(stop,)))
    h.drain()
    reasons = {e.request_id: e.reason for e in h.events if isinstance(e, Finished)}
    assert reasons == {"a": FinishReason.STOP, "b": FinishReason.LENGTH}
    assert h.outputs()["a"][-1] == stop and len(h.outputs()["a"]) == 3
    assert len(h.outputs()["b"]) == 9


def test_fdfo_reuses_the_retained_block_in_place() -> None:
    """An unfinished FDFO block is fed again from the same KV slots (SGLang's in-place reuse,
    mem_cache/allocation.py `_alloc_extend_loc_with_kv_reuse`)."""
    h = _harness(_config())
    h.submit(RequestSpec("a", (5,), 4))
    h.round()
    h.round()
    reused = [row for e in h.events if isinstance(e, Forward) for row in e.rows if row.reused]
    assert reused, "the carried block was not reused"


def test_abort_is_exact_although_sglang_aborts_by_prefix() -> None:
    """SGLang aborts every id that starts with the given one; the adapter's engine ids are never
    prefixes of each other, so aborting r1 leaves r10 running."""
    assert not engine_request_id("r10").startswith(engine_request_id("r1"))
    h = _harness(_config())
    h.submit(RequestSpec("r1", (1, 2), 6))
    h.submit(RequestSpec("r10", (3, 4), 6))
    h.round()
    assert h.abort("r1") is None
    assert h.abort("nope") is not None  # SGLang ignores unknown ids; the adapter refuses them
    h.drain()
    assert set(h.outputs()) == {"r10"}


def test_a_whole_prompt_block_passes_a_shorter_prompt_under_prefill_first() -> None:
    """SGLang forms the prefill batch first: a request whose prompt fills its first block
    (INCOMING_PREFILL) gets its row before a one-token prompt (INCOMING_DECODE) queued ahead of
    it. The profile's PREFILL_FIRST admission order allows exactly that; plain FCFS refuses it."""
    from spec.events import Admitted

    def run(profile: DllmProfile) -> Harness:
        h = _harness(_config(), profile)
        h.submit(RequestSpec("d", (1,), 2))
        h.submit(RequestSpec("p", (5, 6, 7, 8), 2))
        h.round()
        return h

    h = run(BELOW_HEADROOM)
    assert [e.request_id for e in h.events if isinstance(e, Admitted)] == ["p"]
    h.drain()
    assert set(h.outputs()) == {"d", "p"}
    fcfs = dataclasses.replace(
        BELOW_HEADROOM,
        policy=dataclasses.replace(BELOW_HEADROOM.policy, admission=DllmAdmission.FCFS),
    )
    v = _violation(lambda: run(fcfs))
    assert v.rule == "fcfs_admission" and "admitted 'p' while 'd' is ahead" in str(v), v


# ---------------------------------------------------------------------------------- the suite
# Pools with room for every admitted request's worst case and for SGLang's admission estimate
# (a mask block, max_new_tokens and a page per request): the KV-pressure findings below are
# checked on their own (with less room SGLang overcommits or truncates blocks;
# docs/engines/sglang.md).
def _roomy_configs() -> st.SearchStrategy[DllmConfig]:
    """Roomy pools, with the suites' EOS (15) half the time: the scripted tokens (ids 0..15)
    hit it, and the drawn stop token ids, often enough that requests end at both."""
    return st.builds(
        lambda b, rows, mode, eos: DllmConfig(
            block_size=b,
            page_size=b,
            kv_pages=rows * (-(-24 // b) + 4) + 4,  # PROFILE.space.min_kv_pages
            req_pool_rows=rows,
            max_running_requests=rows,
            max_context=b * (-(-24 // b)),
            mode=mode,
            in_place_reuse=mode is Mode.FDFO,
            eos_token_id=eos,
        ),
        st.sampled_from([1, 2, 4]),
        st.integers(1, 3),
        st.sampled_from([Mode.FDFO, Mode.SYNC]),
        st.sampled_from([None, EOS]),
    )


def _run_suite(
    machine: type[RuleBasedStateMachine], examples: int | None = None, *, shrink: bool = True
) -> None:
    """Run a suite machine for `examples` examples (default SCHEDSPEC_SGLANG_EXAMPLES, else
    20 per push and 40 in the full tier: tests/tier.py).
    With `examples` given (a test that must find a seeded bug) the run is derandomized, so it
    replays the same programs under every profile, and it shrinks the failure but skips
    Hypothesis's explain phase (which re-runs the shrunk example under coverage, most of the
    cost). Without `shrink` the first failure is reported as found (a program whose examples
    build many engines can take minutes to shrink)."""
    chosen = settings(
        max_examples=examples or int(os.environ.get("SCHEDSPEC_SGLANG_EXAMPLES", depth(20, 40))),
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    if examples:
        hunting = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
        chosen = settings(
            chosen,
            derandomize=True,
            phases=hunting if shrink else hunting[:-1],
            # stop at the first failure: searching on for more bugs is bounded by wall-clock
            # time (10 s), so under load another counterexample was shrunk ("round 1")
            report_multiple_bugs=False,
        )
    run_state_machine_as_test(machine, settings=chosen)


def test_real_path_passes_the_dllm_suite_under_its_profile() -> None:
    """SGLang as released, inside its declared space, passes the dLLM suite. (Not with requests
    as large as half the pool, nor with its decision twin: the two findings inside the headroom
    below.)"""
    machine = conformance_machine(
        REAL_SGLANG_DLLM.factory, profile=PROFILE, configs=_roomy_configs(), parity="always"
    )
    _run_suite(machine)


def test_the_suite_sees_sglang_end_requests_at_the_eos_a_stop_token_id_and_their_length() -> None:
    """The suite above exercises every way a request ends: the scripted step writes the ids
    the suite draws the EOS and stop token ids from (`engine.SCRIPTED_VOCAB`), so within 60
    derandomized examples SGLang finishes requests with each of `eos`, `stop` and `length`
    (counted on every `Finished` its adapter emits, the parity reference's solo runs
    included)."""
    reasons: Counter[FinishReason] = Counter()

    def counting(config: DllmConfig, sink: EventSink) -> Any:
        def counted(event: Event) -> None:
            if isinstance(event, Finished):
                reasons[event.reason] += 1
            sink(event)

        return REAL_SGLANG_DLLM.factory(config, counted)

    machine = conformance_machine(
        counting, profile=PROFILE, configs=_roomy_configs(), parity="always"
    )
    _run_suite(machine, examples=60)
    assert all(reasons[reason] > 0 for reason in FinishReason), reasons


def radix_cache_machine(
    factory: ImplementationFactory, name: str, profile: DllmProfile = PROFILE
) -> type[RuleBasedStateMachine]:
    """The dLLM suite under SGLang's profile (or `profile`) with the radix cache on: roomy
    pools, prompts that share stems (`shared_stem_prompts`), outputs checked for parity."""
    return conformance_machine(
        factory,
        profile=profile,
        configs=_roomy_configs().map(lambda config: config.replace(prefix_cache=True)),
        parity="always",
        prompt_strategy=shared_stem_prompts(20),
        name=name,
    )


def test_with_the_radix_cache_on_sglang_passes_the_dllm_suite() -> None:
    """SGLang's default for dLLMs, the radix cache on (`prefix_cache` in its declared space):
    with requests that share prompt stems (`shared_stem_prompts`), SGLang as released passes
    the dLLM suite with the spec's prefix cache, its snapshots comparing the tree's slots with
    the spec's cached blocks after every round; within 40 derandomized examples blocks enter
    the cache, requests read them, and the tree evicts."""
    seen: Counter[str] = Counter()

    def counting(config: DllmConfig, sink: EventSink) -> Any:
        def counted(event: Event) -> None:
            if isinstance(event, KvCached | CacheHit | CacheEvicted):
                seen[event.kind] += 1
            sink(event)

        return REAL_SGLANG_DLLM.factory(config, counted)

    _run_suite(radix_cache_machine(counting, "RadixCache"), examples=40)
    assert seen["kv_cached"] > 100 and seen["cache_hit"] > 20 and seen["cache_evicted"] > 0, seen


def _rows_kept_on_a_duplicate_insert(config: DllmConfig, sink: EventSink) -> Any:
    """Seeded bug: when a request checkpoints a block the tree already holds, the tree frees
    the request's own copy but the request's row keeps pointing at it (SGLang rewrites the row
    to the tree's copy: `checkpoint_into_tree`)."""
    adapter = SglangDllmAdapter(config, sink)
    tree = adapter.engine.tree_cache
    checkpoint = tree.checkpoint_into_tree

    def row_kept(req: Any, *, up_to: int, **kwargs: Any) -> None:
        table, row = tree.req_to_token_pool.req_to_token, req.kv.req_pool_idx
        before = table[row, :up_to].clone()
        checkpoint(req, up_to=up_to, **kwargs)
        if req.kv.req_pool_idx is not None:
            table[row, :up_to] = before

    tree.checkpoint_into_tree = row_kept
    return adapter


def test_the_radix_cache_suite_catches_a_row_left_on_a_freed_copy() -> None:
    """The suite above has teeth: SGLang seeded with that bug fails it, the violation naming
    the rule and the state (the first failing program, unshrunk: shrinking SGLang programs
    takes minutes)."""
    machine = radix_cache_machine(_rows_kept_on_a_duplicate_insert, "RadixCacheSeeded")
    with pytest.raises(SpecViolation) as caught:
        _run_suite(machine, examples=400, shrink=False)
    # the freed copy is KV the request's committed block no longer holds (derandomized, the
    # first program that breaks it fails `committed_prefix_kept`)
    rules = {"committed_prefix_kept", "forward_ready", "snapshot_matches", "kv_exclusive"}
    assert caught.value.rule in rules, caught.value
    assert "state:" in str(caught.value) and "cache (" in str(caught.value), caught.value


def two_long_requests_config(mode: Mode) -> DllmConfig:
    """Inside SGLang's declared space: 2 seats and rows, block = page = 2, 36 pages (each seat
    a whole 24-token context plus the 4 pages of headroom)."""
    return _config(
        block_size=2,
        page_size=2,
        kv_pages=36,
        req_pool_rows=2,
        max_running_requests=2,
        max_context=24,
        mode=mode,
        in_place_reuse=mode is Mode.FDFO,
    )


def _two_long_requests(mode: Mode, max_new: tuple[int, int]) -> Harness:
    """In `two_long_requests_config`, two one-token prompts whose outputs run to the end of the
    context or nearly, submitted together and drained."""
    h = _harness(two_long_requests_config(mode), PROFILE)
    h.submit(RequestSpec("r0", (0,), max_new[0]))
    h.submit(RequestSpec("r1", (0,), max_new[1]))
    h.guarded("drain", h.drain)
    return h


@pytest.mark.parametrize("mode", [Mode.SYNC, Mode.FDFO])
def test_finding_ragged_row_inside_the_declared_headroom(mode: Mode) -> None:
    """Found by the pool-share submit rule (2026-11-25): the headroom the profile declares does
    not keep staging from truncating a running request's next block (the finding above, which
    `whole-staged-blocks` fixes alone). Two requests of a whole context each: the second's last
    block gets one slot of two."""
    v = _violation(lambda: _two_long_requests(mode, (23, 23)))
    assert v.rule == "whole_block_alloc", v
    assert "allocated 1 slots for a block of 2" in str(v), v
    with sglang_fixed(["whole-staged-blocks"]):
        h = _two_long_requests(mode, (23, 23))
    assert set(h.outputs()) == {"r0", "r1"}


def test_finding_a_ready_block_waits_a_round_inside_the_declared_headroom() -> None:
    """Found by the decision twin (2026-11-25): inside the declared headroom SGLang 0.5.23 leaves
    `r1`'s last block, allocated and unmasked, out of round 27 and runs it alone in round 28.
    It is the staging truncation above, truncating to nothing: staging charges each running
    request its next block, a page and its whole `max_new_tokens` again, and no budget is left
    for `r1`. The spec allows a round that skips a running request; SGLang's admission order
    does not skip it. With `whole-staged-blocks` alone they agree."""
    h = _two_long_requests(Mode.FDFO, (21, 23))
    config = h.config
    differs = twin_difference(h.events, config, SGLANG_ORDER_TWIN, SGLANG_DLLM_ORDER.profile)
    assert differs == (
        "round 27: the implementation forwards [[('r0', 10)]], its twin forwards "
        "[[('r0', 10), ('r1', 11)]]"
    ), differs
    with sglang_fixed(["whole-staged-blocks"]):
        h = _two_long_requests(Mode.FDFO, (21, 23))
    assert twin_difference(h.events, config, SGLANG_ORDER_TWIN, SGLANG_DLLM_ORDER.profile) is None


def test_finding_a_fitting_request_waits_inside_the_declared_headroom() -> None:
    """Found by `verify --impl real-sglang-dllm --twin sglang-dllm-order --examples 5000`
    (2026-11-25), shrunk there: the same staging charge in a third form. Three requests run in
    a pool with the profile's headroom (56 pages for 4 seats of 9 pages); in round 10 `r4`
    fits, but staging has charged each running request its next block, a page and its whole
    `max_new_tokens` again, so SGLang admits nothing; its admission order admits `r4`. The spec
    allows the wait (SGLang is not work-conserving); the twin does not. `whole-staged-blocks`
    alone fixes it."""
    config = DllmConfig(
        block_size=2,
        page_size=2,
        kv_pages=56,
        req_pool_rows=4,
        max_running_requests=4,
        max_context=18,
        mode=Mode.SYNC,
        in_place_reuse=False,
        reloop=False,
    )

    def run() -> str | None:
        h = Harness(REAL_SGLANG_DLLM.factory, config, profile=PROFILE)
        h.round()
        h.submit(RequestSpec("r0", (0,), 16))
        h.round()
        h.round()
        h.submit(RequestSpec("r1", (0,), 16))
        h.submit(RequestSpec("r2", (0, 0), 13))
        for _ in range(4):
            h.round()
        h.submit(RequestSpec("r3", (0,), 4))
        h.submit(RequestSpec("r4", (0,), 8))
        h.drain()
        return twin_difference(h.events, config, SGLANG_ORDER_TWIN, SGLANG_DLLM_ORDER.profile)

    assert PROFILE.space.outside(config) is None  # inside the declared space
    assert run() == "round 10: the implementation admits [], its twin admits ['r4']"
    with sglang_fixed(["whole-staged-blocks"]):
        assert run() is None


# ---------------------------------------------------------------------------------- findings
@dataclasses.dataclass
class AdderSpy:
    """What SGLang's `PrefillAdder` did, by the harness's request ids: the requests the
    incoming path refused (`add_one_req` gave NO_TOKEN), and each request the staging path took
    (`add_dllm_staging_req` gave CONTINUE) with whether it held a row before."""

    refused: list[str] = dataclasses.field(default_factory=list)
    staged: list[tuple[str, bool]] = dataclasses.field(default_factory=list)


def spy_on_the_adder(monkeypatch: pytest.MonkeyPatch) -> AdderSpy:
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

    spy = AdderSpy()
    add_one, add_staging = PrefillAdder.add_one_req, PrefillAdder.add_dllm_staging_req

    def incoming(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        result = add_one(self, req, *args, **kwargs)
        if result is AddReqResult.NO_TOKEN:
            spy.refused.append(spec_request_id(req.rid))
        return result

    def staging(self: Any, req: Any) -> Any:
        had_row = req.kv.req_pool_idx is not None
        result = add_staging(self, req)
        if result is AddReqResult.CONTINUE:
            spy.staged.append((spec_request_id(req.rid), had_row))
        return result

    monkeypatch.setattr(PrefillAdder, "add_one_req", incoming)
    monkeypatch.setattr(PrefillAdder, "add_dllm_staging_req", staging)
    return spy


KV_PRESSURE = FINDINGS["kv-pressure"]  # 5 usable pages; two requests of 3 pages each


def _kv_pressure(h: Harness) -> None:
    """rows 2, 5 usable KV pages (SGLang's page 0 aside), two requests of 3 pages each
    (block = page = 4): both fit alone, not together."""
    drive(h, KV_PRESSURE.ops)


def test_finding_kv_pressure_overcommits_and_runs_out_of_memory() -> None:
    """SGLang admits the second request without reserving the future blocks of the running one
    and later raises `RuntimeError: Prefill out of memory` inside alloc_for_extend."""
    v = _violation(lambda: _kv_pressure(_harness(KV_PRESSURE.config)))
    assert v.rule == "implementation_error", v
    assert "Prefill out of memory" in str(v), v


def test_finding_kv_pressure_fixed_by_reserving_future_blocks() -> None:
    """The fix: admit an incoming request only when the free KV, less what the running
    requests can still claim, covers its own claim (`reserve-future-blocks`, in
    `process_dllm_incoming_reqs`, dllm/mixin/scheduler.py, which offers incoming requests to
    the adder). A refused prefill request must not starve the decode batch, so the decode
    fallback is applied too."""
    h = _harness(KV_PRESSURE.config)
    with sglang_fixed(["reserve-future-blocks", "decode-fallback"]):
        _kv_pressure(h)
    assert set(h.outputs()) == {"a", "b"}


def test_finding_kv_pressure_fixed_by_keeping_the_refused_request_incoming(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same cause as the ragged row (found by a review, 2026-12-06): the adder refuses `b`,
    which comes back through the staging path, past the estimate that refused it, and
    overcommits the pool. Kept incoming (`refused-stays-incoming`) it waits; the decode
    fallback keeps it from starving the running request. The reservation fixes the same
    program by refusing `b` before it becomes a staging request."""
    spy = spy_on_the_adder(monkeypatch)
    _violation(lambda: _kv_pressure(_harness(KV_PRESSURE.config)))
    assert spy.refused[:1] == ["b"]
    assert ("b", False) in spy.staged  # back through staging, without a row
    h = _harness(KV_PRESSURE.config)
    with sglang_fixed(["refused-stays-incoming", "decode-fallback"]):
        _kv_pressure(h)
    assert set(h.outputs()) == {"a", "b"}


def _rows_short(h: Harness) -> None:
    """1 row, max_running 2: a decode-phase request runs, then a prefill-phase one arrives."""
    drive(h, FINDINGS["row-starvation"].ops)


_ROWS_SHORT = DllmProfile(
    space=DllmConfigSpace(
        page_multiples=frozenset({1}),
        in_place_reuse=frozenset({True}),
        reloop=frozenset({False}),
        rows_equal_max_running=False,  # deliberately outside the declared profile
    ),
    policy=PROFILE.policy,
)


def test_finding_prefill_request_without_a_row_starves_the_decode_request() -> None:
    """With fewer rows than max_running, a prefill-phase request that cannot get a row makes
    SGLang skip the decode batch (prefill goes first and forms nothing): the decode request that
    holds the row never runs again. Outside the profile (rows == max_running) on purpose, not
    outside SGLang: a small KV pool or attention DP sizes the request pool below the seats."""
    v = _violation(lambda: _rows_short(_harness(FINDINGS["row-starvation"].config, _ROWS_SHORT)))
    assert v.rule == "progress", v


def test_finding_starvation_fixed_by_falling_back_to_decode() -> None:
    """The fix: when the prefill pass admits nothing, fall back to the decode batch
    (`decode-fallback`, in `_process_dllm_batches`, dllm/mixin/scheduler.py, which returns
    after the prefill pass)."""
    h = _harness(FINDINGS["row-starvation"].config, _ROWS_SHORT)
    with sglang_fixed(["decode-fallback"]):
        _rows_short(h)
    assert set(h.outputs()) == {"d", "p"}


def _abort_carrier(h: Harness) -> None:
    """An FDFO request whose block is unresolved (carried, KV retained) is aborted."""
    h.submit(RequestSpec("a", (5, 6, 7, 8, 9), 8))
    h.round()  # prompt block
    h.round()  # block 1: first step leaves masks -> carried with its KV
    assert h.impl.snapshot().carrying == frozenset({"a"})
    h.abort("a")
    h.guarded("drain", h.drain)


def test_sglang_0_5_23_frees_the_retained_block_on_abort() -> None:
    """0.5.23 releases the whole allocation of an aborted FDFO request (#32992 is fixed)."""
    h = _harness(_config())
    _abort_carrier(h)
    assert h.impl.snapshot().leaked_slots() == 0


def recreate_32992(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang #32992 re-created for the test: `release_kv_cache` (as the dLLM abort path in
    managers/scheduler.py calls it) forgets an FDFO request's retained block first, so an abort
    frees only its committed KV."""
    import sglang.srt.managers.scheduler as scheduler_module

    release = scheduler_module.release_kv_cache

    def pre_fix(req: Any, tree_cache: Any, checkpoint: bool = False) -> Any:
        if len(req.dllm_incomplete_ids):  # the retained block is not part of the commit
            req.kv.kv_allocated_len = req.prefix_len
            req.kv.kv_committed_len = req.prefix_len
        return release(req, tree_cache, checkpoint=checkpoint)

    monkeypatch.setattr(scheduler_module, "release_kv_cache", pre_fix)


def test_finding_32992_recreated_is_caught_as_terminal_owns_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SGLang #32992 re-created: the abort frees only the committed KV of the request, not the
    retained block of its unresolved FDFO block. The patched `release_kv_cache` (as the dLLM
    abort path in managers/scheduler.py calls it) forgets the retained block first."""
    recreate_32992(monkeypatch)
    v = _violation(lambda: _abort_carrier(_harness(_config())))
    assert v.rule == "terminal_owns_nothing", v


RAGGED = FINDINGS["ragged-row"]  # rows 3, 8 pages


def _ragged(h: Harness) -> None:
    """A request with a one-token prompt is admitted while another runs (rows 3, 8 pages)."""
    drive(h, RAGGED.ops)


def test_finding_ragged_row_is_not_a_whole_block() -> None:
    """Found by the suite: SGLang allocates a row that is not one whole block. Here `b`'s first
    extend is its prompt plus a whole mask block (5 tokens for block 4), spanning two blocks
    (why: the next test). A real model's step views the input as whole blocks and would fail."""
    cfg = RAGGED.config
    v = _violation(lambda: _ragged(_harness(cfg)))
    assert v.rule == "whole_block_alloc", v


def test_finding_ragged_row_fixed_by_capping_the_fallback_budget() -> None:
    """A fix of the symptom (`cap-fallback-budget`): `PrefillAdder._get_dllm_remain_tokens`
    (schedule_policy.py:1001) falls back to `rem_dllm_tokens` (max_running x block_size) when
    its budget is used up, dropping its own cap at block_size (line 1010); a short prompt's
    fill ids are prompt + a whole mask block, so the row takes more than a block. Keeping the
    cap makes every row one block. This program also runs short of KV, so the KV-pressure fix
    (with the decode fallback) is applied too."""
    h = _harness(RAGGED.config)
    with sglang_fixed(["cap-fallback-budget", "reserve-future-blocks", "decode-fallback"]):
        _ragged(h)
    assert set(h.outputs()) == {"a", "b", "c"}


def test_finding_ragged_row_comes_from_a_refused_request_entering_as_staging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why `b`'s row spans two blocks: `process_dllm_incoming_reqs` (dllm/mixin/scheduler.py)
    calls `req.init_next_round_input` before `adder.add_one_req` decides, and its
    `determine_dllm_phase` moves the request from INCOMING_DECODE to STAGING_DECODE. When the
    adder refuses it (NO_TOKEN), it stays in the dLLM queue as a staging request without a row;
    the next round `add_dllm_staging_req` takes it, skipping the admission estimate and the
    incoming path's one-block extend (`_get_dllm_extend_len`), with its whole fill ids: prompt
    + a whole mask block, 5 tokens for block 4."""
    from sglang.srt.dllm.mixin.req import DllmReqPhase
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

    seen: list[tuple[str, str, Any, Any]] = []
    add_one, add_staging = PrefillAdder.add_one_req, PrefillAdder.add_dllm_staging_req

    def spy_incoming(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        result = add_one(self, req, *args, **kwargs)
        seen.append(("incoming", req.rid, result, (req.dllm_phase, req.kv.req_pool_idx)))
        return result

    def spy_staging(self: Any, req: Any) -> Any:
        row = req.kv.req_pool_idx
        result = add_staging(self, req)
        seen.append(("staging", req.rid, row, req.extend_end - req.prefix_len))
        return result

    monkeypatch.setattr(PrefillAdder, "add_one_req", spy_incoming)
    monkeypatch.setattr(PrefillAdder, "add_dllm_staging_req", spy_staging)
    cfg = RAGGED.config
    with pytest.raises(SpecViolation):
        _ragged(_harness(cfg))
    b = engine_request_id("b")
    refused = [e for e in seen if e[:2] == ("incoming", b) and e[2] is AddReqResult.NO_TOKEN]
    assert refused and refused[0][3] == (DllmReqPhase.STAGING_DECODE, None), seen
    assert ("staging", b, None, 5) in seen, seen


def test_finding_ragged_row_fixed_by_keeping_a_refused_request_incoming() -> None:
    """With the refused request kept incoming (`refused-stays-incoming`, and no other fix), the
    program passes: `b` is offered to the adder again, which admits it with a one-block
    extend."""
    h = _harness(RAGGED.config)
    with sglang_fixed(["refused-stays-incoming"]):
        _ragged(h)
    assert set(h.outputs()) == {"a", "b", "c"}


def _rows_taken_by_staging(h: Harness) -> Harness:
    """2 rows, 3 seats, 4 pages of 2 slots, sync: `r0` and `r1` arrive together and the
    adder refuses `r1` (its estimate: prompt + a mask block, a new token and a page, 6 slots
    each); `r2` and `r3` come next and each takes a row; then `r1`, queued as a staging request
    without a row, is taken with them."""
    drive(h, ROWS_TAKEN.ops)
    return h


UNDER_PRESSURE = SGLANG_DLLM_UNDER_PRESSURE_PROFILE  # any rows, no KV headroom
ROWS_TAKEN = FINDINGS["rows-taken-by-staging"]
ROWS_TAKEN_CONFIG = ROWS_TAKEN.config  # 2 rows, 3 seats, 4 pages of 2 slots, sync


def test_finding_a_refused_request_entering_as_staging_takes_a_row_there_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by `verify --impl real-sglang-dllm-under-pressure --examples 200 --keep-going
    --seed 4` (2026-12-06), shrunk there: the ragged row's cause in another form. A refused
    request re-enters through the staging path (`process_dllm_staging_reqs`,
    `add_dllm_staging_req`), which lacks the incoming path's checks, the free-row check
    (`get_num_allocatable_reqs` in `process_dllm_incoming_reqs`) among them; with fewer rows
    than seats three requests meet two rows and SGLang raises in `alloc_req_slots`
    (mem_cache/allocation.py). Outside the declared profile, not outside SGLang: the dLLM
    manager keeps `--max-running-requests` as given while `resolve_max_num_reqs` sizes the
    request pool at min(requested // attention-DP size, token capacity // 2)."""
    spy = spy_on_the_adder(monkeypatch)
    v = _violation(lambda: _rows_taken_by_staging(_harness(ROWS_TAKEN_CONFIG, UNDER_PRESSURE)))
    assert v.rule == "implementation_error", v
    assert "alloc_req_slots runs out of memory" in str(v), v
    assert "num_reqs=3" in str(v), v
    # r1 and r3 refused by the adder, then both taken by the staging path without a row
    assert spy.refused == ["r1", "r3"]
    assert [rid for rid, had_row in spy.staged if not had_row] == ["r3", "r1"]


def test_finding_rows_taken_by_staging_fixed_by_keeping_the_refused_request_incoming() -> None:
    """With `r1` kept incoming (`refused-stays-incoming`) it asks for a row through the adder
    and waits for one; that wait is the row starvation above (`progress`), which
    `decode-fallback` fixes: with both, every request finishes."""
    with sglang_fixed(["refused-stays-incoming"]):
        v = _violation(lambda: _rows_taken_by_staging(_harness(ROWS_TAKEN_CONFIG, UNDER_PRESSURE)))
    assert v.rule == "progress", v
    with sglang_fixed(["refused-stays-incoming", "decode-fallback"]):
        h = _rows_taken_by_staging(_harness(ROWS_TAKEN_CONFIG, UNDER_PRESSURE))
    assert set(h.outputs()) == {"r0", "r1", "r2", "r3"}


def test_finding_idle_engine_skips_a_round_before_admitting_a_request_that_fits() -> None:
    """Found by the suite: with 4 pages (16 slots) a request of 12 tokens (3 pages) fits, but
    SGLang's admission estimate (fill ids = prompt + a whole mask block, + max_new_tokens, + a
    page: 5 + 4 + 6 + 4 = 19 > 16, managers/schedule_policy.py `add_one_req`) does not fit, so
    the idle engine runs its first round admitting nothing. It admits the request a round
    later, without that estimate: the refused request was moved to a staging phase, and
    `add_dllm_staging_req` admits staged requests on a budget of their next block (the cause
    of the ragged-row finding too); tests/test_sglang_event_log.py shows the same program
    served by SGLang's loop."""
    h = _harness(_config(kv_pages=4))
    h.submit(RequestSpec("a", (5, 6, 7, 8, 9), 6))
    v = _violation(lambda: h.guarded("round", h.round))
    assert v.rule == "progress", v


def test_finding_idle_engine_fixed_by_estimating_the_worst_case() -> None:
    """The fix (`worst-case-estimate`, in `PrefillAdder._select_prefill_admission`, which hands
    the estimate to the memory budget's `check_prefill`: `total_tokens < remaining_total`,
    mem_cache/prefill_budget.py:128): the request's own worst case, its prompt and
    max_new_tokens in whole blocks less its prefix, and an exact fit admitted."""
    h = _harness(_config(kv_pages=4))
    h.submit(RequestSpec("a", (5, 6, 7, 8, 9), 6))
    with sglang_fixed(["worst-case-estimate"]):
        h.guarded("drain", h.drain)
    assert set(h.outputs()) == {"a"} and len(h.outputs()["a"]) == 6


def test_finding_an_ignore_eos_request_that_fits_waits_a_round() -> None:
    """Found by the suite once it gave SGLang requests with `ignore_eos`: SGLang estimates
    them on a path of their own (`PrefillAdder.add_one_req_ignore_eos`, taken when the radix
    cache is off): the fill ids paged (prompt + a mask block: 5 tokens, 8) plus a rounding
    page (4), then the whole max_new_tokens (1) and one reserve token must stay under the 12
    free slots: 12 - 12 - 1 <= 1, refused, and the idle engine runs a round admitting nothing.
    The request needs one block of 4 slots. Without `ignore_eos` the same request is admitted
    at once (5 + 1 + 4 = 10 < 12). Refused, it is left a staging request (the ragged row's
    cause), and the staging path, which has no estimate, takes it the round after: driven on
    bare, it finishes (found by a review, 2026-12-06: this finding read "never admitted")."""
    for ignore_eos in (False, True):
        h = _harness(_config(kv_pages=3))
        h.submit(RequestSpec("a", (0,), 1, ignore_eos=ignore_eos))
        if not ignore_eos:
            h.guarded("drain", h.drain)
            continue
        v = _violation(lambda h=h: h.guarded("round", h.round))
        assert v.rule == "progress", v
        assert "idle system with 1 queued requests admitted none" in str(v), v
        impl = h.impl
        assert isinstance(impl, SglangDllmAdapter)
        impl.drain()  # on, unchecked: the staging path takes it
        assert set(impl.collect_outputs()) == {"a"}


def test_finding_ignore_eos_fixed_by_the_worst_case_estimate() -> None:
    """`worst-case-estimate` routes a dLLM request with `ignore_eos` through the same worst
    case as any other (`PrefillAdder.add_one_req`). Without that edit, the rest of the fix
    (no rounding page) is not enough: 8 + 7 (the whole max_new_tokens) + 1 reserve token
    exceed the 12 free slots of a request that claims 8."""
    estimate = fixes.WORST_CASE_ESTIMATE
    routed = [i for i, edit in enumerate(estimate.edits) if "ignore_eos" in edit[2]]
    assert len(routed) == 1, "the edit this test drops moved"
    partial = dataclasses.replace(
        estimate,
        edits=tuple(e for i, e in enumerate(estimate.edits) if i not in routed),
        methods=tuple(m for m in estimate.methods if m[1] != "PrefillAdder.add_one_req"),
    )
    without_routing = dataclasses.replace(
        SGLANG_FIXES, fixes=tuple(partial if f is estimate else f for f in SGLANG_FIXES.fixes)
    )
    for fix_set, admitted in ((without_routing, False), (SGLANG_FIXES, True)):
        h = _harness(_config(kv_pages=3))
        h.submit(RequestSpec("a", (0,), 7, ignore_eos=True))
        with fix_set.applied(["worst-case-estimate"]):
            if admitted:
                h.guarded("drain", h.drain)
                assert len(h.outputs()["a"]) == 7
            else:
                v = _violation(lambda h=h: h.guarded("round", h.round))
                assert v.rule == "progress", v


def _two_running_blocks(h: Harness) -> None:
    """sync, block = page = 3, 6 pages (18 slots), rows 2: two one-token prompts finish with
    their first block, then `r2` (4 new tokens) and `r3` (3) each need a second block — 6 of
    the 12 free slots."""
    drive(h, FINDINGS["staging-truncation"].ops)


_TWO_RUNNING_BLOCKS = FINDINGS["staging-truncation"].config


def test_finding_staging_truncates_a_running_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the suite below the headroom: `PrefillAdder.add_dllm_staging_req` charges each
    staged running request its next block, a page and its whole max_new_tokens again
    (`_update_prefill_budget`, managers/schedule_policy.py:1122); the dLLM path's running batch
    is empty, so nothing else counts them. `r2`'s staging leaves 12 - (3 + 3 + 4) = 2 tokens,
    and `r3`'s next block is truncated to them (line 1114: `min(cand_extend_input_len,
    _rem_tokens)`): 2 slots for a block of 3, with 9 slots free after the round."""
    from sglang.srt.managers.schedule_policy import PrefillAdder

    staged: list[tuple[str, int, int]] = []
    original = PrefillAdder.add_dllm_staging_req

    def spy(self: Any, req: Any) -> Any:
        budget = int(self.rem_total_tokens)
        result = original(self, req)
        staged.append((req.rid, budget, int(req.extend_end - req.prefix_len)))
        return result

    monkeypatch.setattr(PrefillAdder, "add_dllm_staging_req", spy)
    v = _violation(lambda: _two_running_blocks(_harness(_TWO_RUNNING_BLOCKS)))
    assert v.rule == "whole_block_alloc" and "allocated 2 slots for a block of 3" in str(v), v
    assert staged[-2:] == [(engine_request_id("r2"), 12, 3), (engine_request_id("r3"), 2, 2)]


def test_finding_staging_truncation_fixed_by_staging_whole_blocks() -> None:
    """The fix (`whole-staged-blocks`, in `PrefillAdder.add_dllm_staging_req`): a staged
    request's next block is whole or waits, charged only the KV it newly takes."""
    h = _harness(_TWO_RUNNING_BLOCKS)
    with sglang_fixed(["whole-staged-blocks"]):
        _two_running_blocks(h)
    assert set(h.outputs()) == {"r0", "r1", "r2", "r3"}


def _prompt_block_waits(h: Harness) -> None:
    """block = page = 2, 3 pages, rows 3 (the suite's shrunk counterexample): `r1`'s prompt
    fills its block; `r2`'s does too, but its worst case (4 slots) does not fit beside `r1`'s
    reserved future; `r3`, a one-token prompt queued behind `r2`, would fit."""
    h.submit(RequestSpec("r0", (0,), 1))
    h.submit(RequestSpec("r1", (0, 0), 1))
    h.submit(RequestSpec("r2", (0, 0), 1))
    h.abort("r0")
    h.submit(RequestSpec("r3", (0,), 1))
    h.guarded("drain", h.drain)


EVERY_FIX = [fix.name for fix in FIXES]
# The five with the fallback's first version, which offered every decode request.
EVERY_FIX_ANY_ORDER = [
    "decode-fallback-any-order" if name == "decode-fallback" else name for name in EVERY_FIX
]


@pytest.mark.parametrize("keep_order", [True, False])
def test_the_decode_fallback_must_keep_the_prefill_first_order(keep_order: bool) -> None:
    """With every fix, the decode fallback must not admit `r3` past `r2`: PREFILL_FIRST lets a
    whole prompt block pass shorter prompts, never the reverse. A fallback that offered every
    decode request did (found by the suite below the headroom)."""
    cfg = _config(
        block_size=2,
        page_size=2,
        kv_pages=3,
        req_pool_rows=3,
        max_running_requests=3,
        max_context=4,
        mode=Mode.SYNC,
        in_place_reuse=False,
    )
    h = _harness(cfg)
    with sglang_fixed(EVERY_FIX if keep_order else EVERY_FIX_ANY_ORDER):
        if keep_order:
            _prompt_block_waits(h)
            assert set(h.outputs()) == {"r1", "r2", "r3"}
        else:
            v = _violation(lambda: _prompt_block_waits(h))
            assert v.rule == "fcfs_admission", v
            assert "admitted 'r3' while 'r2' is ahead" in str(v), v


# The profile's space without its two restrictions: any pool size, any number of rows.
EVERY_FIX_SPACE = dataclasses.replace(
    BELOW_HEADROOM,
    space=dataclasses.replace(BELOW_HEADROOM.space, rows_equal_max_running=False),
)


def _with_pool_share_submits(
    machine: type[RuleBasedStateMachine],
) -> type[RuleBasedStateMachine]:
    """`machine` with one more submit rule: a request needing at most half the pool, so that
    several are in flight at once and whether the next fits is a page-exact question (where a
    decision twin sees a miscount the spec allows)."""
    base: Any = machine

    class WithPoolShareSubmits(base):  # type: ignore[misc]
        @rule(target=ConformanceBase.requests, data=st.data())
        def submit_a_pool_share(self, data: st.DataObject) -> str | MultipleResults[str]:
            cfg = self.harness.config
            b = cfg.block_size
            pages = data.draw(st.integers(1, max(1, cfg.kv_pages // 2)), label="pages")
            tokens = min(pages * b, cfg.max_context)
            prompt_len = data.draw(st.integers(1, max(1, tokens - 1)), label="prompt length")
            request = RequestSpec(self.new_id(), (0,) * prompt_len, max(1, tokens - prompt_len))
            err = self.run("submit", self.harness.submit, request)
            return multiple() if err is not None else request.request_id

    WithPoolShareSubmits.__name__ = WithPoolShareSubmits.__qualname__ = machine.__name__
    return WithPoolShareSubmits


def _every_fix_machine(
    configs: st.SearchStrategy[DllmConfig] | None = None,
) -> type[RuleBasedStateMachine]:
    """The dLLM suite on SGLang with every fix, below the headroom, ending every example with
    SGLang's decision twin (`reference.sglang_dllm.SGLANG_ORDER_TWIN`, rule `twin_decisions`):
    the example's operations through SGLang's admission order, replaying SGLang's step
    outcomes, must admit the same requests in the same rounds and run the same rows in every
    forward."""
    return _with_pool_share_submits(
        conformance_machine(
            REAL_SGLANG_DLLM.factory,
            profile=EVERY_FIX_SPACE,
            configs=configs,
            parity="always",
            name="EveryFix",
            twin=SGLANG_ORDER_TWIN,
            twin_profile=SGLANG_DLLM_ORDER.profile,
        )
    )


def test_suite_passes_below_the_headroom_with_every_fix() -> None:
    """With the five fixes SGLang needs neither `kv_headroom_pages` nor as many rows as seats:
    the dLLM suite draws pools of any size (down to half a max_context request) and fewer rows
    than max_running, and passes. Without them 0.5.23 fails it within 100 examples
    (`progress`, an idle engine admitting nothing: docs/engines/sglang.md). The code run is the
    edited SGLang files (`scripts/engine_fixes_diff.py sglang` prints them as a patch).

    Every example is also a differential: SGLang decides exactly as its admission order
    (`reference.sglang_dllm`) does on the same operations and step outcomes."""
    with sglang_fixed(EVERY_FIX):
        _run_suite(_every_fix_machine())


def test_with_every_fix_sglang_passes_below_the_headroom_with_the_radix_cache_on() -> None:
    """The same space with the radix cache on (its cached blocks filling the pool, evicted on
    demand) and prompts that share stems: with the five fixes SGLang passes 150 derandomized
    examples, reading blocks from the cache and evicting. No decision twin here: a hit changes
    what SGLang's adder charges, which `reference.sglang_dllm` does not model."""
    seen: Counter[str] = Counter()

    def counting(config: DllmConfig, sink: EventSink) -> Any:
        def counted(event: Event) -> None:
            if isinstance(event, CacheHit | CacheEvicted):
                seen[event.kind] += 1
            sink(event)

        return REAL_SGLANG_DLLM.factory(config, counted)

    space = dataclasses.replace(EVERY_FIX_SPACE.space, prefix_cache=frozenset({True}))
    machine = conformance_machine(
        counting,
        profile=dataclasses.replace(EVERY_FIX_SPACE, space=space),
        parity="always",
        name="EveryFixRadixCache",
    )
    with sglang_fixed(EVERY_FIX):
        _run_suite(_with_pool_share_submits(machine), examples=150, shrink=False)
    assert seen["cache_hit"] > 50 and seen["cache_evicted"] > 100, seen


def _tight_pools() -> st.SearchStrategy[DllmConfig]:
    """Two or three seats and rows over a pool of three to five pages of one block each: where
    a page more or less charged per admission decides who is admitted."""
    return st.builds(
        lambda b, seats, pages, mode: DllmConfig(
            block_size=b,
            page_size=b,
            kv_pages=pages,
            req_pool_rows=seats,
            max_running_requests=seats,
            max_context=8 * b,
            mode=mode,
            in_place_reuse=mode is Mode.FDFO,
        ),
        st.just(4),
        st.integers(2, 3),
        st.integers(3, 5),
        st.sampled_from([Mode.SYNC, Mode.FDFO]),
    )


def test_the_decision_oracle_catches_the_rounding_page_charge() -> None:
    """The decision oracle has teeth where the spec has none: with the worst-case estimate
    still charging each admitted request a rounding page (`per_req_token_overhead`), SGLang
    conforms (its profile is not work-conserving) but admits a fitting request later than its
    admission order does, and the suite above fails on that, naming the round."""
    estimate = fixes.WORST_CASE_ESTIMATE
    charging = dataclasses.replace(
        estimate, edits=estimate.edits[:-1], methods=estimate.methods[:-1]
    )
    assert "per_req_token_overhead" in estimate.edits[-1][2], "the edit this test drops moved"
    variant = dataclasses.replace(
        SGLANG_FIXES, fixes=tuple(charging if f is estimate else f for f in SGLANG_FIXES.fixes)
    )
    with variant.applied(EVERY_FIX), pytest.raises(AssertionError) as caught:
        _run_suite(_every_fix_machine(_tight_pools()), examples=300)
    violation = caught.value
    assert isinstance(violation, SpecViolation) and violation.rule == "twin_decisions", violation
    assert "round 0: the implementation admits" in str(violation), violation
    assert "its twin admits" in str(violation), violation


def test_with_every_fix_sglang_is_still_not_work_conserving() -> None:
    """Why the profile keeps `work_conserving=False` with the fixes too (the suite's shrunk
    counterexample): a batch is prefill-only or decode-only, so while `r1`'s second prompt
    block runs, `r0` (a one-token prompt, a decode-phase request) waits though a row and its
    page are free. The same program passes the profile as declared."""
    conserving = dataclasses.replace(
        EVERY_FIX_SPACE, policy=dataclasses.replace(EVERY_FIX_SPACE.policy, work_conserving=True)
    )
    cfg = _config(
        block_size=2,
        page_size=2,
        kv_pages=4,
        max_context=6,
        mode=Mode.SYNC,
        in_place_reuse=False,
    )

    def program(h: Harness) -> None:
        h.submit(RequestSpec("r0", (0,), 1))
        h.submit(RequestSpec("r1", (0, 0, 0, 0), 1))
        h.guarded("drain", h.drain)

    with sglang_fixed(EVERY_FIX):
        v = _violation(lambda: program(_harness(cfg, conserving)))
        assert v.rule == "work_conserving", v
        assert "the round admitted nothing although 'r0' fits" in str(v), v
        h = _harness(cfg, EVERY_FIX_SPACE)
        program(h)
        assert set(h.outputs()) == {"r0", "r1"}


def test_the_fixes_are_a_patch_of_sglangs_files(tmp_path: Path) -> None:
    """The five fixes as one patch: `git apply -p1` makes exactly the edited files the tests
    run, and the patch takes out only the ignore-EOS test it narrows to non-dLLM requests, the
    import it widens and the comment it rewrites."""
    diff = fix_as_diff()
    sources = SGLANG_FIXES.fixed_sources(EVERY_FIX)
    patched = git_apply_to_copies(tmp_path, sources, diff)
    for module, (_, fixed) in sources.items():
        assert patched[module] == fixed
        compile(fixed, module_file(module), "exec")
    removed = [
        line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")
    ]
    assert removed == [
        '-        if req.sampling_params.ignore_eos and getattr(self.tree_cache, "disable", True):',
        "-from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder",
        "-            # Prepare and add request",
    ]
    assert set(sources) == {fixes.POLICY, fixes.MIXIN}


def test_sglang_fixed_leaves_sglang_as_it_was() -> None:
    """Inside the block the edited methods and the new names are SGLang's; after it (also when
    the block raises) every method and module is as it was."""
    import sglang.srt.dllm.mixin.scheduler as mixin
    import sglang.srt.managers.schedule_policy as policy

    before = (
        dict(vars(policy.PrefillAdder)),
        dict(vars(mixin.SchedulerDllmMixin)),
        set(vars(policy)),
        set(vars(mixin)),
    )
    with pytest.raises(RuntimeError, match="inside"), sglang_fixed(EVERY_FIX):
        staged = policy.PrefillAdder.add_dllm_staging_req
        assert staged is not before[0]["add_dllm_staging_req"]
        assert staged.__globals__ is vars(policy)  # SGLang's own enums and classes
        assert "dllm_claim_tokens" in vars(policy) and "dllm_claim_tokens" in vars(mixin)
        assert hasattr(mixin.SchedulerDllmMixin, "_dllm_decode_fallback_reqs")
        raise RuntimeError("inside")
    after = (
        dict(vars(policy.PrefillAdder)),
        dict(vars(mixin.SchedulerDllmMixin)),
        set(vars(policy)),
        set(vars(mixin)),
    )
    assert after == before


def test_a_fix_refuses_an_sglang_without_the_places_it_edits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Written against 0.5.23: a file without a place a fix edits is refused by name, and
    nothing of SGLang changes."""
    import sglang.srt.managers.schedule_policy as policy

    installed = FixSet.installed_text
    monkeypatch.setattr(
        FixSet,
        "installed_text",
        lambda self, module: installed(self, module).replace(
            "    def add_dllm_staging_req(", "    def x("
        ),
    )
    methods = dict(vars(policy.PrefillAdder))
    with (
        pytest.raises(FixDoesNotApply, match=r"schedule_policy\.py has 0 copies of `def add_dllm"),
        sglang_fixed(["whole-staged-blocks"]),
    ):
        pass
    assert dict(vars(policy.PrefillAdder)) == methods
    with pytest.raises(ValueError, match=r"unknown SGLang 0\.5\.23 fix 'nope' \(valid: refused-st"):
        SGLANG_FIXES.resolve(["nope"])
    with pytest.raises(ValueError, match="edit the same lines"):
        SGLANG_FIXES.resolve(["decode-fallback", "decode-fallback-any-order"])


def test_the_patch_script_prints_the_patch_or_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`scripts/engine_fixes_diff.py sglang`: the five by default, any named subset, or one line
    and exit 2."""
    main = load_script("engine_fixes_diff").main
    assert main(["sglang"]) == 0
    assert capsys.readouterr().out == fix_as_diff()
    assert main(["sglang", "--fix", "cap-fallback-budget"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("--- a/sglang/srt/managers/schedule_policy.py") and "mixin" not in out
    assert main(["sglang", "--fix", "decode-fallback", "--fix", "decode-fallback-any-order"]) == 2
    err = capsys.readouterr().err
    assert err == "error: decode-fallback and decode-fallback-any-order edit the same lines\n"
    assert main(["sglang", "--fix", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown SGLang 0.5.23 fix 'nope' (valid: ")


def test_profile_refuses_a_config_outside_its_space() -> None:
    from spec.profile import ConfigOutsideProfile

    with pytest.raises(ConfigOutsideProfile, match="page_size"):
        _harness(_config(page_size=8))


def test_replace_keeps_profile_fields() -> None:
    # the profile SGLang declares (docs/engines/sglang.md lists each option with its source line)
    assert PROFILE.space.page_multiples == frozenset({1})
    assert PROFILE.policy.reserved_kv_pages == 1 and PROFILE.policy.reserved_rows == 1
    assert dataclasses.replace(PROFILE).policy.admission.value == "prefill-first"
    assert PROFILE.deviations == ()  # PREFILL_FIRST covers its admission order


def test_missing_install_names_the_install_command(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from integrations.manifest import EngineNotInstalled

    monkeypatch.setenv("SCHEDSPEC_ENGINE_CACHE", str(tmp_path))
    with pytest.raises(EngineNotInstalled, match="schedspec install-engines sglang"):
        MANIFEST.activate()


def test_importing_the_integration_does_not_import_sglang() -> None:
    import sys

    code = (
        "import sys, integrations.sglang\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch')]\n"
        "assert not bad, bad[:5]\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_the_cli_run_prints_no_sglang_import_warnings() -> None:
    """SGLang's kernel modules warn at import that this CPU has no AWQ, GGUF or Triton
    kernels; the scheduler path never uses them, so a user's terminal shows none of it."""
    import sys
    from pathlib import Path

    schedspec = Path(sys.executable).parent / "schedspec"
    res = subprocess.run(
        [str(schedspec), "verify", "--impl", "real-sglang-dllm", "--examples", "2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "real-sglang-dllm" in res.stdout and "PASS" in res.stdout
    assert "Warning" not in res.stderr, res.stderr


def test_with_every_fix_sglang_decides_as_its_admission_order_says() -> None:
    """`scripts/sglang_vs_reference.py` on 700 programs: SGLang with the five fixes makes the
    decisions of `reference.sglang_dllm` (PREFILL_FIRST within `_fetch_waiting_reqs`' window, no
    decode admission in a prefill round), which replays SGLang's own step outcomes: the same
    admissions and the same rows in every forward of every program. Without the fixes' exact
    charge (no rounding page per admitted request) program 599 admits a request a round late."""
    script = load_script("sglang_vs_reference")
    results = script.compare_programs(700)
    assert [r.seed for r in results if not (r.same_admissions and r.same_forwards)] == []


def test_as_released_sglang_decides_as_its_admission_order_inside_its_space() -> None:
    """SGLang 0.5.23 unpatched, on the comparison's programs grown into the space its profile
    declares (as many rows as seats, a pool with its headroom; contexts of at most 16 tokens):
    the same decisions as `reference.sglang_dllm`, and not the same as plain PREFILL_FIRST's,
    so the programs do reach SGLang's own choices. (Longer requests do not always: the two
    findings inside the declared headroom above.)"""
    script = load_script("sglang_vs_reference")
    results = script.compare_programs(200, released=True)
    assert [r.seed for r in results if not (r.same_admissions and r.same_forwards)] == []
    plain = script.compare_programs(200, "prefill-first", released=True)
    assert sum(not r.same_admissions for r in plain) > 0


def test_the_prefill_first_reference_differs_from_sglang_only_by_admission_order() -> None:
    """Against the reference under plain PREFILL_FIRST (any prefill request may pass, decode
    requests admitted in any round) the forwards differ only where the admissions do."""
    script = load_script("sglang_vs_reference")
    results = script.compare_programs(200, "prefill-first")
    assert not [r.seed for r in results if r.same_admissions and not r.same_forwards]
    assert sum(not r.same_admissions for r in results) > 0


def test_as_released_sglang_decides_as_its_twin_through_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`schedspec verify --impl real-sglang-dllm --twin sglang-dllm-order`: on the suite's own
    configurations SGLang 0.5.23, unpatched, admits and forwards as its admission order does
    (the twin is checked under its own profile). The two findings inside the headroom need
    requests of half the pool, which this run does not draw."""
    from schedspec_cli.main import main

    argv = ["verify", "--impl", "real-sglang-dllm", "--twin", "sglang-dllm-order"]
    assert main([*argv, "--examples", str(depth(30, 60))]) == 0, capsys.readouterr().out
    assert "sglang-dllm-order" in capsys.readouterr().out


def test_a_log_of_real_sglang_checks_under_its_profile_and_decides_as_its_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`schedspec check-trace LOG --profile real-sglang-dllm --twin sglang-dllm-order` on a log
    SGLang's own scheduler wrote (arrivals between rounds, an abort): it breaks the idealised
    spec's FCFS admission on purpose, conforms under the profile SGLang declares (or the policy
    its header declares), and decides exactly as its twin on the log's operations."""
    import json

    from schedspec_cli.main import main
    from spec.trace import config_to_dict, event_to_dict
    from tests.test_check_trace_profile import record_dllm_run

    config = DllmConfig(
        block_size=2,
        page_size=2,
        kv_pages=120,
        req_pool_rows=3,
        max_running_requests=3,
        max_context=32,
        mode=Mode.FDFO,
    )
    events = record_dllm_run(REAL_SGLANG_DLLM, config)  # SGLang admits a prefill past a decode
    body = [json.dumps(event_to_dict(e)) for e in events]
    bare, declared = tmp_path / "bare.jsonl", tmp_path / "declared.jsonl"
    bare.write_text("\n".join([json.dumps(config_to_dict(config)), *body]) + "\n")
    declared.write_text(
        "\n".join([json.dumps(config_to_dict(config, PROFILE.policy)), *body]) + "\n"
    )
    assert main(["check-trace", str(bare)]) == 1
    assert "[fcfs_admission]" in capsys.readouterr().out
    for log, profile in ((bare, ["--profile", "real-sglang-dllm"]), (declared, [])):
        code = main(["check-trace", str(log), *profile, "--twin", "sglang-dllm-order"])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "its twin sglang-dllm-order decides alike in all" in out
    assert main(["check-trace", str(declared), "--twin", "reference-dllm"]) == 1
    assert "[twin_decisions] against reference-dllm" in capsys.readouterr().out


def test_parity_impl_runs_sglang_in_the_modes_it_declares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`parity --impl real-sglang-dllm` (a page of one block): SGLang's own scheduler and pools
    run sync and FDFO with reuse, the variants its profile declares, on a pool with its
    admission headroom, and every output equals sync's at batch size 1 with nothing leaked.
    Before, every page size and pool the command could set was outside SGLang's space."""
    from schedspec_cli.main import main

    out = tmp_path / "sglang-parity.json"
    argv = ["parity", "--impl", "real-sglang-dllm", "--block-size", "8", "--page-size", "8"]
    assert main([*argv, "--prompts", "4", "--max-new-tokens", "16", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "the modes its profile declares: sync, fdfo+reuse" in printed
    report = json.loads(out.read_text())
    assert report["identical"] is True and report["batch_sizes"] == [1, 4]
    assert report["leaked_slots"] == 0 and report["leaked_rows"] == 0
    # the release checked, as verify records it (it had no engine, no run metadata)
    assert report["engine"] == {"name": "sglang", "version": MANIFEST.version}
    assert f"real-sglang-dllm: sglang {MANIFEST.version}" in printed
    assert {"date", "commit", "versions"} <= set(report["run"])


def _reading_a_new_knob(monkeypatch: pytest.MonkeyPatch) -> SglangDllmAdapter:
    """An adapter whose SGLang `Scheduler` class now reads `dllm_max_staging`, an attribute the
    adapter's `build` does not set (for the test's duration), as a maintainer's change might."""
    adapter = REAL_SGLANG_DLLM.factory(_config(), lambda event: None)
    scheduler_cls = type(adapter.engine.scheduler)  # type: ignore[attr-defined]
    released = scheduler_cls.get_next_batch_to_run

    def reads_a_new_knob(self: Any, *args: Any) -> Any:
        if self.dllm_max_staging < 0:
            return None
        return released(self, *args)

    monkeypatch.setattr(scheduler_cls, "get_next_batch_to_run", reads_a_new_knob)
    assert isinstance(adapter, SglangDllmAdapter)
    return adapter


def test_a_change_reading_an_attribute_the_adapter_does_not_set_says_where_to_set_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A maintainer's change that reads a new Scheduler attribute (set by the server's
    `__init__`, which the adapter does not run) names the attribute and where the adapter
    builds the Scheduler, instead of reading as an SGLang bug (`AttributeError: 'Scheduler'
    object has no attribute ...` from SGLang's own code)."""
    adapter = _reading_a_new_knob(monkeypatch)
    adapter.submit(RequestSpec("r0", (1, 2, 3), 4))
    with pytest.raises(AttributeNotBuilt) as caught:
        adapter.run_round()
    said = str(caught.value)
    assert said.startswith("SGLang's Scheduler has no attribute 'dllm_max_staging' (read at ")
    assert "in reads_a_new_knob)" in said and "integrations/sglang/engine.py (`build`)" in said


def test_verify_refuses_a_change_the_adapter_cannot_drive_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same change under `verify`: the adapter's limit, not a rule SGLang broke, so the run
    is refused in one line naming the attribute (exit 2), not reported as `implementation_error`
    with a "no known finding" verdict (a review found it so)."""
    from schedspec_cli.main import main

    _reading_a_new_knob(monkeypatch)
    assert main(["verify", "--impl", "real-sglang-dllm", "--examples", "5"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()[-1]
    assert "SGLang's Scheduler has no attribute 'dllm_max_staging'" in err, captured.err
    assert "Traceback" not in captured.err and "implementation_error" not in captured.out


class _LeaksOnFinish(SglangDllmAdapter):
    """A planted leak, on the adapter's side of SGLang: the snapshot hides the first free slot,
    as a pool that forgot a finished request's KV would show it."""

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        if self.seen and not self.live and snap.free_slots:  # after a request ended
            return dataclasses.replace(snap, free_slots=snap.free_slots - {min(snap.free_slots)})
        return snap


def _leaks_on_finish(config: DllmConfig, sink: EventSink) -> SglangDllmAdapter:
    return _LeaksOnFinish(config, sink)


#: Under SGLang's declared profile, as the built-in runs (its estimate findings stay out).
LEAKS_ON_FINISH = DllmImplementation(_leaks_on_finish, PROFILE, "SGLang with a planted leak")


def test_a_counterexample_ends_with_sglangs_own_calls(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failing example on SGLang prints, after the program, what the adapter did on SGLang's
    scheduler: the queued `Req`s under their engine ids, each round's batch with its forward
    mode, rows (SGLang's `req_pool_idx`) and dLLM phases, and what ended."""
    from properties.conformance_base import NATIVE_NOTE
    from schedspec_cli.main import main

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    code = main(["verify", "--impl", f"{__name__}:LEAKS_ON_FINISH", "--examples", "50"])
    out = capsys.readouterr().out
    assert code == 1 and NATIVE_NOTE in out, out[-3000:]
    native = out.split(NATIVE_NOTE, 1)[1]
    assert native.lstrip().startswith("scheduler = Scheduler.__new__(Scheduler)  # assembled by")
    assert "scheduler.waiting_queue.append(Req(rid='2:r0|', origin_input_ids=[" in native
    assert "batch = scheduler.get_next_batch_to_run(...)  # " in native
    assert "  # DLLM_EXTEND: 2:r0| row 1 STAGING_" in native, native
    assert "scheduler.process_batch_result_dllm(batch, worker step)  # 2:r0| (FINISH_" in native
