"""Scheduling differential: the torch engine against the plain-Python reference scheduler.

The engine runs a generated program (submits, rounds, aborts, drains) under the harness and
records, per forward, which rows ran and their done flags (`DllmEngine.forward_log`). The
reference scheduler then runs the same program with a `DenoiseOracle` that replays exactly
those done flags (and the engine's mask counts and committed tokens). Both schedulers decide
admission, batching, allocation, reuse and release on their own; given the same denoising
outcomes they must schedule the same: the same sequence of forward row sets, round by round —
and in fact the same event stream, slot numbers included.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu.engine import DllmEngine, make_small_engine, make_small_joint_engine
from properties.harness import Harness
from properties.strategies import dllm_configs, prompts
from reference.dllm import ReferenceDllmScheduler
from reference.oracle import BlockKey, BlockScript, RecordedOracle
from spec.adapter import EventSink, ImplementationFactory
from spec.config import DllmConfig, RequestSpec
from spec.events import BlockCommitted, ControlReturned, Event, Forward, StepResult

torch.set_num_threads(1)


def _scripts(engine: DllmEngine, events: Sequence[Event]) -> dict[BlockKey, BlockScript]:
    """Per block: done flags from the engine's per-forward record, masks from its events."""
    done_flags: dict[BlockKey, list[bool]] = defaultdict(list)
    for rec in engine.forward_log:
        for key, done in zip(rec.rows, rec.done, strict=True):
            done_flags[key].append(done)
    masks: dict[BlockKey, list[int]] = defaultdict(list)
    finals: dict[BlockKey, tuple[int, ...]] = {}
    for e in events:
        if isinstance(e, StepResult):
            masks[(e.request_id, e.block_index)].append(e.masks_remaining)
        elif isinstance(e, BlockCommitted):
            finals[(e.request_id, e.block_index)] = e.tokens
    out: dict[BlockKey, BlockScript] = {}
    for key, flags in done_flags.items():
        assert len(flags) == len(masks[key]), key  # the record agrees with the events
        out[key] = BlockScript(tuple(zip(flags, masks[key], strict=True)), finals.get(key))
    return out


def _forward_rounds(events: Sequence[Event]) -> list[list[tuple[tuple[str, int, bool], ...]]]:
    """Per round, the row sets of its forwards: (request, block, reused) per row."""
    rounds: list[list[tuple[tuple[str, int, bool], ...]]] = [[]]
    for e in events:
        if isinstance(e, Forward):
            rounds[-1].append(tuple((r.request_id, r.block_index, r.reused) for r in e.rows))
        elif isinstance(e, ControlReturned):
            rounds.append([])
    return rounds


Op = tuple[str, object]


def _run(factory: ImplementationFactory, config: DllmConfig, ops: Sequence[Op]) -> Harness:
    h = Harness(factory, config)
    for op, arg in ops:
        if op == "submit":
            assert isinstance(arg, RequestSpec)
            h.submit(arg)
        elif op == "abort":
            assert isinstance(arg, str)
            if h.spec.request_phase(arg) is not None:
                h.abort(arg)
        elif op == "round":
            h.round()
        else:
            h.drain()
    h.drain()
    return h


@st.composite
def _programs(draw: st.DrawFn) -> tuple[DllmConfig, list[Op]]:
    """A config and a program whose requests mostly fit it (a few are rejected)."""
    config = draw(dllm_configs())
    ops: list[Op] = []
    n = 0
    for _ in range(draw(st.integers(2, 16))):
        kind = draw(st.sampled_from(["submit", "submit", "round", "round", "abort", "drain"]))
        if kind == "submit" or n == 0:
            prompt = draw(prompts(max(1, config.max_context - 2)))
            room = max(1, config.max_context - len(prompt))
            max_new = draw(st.integers(1, room + 2))
            ops.append(("submit", RequestSpec(f"r{n}", prompt, max_new)))
            n += 1
        elif kind == "abort":
            ops.append(("abort", f"r{draw(st.integers(0, n - 1))}"))
        else:
            ops.append((kind, None))
    return config, ops


def _differential(
    engine_factory: ImplementationFactory, config: DllmConfig, ops: Sequence[Op]
) -> None:
    eh = _run(engine_factory, config, ops)
    engine = eh.impl
    assert isinstance(engine, DllmEngine)
    scripts = _scripts(engine, eh.events)

    def reference(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
        return ReferenceDllmScheduler(config, sink, RecordedOracle(scripts, config.mask_token_id))

    rh = _run(reference, config, ops)
    assert _forward_rounds(eh.events) == _forward_rounds(rh.events)
    assert eh.events == rh.events  # same admissions, slots, commits, frees, in the same order
    assert eh.outputs() == rh.outputs()


SETTINGS = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


@SETTINGS
@given(_programs())
def test_engine_schedules_like_the_reference_low_confidence(
    program: tuple[DllmConfig, list[Op]],
) -> None:
    _differential(make_small_engine, *program)


@SETTINGS
@given(_programs())
def test_engine_schedules_like_the_reference_joint_threshold(
    program: tuple[DllmConfig, list[Op]],
) -> None:
    _differential(make_small_joint_engine, *program)


def test_the_differential_sees_a_scheduling_difference() -> None:
    """Control: a reference with another admission cap schedules differently, and the
    comparison notices."""
    config = DllmConfig(max_running_requests=2, req_pool_rows=2, kv_pages=16)
    ops: list[Op] = [("submit", RequestSpec(f"r{i}", (1, 2, 3, 4, 5), 6)) for i in range(3)] + [
        ("drain", None)
    ]
    eh = _run(make_small_engine, config, ops)
    engine = eh.impl
    assert isinstance(engine, DllmEngine)
    scripts = _scripts(engine, eh.events)
    narrow = config.replace(max_running_requests=1)

    def reference(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
        return ReferenceDllmScheduler(config, sink, RecordedOracle(scripts, config.mask_token_id))

    rh = _run(reference, narrow, ops)
    assert _forward_rounds(eh.events) != _forward_rounds(rh.events)
