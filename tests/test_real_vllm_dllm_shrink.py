"""Shrinking failing programs of vLLM's diffusion path over vLLM itself
(`integrations.vllm.dllm_shrink`, `scripts/vllm_dllm_shrink.py`): each of the path's two findings
shrinks to a smaller program that still breaks `canvas_whole` in its loop, reproduces from the
printed source and passes with the finding's fix; a seeded bug shrinks to one request; a trace
changes no verdict; the check script prints the shrink command of each rule broken.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.diffusion import (
    DllmProgram,
    DllmRequest,
    DllmServing,
    dllm_program,
    run_dllm,
)
from integrations.vllm.dllm_shrink import dllm_fails_like, run_dllm_named, shrink_dllm
from integrations.vllm.program_tally import release_selector
from integrations.vllm.shrink import size
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.vllm_seeded_bugs import under_allocate

NAMES = {"DllmProgram": DllmProgram, "DllmServing": DllmServing, "DllmRequest": DllmRequest}


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def test_a_seeded_bug_shrinks_to_one_request() -> None:
    """Allocations one token short fail `kv_covers_scheduled` with any request whose prompt
    needs a block more than one token less: the first program it fails shrinks to one
    request, and the run with the bug as `mutate` still fails."""

    def fails(candidate: DllmProgram) -> EngineCoreViolation | None:
        try:
            run_dllm(candidate, async_scheduling=False, mutate=under_allocate)
        except EngineCoreViolation as err:
            return err if err.rule == "kv_covers_scheduled" else None
        return None

    program = next(p for p in map(dllm_program, range(40)) if size(p)[0] > 1 and fails(p))
    result = shrink_dllm(program, fails)
    assert size(result.program)[0] == 1, size(result.program)
    assert fails(result.program) is not None


@pytest.mark.parametrize(
    ("argv", "loop", "fix"),
    [
        (["--seed", "6", "--budget-binds"], "sync", "whole-canvas"),
        (["--seed", "0", "--reach-model-len"], "async", "model-len-hold"),
    ],
    ids=["token-budget", "model-len"],
)
def test_the_script_shrinks_each_finding_that_still_needs_its_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], loop: str, fix: str
) -> None:
    """The first program of each finding's space breaks `canvas_whole` in its loop. Shrunk under
    `--lifted-by` its fix, it has fewer requests and tokens and no abort; the printed program,
    run as printed, breaks the same rule with the same message in the same loop, and passes
    with the fix."""
    script = load_script("vllm_dllm_shrink")
    out = tmp_path / "shrunk.json"
    assert script.main([*argv, "--lifted-by", fix, "--json", str(out)]) == 1
    printed = capsys.readouterr().out
    assert f"[canvas_whole] {loop} loop:" in printed.splitlines()[0], printed
    data = json.loads(out.read_text())
    assert data["path"] == "diffusion" and data["loop"] == loop and not data["exhausted"]
    assert data["rule"] == "canvas_whole" and data["lifted_by"] == fix
    before, after = data["size_before"], data["size_after"]
    assert after["requests"] < before["requests"] and after["tokens"] * 5 < before["tokens"]
    assert after["aborts"] == 0, data
    program = eval(data["program"], dict(NAMES))
    with pytest.raises(EngineCoreViolation) as caught:
        run_dllm_named(program, loop == "async")
    assert caught.value.rule == "canvas_whole" and caught.value.detail == data["shrunk"]
    run_dllm_named(program, loop == "async", [fix])


def test_the_script_has_nothing_to_shrink_in_a_passing_program(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = load_script("vllm_dllm_shrink")
    assert script.main(["--seed", "0"]) == 0
    assert "breaks any rule in neither loop run: nothing to shrink" in capsys.readouterr().out


def test_the_script_refuses_a_fix_that_does_not_lift_the_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The token budget's cut is not the async model-len cut: with `--lifted-by
    model-len-hold` program 6 still fails, and there is nothing to shrink (exit 0)."""
    script = load_script("vllm_dllm_shrink")
    argv = ["--seed", "6", "--budget-binds", "--lifted-by", "model-len-hold"]
    assert script.main(argv) == 0
    assert "still breaks a rule with model-len-hold: nothing to shrink" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--seed", "1", "--budget", "0"],
        ["--seed", "-1"],
        ["--seed", "1", "--rule", "nonsense"],
        ["--seed", "1", "--lifted-by", "nonsense"],
        ["--seed", "1", "--loop", "sync", "--pipeline-parallel", "2"],
    ],
)
def test_the_script_refuses_bad_arguments(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    script = load_script("vllm_dllm_shrink")
    with pytest.raises(SystemExit) as leaving:
        script.main(argv)
    assert leaving.value.code == 2
    err = capsys.readouterr().err
    # one line, no usage block before it (tests/test_shrink_cli.py: every usage error)
    assert err.count("\n") == 1 and err.startswith("scripts/vllm_dllm_shrink.py: error: "), err


def test_a_trace_changes_no_verdict_and_says_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    """With a trace kept, 20 programs of the token-budget finding's space run exactly as without
    one in both loops; `--trace` prints the shrunk program's run: its submissions, its calls
    with their canvases, ending at the violation."""
    for seed in range(20):
        program = dllm_program(seed, budget_binds=True)
        for async_scheduling in (False, True):
            results = []
            traces: tuple[list[str] | None, ...] = (None, [])
            for trace in traces:
                try:
                    results.append(
                        repr(run_dllm(program, async_scheduling=async_scheduling, trace=trace))
                    )
                except EngineCoreViolation as err:
                    results.append(str(err))
            assert results[0] == results[1], seed
    script = load_script("vllm_dllm_shrink")
    argv = ["--seed", "6", "--budget-binds", "--lifted-by", "whole-canvas", "--trace"]
    assert script.main(argv) == 1
    printed = capsys.readouterr().out
    run = printed[printed.index("its run in the sync loop:") :].splitlines()[1:]
    assert run[0].startswith("  step 0: submit r"), run
    assert any("with a canvas of" in line for line in run), run
    assert run[-1].startswith("  violation: [canvas_whole] sync loop:"), run


def test_the_check_script_prints_the_shrink_command_of_each_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`scripts/vllm_dllm_check.py --budget-binds` fails program 6 (exit 1) and prints the
    command that shrinks it under the same options; with the fix it prints none."""
    check = load_script("vllm_dllm_check")
    assert check.main(["--programs", "7", "--budget-binds"]) == 1
    lines = capsys.readouterr().out.splitlines()
    command = (
        f"shrink [canvas_whole]: {release_selector()}.venv/bin/python "
        "scripts/vllm_dllm_shrink.py --seed 6 "
        "--rule canvas_whole --budget-binds"
    )
    assert command in lines, lines
    assert check.main(["--programs", "7", "--budget-binds", "--whole-canvas-fix"]) == 0
    assert not any(line.startswith("shrink [") for line in capsys.readouterr().out.splitlines())


def test_a_fix_name_that_is_not_a_diffusion_fix_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown diffusion fixes"):
        run_dllm_named(dllm_program(0), False, ["uncache-preempted"])
    assert dllm_fails_like(False, "canvas_whole")(dllm_program(0)) is None
