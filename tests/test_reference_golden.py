"""The reference's golden decoder (`reference.golden`): every reference output, at batch sizes
1, 4 and 16, in every mode, with each built-in oracle, equals the request decoded alone by the
same oracle; and the harness holds implementations to it (rule `golden_output`)."""

from __future__ import annotations

import random

import pytest

from properties.harness import Harness
from reference.dllm import (
    ReferenceDllmScheduler,
    make_joint_threshold_scheduler,
    make_scheduler,
    make_scripted_scheduler,
)
from reference.golden import golden_output
from reference.oracle import AlgorithmOracle
from spec.adapter import EventSink, ImplementationFactory
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import PromptTooLong, SchedulerStalled, SpecViolation
from spec.events import Finished, FinishReason
from spec.golden import GoldenDecoder
from spec.snapshot import FinishedOutput

FACTORIES: dict[str, ImplementationFactory] = {
    "LowConfidence": make_scheduler,
    "JointThreshold": make_joint_threshold_scheduler,
    "scripted": make_scripted_scheduler,
}
MODES = {
    "sync": (Mode.SYNC, False, False),
    "fdfo": (Mode.FDFO, False, False),
    "fdfo+reuse": (Mode.FDFO, True, False),
    "fdfo+reuse+reloop": (Mode.FDFO, True, True),
}
EOS = 15


def _config(batch: int, mode: str) -> DllmConfig:
    m, reuse, reloop = MODES[mode]
    return DllmConfig(
        block_size=4,
        page_size=8,
        kv_pages=8 * batch,
        req_pool_rows=batch,
        max_running_requests=batch,
        max_context=64,
        mode=m,
        in_place_reuse=reuse,
        reloop=reloop,
        mask_token_id=-1,
        eos_token_id=EOS,
    )


def _requests(n: int, seed: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    return [
        RequestSpec(
            f"r{i:02d}",
            tuple(rng.randrange(0, 15) for _ in range(rng.randint(1, 13))),
            rng.randint(1, 24),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("oracle", list(FACTORIES))
@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize("mode", list(MODES))
def test_reference_equals_its_golden(oracle: str, batch: int, mode: str) -> None:
    config = _config(batch, mode)
    sched = FACTORIES[oracle](config, lambda e: None)
    assert isinstance(sched, ReferenceDllmScheduler)
    requests = _requests(20, 12)
    for r in requests:
        sched.submit(r)
    sched.drain()
    outputs = sched.collect_outputs()
    for r in requests:
        want = golden_output(config, sched.oracle, r)
        assert outputs[r.request_id] == want, r.request_id
    reasons = {golden_output(config, sched.oracle, r).reason for r in requests}
    assert reasons == {FinishReason.EOS, FinishReason.LENGTH} or oracle == "scripted"


def test_reference_runs_the_batch_under_test() -> None:
    """Control for the test above: 16 requests really share forwards at batch 16."""
    from spec.events import Event, Forward

    widest = 0

    def sink(event: Event) -> None:
        nonlocal widest
        if isinstance(event, Forward):
            widest = max(widest, len(event.rows))

    sched = make_scheduler(_config(16, "fdfo"), sink)
    for r in _requests(20, 12):
        sched.submit(r)
    sched.drain()
    assert widest == 16


def test_golden_depends_on_the_context() -> None:
    """A different oracle seed gives different golden outputs (not a constant)."""
    config = _config(1, "sync")
    requests = _requests(10, 4)
    one = [golden_output(config, AlgorithmOracle.named("LowConfidence", -1), r) for r in requests]
    two = [
        golden_output(config, AlgorithmOracle.named("LowConfidence", -1, seed=7), r)
        for r in requests
    ]
    assert one != two


def test_golden_refuses_what_the_scheduler_refuses() -> None:
    with pytest.raises(PromptTooLong):
        golden_output(
            _config(1, "sync"),
            AlgorithmOracle.named("LowConfidence", -1),
            RequestSpec("x", (1,) * 70, 2),
        )


class _NeverDone:
    def init_state(self, row_tokens: tuple[int, ...]) -> object:
        return None

    def step(self, rows):  # type: ignore[no-untyped-def]
        from reference.oracle import OracleStep

        return [OracleStep(r.tokens, r.state, False) for r in rows]


def test_golden_of_a_stalled_oracle_is_a_typed_error() -> None:
    with pytest.raises(SchedulerStalled, match=r"within \d+ forwards: golden decoding of 'x'"):
        golden_output(_config(1, "sync"), _NeverDone(), RequestSpec("x", (1, 2), 2))


def test_reference_is_a_golden_decoder() -> None:
    assert isinstance(make_scheduler(_config(1, "sync"), lambda e: None), GoldenDecoder)


class _WrongGolden(ReferenceDllmScheduler):
    """A golden decoder that disagrees with the run: the harness must say so."""

    def golden_output(self, request: RequestSpec) -> FinishedOutput:
        real = super().golden_output(request)
        return FinishedOutput((*real.tokens[:-1], (real.tokens[-1] + 1) % 15), real.reason)


def _wrong(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
    return _WrongGolden(config, sink)


def test_harness_checks_golden_after_the_round() -> None:
    h = Harness(_wrong, _config(2, "sync"))
    h.submit(RequestSpec("a", (1, 2, 3), 1))  # one block: finished in the first round
    with pytest.raises(SpecViolation) as info:
        h.round()
    assert info.value.rule == "golden_output"
    assert "'a' output [" in str(info.value) and "golden output [" in str(info.value)


def test_harness_skips_golden_when_told() -> None:
    h = Harness(_wrong, _config(2, "sync"), check_golden=False)
    h.submit(RequestSpec("a", (1, 2, 3), 3))
    h.round()
    h.drain()
    assert h.outputs()["a"]


def test_a_request_with_a_sampled_stop_that_stops_on_its_stop_token_matches_its_golden() -> None:
    """A request that may stop on what the spec cannot see (`stop_sampled`) and stops on its
    stop token id instead: the spec allows any cut inside its last block, and the golden
    decoding, which samples no stop either, stops at the token. Found when a Z3 counterexample
    handed the reference such a request (`r0`: its last block [4, 6], stop token 4); the golden
    check compared the longest cut [11, 4, 6] with the golden [11, 4]."""
    from properties.symbolic.workloads import dllm_config
    from properties.workload import Submit, Workload, run_workload

    sampled = RequestSpec("r0", (1, 1, 1), 5, stop_sampled=True, stop_token_ids=(4,))
    w = Workload(
        dllm_config(max_running_requests=1), (Submit(sampled), Submit(RequestSpec("r1", (1,), 4)))
    )
    harness = run_workload(ReferenceDllmScheduler, w, parity=False)
    reasons = {e.request_id: e.reason for e in harness.events if isinstance(e, Finished)}
    assert reasons["r0"] is FinishReason.STOP
    golden = ReferenceDllmScheduler(w.config, lambda e: None).golden_output(sampled)
    assert golden.tokens == (11, 4), golden


def test_a_sampled_stop_whose_tokens_part_from_the_golden_is_a_golden_output_violation() -> None:
    from spec.golden import sampled_stop_mismatch

    request = RequestSpec("r0", (1,), 5, stop_sampled=True)
    longest = FinishedOutput((11, 4, 6), FinishReason.STOP)
    assert (
        sampled_stop_mismatch(
            request, longest, range(2, 4), FinishedOutput((11, 4), FinishReason.STOP)
        )
        is None
    )
    assert (
        sampled_stop_mismatch(
            request, longest, range(2, 4), FinishedOutput((11, 4, 6, 2, 3), FinishReason.LENGTH)
        )
        is None
    )
    parted = sampled_stop_mismatch(
        request, longest, range(2, 4), FinishedOutput((11, 5, 6), FinishReason.LENGTH)
    )
    assert parted is not None and "they part at token 1" in parted
    early = sampled_stop_mismatch(
        request, longest, range(2, 4), FinishedOutput((11,), FinishReason.STOP)
    )
    assert early is not None and "cut to 2..3 tokens" in early  # the golden ended a block earlier
