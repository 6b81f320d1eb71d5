"""Train the toy block-diffusion model: `python -m gpu.train --out gpu/assets`.

Objective (masked diffusion, per block): for every block k of a sequence draw
t_k ~ U(eps, 1), replace each token of the block by MASK with probability t_k, and minimise the
cross-entropy of the masked tokens weighted by 1 / t_k, summed and divided by the number of
real (non-PAD) tokens. Inference decodes a block while attending to CLEAN earlier blocks, so the
model is trained on the pair [x_clean ; x_noised] (length 2L, both halves at positions 0..L-1):
clean queries see clean blocks <= their own (block-causal), noised block k sees clean blocks < k
and its own noised block. The block size of each batch is drawn from `train_block_sizes`.

Everything is seeded (corpus, noise, init, block sizes) and runs on 2 CPU threads, so a rerun
reproduces the shipped weights on the same torch build.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gpu.corpus import MAX_SAMPLE_TOKENS, Sample, make_sample
from gpu.model import BlockDiffusionLM, count_parameters
from gpu.model_config import ModelConfig
from gpu.tokenizer import EOS_ID, MASK_ID, PAD_ID, VOCAB_SIZE
from gpu.weights import save_model

PAD_ALIGN = 16  # EOS-pad each sample to a multiple of the largest block size


@dataclass(frozen=True, slots=True)
class TrainConfig:
    steps: int = 1200
    batch_size: int = 32
    seq_len: int = MAX_SAMPLE_TOKENS
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup: int = 60
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eps: float = 1e-3
    seed: int = 0
    corpus_seed: int = 1234


DEFAULT_MODEL = ModelConfig(
    vocab_size=VOCAB_SIZE,
    d_model=128,
    n_layers=4,
    n_heads=4,
    d_ff=384,
    max_context=128,
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
        padded = -(-len(ids) // PAD_ALIGN) * PAD_ALIGN
        ids = ids + [EOS_ID] * (padded - len(ids))
        if len(ids) > seq_len:
            raise ValueError(f"sample of {len(ids)} tokens exceeds seq_len={seq_len}")
        out[i, : len(ids)] = torch.tensor(ids)
    return out


def two_copy_mask(length: int, block_size: int) -> torch.Tensor:
    """Bool [2L, 2L] over [clean ; noised]: see the module docstring."""
    block = torch.arange(length) // block_size
    qb, kb = block[:, None], block[None, :]
    none = torch.zeros(length, length, dtype=torch.bool)
    top = torch.cat((kb <= qb, none), dim=1)
    bottom = torch.cat((kb < qb, kb == qb), dim=1)
    return torch.cat((top, bottom), dim=0)


def diffusion_loss(
    model: BlockDiffusionLM, clean: torch.Tensor, block_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, float]:
    """(weighted loss to minimise, plain mean CE over masked tokens for logging)."""
    n, length = clean.shape
    n_blocks = -(-length // block_size)
    eps = 1e-3
    t_block = eps + (1 - eps) * torch.rand(n, n_blocks, generator=gen)
    t = t_block.repeat_interleave(block_size, dim=1)[:, :length]
    real = clean != PAD_ID
    masked = (torch.rand(n, length, generator=gen) < t) & real
    noised = torch.where(masked, torch.full_like(clean, MASK_ID), clean)
    positions = torch.arange(length).repeat(2)
    logits = model.forward_masked(
        torch.cat((clean, noised), dim=1), positions, two_copy_mask(length, block_size)
    )[:, length:]
    ce = torch.nn.functional.cross_entropy(logits[masked], clean[masked], reduction="none")
    loss = (ce / t[masked]).sum() / real.sum().clamp(min=1)
    plain = float(ce.mean().item()) if ce.numel() else 0.0
    return loss, plain


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


@dataclass(frozen=True, slots=True)
class TrainResult:
    model: BlockDiffusionLM
    losses: list[float]  # weighted objective per step
    masked_ce: list[float]  # plain masked-token CE per step
    seconds: float


def train(
    model_config: ModelConfig, cfg: TrainConfig, *, log_every: int = 0, threads: int = 2
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
    for step in range(cfg.steps):
        block_size = rng.choice(model_config.train_block_sizes)
        batch = encode_batch(
            [make_sample(rng, "train") for _ in range(cfg.batch_size)], cfg.seq_len
        )
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss, plain = diffusion_loss(model, batch, block_size, gen)
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
    return TrainResult(model, losses, masked_ce, time.perf_counter() - began)


def _tail_mean(values: list[float], n: int = 50) -> float:
    tail = values[-n:]
    return sum(tail) / max(1, len(tail))


def main(argv: Sequence[str] | None = None) -> int:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(prog="python -m gpu.train", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("gpu/assets"))
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--corpus-seed", type=int, default=defaults.corpus_seed)
    parser.add_argument("--log-every", type=int, default=50)
    args = parser.parse_args(argv)
    cfg = TrainConfig(
        steps=args.steps, batch_size=args.batch_size, seed=args.seed, corpus_seed=args.corpus_seed
    )
    result = train(DEFAULT_MODEL, cfg, log_every=args.log_every)
    args.out.mkdir(parents=True, exist_ok=True)
    save_model(result.model, DEFAULT_MODEL, args.out)
    log = {
        "steps": cfg.steps,
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
            round(_tail_mean(result.losses[: i + 1]), 4) for i in range(49, cfg.steps, 50)
        ],
    }
    (args.out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in log.items() if k != "loss_every_50"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
