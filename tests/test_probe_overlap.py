"""scripts/probe_overlap.py: a measurement script, so its figures are not asserted; what it
writes, that it leaves the interpreter's switch interval as it was, and how it refuses bad
arguments are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.script_module import load_script


def test_probe_writes_every_variant_and_the_paired_ratios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "overlap.json"
    args = ["--rows", "2", "--samples", "3", "--bookkeeping-repeats", "1", "--json", str(out)]
    probe = load_script("probe_overlap")
    assert probe.main(args) == 0
    data = json.loads(out.read_text())
    assert data["rows"] == 2 and data["samples"] == 3 and data["bookkeeping_repeats"] == 1
    assert data["device"] == "cpu" and data["command"].startswith("scripts/probe_overlap.py")
    results = data["results"]
    names = ("forward", "bookkeeping", "serial", *probe.OVERLAPPED)
    assert set(results) == {
        *(f"{n}_ms" for n in names),
        *(f"{n}_over_serial" for n in probe.OVERLAPPED),
        "forward_beside_python_ms",
    }
    assert all(value > 0 for value in results.values())
    printed = capsys.readouterr().out
    for name in names:
        assert name in printed
    assert "forward beside a thread running Python" in printed


def test_the_switch_interval_is_restored(tmp_path: Path) -> None:
    """The probe changes the interpreter's switch interval per variant; it must leave it as it
    found it (the test process runs on)."""
    import sys

    before = sys.getswitchinterval()
    args = ["--rows", "1", "--samples", "1", "--bookkeeping-repeats", "1"]
    assert load_script("probe_overlap").main(args) == 0
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize(
    "args",
    [["--rows", "0"], ["--rows", "65"], ["--samples", "0"], ["--bookkeeping-repeats", "0"]],
)
def test_probe_refuses_bad_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert load_script("probe_overlap").main(args) == 2
    assert "error:" in capsys.readouterr().err
