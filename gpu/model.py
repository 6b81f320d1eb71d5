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

import functools
import math
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gpu.errors import ForwardInputError
from gpu.gemm_rows import invariant_linear, padding_rows, product_shapes
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
    """Root-mean-square norm over the last dim with a learned scale `weight` (init ones)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight: nn.Parameter = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., dim] -> same shape: `x / sqrt(mean(x^2) + eps) * weight` over the last dim."""
        return nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    """Multi-head attention split in two halves so the paged path can store K/V in between."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads: int = config.n_heads
        self.head_dim: int = config.head_dim
        d = config.d_model
        self.wq: nn.Linear = nn.Linear(d, d, bias=False)
        self.wk: nn.Linear = nn.Linear(d, d, bias=False)
        self.wv: nn.Linear = nn.Linear(d, d, bias=False)
        self.wo: nn.Linear = nn.Linear(d, d, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (both after RoPE) and v, each [b, L, heads, head_dim]."""
        b, length, _ = x.shape
        shape = (b, length, self.n_heads, self.head_dim)
        q = apply_rope(self.wq(x).view(shape), cos, sin)
        k = apply_rope(self.wk(x).view(shape), cos, sin)
        return q, k, self.wv(x).view(shape)

    def project_fused(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, min_rows: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As `project` with one matmul for q, k, v (of at least `min_rows` rows:
        `gpu.gemm_rows.invariant_linear`) and one RoPE for q and k together (fewer small ops
        per forward; on CPU the values are bit-identical to `project`'s)."""
        b, length, _ = x.shape
        qkv = invariant_linear(x, _fused_weight(self, (self.wq, self.wk, self.wv)), min_rows)
        qkv = qkv.view(b, length, 3 * self.n_heads, self.head_dim)
        qk = apply_rope(qkv[:, :, : 2 * self.n_heads], cos, sin)
        return qk[:, :, : self.n_heads], qk[:, :, self.n_heads :], qkv[:, :, 2 * self.n_heads :]

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
    """The MLP: `w_down(silu(w_gate(x)) * w_up(x))`, no biases."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w_gate: nn.Linear = nn.Linear(d_model, d_ff, bias=False)
        self.w_up: nn.Linear = nn.Linear(d_model, d_ff, bias=False)
        self.w_down: nn.Linear = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., d_model] -> [..., d_model] (hidden [..., d_ff])."""
        out: torch.Tensor = self.w_down(nn.functional.silu(self.w_gate(x)) * self.w_up(x))
        return out

    def forward_fused(self, x: torch.Tensor, min_rows: int) -> torch.Tensor:
        """As `forward` with one matmul for gate and up (serving path, no gradients), every
        product of at least `min_rows` rows (`gpu.gemm_rows.invariant_linear`)."""
        fused = _fused_weight(self, (self.w_gate, self.w_up))
        gate, up = invariant_linear(x, fused, min_rows).chunk(2, dim=-1)
        return invariant_linear(nn.functional.silu(gate) * up, self.w_down.weight, min_rows)


def _fused_weight(module: nn.Module, linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """The linears' weights stacked along the output dim, cached on `module` and rebuilt when
    any of them changed (in-place update, load, move: its storage or version differs)."""
    key = tuple((lin.weight.data_ptr(), lin.weight._version) for lin in linears)
    cached = module.__dict__.get("_fused_cache")
    if cached is not None and cached[0] == key:
        weight: torch.Tensor = cached[1]
        return weight
    with torch.no_grad():
        weight = torch.cat([lin.weight for lin in linears]).detach()
    module.__dict__["_fused_cache"] = (key, weight)
    return weight


class TransformerBlock(nn.Module):
    """One layer's modules: `attn_norm`, `attn`, `mlp_norm`, `mlp`. No `forward`: the paths of
    `BlockDiffusionLM` run them (pre-norm attention, then pre-norm MLP, each with a residual)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn_norm: RMSNorm = RMSNorm(config.d_model)
        self.attn: Attention = Attention(config)
        self.mlp_norm: RMSNorm = RMSNorm(config.d_model)
        self.mlp: SwiGLU = SwiGLU(config.d_model, config.d_ff)


class BlockDiffusionLM(nn.Module):
    """The model. Parameters only; the KV pool and its allocation live outside."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    # Host wall time `forward_blocks` spent in attention (KV reads + attention), for profiles.
    attention_seconds: float = 0.0
    # Attention groups (distinct context lengths, one attention call per layer each) summed over
    # `forward_blocks` calls, for profiles.
    attention_groups: int = 0

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed: nn.Embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.layers: nn.ModuleList = nn.ModuleList(
            TransformerBlock(config) for _ in range(config.n_layers)
        )
        self.norm: RMSNorm = RMSNorm(config.d_model)
        self.lm_head: nn.Linear = nn.Linear(config.d_model, config.vocab_size, bias=False)
        cos, sin = rope_tables(config.head_dim, config.max_context, config.rope_theta)
        # Derived from the config, so not part of the weights file.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # (d_out, d_in) of the serving path's products, for their padding (`product_rows`)
        self.product_shapes: tuple[tuple[int, int], ...] = product_shapes(
            config.d_model, config.d_ff, config.vocab_size
        )
        self.reset_parameters()

    def product_rows(self) -> int:
        """The row count the serving path pads its smaller products to, on the model's device
        at torch's current thread count (`gpu.gemm_rows.padding_rows`): from there up each
        row's values do not depend on the batch (measured once per device and thread count)."""
        return padding_rows(self.product_shapes, str(self.rope_cos.device))

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
        """`layers` as a typed list, in order."""
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

    def check_layout(
        self, starts: list[int], row_ids: list[int], block_size: int, req_to_token: torch.Tensor
    ) -> None:
        """Raise `ForwardInputError` unless every row's block starts at a non-negative multiple
        of block_size inside the context limit and names a row of `req_to_token`."""
        b = len(starts)
        if len(row_ids) != b:
            raise ForwardInputError("rows", f"expected shape ({b},), got ({len(row_ids)},)")
        if b == 0:
            raise ForwardInputError("start_positions", "an empty batch: at least one row")
        if req_to_token.dim() != 2:
            raise ForwardInputError("req_to_token", "expected [rows_total, max_context]")
        if block_size < 1:
            raise ForwardInputError("block_size", f"{block_size} is not a positive integer")
        n_rows, width = req_to_token.shape
        limit = min(self.config.max_context, width)
        for i, start in enumerate(starts):
            if start < 0 or start % block_size or start + block_size > limit:
                raise ForwardInputError(
                    "start_positions",
                    f"row {i}: block [{start}, {start + block_size}) does not start at a "
                    f"non-negative multiple of {block_size} inside the context limit {limit}",
                )
        for i, row in enumerate(row_ids):
            if not 0 <= row < n_rows:
                raise ForwardInputError(
                    "rows", f"row {i}: {row} is outside req_to_token's {n_rows} rows"
                )

    def plan_blocks(
        self,
        start_positions: torch.Tensor | Sequence[int],
        rows: torch.Tensor | Sequence[int],
        block_size: int,
        req_to_token: torch.Tensor,
    ) -> BlockPlan:
        """Validate one batch's layout and build its `BlockPlan` (see there) on the host.

        start_positions / rows: per row, the block's first position (a multiple of
        block_size) and its request-pool row; host sequences or CPU tensors (a CUDA tensor
        works but costs a device sync). Reads `req_to_token` once: a plan is valid until the
        table's entries for these rows change (the engine builds one per round)."""
        starts = _host_ints(start_positions)
        row_ids = _host_ints(rows)
        self.check_layout(starts, row_ids, block_size, req_to_token)
        b = len(starts)
        order, groups = _group_by_length(starts, block_size)
        layout = array("q")  # positions, then order and its inverse (see _extend_layout)
        _extend_layout(layout, starts, order, block_size)
        rest = torch.frombuffer(layout, dtype=torch.int64).to(req_to_token.device)
        n = b * block_size
        read = _slots_by_slicing if req_to_token.device.type == "cpu" else _slots_by_gather
        slots = read(req_to_token, starts, row_ids, order, block_size)
        identity = len(rest) == n  # no permutation appended: rows already sorted
        return BlockPlan(
            block_size=block_size,
            positions=rest[:n].view(b, block_size),
            block_slots=slots[:n],
            ctx_slots=slots[n:],
            order=None if identity else rest[n : n + b],
            unorder=None if identity else rest[n + b :],
            groups=groups,
        )

    def forward_blocks(
        self,
        block_tokens: torch.Tensor,
        start_positions: torch.Tensor | Sequence[int],
        rows: torch.Tensor | Sequence[int],
        kv: PagedKvCache,
        req_to_token: torch.Tensor,
        plan: BlockPlan | None = None,
    ) -> torch.Tensor:
        """Serving path: one block per row -> logits [b, B, V].

        Row i's block `block_tokens[i]` occupies positions [start_i, start_i + B) with
        start_i = start_positions[i] a multiple of B. Per layer its K (after RoPE) and V are
        written to pool slots req_to_token[rows[i], start_i:start_i + B] (filled by the caller),
        then its queries attend to the KV at req_to_token[rows[i], 0:start_i + B]: the earlier
        committed blocks of the same request (already in the pool) and the block itself,
        bidirectionally.

        Ragged attention: no row is padded to the batch's longest context. Rows are grouped by
        context length and each group attends to exactly its own keys (one attention call per
        distinct length), so a row's logits do not depend on the other rows of the batch (on
        CPU they are bit-identical to the same row run alone, every product being padded to
        `product_rows()` rows). `plan` (from `plan_blocks`, built
        from the same starts, rows and table) skips re-validating and re-reading the table:
        the engine builds it once per round. Nothing here reads a device value back to the
        host. No gradients; deterministic for fixed inputs.
        """
        if block_tokens.dim() != 2 or block_tokens.shape[1] < 1:
            raise ForwardInputError(
                "block_tokens", f"expected [batch, block_size], got {tuple(block_tokens.shape)}"
            )
        self._check_pool(kv)
        b, size = block_tokens.shape
        if plan is None:
            plan = self.plan_blocks(start_positions, rows, size, req_to_token)
        if plan.block_size != size or plan.positions.shape[0] != b:
            raise ForwardInputError(
                "plan", f"built for {tuple(plan.positions.shape)} blocks, got {(b, size)}"
            )
        with torch.no_grad():
            cos, sin = self.rope_cos[plan.positions], self.rope_sin[plan.positions]
            x = self.embed(block_tokens)
            heads, head_dim = self.config.n_heads, self.config.head_dim
            padding = self.product_rows()
            for layer, block in enumerate(self.transformer_blocks()):
                q, k, v = block.attn.project_fused(_rms(x, block.attn_norm), cos, sin, padding)
                kv.write(
                    layer,
                    plan.block_slots,
                    k.reshape(b * size, heads, head_dim),
                    v.reshape(b * size, heads, head_dim),
                )
                t_attn = time.perf_counter()
                k_ctx, v_ctx = kv.read(layer, plan.ctx_slots)  # [sum of lengths, h, d]
                attended = ragged_attention(q, k_ctx.to(q.dtype), v_ctx.to(q.dtype), plan)
                self.attention_seconds += time.perf_counter() - t_attn
                x = x + invariant_linear(attended, block.attn.wo.weight, padding)
                x = x + block.mlp.forward_fused(_rms(x, block.mlp_norm), padding)
            logits = invariant_linear(_rms(x, self.norm), self.lm_head.weight, padding)
            self.attention_groups += len(plan.groups)
            return logits

    def _check_pool(self, kv: PagedKvCache) -> None:
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


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """The layout of one batch of blocks, built on the host by `plan_blocks`.

    positions: [b, B] RoPE positions; block_slots: [b * B] the pool slots the blocks' K/V go
    to; ctx_slots: the slots every row attends to, packed without padding: rows in `order`
    (by context length, stable), each row's slots of positions 0..start + B - 1; order /
    unorder: that permutation of the rows and its inverse (None when rows are already sorted);
    groups: (context length, number of rows) per run of equal lengths, in `order`.
    """

    block_size: int
    positions: torch.Tensor
    block_slots: torch.Tensor
    ctx_slots: torch.Tensor
    order: torch.Tensor | None
    unorder: torch.Tensor | None
    groups: tuple[tuple[int, int], ...]


def _slots_by_slicing(
    table: torch.Tensor, starts: list[int], rows: list[int], order: list[int], size: int
) -> torch.Tensor:
    """The plan's slots read from a CPU table: each row's block slots (batch order), then each
    row's context slots (`order`), int64. Slices of a numpy view and one concatenation: a few
    microseconds, where torch's per-call cost on these sizes is several times that."""
    view = table.numpy()
    parts = [view[row, start : start + size] for start, row in zip(starts, rows, strict=True)]
    parts += [view[rows[i], : starts[i] + size] for i in order]
    return torch.from_numpy(np.concatenate(parts).astype(np.int64))


def _slots_by_gather(
    table: torch.Tensor, starts: list[int], rows: list[int], order: list[int], size: int
) -> torch.Tensor:
    """The same slots from a table on any device: the table indexes built on the host, one copy
    to the device, one gather (no host sync). A row's indexes depend only on its row and
    context length, so they are made once (`_index_run`) and copied here."""
    width = table.shape[1]
    flat = array("q")  # block slots' table indexes, then the packed context's
    for start, row in zip(starts, rows, strict=True):
        flat.extend(_index_run(row * width + start, size))
    for i in order:
        flat.extend(_index_run(rows[i] * width, starts[i] + size))
    host = torch.frombuffer(flat, dtype=torch.int64).to(table.device)
    return table.reshape(-1).index_select(0, host).long()


@functools.lru_cache(maxsize=65_536)
def _index_run(first: int, length: int) -> array[int]:
    """array('q') of first, first + 1, ..., first + length - 1 (read-only by convention): the
    table indexes of a row's context or block, and a block's positions, shared by every plan."""
    return array("q", range(first, first + length))


def _group_by_length(
    starts: Sequence[int], block_size: int
) -> tuple[list[int], tuple[tuple[int, int], ...]]:
    """Rows sorted by context length (stable), and (context length, rows) per run of equal
    lengths in that order: each run is one attention call over exactly its keys."""
    order = sorted(range(len(starts)), key=starts.__getitem__)
    groups: list[list[int]] = []
    for i in order:
        length = starts[i] + block_size
        if groups and groups[-1][0] == length:
            groups[-1][1] += 1
        else:
            groups.append([length, 1])
    return order, tuple((length, count) for length, count in groups)


def _extend_layout(host: array[int], starts: Sequence[int], order: list[int], size: int) -> None:
    """Append the positions [b * size], then (unless the order is the identity) the order and
    its inverse [b each]: the host half of a plan, copied to the device at once."""
    for start in starts:
        host.extend(_index_run(start, size))
    if order != list(range(len(order))):
        unorder = [0] * len(order)
        for new, old in enumerate(order):
            unorder[old] = new
        host.extend(order)
        host.extend(unorder)


def ragged_attention(
    q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, plan: BlockPlan
) -> torch.Tensor:
    """q [b, B, h, d]; k_ctx, v_ctx packed [sum of lengths, h, d] as `plan.ctx_slots` orders
    them -> [b, B, h * d]. Each group of rows with the same context length runs one unmasked
    attention over exactly its keys: no padding, no mask, and no key of another row or beyond
    a row's own context is ever in its softmax."""
    b, size, heads, head_dim = q.shape
    qs = q if plan.order is None else q.index_select(0, plan.order)
    outs: list[torch.Tensor] = []
    row = offset = 0
    for length, count in plan.groups:
        keys = count * length
        kg = k_ctx[offset : offset + keys].view(count, length, heads, head_dim)
        vg = v_ctx[offset : offset + keys].view(count, length, heads, head_dim)
        outs.append(
            nn.functional.scaled_dot_product_attention(
                qs[row : row + count].transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2)
            )  # [count, h, B, d]
        )
        row += count
        offset += keys
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    if plan.unorder is not None:
        out = out.index_select(0, plan.unorder)
    return out.transpose(1, 2).reshape(b, size, heads * head_dim)


def _rms(x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    """`norm(x)` without the module call (the same function on the same values)."""
    return nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)


def _host_ints(values: torch.Tensor | Sequence[int]) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ForwardInputError("start_positions/rows", f"expected 1-D, got {values.dim()}-D")
        return [int(v) for v in values.tolist()]
    return [int(v) for v in values]


def count_parameters(model: nn.Module) -> int:
    """The number of scalar parameters of `model` (buffers, e.g. the RoPE tables, not counted)."""
    return sum(p.numel() for p in model.parameters())
