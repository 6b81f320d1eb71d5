"""FDFO/sync of forward time alone: each mode's forwards replayed without step or scheduler.

    schedspec bench engine --forward-bound [--max-running 4 16] [--repeats 5] [--json PATH]

The benchmark's "work" ratio counts row-forwards per generated token as if every row cost the
same. It does not: a row's attention reads its whole context, and FDFO's rows are longer on
average. Sync keeps forwarding a finished row until the slowest row of its round is done, and
the rows that finish first are mostly short contexts (a prompt block has no masks and is done
after one forward); FDFO forwards a block only while it has masks left. So FDFO saves a larger
share of sync's rows than of sync's attention.

This module measures the bound that follows. It serves the benchmark's workload once per mode
(untimed), recording every forward's layout (the context length of each row), then replays
exactly those forwards — `forward_blocks` on a plan built beforehand, no step, no scheduler, no
events — and reports the ratio of forward time per generated token. FDFO's three variants (with
or without in-place reuse or re-loop) run the same forwards, so one replay covers them. It is
FDFO/sync as it would be if the step and the scheduler cost nothing in either mode. A third
replay, of sync's forwards without the rows whose block was done earlier in the round, says
how much of that is the finished rows sync forwards (as SGLang's sync loop does; a lock-step
round could drop them and still wait for its slowest block): FDFO's gain against that sync
is what its early release of seats buys besides (`BoundResult.busy_ratio`). Real costs
per forward (the step's, about equal in both) pull the engine's ratio toward the ratio of
forward counts; FDFO's scheduler, which works once per forward where sync's works once per
round of several forwards, pulls it down.

Timing: the replay makes `repeats` passes; in each the two modes alternate forward by forward
(sync's i-th, FDFO's i-th, ...), so every forward of either mode follows one of the other and a
change in the machine's speed hits both alike. Each forward is charged its best time over the
passes and a mode's forward time is the sum: on a shared machine, bursts of interference make
single timings (and so the ratio of two totals) swing by several per cent from pass to pass,
while each forward's best time is stable.

Token values do not change a forward's cost, so the replay feeds fixed random blocks; each row
reads contiguous slots of its own table row (as the page rule lays out a request's blocks).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any

import torch

from gpu.bench import Serving
from gpu.engine import wait_for_device
from gpu.kv_cache import PagedKvCache
from gpu.model import BlockDiffusionLM, BlockPlan
from spec.batch_parity import MODE_VARIANTS, ModeVariant

Layout = tuple[int, ...]  # one forward: each row's block start (its context is start + B)


@dataclass(frozen=True, slots=True)
class ModeWork:
    """What one mode's forwards amount to: counts from the forward log, no timing. Idle: the
    row-forwards of blocks already done earlier in the same round (sync forwards them until
    the round's slowest block is done) and the context positions they attend."""

    forwards: int
    row_forwards: int
    keys: int  # context positions attended, summed over rows and forwards
    tokens: int
    idle_row_forwards: int
    idle_keys: int


def record_layouts(
    serving: Serving, mode: ModeVariant, max_running: int
) -> tuple[list[Layout], ModeWork]:
    """Serve the requests once (untimed); return every forward's layout, in order, and what
    the forwards amount to."""
    layouts, _, work = record_forwards(serving, mode, max_running)
    return layouts, work


def record_forwards(
    serving: Serving, mode: ModeVariant, max_running: int
) -> tuple[list[Layout], list[Layout], ModeWork]:
    """`record_layouts`, with each forward's busy layout too: its rows less those whose block
    was done earlier in the same round (the forwards a lock-step round would make if it
    dropped its finished rows; FDFO has none to drop)."""
    # every forward is kept: the replay needs all of them
    engine = serving.engine(mode, max_running, record=True, forward_log_cap=1 << 30)
    engine.drain()
    b = serving.block_size
    layouts: list[Layout] = []
    busy: list[Layout] = []
    idle_rows = idle_keys = 0
    done_before: set[tuple[str, int]] = set()  # blocks done earlier in the current round
    round_index = -1
    for rec in engine.forward_log:
        if rec.round_index != round_index:
            round_index, done_before = rec.round_index, set()
        layout = tuple(k * b for _, k in rec.rows)
        layouts.append(layout)
        kept = zip(rec.rows, layout, strict=True)
        busy.append(tuple(s for block, s in kept if block not in done_before))
        for block, start, done in zip(rec.rows, layout, rec.done, strict=True):
            if block in done_before:
                idle_rows += 1
                idle_keys += start + b
            elif done:
                done_before.add(block)
    work = ModeWork(
        forwards=len(layouts),
        row_forwards=sum(len(layout) for layout in layouts),
        keys=sum(start + b for layout in layouts for start in layout),
        tokens=sum(len(o) for o in engine.outputs.values()),
        idle_row_forwards=idle_rows,
        idle_keys=idle_keys,
    )
    return layouts, busy, work


class Replayer:
    """Forwards of recorded layouts on one KV pool and table, plans built up front."""

    def __init__(
        self,
        model: BlockDiffusionLM,
        layouts: list[Layout],
        block_size: int,
        max_context: int,
        device: torch.device,
        seed: int = 0,
    ) -> None:
        cfg = model.config
        rows = max(len(layout) for layout in layouts)
        self.model = model
        self.table: torch.Tensor = torch.arange(
            rows * max_context, dtype=torch.int32, device=device
        ).view(rows, max_context)
        self.kv: PagedKvCache = PagedKvCache(
            cfg.n_layers, cfg.n_heads, cfg.head_dim, rows * max_context, device=device
        )
        rng = random.Random(seed)
        self.steps: list[tuple[torch.Tensor, list[int], list[int], BlockPlan]] = []
        for layout in layouts:
            starts, row_ids = list(layout), list(range(len(layout)))
            tokens = torch.tensor(
                [[rng.randrange(cfg.vocab_size) for _ in range(block_size)] for _ in layout],
                dtype=torch.long,
                device=device,
            )
            plan = model.plan_blocks(starts, row_ids, block_size, self.table)
            self.steps.append((tokens, starts, row_ids, plan))
        self.device = device

    def time_forward(self, index: int) -> float:
        """Run recorded forward `index` once; its wall seconds (on CUDA, to completion)."""
        tokens, starts, row_ids, plan = self.steps[index]
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.model.forward_blocks(tokens, starts, row_ids, self.kv, self.table, plan)
        wait_for_device(self.device)
        return time.perf_counter() - t0


def best_forward_seconds(replayers: list[Replayer], passes: int) -> list[list[float]]:
    """Per replayer, each recorded forward's best wall time over `passes` passes in which the
    replayers alternate forward by forward (after one untimed forward each)."""
    best = [[math.inf] * len(r.steps) for r in replayers]
    longest = max(len(r.steps) for r in replayers)
    for r in replayers:  # one-off costs of a first call (lazy kernel setup) stay out
        r.time_forward(0)
    for _ in range(passes):
        for i in range(longest):
            for r, times in zip(replayers, best, strict=True):
                if i < len(r.steps):
                    times[i] = min(times[i], r.time_forward(i))
    return best


@dataclass(frozen=True, slots=True)
class BoundResult:
    """`forward_bound` at one max-running value: each mode's work and summed best seconds."""

    max_running: int
    sync: ModeWork
    fdfo: ModeWork
    sync_seconds: float  # the mode's forwards, each at its best time over the passes
    fdfo_seconds: float
    passes: int
    # sync's forwards without the rows done earlier in their round (`record_forwards`)
    busy_sync_seconds: float

    def ratio(self) -> float:
        """FDFO/sync throughput from forward time alone: sync's forward seconds per generated
        token over FDFO's."""
        return (self.sync_seconds / self.sync.tokens) / (self.fdfo_seconds / self.fdfo.tokens)

    def busy_ratio(self) -> float:
        """FDFO/sync from forward time alone against a lock-step sync that drops its finished
        rows (`busy_sync_seconds`): what FDFO gains besides not forwarding finished rows,
        which sync, as SGLang's, forwards until its round ends."""
        return (self.busy_sync_seconds / self.sync.tokens) / (self.fdfo_seconds / self.fdfo.tokens)

    def rows_ratio(self) -> float:
        """FDFO/sync from row-forwards per generated token (the benchmark's work ratio)."""
        return (self.sync.row_forwards / self.sync.tokens) / (
            self.fdfo.row_forwards / self.fdfo.tokens
        )

    def keys_ratio(self) -> float:
        """FDFO/sync from attended context positions (`keys`) per generated token."""
        return (self.sync.keys / self.sync.tokens) / (self.fdfo.keys / self.fdfo.tokens)

    def to_json(self) -> dict[str, Any]:
        """One entry of the `--forward-bound --json` report's `results`: each mode's counts
        and best forward seconds, the passes and the three ratios (rounded)."""
        return {
            "max_running": self.max_running,
            "forwards": {"sync": self.sync.forwards, "fdfo": self.fdfo.forwards},
            "row_forwards": {"sync": self.sync.row_forwards, "fdfo": self.fdfo.row_forwards},
            "attention_keys": {"sync": self.sync.keys, "fdfo": self.fdfo.keys},
            "tokens": {"sync": self.sync.tokens, "fdfo": self.fdfo.tokens},
            "idle_row_forwards": {
                "sync": self.sync.idle_row_forwards,
                "fdfo": self.fdfo.idle_row_forwards,
            },
            "idle_attention_keys": {"sync": self.sync.idle_keys, "fdfo": self.fdfo.idle_keys},
            "best_forward_seconds": {
                "sync": round(self.sync_seconds, 4),
                "fdfo": round(self.fdfo_seconds, 4),
                "sync_dropping_done_rows": round(self.busy_sync_seconds, 4),
            },
            "passes": self.passes,
            "forward_time_ratio": round(self.ratio(), 3),
            "forward_time_ratio_vs_sync_dropping_done_rows": round(self.busy_ratio(), 3),
            "row_forward_ratio": round(self.rows_ratio(), 3),
            "attention_key_ratio": round(self.keys_ratio(), 3),
        }


def forward_bound(serving: Serving, max_running: int, *, passes: int = 5) -> BoundResult:
    """Record sync's and FDFO's forwards on the serving's requests and replay them `passes`
    times, alternating forward by forward (see the module docstring)."""
    by_name = {m.name: m for m in MODE_VARIANTS}
    works: list[ModeWork] = []
    replayed: list[list[Layout]] = []
    busy: list[list[Layout]] = []
    for name in ("sync", "fdfo"):
        layouts, busy_layouts, work = record_forwards(serving, by_name[name], max_running)
        works.append(work)
        replayed.append(layouts)
        busy.append(busy_layouts)
    replayed.append(busy[0])  # sync dropping its finished rows
    replayers = [
        Replayer(serving.model, lay, serving.block_size, serving.max_context, serving.device)
        for lay in replayed
    ]
    best = best_forward_seconds(replayers, passes)
    return BoundResult(
        max_running, works[0], works[1], sum(best[0]), sum(best[1]), passes, sum(best[2])
    )
