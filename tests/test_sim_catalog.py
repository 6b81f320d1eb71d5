"""`reference.sim.catalog`: every replica scheduler name builds, a bad one is refused naming the
valid ones, and the classes that decide as Vidur's releases reproduce Vidur 0.0.26's own batch
counts (recorded by scripts/vidur_speed.py in docs/vidur-speed.json) in simulated time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference.sim.catalog import SCHEDULERS, ReplicaSpec
from reference.sim.errors import SimConfigError
from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", SCHEDULERS)
def test_every_scheduler_name_builds(name: str) -> None:
    make = ReplicaSpec(name, 4096, max_batch=8, budget=1024, max_model_len=512).factory()
    assert make() is not make()  # a fresh replica each call


def test_an_unknown_scheduler_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(SimConfigError) as err:
        ReplicaSpec("vidur-nope")
    assert "vidur-sarathi-released-ref" in str(err.value)


def vidur_0_0_26_batches(scheduler: str, workload: str, replicas: int, requests: int) -> int:
    for row in json.loads((ROOT / "docs" / "vidur-speed.json").read_text()):
        key = (row["scheduler"], row["workload"], row["replicas"], row["requests"])
        if row["vidur"] == "0.0.26" and key == (scheduler, workload, replicas, requests):
            return int(row["batches"])
    raise LookupError(scheduler)


@pytest.mark.parametrize("kind", ["vllm", "sarathi"])
def test_released_classes_give_vidur_0_0_26_s_batch_count(kind: str) -> None:
    """One overloaded replica, 2,000 requests (`simulate` workload): where microsoft/vidur's
    main branch (and `vidur-vllm`) pads a prefill batch's tokens, 0.0.26 sums them, and only
    the class that sums gets 0.0.26's count."""
    bench = load_script("bench_sim_speed")
    expected = vidur_0_0_26_batches(f"vidur-{kind}", "simulate", 1, 2000)
    released = bench.run(f"vidur-{kind}-released-ref", 1, 2000, "simulate")
    assert released["completed"] == 2000
    assert released["batches"] == expected
    if kind == "vllm":
        assert bench.run("vidur-vllm-ref", 1, 2000, "simulate")["batches"] != expected


def test_a_released_scheduler_is_compared_with_vidur_0_0_26_only() -> None:
    """scripts/bench_sim_speed.py's baseline: the fastest Vidur run of the point, but for a
    class that decides as Vidur's releases, 0.0.26's run of the scheduler it re-implements."""
    baseline = load_script("bench_sim_speed").vidur_baseline
    point = {"replicas": 1, "requests": 2000, "workload": "bench"}
    rows = [
        {"scheduler": "vidur-vllm", "vidur": "0.0.26", "cpu_s": 2.0, **point},
        {"scheduler": "vidur-vllm", "vidur": "main", "cpu_s": 1.5, **point},
    ]
    assert baseline(rows, "vidur-vllm", 1, 2000, "bench")["vidur"] == "main"
    for name in ("vidur-vllm-released", "vidur-vllm-released-ref"):
        assert baseline(rows, name, 1, 2000, "bench")["vidur"] == "0.0.26"
    assert baseline(rows, "vidur-sarathi-released", 1, 2000, "bench") is None
    assert baseline(rows, "vidur-vllm", 8, 2000, "bench") is None


@pytest.mark.parametrize("name", ["vidur-vllm", "vidur-sarathi-released", "vidur-orca-ref"])
def test_simulate_replicas_runs_a_catalog_scheduler(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`schedspec simulate replicas --scheduler NAME` builds the catalog's replicas (Vidur's
    schedulers refuse the chunking default of a bare AR factory's configuration), with
    max_model_len the workload's longest request: every request completes."""
    from schedspec_cli.main import main

    out = tmp_path / "r.json"
    argv = ["simulate", "replicas", "--scheduler", name, "--requests", "60", "--json", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert data["scheduler"] == name and data["completed"] == 60 and data["batches"] > 0
