"""Vidur's replica schedulers: conformance, their characteristic decisions, bad configs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from properties.ar.conformance import ar_conformance_machine
from properties.ar.harness import ArHarness
from properties.ar.strategies import ar_configs
from reference.ar import vidur
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArPreempted, ArScheduled, ArStepEnd
from spec.errors import ConfigError

RUN = settings(
    max_examples=60, deadline=None, stateful_step_count=30, suppress_health_check=list(HealthCheck)
)

FACTORIES = {
    "vidur-vllm": (vidur.make_vidur_vllm, False),
    "vidur-sarathi": (vidur.make_vidur_sarathi, True),
    "vidur-orca": (vidur.make_vidur_orca, False),
    "vidur-lightllm": (vidur.make_vidur_lightllm, False),
    "vidur-ft": (vidur.make_vidur_ft, False),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_vidur_conforms(name: str) -> None:
    factory, chunked = FACTORIES[name]
    sizes = st.just(1) if name == "vidur-lightllm" else None
    configs = ar_configs(chunked=(chunked,), block_sizes=sizes, thresholds=False)
    run_state_machine_as_test(ar_conformance_machine(factory, configs=configs), settings=RUN)


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
