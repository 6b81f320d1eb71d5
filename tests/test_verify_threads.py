"""`--threads N` of `schedspec verify --impl ...`, `parity` and `bench conformance`: torch's
intra-op threads while checking.

By default a checking process runs torch on one thread, since two verify runs of the torch
engine at once on a 2-core machine, each with torch's default thread per core, both failed
`[progress]` with a drain past the call deadline, and two parity runs at once took up to five
times as long (docs/implementers.md, section 8). The flag sets another count, 0 leaves torch's
own; a run that does not load torch never imports it and leaves the count to `OMP_NUM_THREADS`
for an implementation that imports torch later. Parity and benchmark reports record the count."""

from __future__ import annotations

import json
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


def _run_without_torch(*argv: str) -> list[str]:
    """A plain-Python implementation's run in a fresh interpreter: its exit code, the
    OMP_NUM_THREADS it leaves and whether torch got imported."""
    code = (
        "import os, sys\n"
        "from schedspec_cli.main import main\n"
        f"rc = main({list(argv)!r})\n"
        "print(rc, os.environ.get('OMP_NUM_THREADS'), 'torch' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1].split()


VERIFY_REFERENCE = ("verify", "--impl", "reference-dllm", "--examples", "2")
PARITY_REFERENCE = ("parity", "--impl", "reference-dllm", "--prompts", "2")
BENCH_REFERENCE = ("bench", "conformance", "--impl", "reference-dllm", "--examples", "2")


@pytest.mark.parametrize(
    "argv", [VERIFY_REFERENCE, PARITY_REFERENCE, BENCH_REFERENCE], ids=["verify", "parity", "bench"]
)
def test_a_run_without_torch_never_imports_it(argv: tuple[str, ...]) -> None:
    assert _run_without_torch(*argv) == ["0", "1", "False"]
    assert _run_without_torch(*argv, "--threads", "0") == ["0", "None", "False"]


# a small parity run of each torch path: the shipped engine (gpu.parity) and a built-in engine
# under the CLI's own parity (schedspec_cli.parity_impl)
PARITY_RUNS = {
    "shipped": ["--prompts", "1", "--algorithm", "LowConfidence", "--max-new-tokens", "8"],
    "engine-lof": ["--impl", "engine-lof", "--prompts", "2", "--max-new-tokens", "8"],
}


def _parity(run: str, flags: list[str], json_path: Path) -> dict[str, Any]:
    """The JSON report of a small parity run; every run in it identical to sync at batch size
    1 (the seeded prompt p000's golden may differ by a float tie, docs/engine.md)."""
    assert main(["parity", *PARITY_RUNS[run], *flags, "--json", str(json_path)]) in (0, 1)
    report: dict[str, Any] = json.loads(json_path.read_text(encoding="utf-8"))
    assert report["identical"] and report["leaked_slots"] == report["leaked_rows"] == 0
    return report


@pytest.mark.parametrize("run", sorted(PARITY_RUNS))
@pytest.mark.parametrize(("flags", "threads"), [([], 1), (["--threads", "3"], 3)])
def test_a_parity_run_sets_torchs_threads_and_reports_them(
    two_threads: None,
    run: str,
    flags: list[str],
    threads: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _parity(run, flags, tmp_path / "p.json")["threads"] == threads
    assert torch.get_num_threads() == threads
    capsys.readouterr()


@pytest.mark.parametrize("run", sorted(PARITY_RUNS))
def test_a_parity_run_with_zero_leaves_torchs_own_count(
    two_threads: None,
    run: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert _parity(run, ["--threads", "0"], tmp_path / "p.json")["threads"] == 2
    assert torch.get_num_threads() == 2
    assert "OMP_NUM_THREADS" not in os.environ
    capsys.readouterr()


@pytest.mark.parametrize(("flags", "threads"), [([], 1), (["--threads", "0"], 2)])
def test_the_conformance_benchmark_checks_as_verify_does_and_reports_the_count(
    two_threads: None,
    flags: list[str],
    threads: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "conformance", "--impl", "engine", "--examples", "2", *flags]
    assert main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["threads"] == threads and report["rows"][0]["passed"], report
    assert torch.get_num_threads() == threads
    capsys.readouterr()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["verify", "--threads", "2"], "invalid --threads=2: only with --impl NAME"),
        (["verify", "--impl", "engine", "--threads", "-1"], "-1 is out of range (valid: 0..4096)"),
        (["verify", "--impl", "engine", "--threads", "two"], "'two' is not an integer"),
        (["parity", "--threads", "-1"], "-1 is out of range (valid: 0..4096)"),
        (["parity", "--impl", "engine-lof", "--threads", "1.5"], "'1.5' is not an integer"),
        (["bench", "conformance", "--threads", "4097"], "4097 is out of range (valid: 0..4096)"),
    ],
)
def test_a_bad_threads_flag_is_a_usage_error(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


SOME_BUILTINS = {"reference-dllm", "vllm-v1", "engine"}


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
    # a pure-Python dLLM built-in, an AR one and the torch engine (each of the engine's five
    # built-ins runs at least 10 examples: all of them took 12 s)
    some = {n: b for n, b in main_job.all_builtins().items() if n in SOME_BUILTINS}
    monkeypatch.setattr(main_job, "all_builtins", lambda: some)
    passed, summary, _ = main_job.step_conformance(4)
    assert passed, summary
    assert seen and set(seen.values()) == {1}, seen
    assert set(seen) == SOME_BUILTINS, seen
    assert torch.get_num_threads() == 2  # the parity and bench steps keep their own count
