"""Shrinking failing engine-core programs over vLLM itself (`integrations.vllm.shrink`,
`scripts/vllm_shrink.py`): a seeded bug shrinks to the one request it needs, and a finding of
docs/engines/vllm.md shrinks to a smaller program that still breaks its rule, reproduces from the
printed source and passes with the finding's fix.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import CoreProgram, LoopOptions, core_program, run_loop
from integrations.vllm.kv_load_fixes import KV_LOAD_FIXES
from integrations.vllm.patches import ScheduleFix
from integrations.vllm.shrink import fails_like, shrink, size
from spec.ar.config import ArConfig, ArRequest, Policy
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.vllm_seeded_bugs import under_allocate


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def test_a_seeded_bug_shrinks_to_one_request() -> None:
    """Allocations one token short fail `kv_covers_scheduled` with any request whose prompt
    needs a block more than one token less: program 0's eight requests shrink to one."""
    program = core_program(0)
    fails = fails_like(LoopOptions(mutate=under_allocate), True, "kv_covers_scheduled")
    result = shrink(program, fails)
    assert size(program)[0] == 8 and size(result.program)[0] == 1, size(result.program)
    err = fails(result.program)
    assert err is not None and "holds" in err.detail


def test_the_script_shrinks_a_finding_that_still_needs_its_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Program 132 over the offload store breaks `cache_hit_written` in the synchronous loop
    (blocks computed over a failed block stay cached). Shrunk with `--lifted-by
    evict-failed-blocks`, it has half the requests and no abort; the printed program, run with
    the printed draw seed, breaks the same rule in the same loop, and passes with
    `evict-failed-blocks`, the fix of that finding."""
    script = load_script("vllm_shrink")
    out = tmp_path / "shrunk.json"
    argv = ["--seed", "132", "--kv-connector", "recompute", "--kv-store", "offload"]
    argv += ["--lifted-by", "evict-failed-blocks"]
    assert script.main([*argv, "--json", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "program 132 (random): [cache_hit_written] sync loop:" in printed, printed
    data = json.loads(out.read_text())
    assert data["loop"] == "sync" and data["rule"] == "cache_hit_written" and not data["exhausted"]
    assert data["lifted_by"] == "evict-failed-blocks"
    before, after = data["size_before"], data["size_after"]
    assert after["requests"] * 2 <= before["requests"] and after["aborts"] == 0, data
    names = {"CoreProgram": CoreProgram, "ArConfig": ArConfig, "ArRequest": ArRequest}
    program = eval(data["program"], {**names, "Policy": Policy})
    options = LoopOptions(kv_connector="recompute", kv_store="offload", draw_seed=data["draw_seed"])
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(program, async_scheduling=False, options=options)
    assert caught.value.rule == "cache_hit_written" and caught.value.detail == data["shrunk"]
    (evict,) = (f for f in KV_LOAD_FIXES.fixes if f.name == "evict-failed-blocks")
    fixed = LoopOptions(
        kv_connector="recompute",
        kv_store="offload",
        draw_seed=data["draw_seed"],
        fix=ScheduleFix(evict).apply,
    )
    run_loop(program, async_scheduling=False, options=fixed)


def test_the_script_has_nothing_to_shrink_in_a_passing_program(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = load_script("vllm_shrink")
    assert script.main(["--seed", "1"]) == 0
    assert "breaks any rule in neither loop run: nothing to shrink" in capsys.readouterr().out


def test_the_script_refuses_a_fix_that_does_not_lift_the_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Program 132's cache finding is not the speculative padding's: with `--lifted-by
    pad-what-fits` it still fails, and there is nothing to shrink (exit 0)."""
    script = load_script("vllm_shrink")
    argv = ["--seed", "132", "--kv-connector", "recompute", "--kv-store", "offload"]
    assert script.main([*argv, "--lifted-by", "pad-what-fits"]) == 0
    assert "still breaks a rule with pad-what-fits: nothing to shrink" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [["--seed", "1", "--budget", "0"], ["--seed", "-1"], ["--seed", "1", "--rule", "nonsense"]],
)
def test_the_script_refuses_bad_arguments(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    script = load_script("vllm_shrink")
    with pytest.raises(SystemExit) as leaving:
        script.main(argv)
    assert leaving.value.code == 2
    err = capsys.readouterr().err
    # one line, no usage block before it (tests/test_shrink_cli.py: every usage error)
    assert err.count("\n") == 1 and err.startswith("scripts/vllm_shrink.py: error: "), err


def test_flags_vllm_refuses_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`--speculative-tokens 99999`: vLLM refuses program 0's configuration with it (an output
    index past the adapter's token ids) and serves program 0 without it. The user's flags made
    vLLM refuse: exit 2 and one line saying so, not "nothing to shrink" and exit 0 (found by a
    review)."""
    script = load_script("vllm_shrink")
    with pytest.raises(SystemExit) as leaving:
        script.main(["--seed", "0", "--speculative-tokens", "99999"])
    assert leaving.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(
        "scripts/vllm_shrink.py: error: vLLM refuses program 0 (random) with the flags given, "
        "and serves it without them in the sync loop: invalid output index=4098: 0..4095"
    ), err
    assert "; valid: " in err, err


def test_a_trace_changes_no_verdict_and_says_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    """With a trace kept, the first 20 programs over the offload store run exactly as without
    one in both loops; `--trace` prints the shrunk program's run, its submissions, calls,
    outputs and connector events, ending at the violation."""
    options = LoopOptions(kv_connector="recompute", kv_store="offload")
    for seed in range(20):
        program = core_program(seed)
        for async_scheduling in (False, True):
            results = []
            traces: tuple[list[str] | None, ...] = (None, [])
            for trace in traces:
                try:
                    ran = run_loop(
                        program,
                        async_scheduling=async_scheduling,
                        options=replace(options, trace=trace),
                    )
                    results.append(repr(ran))
                except EngineCoreViolation as err:
                    results.append(str(err))
            assert results[0] == results[1], seed
    script = load_script("vllm_shrink")
    argv = ["--seed", "132", "--kv-connector", "recompute", "--kv-store", "offload", "--trace"]
    assert script.main([*argv, "--lifted-by", "evict-failed-blocks"]) == 1
    printed = capsys.readouterr().out
    run = printed[printed.index("its run in the sync loop:") :].splitlines()[1:]
    assert run[0].startswith("  step 0: submit r0: ")
    assert any("connector: synchronous load of" in line for line in run)
    assert any("reported failed in block" in line for line in run)
    assert run[-1].startswith("  violation: [cache_hit_written] sync loop: ")
