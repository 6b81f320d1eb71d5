"""Every shell command shown in README.md and docs/ runs as written.

Commands are taken from the ```bash blocks. `./schedspec` runs the installed console script
(the wrapper only adds first-use set-up). They run in a scratch directory that holds what the
docs assume the reader has (their own `my_scheduler.py` and `my_ar_scheduler.py` from the
implementer guide, an engine's event log). A command the docs say fails (a seeded bug) must
fail; a CUDA command on a machine without CUDA must stop with a typed error, not a traceback.
A command the docs show passing runs at most `EXAMPLES_HERE` examples: its flags, target and
verdict are checked as written, and the depth of each implementation's search is its own
test's (tests/test_conformance_reference.py, tests/test_real_vllm.py, ...), not the tour's.
No wall-clock limit is asserted (a loaded machine is slow, not wrong); pytest-timeout's hang
guard (1 hour per command) still applies.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tier import depth

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SCHEDSPEC = Path(sys.executable).parent / "schedspec"

#: The most examples a passing doc command runs here (the README's tour asks for up to 200): 30
#: in the full tier, 15 per push (tests/tier.py).
EXAMPLES_HERE = depth(15, 30)

# commands not run here, and why
NOT_RUN = {
    "./run-tests": "it is this test suite itself (CI runs it)",
    "./schedspec verify": "the main job; run by tests/test_main_job.py with smaller settings",
    # a minute of solving that CI would do twice: tests/test_z3_proofs.py checks the same
    # run (`run_all_proofs` at the default bound) and tests/test_install_wheel.py runs
    # `schedspec prove --bound 2` from the wheel (the bmc, theorems and boundary families)
    "./schedspec prove": "every Z3 proof, checked in-process by tests/test_z3_proofs.py",
    # multi-minute measurements whose recorded output is in docs/engine-benchmarks.md; the same
    # code paths run in tests/test_engine_conformance.py and tests/test_engine_units.py on small
    # inputs
    "./schedspec verify --impl engine --impl gpu.engine:make_small_joint_engine "
    "--impl gpu.engine:make_engine --examples 150": "about 5 minutes on 2 cores",
    "./schedspec bench engine --max-running 4 16 --repeats 5 --threads 1 "
    "--json docs/engine-bench-cpu.json": "a benchmark of several minutes",
    "./schedspec bench engine --forward-bound --max-running 4 16 --repeats 5 --threads 1 "
    "--json docs/engine-forward-bound-cpu.json": "a replay of about 2 minutes "
    "(tests/test_forward_bound.py runs it on a small workload)",
    # the same replay at 3 repeats on a busy machine (docs/engine-benchmarks.md): 30 s and
    # 55 s of a push's worker time for figures no test reads
    "./schedspec bench engine --forward-bound --max-running 4 16 --repeats 3 --threads 1 "
    "--json docs/engine-forward-bound-busy-cpu-epyc512-32.json": "a replay of about 30 s "
    "(tests/test_forward_bound.py runs it on a small workload)",
    "./schedspec bench engine --forward-bound --max-running 4 16 --max-new-tokens 128 "
    "--repeats 3 --threads 1 --json docs/engine-forward-bound-busy-cpu-epyc512-128.json": "a "
    "replay of about a minute (tests/test_forward_bound.py runs it on a small workload)",
    # the real vLLM scheduler at 500 examples takes minutes; tests/test_real_vllm.py runs the
    # same machine and profile with 20 examples per push (40 in the full tier), and the
    # README's tour runs it with 100
    # the engine's parity runs eight engines per algorithm and the golden decoding (minutes on
    # 2 cores); the README's 4-prompt run and tests/test_engine_parity.py cover the same path
    "./schedspec parity --device cpu --algorithm all --max-new-tokens 32 "
    "--json out/parity-cpu.json": "a minute or more (31 prompts x 8 engines x 2 algorithms)",
    "./schedspec parity --device cpu --algorithm all --prompts 8 --max-new-tokens 128 "
    "--json out/parity-cpu-128.json": "several minutes (128 tokens x 8 engines x 2 algorithms)",
    "./schedspec parity --device cpu --algorithm all --max-new-tokens 128 "
    "--json out/parity-cpu-128-full.json": "a minute or more (31 prompts x 128 tokens x 8 "
    "engines x 2 algorithms)",
    "./schedspec verify --impl real-vllm --examples 500": "several minutes (real vLLM)",
    # every built-in at 200 examples: half a minute to a minute of CI; tests/test_cli_twin.py,
    # test_cli_verify_seed.py and test_verify_threads.py run `bench conformance` on less
    "./schedspec bench conformance --examples 200": "a benchmark of every built-in",
    "./schedspec verify --impl real-vllm-prefix --examples 500": "several minutes (real vLLM)",
}


def shell_commands() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            for line in block.splitlines():
                cmd = line.split("  #")[0].strip()
                if cmd and not cmd.startswith("#"):
                    out.append((doc.name, cmd))
    return out


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.test_docs_examples import guide_files

    wd = tmp_path_factory.mktemp("reader")
    for name in ("my_scheduler.py", "my_ar_scheduler.py"):
        (wd / name).write_text(guide_files()[name], encoding="utf-8")
    # an "engine's" event log: the reference's, written in the documented JSONL format
    from properties.harness import Harness
    from reference.dllm import make_scheduler
    from spec import DllmConfig, RequestSpec
    from spec.trace import config_to_dict, write_events

    cfg = DllmConfig(block_size=2, page_size=4, kv_pages=4, max_context=8)
    h = Harness(make_scheduler, cfg)
    h.submit(RequestSpec("a", (1, 2, 3), 3))
    h.drain()
    buf = io.StringIO()
    write_events(h.events, buf)
    (wd / "engine-events.jsonl").write_text(
        json.dumps(config_to_dict(cfg)) + "\n" + buf.getvalue(), encoding="utf-8"
    )
    return wd


@pytest.mark.timeout(3600)  # a hang guard, not a performance assertion
@pytest.mark.parametrize(("doc", "command"), shell_commands())
def test_doc_command_runs_as_written(doc: str, command: str, workdir: Path) -> None:
    if command in NOT_RUN:
        pytest.skip(NOT_RUN[command])
    argv = shlex.split(command)
    assert argv[0] == "./schedspec", f"{doc}: unexpected command {command!r}"
    # the reader's own modules are found because the current directory is importable (no
    # PYTHONPATH for them); ROOT is there for the checkout's packages, as `./schedspec` finds them
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if "release-check" in argv and not (workdir / argv[-1]).exists():
        pytest.skip("needs the CUDA parity JSON of the previous command")
    expected = 1 if "seeded bug: FAILS" in _line_comment(doc, command) else 0
    if expected == 0:
        argv = _at_most(argv, EXAMPLES_HERE)
    res = subprocess.run(
        [str(SCHEDSPEC), *argv[1:]],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
    )
    out = res.stdout + res.stderr
    if "--device" in argv and "cuda" in argv and not cuda_available():
        assert res.returncode == 2 and "CUDA" in out and "Traceback" not in out, out[-2000:]
        return
    assert res.returncode == expected, f"{doc}: {command}\n{out[-3000:]}"
    assert "Traceback" not in out, out[-3000:]


def _at_most(argv: list[str], examples: int) -> list[str]:
    """`argv` with its `--examples N` lowered to `examples` where N is larger (a seeded bug's
    command keeps its count: the docs promise it fails within that many)."""
    if "--examples" not in argv:
        return argv
    at = argv.index("--examples") + 1
    return [*argv[:at], str(min(int(argv[at]), examples)), *argv[at + 1 :]]


def test_a_passing_commands_examples_are_capped_and_a_seeded_bugs_kept() -> None:
    argv = ["./schedspec", "verify", "--impl", "x", "--examples", "200", "--json", "o.json"]
    assert _at_most(argv, 30) == [*argv[:5], "30", *argv[6:]]
    assert _at_most([*argv[:5], "12"], 30) == [*argv[:5], "12"]
    assert _at_most(["./schedspec", "simulate", "sbs"], 30) == ["./schedspec", "simulate", "sbs"]


def _line_comment(doc: str, command: str) -> str:
    for path in DOCS:
        if path.name == doc:
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip().startswith(command):
                    return line
    return ""


def test_every_command_not_run_is_shown_in_the_docs() -> None:
    """A command left out here is one the docs show: an entry for a command since changed
    or removed would skip nothing and hide that the new one runs."""
    shown = {command for _, command in shell_commands()}
    assert not set(NOT_RUN) - shown, sorted(set(NOT_RUN) - shown)
