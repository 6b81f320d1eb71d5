"""The release gate refuses CPU runs, mismatches, leaks and thin coverage."""

from __future__ import annotations

import json
from pathlib import Path

from properties.cli import main
from properties.release import release_problems


def report(**changes: object) -> dict[str, object]:
    cases = [
        {"algorithm": a, "prompt": i, "max_new_tokens": 64, "identical": True}
        for a in ("LowConfidence", "JointThreshold")
        for i in range(3)
    ]
    base: dict[str, object] = {
        "device": "cuda:0",
        "identical": True,
        "leaked_slots": 0,
        "cases": cases,
    }
    base.update(changes)
    return base


def test_a_good_cuda_run_qualifies(tmp_path: Path) -> None:
    assert release_problems(report()) == []
    p = tmp_path / "parity.json"
    p.write_text(json.dumps(report()))
    assert main(["release-check", str(p)]) == 0


def test_cpu_runs_are_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "parity.json"
    p.write_text(json.dumps(report(device="cpu")))
    assert main(["release-check", str(p)]) == 1
    assert "must run on CUDA" in capsys.readouterr().out


def test_mismatch_leak_and_coverage_are_refused() -> None:
    assert any("byte-identical" in x for x in release_problems(report(identical=False)))
    assert any("leaked_slots=3" in x for x in release_problems(report(leaked_slots=3)))
    one_algo = report(cases=[{"algorithm": "LowConfidence", "max_new_tokens": 64}] * 3)
    assert any("JointThreshold" in x for x in release_problems(one_algo))
    short = report(
        cases=[
            {"algorithm": a, "max_new_tokens": 16}
            for a in ("LowConfidence", "JointThreshold")
            for _ in range(3)
        ]
    )
    assert any("fewer than 64" in x for x in release_problems(short))
