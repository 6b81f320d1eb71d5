"""Pure-numpy dLLM step functions: LowConfidence and JointThreshold.

They follow the algorithm text below to the letter and are the twins of the torch algorithms
in `gpu/` (a differential test feeds both the same logits). Per row the input is the current
block tokens (some equal to `mask_id`) and logits of shape [block_size, vocab]:

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
    x, p = argmax_and_confidence(logits)
    rows = tokens[None]
    rows[...] = np.where(mask_transfers(rows == mask_id, p[None], threshold), x[None], rows)


def mask_transfers(
    masked: npt.NDArray[np.bool_], p: FloatArray, threshold: float
) -> npt.NDArray[np.bool_]:
    """Bool [b, B]: what mask-to-token commits in every row at once. Per row: the masked
    positions with p > threshold, or, when none clears it, the single most confident masked
    position (first index on ties); nothing in a row without masks."""
    transfer = masked & (p > np.float32(threshold))
    fallback_rows = masked.any(axis=-1) & ~transfer.any(axis=-1)
    confidence = np.where(masked, p, np.float32(-np.inf))
    best = np.argmax(confidence, axis=-1)  # first index on ties
    fallback = np.zeros_like(masked)
    fallback[np.arange(masked.shape[0]), best] = fallback_rows
    return transfer | fallback


class StepAlgorithm(Protocol):
    """A dLLM step function over numpy arrays."""

    @property
    def name(self) -> str:
        """The algorithm's name, as `make_step_algorithm` takes it."""
        ...

    def init_step_state(self, tokens: IntArray) -> object:
        """The carried state of a block that starts with `tokens` (one row [B])."""
        ...

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
        """None: LowConfidence is stateless."""
        return None  # stateless

    def step(
        self, tokens: IntArray, logits: FloatArray, states: Sequence[object]
    ) -> tuple[list[bool], list[object]]:
        """Mask-to-token on every row (`mask_transfers`); done: the row had no mask when the step
        started. The states come back unchanged."""
        masked = tokens == self.mask_id
        x, p = argmax_and_confidence(logits)
        tokens[...] = np.where(mask_transfers(masked, p, self.threshold), x, tokens)
        # a row complete when the step started is done: this was its final forward
        done: list[bool] = (~masked.any(axis=-1)).tolist()
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
        """A fresh `JointState` for a block starting with `tokens` (one row [B]): no edit step yet,
        not finished, the positions not holding `mask_id` taken as prompt."""
        return JointState(0, False, tuple(bool(t != self.mask_id) for t in tokens))

    def step(
        self, tokens: IntArray, logits: FloatArray, states: Sequence[object]
    ) -> tuple[list[bool], list[object]]:
        """Per unfinished row: mask-to-token while the block has masks; on a complete block,
        token-to-token edits of its non-prompt positions whose argmax differs and whose score
        `p - penalty_lambda * p(current token)` exceeds `edit_threshold`. A row finishes on the
        first step of its complete block that edits nothing or follows `max_post_edit_steps` editing
        steps; done: it has finished (a finished row stays unchanged). `TypeError` for a state not a
        `JointState`."""
        joint: list[JointState] = []
        for state in states:
            if not isinstance(state, JointState):
                raise TypeError(f"JointThreshold needs its carried JointState, got {state!r}")
            joint.append(state)
        b, size = tokens.shape
        finished = np.array([s.finished for s in joint], dtype=bool)
        steps = np.array([s.post_edit_steps for s in joint], dtype=np.int64)
        prompt = np.array([s.prompt_mask for s in joint], dtype=bool).reshape(b, size)
        masked = tokens == self.mask_id
        has_masks = masked.any(axis=-1)
        active = ~finished
        x, p = argmax_and_confidence(logits)
        transfer = mask_transfers(masked & active[:, None], p, self.threshold)
        editing = active & ~has_masks
        capped = editing & (steps >= self.max_post_edit_steps)
        trying = editing & ~capped
        p_cur = token_probability(logits, tokens)
        score = p - np.float32(self.penalty_lambda) * p_cur
        edits = (
            trying[:, None] & ~prompt & (x != tokens) & (score > np.float32(self.edit_threshold))
        )
        edited = edits.any(axis=-1)
        newly_finished = capped | (trying & ~edited)
        tokens[...] = np.where(transfer | edits, x, tokens)
        out: list[object] = [
            replace(s, finished=True)
            if end
            else replace(s, post_edit_steps=s.post_edit_steps + 1)
            if more
            else s
            for s, end, more in zip(joint, newly_finished.tolist(), edited.tolist(), strict=True)
        ]
        done: list[bool] = (finished | newly_finished).tolist()
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
