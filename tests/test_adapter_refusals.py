"""An adapter a user got partly wrong is refused, or reported, in the user's terms.

A reviewer's adapters, written from docs/implementers.md: a dLLM adapter without `config`, an
AR adapter without `rules` or with `rules = "fcfs"`, were each a violation of an exception's
type (`[ConfigError]`, `[AttributeError]`, `[ProfileError]`, exit 1) instead of refused before
any run (exit 2, one line naming the member); a `collect_outputs()` or `golden_output()`
returning the wrong type was reported as schedspec's own AttributeError (`at spec/machine.py
in check_outputs`, `at spec/golden.py in golden_mismatch`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from properties.adapter_check import adapter_refusal, require_adapter
from properties.ar.conformance import ar_conformance_machine
from properties.harness import Harness
from reference.ar.vllm_v1 import make_vllm_v1
from reference.dllm import make_scheduler
from schedspec_cli.main import main
from spec.adapter import SchedulerAdapter
from spec.ar.adapter import ArSchedulerAdapter
from spec.ar.config import ArConfig
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError, SpecViolation
from spec.events import FinishReason
from spec.machine import SpecMachine
from spec.snapshot import FinishedOutput
from tests import broken_adapters

DLLM = DllmConfig(
    block_size=2, page_size=2, kv_pages=8, req_pool_rows=2, max_running_requests=2, mode=Mode.FDFO
)
DLLM_MEMBERS = "(abort, config, drain, run_round, snapshot, submit)"
AR_MEMBERS = "(abort, config, drain, rules, snapshot, step, submit)"


def _verify(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    out = tmp_path / "verify.json"
    target = f"tests.broken_adapters:{name}"
    code = main(["verify", "--impl", target, "--examples", "3", "--json", str(out)])
    err = capsys.readouterr().err
    assert not out.exists(), "refused before any run: no report"
    return code, err


@pytest.mark.parametrize(
    ("name", "refusal"),
    [
        (
            "no_config",
            f"a factory returning a SchedulerAdapter {DLLM_MEMBERS}; it returned NoConfig, "
            "lacking config",
        ),
        (
            "config_as_dict",
            f"a factory returning a SchedulerAdapter {DLLM_MEMBERS}; it returned ConfigAsDict, "
            "whose config is the dict {'block_size': 1}, not a spec.DllmConfig",
        ),
        (
            "no_rules",
            f"a factory returning an ArSchedulerAdapter {AR_MEMBERS}; it returned NoRules, "
            "lacking rules",
        ),
        (
            "rules_as_text",
            f"a factory returning an ArSchedulerAdapter {AR_MEMBERS}; it returned RulesAsText, "
            "whose rules is the str 'fcfs', not a spec.ar.ArRules or None",
        ),
        (
            "not_an_adapter",
            f"a factory returning a SchedulerAdapter {DLLM_MEMBERS}; it returned dict, lacking "
            "abort, config, drain, run_round, snapshot, submit",
        ),
    ],
)
def test_verify_refuses_an_adapter_missing_or_mistyping_a_member(
    name: str, refusal: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before any run, exit 2, one line in the form docs/implementers.md section 8 shows."""
    code, err = _verify(name, tmp_path, capsys)
    assert code == 2, err
    assert err == f"schedspec: error: invalid impl='tests.broken_adapters:{name}': {refusal}\n"


def test_the_harness_refuses_an_ill_typed_config_in_the_same_words() -> None:
    """From pytest, where the harness builds the adapter, the same check and words."""
    with pytest.raises(ConfigError) as err:
        Harness(broken_adapters.config_as_dict, DLLM)
    assert str(err.value).startswith("invalid impl='config_as_dict': a factory returning a ")
    assert str(err.value).endswith("not a spec.DllmConfig"), err.value


def test_rules_none_and_a_forwarding_adapter_are_adapters() -> None:
    """`rules` may be None (the policy's defaults); members forwarded through `__getattr__`
    count, as they do for the calls."""
    ar = broken_adapters.Altered(make_vllm_v1(ArConfig(), print), rules=None)
    assert adapter_refusal(ar, ArSchedulerAdapter) is None
    dllm = broken_adapters.Altered(make_scheduler(DLLM, print))
    require_adapter(dllm, SchedulerAdapter, broken_adapters.no_config)


# ---------------------------------------------------------------- optional methods' returns
def _drained(factory: object) -> SpecViolation:
    harness = Harness(factory, DLLM)  # type: ignore[arg-type]
    harness.submit(RequestSpec("r0", (1, 2), 2))
    with pytest.raises(SpecViolation) as err:
        harness.drain()
    return err.value


def test_collect_outputs_returning_a_list_breaks_reported_output_saying_so() -> None:
    v = _drained(broken_adapters.outputs_as_list)
    assert v.rule == "reported_output", v
    assert v.detail == (
        "collect_outputs() returned list, not a Mapping of request id to spec.FinishedOutput"
    )


def test_collect_outputs_mapping_to_tuples_names_the_request() -> None:
    v = _drained(broken_adapters.outputs_as_tuples)
    assert v.rule == "reported_output", v
    assert v.detail == "collect_outputs()['r0'] is tuple, not a spec.FinishedOutput"


def test_a_reported_reason_of_the_wrong_type_is_named() -> None:
    spec = SpecMachine(DLLM)
    with pytest.raises(SpecViolation) as err:
        spec.check_outputs({"r0": FinishedOutput((1,), "length")})  # type: ignore[arg-type]
    assert err.value.detail == (
        "collect_outputs()['r0'] is a FinishedOutput whose reason is str, not a spec.FinishReason"
    )
    with pytest.raises(SpecViolation) as err:
        spec.check_outputs({"r0": FinishedOutput(None, FinishReason.LENGTH)})  # type: ignore[arg-type]
    assert "whose tokens is NoneType, not a tuple of token ids" in err.value.detail


@pytest.mark.parametrize(
    ("name", "got"), [("golden_as_none", "NoneType"), ("golden_as_tuple", "tuple")]
)
def test_golden_output_of_the_wrong_type_breaks_golden_output_saying_so(
    name: str, got: str
) -> None:
    v = _drained(getattr(broken_adapters, name))
    assert v.rule == "golden_output", v
    assert v.detail == f"golden_output(request 'r0') returned {got}, not a spec.FinishedOutput"


@pytest.mark.parametrize(
    ("name", "got"), [("golden_as_none", "NoneType"), ("golden_as_tuple", "tuple")]
)  # fmt: skip
def test_parity_impl_names_a_golden_output_of_the_wrong_type(
    name: str, got: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`schedspec parity --impl` reads `golden_output` too: exit 1 naming what it returned,
    not an AttributeError traceback from spec/golden.py."""
    argv = ["parity", "--impl", f"tests.broken_adapters:{name}", "--prompts", "2"]
    assert main([*argv, "--max-new-tokens", "8"]) == 1
    err = capsys.readouterr().err
    assert f"[golden_output] golden_output(request 'p000') returned {got}, not a" in err, err


@pytest.mark.parametrize(
    ("factory", "says"),
    [
        (broken_adapters.no_rules, "lacking rules"),
        (broken_adapters.rules_as_text, "whose rules is the str 'fcfs'"),
    ],
)
def test_the_ar_suite_from_pytest_names_a_missing_or_ill_typed_rules(
    factory: Any, says: str
) -> None:
    """From a user's own pytest (no CLI in front), the AR machine reads `rules` to set the
    spec's ordering: a missing or ill-typed one is the same ConfigError as the CLI's refusal,
    not an AttributeError or a ProfileError from inside the run."""
    machine = ar_conformance_machine(factory)
    with pytest.raises(ConfigError) as refused:
        run_state_machine_as_test(machine, settings=settings(max_examples=1, database=None))
    assert "a factory returning an ArSchedulerAdapter" in str(refused.value)
    assert says in str(refused.value)
