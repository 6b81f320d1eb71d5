"""vLLM's admission watermark under the AR spec: `real-vllm-watermark` (vLLM 0.33.0 with
`SchedulerConfig.watermark=0.25`) conforms to its declared profile and decides as its
re-implementation `vllm-v1-watermark`; what the profile declares is each needed."""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

from integrations.vllm import (
    MANIFEST,
    REAL_VLLM,
    REAL_VLLM_WATERMARK,
    REAL_VLLM_WATERMARK_PROFILE,
    VLLM_WATERMARK,
)
from integrations.vllm.adapter import SPACE_WATERMARK, RealVllmScheduler
from integrations.vllm.admission_knobs import AdmissionKnobs
from integrations.vllm.differential import decisions, first_difference
from properties.ar.conformance import ar_conformance_machine
from properties.ar.harness import ArHarness
from properties.verify import failure_from, run_machine
from reference.ar import prefix_cache
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArEvent, ArScheduled
from spec.ar.profile import ArProfile
from spec.errors import ConfigError, SpecViolation
from tests.engine_gate import require_engine

EXAMPLES = int(os.environ.get("SCHEDSPEC_VLLM_EXAMPLES", "40"))

# Derandomized, no shrinking: the hunt for a profile that leaves an option out.
HUNT = settings(
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    max_examples=300,
    derandomize=True,
    deadline=None,
    database=None,
    stateful_step_count=30,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def test_real_vllm_with_a_watermark_conforms_and_decides_as_its_twin(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`verify --impl real-vllm-watermark --twin vllm-v1-watermark`: the suite under the
    declared profile (prefix caching off and on), each example replayed through the twin."""
    from schedspec_cli.main import main

    argv = ["verify", "--impl", "real-vllm-watermark", "--twin", "vllm-v1-watermark"]
    assert main([*argv, "--examples", str(EXAMPLES)]) == 0, capsys.readouterr().out
    assert "vllm-v1-watermark" in capsys.readouterr().out
    # the twin runs vLLM with the same fraction
    assert prefix_cache.VLLM_WATERMARK == VLLM_WATERMARK


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
    twin = prefix_cache.VLLM_V1_WATERMARK.factory
    assert first_difference(real, decisions(twin, WATERMARKED, arrivals)) is None
    plain = decisions(prefix_cache.VLLM_V1_PREFIX.factory, WATERMARKED, arrivals)
    assert first_difference(real, plain) is not None


# --- a live scheduler's event log declares the watermark it runs with ---------------------------


def _live_log(
    config: ArConfig, knobs: AdmissionKnobs, plant: Callable[[Any], None] | None = None
) -> list[str]:
    """A program run on vLLM's scheduler built with `knobs`, `VllmEventLog` attached: the
    log's lines."""
    from integrations.vllm.event_log import VllmEventLog

    lines: list[str] = []
    adapter = RealVllmScheduler(config, lambda e: None, SPACE_WATERMARK, admission=knobs)
    if plant is not None:
        plant(adapter.sched)
    VllmEventLog(adapter.sched, lines.append)
    rng = random.Random(6)
    for i in range(8):
        prompt, out, prio = rng.randrange(1, 8), rng.randrange(1, 8), rng.randrange(3)
        adapter.submit(ArRequest(f"r{i}", prompt, out, priority=prio))
        adapter.step()
    for _ in range(200):
        if adapter.is_idle():
            break
        adapter.step()
    return lines


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
    lines = _live_log(LIVE, knobs)
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
    result = check_ar_trace(_live_log(LIVE, knobs, watermark_ignored))
    assert result.violation is not None, "the planted bug went unseen"
    assert result.violation.rule in ("admission_watermark", "full_sequence_admission")
    assert "watermark" in str(result.violation).splitlines()[0]


def test_a_live_log_declares_the_active_cap_and_no_whole_sequence_gate() -> None:
    """`max_num_active_seqs` becomes the header's seat cap, and
    `scheduler_reserve_full_isl=False` takes `full_sequence_admission` out of the declared
    policy; the log passes under them."""
    from properties.ar.trace_check import check_ar_trace
    from spec.ar.trace import ArTraceReader

    lines = _live_log(LIVE, AdmissionKnobs(max_active_seqs=2, reserve_full_isl=False))
    with ArTraceReader(lines) as reader:
        list(reader)
        assert reader.header is not None
        assert reader.header.config.max_num_seqs == 2
        assert not reader.header.policy.full_sequence_admission
    assert check_ar_trace(lines).violation is None


def test_a_live_log_refuses_an_adaptive_long_prefill_threshold() -> None:
    from integrations.vllm.event_log import VllmEventLog

    config = LIVE.replace(long_prefill_token_threshold=4)
    adapter = RealVllmScheduler(
        config, lambda e: None, SPACE_WATERMARK, admission=AdmissionKnobs(adaptive_threshold=True)
    )
    with pytest.raises(ConfigError, match="long_prefill_token_threshold_adaptive"):
        VllmEventLog(adapter.sched, print)
    # without a threshold the setting changes nothing, and the log is written
    plain = RealVllmScheduler(
        LIVE, lambda e: None, SPACE_WATERMARK, admission=AdmissionKnobs(adaptive_threshold=True)
    )
    lines: list[str] = []
    VllmEventLog(plain.sched, lines.append)
    assert len(lines) == 1  # the header
