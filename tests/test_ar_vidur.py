"""Vidur's replica schedulers: conformance, their characteristic decisions, bad configs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from properties.ar.conformance import ar_conformance_machine
from properties.ar.harness import ArHarness
from reference.ar import mnemosyne, vidur, vidur_released
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import (
    ArBlocksAllocated,
    ArEvent,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.lifecycles import ArPhase
from spec.ar.machine import ArSpecMachine
from spec.errors import ConfigError, SpecViolation

RUN = settings(
    max_examples=60, deadline=None, stateful_step_count=30, suppress_health_check=list(HealthCheck)
)

# every Vidur replica scheduler the project re-implements, by built-in name
IMPLEMENTATIONS = {
    "vidur-vllm": vidur.VIDUR_VLLM,
    "vidur-sarathi": vidur.VIDUR_SARATHI,
    "vidur-orca": vidur.VIDUR_ORCA,
    "vidur-lightllm": vidur.VIDUR_LIGHTLLM,
    "vidur-ft": vidur.VIDUR_FT,
    "vidur-mnemosyne": mnemosyne.VIDUR_MNEMOSYNE,
    "vidur-mnemosyne-one-queue": mnemosyne.VIDUR_MNEMOSYNE_ONE_QUEUE,
    "vidur-vllm-released": vidur_released.VIDUR_VLLM_RELEASED,
    "vidur-sarathi-released": vidur_released.VIDUR_SARATHI_RELEASED,
}


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_vidur_conforms_under_its_profile(name: str) -> None:
    impl = IMPLEMENTATIONS[name]
    machine = ar_conformance_machine(impl.factory, profile=impl.profile)
    run_state_machine_as_test(machine, settings=RUN)


def _readmission_events() -> list[ArEvent]:
    """Step 0 admits a and b; step 1 preempts b (a needs its block) and admits b again at once,
    in the same batch (Vidur's `admit_after_preemption`)."""
    return [
        ArSubmitted("a", 2, 2),
        ArSubmitted("b", 2, 2),
        ArBlocksAllocated("a", (0, 1)),
        ArScheduled("a", 2),
        ArBlocksAllocated("b", (2, 3)),
        ArScheduled("b", 2),
        ArStepEnd(0),
        ArPreempted("b", (2, 3)),
        ArBlocksAllocated("a", (2,)),
        ArScheduled("a", 1),
        ArBlocksAllocated("b", (3,)),
        ArScheduled("b", 1),
        ArStepEnd(1),
    ]


def test_same_step_readmission_is_legal_where_declared() -> None:
    """The contradiction of issue 10: with same-step re-admission declared, the victim may hold
    blocks again in the step that preempted it (preempted_holds_nothing holds between steps)."""
    cfg = ArConfig(
        block_size=1,
        num_blocks=4,
        reserve_null_block=False,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        max_model_len=8,
    )
    m = ArSpecMachine(cfg, vidur.VIDUR_SARATHI.profile.policy)
    for e in _readmission_events():
        m.apply(e)
        m.check_invariants()
        m.check_invariants_full()
    m.check_invariants(between_steps=True)
    assert m.request_phase("b") is ArPhase.RUNNING
    idealised = ArSpecMachine(cfg)
    with pytest.raises(SpecViolation) as err:
        idealised.apply_all(_readmission_events())
    assert err.value.rule == "no_admission_after_preemption"


def _steps(h: ArHarness) -> list[dict[str, int]]:
    out: list[dict[str, int]] = [{}]
    for e in h.events:
        if isinstance(e, ArScheduled):
            out[-1][e.request_id] = e.num_tokens
        elif isinstance(e, ArStepEnd):
            out.append({})
    return out[:-1]


def test_vidur_vllm_never_mixes_prefill_and_decode() -> None:
    cfg = ArConfig(
        block_size=2,
        num_blocks=20,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        max_model_len=16,
        enable_chunked_prefill=False,
    )
    h = ArHarness(vidur.make_vidur_vllm, cfg)
    h.submit(ArRequest("a", 4, 3))
    h.step()
    h.submit(ArRequest("b", 5, 2))
    h.drain()
    # step 1 is b's prefill alone: a's decode waits (prefill-only batch)
    assert _steps(h)[:3] == [{"a": 4}, {"b": 5}, {"a": 1, "b": 1}]


def test_sarathi_chunks_with_decodes() -> None:
    cfg = ArConfig(
        block_size=2, num_blocks=20, max_num_batched_tokens=4, max_num_seqs=4, max_model_len=16
    )
    h = ArHarness(vidur.make_vidur_sarathi, cfg)
    h.submit(ArRequest("a", 2, 4))
    h.step()
    h.submit(ArRequest("b", 9, 1))
    h.drain()
    assert _steps(h)[1:4] == [{"a": 1, "b": 3}, {"a": 1, "b": 3}, {"b": 3, "a": 1}]


def test_restart_folds_outputs_into_prefill() -> None:
    cfg = ArConfig(
        block_size=1,
        num_blocks=8,
        reserve_null_block=False,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        max_model_len=8,
        enable_chunked_prefill=False,
    )
    h = ArHarness(vidur.make_vidur_vllm, cfg)
    h.submit(ArRequest("a", 3, 5))
    h.submit(ArRequest("b", 3, 5))
    h.drain()
    pre = [e.request_id for e in h.events if isinstance(e, ArPreempted)]
    assert pre == ["b"]
    steps = _steps(h)
    i = next(k for k, s in enumerate(steps) if k and s.get("b", 0) > 1)
    assert steps[i]["b"] > 3  # prompt + its outputs so far, prefilled again
    assert h.outputs() == {"a": 5, "b": 5}


def test_ft_static_batches() -> None:
    cfg = ArConfig(
        block_size=4,
        num_blocks=9,
        max_num_batched_tokens=16,
        max_num_seqs=2,
        max_model_len=16,
        enable_chunked_prefill=False,
    )
    h = ArHarness(vidur.make_vidur_ft, cfg)
    for rid, out in (("a", 1), ("b", 4), ("c", 1)):
        h.submit(ArRequest(rid, 2, out))
    h.drain()
    firsts = [next(k for k, s in enumerate(_steps(h)) if r in s) for r in "abc"]
    assert firsts == [0, 0, 4]  # c waits for the whole batch, although a finished at once


@pytest.mark.parametrize(
    ("make", "kw", "field"),
    [
        (vidur.make_vidur_lightllm, {"block_size": 2}, "block_size"),
        (vidur.make_vidur_lightllm, {"block_size": 1, "num_stages": 2}, "num_stages"),
        (vidur.make_vidur_vllm, {"policy": "priority"}, "policy"),
        (
            vidur.make_vidur_sarathi,
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 32},
            "enable_chunked_prefill",
        ),
        (
            vidur.make_vidur_orca,
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 32, "num_blocks": 4},
            "num_blocks",
        ),
    ],
)
def test_vidur_bad_config(make: object, kw: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"enable_chunked_prefill": False, "max_num_batched_tokens": 32}
    base.update(kw)
    cfg = ArConfig(**base)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as err:
        make(cfg, lambda e: None)  # type: ignore[operator]
    assert err.value.field == field
