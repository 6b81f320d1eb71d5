"""scripts/repro_vidur_rules.py: a measurement script, so its figures are not asserted; what it
writes, that the `release` variant is the released class itself, and how it refuses bad
arguments are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference.ar.vidur_released import VidurSarathiReleased, VidurVllmReleased
from tests.script_module import load_script


def test_it_runs_every_variant_of_both_schedulers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rules.json"
    args = ["--kv-tokens", "2048", "--qps", "40", "--requests", "40", "--seeds", "1,2"]
    assert load_script("repro_vidur_rules").main([*args, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["seeds"] == [1, 2] and data["kv_tokens"] == 2048
    variants = {"reference", "+ watermark", "release, no watermark", "release"}
    for scheduler, extra in (
        ("vidur-vllm", set()),
        ("vidur-sarathi", {"block demand only, no watermark"}),
    ):
        runs = [r for r in data["runs"] if r["scheduler"] == scheduler]
        assert {r["variant"] for r in runs} == variants | extra
        assert len(runs) == 2 * len(variants | extra)
        assert all(r["completed"] == 40 and r["batches"] > 0 for r in runs)
    printed = capsys.readouterr().out
    assert "release, no watermark" in printed and "over the release" in printed


def test_the_release_variant_is_the_released_class_and_the_others_differ_only_in_watermark() -> (
    None
):
    script = load_script("repro_vidur_rules")
    table = script.variants()
    assert table["vidur-vllm"]["release"] == (VidurVllmReleased, False)
    assert table["vidur-sarathi"]["release"] == (VidurSarathiReleased, True)
    for variants in table.values():
        assert variants["reference"][0].watermark_fraction == 0.0
        assert variants["+ watermark"][0].watermark_fraction == 0.01
        assert variants["release, no watermark"][0].watermark_fraction == 0.0
        assert issubclass(variants["+ watermark"][0], variants["reference"][0])
        assert issubclass(variants["release, no watermark"][0], variants["release"][0])
    demand_only = table["vidur-sarathi"]["block demand only, no watermark"][0]
    assert issubclass(demand_only, VidurSarathiReleased) and demand_only.watermark_fraction == 0
    assert not demand_only.restart_keeps_processed


@pytest.mark.parametrize(
    "args",
    [["--kv-tokens", "1024"], ["--qps", "0"], ["--requests", "0"], ["--seeds", "a,b"]],
)
def test_it_refuses_bad_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert load_script("repro_vidur_rules").main(args) == 2
    assert "error:" in capsys.readouterr().err
