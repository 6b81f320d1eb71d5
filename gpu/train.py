"""Train the toy block-diffusion model: `python -m gpu.train --out gpu/assets`.

Objective (masked diffusion, per block): for every block k of a sequence draw
t_k ~ U(eps, 1), replace each token of the block by MASK with probability t_k, and minimise the
cross-entropy of the masked tokens weighted by 1 / t_k, summed and divided by the number of
real (non-PAD) tokens. Inference decodes a block while attending to CLEAN earlier blocks, so the
model is trained on the pair [x_clean ; x_noised] (length 2L, both halves at positions 0..L-1):
clean queries see clean blocks <= their own (block-causal), noised block k sees clean blocks < k
and its own noised block. The block size of each batch is drawn from `train_block_sizes`.

One addition to the plain objective (an "edit" term, LLaDA2.1-style): a few unmasked tokens of
the noised copy are replaced by random characters and the CE at every unmasked position is
added with weight `edit_weight`, so the model's argmax at an unmasked position is meaningful
(JointThreshold edits read it). See `diffusion_loss`.

Batches are bucketed by padded length (no compute on PAD-only blocks). Everything is seeded
(corpus, noise, init, block sizes) and runs on ONE CPU thread: on a shared 2-core machine two
threads spin against other processes and run several times slower, and a fixed thread count
keeps the run reproducible on the same torch build.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from gpu.corpus import MIN_LONG_TOKENS, Sample, make_long_sample, make_sample
from gpu.model import BlockDiffusionLM, count_parameters
from gpu.model_config import ModelConfig
from gpu.tokenizer import EOS_ID, MASK_ID, PAD_ID, VOCAB_SIZE
from gpu.weights import save_model

PAD_ALIGN = 16  # EOS-pad each sample to a multiple of the largest block size


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Optimisation, noise and seeds of one training run (see the module docstring)."""

    steps: int = 2000
    max_seconds: float = 3600.0  # wall-clock guard: stop early rather than run away
    long_fraction: float = 0.25  # batches of long samples (64..max_context tokens)
    batch_size: int = 24
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup: int = 60
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eps: float = 0.05  # t ~ U(eps, 1): bounds the 1/t weight at 20
    edit_noise: float = 0.05  # random-character corruption of unmasked tokens, times t
    edit_weight: float = 1.0
    seed: int = 0
    corpus_seed: int = 1234


DEFAULT_MODEL = ModelConfig(
    vocab_size=VOCAB_SIZE,
    d_model=128,
    n_layers=4,
    n_heads=4,
    d_ff=384,
    max_context=256,
    rope_theta=10000.0,
    train_block_sizes=(4, 8, 16),
)


def encode_batch(samples: Sequence[Sample], seq_len: int) -> torch.Tensor:
    """[n, seq_len] ids: each sample + EOS, EOS-padded to a multiple of PAD_ALIGN, then PAD.

    EOS padding teaches the model to fill the rest of a finished block with EOS; PAD blocks are
    never noised nor scored, and later blocks cannot influence earlier ones."""
    out = torch.full((len(samples), seq_len), PAD_ID, dtype=torch.long)
    for i, sample in enumerate(samples):
        ids = sample.token_ids()
        ids = ids + [EOS_ID] * (padded_length(sample) - len(ids))
        if len(ids) > seq_len:
            raise ValueError(f"sample of {len(ids)} tokens exceeds seq_len={seq_len}")
        out[i, : len(ids)] = torch.tensor(ids)
    return out


def padded_length(sample: Sample) -> int:
    """The sample's tokens (EOS included) rounded up to a multiple of PAD_ALIGN."""
    return -(-len(sample.token_ids()) // PAD_ALIGN) * PAD_ALIGN


def sample_batch(
    rng: random.Random, batch_size: int, max_context: int = 256, long_fraction: float = 0.0
) -> torch.Tensor:
    """A batch of training samples of one padded length (bucketed, so no step computes on
    PAD-only blocks).

    With probability `long_fraction` the batch is long: a length L is drawn from the multiples
    of PAD_ALIGN in [MIN_LONG_TOKENS, max_context] and every sample fills L (so every position
    of the context is trained). Otherwise the first short draw picks the bucket, so buckets keep
    their corpus frequency."""
    if long_fraction > 0 and rng.random() < long_fraction:
        lengths = range(MIN_LONG_TOKENS, max_context + 1, PAD_ALIGN)
        bucket = rng.choice(lengths)
        return encode_batch([make_long_sample(rng, bucket) for _ in range(batch_size)], bucket)
    first = make_sample(rng, "train")
    bucket = padded_length(first)
    chosen = [first]
    while len(chosen) < batch_size:
        sample = make_sample(rng, "train")
        if padded_length(sample) == bucket:
            chosen.append(sample)
    return encode_batch(chosen, bucket)


def two_copy_mask(length: int, block_size: int) -> torch.Tensor:
    """Bool [2L, 2L] over [clean ; noised]: see the module docstring."""
    block = torch.arange(length) // block_size
    qb, kb = block[:, None], block[None, :]
    none = torch.zeros(length, length, dtype=torch.bool)
    top = torch.cat((kb <= qb, none), dim=1)
    bottom = torch.cat((kb < qb, kb == qb), dim=1)
    return torch.cat((top, bottom), dim=0)


def diffusion_loss(
    model: BlockDiffusionLM,
    clean: torch.Tensor,
    block_size: int,
    gen: torch.Generator,
    cfg: TrainConfig,
) -> tuple[torch.Tensor, float]:
    """(loss to minimise, plain mean CE over masked tokens for logging).

    loss = [sum over masked tokens of CE / t  +  edit_weight * sum over the other real tokens
    of CE] / number of real tokens. The second (edit) term trains the prediction at unmasked
    positions, a fraction `edit_noise * t` of which are replaced by random characters: it is
    what JointThreshold's token-to-token edits read; without it the logits at unmasked
    positions would be untrained noise."""
    n, length = clean.shape
    n_blocks = -(-length // block_size)
    t_block = cfg.eps + (1 - cfg.eps) * torch.rand(n, n_blocks, generator=gen)
    t = t_block.repeat_interleave(block_size, dim=1)[:, :length]
    real = clean != PAD_ID
    draw = torch.rand(n, length, generator=gen)
    masked = (draw < t) & real
    corrupt = (draw >= t) & (draw < t * (1 + cfg.edit_noise)) & real
    random_chars = torch.randint(EOS_ID + 1, VOCAB_SIZE, (n, length), generator=gen)
    noised = torch.where(masked, torch.full_like(clean, MASK_ID), clean)
    noised = torch.where(corrupt, random_chars, noised)
    positions = torch.arange(length).repeat(2)
    logits = model.forward_masked(
        torch.cat((clean, noised), dim=1),
        positions,
        two_copy_mask(length, block_size),
        logits_from=length,
    )
    ce = torch.nn.functional.cross_entropy(
        logits.reshape(n * length, -1), clean.reshape(-1), reduction="none"
    ).view(n, length)
    weight = torch.where(masked, 1.0 / t, torch.full_like(t, cfg.edit_weight)) * real
    loss = (ce * weight).sum() / real.sum().clamp(min=1)
    plain = float(ce[masked].mean().item()) if bool(masked.any()) else 0.0
    return loss, plain


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate of `step` (0-based): linear warm-up to `lr` over `warmup` steps, then
    cosine decay to `lr * min_lr_ratio` at `steps`."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


@dataclass(frozen=True, slots=True)
class TrainResult:
    """What `train` returns: the model (in eval mode), per-step losses and the wall time."""

    model: BlockDiffusionLM
    losses: list[float]  # weighted objective per step
    steps_run: int  # == cfg.steps unless the wall-clock guard stopped the run
    masked_ce: list[float]  # plain masked-token CE per step
    seconds: float


def train(
    model_config: ModelConfig, cfg: TrainConfig, *, log_every: int = 0, threads: int = 1
) -> TrainResult:
    """Train from scratch, deterministically in (model_config, cfg, torch build, threads)."""
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    model = BlockDiffusionLM(model_config)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )
    rng = random.Random(cfg.corpus_seed)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    losses: list[float] = []
    masked_ce: list[float] = []
    began = time.perf_counter()
    steps_run = 0
    for step in range(cfg.steps):
        if time.perf_counter() - began > cfg.max_seconds:
            print(f"wall-clock guard: stopping after {step} of {cfg.steps} steps", flush=True)
            break
        steps_run = step + 1
        block_size = rng.choice(model_config.train_block_sizes)
        batch = sample_batch(rng, cfg.batch_size, model_config.max_context, cfg.long_fraction)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss, plain = diffusion_loss(model, batch, block_size, gen, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(float(loss.item()))
        masked_ce.append(plain)
        if log_every and (step % log_every == 0 or step == cfg.steps - 1):
            elapsed = time.perf_counter() - began
            recent = sum(losses[-log_every:]) / len(losses[-log_every:])
            print(f"step {step:5d}  loss {recent:.4f}  ce {plain:.4f}  {elapsed:6.1f}s", flush=True)
    model.eval()
    return TrainResult(model, losses, steps_run, masked_ce, time.perf_counter() - began)


def _tail_mean(values: list[float], n: int = 50) -> float:
    tail = values[-n:]
    return sum(tail) / max(1, len(tail))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpu.train`: train `DEFAULT_MODEL` (sizes from the flags) and write the
    weights, config and `train_log.json` to `--out`; prints the log (less its per-50-step
    losses). Returns 0."""
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(prog="python -m gpu.train", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("gpu/assets"))
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--corpus-seed", type=int, default=defaults.corpus_seed)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--d-model", type=int, default=DEFAULT_MODEL.d_model)
    parser.add_argument("--n-layers", type=int, default=DEFAULT_MODEL.n_layers)
    parser.add_argument("--n-heads", type=int, default=DEFAULT_MODEL.n_heads)
    parser.add_argument("--d-ff", type=int, default=DEFAULT_MODEL.d_ff)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--max-seconds", type=float, default=defaults.max_seconds)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    model_config = replace(
        DEFAULT_MODEL,
        d_model=args.d_model,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        d_ff=args.d_ff,
    )
    cfg = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        seed=args.seed,
        corpus_seed=args.corpus_seed,
        lr=args.lr,
        max_seconds=args.max_seconds,
    )
    result = train(model_config, cfg, log_every=args.log_every, threads=args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    save_model(result.model, model_config, args.out)
    log = {
        "command": "python -m gpu.train " + " ".join(sys.argv[1:] if argv is None else argv),
        "steps": result.steps_run,
        "planned_steps": cfg.steps,
        "final_loss": _tail_mean(result.losses),
        "final_masked_ce": _tail_mean(result.masked_ce),
        "final_loss_note": "mean of the last 50 steps (weighted objective / plain masked CE)",
        "seconds": round(result.seconds, 1),
        "corpus_seed": cfg.corpus_seed,
        "train_config": asdict(cfg),
        "parameters": count_parameters(result.model),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "loss_every_50": [
            round(_tail_mean(result.losses[: i + 1]), 4) for i in range(49, len(result.losses), 50)
        ],
    }
    (args.out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in log.items() if k != "loss_every_50"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
