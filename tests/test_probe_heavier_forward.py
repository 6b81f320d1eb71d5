"""scripts/probe_heavier_forward.py: a measurement script, so its figures are not asserted; that
a heavier forward runs the model k times with the same values and decisions, what it writes
and how it refuses bad arguments are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpu.engine import tiny_model
from gpu.kv_cache import PagedKvCache
from tests.script_module import load_script


def test_a_heavier_forward_runs_k_times_with_the_same_logits() -> None:
    script = load_script("probe_heavier_forward")
    model = tiny_model()
    cfg = model.config
    kv = PagedKvCache(cfg.n_layers, cfg.n_heads, cfg.head_dim, 2 * cfg.max_context)
    table = torch.arange(2 * cfg.max_context, dtype=torch.int32).view(2, cfg.max_context)
    tokens = torch.randint(0, cfg.vocab_size, (2, 4), generator=torch.Generator().manual_seed(1))
    args = (tokens, [0, 4], [0, 1], kv, table)
    with torch.inference_mode():
        plain = model.forward_blocks(*args)
        calls_before = model.attention_groups
        script.make_heavier(model, 3)
        heavy = model.forward_blocks(*args)
        heavy_calls = model.attention_groups - calls_before
        script.make_heavier(model, 1)
        restored_before = model.attention_groups
        model.forward_blocks(*args)
        restored_calls = model.attention_groups - restored_before
    assert torch.equal(heavy, plain)
    assert heavy_calls == 3 * restored_calls > 0  # three real forwards, then one again
    assert "forward_blocks" not in model.__dict__


def test_probe_writes_ratios_and_predictions_per_k(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "heavier.json"
    args = ["--heavier", "1", "2", "--max-running", "2", "--requests", "3", "--repeats", "1"]
    assert load_script("probe_heavier_forward").main([*args, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["requests"] == 3
    rows = data["results"]
    assert [(r["heavier"], r["max_running"]) for r in rows] == [(1, 2), (2, 2)]
    base = rows[0]
    # the lightest k predicts itself: the prediction is anchored on its measured ratio
    assert base["fdfo/sync predicted"] == base["fdfo/sync"]
    for r in rows:
        assert 0 < r["sync outside forward"] < 1
        assert r["work ratio"] == base["work ratio"]  # the same decisions for every k
    runs = data["runs"]
    assert set(runs) == {"1", "2"}
    forwards = {k: {x["mode"]: x["forwards"] for x in run["results"]} for k, run in runs.items()}
    assert forwards["1"] == forwards["2"]
    # one repeat: the forward-time ratio is the two runs' tokens per forward second
    for r in rows:
        by_mode = {x["mode"]: x for x in runs[str(r["heavier"])]["results"]}
        rate = {m: x["tokens"] / x["forward_seconds"] for m, x in by_mode.items()}
        for num in ("fdfo", "fdfo+reuse"):
            want = rate[num] / rate["sync"]
            assert r[f"{num}/sync forward time"] == pytest.approx(want, rel=0.01, abs=2e-3)
    assert "fdfo/sync" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        ["--heavier", "0"],
        ["--heavier", "17"],
        ["--heavier", "2", "2"],
        ["--max-running", "0"],
        ["--repeats", "0"],
        ["--requests", "0"],
    ],
)
def test_refuses_bad_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert load_script("probe_heavier_forward").main(args) == 2
    assert "error:" in capsys.readouterr().err
