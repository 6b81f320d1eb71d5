"""The release gate refuses CPU runs, mismatches, leaks, thin coverage, and every way of
fooling it: a summary that disagrees with its cases, repeated prompts, held rows, a leaked_rows
field left out, a device name torch would never report, too few new tokens, cases without golden
agreement, no run at batch size > 1, a report produced for another implementation. A file that
is not a parity report is an input error (exit 2, one line), never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from schedspec_cli.main import main
from schedspec_cli.release import release_problems
from spec.parity import RELEASE_MIN_NEW_TOKENS

ROOT = Path(__file__).resolve().parents[1]


def report(**changes: object) -> dict[str, Any]:
    cases: list[dict[str, Any]] = [
        {
            "algorithm": a,
            "index": i,
            "prompt": f"prompt {i}",
            "max_new_tokens": RELEASE_MIN_NEW_TOKENS,
            "identical": True,
            "identical_outputs": True,
            "identical_digests": True,
            "mismatched": [],
            "golden": True,
        }
        for a in ("LowConfidence", "JointThreshold")
        for i in range(3)
    ]
    base: dict[str, Any] = {
        "impl": "engine",
        "device": "cuda:0",
        "batch_sizes": [1, 4],
        "identical": True,
        "leaked_slots": 0,
        "leaked_rows": 0,
        "cases": cases,
    }
    base.update(changes)
    return base


def check(tmp_path: Path, data: object, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    p = tmp_path / "parity.json"
    p.write_text(json.dumps(data))
    code = main(["release-check", str(p)])
    cap = capsys.readouterr()
    return code, cap.out + cap.err


def test_a_good_cuda_run_qualifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert release_problems(report()) == []
    code, out = check(tmp_path, report(), capsys)
    assert code == 0 and "release run OK" in out
    assert check(tmp_path, report(device="cuda"), capsys)[0] == 0


def test_cpu_runs_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(tmp_path, report(device="cpu"), capsys)
    assert code == 1 and "must run on CUDA" in out


def test_a_device_name_torch_never_reports_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = check(tmp_path, report(device="cudaXYZ-fake"), capsys)
    assert code == 1 and "not a device name torch reports" in out


def test_mismatch_leak_and_coverage_are_refused() -> None:
    assert any("byte-identical" in x for x in release_problems(report(identical=False)))
    assert any("leaked_slots=3" in x for x in release_problems(report(leaked_slots=3)))
    one_algo = report(cases=[c for c in report()["cases"] if c["algorithm"] == "LowConfidence"])
    assert any("JointThreshold" in x for x in release_problems(one_algo))


def test_a_summary_that_disagrees_with_its_cases_is_refused() -> None:
    for flag in ("identical", "identical_outputs", "identical_digests"):
        r = report()
        r["cases"][4][flag] = False
        problems = release_problems(r)
        assert any("summary says identical but 1 case(s) differ" in x for x in problems), flag
    r = report()
    r["cases"][0]["mismatched"] = ["fdfo"]
    assert any("case(s) differ" in x for x in release_problems(r))


def test_repeated_prompts_are_refused() -> None:
    r = report()
    for c in r["cases"]:
        c["prompt"] = "the same prompt"
    problems = release_problems(r)
    assert any("repeated prompts" in x for x in problems)
    assert any("1 distinct prompts; at least 3" in x for x in problems)


def test_held_rows_are_refused() -> None:
    assert any("leaked_rows=2" in x for x in release_problems(report(leaked_rows=2)))


def test_a_report_that_leaves_out_leaked_rows_is_not_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    r = report()
    del r["leaked_rows"]
    code, out = check(tmp_path, r, capsys)
    assert code == 2 and "report.leaked_rows" in out and "Traceback" not in out


def test_too_few_new_tokens_are_refused() -> None:
    r = report()
    for c in r["cases"]:
        c["max_new_tokens"] = RELEASE_MIN_NEW_TOKENS - 1
    assert any(f"fewer than {RELEASE_MIN_NEW_TOKENS} new tokens" in x for x in release_problems(r))


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b"\xff\xfe\x00binary",
        json.dumps(report(cases="many")).encode(),
        json.dumps(report(leaked_slots="0")).encode(),
        json.dumps(report(identical="yes")).encode(),
        json.dumps(report(cases=[{"algorithm": 1}])).encode(),
    ],
)
def test_malformed_files_are_input_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    p = tmp_path / "parity.json"
    p.write_bytes(content)
    assert main(["release-check", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_docs_quote_the_token_threshold_from_the_code() -> None:
    """Every doc that states the gate's token minimum states RELEASE_MIN_NEW_TOKENS' value."""
    quoted = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"RELEASE_MIN_NEW_TOKENS`?\s*(?:=|is)\s*(\d+)", text):
            quoted.append((doc.name, int(m.group(1))))
        for m in re.finditer(r"gate[^.\n]{0,80}?≥ ?(\d+) new tokens", text):
            quoted.append((doc.name, int(m.group(1))))
    assert ("release.md", RELEASE_MIN_NEW_TOKENS) in quoted, quoted
    assert all(n == RELEASE_MIN_NEW_TOKENS for _, n in quoted), quoted


def test_cases_without_golden_agreement_are_refused() -> None:
    r = report()
    r["cases"][4]["golden"] = False
    assert any("1 case(s) lack golden agreement" in x for x in release_problems(r))
    r = report()
    for c in r["cases"]:
        del c["golden"]  # a report written before the golden oracle
    assert any("6 case(s) lack golden agreement" in x for x in release_problems(r))


@pytest.mark.parametrize("sizes", [[1], [], None, ["4"]])
def test_a_run_without_a_batch_above_one_is_refused(sizes: object) -> None:
    r = report(batch_sizes=sizes)
    if sizes is None:
        del r["batch_sizes"]
    assert any("batch size > 1" in x for x in release_problems(r))


@pytest.mark.parametrize(
    ("impl", "argv", "expected"),
    [
        ("reference-dllm", [], "produced for implementation 'reference-dllm', not for --impl "),
        ("engine", ["--impl", "my.module:factory"], "not for --impl 'my.module:factory'"),
        (None, [], "does not say which implementation"),
    ],
)
def test_a_report_for_another_implementation_is_refused_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    impl: str | None,
    argv: list[str],
    expected: str,
) -> None:
    r = report(impl=impl)
    if impl is None:
        del r["impl"]
    p = tmp_path / "parity.json"
    p.write_text(json.dumps(r))
    code = main(["release-check", *argv, str(p)])
    out = capsys.readouterr().out
    assert code == 1 and expected in out and out.count("\n") == 1, out


def test_the_named_implementation_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "parity.json"
    p.write_text(json.dumps(report(impl="my.module:factory")))
    assert main(["release-check", "--impl", "my.module:factory", str(p)]) == 0
    assert "release run OK: my.module:factory on cuda:0" in capsys.readouterr().out


@pytest.mark.parametrize(
    "recorded", sorted(p.name for p in (ROOT / "docs").glob("parity-cuda-*.json"))
)
def test_the_recorded_gpu_runs_pass_todays_gate(
    recorded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every CUDA parity report kept in docs/ as release evidence still qualifies under the
    gate as it is now (a stricter gate would otherwise leave the docs citing a run it refuses)."""
    code = main(["release-check", str(ROOT / "docs" / recorded)])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("release run OK: engine on cuda"), out
