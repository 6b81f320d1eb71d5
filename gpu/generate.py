"""Batch-size-1 block-by-block generation over the paged path (for accuracy tests and reports).

The prompt is fed block by block: every full prompt block takes one forward (writing its KV);
a partial last prompt block is completed with MASK tokens and decoded as the first output block
(its prompt positions are never changed). Each output block is decoded by the algorithm in sync
mode with `forward_blocks`, using a trivial contiguous allocation (one request row, slot i holds
position i); the MASK logit is suppressed, as in the engine's model runner. Generation stops
after the block holding EOS, or at `max_new_tokens`, or when the next block would not fit in
`max_context`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpu.algorithms import DllmAlgorithm
from gpu.kv_cache import PagedKvCache
from gpu.model import BlockDiffusionLM
from gpu.tokenizer import EOS_ID, MASK_ID, TOKENIZER
from spec.errors import EmptyPrompt, PromptTooLong


@dataclass(frozen=True, slots=True)
class Generation:
    """What `generate` produced: text, token ids and the forwards of each output block."""

    text: str  # generated text, cut at EOS and max_new_tokens
    token_ids: tuple[int, ...]  # generated ids (EOS excluded)
    rounds_per_block: tuple[int, ...]  # forwards per output block, incl. the final one


def generate(
    model: BlockDiffusionLM,
    prompt: str,
    block_size: int,
    algorithm: DllmAlgorithm,
    max_new_tokens: int = 64,
) -> Generation:
    """Decode `prompt` alone with `algorithm` in sync mode, block by block (see the module
    docstring), on the model's device. Raises `EmptyPrompt` for a prompt that encodes to no
    ids, `PromptTooLong` when the first output block does not fit the model's `max_context`."""
    ids = TOKENIZER.encode(prompt)
    if not ids:
        raise EmptyPrompt("generate")
    cfg = model.config
    device = model.embed.weight.device
    full_blocks = len(ids) // block_size
    first_out = full_blocks * block_size
    if first_out + block_size > cfg.max_context:
        needed = first_out + block_size
        raise PromptTooLong("generate", needed, cfg.max_context)
    kv = PagedKvCache(
        cfg.n_layers, cfg.n_heads, cfg.head_dim, cfg.max_context, model.embed.weight.dtype, device
    )
    table = torch.arange(cfg.max_context, dtype=torch.int32, device=device)[None, :]
    row = torch.zeros(1, dtype=torch.long, device=device)

    for k in range(full_blocks):
        block = torch.tensor([ids[k * block_size : (k + 1) * block_size]], device=device)
        model.forward_blocks(block, torch.tensor([k * block_size], device=device), row, kv, table)

    carried = ids[first_out:]
    generated: list[int] = []
    rounds: list[int] = []
    start = first_out
    while len(generated) < max_new_tokens and start + block_size <= cfg.max_context:
        block = torch.tensor(
            [carried + [MASK_ID] * (block_size - len(carried))], dtype=torch.long, device=device
        )
        start_t = torch.tensor([start], device=device)

        def forward(tokens: torch.Tensor, start_t: torch.Tensor = start_t) -> torch.Tensor:
            logits = model.forward_blocks(tokens, start_t, row, kv, table)
            logits[..., MASK_ID] = float("-inf")  # never "commit" a mask (as the engine does)
            return logits

        states = algorithm.init_states(block)
        _, forwards = algorithm.run(forward, block, states, "sync")
        rounds.append(forwards)
        new = block[0, len(carried) :].tolist()
        generated.extend(int(t) for t in new)
        carried = []
        start += block_size
        if EOS_ID in new:
            break
    if EOS_ID in generated:
        generated = generated[: generated.index(EOS_ID)]
    generated = generated[:max_new_tokens]
    return Generation(TOKENIZER.decode(generated), tuple(generated), tuple(rounds))
