"""Pure-numpy dLLM step functions: LowConfidence and JointThreshold.

They follow DESIGN.md to the letter and are the twins of the torch algorithms in `gpu/` (a
differential test feeds both the same logits). Per row the input is the current block tokens
(some equal to `mask_id`) and logits of shape [block_size, vocab]:

    x = argmax(logits)               (first index on ties)
    p = softmax(logits)[x]           (float32)

`step` updates the block tokens in place and returns, per row, whether the block was already
complete when the step started (done); after the last mask is filled one more step runs on the
complete block — the forward that writes its final KV — before it reports done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from spec.errors import ConfigError

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]


def argmax_and_confidence(logits: FloatArray) -> tuple[IntArray, FloatArray]:
    """(x, p): argmax token per position and its float32 softmax probability."""
    z = logits.astype(np.float32)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z, dtype=np.float32)
    probs = e / e.sum(axis=-1, keepdims=True, dtype=np.float32)
    x = np.argmax(z, axis=-1).astype(np.int64)
    p = np.take_along_axis(probs, x[..., None], axis=-1)[..., 0].astype(np.float32)
    return x, p


def token_probability(logits: FloatArray, tokens: IntArray) -> FloatArray:
    """Softmax probability (float32) of the given tokens, per position."""
    z = logits.astype(np.float32)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z, dtype=np.float32)
    probs = e / e.sum(axis=-1, keepdims=True, dtype=np.float32)
    safe = np.clip(tokens, 0, probs.shape[-1] - 1)
    return np.take_along_axis(probs, safe[..., None], axis=-1)[..., 0].astype(np.float32)


def fill_masks(tokens: IntArray, logits: FloatArray, mask_id: int, threshold: float) -> None:
    """Mask-to-token for one row: commit masked positions whose confidence > threshold, or the
    single most confident masked position if none clears it (progress is guaranteed)."""
    masked = tokens == mask_id
    x, p = argmax_and_confidence(logits)
    confidence = np.where(masked, p, np.float32(-np.inf))
    transfer = masked & (p > np.float32(threshold))
    if not transfer.any():
        transfer = np.zeros_like(masked)
        transfer[int(np.argmax(confidence))] = True
    tokens[transfer] = x[transfer]


class StepAlgorithm(Protocol):
    """A dLLM step function over numpy arrays."""

    @property
    def name(self) -> str: ...

    def init_step_state(self, tokens: IntArray) -> object: ...

    def step(
        self, tokens: IntArray, logits: FloatArray, states: Sequence[object]
    ) -> tuple[list[bool], list[object]]:
        """Update tokens [b, B] in place; return (done per row, new states)."""
        ...


@dataclass(frozen=True, slots=True)
class LowConfidence:
    """Commit every masked position above `threshold`, else the single most confident one."""

    mask_id: int
    threshold: float = 0.95
    name: str = "LowConfidence"

    def init_step_state(self, tokens: IntArray) -> object:
        return None  # stateless

    def step(
        self, tokens: IntArray, logits: FloatArray, states: Sequence[object]
    ) -> tuple[list[bool], list[object]]:
        done: list[bool] = []
        for i in range(tokens.shape[0]):
            if not (tokens[i] == self.mask_id).any():
                done.append(True)  # complete when the step started: this was the final forward
                continue
            fill_masks(tokens[i], logits[i], self.mask_id, self.threshold)
            done.append(False)
        return done, list(states)


@dataclass(frozen=True, slots=True)
class JointState:
    """JointThreshold's per-block state, carried between FDFO rounds."""

    post_edit_steps: int
    finished: bool
    prompt_mask: tuple[bool, ...]  # positions that held prompt tokens when the block began


@dataclass(frozen=True, slots=True)
class JointThreshold:
    """Mask-to-token like LowConfidence, then token-to-token edits of generated positions."""

    mask_id: int
    threshold: float = 0.5
    edit_threshold: float = 0.0
    max_post_edit_steps: int = 16
    penalty_lambda: float = 0.0
    name: str = "JointThreshold"

    def init_step_state(self, tokens: IntArray) -> object:
        return JointState(0, False, tuple(bool(t != self.mask_id) for t in tokens))

    def step(
        self, tokens: IntArray, logits: FloatArray, states: Sequence[object]
    ) -> tuple[list[bool], list[object]]:
        done: list[bool] = []
        out: list[object] = []
        for i in range(tokens.shape[0]):
            state = states[i]
            assert isinstance(state, JointState), "JointThreshold needs its carried state"
            row = tokens[i]
            if state.finished:
                done.append(True)
                out.append(state)
                continue
            if (row == self.mask_id).any():
                fill_masks(row, logits[i], self.mask_id, self.threshold)
                done.append(False)
                out.append(state)
                continue
            if state.post_edit_steps >= self.max_post_edit_steps:
                done.append(True)
                out.append(replace(state, finished=True))
                continue
            x, p = argmax_and_confidence(logits[i])
            p_cur = token_probability(logits[i], row)
            editable = ~np.array(state.prompt_mask, dtype=bool)
            score = p - np.float32(self.penalty_lambda) * p_cur
            edits = editable & (x != row) & (score > np.float32(self.edit_threshold))
            if not edits.any():
                done.append(True)
                out.append(replace(state, finished=True))
                continue
            row[edits] = x[edits]
            done.append(False)
            out.append(replace(state, post_edit_steps=state.post_edit_steps + 1))
        return done, out


ALGORITHM_PARAMS: dict[str, tuple[str, ...]] = {
    "LowConfidence": ("threshold",),
    "JointThreshold": ("threshold", "edit_threshold", "max_post_edit_steps", "penalty_lambda"),
}
ALGORITHMS = tuple(ALGORITHM_PARAMS)


def make_step_algorithm(name: str, mask_id: int, **params: float) -> StepAlgorithm:
    """LowConfidence or JointThreshold by name with optional parameters."""
    if name not in ALGORITHM_PARAMS:
        raise ConfigError("algorithm", name, f"one of {list(ALGORITHMS)}")
    unknown = sorted(set(params) - set(ALGORITHM_PARAMS[name]))
    if unknown:
        raise ConfigError(
            f"{name}.{unknown[0]}",
            params[unknown[0]],
            f"valid keys: {list(ALGORITHM_PARAMS[name])}",
        )
    if name == "LowConfidence":
        return LowConfidence(mask_id, **params)  # type: ignore[arg-type]
    return JointThreshold(mask_id, **params)  # type: ignore[arg-type]
