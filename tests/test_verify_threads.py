"""`schedspec verify --impl ... --threads N`: torch's intra-op threads while checking.

By default a checking process runs torch on one thread, since two verify runs of the torch
engine at once on a 2-core machine, each with torch's default thread per core, both failed
`[progress]` with a drain past the call deadline (docs/implementers.md, section 8). The flag
sets another count, 0 leaves torch's own; a run that does not load torch never imports it and
leaves the count to `OMP_NUM_THREADS` for an implementation that imports torch later."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schedspec_cli.main import main

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def two_threads() -> Iterator[None]:
    """torch on two threads before the run (its default on the 2-core machine), restored
    after: the test modules of the engine pin one."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("flags", "threads"), [([], 1), (["--threads", "3"], 3)])
def test_an_engine_run_sets_torchs_threads(
    two_threads: None, flags: list[str], threads: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "--impl", "engine", "--examples", "2", *flags]) == 0
    assert torch.get_num_threads() == threads
    assert "PASS" in capsys.readouterr().out


def test_zero_leaves_torchs_own_count(
    two_threads: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["verify", "--impl", "engine", "--examples", "2", "--threads", "0"]) == 0
    assert torch.get_num_threads() == 2
    assert "OMP_NUM_THREADS" not in os.environ
    capsys.readouterr()


def _run_without_torch(*flags: str) -> list[str]:
    """A plain-Python implementation's run in a fresh interpreter: its exit code, the
    OMP_NUM_THREADS it leaves and whether torch got imported."""
    code = (
        "import os, sys\n"
        "from schedspec_cli.main import main\n"
        f"rc = main(['verify', '--impl', 'reference-dllm', '--examples', '2', *{list(flags)!r}])\n"
        "print(rc, os.environ.get('OMP_NUM_THREADS'), 'torch' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1].split()


def test_a_run_without_torch_never_imports_it() -> None:
    assert _run_without_torch() == ["0", "1", "False"]
    assert _run_without_torch("--threads", "0") == ["0", "None", "False"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--threads", "2"], "invalid --threads=2: only with --impl NAME"),
        (["--impl", "engine", "--threads", "-1"], "-1 is out of range (valid: 0..4096)"),
        (["--impl", "engine", "--threads", "two"], "'two' is not an integer"),
    ],
)
def test_a_bad_threads_flag_is_a_usage_error(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


def test_the_main_jobs_conformance_checks_on_one_thread_and_gives_the_count_back(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from properties.verify import VerifyResult, verify_implementation
    from schedspec_cli import main_job

    seen: dict[str, int] = {}
    real = verify_implementation  # what main_job calls

    def counting(name: str, *args: Any, **kwargs: Any) -> VerifyResult:
        seen[name] = torch.get_num_threads()
        return real(name, *args, **kwargs)

    monkeypatch.setattr(main_job, "verify_implementation", counting)
    passed, summary, _ = main_job.step_conformance(4)
    assert passed, summary
    assert seen and set(seen.values()) == {1}, seen
    assert "engine" in seen
    assert torch.get_num_threads() == 2  # the parity and bench steps keep their own count
