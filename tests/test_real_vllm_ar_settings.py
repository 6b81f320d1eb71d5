"""vLLM's admission settings under the AR spec: `real-vllm-watermark` (vLLM 0.33.0 with
`SchedulerConfig.watermark=0.25`), `real-vllm-no-reserve` (`scheduler_reserve_full_isl=False`)
and `real-vllm-adaptive` (`long_prefill_token_threshold_adaptive=True`) conform to their
declared profiles and decide as their re-implementations `vllm-v1-watermark`,
`vllm-v1-no-reserve` and `vllm-v1-adaptive`; what each profile declares is needed; a live
scheduler's event log declares the settings it runs with."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from integrations.vllm import (
    MANIFEST,
    REAL_VLLM,
    REAL_VLLM_ADAPTIVE,
    REAL_VLLM_CADENCE,
    REAL_VLLM_CADENCE_FIXED,
    REAL_VLLM_CADENCE_PROFILE,
    REAL_VLLM_NO_RESERVE,
    REAL_VLLM_NO_RESERVE_PROFILE,
    REAL_VLLM_PROFILE,
    REAL_VLLM_WATERMARK,
    REAL_VLLM_WATERMARK_PROFILE,
    VLLM_PREFILL_INTERVAL,
    VLLM_WATERMARK,
)
from integrations.vllm.admission_knobs import AdmissionKnobs
from integrations.vllm.cadence_fix import CADENCE_FIXES
from integrations.vllm.differential import decisions, first_difference, program
from properties.ar.conformance import ar_conformance_machine
from properties.ar.harness import ArHarness
from properties.verify import failure_from, run_machine
from reference.ar import prefix_cache, vllm_settings
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArEvent, ArScheduled, ArStepEnd
from spec.ar.profile import ArPolicy, ArProfile
from spec.errors import SpecViolation
from spec.implementation import ArImplementation
from tests.engine_gate import require_engine
from tests.patch_check import apply_fix_set
from tests.test_ar_mutants import HUNT
from tests.test_real_vllm import _logged_run
from tests.tier import depth

EXAMPLES = int(os.environ.get("SCHEDSPEC_VLLM_EXAMPLES", depth(20, 40)))


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


@pytest.mark.parametrize("setting", ["watermark", "no-reserve", "adaptive"])
def test_real_vllm_with_an_admission_setting_conforms_and_decides_as_its_twin(
    setting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify --impl real-vllm-SETTING --twin vllm-v1-SETTING`: the suite under the declared
    profile (prefix caching off and on), each example replayed through the twin."""
    from schedspec_cli.main import main

    argv = ["verify", "--impl", f"real-vllm-{setting}", "--twin", f"vllm-v1-{setting}"]
    assert main([*argv, "--examples", str(EXAMPLES)]) == 0, capsys.readouterr().out
    assert f"vllm-v1-{setting}" in capsys.readouterr().out
    # the twin runs vLLM with the same fraction
    assert vllm_settings.VLLM_WATERMARK == VLLM_WATERMARK


def _scheduled(events: list[ArEvent]) -> list[tuple[str, int]]:
    return [(e.request_id, e.num_tokens) for e in events if isinstance(e, ArScheduled)]


# 8 usable blocks of 2 tokens, the null block besides: the watermark is int(0.25 * 9) = 2
WATERMARKED = ArConfig(
    block_size=2, num_blocks=9, max_num_batched_tokens=16, max_num_seqs=2, max_model_len=16
)


def test_the_watermark_holds_back_an_admission_beside_a_running_request() -> None:
    """a holds 4 blocks; b's whole 5-token prompt needs 3 of the 4 free, which would leave 1
    below the watermark of 2: vLLM with the watermark keeps b waiting, without it admits b."""
    runs = {}
    for impl in (REAL_VLLM_WATERMARK, REAL_VLLM):
        h = ArHarness(impl.factory, WATERMARKED, policy=impl.profile.policy)
        h.submit(ArRequest("a", 7, 3))
        h.step()
        h.submit(ArRequest("b", 5, 1))
        start = len(h.events)
        h.step()
        runs[impl] = _scheduled(h.events[start:])
        h.drain()
        assert h.violation is None, h.violation
        assert h.outputs() == {"a": 3, "b": 1}
    assert runs[REAL_VLLM_WATERMARK] == [("a", 1)]
    assert runs[REAL_VLLM] == [("a", 1), ("b", 5)]


def test_with_nothing_running_a_request_may_take_the_pool_below_the_watermark() -> None:
    """a, alone, takes 7 of the 8 usable blocks: vLLM keeps no watermark beside nothing."""
    h = ArHarness(
        REAL_VLLM_WATERMARK.factory, WATERMARKED, policy=REAL_VLLM_WATERMARK_PROFILE.policy
    )
    h.submit(ArRequest("a", 14, 2))
    h.step()
    assert _scheduled(h.events) == [("a", 14)]
    assert h.impl.snapshot().held_blocks() == 7
    h.drain()
    assert h.violation is None, h.violation
    # the same run, were the watermark kept beside nothing too
    always = dataclasses.replace(REAL_VLLM_WATERMARK_PROFILE.policy, watermark_beside_running=False)
    h = ArHarness(REAL_VLLM_WATERMARK.factory, WATERMARKED, policy=always)
    h.submit(ArRequest("a", 14, 2))
    with pytest.raises(SpecViolation, match=r"leaves 1 free block\(s\) < watermark 2") as err:
        h.step()
    assert err.value.rule == "admission_watermark"


def test_the_suite_fails_real_vllm_where_the_profile_keeps_the_watermark_beside_nothing() -> None:
    """Leaving `watermark_beside_running` out of the profile, the suite finds vLLM's lone
    admission below the watermark (its chunk, or under the whole-sequence gate its whole
    sequence) and prints a replayable program."""
    policy = dataclasses.replace(REAL_VLLM_WATERMARK_PROFILE.policy, watermark_beside_running=False)
    profile = ArProfile(space=REAL_VLLM_WATERMARK_PROFILE.space, policy=policy)
    err, printed = run_machine(
        ar_conformance_machine(REAL_VLLM_WATERMARK.factory, profile=profile), HUNT
    )
    assert isinstance(err, SpecViolation), err
    # the chunk, or the whole sequence, of a request admitted with nothing running
    assert err.rule in ("admission_watermark", "full_sequence_admission"), err
    assert "watermark" in str(err).splitlines()[0], err
    assert "running: []" in str(err), err
    assert "state.configure(config=" in failure_from(err, printed).program


def test_the_twin_without_the_watermark_decides_otherwise() -> None:
    """`vllm-v1-prefix` (no watermark) parts from vLLM with the watermark on the program of
    the first test: the twin check sees the watermark."""
    arrivals = [[ArRequest("a", 7, 3)], [ArRequest("b", 5, 1)]]
    real = decisions(REAL_VLLM_WATERMARK.factory, WATERMARKED, arrivals)
    twin = vllm_settings.VLLM_V1_WATERMARK.factory
    assert first_difference(real, decisions(twin, WATERMARKED, arrivals)) is None
    plain = decisions(prefix_cache.VLLM_V1_PREFIX.factory, WATERMARKED, arrivals)
    assert first_difference(real, plain) is not None


# --- without the whole-sequence reservation ------------------------------------------------------


def test_without_the_reservation_vllm_admits_what_only_its_first_chunk_fits() -> None:
    """6 usable blocks of 2 tokens; "a" holds 3. "b" (prompt 8: 4 blocks) starts a 3-token
    chunk (the budget less a's decode) in 2 of the 3 free blocks: vLLM without the
    reservation admits it, and the spec under `real-vllm`'s profile (which declares the gate)
    reports it; under `real-vllm-no-reserve`'s the run passes and decides as its twin."""
    config = ArConfig(
        block_size=2, num_blocks=7, max_num_batched_tokens=4, max_num_seqs=2, max_model_len=12
    )

    def run(policy: ArPolicy) -> ArHarness:
        h = ArHarness(REAL_VLLM_NO_RESERVE.factory, config, policy=policy)
        h.submit(ArRequest("a", 5, 4))
        h.step()
        h.step()  # a: 5 computed, 3 blocks
        h.submit(ArRequest("b", 8, 1))
        h.step()
        return h

    h = run(REAL_VLLM_NO_RESERVE_PROFILE.policy)
    assert ("b", 3) in _scheduled(h.events)
    h.drain()
    assert h.violation is None, h.violation
    assert h.outputs() == {"a": 4, "b": 1}
    with pytest.raises(SpecViolation, match="whole sequence") as err:
        run(REAL_VLLM_PROFILE.policy)
    assert err.value.rule == "full_sequence_admission"
    arrivals = [[ArRequest("a", 5, 4)], [], [ArRequest("b", 8, 1)]]
    real = decisions(REAL_VLLM_NO_RESERVE.factory, config, arrivals)
    twin = decisions(vllm_settings.VLLM_V1_NO_RESERVE.factory, config, arrivals)
    assert first_difference(real, twin) is None
    gated = decisions(prefix_cache.VLLM_V1_PREFIX.factory, config, arrivals)
    assert first_difference(real, gated) is not None


# --- the adaptive long-prefill threshold ------------------------------------------------------


def test_the_adaptive_threshold_gives_each_request_a_fair_share_of_the_budget() -> None:
    """Threshold 2, budget 12, two 10-token prompts: vLLM's adaptive threshold schedules 6 of
    each (12 // 2), plain vLLM 2 of each; the spec under `real-vllm`'s profile reports the
    adaptive run, under `real-vllm-adaptive`'s it passes."""
    config = ArConfig(
        block_size=2,
        num_blocks=20,
        max_num_batched_tokens=12,
        max_num_seqs=2,
        max_model_len=16,
        long_prefill_token_threshold=2,
    )
    firsts = {}
    for impl in (REAL_VLLM_ADAPTIVE, REAL_VLLM):
        h = ArHarness(impl.factory, config, policy=impl.profile.policy)
        h.submit(ArRequest("a", 10, 1))
        h.submit(ArRequest("b", 10, 1))
        h.step()
        firsts[impl] = _scheduled(h.events)
        h.drain()
        assert h.violation is None, h.violation
    assert firsts[REAL_VLLM_ADAPTIVE] == [("a", 6), ("b", 6)]
    assert firsts[REAL_VLLM] == [("a", 2), ("b", 2)]
    h = ArHarness(REAL_VLLM_ADAPTIVE.factory, config, policy=REAL_VLLM_PROFILE.policy)
    h.submit(ArRequest("a", 10, 1))
    h.submit(ArRequest("b", 10, 1))
    with pytest.raises(SpecViolation, match="6 tokens > long_prefill_token_threshold=2") as err:
        h.step()
    assert err.value.rule == "long_prefill_threshold"


# --- the prefill cadence -----------------------------------------------------------------------


def test_the_cadence_reference_decides_as_vllm_with_its_prefill_interval() -> None:
    """`VLLM_V1_CADENCE` (the reference with `prefill_interval=3`) and vLLM with
    `prefill_schedule_interval=3` decide alike on 300 generated programs; the cadence changes
    vLLM's decisions on some of them."""
    twin = vllm_settings.VLLM_V1_CADENCE.factory
    changed = 0
    for seed in range(300):
        config, arrivals = program(seed)
        real = decisions(REAL_VLLM_CADENCE.factory, config, arrivals)
        assert first_difference(real, decisions(twin, config, arrivals)) is None, seed
        changed += (
            first_difference(real, decisions(REAL_VLLM.factory, config, arrivals)) is not None
        )
    assert changed > 0
    assert vllm_settings.VLLM_PREFILL_INTERVAL == VLLM_PREFILL_INTERVAL


# Found by `verify --impl reference.ar.vllm_settings:VLLM_V1_CADENCE` (the reference, which
# decides as vLLM does) and replayed on vLLM: 8 usable blocks of one token, a budget of 3, a
# long-prefill threshold of 2.
CADENCE_EMPTY_STEP = ArConfig(
    block_size=1,
    num_blocks=9,
    max_num_batched_tokens=3,
    max_num_seqs=2,
    max_model_len=6,
    long_prefill_token_threshold=2,
)


def _cadence_empty_step(impl: ArImplementation, policy: ArPolicy) -> ArHarness:
    h = ArHarness(impl.factory, CADENCE_EMPTY_STEP, policy=policy)
    h.step()
    h.submit(ArRequest("r0", 5, 1))
    h.submit(ArRequest("r1", 1, 5))
    for _ in range(12):
        h.step()
    return h


def test_finding_a_held_step_whose_only_decode_preempts_itself_schedules_nothing() -> None:
    """vLLM 0.33.0 with `prefill_schedule_interval=3`: r0 is still in its prefill and r1
    decodes, so step 5 starts held and skips r0's next chunk; r1 then needs a block, none is
    free, and r1, the tail of the running requests, preempts itself. Nothing else may run in a
    held step: step 5 schedules nothing while r0 runs and r1 waits (`progress`). vLLM's
    comment says a held step's "decodes still run to fill this step"; here none is left. The
    next step is not held (no request decodes) and r0 goes on: one wasted iteration, no
    stall. Without the cadence, r0 runs in step 5 (it preempts r1 for its block); with the
    candidate fix, too, and the fixed twin decides alike."""
    policy = REAL_VLLM_CADENCE_PROFILE.policy
    with pytest.raises(SpecViolation) as err:
        _cadence_empty_step(REAL_VLLM_CADENCE, policy)
    assert err.value.rule == "progress"
    assert str(err.value).startswith(
        "[progress] step 5 scheduled nothing with 1 running and 1 waiting"
    ), err.value
    # the reference decides as vLLM does, up to the same empty step
    with pytest.raises(SpecViolation, match=r"step 5 scheduled nothing"):
        _cadence_empty_step(vllm_settings.VLLM_V1_CADENCE, policy)
    h = _cadence_empty_step(REAL_VLLM, REAL_VLLM_PROFILE.policy)
    h.drain()
    assert h.violation is None and h.outputs() == {"r0": 1, "r1": 5}
    # with the candidate fix (`lift-empty-hold`) step 5 lifts its hold and runs r0's chunk
    h = _cadence_empty_step(REAL_VLLM_CADENCE_FIXED, policy)
    assert ("r0", 1) in _step_scheduled(h.events, 5)
    h.drain()
    assert h.violation is None and h.outputs() == {"r0": 1, "r1": 5}
    arrivals = [[], [ArRequest("r0", 5, 1), ArRequest("r1", 1, 5)]]
    fixed = decisions(REAL_VLLM_CADENCE_FIXED.factory, CADENCE_EMPTY_STEP, arrivals)
    twin = decisions(vllm_settings.VLLM_V1_CADENCE_FIXED.factory, CADENCE_EMPTY_STEP, arrivals)
    assert first_difference(fixed, twin) is None


def _step_scheduled(events: list[ArEvent], step: int) -> list[tuple[str, int]]:
    """What step `step` scheduled (the events after `ArStepEnd(step - 1)`)."""
    ends = [i for i, e in enumerate(events) if isinstance(e, ArStepEnd)]
    return _scheduled(events[ends[step - 1] + 1 : ends[step]])


def test_the_cadence_fix_is_one_patch_of_vllms_scheduler(tmp_path: Path) -> None:
    """`scripts/engine_fixes_diff.py vllm-cadence` prints the edit the tests run (one insertion
    in `Scheduler.schedule`'s running loop): applied with `git apply -p1` to a copy of vLLM's
    `scheduler.py`, it gives the very text they run."""
    diff, patched = apply_fix_set(tmp_path, CADENCE_FIXES)
    assert "\n-    " not in diff, diff  # an insertion only
    assert "defer_prefills = False" in next(iter(patched.values()))


# --- a live scheduler's event log declares the watermark it runs with ---------------------------


LIVE = ArConfig(
    block_size=2, num_blocks=12, max_num_seqs=3, max_num_batched_tokens=8, max_model_len=16
)


def test_a_live_log_declares_the_watermark_and_checks_and_decides_under_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`VllmEventLog` on a scheduler with `watermark=0.25` declares it as vLLM keeps it; the
    log passes `check-trace`, alone and with `vllm-v1-watermark` as its twin; the same
    scheduler keeping no watermark (the seeded bug `watermark_ignored`) fails it."""
    from properties.ar.trace_check import check_ar_trace
    from schedspec_cli.main import main
    from spec.ar.trace import ArTraceReader
    from tests.vllm_seeded_bugs import watermark_ignored

    knobs = AdmissionKnobs(watermark=VLLM_WATERMARK)
    lines, _ = _logged_run(LIVE, knobs=knobs)
    with ArTraceReader(lines) as reader:
        list(reader)
        assert reader.header is not None
        assert reader.header.policy == dataclasses.replace(
            REAL_VLLM_WATERMARK_PROFILE.policy, rules=reader.header.policy.rules
        )
    log = tmp_path / "vllm-watermark.jsonl"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for extra in ([], ["--twin", "vllm-v1-watermark"]):
        code = main(["check-trace", str(log), *extra])
        out = capsys.readouterr().out
        assert code == 0, out
        assert not extra or "decides alike in all" in out
    result = check_ar_trace(_logged_run(LIVE, watermark_ignored, knobs)[0])
    assert result.violation is not None, "the planted bug went unseen"
    assert result.violation.rule in ("admission_watermark", "full_sequence_admission")
    assert "watermark" in str(result.violation).splitlines()[0]


def test_a_live_log_declares_the_active_cap_and_no_whole_sequence_gate() -> None:
    """`max_num_active_seqs` becomes the header's seat cap, and
    `scheduler_reserve_full_isl=False` takes `full_sequence_admission` out of the declared
    policy; the log passes under them."""
    from properties.ar.trace_check import check_ar_trace
    from spec.ar.trace import ArTraceReader

    lines, _ = _logged_run(LIVE, knobs=AdmissionKnobs(max_active_seqs=2, reserve_full_isl=False))
    with ArTraceReader(lines) as reader:
        list(reader)
        assert reader.header is not None
        assert reader.header.config.max_num_seqs == 2
        assert not reader.header.policy.full_sequence_admission
    assert check_ar_trace(lines).violation is None


def test_a_live_log_declares_an_adaptive_threshold_and_decides_as_its_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With `long_prefill_token_threshold_adaptive`, the header declares
    `adaptive_long_prefill_threshold`; the log passes `check-trace`, with `vllm-v1-adaptive`
    as its twin, and fails it with the declaration taken out of its header."""
    from properties.ar.trace_check import check_ar_trace
    from schedspec_cli.main import main
    from spec.ar.trace import ArTraceReader

    config = LIVE.replace(long_prefill_token_threshold=2)
    lines, _ = _logged_run(config, knobs=AdmissionKnobs(adaptive_threshold=True))
    with ArTraceReader(lines) as reader:
        list(reader)
        assert reader.header is not None
        assert reader.header.policy.adaptive_long_prefill_threshold
    log = tmp_path / "vllm-adaptive.jsonl"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code = main(["check-trace", str(log), "--twin", "vllm-v1-adaptive"])
    out = capsys.readouterr().out
    assert code == 0 and "decides alike in all" in out, out
    # the same log, its header declaring no floor: the spec reports the fair-share chunks
    header = json.loads(lines[0])
    del header["declared_policy"]["adaptive_long_prefill_threshold"]
    result = check_ar_trace([json.dumps(header), *lines[1:]])
    assert result.violation is not None and result.violation.rule == "long_prefill_threshold"


def test_a_live_log_declares_the_prefill_cadence_it_runs_with() -> None:
    """With `prefill_schedule_interval=3` the header declares `prefill_interval=3` and the log
    passes; declared as 4, the spec holds a step vLLM released (`prefill_cadence`)."""
    from properties.ar.trace_check import check_ar_trace
    from spec.ar.trace import ArTraceReader

    config = LIVE.replace(long_prefill_token_threshold=2)
    lines, _ = _logged_run(config, knobs=AdmissionKnobs(prefill_interval=VLLM_PREFILL_INTERVAL))
    with ArTraceReader(lines) as reader:
        list(reader)
        assert reader.header is not None
        assert reader.header.policy.prefill_interval == VLLM_PREFILL_INTERVAL
    assert check_ar_trace(lines).violation is None
    header = json.loads(lines[0])
    header["declared_policy"]["prefill_interval"] = VLLM_PREFILL_INTERVAL + 1
    result = check_ar_trace([json.dumps(header), *lines[1:]])
    assert result.violation is not None and result.violation.rule == "prefill_cadence"


#: Generated programs whose no-reserve logs `check-trace --twin vllm-v1` (or `vllm-v1-prefix`)
#: found deciding otherwise while the header left `full_sequence_admission` out (9 of the first
#: 100 `core_program` seeds): the twin kept its own whole-sequence reservation.
NO_RESERVE_SEEDS = (6, 7, 13)


@pytest.mark.parametrize("seed", NO_RESERVE_SEEDS)
def test_a_no_reserve_log_says_so_and_the_plain_twin_is_rebuilt_without_it(
    seed: int, tmp_path: Path
) -> None:
    """vLLM with `scheduler_reserve_full_isl=False`: the header writes
    `"full_sequence_admission": false` out (a header leaving it out says nothing), and
    `--twin vllm-v1` (`vllm-v1-prefix` with prefix caching), rebuilt without the reservation,
    decides alike; with the setting taken out of the header it keeps its own and differs."""
    from integrations.vllm.engine_core import EngineCoreLoop, core_program
    from integrations.vllm.event_log import VllmEventLog
    from tests.test_twin_settings import check

    program = core_program(seed)
    lines: list[str] = []

    def attach(scheduler: object) -> None:
        VllmEventLog(scheduler, lines.append)

    EngineCoreLoop(
        program.config,
        async_scheduling=False,
        mutate=attach,
        admission=AdmissionKnobs(reserve_full_isl=False),
    ).run(program)
    header = json.loads(lines[0])
    assert header["declared_policy"]["full_sequence_admission"] is False
    twin = "vllm-v1-prefix" if program.config.enable_prefix_caching else "vllm-v1"
    log = tmp_path / "no-reserve.jsonl"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, said = check(str(log), "--twin", twin)
    assert code == 0 and "(with full_sequence_admission=False) decides alike" in said, said
    del header["declared_policy"]["full_sequence_admission"]
    log.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    code, said = check(str(log), "--twin", twin)
    assert code == 1 and f"[twin_decisions] against {twin}: step " in said, said
