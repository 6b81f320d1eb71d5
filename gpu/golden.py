"""The golden oracle of the engine: one request decoded alone, dense, unpaged and unbatched.

`golden_decode` runs the engine's model and algorithm (same parameters) on one request with
nothing the serving path adds: no KV pool, no request-to-token table, no batch, no carry. Each
forward is `BlockDiffusionLM.forward_dense` over the whole sequence so far (the committed
blocks, then the current block) under the block-causal mask; only the current block's logits
are kept, with the MASK logit suppressed as the engine's model runner does. Everything else is
the engine's rule:

- blocks start at multiples of block_size; a block holds the prompt's tokens at prompt
  positions and MASK elsewhere, so a full prompt block is decoded too (it has no masks: one
  forward, committed unchanged) and a partial last prompt block is the first output block with
  its prompt positions fixed;
- each block is decoded by the algorithm in sync mode (`DllmAlgorithm.run`), from a fresh state;
- after each committed block the request finishes as the spec says (`spec.machine`
  `finish_condition`): EOS when an EOS is among the first max_new_tokens generated tokens,
  else LENGTH once max_new_tokens tokens are generated; the output is cut at max_new_tokens and
  after the first EOS (`request_output`). A request is validated as the engine validates it
  (`validate_request`), so its blocks always fit the context.

Token ids are the config's (spec) ids, mapped to the model's with the engine's `TokenMap`.
Since every row of a batched block forward depends only on its own request, an engine that is
correct outputs exactly the golden output at every batch size and in every mode.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gpu.algorithms import DllmAlgorithm, JointThreshold, LowConfidence
from gpu.model import BlockDiffusionLM
from gpu.near_tie import NearTie, flipped, near_ties
from gpu.token_map import TokenMap
from gpu.tokenizer import EOS_ID, MASK_ID
from spec.config import DllmConfig, RequestSpec, validate_request
from spec.errors import ConfigError
from spec.events import FinishReason
from spec.golden import GoldenBranch, GoldenTie, first_difference
from spec.machine import finish_of
from spec.snapshot import FinishedOutput

if TYPE_CHECKING:
    from gpu.engine import DllmEngine


@dataclass(frozen=True, slots=True)
class TieAt:
    """A near-tie of a golden decoding, located: the block (its index), the forward within the
    block's decoding (1-based) and the tie (`gpu.near_tie.NearTie`) in that forward's logits."""

    block: int
    forward: int
    tie: NearTie


class CannotFlip(Exception):
    """A flip asked of `golden_decode` that no move within float noise makes (`flipped`)."""


@dataclass(frozen=True, slots=True)
class GoldenDecode:
    """The golden decoding of one request.

    tokens: the output in the config's ids (generated tokens, cut at max_new_tokens and after
        the first EOS, EOS included), as the engine reports it.
    finish_reason: why the request finished.
    forwards_per_block: forwards each block took (prompt-only blocks included, final forward
        included), in block order.
    near_tie: where the decoding first took a decision within float noise of flipping
        (`gpu.near_tie`), None when it took none or was not asked to look (`find_ties`). The
        engine's paged forward may break such a tie the other way.
    """

    tokens: tuple[int, ...]
    finish_reason: FinishReason
    forwards_per_block: tuple[int, ...]
    near_tie: GoldenTie | None = None
    tie_at: TieAt | None = None


def golden_decode(
    model: BlockDiffusionLM,
    algorithm: DllmAlgorithm,
    config: DllmConfig,
    request: RequestSpec,
    *,
    find_ties: bool = False,
    flips: tuple[TieAt, ...] = (),
) -> GoldenDecode:
    """Decode `request` alone (see the module docstring). With `find_ties`, also look in every
    forward for a decision within float noise of flipping and record the first
    (`GoldenDecode.near_tie`, located in `tie_at`; it costs a little per forward, so only a
    report asks), after the last of `flips`. Each of `flips` is taken the other way: its
    forward's logits are moved within float noise until it flips (`gpu.near_tie.flipped`;
    `CannotFlip` when none does). Raises the engine's request errors
    (`spec.errors.RequestError` subclasses) for a request the engine would refuse."""
    validate_request(config, request)
    tokens = TokenMap(config, model.config.vocab_size, MASK_ID, EOS_ID)
    tokens.check_prompt(request.request_id, request.prompt)
    prompt = tokens.to_internal(request.prompt)
    size = config.block_size
    device = model.embed.weight.device
    committed = torch.empty(0, dtype=torch.long, device=device)  # internal ids
    generated: list[int] = []  # config ids
    forwards: list[int] = []
    ties: list[tuple[GoldenTie, TieAt]] = []  # the first near-tie, once found
    flip_at = {(f.block, f.forward): f.tie for f in flips}
    look_after = max(flip_at, default=(-1, 0))  # the flips' own forwards hold their ties
    start = 0
    with torch.inference_mode():
        while True:
            ids = [prompt[p] if p < len(prompt) else MASK_ID for p in range(start, start + size)]
            block = torch.tensor([ids], dtype=torch.long, device=device)
            context = committed
            # positions a JointThreshold edit may change: generated ones, once no mask is left
            generated_at = torch.tensor([start + i >= len(prompt) for i in range(size)])
            calls = [0]

            def forward(
                rows: torch.Tensor,
                context: torch.Tensor = context,
                index: int = start // size,
                generated_at: torch.Tensor = generated_at,
                calls: list[int] = calls,
            ) -> torch.Tensor:
                sequence = torch.cat((context[None], rows), dim=1)
                logits = model.forward_dense(sequence, size)[:, context.shape[0] :]
                logits[..., MASK_ID] = float("-inf")  # as the engine's model runner does
                calls[0] += 1
                here = (index, calls[0])
                if here in flip_at:
                    moved = flipped(logits[0], flip_at[here], _threshold(algorithm))
                    if moved is None:
                        raise CannotFlip(f"block {index}, forward {calls[0]}")
                    logits = moved[None]
                if find_ties and not ties and here > look_after:
                    tie = _near_tie(algorithm, logits[0], rows[0].cpu(), generated_at)
                    if tie is not None:  # the first the noise can flip
                        first = max(0, index * size - len(prompt))  # its first output token
                        where = f"block {index}, forward {calls[0]}: {tie.describe()}"
                        ties.append((GoldenTie(first, where), TieAt(index, calls[0], tie)))
                return logits

            _, count = algorithm.run(forward, block, algorithm.init_states(block), "sync")
            forwards.append(count)
            committed = torch.cat((committed, block[0]))
            spec_block = tokens.to_spec(block[0].tolist())
            generated.extend(t for p, t in enumerate(spec_block, start) if p >= len(prompt))
            start += size
            end = finish_of(config, request, generated)
            if end is not None:
                found, at = ties[0] if ties else (None, None)
                return GoldenDecode(end[1], end[0], tuple(forwards), found, at)


def _threshold(algorithm: DllmAlgorithm) -> float:
    """The commit threshold of an algorithm whose ties `_near_tie` finds."""
    if not isinstance(algorithm, LowConfidence | JointThreshold):
        raise CannotFlip(f"{type(algorithm).__name__} reports no near-ties")
    return algorithm.threshold


def _near_tie(
    algorithm: DllmAlgorithm, logits: torch.Tensor, rows: torch.Tensor, generated_at: torch.Tensor
) -> NearTie | None:
    """The first near-tie of one forward's decision (`gpu.near_tie.near_ties`) that a move
    within the noise flips (`flipped`: one it cannot flip is no tie), or None; only for the
    algorithms whose decisions it knows (LowConfidence, JointThreshold)."""
    if not isinstance(algorithm, LowConfidence | JointThreshold):
        return None
    masked = rows == MASK_ID
    edits = isinstance(algorithm, JointThreshold) and not bool(masked.any())
    editable = generated_at & ~masked if edits else torch.zeros_like(masked)
    on_host = logits.cpu()
    for tie in near_ties(on_host, masked, editable, algorithm.threshold):
        if flipped(on_host, tie, algorithm.threshold) is not None:
            return tie
    return None


# Golden decodings per model, keyed by what they depend on (shrinking and the conformance
# machine ask for the same request many times). Bounded; dropped with the model.
_CACHE: weakref.WeakKeyDictionary[BlockDiffusionLM, OrderedDict[tuple[object, ...], GoldenDecode]]
_CACHE = weakref.WeakKeyDictionary()
CACHE_SIZE = 4096


def cached_golden_decode(
    model: BlockDiffusionLM, algorithm: DllmAlgorithm, config: DllmConfig, request: RequestSpec
) -> GoldenDecode:
    """`golden_decode`, remembered per model for the last `CACHE_SIZE` distinct requests."""
    key = (
        repr(algorithm),
        config.block_size,
        config.max_context,
        config.mask_token_id,
        config.eos_token_id,
        request.prompt,
        request.max_new_tokens,
        request.ignore_eos,
        tuple(request.stop_token_ids),
    )
    cache = _CACHE.setdefault(model, OrderedDict())
    hit = cache.get(key)
    if hit is not None:
        cache.move_to_end(key)
        return hit
    result = golden_decode(model, algorithm, config, request)
    cache[key] = result
    if len(cache) > CACHE_SIZE:
        cache.popitem(last=False)
    return result


def engine_near_tie(engine: DllmEngine, request: RequestSpec) -> GoldenTie | None:
    """`DllmEngine.golden_near_tie`: where the request's golden decoding (the one
    `engine_golden` compares with) first took a decision within float noise of flipping, or
    None (also when the engine's algorithm has no golden decoding). Decodes the request again,
    looking for ties: a report asks only after a mismatch."""
    algorithm = engine.configured_algorithm
    if not isinstance(algorithm, DllmAlgorithm):
        return None
    return golden_decode(engine.model, algorithm, engine.config, request, find_ties=True).near_tie


#: The most near-ties `golden_past_ties` takes the other way for one request.
MOST_FLIPS = 4


def golden_past_ties(
    model: BlockDiffusionLM,
    algorithm: DllmAlgorithm,
    config: DllmConfig,
    request: RequestSpec,
    actual: FinishedOutput,
) -> GoldenBranch | None:
    """The golden decoding of `request` with near-ties taken the other way whose output is
    `actual`, or None. One tie at a time: decode, and while the output differs from `actual`,
    take the first near-tie after the last flip the other way if it can change a token at or
    before the first difference, up to `MOST_FLIPS` ties. A decoding that parts from `actual`
    with no such tie before it cannot be explained by float noise: None."""
    flips: tuple[TieAt, ...] = ()
    taken: tuple[GoldenTie, ...] = ()
    while True:
        try:
            decode = golden_decode(model, algorithm, config, request, find_ties=True, flips=flips)
        except CannotFlip:
            return None
        output = FinishedOutput(decode.tokens, decode.finish_reason)
        if output == actual:
            return GoldenBranch(output, taken) if taken else None
        tie, at = decode.near_tie, decode.tie_at
        if tie is None or at is None or len(flips) == MOST_FLIPS:
            return None
        if tie.token > first_difference(actual, output):
            return None
        flips, taken = (*flips, at), (*taken, tie)


def engine_past_ties(
    engine: DllmEngine, request: RequestSpec, actual: FinishedOutput
) -> GoldenBranch | None:
    """`DllmEngine.golden_output_past_ties`: `golden_past_ties` with the engine's model,
    configured algorithm and configuration (None when its algorithm has no golden decoding)."""
    algorithm = engine.configured_algorithm
    if not isinstance(algorithm, DllmAlgorithm):
        return None
    return golden_past_ties(engine.model, algorithm, engine.config, request, actual)


def engine_golden(engine: DllmEngine, request: RequestSpec) -> FinishedOutput:
    """`DllmEngine.golden_output`: the request decoded alone with the engine's model, its
    algorithm as configured (`configured_algorithm`, fixed at construction) and configuration.
    Raises `GoldenUnavailable` when the engine's algorithm is not a
    `gpu.algorithms.DllmAlgorithm` (the golden decoder drives its `run`)."""
    algorithm = engine.configured_algorithm
    if not isinstance(algorithm, DllmAlgorithm):
        raise GoldenUnavailable(type(algorithm).__name__)
    result = cached_golden_decode(engine.model, algorithm, engine.config, request)
    return FinishedOutput(result.tokens, result.finish_reason)


class GoldenUnavailable(ConfigError):
    """The engine's algorithm is not a `DllmAlgorithm`, so there is no golden decoding."""

    def __init__(self, algorithm: str) -> None:
        super().__init__(
            "algorithm", algorithm, "a gpu.algorithms.DllmAlgorithm for golden decoding"
        )
