"""The reference scheduler: behaviour the design describes, checked against the spec."""

from __future__ import annotations

import numpy as np
import pytest

from properties.harness import Harness, check_parity
from reference.algorithms import JointState, JointThreshold, LowConfidence, make_step_algorithm
from reference.dllm import ReferenceDllmScheduler, make_scheduler
from reference.oracle import ScriptedOracle
from spec import (
    ConfigError,
    ControlReturned,
    DllmConfig,
    DuplicateRequest,
    EmptyPrompt,
    Forward,
    Mode,
    PromptTooLong,
    RequestSpec,
    UnknownRequest,
)

MASK = -1


def scripted(steps: dict[str, int]):  # type: ignore[no-untyped-def]
    def factory(config: DllmConfig, sink):  # type: ignore[no-untyped-def]
        return ReferenceDllmScheduler(
            config, sink, ScriptedOracle(lambda rid, k: steps[rid], config.mask_token_id)
        )

    return factory


def forwards_per_round(h: Harness) -> list[int]:
    out, n = [], 0
    for e in h.events:
        if isinstance(e, Forward):
            n += 1
        elif e.kind == "control_returned":
            out.append(n)
            n = 0
    return out


@pytest.mark.parametrize("mode", [Mode.SYNC, Mode.FDFO])
def test_head_of_line_blocking_vs_first_done_first_out(mode: Mode) -> None:
    """A/B/C need 3, 8, 2 rounds to unmask (+1 final forward). Sync runs them as one batch of
    max(T)+1 forwards; FDFO lets A and C leave as soon as they are done."""
    cfg = DllmConfig(
        block_size=8,
        page_size=8,
        kv_pages=8,
        req_pool_rows=3,
        max_running_requests=3,
        max_context=16,
        mode=mode,
        in_place_reuse=mode is Mode.FDFO,
    )
    h = Harness(scripted({"A": 3, "B": 8, "C": 2}), cfg)
    for rid in "ABC":
        h.submit(RequestSpec(rid, (1,) * 8, 8))  # one prompt block, one output block
    h.drain()
    last_round = max(e.round_index for e in h.events if isinstance(e, ControlReturned))
    rounds = forwards_per_round(h)
    if mode is Mode.SYNC:
        # round 0: prompt blocks (1 forward); round 1: output blocks, max(T)+1 = 9 forwards
        assert rounds == [1, 9]
    else:
        assert rounds == [1] * 10  # one forward per round; B needs 9 rounds after its prompt
    assert set(h.outputs()) == {"A", "B", "C"}
    check_parity(h)
    assert last_round >= 1


def test_abort_mid_block_frees_the_retained_block() -> None:
    cfg = DllmConfig(
        block_size=4, page_size=8, kv_pages=4, max_context=16, mode=Mode.FDFO, in_place_reuse=True
    )
    h = Harness(scripted({"a": 4}), cfg)
    h.submit(RequestSpec("a", (1, 2, 3, 4, 5), 6))
    h.round()  # prompt block committed
    h.round()  # output block 1: in progress, retained
    assert h.impl.snapshot().carrying == {"a"}
    owned = h.impl.snapshot().slot_owners
    assert {b for _, b in owned.values()} == {0, 1}
    h.abort("a")
    snap = h.impl.snapshot()
    assert snap.leaked_slots() == 0 and snap.held_rows() == 0


def test_bad_input_is_rejected_without_changes() -> None:
    cfg = DllmConfig(block_size=4, page_size=4, kv_pages=4, max_context=16)
    h = Harness(make_scheduler, cfg)
    before = h.impl.snapshot()
    with pytest.raises(EmptyPrompt):
        h.impl.submit(RequestSpec("x", (), 2))
    with pytest.raises(PromptTooLong):
        h.impl.submit(RequestSpec("x", tuple(range(16)), 2))
    h.submit(RequestSpec("ok", (1,), 2))
    with pytest.raises(DuplicateRequest):
        h.impl.submit(RequestSpec("ok", (1,), 2))
    with pytest.raises(UnknownRequest, match="unknown request id 'nope'"):
        h.impl.abort("nope")
    assert h.impl.snapshot().free_slots == before.free_slots
    h.drain()
    with pytest.raises(UnknownRequest):
        h.impl.abort("ok")  # finished requests cannot be aborted


def test_drain_never_hangs_and_pool_exact_fit_admits_one_at_a_time() -> None:
    cfg = DllmConfig(
        block_size=2,
        page_size=2,
        kv_pages=3,
        req_pool_rows=2,
        max_running_requests=2,
        max_context=6,
        mode=Mode.FDFO,
    )
    h = Harness(make_scheduler, cfg)
    for i in range(4):
        h.submit(RequestSpec(f"r{i}", (1, 2, 3), 3))  # each needs all 3 pages
    h.round()
    assert h.impl.snapshot().running == {"r0"}
    h.drain()
    assert set(h.outputs()) == {f"r{i}" for i in range(4)}


def test_low_confidence_semantics() -> None:
    algo = LowConfidence(MASK, threshold=0.9)
    tokens = np.array([[MASK, MASK, 3, MASK]], dtype=np.int64)
    logits = np.zeros((1, 4, 5), dtype=np.float32)
    logits[0, 0, 2] = 10.0  # confident
    logits[0, 1, 1] = 1.0  # not confident
    logits[0, 3, 4] = 2.0  # not confident, but the most confident of the rest
    done, _ = algo.step(tokens, logits, [None])
    assert done == [False] and tokens.tolist() == [[2, MASK, 3, MASK]]
    logits[0, 0, 2] = 0.0
    done, _ = algo.step(tokens, logits, [None])  # fallback: exactly one, the most confident
    assert done == [False] and tokens.tolist() == [[2, MASK, 3, 4]]
    done, _ = algo.step(tokens, logits, [None])
    assert tokens.tolist() == [[2, 1, 3, 4]] and done == [False]
    done, _ = algo.step(tokens, logits, [None])  # complete at the start: the final forward
    assert done == [True]


def test_joint_threshold_edits_budget_and_prompt_protection() -> None:
    algo = JointThreshold(MASK, max_post_edit_steps=2)
    tokens = np.array([[7, MASK]], dtype=np.int64)
    state = algo.init_step_state(tokens[0])
    logits = np.zeros((1, 2, 9), dtype=np.float32)
    logits[0, :, 3] = 5.0  # argmax 3 everywhere
    done, (state,) = algo.step(tokens, logits, [state])
    assert tokens.tolist() == [[7, 3]] and done == [False]
    logits[0, :, 3] = 0.0
    logits[0, :, 4] = 5.0  # now prefers 4: position 1 is edited, the prompt position 0 never
    done, (state,) = algo.step(tokens, logits, [state])
    assert isinstance(state, JointState)
    assert tokens.tolist() == [[7, 4]] and done == [False] and state.post_edit_steps == 1
    logits[0, :, 4] = 0.0
    logits[0, :, 5] = 5.0
    done, (state,) = algo.step(tokens, logits, [state])
    assert isinstance(state, JointState)
    assert tokens.tolist() == [[7, 5]] and state.post_edit_steps == 2
    done, (state,) = algo.step(tokens, logits, [state])  # budget spent
    assert isinstance(state, JointState)
    assert done == [True] and state.finished
    done, (state,) = algo.step(tokens, logits, [state])
    assert done == [True]


def test_unknown_algorithm_and_key() -> None:
    with pytest.raises(ConfigError, match="LowConfidence"):
        make_step_algorithm("Greedy", MASK)
    with pytest.raises(ConfigError, match="valid keys"):
        make_step_algorithm("LowConfidence", MASK, edit_threshold=0.1)
