"""Logs cut short, and the verdict a CI job reads (`schedspec check-trace`, both families).

A log an engine was writing when it was killed, or a live pipe read to its end, stops anywhere:
inside an AR step (blocks allocated, the request not yet scheduled) or in its update phase (a
request's blocks freed, its `ar_finished` not yet written). There the between-steps rules do not
hold yet, so the end of a log with work left is not judged by them: every prefix of a
conforming log conforms (exit 0, a warning naming the requests left), and `--require-idle`,
which says the log is whole, judges its end. The JSON says what a dashboard groups by, and an
input error replaces a verdict file an earlier run left.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from properties.ar.harness import ArHarness
from properties.ar.trace_check import check_ar_trace
from reference.ar.vllm_v1 import make_vllm_v1
from schedspec_cli.main import main
from spec.ar.config import ArConfig, ArRequest
from spec.ar.trace import write_ar_trace

CFG = ArConfig(
    block_size=2, num_blocks=9, max_num_batched_tokens=8, max_num_seqs=4, max_model_len=16
)


def recorded_lines() -> list[str]:
    """An AR log vLLM v1's reference wrote: three requests, chunked, run to the end."""
    h = ArHarness(make_vllm_v1, CFG, check_invariants=False)
    for i in range(3):
        h.submit(ArRequest(f"r{i}", 3 + 2 * i, 3))
        h.step()
    h.drain()
    out = io.StringIO()
    write_ar_trace(list(h.events), out, CFG)
    return out.getvalue().splitlines(keepends=True)


def check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: list[str], *extra: str
) -> tuple[int, str, dict[str, object]]:
    log = tmp_path / "log.jsonl"
    log.write_text("".join(lines), encoding="utf-8")
    out_json = tmp_path / "verdict.json"
    code = main(["check-trace", str(log), "--json", str(out_json), *extra])
    cap = capsys.readouterr()
    return code, cap.out + cap.err, json.loads(out_json.read_text(encoding="utf-8"))


def test_every_prefix_of_a_conforming_ar_log_conforms() -> None:
    """Before, 11 of such a log's prefixes failed at their end (`waiting_holds_nothing` for a
    request allocated but not yet scheduled, `kv_covers_computed` for one freed before its
    `ar_finished`); those are now kept apart as not judged."""
    lines = recorded_lines()
    unjudged = set()
    for end in range(2, len(lines) + 1):
        result = check_ar_trace(lines[:end])
        assert result.violation is None, (end, result.violation)
        if end == len(lines):
            assert result.idle_at_end and result.unjudged_at_end is None, result
        if result.unjudged_at_end is not None:
            assert not result.idle_at_end
            unjudged.add(str(result.unjudged_at_end.rule))
    assert {"waiting_holds_nothing", "kv_covers_computed"} <= unjudged, unjudged


def _cut_in_update_phase(lines: list[str]) -> list[str]:
    """The log up to the first `ar_blocks_freed` of a request that then finishes."""
    at = next(i for i, line in enumerate(lines) if '"ar_blocks_freed"' in line)
    return lines[: at + 1]


def test_a_log_cut_in_an_update_phase_warns_and_require_idle_judges_its_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = _cut_in_update_phase(recorded_lines())
    code, out, verdict = check(tmp_path, capsys, cut)
    assert code == 0, out
    assert "warning: " in out and "the log ends with work still running (incomplete log?): " in out
    assert "not judged at its end, which may be a cut inside a step or its update phase: " in out
    assert "[kv_covers_computed]" in out, out
    assert verdict["verdict"] == "pass" and verdict["idle_at_end"] is False, verdict
    unjudged = verdict["unjudged_at_end"]
    assert isinstance(unjudged, dict) and unjudged["rule"] == "kv_covers_computed", verdict
    assert verdict["running_at_end"], verdict
    code, out, verdict = check(tmp_path, capsys, cut, "--require-idle")
    assert code == 1, out
    assert verdict["verdict"] == "violation" and verdict["rule"] == "kv_covers_computed", verdict
    assert verdict["line"] == "end", verdict
    assert out.startswith("FAIL ") and ":end: [kv_covers_computed]" in out, out


def test_require_idle_fails_in_one_line_naming_the_requests_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, an `OK ...` line came first, so a CI job grepping for `^OK` passed."""
    lines = recorded_lines()
    step_ends = [i for i, line in enumerate(lines) if '"ar_step_end"' in line]
    cut = lines[: step_ends[1] + 1]  # a step boundary, work left
    code, out, verdict = check(tmp_path, capsys, cut, "--require-idle")
    assert code == 1, out
    assert out.count("\n") == 1 and out.startswith("FAIL "), out
    assert "but the log ends with work still running (--require-idle): " in out, out
    assert "running ('r0', 'r1')" in out, out
    assert verdict["verdict"] == "incomplete" and verdict["running_at_end"] == ["r0", "r1"]


def test_a_violation_names_its_event_and_request_for_a_dashboard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = recorded_lines()
    at = next(i for i, line in enumerate(lines) if '"ar_scheduled"' in line)
    bad = json.loads(lines[at])
    bad["num_tokens"] = 99  # more than the request has known
    lines[at] = json.dumps(bad) + "\n"
    code, out, verdict = check(tmp_path, capsys, lines)
    assert code == 1, out
    assert verdict["rule"] == "no_compute_past_known", verdict
    assert verdict["event_kind"] == "ar_scheduled" and verdict["request_id"] == bad["request_id"]
    assert verdict["line"] == at + 1 and verdict["events"] == at - 1, verdict
    assert verdict["steps"] == 0, verdict


def test_an_input_error_replaces_an_earlier_verdict_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An engine killed mid-line: the last line is cut. Before, the run exited 2 and left the
    previous run's `"verdict": "pass"` file in place."""
    lines = recorded_lines()
    code, _, verdict = check(tmp_path, capsys, lines)
    assert code == 0 and verdict["verdict"] == "pass"
    cut = [*lines[:-1], lines[-1][: len(lines[-1]) // 2]]
    code, out, verdict = check(tmp_path, capsys, cut)
    assert code == 2, out
    assert verdict["verdict"] == "error" and verdict["exit"] == 2, verdict
    error = verdict["error"]
    assert isinstance(error, str) and f"log.jsonl:{len(lines)}: not JSON: " in error, error
    assert "the line opens an object it never closes: a log cut while it was written?" in error
    assert error in out, out


def test_an_ar_header_without_its_family_is_told_to_add_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = recorded_lines()
    header = json.loads(lines[0])
    del header["family"]
    lines[0] = json.dumps(header) + "\n"
    code, out, _ = check(tmp_path, capsys, lines)
    assert code == 2 and 'a header without "family" is a dLLM one, so add "family": "ar"' in out
    code, out, _ = check(tmp_path, capsys, lines, "--family", "ar")
    assert code == 2, out
    assert 'its header line has no "family", which makes it a dllm header; for an ar log add' in out
