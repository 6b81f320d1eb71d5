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


def guide_files() -> dict[str, str]:
    """The guide's code blocks, under the file names the guide gives them."""
    adapter, user_test, ar_adapter = python_blocks(GUIDE)[:3]
    return {
        "my_scheduler.py": adapter,
        "test_my_scheduler.py": user_test,
        "my_ar_scheduler.py": ar_adapter,
    }


def mypy_strict(cwd: Path, *files: str) -> None:
    """`mypy --strict` on the user's files in `cwd` passes, with this checkout as the library."""
    mypy = subprocess.run(
        [str(Path(sys.executable).parent / "mypy"), "--strict", *files],
        cwd=cwd,
        capture_output=True,
        text=True,
        # an editable install is invisible to mypy; a regular install needs no MYPYPATH
        env={"MYPYPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert mypy.returncode == 0, mypy.stdout + mypy.stderr


def test_guide_adapter_typechecks_and_conforms(tmp_path: Path) -> None:
    for name, text in guide_files().items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    mypy_strict(tmp_path, "my_scheduler.py", "my_ar_scheduler.py")
    # run the user's test file as an outside project would: its own pytest, its own rootdir
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_scheduler.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "1 passed" in res.stdout


def test_guide_ar_adapter_verifies_from_the_command_line(tmp_path: Path) -> None:
    """`schedspec verify --impl my_ar_scheduler:TINY_AR`, run where the module lives, as the
    guide says (no PYTHONPATH), passes; so does the bare factory, its family read from its
    annotation."""
    (tmp_path / "my_ar_scheduler.py").write_text(guide_files()["my_ar_scheduler.py"])
    schedspec = Path(sys.executable).parent / "schedspec"
    for target in ("my_ar_scheduler:TINY_AR", "my_ar_scheduler:make_tiny_ar"):
        res = subprocess.run(
            [str(schedspec), "verify", "--impl", target, "--examples", "30"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert " ar " in res.stdout and "PASS" in res.stdout


def run_example_and_variant(tmp_path: Path, example: str, variant: str) -> str:
    """The example type-checks under mypy --strict and runs as shown (exit 0); the variant
    exits 1: its standard error is returned for the caller to read."""
    assert variant != example
    (tmp_path / "example.py").write_text(example, encoding="utf-8")
    (tmp_path / "variant.py").write_text(variant, encoding="utf-8")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    mypy_strict(tmp_path, "example.py")
    runs = [
        subprocess.run(
            [sys.executable, name], cwd=tmp_path, capture_output=True, text=True, env=env
        )
        for name in ("example.py", "variant.py")
    ]
    assert runs[0].returncode == 0, runs[0].stderr[-3000:]
    assert runs[1].returncode == 1, runs[1].stderr[-3000:]
    return runs[1].stderr


def test_guide_check_trace_example_runs_and_catches_a_violation(tmp_path: Path) -> None:
    """The guide's `check_trace(lines)` example type-checks and runs as shown; with one
    violating event appended to its log, its own assertion fails naming that line."""
    (example,) = [b for b in python_blocks(GUIDE) if "check_trace(lines)  # a path works too" in b]
    broken = example.replace(
        "result = check_trace(lines)",
        "from spec.events import KvFreed\n\n"
        'lines.append(json.dumps(event_to_dict(KvFreed("r0", (0,)))))\n'
        "result = check_trace(lines)",
    )
    stderr = run_example_and_variant(tmp_path, example, broken)
    # the appended free is what fails, reported with its line
    assert re.search(r"AssertionError: line \d+: \[free_owned_only\] 'r0' freed slot 0", stderr)


def test_guide_declared_policy_example_runs_and_fails_without_the_declaration(
    tmp_path: Path,
) -> None:
    """The guide's declared-policy example type-checks and runs as shown; with the header's
    declaration taken out, the idealised spec refuses the engine's prefill-first admission."""
    (example,) = [b for b in python_blocks(GUIDE) if "config_to_dict(config, policy)" in b]
    undeclared = example.replace("config_to_dict(config, policy)", "config_to_dict(config)")
    stderr = run_example_and_variant(tmp_path, example, undeclared)
    assert re.search(r"AssertionError: line \d+: \[fcfs_admission\] ", stderr), stderr


def test_spec_reference_doc_is_current() -> None:
    from spec.docs import render

    assert (ROOT / "docs" / "spec.md").read_text(encoding="utf-8") == render(), (
        "docs/spec.md is stale: run `python -m spec.docs > docs/spec.md`"
    )
