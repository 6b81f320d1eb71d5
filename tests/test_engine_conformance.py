"""The torch engine passes the conformance suite (both algorithms, batch parity: every output at
every batch size equals the request's solo sync output, bit-exact on CPU), and
never leaks a KV slot or a row, in its own allocator tensors, after drains with aborts that hit
requests in the middle of a block."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from gpu.engine import ENGINE_PROFILE, DllmEngine, make_small_engine, make_small_joint_engine
from properties.conformance import conformance_machine
from properties.harness import Harness
from properties.strategies import dllm_configs, prompts
from spec.adapter import ImplementationFactory
from spec.config import DllmConfig, Mode, RequestSpec
from tests.tier import depth

torch.set_num_threads(1)

SUITE = settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,
    stateful_step_count=30,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize(
    "factory",
    [make_small_engine, make_small_joint_engine],
    ids=["LowConfidence", "JointThreshold"],
)
def test_engine_conforms(factory: ImplementationFactory) -> None:
    run_state_machine_as_test(conformance_machine(factory, profile=ENGINE_PROFILE), settings=SUITE)


def _engine_of(h: Harness) -> DllmEngine:
    impl = h.impl
    assert isinstance(impl, DllmEngine)
    return impl


def _assert_clean(engine: DllmEngine) -> None:
    snap = engine.snapshot()
    assert snap.leaked_slots() == 0, snap.slot_owners
    assert snap.held_rows() == 0, snap.rows
    assert engine.allocator.used_slots() == 0
    assert engine.allocator.free_pages() == engine.config.kv_pages
    assert engine.allocator.reserved_pages == 0
    engine.allocator.check_consistency()


def test_abort_of_a_retained_block_frees_it() -> None:
    """SGLang #32992: aborting an FDFO request whose unfinished block is retained in place must
    free that block's slots too (checked in the allocator's owner tensor, not only in events)."""
    config = DllmConfig(
        block_size=4, page_size=8, kv_pages=8, max_context=32, mode=Mode.FDFO, in_place_reuse=True
    )
    h = Harness(make_small_engine, config)
    engine = _engine_of(h)
    h.submit(RequestSpec("a", (3, 4, 5, 6, 7), 12))  # one prompt block, then a partial one
    h.submit(RequestSpec("b", (8, 9), 12))
    for _ in range(10):
        h.round()
        req = next((r for r in engine.running if r.rid == "a"), None)
        if req is not None and req.carry is not None and req.block_first_slot is not None:
            break
    else:
        pytest.fail("request 'a' never carried a retained block")
    owned = [s for s, o in engine.snapshot().slot_owners.items() if o[0] == "a"]
    assert len(owned) >= 2 * config.block_size  # a committed block and the retained one
    h.abort("a")
    assert all(o[0] != "a" for o in engine.snapshot().slot_owners.values())
    engine.allocator.check_consistency()
    h.drain()
    _assert_clean(engine)


@st.composite
def _abort_programs(draw: st.DrawFn) -> tuple[DllmConfig, list[tuple[str, object]]]:
    config = draw(dllm_configs(modes=(Mode.FDFO, Mode.SYNC)))
    ops: list[tuple[str, object]] = []
    n = draw(st.integers(1, 6))
    for i in range(n):
        ops.append(("submit", RequestSpec(f"r{i}", draw(prompts(12)), draw(st.integers(1, 12)))))
    for _ in range(draw(st.integers(1, 12))):
        ops.append(draw(st.sampled_from([("round", None), ("abort", None), ("drain", None)])))
    return config, ops


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(_abort_programs(), st.randoms(use_true_random=False))
def test_no_leak_after_drains_with_aborts_mid_block(
    program: tuple[DllmConfig, list[tuple[str, object]]], rnd: object
) -> None:
    import random

    assert isinstance(rnd, random.Random)
    config, ops = program
    h = Harness(make_small_engine, config)
    engine = _engine_of(h)
    for op, arg in ops:
        if op == "submit":
            assert isinstance(arg, RequestSpec)
            h.submit(arg)
        elif op == "round":
            h.round()
        elif op == "drain":
            h.drain()
            _assert_clean(engine)
        else:
            # prefer a request in the middle of a block (carrying) when there is one
            carrying = sorted(r.rid for r in engine.running if r.carry is not None)
            active = (
                carrying or sorted(r.rid for r in engine.running) or [r.rid for r in engine.waiting]
            )
            if active:
                h.abort(rnd.choice(active))
        engine.allocator.check_consistency()
    h.drain()
    _assert_clean(engine)


def test_the_engine_decides_as_the_reference_through_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`schedspec verify --impl engine --twin reference-dllm`: the engine's scheduler admits and
    forwards exactly as the FCFS reference does when the reference replays the engine's step
    outcomes (rule `twin_decisions`; 60 examples in the full tier, 30 per push; 1,000 passed once,
    docs/engine.md)."""
    from schedspec_cli.main import main

    examples = str(depth(30, 60))
    argv = ["verify", "--impl", "engine", "--twin", "reference-dllm", "--examples", examples]
    assert main(argv) == 0, capsys.readouterr().out
    assert "reference-dllm" in capsys.readouterr().out
