"""LLaDA-style block-diffusion transformer with a dense path and a paged (serving) path.

Architecture: token embedding -> n_layers x [RMSNorm -> multi-head attention with rotary
position embeddings -> residual; RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> LM head.
Attention has no causal mask of its own: every path passes an explicit `allowed` mask, which
for block diffusion is block-causal (a query sees its whole block and every earlier block).

Both paths run the same per-layer functions (`Attention.project`, `Attention.attend`) on the
same values, so `forward_blocks` over a filled KV pool reproduces `forward_dense` on the whole
sequence (up to float summation order; the tests hold them to 1e-5).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gpu.errors import ForwardInputError
from gpu.kv_cache import PagedKvCache
from gpu.model_config import ModelConfig


def block_causal_mask(
    length: int, block_size: int, device: torch.device | None = None
) -> torch.Tensor:
    """Bool [length, length]: query i may attend key j iff j // block_size <= i // block_size."""
    block = torch.arange(length, device=device) // block_size
    return block[None, :] <= block[:, None]


def rope_tables(head_dim: int, max_context: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [max_context, head_dim // 2] (computed in float64, stored float32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.arange(max_context, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [b, L, heads, head_dim] by per-position tables cos/sin [b or 1, L, head_dim/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    """Multi-head attention split in two halves so the paged path can store K/V in between."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        d = config.d_model
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (both after RoPE) and v, each [b, L, heads, head_dim]."""
        b, length, _ = x.shape
        shape = (b, length, self.n_heads, self.head_dim)
        q = apply_rope(self.wq(x).view(shape), cos, sin)
        k = apply_rope(self.wk(x).view(shape), cos, sin)
        return q, k, self.wv(x).view(shape)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        """q [b, L, h, d]; k, v [b, S, h, d]; allowed bool [b or 1, L, S] -> [b, L, d_model].

        Every query must be allowed at least one key (else its softmax row would be NaN)."""
        b, length = q.shape[0], q.shape[1]
        out = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed[:, None]
        )  # [b, h, L, d]
        merged = out.transpose(1, 2).reshape(b, length, self.n_heads * self.head_dim)
        result: torch.Tensor = self.wo(merged)
        return result


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w_down(nn.functional.silu(self.w_gate(x)) * self.w_up(x))
        return out


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.d_model)
        self.mlp = SwiGLU(config.d_model, config.d_ff)


class BlockDiffusionLM(nn.Module):
    """The model. Parameters only; the KV pool and its allocation live outside."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        cos, sin = rope_tables(config.head_dim, config.max_context, config.rope_theta)
        # Derived from the config, so not part of the weights file.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Small normal init; residual output projections scaled down by depth (GPT-2 style)."""
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(param)
            elif name.endswith(("attn.wo.weight", "mlp.w_down.weight")):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * self.config.n_layers))
            else:
                nn.init.normal_(param, std=0.02)

    def transformer_blocks(self) -> list[TransformerBlock]:
        return [m for m in self.layers if isinstance(m, TransformerBlock)]

    def forward_masked(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        allowed: torch.Tensor,
        logits_from: int = 0,
    ) -> torch.Tensor:
        """General dense forward: tokens [b, L], RoPE positions [L], allowed bool [L, L]
        (query i may attend key j) -> logits [b, L - logits_from, V] of positions
        logits_from.. . Training uses it on [clean; noised] with logits_from = L/2: the last
        layer then skips the queries and MLP of the positions whose outputs nobody reads."""
        cos = self.rope_cos[positions][None]
        sin = self.rope_sin[positions][None]
        x = self.embed(tokens)
        blocks = self.transformer_blocks()
        for index, block in enumerate(blocks):
            q, k, v = block.attn.project(block.attn_norm(x), cos, sin)
            if index == len(blocks) - 1 and logits_from:
                x, q = x[:, logits_from:], q[:, logits_from:]
                x = x + block.attn.attend(q, k, v, allowed[None, logits_from:])
            else:
                x = x + block.attn.attend(q, k, v, allowed[None])
            x = x + block.mlp(block.mlp_norm(x))
        logits: torch.Tensor = self.lm_head(self.norm(x))
        return logits

    def forward_dense(self, tokens: torch.Tensor, block_size: int) -> torch.Tensor:
        """Logits [b, L, V] of full sequences tokens [b, L] under the block-causal mask.

        Training path and test oracle; L may be any length <= max_context (a partial last block
        is simply a shorter block)."""
        if tokens.dim() != 2:
            raise ForwardInputError(
                "tokens", f"expected [batch, length], got {tuple(tokens.shape)}"
            )
        length = tokens.shape[1]
        if block_size < 1:
            raise ForwardInputError("block_size", f"{block_size} is not a positive integer")
        if length > self.config.max_context:
            raise ForwardInputError(
                "tokens", f"length {length} exceeds max_context={self.config.max_context}"
            )
        positions = torch.arange(length, device=tokens.device)
        allowed = block_causal_mask(length, block_size, tokens.device)
        return self.forward_masked(tokens, positions, allowed)

    def forward_blocks(
        self,
        block_tokens: torch.Tensor,
        start_positions: torch.Tensor,
        rows: torch.Tensor,
        kv: PagedKvCache,
        req_to_token: torch.Tensor,
    ) -> torch.Tensor:
        """Serving path: one block per row -> logits [b, B, V].

        Row i's block `block_tokens[i]` occupies positions [start_i, start_i + B) with
        start_i = start_positions[i] a multiple of B. Per layer its K (after RoPE) and V are
        written to pool slots req_to_token[rows[i], start_i:start_i + B] (filled by the caller),
        then its queries attend to the KV at req_to_token[rows[i], 0:start_i + B]: the earlier
        committed blocks of the same request (already in the pool) and the block itself,
        bidirectionally. Rows may have different start positions (shorter contexts are padded
        and masked). No gradients; deterministic for fixed inputs.
        """
        self._check_block_inputs(block_tokens, start_positions, rows, kv, req_to_token)
        with torch.no_grad():
            b, size = block_tokens.shape
            device = block_tokens.device
            table = req_to_token.to(device=device, dtype=torch.long)
            starts = start_positions.to(device=device, dtype=torch.long)
            row_idx = rows.to(device=device, dtype=torch.long)[:, None]
            positions = starts[:, None] + torch.arange(size, device=device)[None, :]  # [b, B]
            block_slots = table[row_idx, positions].reshape(-1)
            ctx_len = starts + size
            span = int(ctx_len.max().item())
            ctx_pos = torch.arange(span, device=device)[None, :].expand(b, span)
            valid = ctx_pos < ctx_len[:, None]  # [b, S]
            ctx_slots = torch.where(valid, table[row_idx, ctx_pos], torch.zeros_like(ctx_pos))
            allowed = valid[:, None, :].expand(b, size, span)
            keep = valid[:, :, None, None]
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
            x = self.embed(block_tokens)
            for layer, block in enumerate(self.transformer_blocks()):
                q, k, v = block.attn.project(block.attn_norm(x), cos, sin)
                kv.write(
                    layer,
                    block_slots,
                    k.reshape(b * size, *k.shape[2:]),
                    v.reshape(b * size, *v.shape[2:]),
                )
                k_ctx, v_ctx = kv.read(layer, ctx_slots)  # [b, S, h, d]
                # Padding reads slot 0; zero its V so stale contents can never leak through.
                v_ctx = torch.where(keep, v_ctx, torch.zeros_like(v_ctx))
                x = x + block.attn.attend(q, k_ctx.to(q.dtype), v_ctx.to(q.dtype), allowed)
                x = x + block.mlp(block.mlp_norm(x))
            logits: torch.Tensor = self.lm_head(self.norm(x))
            return logits

    def _check_block_inputs(
        self,
        block_tokens: torch.Tensor,
        start_positions: torch.Tensor,
        rows: torch.Tensor,
        kv: PagedKvCache,
        req_to_token: torch.Tensor,
    ) -> None:
        if block_tokens.dim() != 2 or block_tokens.shape[1] < 1:
            raise ForwardInputError(
                "block_tokens", f"expected [batch, block_size], got {tuple(block_tokens.shape)}"
            )
        b, size = block_tokens.shape
        for name, t in (("start_positions", start_positions), ("rows", rows)):
            if tuple(t.shape) != (b,):
                raise ForwardInputError(name, f"expected shape ({b},), got {tuple(t.shape)}")
        if req_to_token.dim() != 2:
            raise ForwardInputError("req_to_token", "expected [rows_total, max_context]")
        if kv.n_layers != self.config.n_layers or kv.head_dim != self.config.head_dim:
            raise ForwardInputError(
                "kv",
                f"pool has {kv.n_layers} layers x head_dim {kv.head_dim}, model needs "
                f"{self.config.n_layers} x {self.config.head_dim}",
            )
        if kv.n_kv_heads != self.config.n_heads:
            raise ForwardInputError(
                "kv", f"pool has {kv.n_kv_heads} heads, model needs {self.config.n_heads}"
            )
        starts = start_positions.tolist()
        limit = min(self.config.max_context, req_to_token.shape[1])
        for i, start in enumerate(starts):
            if start < 0 or start % size != 0:
                raise ForwardInputError(
                    "start_positions", f"row {i}: {start} is not a non-negative multiple of {size}"
                )
            if start + size > limit:
                raise ForwardInputError(
                    "start_positions",
                    f"row {i}: block [{start}, {start + size}) exceeds the context limit {limit}",
                )
        for i, row in enumerate(rows.tolist()):
            if not 0 <= row < req_to_token.shape[0]:
                raise ForwardInputError(
                    "rows", f"row {i}: {row} is outside req_to_token's {req_to_token.shape[0]} rows"
                )


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
