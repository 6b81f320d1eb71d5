"""The forward-time bound (`schedspec bench engine --forward-bound`): what it records and
replays is exactly the engine's forwards."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from gpu.algorithms import make_algorithm
from gpu.bench import Serving, bench_main, serving
from gpu.engine import DllmEngine, tiny_model
from gpu.forward_bound import (
    Replayer,
    best_forward_seconds,
    forward_bound,
    record_forwards,
    record_layouts,
)
from gpu.parity import engine_config
from spec.batch_parity import MODE_VARIANTS

torch.set_num_threads(1)
CPU = torch.device("cpu")
MODES = {m.name: m for m in MODE_VARIANTS}


def _setup() -> Serving:
    return serving(tiny_model("cpu"), requests=6, max_new_tokens=8, block_size=4, page_size=4,
                   algorithm="LowConfidence", device=CPU)  # fmt: skip


def test_layouts_are_the_engines_forwards_and_fdfo_variants_share_them() -> None:
    """Each recorded forward lists every row the engine forwarded (its block's start); the
    three FDFO variants forward the same blocks in the same order, so one replay covers them."""
    setup = _setup()
    model, max_context = setup.model, setup.max_context
    recorded = {name: record_layouts(setup, MODES[name], 3) for name in MODES}
    assert recorded["fdfo"] == recorded["fdfo+reuse"] == recorded["fdfo+reuse+reloop"]
    for name, (layouts, work) in recorded.items():
        config = engine_config(4, 4, max_context, MODES[name], 3)
        engine = DllmEngine(config, lambda e: None, model=model,
                            algorithm=make_algorithm("LowConfidence"), record=False)  # fmt: skip
        for req in setup.requests:
            engine.submit(req)
        engine.drain()
        assert work.forwards == len(layouts) == engine.runner.forwards
        assert work.row_forwards == engine.rows_forwarded
        assert work.tokens == sum(len(o) for o in engine.outputs.values())
        assert work.keys == sum(s + 4 for layout in layouts for s in layout)
        assert all(s % 4 == 0 and s + 4 <= max_context for lay in layouts for s in lay)
    (sync, sync_work), (fdfo, fdfo_work) = recorded["sync"], recorded["fdfo"]
    assert len(sync) > len(fdfo)  # sync forwards finished rows until its round ends
    # FDFO forwards a block only until it is done; sync forwards every block as often as FDFO
    # does (steps are batch-invariant) plus its idle forwards
    assert fdfo_work.idle_row_forwards == fdfo_work.idle_keys == 0
    assert sync_work.idle_row_forwards > 0
    assert sync_work.row_forwards - sync_work.idle_row_forwards == fdfo_work.row_forwards
    assert sync_work.keys - sync_work.idle_keys == fdfo_work.keys


def test_sync_dropping_its_done_rows_forwards_exactly_fdfos_rows() -> None:
    """The busy layouts are sync's forwards less the rows done earlier in their round: as many
    forwards as sync, each keeping its undone rows (never empty: a round goes on only while a
    block is undone), and in all exactly FDFO's row-forwards and attended keys."""
    setup = _setup()
    layouts, busy, work = record_forwards(setup, MODES["sync"], 3)
    fdfo_layouts, fdfo_busy, fdfo_work = record_forwards(setup, MODES["fdfo"], 3)
    assert fdfo_busy == fdfo_layouts  # FDFO has no finished row to drop
    assert len(busy) == len(layouts) and all(busy)
    assert all(set(kept) <= set(full) for kept, full in zip(busy, layouts, strict=True))
    assert sum(len(lay) for lay in busy) == work.row_forwards - work.idle_row_forwards
    assert sum(len(lay) for lay in busy) == fdfo_work.row_forwards
    assert sum(s + 4 for lay in busy for s in lay) == fdfo_work.keys
    assert busy != layouts  # some rows were dropped


def test_every_pass_runs_every_recorded_forward_once() -> None:
    """Each pass makes exactly the recorded forwards (the attention groups of the layouts, no
    more, no fewer), after one untimed warm-up forward per mode; every forward gets a best
    time."""
    setup = _setup()
    model = setup.model
    layouts = [record_layouts(setup, MODES[name], 3)[0] for name in ("sync", "fdfo")]
    replayers = [Replayer(model, lay, 4, setup.max_context, CPU) for lay in layouts]
    before = model.attention_groups
    best = best_forward_seconds(replayers, passes=3)
    groups = sum(len(set(layout)) for lay in layouts for layout in lay)
    warm_up = sum(len(set(lay[0])) for lay in layouts)  # each replayer's first forward, once
    assert model.attention_groups - before == 3 * groups + warm_up
    assert [len(b) for b in best] == [len(lay) for lay in layouts]
    assert all(0 < t < math.inf for b in best for t in b)


def test_forward_bound_result_and_cli_json(tmp_path: Path) -> None:
    result = forward_bound(_setup(), 3, passes=2)
    assert result.sync_seconds > 0 and result.fdfo_seconds > 0 and result.passes == 2
    assert result.rows_ratio() > 1.0  # FDFO forwards fewer rows per token than sync
    assert result.ratio() > 0
    assert result.busy_sync_seconds > 0 and result.busy_ratio() > 0
    out = tmp_path / "bound.json"
    args = ["--forward-bound", "--max-running", "2", "--requests", "3", "--max-new-tokens", "8"]
    assert bench_main([*args, "--repeats", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    (row,) = data["results"]
    assert row["max_running"] == 2
    assert row["row_forwards"]["sync"] >= row["row_forwards"]["fdfo"] > 0
    assert row["forward_time_ratio"] > 0 and row["passes"] == 1
    assert row["best_forward_seconds"]["sync"] > 0
    assert row["best_forward_seconds"]["sync_dropping_done_rows"] > 0
    assert row["forward_time_ratio_vs_sync_dropping_done_rows"] > 0
    assert data["command"].startswith("schedspec bench engine --forward-bound")
