"""Unit tests of gpu.algorithms: exact commit semantics, done timing, state, registry errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpu.algorithms import (
    ALGORITHMS,
    JointState,
    JointThreshold,
    LowConfidence,
    load_algorithm_config,
    make_algorithm,
)
from gpu.errors import UnknownAlgorithm, UnknownAlgorithmKey
from spec.errors import ConfigError, SchedSpecError

torch.set_num_threads(1)

M = 1  # mask id used throughout
V = 6  # vocabulary of the hand-made logits


def logits_for(spec: list[tuple[int, float]]) -> torch.Tensor:
    """[B, V] logits: position i has logit z_i at token a_i and 0 elsewhere, so its argmax is
    a_i with probability e^z / (e^z + V - 1): z=5 -> 0.967, z=2 -> 0.596, z=1 -> 0.352."""
    out = torch.zeros(len(spec), V)
    for i, (token, z) in enumerate(spec):
        out[i, token] = z
    return out


def batch(*rows: list[int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


# --- LowConfidence -------------------------------------------------------------------------


def test_low_confidence_commits_every_position_above_threshold() -> None:
    algo = LowConfidence(mask_id=M)
    tokens = batch([M, M, M, M])
    logits = logits_for([(3, 5.0), (4, 5.0), (2, 1.0), (5, 2.0)])[None]
    done = algo.step(tokens, logits, [None])
    assert done == [False]
    assert tokens.tolist() == [[3, 4, M, M]]


def test_low_confidence_fallback_commits_exactly_the_most_confident_position() -> None:
    algo = LowConfidence(mask_id=M)
    tokens = batch([M, M, M, M])
    logits = logits_for([(3, 1.0), (4, 2.5), (2, 1.0), (5, 2.0)])[None]
    assert algo.step(tokens, logits, [None]) == [False]
    assert tokens.tolist() == [[M, 4, M, M]]


def test_low_confidence_fallback_tie_takes_the_first_masked_index() -> None:
    algo = LowConfidence(mask_id=M)
    tokens = batch([0, M, M, M])
    # Position 0 is not masked: its (higher) confidence must not be chosen. Positions 2 and 3
    # have identical logit rows, hence bit-identical confidences: the first index wins.
    logits = logits_for([(3, 4.0), (4, 1.0), (2, 2.0), (2, 2.0)])[None]
    algo.step(tokens, logits, [None])
    assert tokens.tolist() == [[0, M, 2, M]]


def test_low_confidence_never_changes_unmasked_positions() -> None:
    algo = LowConfidence(mask_id=M, threshold=0.5)
    tokens = batch([0, 0, M, 0])
    logits = logits_for([(3, 9.0), (4, 9.0), (2, 9.0), (5, 9.0)])[None]
    algo.step(tokens, logits, [None])
    assert tokens.tolist() == [[0, 0, 2, 0]]


def test_done_only_when_the_block_was_complete_at_the_start_of_the_step() -> None:
    algo = LowConfidence(mask_id=M)
    tokens = batch([0, M, 3, 4])
    logits = logits_for([(3, 9.0)] * 4)[None]
    assert algo.step(tokens, logits, [None]) == [False]  # filled the last mask: not done yet
    assert tokens.tolist() == [[0, 3, 3, 4]]
    assert algo.step(tokens, logits, [None]) == [True]  # complete at the start: done
    assert tokens.tolist() == [[0, 3, 3, 4]]  # and nothing changes


def test_rows_of_a_batch_are_independent() -> None:
    algo = LowConfidence(mask_id=M)
    tokens = batch([0, 2, 3, 4], [M, M, M, M])
    logits = torch.stack([logits_for([(5, 9.0)] * 4), logits_for([(5, 1.0)] * 4)])
    assert algo.step(tokens, logits, [None, None]) == [True, False]
    assert tokens.tolist() == [[0, 2, 3, 4], [5, M, M, M]]


def test_sync_run_counts_rounds_to_unmask_plus_one_final_forward() -> None:
    algo = LowConfidence(mask_id=M)
    tokens = batch([M, M, M, M], [0, M, 2, 3])
    logits = torch.stack([logits_for([(5, 1.0)] * 4)] * 2)  # never confident: one per round
    calls: list[torch.Tensor] = []

    def forward(t: torch.Tensor) -> torch.Tensor:
        calls.append(t.clone())
        return logits

    done, forwards = algo.run(forward, tokens, algo.init_states(tokens), "sync")
    assert done == [True, True]
    assert forwards == 5  # 4 masks one at a time, then the final forward on the complete block
    assert len(calls) == 5 and calls[-1].tolist() == tokens.tolist()
    assert (tokens != M).all()


def test_fdfo_run_is_exactly_one_forward_and_step() -> None:
    algo = LowConfidence(mask_id=M)
    tokens = batch([M, M, M, M])
    done, forwards = algo.run(lambda t: logits_for([(5, 1.0)] * 4)[None], tokens, [None], "fdfo")
    assert (done, forwards) == ([False], 1)
    assert tokens.tolist() == [[5, M, M, M]]


def test_unknown_mode_is_a_config_error() -> None:
    algo = LowConfidence(mask_id=M)
    with pytest.raises(ConfigError, match="mode"):
        algo.run(lambda t: logits_for([(5, 1.0)])[None], batch([M]), [None], "async")


def test_low_confidence_is_stateless() -> None:
    assert LowConfidence(mask_id=M).init_step_state(torch.tensor([M, 2])) is None


# --- JointThreshold ------------------------------------------------------------------------


def test_joint_initial_state_marks_prompt_positions() -> None:
    state = JointThreshold(mask_id=M).init_step_state(torch.tensor([4, 2, M, M]))
    assert state == JointState(
        post_edit_steps=0, finished=False, prompt_mask=(True, True, False, False)
    )


def test_joint_mask_to_token_uses_its_own_threshold() -> None:
    algo = JointThreshold(mask_id=M, threshold=0.5)
    tokens = batch([M, M, M])
    states = algo.init_states(tokens)
    logits = logits_for([(3, 2.0), (4, 1.0), (5, 1.5)])[None]  # p = 0.596, 0.352, 0.473
    assert algo.step(tokens, logits, states) == [False]
    assert tokens.tolist() == [[3, M, M]]
    assert states[0] == JointState(0, False, (False, False, False))


def test_joint_edits_generated_positions_but_never_prompt_positions() -> None:
    algo = JointThreshold(mask_id=M)
    tokens = batch([4, M, M])
    states = algo.init_states(tokens)
    want = logits_for([(5, 9.0), (3, 9.0), (3, 9.0)])[None]
    algo.step(tokens, want, states)
    assert tokens.tolist() == [[4, 3, 3]]
    # No masks left: now the model prefers 2 at every position; prompt position 0 stays.
    edit = logits_for([(2, 9.0), (2, 9.0), (3, 9.0)])[None]
    assert algo.step(tokens, edit, states) == [False]
    assert tokens.tolist() == [[4, 2, 3]]
    assert states[0] == JointState(1, False, (True, False, False))
    # Nothing left to change: finished, done, unchanged.
    assert algo.step(tokens, edit, states) == [True]
    assert states[0] == JointState(1, True, (True, False, False))
    assert tokens.tolist() == [[4, 2, 3]]
    # Once finished it stays done whatever the logits say.
    assert algo.step(tokens, want, states) == [True]
    assert tokens.tolist() == [[4, 2, 3]]


def test_joint_edit_budget_finishes_the_block() -> None:
    algo = JointThreshold(mask_id=M, max_post_edit_steps=2)
    tokens = batch([3, 3])
    states: list[object] = [JointState(0, False, (False, False))]
    flip = [logits_for([(4, 9.0), (4, 9.0)])[None], logits_for([(3, 9.0), (3, 9.0)])[None]]
    assert algo.step(tokens, flip[0], states) == [False]
    assert algo.step(tokens, flip[1], states) == [False]
    assert tokens.tolist() == [[3, 3]]
    assert states[0] == JointState(2, False, (False, False))
    assert algo.step(tokens, flip[0], states) == [True]  # budget spent: finished, no edit
    assert tokens.tolist() == [[3, 3]]
    assert states[0] == JointState(2, True, (False, False))


def test_joint_edit_threshold_and_penalty_gate_edits() -> None:
    tokens = batch([3, 3])
    # Argmax 4 with p=0.596 (z=2), current token 3 has p=0.081 at both positions.
    logits = logits_for([(4, 2.0), (4, 2.0)])[None]
    strict = JointThreshold(mask_id=M, edit_threshold=0.6)
    states: list[object] = [JointState(0, False, (False, False))]
    assert strict.step(tokens.clone(), logits, states) == [True]  # 0.596 does not clear 0.6
    penalised = JointThreshold(mask_id=M, edit_threshold=0.0, penalty_lambda=8.0)
    states = [JointState(0, False, (False, False))]
    assert penalised.step(tokens.clone(), logits, states) == [True]  # 0.596 - 8*0.081 < 0
    mild = JointThreshold(mask_id=M, edit_threshold=0.5, penalty_lambda=1.0)
    states = [JointState(0, False, (False, False))]
    edited = tokens.clone()
    assert mild.step(edited, logits, states) == [False]  # 0.596 - 0.081 > 0.5
    assert edited.tolist() == [[4, 4]]


def test_joint_sync_run_respects_the_round_bound() -> None:
    algo = JointThreshold(mask_id=M, max_post_edit_steps=3)
    tokens = batch([M, M])
    flips = [logits_for([(4, 9.0), (4, 9.0)])[None], logits_for([(3, 9.0), (3, 9.0)])[None]]
    count = [0]

    def forward(t: torch.Tensor) -> torch.Tensor:
        count[0] += 1
        return flips[count[0] % 2]

    done, forwards = algo.run(forward, tokens, algo.init_states(tokens), "sync")
    assert done == [True]
    assert forwards == 1 + 3 + 1  # unmask, 3 edits, final
    assert forwards <= algo.max_rounds(2)


def test_joint_requires_its_state() -> None:
    with pytest.raises(TypeError, match="JointState"):
        JointThreshold(mask_id=M).step(batch([M]), logits_for([(2, 1.0)])[None], [None])


# --- registry and config files ---------------------------------------------------------------


def test_make_algorithm_builds_each_registered_algorithm_with_params() -> None:
    assert set(ALGORITHMS) == {"LowConfidence", "JointThreshold"}
    low = make_algorithm("LowConfidence", {"threshold": 0.9}, mask_id=7)
    assert isinstance(low, LowConfidence) and low.threshold == 0.9 and low.mask_id == 7
    joint = make_algorithm("JointThreshold", {"max_post_edit_steps": 4, "penalty_lambda": 0.5})
    assert isinstance(joint, JointThreshold)
    assert joint.params() == {
        "threshold": 0.5,
        "edit_threshold": 0.0,
        "max_post_edit_steps": 4,
        "penalty_lambda": 0.5,
    }


def test_unknown_algorithm_lists_valid_names() -> None:
    with pytest.raises(UnknownAlgorithm) as info:
        make_algorithm("HighConfidence")
    assert isinstance(info.value, ConfigError) and isinstance(info.value, SchedSpecError)
    assert "HighConfidence" in str(info.value)
    assert "LowConfidence" in str(info.value) and "JointThreshold" in str(info.value)


def test_unknown_key_names_the_key_and_lists_valid_keys() -> None:
    with pytest.raises(UnknownAlgorithmKey) as info:
        make_algorithm("LowConfidence", {"edit_threshold": 0.1})
    assert isinstance(info.value, ConfigError)
    assert info.value.key == "edit_threshold"
    assert "edit_threshold" in str(info.value) and "threshold" in str(info.value)
    assert info.value.valid_keys == ("threshold",)


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("LowConfidence", "threshold", 1.5),
        ("LowConfidence", "threshold", "high"),
        ("JointThreshold", "max_post_edit_steps", -1),
        ("JointThreshold", "max_post_edit_steps", 2.5),
        ("JointThreshold", "penalty_lambda", -0.1),
    ],
)
def test_out_of_range_values_are_config_errors(name: str, key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"{name}.{key}"):
        make_algorithm(name, {key: value})


def test_load_algorithm_config_reads_yaml_and_json(tmp_path: Path) -> None:
    y = tmp_path / "algo.yaml"
    y.write_text("algorithm: JointThreshold\nthreshold: 0.6\nmax_post_edit_steps: 8\n")
    algo = load_algorithm_config(y)
    assert isinstance(algo, JointThreshold)
    assert (algo.threshold, algo.max_post_edit_steps) == (0.6, 8)
    j = tmp_path / "algo.json"
    j.write_text(json.dumps({"algorithm": "LowConfidence", "threshold": 0.8}))
    low = load_algorithm_config(j)
    assert isinstance(low, LowConfidence) and low.threshold == 0.8


def test_load_algorithm_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"threshold": 0.8}))
    with pytest.raises(ConfigError, match="algorithm"):
        load_algorithm_config(bad)
    bad.write_text(json.dumps({"algorithm": "LowConfidence", "budget": 3}))
    with pytest.raises(UnknownAlgorithmKey, match="budget"):
        load_algorithm_config(bad)
    bad.write_text("{not json")
    with pytest.raises(ConfigError):
        load_algorithm_config(bad)
