"""dLLM step algorithms over torch tensors: LowConfidence and JointThreshold.

Per row the input is the current block tokens (B ids, some equal to `mask_id`) and logits [B, V]:

    x = argmax(logits, -1)                       (torch.argmax: first index on ties)
    p = softmax(logits.float(), -1) gathered at x  (float32)

`step(tokens, logits, states)` updates `tokens` [b, B] in place and returns, per row, `done`:
whether the block was ALREADY complete when the step started. After the last mask is filled one
more forward runs on the complete block (it writes the final KV), then the step reports done.
Stateful algorithms keep one state object per row in `states`; `step` replaces `states[i]` in
the given list, and the caller carries that list between FDFO rounds.

The numpy twins in `reference/` implement the same text; a differential test holds both to
identical commits, so every comparison here is done in float32 like theirs.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import torch
import yaml

from gpu.errors import UnknownAlgorithm, UnknownAlgorithmKey
from gpu.tokenizer import MASK_ID
from spec.errors import ConfigError, SchedSpecError
from spec.input_file import read_input_text
from spec.json_text import parse_json

Forward = Callable[[torch.Tensor], torch.Tensor]
MODES = ("sync", "fdfo")


class AlgorithmStalled(SchedSpecError, RuntimeError):
    """A sync run exceeded the algorithm's round bound (a bug, never expected)."""


def argmax_and_confidence(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, p, probs) for logits [..., V]: argmax id, its float32 softmax prob, all probs."""
    z = logits.float()
    probs = torch.softmax(z, dim=-1)
    x = torch.argmax(z, dim=-1)
    p = probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    return x, p, probs


def fill_masks(row: torch.Tensor, logits: torch.Tensor, mask_id: int, threshold: float) -> None:
    """Mask-to-token on one row [B] in place: commit masked positions with p > threshold, or
    the single most confident masked position (first index on ties) when none clears it."""
    x, p, _ = argmax_and_confidence(logits)
    tokens = row[None]
    tokens.copy_(
        torch.where(mask_transfers(tokens == mask_id, p[None], threshold), x[None], tokens)
    )


def mask_transfers(masked: torch.Tensor, p: torch.Tensor, threshold: float) -> torch.Tensor:
    """Bool [b, B]: the positions mask-to-token commits, for every row at once. Per row: the
    masked positions with p > threshold, or, when none clears it, the single most confident
    masked position (first index on ties); nothing in a row without masks. No host sync."""
    transfer = masked & (p > torch.tensor(threshold, dtype=torch.float32))
    fallback_rows = masked.any(dim=-1) & ~transfer.any(dim=-1)  # [b]
    confidence = torch.where(masked, p, torch.full_like(p, float("-inf")))
    best = torch.argmax(confidence, dim=-1, keepdim=True)  # torch.argmax: first on ties
    fallback = torch.zeros_like(masked).scatter_(-1, best, fallback_rows[:, None])
    return transfer | fallback


class DllmAlgorithm(ABC):
    """A block-decoding algorithm: `init_step_state`, `step` and the `run` driver."""

    name: ClassVar[str]
    param_names: ClassVar[tuple[str, ...]]

    def __init__(self, mask_id: int) -> None:
        self.mask_id = mask_id

    def init_step_state(self, block_tokens: torch.Tensor) -> object:
        """State for a block [B] that is about to be decoded (None for stateless algorithms)."""
        return None

    def init_states(self, tokens: torch.Tensor) -> list[object]:
        """One fresh state per row of tokens [b, B]."""
        return [self.init_step_state(tokens[i]) for i in range(tokens.shape[0])]

    def step(self, tokens: torch.Tensor, logits: torch.Tensor, states: list[object]) -> list[bool]:
        """Update tokens [b, B] in place from logits [b, B, V]; return done per row (complete
        when the step started). May replace entries of `states`."""
        return self.step_counted(tokens, logits, states)[0]

    @abstractmethod
    def step_counted(
        self, tokens: torch.Tensor, logits: torch.Tensor, states: list[object]
    ) -> tuple[list[bool], list[int]]:
        """As `step`, also returning the masks left in each row after the step; both lists
        come from ONE device-to-host copy (the serving loop's only read per forward)."""

    @abstractmethod
    def max_rounds(self, block_size: int) -> int:
        """Upper bound on forwards a sync run of one block can take (incl. the final one)."""

    def params(self) -> dict[str, float | int]:
        """The algorithm's parameters by name, in `param_names` order (as `__repr__` shows)."""
        return {name: getattr(self, name) for name in self.param_names}

    def run(
        self, forward: Forward, tokens: torch.Tensor, states: list[object], mode: str
    ) -> tuple[list[bool], int]:
        """Drive forward -> step. "sync": repeat until every row is done (done rows stay in the
        batch); "fdfo": exactly one forward -> step. Returns (done per row, forwards run)."""
        if mode == "fdfo":
            return self.step(tokens, forward(tokens), states), 1
        if mode != "sync":
            raise ConfigError("mode", mode, f"one of {list(MODES)}")
        limit = self.max_rounds(tokens.shape[1])
        forwards = 0
        while True:
            done = self.step(tokens, forward(tokens), states)
            forwards += 1
            if all(done):
                return done, forwards
            if forwards >= limit:
                raise AlgorithmStalled(
                    f"{self.name}: {forwards} forwards without finishing a block of "
                    f"{tokens.shape[1]} (bound {limit})"
                )

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{self.name}(mask_id={self.mask_id}, {args})"


class LowConfidence(DllmAlgorithm):
    """Commit every masked position above `threshold`, else the single most confident one."""

    name = "LowConfidence"
    param_names: ClassVar[tuple[str, ...]] = ("threshold",)

    def __init__(self, mask_id: int = MASK_ID, threshold: float = 0.95) -> None:
        super().__init__(mask_id)
        self.threshold = threshold

    def step_counted(
        self, tokens: torch.Tensor, logits: torch.Tensor, states: list[object]
    ) -> tuple[list[bool], list[int]]:
        """Every row at once: a row without masks is done (that forward wrote the final KV);
        the others commit their transfers. One host transfer: the done flags and the masks
        left."""
        masked = tokens == self.mask_id
        x, p, _ = argmax_and_confidence(logits)
        transfer = mask_transfers(masked, p, self.threshold)
        tokens.copy_(torch.where(transfer, x.to(tokens.dtype), tokens))
        left = masked.sum(dim=-1) - transfer.sum(dim=-1)
        done: list[int]
        masks: list[int]
        done, masks = torch.stack((~masked.any(dim=-1), left)).tolist()
        return [bool(d) for d in done], masks

    def max_rounds(self, block_size: int) -> int:
        """`block_size + 1`: at least one mask filled per forward, then the final forward."""
        return block_size + 1


@dataclass(frozen=True, slots=True)
class JointState:
    """JointThreshold's per-block state, carried by the caller between FDFO rounds."""

    post_edit_steps: int
    finished: bool
    prompt_mask: tuple[bool, ...]  # positions holding prompt tokens when the block began


class JointThreshold(DllmAlgorithm):
    """Mask-to-token like LowConfidence (with `threshold`), then token-to-token edits of
    generated positions until nothing changes or `max_post_edit_steps` edits were made."""

    name = "JointThreshold"
    param_names: ClassVar[tuple[str, ...]] = (
        "threshold",
        "edit_threshold",
        "max_post_edit_steps",
        "penalty_lambda",
    )

    def __init__(
        self,
        mask_id: int = MASK_ID,
        threshold: float = 0.5,
        edit_threshold: float = 0.0,
        max_post_edit_steps: int = 16,
        penalty_lambda: float = 0.0,
    ) -> None:
        super().__init__(mask_id)
        self.threshold = threshold
        self.edit_threshold = edit_threshold
        self.max_post_edit_steps = max_post_edit_steps
        self.penalty_lambda = penalty_lambda

    def init_step_state(self, block_tokens: torch.Tensor) -> JointState:
        """A fresh `JointState` whose `prompt_mask` marks the non-mask positions of the block
        [B] (one host read); those are never edited."""
        prompt = tuple(bool(t) for t in (block_tokens != self.mask_id).tolist())
        return JointState(post_edit_steps=0, finished=False, prompt_mask=prompt)

    def step_counted(
        self, tokens: torch.Tensor, logits: torch.Tensor, states: list[object]
    ) -> tuple[list[bool], list[int]]:
        """Every row at once. Per row, by its state at the start of the step: finished -> done;
        masks left -> mask-to-token; edit budget spent -> finished, done; else the edits of
        non-prompt positions whose argmax differs with score > edit_threshold, and finished,
        done when there are none. One host transfer (done, newly finished, edited, masks left
        per row); the per-row state objects are rebuilt only for rows whose state changed."""
        for i, state in enumerate(states):
            if not isinstance(state, JointState):
                raise TypeError(f"row {i}: JointThreshold needs a JointState, got {state!r}")
        joint = [s for s in states if isinstance(s, JointState)]
        device = tokens.device
        finished = torch.tensor([s.finished for s in joint], dtype=torch.bool, device=device)
        steps = torch.tensor([s.post_edit_steps for s in joint], dtype=torch.long, device=device)
        prompt = torch.tensor([s.prompt_mask for s in joint], dtype=torch.bool, device=device)
        prompt = prompt.view(tokens.shape)  # [b, B] (also when b == 0)
        masked = tokens == self.mask_id
        has_masks = masked.any(dim=-1)
        active = ~finished
        x, p, probs = argmax_and_confidence(logits)
        transfer = mask_transfers(masked & active[:, None], p, self.threshold)
        editing = active & ~has_masks
        capped = editing & (steps >= self.max_post_edit_steps)
        trying = editing & ~capped
        p_cur = probs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
        score = p - torch.tensor(self.penalty_lambda, dtype=torch.float32) * p_cur
        edits = (
            trying[:, None]
            & ~prompt
            & (x != tokens)
            & (score > torch.tensor(self.edit_threshold, dtype=torch.float32))
        )
        edited = edits.any(dim=-1)
        newly_finished = capped | (trying & ~edited)
        tokens.copy_(torch.where(transfer | edits, x.to(tokens.dtype), tokens))
        left = masked.sum(dim=-1) - transfer.sum(dim=-1)
        done: list[int]
        masks: list[int]
        done, ends, edit_rows, masks = torch.stack(
            (finished | newly_finished, newly_finished, edited, left)
        ).tolist()
        for i, (end, more) in enumerate(zip(ends, edit_rows, strict=True)):
            if end:
                states[i] = replace(joint[i], finished=True)
            elif more:
                states[i] = replace(joint[i], post_edit_steps=joint[i].post_edit_steps + 1)
        return [bool(d) for d in done], masks

    def max_rounds(self, block_size: int) -> int:
        """`block_size + max_post_edit_steps + 1`: the mask-filling forwards, at most
        `max_post_edit_steps` edits, then the forward that finishes the block."""
        return block_size + self.max_post_edit_steps + 1


ALGORITHMS: dict[str, type[DllmAlgorithm]] = {
    LowConfidence.name: LowConfidence,
    JointThreshold.name: JointThreshold,
}


def _check_value(algorithm: str, key: str, value: object) -> float | int:
    """Validate one parameter; ConfigError naming `algorithm.key` and what is valid."""
    field = f"{algorithm}.{key}"
    if key == "max_post_edit_steps":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(field, value, "a non-negative integer")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ConfigError(field, value, "a number")
    number = float(value)
    if key == "threshold" and not 0.0 <= number <= 1.0:
        raise ConfigError(field, value, "a probability in [0, 1]")
    if key == "penalty_lambda" and number < 0:
        raise ConfigError(field, value, "a non-negative number")
    if key == "edit_threshold" and not -1.0 <= number <= 1.0:
        raise ConfigError(field, value, "a number in [-1, 1]")
    return number


def make_algorithm(
    name: str, config: Mapping[str, object] | None = None, *, mask_id: int = MASK_ID
) -> DllmAlgorithm:
    """Build a registered algorithm by name with optional parameters.

    Raises UnknownAlgorithm (listing valid names) or UnknownAlgorithmKey (naming the key and
    listing valid keys), both ConfigErrors, or ConfigError for an out-of-range value."""
    cls = ALGORITHMS.get(name)
    if cls is None:
        raise UnknownAlgorithm(name, tuple(ALGORITHMS))
    params: dict[str, float | int] = {}
    for key, value in (config or {}).items():
        if key not in cls.param_names:
            raise UnknownAlgorithmKey(name, key, value, cls.param_names)
        params[key] = _check_value(name, key, value)
    return cls(mask_id, **params)


def load_algorithm_config(path: str | Path, *, mask_id: int = MASK_ID) -> DllmAlgorithm:
    """Build an algorithm from a YAML (.yaml/.yml) or JSON file such as
    `{"algorithm": "JointThreshold", "threshold": 0.6}`."""
    source = Path(path)
    text = read_input_text(source)
    try:
        if source.suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            data = parse_json(text)
    except (yaml.YAMLError, json.JSONDecodeError, RecursionError) as exc:  # YAML nested too deep
        raise ConfigError("algorithm_config", str(source), f"valid YAML or JSON ({exc})") from exc
    if not isinstance(data, dict) or "algorithm" not in data:
        raise ConfigError(
            "algorithm_config",
            str(source),
            'a mapping with an "algorithm" key, e.g. {"algorithm": "LowConfidence"}',
        )
    params = {str(k): v for k, v in data.items() if k != "algorithm"}
    name = data["algorithm"]
    if not isinstance(name, str):
        raise UnknownAlgorithm(name, tuple(ALGORITHMS))
    return make_algorithm(name, params, mask_id=mask_id)
