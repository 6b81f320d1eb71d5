"""A complete install: the wheel carries every subpackage and asset, and works from a fresh
virtual environment outside the repository, the way a user installs it.

The wheel is built from a copy of the source tree (so the checkout is never written to), then
installed with `pip install --no-deps` into a new environment, beside the declared dependencies
(hypothesis, z3-solver, numpy — from pip's cache; torch is an extra and never installed). There,
from the user's own directory: `--version`, `list-impls` (every built-in), `prove --bound 2`,
`simulate sbs`, and a dLLM and an AR adapter written as docs/implementers.md says, verified with
`schedspec verify --impl my_module:attr` (no PYTHONPATH), the shipped seeded bugs caught, and
`check-trace` on a recorded log, as a file and piped to `-`. What an implementer's and an
engine's CI run there: `mypy --strict` on the adapters against the installed package, and the
guide's own pytest file. Without torch,
`parity` and `verify --impl engine` are one line naming the `engine` extra, a real engine that
runs on torch one line saying to install torch, and without matplotlib `simulate --plots` one
line naming the `plots` extra.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from integrations.manifest import cache_root
from integrations.vidur import MANIFEST as VIDUR
from integrations.vllm import MANIFEST as VLLM
from reference.ar.seeded_bugs import AR_SEEDED_BUGS
from reference.seeded_bugs import SEEDED_BUGS
from schedspec_cli.registry import BUILTINS
from tests.engine_gate import require_engine
from tests.test_docs_examples import guide_files

# one worker under run-tests' --dist loadgroup: the wheel is built and installed (`installed`)
# once, not once per worker
pytestmark = pytest.mark.xdist_group("install-wheel")

ROOT = Path(__file__).resolve().parents[1]
PY = Path(sys.executable)
SKIP = shutil.ignore_patterns(
    ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "reports", "out"
)
SUBPACKAGES = (
    "spec/ar/__init__.py",
    "reference/ar/__init__.py",
    "reference/sim/__init__.py",
    "properties/ar/__init__.py",
    "properties/sim/__init__.py",
    "properties/symbolic/__init__.py",
    "integrations/__init__.py",
    "schedspec_cli/main.py",
    "gpu/assets/model.safetensors",
    "gpu/assets/prompts.json",
    "spec/py.typed",
    "schedspec_cli/py.typed",
)


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def install_wheel(base: Path, extras: tuple[str, ...] = ()) -> tuple[Path, dict[str, str], Path]:
    """Build the wheel from a copy of the source tree and install it with `--no-deps` into a
    new virtual environment under `base`, after the declared dependencies and `extras` (more
    requirements, installed first and pinned as constraints.txt pins them). Returns the wheel,
    the environment to run the venv's commands with, and the user's directory (outside the
    repository, holding the guide's two adapters)."""
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=SKIP)
    env = {"PATH": f"{PY.parent}:/usr/bin:/bin", "HOME": os.environ.get("HOME", str(base))}
    build = run(
        [str(PY), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", "dist", "."],
        src,
        env,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = (src / "dist").glob("schedspec-*.whl")
    venv = base / "venv"
    made = run([str(PY), "-m", "venv", "--without-pip", str(venv)], base, env)
    assert made.returncode == 0, made.stderr
    vpy = venv / "bin" / "python"
    pip = [str(PY), "-m", "pip", "--python", str(vpy), "install", "--quiet"]
    if extras:
        more = run([*pip, "-c", str(ROOT / "constraints.txt"), *extras], base, env)
        assert more.returncode == 0, more.stderr[-2000:]
    deps = run([*pip, "hypothesis>=6.100", "z3-solver>=4.12", "numpy>=1.26"], base, env)
    assert deps.returncode == 0, deps.stderr[-2000:]
    inst = run([*pip, "--no-deps", str(wheel)], base, env)
    assert inst.returncode == 0, inst.stderr[-2000:]
    user = base / "user"  # the user's own project directory, outside the repository
    user.mkdir()
    for name in ("my_scheduler.py", "my_ar_scheduler.py"):
        (user / name).write_text(guide_files()[name], encoding="utf-8")
    uenv = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(base)}
    return wheel, uenv, user


def venv_python(env: dict[str, str]) -> Path:
    """The fresh venv's interpreter, from the environment `install_wheel` returns (its bin
    directory leads PATH)."""
    return Path(env["PATH"].split(os.pathsep)[0]) / "python"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    return install_wheel(tmp_path_factory.mktemp("wheel"))


def schedspec(
    installed: tuple[Path, dict[str, str], Path], *args: str
) -> subprocess.CompletedProcess[str]:
    _, env, user = installed
    return run(["schedspec", *args], user, env)


def test_the_wheel_carries_every_subpackage_and_asset(
    installed: tuple[Path, dict[str, str], Path],
) -> None:
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [p for p in SUBPACKAGES if p not in names]
    assert not missing, missing
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "schedspec_cli.main:entry" in zipfile.ZipFile(wheel).read(entry).decode()


def test_installed_commands_run_outside_the_repo(
    installed: tuple[Path, dict[str, str], Path],
) -> None:
    _, env, user = installed
    res = run(["python", "-c", "import schedspec_cli, spec; print(spec.__file__)"], user, env)
    assert res.returncode == 0 and "site-packages" in res.stdout, res.stdout + res.stderr
    assert run(["python", "-c", "import torch"], user, env).returncode != 0  # never pulled in
    version = schedspec(installed, "--version")
    assert version.returncode == 0 and version.stdout.startswith("schedspec "), version.stderr
    listing = schedspec(installed, "list-impls")
    assert listing.returncode == 0, listing.stderr
    for name in BUILTINS:
        assert any(line.startswith(name + " ") for line in listing.stdout.splitlines()), name
    # the installed package's Z3 path, on the families that solve in seconds: the inductive
    # ones (about 20 s of solving) and the seeded mutants' run in tests/test_z3_proofs.py
    families = ("bmc", "theorems", "boundary")
    prove = schedspec(installed, "prove", "--bound", "2", *(f"--family={f}" for f in families))
    assert prove.returncode == 0, prove.stdout[-2000:] + prove.stderr[-2000:]
    assert "proved" in prove.stdout
    sim = schedspec(installed, "simulate", "sbs")
    assert sim.returncode == 0, sim.stdout[-2000:] + sim.stderr[-2000:]
    # the shipped rounds report is read from the installed package, per algorithm
    dllm = ["simulate", "dllm", "--algorithm", "JointThreshold", "--seats", "1", "--requests", "2"]
    sim = schedspec(installed, *dllm, "--gen-blocks", "1")
    assert sim.returncode == 0, sim.stdout[-2000:] + sim.stderr[-2000:]
    assert "rounds_report.json:JointThreshold (block 8)" in sim.stderr, sim.stderr[-2000:]
    # --plots without the plots extra: refused before the simulation runs, in either spelling
    for flag in (["--plots", str(user / "plots")], [f"--plots={user / 'plots'}"]):
        plots = schedspec(installed, "simulate", "sbs", *flag)
        assert plots.returncode == 2 and "schedspec[plots]" in plots.stderr, plots.stderr
        assert "Traceback" not in plots.stderr and not (user / "plots").exists()
    parity = schedspec(installed, "parity", "--device", "cpu", "--prompts", "1")
    assert parity.returncode == 2 and "schedspec[engine]" in parity.stderr, parity.stderr
    assert "Traceback" not in parity.stderr
    # the torch engine's built-in, too (it used to say only "No module named 'torch'")
    engine = schedspec(installed, "verify", "--impl", "engine", "--examples", "2")
    assert engine.returncode == 2 and "schedspec[engine]" in engine.stderr, engine.stderr
    # the main job serves the engine in three of its steps: refused before the first one runs
    main_job = schedspec(installed, "verify", "--report", str(user / "verify-report"))
    assert main_job.returncode == 2 and "schedspec[engine]" in main_job.stderr, main_job.stderr
    assert not (user / "verify-report").exists()


def test_guide_adapters_verify_from_the_users_directory(
    installed: tuple[Path, dict[str, str], Path],
) -> None:
    for args in (
        ("--impl", "my_scheduler:TINY", "--mode", "sync"),
        ("--impl", "my_ar_scheduler:TINY_AR"),
        ("--impl", "reference.ar.vidur:make_vidur_vllm"),
    ):
        res = schedspec(installed, "verify", *args, "--examples", "20")
        assert res.returncode == 0, f"{args}\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
        assert "PASS" in res.stdout


def test_the_shipped_seeded_bugs_fail_from_the_wheel(
    installed: tuple[Path, dict[str, str], Path],
) -> None:
    """The README tour's seeded bug, and an AR one, run from an install (they used to live only
    in the checkout's `tests/`, so the tour's command said "No module named 'tests'")."""
    for bug in (SEEDED_BUGS[0], AR_SEEDED_BUGS[2]):
        res = schedspec(installed, "verify", "--impl", bug.target, "--examples", "100")
        assert res.returncode == 1, f"{bug.target}\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
        assert f"[{bug.rule}]" in res.stdout, res.stdout[-3000:]


@pytest.mark.parametrize("seed", [(), ("--seed", "5")], ids=["fixed", "seed-5"])
def test_an_installed_verify_draws_the_programs_a_checkout_draws(
    installed: tuple[Path, dict[str, str], Path], tmp_path: Path, seed: tuple[str, ...]
) -> None:
    """The same command runs the same programs from the wheel as from a checkout, with or
    without `--seed`. Hypothesis mines constants from loaded modules outside `site-packages/`,
    which a checkout's are: until the command line stopped drawing them, `verify --impl
    vidur-orca --examples 100` ran 120 examples from the wheel and 115 from a checkout
    (`tests/test_verify_draws.py`)."""
    argv = ("verify", "--impl", "vidur-orca", "--examples", "100", *seed, "--json")
    wheel = schedspec(installed, *argv, str(tmp_path / "wheel.json"))
    assert wheel.returncode == 0, wheel.stdout[-2000:] + wheel.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SCHEDSPEC_PROFILE", None)
    checkout = run([str(PY), "-m", "schedspec_cli.main", *argv, "checkout.json"], tmp_path, env)
    assert checkout.returncode == 0, checkout.stdout[-2000:] + checkout.stderr[-2000:]
    ran = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in ("wheel", "checkout")}
    drawn = {n: (r["examples"], r["steps"], r["seed"]) for n, r in ran.items()}
    assert drawn["wheel"] == drawn["checkout"], drawn


def test_a_users_mypy_checks_the_guide_adapters_against_the_installed_wheel(
    installed: tuple[Path, dict[str, str], Path], tmp_path: Path
) -> None:
    """What an implementer's CI does: `mypy --strict` on their adapters, resolving `spec` from
    the environment the wheel is installed in (`--python-executable`; no MYPYPATH, no checkout).
    It needs the wheel's `py.typed` markers: with spec's removed from the installed package, the
    same run fails with "module is installed, but missing library stubs or py.typed marker"
    (checked by hand)."""
    _, env, user = installed
    python = venv_python(env)
    argv = [str(PY.parent / "mypy"), "--strict", "--python-executable", str(python)]
    argv += ["--cache-dir", str(tmp_path / "mypy-cache"), "my_scheduler.py", "my_ar_scheduler.py"]
    res = run(argv, user, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Success: no issues found in 2 source files" in res.stdout, res.stdout


def test_the_guides_pytest_suite_runs_against_the_installed_wheel(
    installed: tuple[Path, dict[str, str], Path],
) -> None:
    """What a serving engine's CI does: its own pytest file (the guide's `test_my_scheduler.py`)
    builds the conformance suite's TestCase from the installed `properties` and runs it, with
    pytest installed beside the wheel (as the engine's CI has it) and no checkout on the path."""
    _, env, user = installed
    python = venv_python(env)
    pip = [str(PY), "-m", "pip", "--python", str(python), "install", "--quiet"]
    got = run([*pip, "-c", str(ROOT / "constraints.txt"), "pytest"], user, env)
    assert got.returncode == 0, got.stderr[-2000:]
    (user / "test_my_scheduler.py").write_text(guide_files()["test_my_scheduler.py"])
    argv = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_scheduler.py"]
    res = run(argv, user, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "1 passed" in res.stdout, res.stdout[-2000:]


def test_an_installed_verify_reports_a_hang_instead_of_hanging(
    installed: tuple[Path, dict[str, str], Path],
) -> None:
    _, _, user = installed
    (user / "my_hanging.py").write_text(
        "from reference.dllm import ReferenceDllmScheduler\n"
        "from spec import DllmConfig\n\n\n"
        "class Hangs(ReferenceDllmScheduler):\n"
        "    def run_round(self) -> None:\n"
        "        while True:\n"
        "            pass\n\n\n"
        "def make_hanging(config: DllmConfig, sink):\n"
        "    return Hangs(config, sink)\n",
        encoding="utf-8",
    )
    argv = ("verify", "--impl", "my_hanging:make_hanging", "--call-timeout", "1")
    res = schedspec(installed, *argv, "--examples", "5")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "violation of [progress]" in res.stdout
    assert "did not return from run_round within 1 s" in res.stdout


@pytest.mark.parametrize("family", ["dllm", "ar"])
def test_installed_check_trace_reads_a_file_and_a_pipe(
    installed: tuple[Path, dict[str, str], Path], family: str
) -> None:
    """The installed `check-trace` on a recorded log with one violating event appended: the
    file and the same bytes piped to `-` fail at that line; the log without it passes, and
    decides as its recorder's twin under its recorder's profile."""
    from tests.test_check_trace_stream import _violating_trace

    _, env, user = installed
    data, bad_line = _violating_trace(user, family)
    good = data[: data.rstrip(b"\n").rindex(b"\n") + 1]
    log = user / f"{family}-events.jsonl"
    for body, code in ((data, 1), (good, 0)):
        log.write_bytes(body)
        for args, stdin in ((["check-trace", str(log)], None), (["check-trace", "-"], body)):
            res = subprocess.run(
                ["schedspec", *args], cwd=user, env=env, input=stdin, capture_output=True
            )
            out = res.stdout.decode()
            assert res.returncode == code, out + res.stderr.decode()
            name = "<stdin>" if stdin is not None else str(log)
            expect = f"FAIL {name}:{bad_line}: " if code else f"OK {name}: "
            assert out.startswith(expect), out
    # the log's decisions against its twin, and under its recorder's profile
    twin = "reference-dllm" if family == "dllm" else "vllm-v1"
    argv = ["schedspec", "check-trace", str(log), "--profile", twin, "--twin", twin]
    twinned = subprocess.run(argv, cwd=user, env=env, capture_output=True, text=True)
    assert twinned.returncode == 0, twinned.stdout + twinned.stderr
    assert f"its twin {twin} decides alike in all" in twinned.stdout


def test_a_real_engine_that_runs_on_torch_says_to_install_torch(
    installed: tuple[Path, dict[str, str], Path],
) -> None:
    """vLLM's engine directory holds no torch: it runs on the environment's. Without it the
    command says to install torch, not to reinstall the engine (which would not help), and
    `list-impls` shows the install as one that needs torch."""
    require_engine(VLLM, "vllm", "vLLM")
    _, env, user = installed
    env = {**env, "SCHEDSPEC_ENGINE_CACHE": str(cache_root())}
    res = run(["schedspec", "verify", "--impl", "real-vllm", "--examples", "2"], user, env)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "No module named 'torch'" in res.stderr, res.stderr
    assert "pip install torch==2.13.0" in res.stderr and "--force" not in res.stderr, res.stderr
    # and list-impls says so beforehand; Vidur, which never imports torch, is simply installed
    listing = run(["schedspec", "list-impls"], user, env)
    rows = {line.split()[0]: line for line in listing.stdout.splitlines() if line.strip()}
    assert "installed, needs torch: pip install 'schedspec[engine]'" in rows["real-vllm"], rows
    require_engine(VIDUR, "vidur", "Vidur")
    assert "needs torch" not in rows["real-vidur-vllm"] and "installed" in rows["real-vidur-vllm"]
