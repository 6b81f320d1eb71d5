"""The forward-time bound of FDFO/sync: each mode's forwards replayed without its scheduler.

    schedspec bench engine --forward-bound [--max-running 4 16] [--repeats 5] [--json PATH]

The benchmark's "work" ratio counts row-forwards per generated token as if every row cost the
same. It does not: a row's attention reads its whole context, and FDFO's rows are longer on
average. Sync keeps forwarding a finished row until the slowest row of its round is done, and
the rows that finish first are often prompt blocks (no masks: one forward), which are the
shortest contexts; FDFO forwards a block only while it has masks left. So FDFO saves a larger
share of sync's rows than of sync's attention.

This module measures the bound that follows. It serves the benchmark's workload once per mode
(untimed), recording every forward's layout (the context length of each row), then replays
exactly those forwards — `forward_blocks` on a plan built beforehand, no step, no scheduler, no
events — with the two modes taking turns in time slices (as the benchmark does), and reports
the paired ratio of forward time. FDFO's three variants (with or without in-place reuse or
re-loop) run the same forwards, so one replay covers them. A scheduler that cost nothing would
reach this ratio; none can beat it by more than the noise.

Token values do not change a forward's cost, so the replay feeds fixed random blocks; each row
reads contiguous slots of its own table row (as the page rule lays out a request's blocks).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from gpu.algorithms import make_algorithm
from gpu.engine import DllmEngine
from gpu.kv_cache import PagedKvCache
from gpu.model import BlockDiffusionLM, BlockPlan
from gpu.parity import engine_config
from spec.batch_parity import MODE_VARIANTS, ModeVariant
from spec.config import RequestSpec

Layout = tuple[int, ...]  # one forward: each row's block start (its context is start + B)


def record_layouts(
    model: BlockDiffusionLM,
    algorithm: str,
    mode: ModeVariant,
    max_running: int,
    requests: list[RequestSpec],
    block_size: int,
    page_size: int,
    max_context: int,
    device: torch.device,
) -> tuple[list[Layout], int]:
    """Serve `requests` once (untimed) and return every forward's layout, in order, and the
    tokens generated."""
    config = engine_config(block_size, page_size, max_context, mode, max_running)
    engine = DllmEngine(
        config,
        lambda event: None,
        model=model,
        algorithm=make_algorithm(algorithm),
        device=device,
        record=True,
        forward_log_cap=1 << 30,  # every forward: the replay needs all of them
    )
    for req in requests:
        engine.submit(req)
    engine.drain()
    layouts = [tuple(k * block_size for _, k in rec.rows) for rec in engine.forward_log]
    return layouts, sum(len(o) for o in engine.outputs.values())


@dataclass(frozen=True, slots=True)
class ModeWork:
    """What one mode's forwards amount to: counts from the layouts, no timing."""

    forwards: int
    row_forwards: int
    keys: int  # context positions attended, summed over rows and forwards
    tokens: int


def work_of(layouts: list[Layout], tokens: int, block_size: int) -> ModeWork:
    return ModeWork(
        forwards=len(layouts),
        row_forwards=sum(len(layout) for layout in layouts),
        keys=sum(start + block_size for layout in layouts for start in layout),
        tokens=tokens,
    )


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
        self.table = torch.arange(rows * max_context, dtype=torch.int32, device=device).view(
            rows, max_context
        )
        self.kv = PagedKvCache(
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
        self.next = 0
        self.seconds = 0.0

    def done(self) -> bool:
        return self.next >= len(self.steps)

    def run_for(self, turn_seconds: float) -> None:
        """Replay forwards until `turn_seconds` of this replayer's time have passed (at least
        one forward) or all are done; the time is charged to this replayer."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            while not self.done():
                tokens, starts, row_ids, plan = self.steps[self.next]
                self.model.forward_blocks(tokens, starts, row_ids, self.kv, self.table, plan)
                self.next += 1
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                if time.perf_counter() - t0 >= turn_seconds:
                    break
        self.seconds += time.perf_counter() - t0


def replay_interleaved(replayers: list[Replayer], turn_seconds: float = 0.05) -> list[float]:
    """Run every replayer to the end, taking turns; each one's own wall seconds."""
    for r in replayers:
        r.next, r.seconds = 0, 0.0
    while not all(r.done() for r in replayers):
        for r in replayers:
            if not r.done():
                r.run_for(turn_seconds)
    return [r.seconds for r in replayers]


@dataclass(frozen=True, slots=True)
class BoundResult:
    max_running: int
    sync: ModeWork
    fdfo: ModeWork
    sync_seconds: list[float]  # per repeat
    fdfo_seconds: list[float]

    def ratio(self) -> float:
        """Median over repeats of the paired ratio of forward time per generated token."""
        return statistics.median(
            (s / self.sync.tokens) / (f / self.fdfo.tokens)
            for s, f in zip(self.sync_seconds, self.fdfo_seconds, strict=True)
        )

    def rows_ratio(self) -> float:
        return (self.sync.row_forwards / self.sync.tokens) / (
            self.fdfo.row_forwards / self.fdfo.tokens
        )

    def keys_ratio(self) -> float:
        return (self.sync.keys / self.sync.tokens) / (self.fdfo.keys / self.fdfo.tokens)

    def to_json(self) -> dict[str, Any]:
        return {
            "max_running": self.max_running,
            "forwards": {"sync": self.sync.forwards, "fdfo": self.fdfo.forwards},
            "row_forwards": {"sync": self.sync.row_forwards, "fdfo": self.fdfo.row_forwards},
            "attention_keys": {"sync": self.sync.keys, "fdfo": self.fdfo.keys},
            "tokens": {"sync": self.sync.tokens, "fdfo": self.fdfo.tokens},
            "forward_seconds": {
                "sync": [round(x, 4) for x in self.sync_seconds],
                "fdfo": [round(x, 4) for x in self.fdfo_seconds],
            },
            "forward_time_ratio": round(self.ratio(), 3),
            "row_forward_ratio": round(self.rows_ratio(), 3),
            "attention_key_ratio": round(self.keys_ratio(), 3),
        }


def forward_bound(
    model: BlockDiffusionLM,
    max_running: int,
    requests: list[RequestSpec],
    *,
    block_size: int,
    page_size: int,
    max_context: int,
    algorithm: str = "LowConfidence",
    repeats: int = 5,
    device: torch.device | None = None,
    turn_seconds: float = 0.05,
) -> BoundResult:
    """Record sync's and FDFO's forwards on `requests`, replay them interleaved `repeats`
    times (see the module docstring)."""
    dev = device or torch.device("cpu")
    by_name = {m.name: m for m in MODE_VARIANTS}
    works: list[ModeWork] = []
    replayers: list[Replayer] = []
    for name in ("sync", "fdfo"):
        layouts, tokens = record_layouts(
            model, algorithm, by_name[name], max_running, requests, block_size, page_size,
            max_context, dev,
        )  # fmt: skip
        works.append(work_of(layouts, tokens, block_size))
        replayers.append(Replayer(model, layouts, block_size, max_context, dev))
    replay_interleaved(replayers, turn_seconds)  # warm-up
    seconds = [replay_interleaved(replayers, turn_seconds) for _ in range(repeats)]
    return BoundResult(
        max_running,
        works[0],
        works[1],
        [s[0] for s in seconds],
        [s[1] for s in seconds],
    )
