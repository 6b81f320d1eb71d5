"""`schedspec verify --impl X --twin NAME|module:attribute`: every example ends by running its
operations through a decision twin that replays the run's step outcomes; the two must admit and
forward alike (rule `twin_decisions`). The twin is named in the table, the JSON and report.md.
Bad `--twin` values are exit 2 in one line (tests/test_cli_bad_inputs.py); real engines with
their twins: tests/test_real_sglang.py and tests/test_engine_conformance.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from properties.verify import ArTwin, DllmTwin
from reference.dllm import (
    LONGEST_OUTPUT_FIRST_TWIN,
    PREFILL_FIRST_TWIN,
    PRIORITY_TWIN,
    REFERENCE_TWIN,
    ROWS_RELEASED_TWIN,
)
from reference.prefix_cache import CACHED_TWIN
from reference.sglang_dllm import (
    SGLANG_ORDER_LOF_TWIN,
    SGLANG_ORDER_PRIORITY_LOF_TWIN,
    SGLANG_ORDER_PRIORITY_TWIN,
    SGLANG_ORDER_TWIN,
)
from schedspec_cli.main import main
from schedspec_cli.registry import BUILTINS
from schedspec_cli.twins import resolve_twin, twin_names
from spec.implementation import Family
from spec.profile import DllmAdmission
from tests.tier import full_tier


def test_an_implementation_that_decides_as_its_twin_passes_and_the_twin_is_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scripted reference denoises otherwise than the plain one, but decides by the same
    policy: replayed through the reference's twin, every example decides alike."""
    out, report = tmp_path / "v.json", tmp_path / "report"
    argv = ["verify", "--impl", "reference-dllm-scripted", "--twin", "reference-dllm"]
    assert main([*argv, "--examples", "40", "--json", str(out), "--report", str(report)]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[-1] == "twin", header
    data = json.loads(out.read_text())
    assert data["passed"] and data["twin"] == "reference-dllm" and data["examples"] >= 40, data
    md = (report / "report.md").read_text()
    assert "Decision twin (rule `twin_decisions`): reference-dllm" in md


def test_a_twin_of_another_policy_fails_the_run_by_twin_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The FCFS reference checked against the PREFILL_FIRST twin: a program where a prompt-only
    request waits behind another is found, and the message names the round and both
    decisions. Without --twin the same run passes (the suite alone cannot tell policies apart
    here: both are inside the idealised spec)."""
    out = tmp_path / "v.json"
    # found within 5 examples; the control without --twin runs every one of them
    argv = ["verify", "--impl", "reference-dllm", "--examples", "30", "--mode", "sync"]
    assert main([*argv, "--twin", "reference-dllm-prefill-first", "--json", str(out)]) == 1
    data = json.loads(out.read_text())
    assert data["rules"] == ["twin_decisions"], data["rules"]
    message = data["failures"][0]["message"]
    shape = r"\[twin_decisions\] round \d+: the implementation (admits|forwards) .*, its twin \1 "
    assert re.match(shape, message), message
    assert "state.configure(" in data["failures"][0]["program"]
    capsys.readouterr()
    assert main(argv) == 0


def test_a_module_attribute_twin_is_checked_under_the_implementations_profile(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A user's own twin: `module:attribute` naming a DecisionTwin. The PREFILL_FIRST reference
    passes against the PREFILL_FIRST twin named this way (checked under the implementation's
    PREFILL_FIRST profile)."""
    target = "reference.dllm:PREFILL_FIRST_TWIN"
    argv = ["verify", "--impl", "reference-dllm-prefill-first", "--twin", target]
    assert main([*argv, "--examples", "30"]) == 0
    assert target in capsys.readouterr().out
    resolved = resolve_twin(target, Family.DLLM)
    assert isinstance(resolved, DllmTwin)
    assert resolved.replay is PREFILL_FIRST_TWIN and resolved.profile is None


def test_each_builtin_twin_is_its_builtins_policy_under_its_builtins_profile() -> None:
    """`--twin NAME` loads the twin the registry names, checked under that built-in's own
    profile (so SGLang's order is checked as not work-conserving, whatever it checks)."""
    expected = {
        "reference-dllm": REFERENCE_TWIN,
        "reference-dllm-prefill-first": PREFILL_FIRST_TWIN,
        "reference-dllm-rows-released": ROWS_RELEASED_TWIN,
        "reference-dllm-priority": PRIORITY_TWIN,
        "reference-dllm-lof": LONGEST_OUTPUT_FIRST_TWIN,
        "reference-dllm-cached": CACHED_TWIN,
        "sglang-dllm-order": SGLANG_ORDER_TWIN,
        "sglang-dllm-order-priority": SGLANG_ORDER_PRIORITY_TWIN,
        "sglang-dllm-order-lof": SGLANG_ORDER_LOF_TWIN,
        "sglang-dllm-order-priority-lof": SGLANG_ORDER_PRIORITY_LOF_TWIN,
    }
    assert twin_names(Family.DLLM) == sorted(expected)
    for name, twin in expected.items():
        resolved = resolve_twin(name, Family.DLLM)
        assert isinstance(resolved, DllmTwin) and resolved.replay is twin, name
        assert resolved.profile is not None, name
    sglang = resolve_twin("sglang-dllm-order", Family.DLLM)
    assert isinstance(sglang, DllmTwin) and sglang.profile is not None
    assert sglang.profile.policy.admission is DllmAdmission.PREFILL_FIRST
    assert not sglang.profile.policy.work_conserving
    assert all(BUILTINS[n].family is Family.DLLM for n in expected)


# the full tier's: a benchmark's run; per push the twin's verdicts are the tests around it
@full_tier
def test_bench_conformance_measures_the_twins_cost_in_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench conformance --twin NAME`: each implementation runs the same derandomized programs
    without and with the twin, and the twin's row carries the cost as a ratio of the times per
    step (no wall-clock value is asserted: the ratio's presence and sense only)."""
    out = tmp_path / "b.json"
    argv = ["bench", "conformance", "--impl", "vllm-v1", "--twin", "vllm-v1", "--examples", "20"]
    assert main([*argv, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["twin"] for r in rows] == ["-", "vllm-v1"], rows
    assert rows[0]["steps"] == rows[1]["steps"] > 0  # the same programs
    assert rows[1]["twin_cost"] > 0 and "twin_cost" not in rows[0]
    assert "twin cost" in capsys.readouterr().out
    # a twin of another policy fails the benchmark run (exit 1): the rows say which
    argv = ["bench", "conformance", "--impl", "vllm-v1", "--examples", "50"]  # fails from 20
    assert main([*argv, "--twin", "reference.ar.vllm_v1:make_vllm_v1"]) == 1


def test_an_ar_twin_given_as_a_bare_factory_is_checked_under_the_implementations_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`vllm-v1`'s own factory named as `module:attribute` declares no policy; checked under the
    implementation's (vLLM 0.33's options), it decides alike. Under the idealised policy its
    lone-request threshold exemption would break `long_prefill_threshold`."""
    target = "reference.ar.vllm_v1:make_vllm_v1_033"
    assert main(["verify", "--impl", "vllm-v1", "--twin", target, "--examples", "100"]) == 0
    assert target in capsys.readouterr().out
    resolved = resolve_twin(target, Family.AR)
    assert isinstance(resolved, ArTwin) and resolved.policy is None
    builtin = resolve_twin("vllm-v1", Family.AR)
    assert isinstance(builtin, ArTwin) and builtin.policy is not None
    assert builtin.policy.lone_request_threshold_exempt


def test_verify_help_names_every_builtin_dllm_twin(capsys: pytest.CaptureFixture[str]) -> None:
    """`verify --help` lists the dLLM built-ins that declare a twin by hand: it names them all."""
    with pytest.raises(SystemExit) as exited:
        main(["verify", "--help"])
    assert exited.value.code == 0
    text = "".join(capsys.readouterr().out.split())  # argparse may wrap inside a name
    for name in twin_names(Family.DLLM):
        assert f"{name}," in text or f"{name};" in text, name


def test_a_twin_that_does_not_run_the_implementations_configurations_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The plain reference's twin runs no prefix cache; the cached reference runs nothing else:
    every example would fail `twin_decisions` saying nothing of the implementation, so the run
    is refused in one line naming what the twin lacks (as `check-trace` refuses a log's), and
    the twin that runs the cache passes (a review found the first reported as a finding)."""
    argv = ["verify", "--impl", "reference-dllm-cached", "--examples", "10"]
    assert main([*argv, "--twin", "reference-dllm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "reference-dllm declares no prefix_cache={True}" in err, err
    assert main([*argv, "--twin", "reference-dllm-cached"]) == 0


def test_mode_draws_inside_the_implementations_declared_space(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--mode` narrows the implementation's own space to that mode: the cached reference
    (page = block, the cache on) passes in fdfo, where configurations drawn from the any-space
    failed every example as outside its profile (a review's finding)."""
    argv = ["verify", "--impl", "reference-dllm-cached", "--examples", "20", "--mode", "fdfo"]
    assert main(argv) == 0, capsys.readouterr()


def test_an_ar_twin_that_does_not_run_the_implementations_policies_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Vidur's vLLM is FCFS only; the vLLM v1 re-implementation draws every policy: every
    example the twin refused ('the twin then stopped: ConfigError: invalid policy=...') failed
    as a difference (a review's finding, in its dLLM form)."""
    assert main(["verify", "--impl", "vllm-v1", "--twin", "vidur-vllm", "--examples", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vidur-vllm declares no policy={aging, fair" in err, err
