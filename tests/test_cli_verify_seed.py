"""`schedspec verify --impl ... --seed N`: the programs come from seed N instead of the fixed
seed of a run without it, so a CI can explore other programs run after run and still replay
each: the same seed draws the same programs and shrinks to the same counterexample. The seed is
in the table, the JSON and report.md; without `--impl` it is refused, `--seed 0` included.
`bench conformance --seed N` times the same programs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hypothesis.core
import pytest

from properties.verify import forced_seed
from schedspec_cli.main import main

MUTANT = "reference.seeded_bugs:no_free_on_finish"


def verify(tmp_path: Path, name: str, *argv: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / f"{name}.json"
    code = main(["verify", *argv, "--json", str(out)])
    return code, json.loads(out.read_text(encoding="utf-8"))


def drawn(result: dict[str, Any]) -> tuple[int, int]:
    return result["examples"], result["steps"]


def test_the_same_seed_replays_the_same_counterexample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("--impl", MUTANT, "--examples", "100", "--seed", "5")
    code, first = verify(tmp_path, "first", *argv)
    again_code, again = verify(tmp_path, "again", *argv)
    assert code == again_code == 1
    assert first["seed"] == again["seed"] == 5
    assert drawn(first) == drawn(again)
    assert first["failures"] == again["failures"]
    assert first["rules"] == ["terminal_owns_nothing"]
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[-1] == "seed", header


def test_other_seeds_draw_other_programs(tmp_path: Path) -> None:
    argv = ("--impl", "vidur-orca", "--examples", "25")
    runs = {"fixed": verify(tmp_path, "fixed", *argv)[1]}
    for seed in ("0", "1", "2"):
        runs[seed] = verify(tmp_path, seed, *argv, "--seed", seed)[1]
    assert all(r["passed"] for r in runs.values())
    assert runs["fixed"]["seed"] is None
    assert len({drawn(r) for r in runs.values()}) > 1, {k: drawn(r) for k, r in runs.items()}


def test_report_names_the_seed(tmp_path: Path) -> None:
    report = tmp_path / "report"
    argv = ["verify", "--impl", "vidur-orca", "--examples", "10", "--seed", "3"]
    assert main([*argv, "--report", str(report)]) == 0
    assert "Programs drawn from seed 3 (`--seed`)" in (report / "report.md").read_text()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--seed", "0"], "invalid --seed=0: only with --impl NAME"),
        (["--seed", "3"], "invalid --seed=3: only with --impl NAME"),
        (["--impl", "vidur-orca", "--seed", "-1"], "-1 is out of range (valid: 0.."),
        (["--impl", "vidur-orca", "--seed", "x"], "'x' is not an integer"),
    ],
)
def test_a_bad_seed_is_a_usage_error(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


def test_the_forced_seed_ends_with_the_run() -> None:
    core: Any = hypothesis.core
    before = core.global_force_seed
    with forced_seed(7):
        assert core.global_force_seed == 7
    assert core.global_force_seed is before
    with pytest.raises(RuntimeError), forced_seed(8):
        raise RuntimeError
    assert core.global_force_seed is before


@pytest.mark.parametrize("seed", [(), ("--seed", "5")], ids=["fixed", "seed-5"])
def test_bench_conformance_draws_what_verify_draws(tmp_path: Path, seed: tuple[str, ...]) -> None:
    """`bench conformance --seed N` times the programs `verify --seed N` checks."""
    argv = ("--impl", "vidur-orca", "--examples", "100", *seed)
    _, checked = verify(tmp_path, "verify", *argv)
    out = tmp_path / "bench.json"
    assert main(["bench", "conformance", *argv, "--json", str(out)]) == 0
    timed = json.loads(out.read_text(encoding="utf-8"))
    (row,) = timed["rows"]
    assert (row["examples"], row["steps"]) == drawn(checked)
    assert timed["seed"] == checked["seed"]
