"""The implementer guide's code is real: its adapter type-checks under mypy --strict, passes the
conformance suite, and its pytest snippet runs in a separate project exactly as shown."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "implementers.md"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def guide_files() -> dict[str, str]:
    """The guide's code blocks, under the file names the guide gives them (each block's first
    line names its file, in a docstring or a comment: `my_scheduler.py: ...`,
    `# test_my_scheduler.py, in your repository`)."""
    files: dict[str, str] = {}
    for block in python_blocks(GUIDE):
        named = re.match(r'(?:"""|# )(\w+\.py)[:,]', block)
        if named:
            files[named.group(1)] = block
    return files


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


def user_pytest(cwd: Path, test_file: str, profile: str = "") -> subprocess.CompletedProcess[str]:
    """The user's test file run as an outside project would: its own pytest, its own rootdir,
    `$SCHEDSPEC_PROFILE` set to `profile` when given."""
    env = {"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"}
    if profile:
        env["SCHEDSPEC_PROFILE"] = profile
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
    )


def test_the_guide_names_every_file_it_shows() -> None:
    assert {
        "my_scheduler.py",
        "test_my_scheduler.py",
        "my_ar_scheduler.py",
        "test_my_ar_scheduler.py",
        "test_replay.py",
        "test_my_scheduler_deadline.py",
    } <= set(guide_files())


@pytest.mark.parametrize("test_file", ["test_my_scheduler.py", "test_my_ar_scheduler.py"])
def test_guide_adapter_typechecks_and_conforms(tmp_path: Path, test_file: str) -> None:
    for name, text in guide_files().items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    mypy_strict(tmp_path, "my_scheduler.py", "my_ar_scheduler.py", test_file)
    res = user_pytest(tmp_path, test_file)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "1 passed" in res.stdout


def test_guide_per_class_deadline_typechecks_and_sets_its_deadline(tmp_path: Path) -> None:
    """Section 3's class with a deadline of its own passes mypy --strict (the guide's earlier
    way, subclassing the generated TestCase, did not: valid-type, misc) and its tests run under
    that deadline."""
    files = guide_files()
    for name in ("my_scheduler.py", "test_my_scheduler_deadline.py"):
        (tmp_path / name).write_text(files[name], encoding="utf-8")
    mypy_strict(tmp_path, "my_scheduler.py", "test_my_scheduler_deadline.py")
    probe = (
        "import sys, unittest\n"
        "from properties.deadline import call_timeout\n"
        "import test_my_scheduler_deadline as t\n"
        "seen = []\n"
        "t.TestTinyWithin5s.runTest = lambda self: seen.append(call_timeout())\n"
        "assert unittest.TextTestRunner().run(t.TestTinyWithin5s()).wasSuccessful()\n"
        "print(seen, call_timeout())\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout == "[5] 60.0\n", res.stdout


# A seeded bug in the guide's adapter: it never says it freed a request's slots.
LEAK = ("            self.sink(KvFreed(rid, tuple(slots)))", "            pass  # seeded: a leak")
REPRODUCE = re.compile(r"@reproduce_failure\('([^']+)', (b'[^']+')\)")


def test_guide_replay_of_a_printed_failure_reproduces_it(tmp_path: Path) -> None:
    """The guide's pytest file, on the adapter with a seeded leak, fails under the ci profile
    and prints a `@reproduce_failure` line; the guide's replay file, given that line's version
    and blob, fails alike on its first example. On the fixed adapter it does not reproduce."""
    files = guide_files()
    adapter = files["my_scheduler.py"]
    assert adapter.count(LEAK[0]) == 1
    (tmp_path / "my_scheduler.py").write_text(adapter.replace(*LEAK), encoding="utf-8")
    (tmp_path / "test_my_scheduler.py").write_text(files["test_my_scheduler.py"], encoding="utf-8")
    failed = user_pytest(tmp_path, "test_my_scheduler.py", profile="ci")
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    assert "[terminal_owns_nothing]" in failed.stdout, failed.stdout[-3000:]
    printed = REPRODUCE.search(failed.stdout)
    assert printed is not None, failed.stdout[-3000:]
    replay = re.sub(
        r'reproduce_failure\("[^"]+", b"[^"]+"\)',
        lambda _: f'reproduce_failure("{printed.group(1)}", {printed.group(2)})',
        files["test_replay.py"],
    )
    assert replay != files["test_replay.py"]
    (tmp_path / "test_replay.py").write_text(replay, encoding="utf-8")
    mypy_strict(tmp_path, "test_replay.py")
    replayed = user_pytest(tmp_path, "test_replay.py")
    assert replayed.returncode == 1, replayed.stdout[-3000:] + replayed.stderr[-3000:]
    assert "[terminal_owns_nothing]" in replayed.stdout, replayed.stdout[-3000:]
    (tmp_path / "my_scheduler.py").write_text(adapter, encoding="utf-8")  # the bug fixed
    fixed = user_pytest(tmp_path, "test_replay.py")
    assert fixed.returncode == 1 and "DidNotReproduce" in fixed.stdout, fixed.stdout[-3000:]


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
