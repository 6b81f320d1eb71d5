"""Where the reference scheduler's denoising comes from: the `DenoiseOracle` protocol.

An oracle says what each row commits in one forward→step. Two are built in:

- `AlgorithmOracle` runs the real numpy step algorithms (LowConfidence, JointThreshold) over a
  deterministic pseudo-logits source. The logits of a row depend only on the request's committed
  context, the block index and the block's current tokens — never on batch composition — so the
  reference's outputs are batch-invariant, exactly like a real model at batch size 1.
- `ScriptedOracle` follows a step-count pattern: block k of a request needs a given number of
  rounds to unmask (useful for exact-fit and simultaneous-finish workloads).
- `RecordedOracle` replays another implementation's recorded step outcomes (a differential:
  the torch engine's, SGLang's), so only the scheduling decisions can differ.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, runtime_checkable

import numpy as np

from reference.algorithms import (
    FloatArray,
    IntArray,
    JointThreshold,
    LowConfidence,
    StepAlgorithm,
    make_step_algorithm,
)
from spec.config import DllmConfig, RequestSpec
from spec.events import (
    Aborted,
    BlockCommitted,
    ControlReturned,
    Event,
    Finished,
    FinishReason,
    Forward,
    StepResult,
)


@dataclass(frozen=True, slots=True)
class OracleRow:
    """One row of a forward, as the oracle sees it."""

    request_id: str
    context: tuple[int, ...]  # committed tokens before this block (prompt blocks included)
    block_index: int
    tokens: tuple[int, ...]  # current block contents (masks = mask_id)
    state: object  # the carried algorithm state


@dataclass(frozen=True, slots=True)
class OracleStep:
    """What one row's forward→step gives: the block's new tokens, its new state, done."""

    tokens: tuple[int, ...]
    state: object
    done: bool


class DenoiseOracle(Protocol):
    """What each request commits each round."""

    def init_state(self, row_tokens: tuple[int, ...]) -> object:
        """The algorithm state of a block that starts with these tokens."""
        ...

    def step(self, rows: Sequence[OracleRow]) -> list[OracleStep]:
        """One forward→step over the batch: new tokens, new state and done per row."""
        ...


@runtime_checkable
class SampledStops(Protocol):
    """An oracle that also knows where a request with a sampled stop (`RequestSpec.
    stop_sampled`: stop strings its engine evaluates) stops: `RecordedOracle` knows where the
    recorded run finished it with STOP."""

    def stops_after(self, request_id: str) -> int | None:
        """The number of committed blocks after which the request finishes with STOP (None:
        it never does)."""
        ...


def stops_now(oracle: object, request: RequestSpec, committed_blocks: int) -> bool:
    """Whether `request`, having just committed its block number `committed_blocks`, finishes
    with STOP: only a request with a sampled stop, and only where its oracle says."""
    return (
        request.stop_sampled
        and isinstance(oracle, SampledStops)
        and oracle.stops_after(request.request_id) == committed_blocks
    )


@runtime_checkable
class EngineAborts(Protocol):
    """An oracle that also knows where an engine aborted a request inside a round, right
    after a commit (`DllmPolicy.aborts_after_commit`): `RecordedOracle` knows where the
    recorded run did."""

    def aborts_after(self, request_id: str) -> int | None:
        """The number of committed blocks after which the engine aborts the request in the
        round (None: it never does)."""
        ...


def aborts_now(oracle: object, request_id: str, committed_blocks: int) -> bool:
    """Whether the engine aborts `request_id` right after it committed its block number
    `committed_blocks`: only where its oracle says."""
    return isinstance(oracle, EngineAborts) and oracle.aborts_after(request_id) == committed_blocks


def _seed(*parts: object) -> int:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


def pseudo_logits(
    seed: int, context: tuple[int, ...], block_index: int, tokens: tuple[int, ...], vocab: int
) -> FloatArray:
    """Deterministic logits [len(tokens), vocab] for a block, read-only.

    Each position has a preferred token and a peak height fixed by (seed, context, position),
    plus noise that depends on the block's current contents, so confidence rises and falls as
    the block fills: some blocks finish in one or two steps, some need one step per token, and
    low peaks let JointThreshold find edits. The peaks are memoised (`_peaks`); whole rows'
    steps are memoised above this (`_row_step`).
    """
    b = len(tokens)
    preferred, height = _peaks(seed, context, block_index, b, vocab)
    noise_rng = np.random.Generator(np.random.PCG64(_seed(seed, context, block_index, tokens)))
    logits = noise_rng.normal(0.0, 1.0, size=(b, vocab)).astype(np.float32)
    logits[np.arange(b), preferred] += height
    logits.setflags(write=False)
    return logits


@lru_cache(maxsize=4096)
def _peaks(
    seed: int, context: tuple[int, ...], block_index: int, b: int, vocab: int
) -> tuple[IntArray, FloatArray]:
    """Each position's preferred token and peak height: fixed while the block's tokens change."""
    base = np.random.Generator(np.random.PCG64(_seed(seed, context, block_index)))
    preferred = base.integers(0, vocab, size=b)
    height = base.uniform(0.0, 11.0, size=b).astype(np.float32)
    preferred.setflags(write=False)
    height.setflags(write=False)
    return preferred, height


class AlgorithmOracle:
    """Runs a numpy step algorithm over `pseudo_logits`."""

    def __init__(self, algorithm: StepAlgorithm, vocab: int = 16, seed: int = 0) -> None:
        self.algorithm = algorithm
        self.vocab = vocab
        self.seed = seed

    @classmethod
    def named(
        cls, name: str, mask_id: int, vocab: int = 16, seed: int = 0, **params: float
    ) -> AlgorithmOracle:
        """An oracle over `make_step_algorithm(name, mask_id, **params)`; `ConfigError` for an
        unknown algorithm or parameter."""
        return cls(make_step_algorithm(name, mask_id, **params), vocab, seed)

    def init_state(self, row_tokens: tuple[int, ...]) -> object:
        """The algorithm's `init_step_state` of a block starting with `row_tokens`."""
        return self.algorithm.init_step_state(np.array(row_tokens, dtype=np.int64))

    def step(self, rows: Sequence[OracleRow]) -> list[OracleStep]:
        """The algorithm's step over the batch, each row's logits `pseudo_logits` of its own
        context, block index and tokens (never of the rest of the batch). The built-in
        algorithms step each row on its own (a batched step equals each row stepped alone), so
        their rows are stepped one by one through a memo; another algorithm gets the batch."""
        algorithm = self.algorithm
        # exact types (a subclass may step otherwise); isinstance narrows the type for mypy
        if not (isinstance(algorithm, _ROW_WISE) and type(algorithm) in _ROW_WISE):
            return _batch_step(algorithm, self.seed, self.vocab, rows)
        return [
            _row_step(algorithm, self.seed, self.vocab, r.context, r.block_index, r.tokens, r.state)
            if _hashable(r.state)
            else _batch_step(algorithm, self.seed, self.vocab, [r])[0]
            for r in rows
        ]


def _hashable(state: object) -> bool:
    try:
        hash(state)
    except TypeError:  # not a state the algorithm carries: its own step says what is wrong
        return False
    return True


#: The algorithms whose step of a row depends on that row alone, and whose states are hashable.
_ROW_WISE = (LowConfidence, JointThreshold)


def _batch_step(
    algorithm: StepAlgorithm, seed: int, vocab: int, rows: Sequence[OracleRow]
) -> list[OracleStep]:
    if not rows:
        return []
    tokens: IntArray = np.array([r.tokens for r in rows], dtype=np.int64)
    logits = np.stack(
        [pseudo_logits(seed, r.context, r.block_index, r.tokens, vocab) for r in rows]
    )
    done, states = algorithm.step(tokens, logits, [r.state for r in rows])
    return [
        OracleStep(tuple(int(t) for t in tokens[i]), states[i], done[i]) for i in range(len(rows))
    ]


@lru_cache(maxsize=16384)
def _row_step(
    algorithm: LowConfidence | JointThreshold,
    seed: int,
    vocab: int,
    context: tuple[int, ...],
    block_index: int,
    tokens: tuple[int, ...],
    state: object,
) -> OracleStep:
    """One row's step, memoised: a check steps the same block many times, in the run under test
    and again in its golden runs (an `OracleStep` is immutable, so it can be shared)."""
    row = OracleRow("", context, block_index, tokens, state)
    return _batch_step(algorithm, seed, vocab, [row])[0]


StepPattern = Callable[[str, int], int]  # (request id, block index) -> rounds to unmask


@dataclass(frozen=True, slots=True)
class ScriptedState:
    """ScriptedOracle's per-block state: the steps the block has taken."""

    steps_taken: int


class ScriptedOracle:
    """Block k of request r unmasks in `pattern(r, k)` steps (at least 1 when it has masks).

    Tokens are drawn deterministically from (request, block, position) in [0, vocab).
    Completion is reported like LowConfidence: done on the step after the last mask is filled.
    """

    def __init__(self, pattern: StepPattern, mask_id: int, vocab: int = 16) -> None:
        self.pattern = pattern
        self.mask_id = mask_id
        self.vocab = vocab

    def init_state(self, row_tokens: tuple[int, ...]) -> object:
        """`ScriptedState(0)`: no step taken yet."""
        return ScriptedState(0)

    def step(self, rows: Sequence[OracleRow]) -> list[OracleStep]:
        """Per row: a block without masks is done, unchanged; otherwise it fills its leftmost
        ceil(masks / steps left of `pattern`) masks (at least one) and is not done yet."""
        out: list[OracleStep] = []
        for r in rows:
            state = r.state
            assert isinstance(state, ScriptedState), "ScriptedOracle needs its carried state"
            masked = [i for i, t in enumerate(r.tokens) if t == self.mask_id]
            if not masked:
                out.append(OracleStep(r.tokens, state, True))
                continue
            budget = max(1, self.pattern(r.request_id, r.block_index) - state.steps_taken)
            n = max(1, -(-len(masked) // budget))
            new = list(r.tokens)
            for i in masked[:n]:
                new[i] = _seed(r.request_id, r.block_index, i) % self.vocab
            out.append(OracleStep(tuple(new), ScriptedState(state.steps_taken + 1), False))
        return out


BlockKey = tuple[str, int]  # (request id, block index)


@dataclass(frozen=True, slots=True)
class BlockScript:
    """What another implementation's steps of one block did, in order: per step its done flag
    and the masks it left; and the tokens the block committed (None if it never did)."""

    steps: tuple[tuple[bool, int], ...]
    final: tuple[int, ...] | None


class RecordedOracle:
    """Replays another implementation's recorded step outcomes, so the reference denoises
    exactly as it did and only the scheduling decisions can differ (a differential).

    Its state is the number of steps the block has taken. A step fills the leftmost masked
    positions (with the block's committed tokens) until the recorded mask count is left, and
    reports the recorded done flag; a done step yields the committed tokens. Stepping a block
    more often than the record has steps raises `RecordExhausted`: the two schedulers' decisions
    have diverged so far that the record no longer covers them."""

    def __init__(
        self,
        scripts: dict[BlockKey, BlockScript],
        mask_id: int,
        stops: dict[str, int] | None = None,
        aborts: dict[str, int] | None = None,
    ) -> None:
        self.scripts = scripts
        self.mask_id = mask_id
        self.stops: dict[str, int] = stops or {}  # request -> committed blocks at its recorded STOP
        self.aborts: dict[str, int] = (
            aborts or {}
        )  # request -> committed blocks at its in-round abort

    @classmethod
    def from_events(cls, events: Sequence[Event], config: DllmConfig) -> RecordedOracle:
        """From another implementation's event stream under `config`: per block, each
        `StepResult` in order (a step is done when it accepts the whole block, with the masks it
        left), and the block's `BlockCommitted` tokens; per request that finished with STOP, the
        blocks it had committed then (`SampledStops`); per request aborted inside a round (after
        its first forward), the blocks it had committed then (`EngineAborts`)."""
        steps: dict[BlockKey, list[tuple[bool, int]]] = {}
        finals: dict[BlockKey, tuple[int, ...]] = {}
        committed: dict[str, int] = {}
        stops: dict[str, int] = {}
        aborts: dict[str, int] = {}
        in_round = False  # a forward ran since the round began
        for e in events:
            if isinstance(e, StepResult):
                done = e.accept_length == config.block_size
                steps.setdefault((e.request_id, e.block_index), []).append(
                    (done, e.masks_remaining)
                )
            elif isinstance(e, BlockCommitted):
                finals[(e.request_id, e.block_index)] = e.tokens
                committed[e.request_id] = committed.get(e.request_id, 0) + 1
            elif isinstance(e, Finished) and e.reason is FinishReason.STOP:
                stops[e.request_id] = committed.get(e.request_id, 0)
            elif isinstance(e, Forward):
                in_round = True
            elif isinstance(e, ControlReturned):
                in_round = False
            elif isinstance(e, Aborted) and in_round:
                aborts[e.request_id] = committed.get(e.request_id, 0)
        scripts = {key: BlockScript(tuple(s), finals.get(key)) for key, s in steps.items()}
        return cls(scripts, config.mask_token_id, stops, aborts)

    def stops_after(self, request_id: str) -> int | None:
        """Committed blocks at the request's recorded STOP (None: it did not stop)."""
        return self.stops.get(request_id)

    def aborts_after(self, request_id: str) -> int | None:
        """Committed blocks at the request's recorded in-round abort (None: no such abort)."""
        return self.aborts.get(request_id)

    def init_state(self, row_tokens: tuple[int, ...]) -> object:
        """0: the block has taken no step."""
        return 0

    def step(self, rows: Sequence[OracleRow]) -> list[OracleStep]:
        """Each row's next recorded step (class docstring); `RecordExhausted` for a block stepped
        more often than the record covers."""
        out: list[OracleStep] = []
        for row in rows:
            key = (row.request_id, row.block_index)
            n = row.state
            assert isinstance(n, int), "RecordedOracle needs its carried state"
            script = self.scripts.get(key)
            if script is None or n >= len(script.steps):
                taken = 0 if script is None else len(script.steps)
                raise RecordExhausted(
                    f"block {key} needs step {n + 1}; the record has {taken} step(s) of it"
                )
            done, masks_left = script.steps[n]
            final = script.final or tuple(0 for _ in row.tokens)
            tokens = list(row.tokens)
            masked = [i for i, t in enumerate(tokens) if t == self.mask_id]
            for i in masked[: max(0, len(masked) - masks_left)]:
                tokens[i] = final[i]
            if done and script.final is not None:
                tokens = list(script.final)
            out.append(OracleStep(tuple(tokens), n + 1, done))
        return out


class RecordExhausted(RuntimeError):
    """A block was stepped more often than the replayed record covers."""
