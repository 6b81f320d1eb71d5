"""vLLM 0.33.0's real v1 Scheduler under the AR spec (`real-vllm`, `real-vllm-prefix`), unit
tests of the fabricated model output, and the differential against the `vllm-v1` reference.

Needs the engine installed (`schedspec install-engines vllm`); without it every test fails
naming that command, unless SCHEDSPEC_SKIP_ENGINES=1 (then they are skipped). The AR tests of
vLLM live in this one file; its diffusion-LLM path's are in tests/test_real_vllm_dllm.py.

Example counts: SCHEDSPEC_VLLM_EXAMPLES examples per suite (default 20 per push, 40 in the full
tier: tests/tier.py) and SCHEDSPEC_VLLM_PROGRAMS engine-core programs (150, 300); the issue's
500-example run is `SCHEDSPEC_VLLM_EXAMPLES=500 pytest tests/test_real_vllm.py -k conforms`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from integrations.vllm import (
    MANIFEST,
    REAL_VLLM,
    REAL_VLLM_PREFIX,
    REAL_VLLM_PREFIX_PROFILE,
    REAL_VLLM_PROFILE,
    SETTINGS_SPACE,
)
from integrations.vllm.adapter import RealVllmScheduler
from integrations.vllm.admission_knobs import VLLM_ADMISSION, AdmissionKnobs
from integrations.vllm.differential import decisions, first_difference, program
from integrations.vllm.engine_core import RULES as CORE_RULES
from integrations.vllm.engine_core import (
    CoreProgram,
    CoreRun,
    LoopOptions,
    check_both,
    core_program,
)
from properties.ar.conformance import ar_conformance_machine
from properties.ar.harness import ArHarness
from reference.ar.vllm_v1 import VLLM_V1, make_vllm_v1
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.events import (
    ArAborted,
    ArBlocksAllocated,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArPreempted,
    ArScheduled,
)
from spec.errors import ConfigError, RequestTooLarge, UnknownRequest
from tests.engine_core_programs import first_violations, passing_runs
from tests.engine_gate import require_engine
from tests.tier import depth
from tests.vllm_seeded_bugs import (
    abort_in_flight_leaks,
    budget_raised,
    extra_seat,
    finished_not_reported,
    lifo_admission,
    new_blocks_not_announced,
    preemption_in_flight_raises,
    reused_block_keeps_its_key,
    stale_hash_on_reuse,
    stop_reported_as_length,
    under_allocate,
)

EXAMPLES = int(os.environ.get("SCHEDSPEC_VLLM_EXAMPLES", depth(20, 40)))
# engine-core programs whose live event log is checked (seeds 0 .. n-1)
LOG_PROGRAMS = int(os.environ.get("SCHEDSPEC_VLLM_LOG_PROGRAMS", "8"))
PROGRAMS = int(os.environ.get("SCHEDSPEC_VLLM_PROGRAMS", depth(150, 300)))


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _run(machine: type, examples: int) -> None:
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            deadline=None,
            stateful_step_count=30,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_the_loaded_vllm_is_the_selected_release() -> None:
    """The adapter imports vLLM from the selected release's own install
    (`SCHEDSPEC_VLLM_VERSION`; unset: 0.33.0), whose `__version__` says it is that release."""
    from integrations.vllm import MANIFEST
    from integrations.vllm.adapter import load_vllm

    load_vllm()
    vllm = sys.modules["vllm"]
    assert vllm.__version__ == MANIFEST.version, (vllm.__version__, MANIFEST.version)
    assert Path(vllm.__file__ or "").is_relative_to(MANIFEST.site_packages), vllm.__file__


# ---------------------------------------------------------------- the suite under the profile
def test_real_vllm_conforms() -> None:
    _run(ar_conformance_machine(REAL_VLLM.factory, profile=REAL_VLLM_PROFILE), EXAMPLES)


def test_real_vllm_prefix_conforms() -> None:
    machine = ar_conformance_machine(REAL_VLLM_PREFIX.factory, profile=REAL_VLLM_PREFIX_PROFILE)
    _run(machine, EXAMPLES)


# ---------------------------------------------------------------- fabricated output, by hand
def _h(policy: Policy = Policy.FCFS, **kw: object) -> ArHarness:
    config = ArConfig(policy=policy, **kw)  # type: ignore[arg-type]
    return ArHarness(REAL_VLLM.factory, config, policy=REAL_VLLM_PROFILE.policy)


def _scheduled(events: list[ArEvent]) -> list[tuple[str, int]]:
    return [(e.request_id, e.num_tokens) for e in events if isinstance(e, ArScheduled)]


def test_chunked_prefill_then_one_token_per_decode_step() -> None:
    h = _h(block_size=4, num_blocks=9, max_num_batched_tokens=4, max_num_seqs=2, max_model_len=16)
    h.submit(ArRequest("a", 10, 3))
    h.drain()
    assert _scheduled(h.events) == [("a", 4), ("a", 4), ("a", 2), ("a", 1), ("a", 1)]
    assert h.outputs() == {"a": 3}
    assert h.violation is None


def test_stop_token_finishes_with_stop_and_frees_every_block() -> None:
    h = _h(block_size=2, num_blocks=9, max_num_batched_tokens=8, max_model_len=16)
    h.submit(ArRequest("s", 3, 8, stop_after=2))
    h.drain()
    assert [e for e in h.events if isinstance(e, ArFinished)] == [
        ArFinished("s", ArFinishReason.STOP)
    ]
    assert h.outputs() == {"s": 2}
    assert h.impl.snapshot().held_blocks() == 0


def test_block_zero_is_the_null_block_and_never_handed_out() -> None:
    h = _h(block_size=1, num_blocks=6, max_num_batched_tokens=8, max_model_len=5)
    h.submit(ArRequest("a", 3, 2))
    h.step()
    snap = h.impl.snapshot()
    assert 0 not in snap.free_blocks and 0 not in snap.block_owners
    assert sorted(snap.block_owners) == [1, 2, 3]
    h.drain()


def test_abort_frees_and_unknown_ids_are_refused() -> None:
    h = _h(max_num_seqs=1)
    h.submit(ArRequest("r", 2, 8))
    h.submit(ArRequest("w", 2, 8))
    h.step()
    assert h.abort("w") is None  # waiting
    assert h.abort("r") is None  # running, holding blocks
    assert isinstance(h.abort("r"), UnknownRequest)
    assert isinstance(h.abort("never"), UnknownRequest)
    assert h.impl.snapshot().held_blocks() == 0
    assert h.violation is None


def test_lone_request_is_exempt_from_the_long_prefill_threshold() -> None:
    """vLLM skips long_prefill_token_threshold when nothing else runs or waits."""
    h = _h(max_num_batched_tokens=16, max_model_len=16, long_prefill_token_threshold=3)
    h.submit(ArRequest("a", 7, 1))
    h.step()
    assert _scheduled(h.events) == [("a", 7)]
    h.submit(ArRequest("b", 7, 1))
    h.submit(ArRequest("c", 7, 1))
    h.step()
    assert _scheduled(h.events)[1:] == [("b", 3), ("c", 3)]  # not alone: chunks of 3
    h.drain()


def test_full_sequence_gate_holds_back_what_only_its_first_chunk_fits() -> None:
    """6 usable blocks of 2 tokens. "a" holds 3; "b" (prompt 8: 4 blocks) could start a 3-token
    chunk in 2 of the 3 free blocks, but vLLM admits it only when all 4 fit."""
    h = _h(block_size=2, num_blocks=7, max_num_batched_tokens=4, max_num_seqs=2, max_model_len=12)
    h.submit(ArRequest("a", 5, 4))
    h.step()
    h.step()  # a: 5 computed, 3 blocks
    h.submit(ArRequest("b", 8, 1))
    start = len(h.events)
    h.step()
    assert _scheduled(h.events[start:]) == [("a", 1)]  # b waits for the whole sequence
    h.drain()
    assert h.outputs() == {"a": 4, "b": 1}
    assert h.violation is None


def test_priority_victim_is_lowest_priority_even_when_already_scheduled() -> None:
    """Under priority vLLM preempts the lowest priority among all running requests: "low",
    scheduled earlier in the same step, is unscheduled when "high" needs its blocks."""
    h = _h(
        Policy.PRIORITY,
        block_size=1,
        num_blocks=9,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        max_model_len=8,
    )
    h.submit(ArRequest("low", 3, 4, priority=5))
    h.step()  # low: 3 blocks
    h.submit(ArRequest("high", 4, 4, priority=0))
    h.step()  # high: 4 blocks (7 of 8 used)
    preempted: list[str] = []
    for _ in range(3):
        start = len(h.events)
        h.step()
        preempted += [e.request_id for e in h.events[start:] if isinstance(e, ArPreempted)]
    assert preempted and set(preempted) == {"low"}
    h.drain()
    assert h.outputs() == {"low": 4, "high": 4}
    assert h.violation is None


def test_unsupported_configurations_are_typed_errors() -> None:
    with pytest.raises(ConfigError) as err:
        REAL_VLLM.factory(ArConfig(policy=Policy.SJF), lambda e: None)
    assert err.value.field == "policy"
    with pytest.raises(ConfigError) as err:
        REAL_VLLM.factory(ArConfig(reserve_null_block=False), lambda e: None)
    assert err.value.field == "reserve_null_block"
    h = _h(block_size=4, num_blocks=3, max_model_len=32)  # 2 usable blocks = 8 tokens
    assert isinstance(h.submit(ArRequest("huge", 10, 2)), RequestTooLarge)


# ---------------------------------------------------------------- differential vs the reference
def test_reference_is_decision_identical_to_real_vllm() -> None:
    """The `vllm-v1` built-in (reference.ar.vllm_v1:VLLM_V1) and vLLM 0.33.0 make the same
    decisions (scheduled tokens, preemptions, finishes, step by step) on generated programs."""
    diffs: list[str] = []
    for seed in range(PROGRAMS):
        config, arrivals = program(seed)
        real = decisions(REAL_VLLM.factory, config, arrivals)
        ref = decisions(VLLM_V1.factory, config, arrivals)
        d = first_difference(real, ref)
        if d is not None:
            diffs.append(f"seed {seed} {config}: {d}")
    assert not diffs, f"{len(diffs)} of {PROGRAMS} programs differ; first: {diffs[:3]}"


def test_the_idealised_reference_differs_where_vllm_declares_options() -> None:
    """The differential can fail: the idealised reference (`make_vllm_v1`: no full-sequence gate,
    no lone-request exemption, victim among unscheduled requests) differs from vLLM."""
    differing = 0
    for seed in range(12):
        config, arrivals = program(seed)
        real = decisions(REAL_VLLM.factory, config, arrivals)
        ideal = decisions(make_vllm_v1, config, arrivals)
        differing += first_difference(real, ideal) is not None
    assert differing > 0


def test_events_are_reconstructed_in_step_order() -> None:
    """Allocation precedes the scheduled tokens it covers; every step ends with ArStepEnd."""
    h = _h(block_size=2, num_blocks=5, max_num_batched_tokens=8, max_num_seqs=2, max_model_len=9)
    h.submit(ArRequest("a", 3, 5))
    h.submit(ArRequest("b", 3, 5))
    h.drain()
    first = [type(e) for e in h.events[2:6]]
    assert first == [ArBlocksAllocated, ArScheduled, ArBlocksAllocated, ArScheduled]
    assert h.ended_steps() == h.spec.step_index
    assert h.outputs() == {"a": 5, "b": 5}


def test_missing_install_names_the_install_command(tmp_path: Path) -> None:
    """In a process without the install, the factory raises EngineNotInstalled (a ConfigError:
    exit 2 from the CLI) naming `schedspec install-engines vllm` — before importing vLLM."""
    code = (
        "from integrations.vllm import REAL_VLLM\n"
        "from spec.ar.config import ArConfig\n"
        "from spec.errors import ConfigError\n"
        "try:\n"
        "    REAL_VLLM.factory(ArConfig(), print)\n"
        "except ConfigError as e:\n"
        "    print(type(e).__name__, e)\n"
        "import sys\n"
        "print('vllm' in sys.modules)\n"
    )
    env = {**os.environ, "SCHEDSPEC_ENGINE_CACHE": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        check=True,
    ).stdout
    assert out.startswith("EngineNotInstalled")
    assert "schedspec install-engines vllm" in out
    assert out.strip().endswith("False")


# ---------------------------------------------------------------- asynchronous scheduling
def test_async_scheduling_builds_vllms_async_scheduler_and_refuses_sync_steps() -> None:
    """`async_scheduling=True` gives vLLM's own choice of class for it (AsyncScheduler, with the
    flag on as a GPU build leaves it); the AR step contract has one batch in flight, so `step()`
    refuses with a typed error naming the engine-core loop."""
    impl = RealVllmScheduler(ArConfig(max_model_len=16), lambda e: None, async_scheduling=True)
    assert type(impl.sched).__name__ == "AsyncScheduler"
    assert impl.sched.vllm_config.scheduler_config.async_scheduling is True
    with pytest.raises(ConfigError, match="engine_core") as err:
        impl.step()
    assert err.value.field == "async_scheduling"
    sync = RealVllmScheduler(ArConfig(max_model_len=16), lambda e: None)
    assert type(sync.sched).__name__ == "Scheduler"


def test_async_loop_schedules_ahead_and_discards_the_step_after_a_stop() -> None:
    """One request that stops at its 2nd output: the async loop schedules each decode before
    the previous output is known, so the step after the stop was scheduled and is thrown away;
    the output is the same 2 tokens as in the sync loop, and every block comes back."""
    config = ArConfig(block_size=2, num_blocks=6, max_num_batched_tokens=8, max_model_len=8)
    program = CoreProgram(config, ((ArRequest("r", 3, 4, stop_after=2),),), ((),))
    sync, run = check_both(program)
    assert sync.outputs == run.outputs and len(run.outputs["r"]) == 2
    assert sync.reasons == run.reasons == {"r": "stop"}
    assert (sync.ahead, sync.discarded) == (0, 0)
    assert run.ahead >= 1 and run.discarded == 1


def test_async_loop_passes_generated_programs_and_takes_every_async_path() -> None:
    """vLLM's async scheduling on generated programs (aborts, preemptions, prefix caching):
    every program passes both loops, and the programs do reach what is particular to async —
    scheduling ahead, stale output after a preemption, aborts and stops with a step in flight."""
    runs = passing_runs(PROGRAMS, lambda seed: check_both(core_program(seed)))
    taken = {
        key: sum(getattr(run, key) for _, run in runs)
        for key in ("ahead", "stale", "aborts_in_flight", "discarded")
    }
    assert all(n > 0 for n in taken.values()), taken


def test_async_loop_with_pipeline_stages_passes_and_keeps_the_cadence() -> None:
    """vLLM's V2 model runner runs pipeline parallelism with async scheduling: p + 1 batches in
    flight, and a request held back until p steps after its last decode. With 2 and 3 stages
    every generated program passes, `pp_cadence` included, and the cadence does hold requests
    back."""
    for stages, programs in ((2, PROGRAMS), (3, max(1, PROGRAMS // 3))):

        def run(seed: int, p: int = stages) -> tuple[CoreRun, CoreRun]:
            return check_both(core_program(seed), LoopOptions(pipeline_parallel_size=p))

        runs = passing_runs(programs, run, f"{stages} stages: ")
        assert sum(run.cadence_waits for _, run in runs) > 0, stages


def test_pipeline_stages_keep_vllms_batches_in_flight_and_need_async() -> None:
    """The loop keeps `VllmConfig.max_concurrent_batches` in flight: 2 asynchronously (V1
    model runner), stages + 1 with pipeline stages (V2, vLLM 0.34.0's only model runner);
    stages without async are refused."""
    config = ArConfig(max_model_len=16)
    assert RealVllmScheduler(config, lambda e: None).max_concurrent_batches == 1
    queued = RealVllmScheduler(config, lambda e: None, async_scheduling=True)
    assert queued.max_concurrent_batches == 2
    staged = RealVllmScheduler(
        config, lambda e: None, async_scheduling=True, pipeline_parallel_size=3
    )
    assert staged.max_concurrent_batches == 4
    assert getattr(staged.sched, "use_v2_model_runner", True)  # 0.34.0: no V1 runner left
    with pytest.raises(ConfigError, match="1 without async scheduling"):
        RealVllmScheduler(config, lambda e: None, pipeline_parallel_size=2)
    with pytest.raises(ConfigError, match="an integer >= 1"):
        RealVllmScheduler(config, lambda e: None, async_scheduling=True, pipeline_parallel_size=0)


def test_the_cadence_check_catches_a_scheduler_without_it() -> None:
    """Seeded bug: decodes staggered by 1 step whatever the stages (vLLM's XPU setting without
    microbatching) fail `pp_cadence` at 2 stages."""

    def no_cadence(sched: Any) -> None:
        sched.decode_stagger = 1

    seen = first_violations(
        PROGRAMS,
        lambda seed: check_both(
            core_program(seed), LoopOptions(mutate=no_cadence, pipeline_parallel_size=2)
        ),
    )
    assert set(seen) == {"pp_cadence"}, seen
    assert "fewer than pipeline_parallel_size=2 apart" in seen["pp_cadence"], seen


def _stale_output_not_marked(sched: Any) -> None:
    """Seeded bug: a preempted request's in-flight output is not marked stale."""
    original = sched._preempt_request

    def preempt(request: Any, *args: Any, **kwargs: Any) -> None:
        original(request, *args, **kwargs)
        request.num_stale_output_tokens = 0

    sched._preempt_request = preempt


def test_stale_output_marking_matters_only_with_pipeline_stages() -> None:
    """Not marking a preempted request's in-flight output stale changes nothing with a batch
    queue of two (that output always lands before the next `schedule()`), so no program fails;
    with 2 pipeline stages the request is resumed while it is still in flight and resamples a
    position: `output_content` fails."""
    unmarked = LoopOptions(mutate=_stale_output_not_marked)
    passing_runs(PROGRAMS, lambda seed: check_both(core_program(seed), unmarked))
    seen = first_violations(
        PROGRAMS,
        lambda seed: check_both(core_program(seed), replace(unmarked, pipeline_parallel_size=2)),
    )
    assert set(seen) == {"output_content"}, seen
    assert "they first differ at output" in seen["output_content"], seen


def _placeholders_never_resolved(sched: Any) -> None:
    """Seeded bug: an output that arrives does not resolve its placeholder."""
    original = sched._update_request_with_output

    def update(request: Any, new_token_ids: list[int], is_stale: bool = False) -> Any:
        before = request.num_output_placeholders
        result = original(request, new_token_ids, is_stale)
        request.num_output_placeholders = before
        return result

    sched._update_request_with_output = update


def _head_of_running_preempted(sched: Any) -> None:
    """Seeded bug: the running queue is reversed before each `schedule()`, so FCFS preempts
    its oldest request instead of its newest."""
    original = sched.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        sched.running.reverse()
        return original(*args, **kwargs)

    sched.schedule = schedule


SEEDED_BUGS = [
    (budget_raised, "token_budget", "max_num_batched_tokens="),
    (under_allocate, "kv_covers_scheduled", "computed or scheduled but holds"),
    (extra_seat, "seat_cap", "max_num_seqs="),
    (lifo_admission, "admission_order", "for the first time while"),
    (_head_of_running_preempted, "preemption_victim", "the last 1 are"),
    (_placeholders_never_resolved, "output_content", "expected"),
    (_placeholders_never_resolved, "progress", "not drained"),
    (abort_in_flight_leaks, "no_leak", "drained, but"),
    (abort_in_flight_leaks, "pool_accounting", "after aborting"),
    (stop_reported_as_length, "finish_reason", "finished with length, expected stop"),
    (preemption_in_flight_raises, "implementation_error", "AssertionError"),
    (stale_hash_on_reuse, "cache_hit_written", "starts from the prefix cache with block"),
    (reused_block_keeps_its_key, "cache_hit_written", "under a prefix-cache key, with other"),
    (new_blocks_not_announced, "runner_tables", "but its outputs gave the runner"),
    (finished_not_reported, "runner_tables", "freed without reporting them finished"),
]


@pytest.mark.parametrize(
    ("mutant", "rule", "words"),
    SEEDED_BUGS,
    ids=lambda v: getattr(v, "__name__", str(v))[:24],
)
def test_async_checks_catch_each_seeded_bug(
    mutant: Callable[[Any], None], rule: str, words: str
) -> None:
    """Each rule of the engine-core loop has teeth: a seeded bug in vLLM's async path fails
    it with a message that names the loop and what went wrong."""
    seen = first_violations(
        PROGRAMS,
        lambda seed: check_both(core_program(seed), LoopOptions(mutate=mutant)),
        until=rule,
    )
    assert rule in seen, f"no program failed [{rule}]; failures seen: {seen}"
    assert seen[rule].startswith(f"[{rule}] async loop: ") and words in seen[rule], seen[rule]


def test_every_async_loop_rule_has_a_seeded_bug() -> None:
    """Each rule of the AR engine-core loop is failed by at least one seeded bug: a row of
    SEEDED_BUGS, or its own test (`pp_cadence` below; `decode_position`, `draft_rows` and
    `drafts_skipped`, which need speculative decoding, in tests/test_real_vllm_speculative.py;
    `grammar_mask` and `draft_grammar`, which need structured output, in
    tests/test_real_vllm_structured.py; `load_before_compute`, `transfer_blocks_held`,
    `kv_written` and `kv_delivered`, which need a KV connector, in
    tests/test_real_vllm_kv_connector.py; `store_content` and `load_content`, which need
    vLLM's offloading connector, in tests/test_real_vllm_offloading.py; `kv_events`, which
    needs KV cache events on, in tests/test_real_vllm_kv_events.py; `max_loras`, which needs
    LoRA adapters, in tests/test_real_vllm_lora.py; `pause`, which needs pauses, in
    tests/test_real_vllm_pauses.py; `kv_event_content`, which needs KV cache events on, in
    tests/test_real_vllm_kv_event_content.py; `session_prompt` and `session_kv_kept`, which
    need streaming-input sessions, in tests/test_real_vllm_sessions.py, where released vLLM
    itself fails `session_length`; `active_cap`, `watermark` and `prefill_cadence`, which need
    vLLM's admission settings, and `idle_step`, the synchronous loop's, whose seeded bug holds
    decodes in a held step, in tests/test_real_vllm_admission.py; `inflight_kv_loads`,
    which needs vLLM 0.34.0's cap on in-flight KV loads, in
    tests/test_real_vllm_inflight_loads.py; `cache_read_limit`, which needs requests that
    bound their cache reads, in tests/test_real_vllm_cache_reads.py; `cache_aware_order`,
    which needs vLLM 0.34.0's cache-aware window, in
    tests/test_real_vllm_cache_aware_loop.py; the seven encoder rules, which need multimodal
    items, in tests/test_real_vllm_encoder.py; the three of the CPU encoder-cache offload in
    tests/test_real_vllm_encoder_offload.py)."""
    from tests import test_real_vllm_admission as admission
    from tests import test_real_vllm_cache_aware_loop as cache_aware_loop
    from tests import test_real_vllm_cache_reads as cache_reads
    from tests import test_real_vllm_encoder as encoder
    from tests import test_real_vllm_encoder_offload as encoder_offload
    from tests import test_real_vllm_inflight_loads as inflight_loads
    from tests import test_real_vllm_kv_connector as kv_connector
    from tests import test_real_vllm_kv_event_content as kv_event_content
    from tests import test_real_vllm_kv_events as kv_events
    from tests import test_real_vllm_lora as lora
    from tests import test_real_vllm_offloading as offloading
    from tests import test_real_vllm_pauses as pauses
    from tests import test_real_vllm_sessions as sessions
    from tests import test_real_vllm_speculative as speculative
    from tests import test_real_vllm_structured as structured

    covered = {rule for _, rule, _ in SEEDED_BUGS}
    covered |= {"pp_cadence", "decode_position", "draft_rows", "drafts_skipped"}
    covered |= {bug[1] for bug in structured.SEEDED_BUGS}
    covered |= {bug[1] for bug in kv_connector.SEEDED_BUGS}
    covered |= {bug[1] for bug in kv_connector.PRODUCER_SEEDED_BUGS}
    covered |= {bug[1] for bug in offloading.SEEDED_BUGS}
    covered |= {bug[1] for bug in kv_events.SEEDED_BUGS}
    covered |= {bug[1] for bug in kv_event_content.SEEDED_BUGS}
    covered |= {bug[1] for bug in lora.SEEDED_BUGS}
    covered |= {bug[1] for bug in sessions.SEEDED_BUGS}
    covered |= {bug[2] for bug in admission.SEEDED}
    covered |= {bug[2] for bug in admission.SYNC_SEEDED}
    covered |= {rule for _, rule in inflight_loads.SEEDED_BUGS}
    covered |= {rule for _, rule in cache_reads.SEEDED_BUGS}
    covered |= {bug[2] for bug in encoder.SEEDED_BUGS}
    covered |= {bug[1] for bug in encoder_offload.SEEDED_BUGS}
    # released vLLM fails it: test_finding_a_session_is_resumed_past_max_model_len
    covered.add("session_length")
    assert pauses.SEEDED_BUGS  # each fails `pause`, as its test asserts
    covered.add("pause")
    assert cache_aware_loop.SEEDED_BUGS  # each fails `cache_aware_order`, as its test asserts
    covered.add("cache_aware_order")
    assert covered == set(CORE_RULES), sorted(set(CORE_RULES) ^ covered)
    assert callable(globals().get("test_the_cadence_check_catches_a_scheduler_without_it"))
    assert callable(speculative.test_the_checks_catch_a_scheduler_that_keeps_rejected_drafts)
    assert callable(speculative.test_the_checks_catch_a_draft_without_a_row)
    assert callable(speculative.test_the_checks_catch_drafts_verified_after_a_skipped_step)


def test_a_core_program_needs_one_abort_tuple_per_step() -> None:
    with pytest.raises(ValueError, match="2 steps of arrivals but 1 of aborts"):
        CoreProgram(ArConfig(), ((), ()), ((),))


# ---------------------------------------------------------------- decision twins
def test_real_vllm_decides_as_its_re_implementation_through_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`verify --impl real-vllm[-prefix] --twin vllm-v1[-prefix]`: every example of the AR suite
    ends by running its operations through the reference; both decide alike, step by step
    (rule `twin_decisions`: tokens, preemptions, fresh blocks, finishes)."""
    from schedspec_cli.main import main

    for impl, twin in (("real-vllm", "vllm-v1"), ("real-vllm-prefix", "vllm-v1-prefix")):
        argv = ["verify", "--impl", impl, "--twin", twin, "--examples", str(EXAMPLES)]
        assert main(argv) == 0, capsys.readouterr().out
        assert twin in capsys.readouterr().out


# Two programs where vLLM 0.33's prefix cache hits and the `vllm-v1-prefix` reference did not,
# found by `verify --impl real-vllm-prefix --twin vllm-v1-prefix` (2026-11-25): each is
# (config, per step the (id, prompt tokens, max_tokens) arriving before it).
_EVICTION_ORDER = (  # r0's decode took r1's first freed block, the prefix r2 then missed
    ArConfig(
        block_size=1,
        num_blocks=14,
        max_num_batched_tokens=13,
        max_num_seqs=2,
        max_model_len=9,
        enable_chunked_prefill=False,
        enable_prefix_caching=True,
    ),
    [[("r0", (100,) * 5, 2), ("r1", (7,) * 5 + (100,) * 3, 1), ("r2", (7, 100), 1)]],
)
_EQUAL_CONTENT = (  # evicting r2's cached [100] lost r4's copy of the same content too
    ArConfig(
        block_size=1,
        num_blocks=13,
        max_num_batched_tokens=12,
        max_num_seqs=2,
        max_model_len=12,
        enable_chunked_prefill=False,
        enable_prefix_caching=True,
    ),
    [
        [("r0", (5,), 1)],
        [("r1", (7,) * 6, 6)],
        [("r2", (100,), 1)],
        [("r3", (100,), 1)],
        [("r4", (100,), 3)],
        [("r5", (100,), 1)],
    ],
)


@pytest.mark.parametrize(
    "case", [_EVICTION_ORDER, _EQUAL_CONTENT], ids=["eviction-order", "equal-content"]
)
def test_the_prefix_reference_hits_where_vllm_hits(
    case: tuple[ArConfig, list[list[tuple[str, tuple[int, ...], int]]]],
) -> None:
    from reference.ar.prefix_cache import VLLM_V1_PREFIX
    from spec.ar.events import ArCacheHit

    config, steps = case
    arrivals = [
        [ArRequest(rid, len(prompt), most, prompt=prompt) for rid, prompt, most in batch]
        for batch in steps
    ]
    real = decisions(REAL_VLLM_PREFIX.factory, config, arrivals)
    assert first_difference(real, decisions(VLLM_V1_PREFIX.factory, config, arrivals)) is None
    events: list[ArEvent] = []
    impl = REAL_VLLM_PREFIX.factory(config, events.append)
    for batch in arrivals:
        for r in batch:
            impl.submit(r)
        impl.step()
    impl.drain(100)
    assert any(isinstance(e, ArCacheHit) for e in events), "the program no longer hits"


def test_a_log_of_real_vllm_checks_under_its_profile_and_decides_as_its_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`schedspec check-trace LOG --profile real-vllm --twin vllm-v1` on a log vLLM's own
    scheduler wrote under the priority policy (three preemptions, an abort) conforms under the
    profile vLLM declares, and the re-implementation, and vLLM itself run again on the log's
    operations, decide alike step by step."""
    import random

    from schedspec_cli.main import main
    from spec.ar.trace import write_ar_trace

    config = ArConfig(
        block_size=2,
        num_blocks=12,
        max_num_seqs=3,
        max_num_batched_tokens=8,
        max_model_len=16,
        policy=Policy.PRIORITY,
    )
    h = ArHarness(REAL_VLLM.factory, config)
    rng = random.Random(6)
    for i in range(8):
        h.submit(
            ArRequest(f"r{i}", rng.randrange(1, 8), rng.randrange(1, 8), priority=rng.randrange(3))
        )
        h.step()
        if i == 5:
            h.abort("r2")
    h.drain()
    assert sum(isinstance(e, ArPreempted) for e in h.events) == 3
    log = tmp_path / "vllm.jsonl"
    with log.open("w", encoding="utf-8") as sink:
        write_ar_trace(h.events, sink, config)
    for twin in ("vllm-v1", "real-vllm"):
        code = main(["check-trace", str(log), "--profile", "real-vllm", "--twin", twin])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "under the profile of real-vllm" in out
        assert f"its twin {twin} decides alike in all" in out


# --- a live scheduler's own event log (integrations.vllm.event_log) -----------------------------


def _logged_run(
    config: ArConfig,
    plant: Callable[[Any], None] | None = None,
    knobs: AdmissionKnobs = VLLM_ADMISSION,
) -> tuple[list[str], list[ArEvent]]:
    """A program run on vLLM's scheduler (driven by the adapter, as an engine core would drive
    it; built with vLLM's admission settings `knobs`) with `VllmEventLog` attached: the log's
    lines, and the adapter's own events."""
    import random

    from integrations.vllm.event_log import VllmEventLog

    lines: list[str] = []
    events: list[ArEvent] = []
    adapter = RealVllmScheduler(config, events.append, SETTINGS_SPACE, admission=knobs)
    if plant is not None:
        plant(adapter.sched)
    VllmEventLog(adapter.sched, lines.append)
    rng = random.Random(6)
    for i in range(8):
        prompt, out, prio = rng.randrange(1, 8), rng.randrange(1, 8), rng.randrange(3)
        stop = 1 if i % 3 == 0 else None  # a stop token as the first output
        adapter.submit(ArRequest(f"r{i}", prompt, out, stop_after=stop, priority=prio))
        adapter.step()
        if i == 5:
            adapter.abort("r4")
    for _ in range(200):
        if adapter.is_idle():
            break
        adapter.step()
    return lines, events


def test_a_live_vllm_scheduler_logs_what_it_decides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`VllmEventLog` on a vLLM scheduler that something else drives writes a log whose header
    declares vLLM's policy, whose stops are sampled (a live scheduler cannot know them), which
    `check-trace` passes alone and with the re-implementation as its twin, and whose decisions
    are exactly those the adapter derived from the same run."""
    from schedspec_cli.main import main
    from spec.ar.decisions import step_decisions
    from spec.ar.trace import ArTraceReader

    config = ArConfig(
        block_size=2,
        num_blocks=8,
        max_num_seqs=3,
        max_num_batched_tokens=8,
        max_model_len=16,
        policy=Policy.PRIORITY,
    )
    lines, events = _logged_run(config)
    from integrations.vllm.manifest import MANIFEST

    assert json.loads(lines[0])["writer"] == f"vllm {MANIFEST.version}"  # vLLM's own class
    assert any(isinstance(e, ArPreempted) for e in events)
    assert any(isinstance(e, ArAborted) for e in events)
    assert any(isinstance(e, ArFinished) and e.reason is ArFinishReason.STOP for e in events)
    with ArTraceReader(lines) as reader:
        logged = [e for _, e in reader]
        assert reader.header is not None and reader.header.config == config
    assert step_decisions(logged) == step_decisions(events)
    log = tmp_path / "vllm-live.jsonl"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for extra in ([], ["--twin", "vllm-v1"], ["--profile", "real-vllm", "--twin", "real-vllm"]):
        code = main(["check-trace", str(log), *extra])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "conform to the spec under" in out
        assert not extra or "decides alike in all" in out
        assert out.splitlines()[-1] == f"{log}: written by vllm {MANIFEST.version}", out


def _served_by_a_subclass(sched: Any) -> None:
    """Makes `sched` an instance of a subclass of its class defined here, outside vLLM (as a
    maintainer's `--scheduler-cls` would be)."""
    sched.__class__ = type("ServedScheduler", (type(sched),), {"__module__": __name__})


def test_a_live_log_of_a_scheduler_class_of_ones_own_names_the_class() -> None:
    """A log of a server run with a scheduler class of its own says so: its verdict is about
    that class, not vLLM's release alone."""
    from integrations.vllm.manifest import MANIFEST

    config = ArConfig(block_size=2, num_blocks=8, max_num_seqs=3, max_num_batched_tokens=8)
    lines, _ = _logged_run(config, plant=_served_by_a_subclass)
    assert json.loads(lines[0])["writer"] == (
        f"vllm {MANIFEST.version}, scheduler_cls {__name__}.ServedScheduler"
    )


@pytest.mark.parametrize(
    ("bug", "rule"),
    [("lifo_admission", "fcfs_admission"), ("under_allocate", "kv_covers_scheduled")],
)
def test_a_live_log_shows_a_seeded_bug_in_vllms_scheduler(bug: str, rule: str) -> None:
    from properties.ar.trace_check import check_ar_trace
    from tests import vllm_seeded_bugs

    config = ArConfig(
        block_size=2, num_blocks=12, max_num_seqs=2, max_num_batched_tokens=8, max_model_len=16
    )
    lines, _ = _logged_run(config, getattr(vllm_seeded_bugs, bug))
    result = check_ar_trace(lines)
    assert result.violation is not None and result.violation.rule == rule, result.violation


def test_a_live_log_refuses_an_asynchronous_scheduler_and_detaches() -> None:
    from integrations.vllm.event_log import VllmEventLog

    config = ArConfig(block_size=2, num_blocks=12, max_num_batched_tokens=8, max_model_len=16)
    eager = RealVllmScheduler(config, lambda e: None, async_scheduling=True)
    with pytest.raises(ConfigError, match="async_scheduling"):
        VllmEventLog(eager.sched, print)
    sync = RealVllmScheduler(config, lambda e: None)
    own = sync.sched.schedule
    log = VllmEventLog(sync.sched, lambda line: None)
    assert sync.sched.schedule != own
    log.detach()
    assert sync.sched.schedule == own and "schedule" not in vars(sync.sched)


def test_a_live_log_from_the_engine_core_loop_checks_and_decides_as_the_reference() -> None:
    """The log `VllmEventLog` writes while vLLM's synchronous engine-core loop drives the
    scheduler (`integrations.vllm.engine_core`: schedule, execute, update_from_output; aborts
    between steps) conforms to vLLM's declared policy and decides step by step as the
    re-implementation (`vllm-v1`, or `vllm-v1-prefix` with prefix caching) on the log's own
    operations, stops placed where vLLM sampled them. CI runs 8 programs;
    `SCHEDSPEC_VLLM_LOG_PROGRAMS=200 pytest tests/test_real_vllm.py -k engine_core_loop` runs
    200 (all passed when this was written)."""
    from integrations.vllm.engine_core import EngineCoreLoop, core_program
    from integrations.vllm.event_log import VllmEventLog
    from properties.ar.decisions import operations, twin_difference
    from properties.ar.harness import ArDrain
    from properties.ar.trace_check import check_ar_trace
    from reference.ar.prefix_cache import VLLM_V1_PREFIX

    kinds = set()
    for seed in range(LOG_PROGRAMS):
        program = core_program(seed)
        lines: list[str] = []

        def attach(sched: Any, lines: list[str] = lines) -> None:
            VllmEventLog(sched, lines.append)

        EngineCoreLoop(program.config, async_scheduling=False, mutate=attach).run(program)
        kept: list[ArEvent] = []
        result = check_ar_trace(lines, keep=kept)
        assert result.ok and result.idle_at_end and result.config == program.config, (
            seed,
            result.violation,
        )
        ops = [*operations(kept, result.sampled_stops), ArDrain(10_000)]
        twin = VLLM_V1_PREFIX if program.config.enable_prefix_caching else VLLM_V1
        assert twin_difference(ops, kept, program.config, twin.factory, result.policy) is None
        kinds.add((program.config.policy, program.config.enable_prefix_caching))
    assert LOG_PROGRAMS < 8 or len(kinds) >= 3  # both policies, prefix caching on and off
