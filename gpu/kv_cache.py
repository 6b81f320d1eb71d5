"""`PagedKvCache`: the KV pool tensors of the serving path. Storage only, no allocation.

Slot `s` of layer `l` holds the key (after RoPE) and value of one token position of one
request. Which slot belongs to which (request, position) is decided by the engine's allocator
and told to the model through a `req_to_token` table; this class never allocates or frees.
"""

from __future__ import annotations

import torch


class PagedKvCache:
    """Per-layer K and V tensors of shape [num_slots, n_kv_heads, head_dim]."""

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        num_slots: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.n_layers = n_layers
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.num_slots = num_slots
        self.dtype = dtype
        self.device: torch.device = torch.device(device)
        shape = (num_slots, n_kv_heads, head_dim)
        # Zero-filled so an unwritten slot is recognisable in tests (never read by the model).
        self.k: list[torch.Tensor] = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(n_layers)
        ]
        self.v: list[torch.Tensor] = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(n_layers)
        ]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v ([n, heads, head_dim]) at `slots` ([n], distinct) of `layer`."""
        self.k[layer][slots] = k.to(self.dtype)
        self.v[layer][slots] = v.to(self.dtype)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at `slots` (any shape of indices) of `layer`, in the pool dtype."""
        return self.k[layer][slots], self.v[layer][slots]
