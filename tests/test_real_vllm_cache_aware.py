"""vLLM 0.34.0's cache-aware admission under the AR spec (`integrations.vllm:REAL_VLLM_CACHE_AWARE`,
`cache_aware_admission_window=3`): it conforms to the profile that declares it
(`ArPolicy.cache_aware_window`) and decides as its twin `VLLM_V1_CACHE_AWARE`; the profile
without it fails; a live scheduler's log declares it.

These run on 0.34.0 in `test_real_vllm_newest`. On 0.33.0, which has no such setting, each
checks instead that asking for it is a `ConfigError` naming the setting and the release."""

from __future__ import annotations

import json
import os

import pytest

from integrations.vllm import (
    MANIFEST,
    REAL_VLLM_CACHE_AWARE,
    REAL_VLLM_PREFIX,
    SETTINGS_SPACE,
    VLLM_CACHE_AWARE_WINDOW,
    VLLM_POLICY,
)
from integrations.vllm.adapter import RealVllmScheduler
from integrations.vllm.event_log import VllmEventLog
from integrations.vllm.settings_034 import Vllm034Settings
from properties.ar.conformance import ar_conformance_machine
from properties.verify import failure_from, run_machine
from reference.ar import vllm_settings
from spec.ar.profile import ArProfile
from spec.errors import ConfigError, SpecViolation
from spec.implementation import ArImplementation
from tests.engine_gate import require_engine
from tests.test_ar_cache_aware import ONE_SEAT, admission_order
from tests.test_ar_mutants import HUNT

EXAMPLES = int(os.environ.get("SCHEDSPEC_VLLM_EXAMPLES", "40"))


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _has_the_setting() -> bool:
    """Whether the loaded release has cache-aware admission; on one without (0.33.0), asking
    for it must be a `ConfigError` naming the setting and the release that has it."""
    try:
        REAL_VLLM_CACHE_AWARE.factory(ONE_SEAT, lambda _: None)
    except ConfigError as err:
        assert "cache_aware_admission_window" in str(err), err
        assert "new in vLLM 0.34.0" in str(err), err
        return False
    return True


def _admissions(impl: ArImplementation) -> list[str]:
    """`admission_order` (tests/test_ar_cache_aware.py) of `impl` under its own profile."""
    return admission_order(impl.factory, impl.profile.policy)


def test_vllm_admits_the_cached_prefix_first_and_keeps_the_order() -> None:
    """With the window, vLLM moves c ahead of b while a holds half the pool, and c still goes
    first once a has finished and the pool is empty; without it, b goes first. The twin
    decides the same."""
    if not _has_the_setting():
        return
    assert _admissions(REAL_VLLM_CACHE_AWARE) == ["a", "c", "b"]
    assert _admissions(vllm_settings.VLLM_V1_CACHE_AWARE) == ["a", "c", "b"]
    assert _admissions(REAL_VLLM_PREFIX) == ["a", "b", "c"]


def test_real_vllm_with_the_window_conforms_and_decides_as_its_twin(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`verify --impl integrations.vllm:REAL_VLLM_CACHE_AWARE --twin
    reference.ar.vllm_settings:VLLM_V1_CACHE_AWARE`: the suite under the declared profile
    (prefix caching off and on, FCFS and priority), each example replayed through the twin."""
    from schedspec_cli.main import main

    if not _has_the_setting():
        return
    assert vllm_settings.VLLM_CACHE_AWARE_WINDOW == VLLM_CACHE_AWARE_WINDOW
    argv = [
        "verify",
        "--impl",
        "integrations.vllm:REAL_VLLM_CACHE_AWARE",
        "--twin",
        "reference.ar.vllm_settings:VLLM_V1_CACHE_AWARE",
        "--examples",
        str(EXAMPLES),
    ]
    assert main(argv) == 0, capsys.readouterr().out
    assert "PASS" in capsys.readouterr().out


def test_the_suite_fails_vllm_with_the_window_where_the_profile_leaves_it_out() -> None:
    """Declaring vLLM's policy without the window, the suite finds the reordered queue (at an
    admission, or in the snapshot after the step) and prints a replayable program."""
    if not _has_the_setting():
        return
    profile = ArProfile(space=SETTINGS_SPACE, policy=VLLM_POLICY)
    err, printed = run_machine(
        ar_conformance_machine(REAL_VLLM_CACHE_AWARE.factory, profile=profile), HUNT
    )
    assert isinstance(err, SpecViolation), err
    assert err.rule in ("fcfs_admission", "waiting_order"), err
    assert "state.configure(config=" in failure_from(err, printed).program


def test_a_live_log_declares_the_window_it_runs_with() -> None:
    """`VllmEventLog` on vLLM 0.34.0 with the window (FCFS, prefix caching on) declares it in
    the header; with prefix caching off vLLM applies no window and the header declares none."""
    if not _has_the_setting():
        return
    window = Vllm034Settings(VLLM_CACHE_AWARE_WINDOW)
    for config, declares in (
        (ONE_SEAT, True),
        (ONE_SEAT.replace(enable_prefix_caching=False), False),
    ):
        adapter = RealVllmScheduler(config, lambda _: None, SETTINGS_SPACE, settings_034=window)
        lines: list[str] = []
        VllmEventLog(adapter.sched, lines.append)
        declared = json.loads(lines[0])["declared_policy"]
        assert ("cache_aware_window" in declared) is declares, declared
        if declares:
            assert declared["cache_aware_window"] == VLLM_CACHE_AWARE_WINDOW, declared
            # vLLM's default threshold is the spec's default: not written
            assert "cache_aware_threshold" not in declared, declared
