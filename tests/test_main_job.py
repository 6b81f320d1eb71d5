"""The main job (`schedspec verify` with no --impl) on small settings: every step passes and the
report directory holds report.md, report.json and the plots; a failing step is named and makes
the exit status non-zero."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import properties.proofs
from properties.proofs import ProofResult
from schedspec_cli import main_job as mj
from schedspec_cli.registry import BUILTINS, Builtin
from spec.implementation import Family
from tests.proof_run import Z3_PROOFS_GROUP, default_proof_run


def _the_shared_proof_run(progress: object = None) -> list[ProofResult]:
    """The main job's call, answered by this process's one run of every proof (the same
    call at the same defaults; `test_z3_proofs` checks that run)."""
    assert progress is None, "the main job runs the proofs without a progress line"
    return list(default_proof_run().results)


# in the proofs' xdist group: the worker that solves them for test_z3_proofs answers here too
@pytest.mark.xdist_group(Z3_PROOFS_GROUP)
@pytest.mark.timeout(3600)  # a hang guard: the whole main job, slower on a loaded machine
def test_main_job_passes_and_writes_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(properties.proofs, "run_all_proofs", _the_shared_proof_run)
    # the benchmark step at 8 requests, not 32: a measurement, whose size this test does not
    # read (the benchmark's own tests do), and 32 were a fifth of this test's time
    bench = mj.step_engine_bench
    monkeypatch.setattr(mj, "step_engine_bench", lambda: bench(requests=8))
    code = mj.main_job(str(tmp_path), examples=5, parity_prompts=1, parity_tokens=8)
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 0, out
    assert report["passed"] is True
    names = [s["name"] for s in report["steps"]]
    proofs = report["steps"][0]["data"]["proofs"]
    assert len(proofs) == len(default_proof_run().results) > 0
    assert all(p["status"] == "proved" for p in proofs)
    assert names == [
        "z3 proofs",
        "conformance",
        "bs=1 parity + leaks",
        "fdfo vs sync",
        "engine bench",
        "plots",
    ]
    for png in ("gantt_sync_vs_fdfo.png", "kv_occupancy.png", "rounds_per_block.png"):
        assert (tmp_path / png).stat().st_size > 10_000, png
        assert png in (tmp_path / "report.md").read_text()
    conformance = report["steps"][1]["data"]["results"]
    assert {"reference-dllm", "engine", "vllm-v1"} <= {r["impl"] for r in conformance}
    twins = {r["impl"]: r["twin"] for r in conformance}
    assert twins["engine"] == "reference-dllm"  # the engine decides as the FCFS reference
    assert twins["engine-rows-released"] == "reference-dllm-rows-released"
    assert twins["engine-priority"] == "reference-dllm-priority"
    assert twins["engine-lof"] == "reference-dllm-lof"
    assert twins["engine-cached"] == "reference-dllm-cached"
    assert {n for n, t in twins.items() if t} == {
        "engine",
        "engine-rows-released",
        "engine-priority",
        "engine-lof",
        "engine-cached",
    }
    assert (
        "decisions checked against a twin: engine as reference-dllm"
        in report["steps"][1]["summary"]
    )
    # the real engines are not part of the main job, and its report says so
    not_run = report["steps"][1]["data"]["not_run"]
    assert set(not_run) == {n for n in BUILTINS if n.startswith("real-")}
    assert not set(not_run) & {r["impl"] for r in conformance}
    assert f"not run here: {len(not_run)} real engines" in report["steps"][1]["summary"]
    run = report["run"]  # when, on what commit, with which versions, on which device and host
    assert run["date"] and run["commit"] and run["device"] and run["host"]["name"]
    assert "cpu" in run["host"]  # the model, or "" where the OS names none
    assert run["versions"]["hypothesis"] and run["versions"]["schedspec"]
    report_md = (tmp_path / "report.md").read_text()
    assert "## Run" in report_md
    if run["host"]["cpu"]:  # the host line names the CPU model the OS reports
        assert f"CPUs, {run['host']['cpu']})" in report_md, report_md
    assert ", 8 requests at max-running 4:" in report["steps"][4]["summary"]
    hol = report["steps"][3]["data"]
    assert hol["fdfo"]["forwards"] < hol["sync"]["forwards"]
    assert hol["fdfo"]["wasted_row_steps"] == 0 < hol["sync"]["wasted_row_steps"]


def test_main_job_names_what_failed(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bad = Builtin("seeded-bug", Family.DLLM, ("reference.seeded_bugs:no_free_on_finish",), "x")
    monkeypatch.setattr(mj, "all_builtins", lambda: {"seeded-bug": bad})
    monkeypatch.setattr(mj, "step_proofs", lambda: (True, "skipped here", {}))
    monkeypatch.setattr(mj, "step_parity", lambda p, t: (True, "skipped here", {}))
    monkeypatch.setattr(mj, "step_engine_bench", lambda: (True, "skipped here", {}))
    from tests.test_conformance_reference import no_shrink

    monkeypatch.setattr("properties.verify.verify_settings", no_shrink)
    code = mj.main_job(str(tmp_path), examples=60, parity_prompts=1, parity_tokens=8)
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED: conformance" in out
    md = (tmp_path / "report.md").read_text()
    assert "seeded-bug: [terminal_owns_nothing]" in md and "state.submit(" in md
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] is False and report["run"]["commit"]
