"""The reference passes the conformance suite (both algorithms), and the CLI reports it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from properties.conformance import conformance_machine
from properties.verify import verify_settings as _verify_settings
from reference.dllm import (
    REFERENCE_DLLM_PREFILL_FIRST,
    REFERENCE_DLLM_PRIORITY,
    REFERENCE_DLLM_ROWS_RELEASED,
    make_joint_threshold_scheduler,
    make_scheduler,
    make_scripted_scheduler,
)
from reference.sglang_dllm import SGLANG_DLLM_ORDER
from schedspec_cli.main import main
from spec.implementation import DllmImplementation


@pytest.mark.parametrize(
    "factory",
    [make_scheduler, make_joint_threshold_scheduler, make_scripted_scheduler],
    ids=["LowConfidence", "JointThreshold", "scripted"],
)
def test_reference_conforms(factory) -> None:  # type: ignore[no-untyped-def]
    run_state_machine_as_test(conformance_machine(factory), settings=settings())


@pytest.mark.parametrize(
    "impl",
    [
        REFERENCE_DLLM_PREFILL_FIRST,
        REFERENCE_DLLM_ROWS_RELEASED,
        REFERENCE_DLLM_PRIORITY,
        SGLANG_DLLM_ORDER,
    ],
    ids=["prefill-first", "rows-released", "priority", "sglang-order"],
)
def test_reference_conforms_under_its_policy(impl: DllmImplementation) -> None:
    """The reference's policy variants pass the suite under their own profiles (the spec
    machine takes the profile's policy, so PREFILL_FIRST, row release and priority order are
    checked)."""
    machine = conformance_machine(impl.factory, profile=impl.profile)
    run_state_machine_as_test(machine, settings=settings())


def test_cli_verify_json(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "v.json"
    code = main(["verify", "--impl", "reference-dllm", "--examples", "20", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["passed"] is True and data["impl"] == "reference-dllm"
    assert data["examples"] >= 20 and data["failures"] == []
    assert "PASS" in capsys.readouterr().out


def no_shrink(examples: int, seed_derandomize: bool = True) -> settings:
    """verify's settings without the shrink phase: these tests check the CLI's plumbing;
    shrinking is checked by tests/test_mutants.py."""
    base = _verify_settings(examples, seed_derandomize)
    return settings(base, phases=[Phase.explicit, Phase.reuse, Phase.generate])


def test_cli_verify_fails_on_a_mutant_by_import_string(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("properties.verify.verify_settings", no_shrink)
    out = tmp_path / "v.json"
    code = main(
        [
            "verify",
            "--impl",
            "reference.seeded_bugs:no_free_on_finish",
            "--examples",
            "100",
            "--json",
            str(out),
        ]
    )
    assert code == 1
    data = json.loads(out.read_text())
    assert data["passed"] is False
    assert data["failures"][0]["rule"] == "terminal_owns_nothing"
    assert "state.submit(" in data["failures"][0]["program"]
    assert "FAIL" in capsys.readouterr().out


def test_cli_rejects_unknown_impl(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["verify", "--impl", "nonesuch"]) == 2
    assert "reference-dllm" in capsys.readouterr().err


def test_cli_list_impls(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["list-impls"]) == 0
    assert "reference-dllm" in capsys.readouterr().out
