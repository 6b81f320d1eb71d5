"""The request pool: the request-to-token table and its row allocator.

`req_to_token[row, pos]` is the KV pool slot that holds position `pos` of the request that holds
`row` (SGLang's `ReqToTokenPool`). The model reads it to find a block's own slots and the slots
of every earlier block of the same request. `row_owner` (int32, CPU) records which request
handle holds each row (-1 = free); the engine's snapshot reads it.

Rows are handed out lowest first, so a run is reproducible: at batch size 1 every request uses
row 0.
"""

from __future__ import annotations

import heapq

import torch

from spec.errors import SchedSpecError

FREE = -1


class RequestPoolError(SchedSpecError, RuntimeError):
    """A row operation the engine's own rules should have made impossible (an engine bug)."""


class ReqToTokenPool:
    """`rows x max_context` int32 table on the model's device plus a row allocator."""

    def __init__(self, rows: int, max_context: int, device: torch.device | str = "cpu") -> None:
        self.rows = rows
        self.max_context = max_context
        self.device: torch.device = torch.device(device)
        self.req_to_token: torch.Tensor = torch.zeros(
            (rows, max_context), dtype=torch.int32, device=self.device
        )
        self.row_owner: torch.Tensor = torch.full((rows,), FREE, dtype=torch.int32)
        self._owner_np = self.row_owner.numpy()  # the hot paths index through this view
        self._table_np = self.req_to_token.numpy() if self.device.type == "cpu" else None
        self._free_rows: list[int] = list(range(rows))  # a heap
        # Bumped by every `write_blocks` that changes an entry: a batch plan read from the
        # table stays valid while the version does (the table is written only there).
        self.version: int = 0

    def has_free(self) -> bool:
        """Whether a row is free for `acquire`."""
        return bool(self._free_rows)

    def acquire(self, handle: int) -> int:
        """The lowest free row, now held by `handle`."""
        if not self._free_rows:
            raise RequestPoolError("no free request-pool row")
        row = heapq.heappop(self._free_rows)
        self._owner_np[row] = handle
        return row

    def release(self, row: int, handle: int) -> None:
        """Free `row`, held by `handle` (`RequestPoolError` when another holds it or it is
        free); its table entries are left as they are."""
        holder = int(self._owner_np[row])
        if holder != handle:
            raise RequestPoolError(f"row {row} is held by handle {holder}, not {handle}")
        self._owner_np[row] = FREE
        heapq.heappush(self._free_rows, row)

    def write_blocks(self, writes: list[tuple[int, int, int]], block_size: int) -> None:
        """Record blocks in the table: each (row, first position, first slot) maps positions
        [pos, pos + block_size) to slots [slot, slot + block_size). One indexed write. Bumps
        `version` when an entry changed (on CUDA: always, comparing would cost a sync)."""
        if not writes:
            return
        if self._table_np is not None:  # CPU: write through a numpy view of the table
            changed = False
            for row, pos, slot in writes:
                entries = self._table_np[row, pos : pos + block_size]
                values = list(range(slot, slot + block_size))
                if entries.tolist() != values:  # plain Python: cheaper than numpy here
                    entries[:] = values
                    changed = True
            self.version += changed
            return
        self.version += 1
        ar = torch.arange(block_size, dtype=torch.int64)
        w = torch.tensor(writes, dtype=torch.int64)  # [n, 3]: row, first position, first slot
        row_idx = w[:, 0:1].expand(-1, block_size).reshape(-1)
        pos_idx = (w[:, 1:2] + ar).reshape(-1)
        slot_val = (w[:, 2:3] + ar).reshape(-1).to(torch.int32)
        self.req_to_token.index_put_(
            (row_idx.to(self.device), pos_idx.to(self.device)), slot_val.to(self.device)
        )

    def slot_at(self, row: int, pos: int) -> int:
        """The KV slot the table maps position `pos` of `row` to (a device read on CUDA)."""
        return int(self.req_to_token[row, pos])

    def held_rows(self) -> dict[int, int]:
        """row -> holder handle for every held row (read from `row_owner`)."""
        held = torch.nonzero(self.row_owner != FREE).flatten().tolist()
        owners = self.row_owner.tolist()
        return {int(r): int(owners[r]) for r in held}
