"""Every `test_finding_*` is marked `finding` (tests/conftest.py), so an engine's own CI that
fixes a finding runs the conformance tests without the reproductions of released behaviour:
`pytest -m "not finding"`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _collected(expression: str) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", expression, "tests/test_real_sglang.py"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return [line for line in run.stdout.splitlines() if "::" in line]


def test_findings_are_marked_and_can_be_left_out() -> None:
    findings, others = _collected("finding"), _collected("not finding")
    assert findings and all("::test_finding_" in line for line in findings), findings
    assert others and not any("::test_finding_" in line for line in others), others
