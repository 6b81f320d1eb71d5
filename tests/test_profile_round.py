"""scripts/profile_round.py: a measurement script, so its figures are not asserted; that its
phases partition each round, that its counts are the engine's, what it writes and how it
refuses bad arguments are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.script_module import load_script


def test_phases_partition_the_round_and_counts_are_the_engines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script("profile_round")
    out = tmp_path / "profile.json"
    args = ["--max-running", "4", "--requests", "6", "--repeats", "1", "--modes", "sync,fdfo"]
    assert script.main([*args, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["max_running"] == 4 and data["requests"] == 6 and data["device"] == "cpu"
    sync, fdfo = data["results"]["sync"], data["results"]["fdfo"]
    for r in (sync, fdfo):
        assert set(r["ms_per_round"]) == set(script.PHASES)
        # one repeat: the phases (rests taken by subtraction) add up to the round exactly
        assert sum(r["ms_per_round"].values()) == pytest.approx(r["round_ms"], rel=1e-3)
        assert r["ms_per_round"]["forward"] > 0
        for phase in script.PHASES:
            assert r["ms_per_forward"][phase] == pytest.approx(
                r["ms_per_round"][phase] * r["rounds"] / r["forwards"], rel=1e-3, abs=1e-4
            )
    assert fdfo["rounds"] == fdfo["forwards"]  # one forward a round without re-loop
    assert sync["forwards"] > sync["rounds"]
    assert sync["commits"] == fdfo["commits"] > 0  # the same blocks, committed once each
    assert sync["carries"] == 0 < fdfo["carries"]
    assert sync["ms_per_round"]["carries"] == 0.0
    assert sync["ms_per_round"]["row re-acquisition"] == fdfo["ms_per_round"]["row re-acquisition"]
    assert fdfo["ms_per_round"]["row re-acquisition"] == 0.0  # never called: rows are kept
    printed = capsys.readouterr().out
    assert "batch + events" in printed and "fdfo" in printed


def test_the_rows_released_mode_is_profiled_with_its_reacquisitions(tmp_path: Path) -> None:
    script = load_script("profile_round")
    out = tmp_path / "profile.json"
    args = ["--max-running", "4", "--requests", "6", "--repeats", "1", "--json", str(out)]
    assert script.main([*args, "--modes", "fdfo,fdfo+rows-released"]) == 0
    results = json.loads(out.read_text())["results"]
    released, kept = results["fdfo+rows-released"], results["fdfo"]
    assert released["ms_per_round"]["row re-acquisition"] > 0
    assert sum(released["ms_per_round"].values()) == pytest.approx(released["round_ms"], rel=1e-3)
    for count in ("rounds", "forwards", "commits", "carries"):
        assert released[count] == kept[count]  # the same work, rows given back between rounds


@pytest.mark.parametrize(
    "args",
    [
        ["--modes", "sync,turbo"],
        ["--modes", ","],
        ["--max-running", "0"],
        ["--repeats", "0"],
        ["--device", "cudaXYZ"],
        ["--device", "tpu"],
    ],
)
def test_refuses_bad_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert load_script("profile_round").main(args) == 2
    assert "error:" in capsys.readouterr().err


def test_cuda_without_cuda_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_script("profile_round").main(["--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_each_timed_call_waits_for_the_device_before_both_clock_reads() -> None:
    """On CUDA a phase's queued device work must count in that phase: the timer synchronises
    before reading the clock at the start and at the end of every call, errors included."""
    script = load_script("profile_round")
    waits: list[str] = []

    class Engine:
        def work(self, fail: bool) -> int:
            waits.append("inside")
            if fail:
                raise ValueError("boom")
            return 7

    engine = Engine()
    timers = script._Timers(lambda: waits.append("sync"))
    timers.wrap(engine, "work")
    assert engine.work(False) == 7
    with pytest.raises(ValueError):
        engine.work(True)
    assert waits == ["sync", "inside", "sync"] * 2
    assert timers.calls["work"] == 2
