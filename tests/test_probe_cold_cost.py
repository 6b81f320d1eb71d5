"""scripts/probe_cold_cost.py: a measurement script, so its figures are not asserted; what it
writes and how it refuses bad arguments are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.script_module import load_script


def test_probe_writes_both_calls_timings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cold.json"
    args = ["--rows", "3", "--samples", "3", "--json", str(out)]
    assert load_script("probe_cold_cost").main(args) == 0
    data = json.loads(out.read_text())
    assert data["rows"] == 3 and data["samples"] == 2 and data["device"] == "cpu"
    assert set(data["results"]) == {"plan_blocks", "stack + unbind"}
    for r in data["results"].values():
        assert r["after_forward_us"] > 0 and r["warm_us"] > 0
        assert r["ratio"] == pytest.approx(r["after_forward_us"] / r["warm_us"], rel=0.05)
    assert "plan_blocks" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--rows", "0"], ["--rows", "65"], ["--samples", "1"]])
def test_probe_refuses_bad_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert load_script("probe_cold_cost").main(args) == 2
    assert "error:" in capsys.readouterr().err
