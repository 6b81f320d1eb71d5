"""The implementer guide's code is real: its adapter type-checks under mypy --strict, passes the
conformance suite, and its pytest snippet runs in a separate project exactly as shown."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "implementers.md"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def test_guide_adapter_typechecks_and_conforms(tmp_path: Path) -> None:
    adapter, user_test = python_blocks(GUIDE)[:2]
    (tmp_path / "my_scheduler.py").write_text(adapter, encoding="utf-8")
    (tmp_path / "test_my_scheduler.py").write_text(user_test, encoding="utf-8")
    mypy = subprocess.run(
        [str(Path(sys.executable).parent / "mypy"), "--strict", "my_scheduler.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        # an editable install is invisible to mypy; a regular install needs no MYPYPATH
        env={"MYPYPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert mypy.returncode == 0, mypy.stdout + mypy.stderr
    # run the user's test file as an outside project would: its own pytest, its own rootdir
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_scheduler.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "1 passed" in res.stdout


def test_spec_reference_doc_is_current() -> None:
    from spec.docs import render

    assert (ROOT / "docs" / "spec.md").read_text(encoding="utf-8") == render(), (
        "docs/spec.md is stale: run `python -m spec.docs > docs/spec.md`"
    )
