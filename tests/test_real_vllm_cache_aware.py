"""vLLM 0.34.0's cache-aware admission under the AR spec (`integrations.vllm:REAL_VLLM_CACHE_AWARE`,
`cache_aware_admission_window=3`): it conforms to the profile that declares it
(`ArPolicy.cache_aware_window`) and decides as its twin `VLLM_V1_CACHE_AWARE`; the profile
without it fails; a live scheduler's log declares it.

These run on 0.34.0 in `test_real_vllm_newest`. On 0.33.0, which has no such setting, each
checks instead that asking for it is a `ConfigError` naming the setting and the release."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from integrations.vllm.cache_probe_fix import CACHE_PROBE_FIXES, REAL_VLLM_CACHE_AWARE_FIXED
from integrations.vllm.engine_core import EngineCoreLoop, core_program
from integrations.vllm.event_log import VllmEventLog
from integrations.vllm.settings_034 import Vllm034Settings
from properties.ar.conformance import ar_conformance_machine
from properties.ar.trace_check import check_ar_trace
from properties.verify import ArTwin, failure_from, run_machine
from reference.ar import vllm_settings
from schedspec_cli.trace_profile import ar_log_difference
from spec.ar.config import Policy
from spec.ar.events import ArEvent
from spec.ar.profile import ArProfile
from spec.errors import ConfigError, SpecViolation
from spec.implementation import ArImplementation
from tests.engine_gate import require_engine
from tests.patch_check import apply_fix_set
from tests.test_ar_cache_aware import ONE_SEAT, admission_order
from tests.test_ar_mutants import HUNT
from tests.test_twin_settings import check
from tests.tier import depth

EXAMPLES = int(os.environ.get("SCHEDSPEC_VLLM_EXAMPLES", depth(20, 40)))


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def has_the_setting() -> bool:
    """Whether the loaded release has cache-aware admission; on one without (0.33.0), asking
    for it must be a `ConfigError` naming the setting and the release that has it."""
    try:
        REAL_VLLM_CACHE_AWARE.factory(ONE_SEAT, lambda _: None)
    except ConfigError as err:
        assert "cache_aware_admission_window" in str(err), err
        assert "new in vLLM 0.34.0" in str(err), err
        return False
    return True


def _admissions(impl: ArImplementation, c_reads: int | None = None) -> list[str]:
    """`admission_order` (tests/test_ar_cache_aware.py) of `impl` under its own profile, c
    reading at most `c_reads` tokens from the cache."""
    return admission_order(impl.factory, impl.profile.policy, c_reads=c_reads)


def test_vllm_admits_the_cached_prefix_first_and_keeps_the_order() -> None:
    """With the window, vLLM moves c ahead of b while a holds half the pool, and c still goes
    first once a has finished and the pool is empty; without it, b goes first. The twin
    decides the same."""
    if not has_the_setting():
        return
    assert _admissions(REAL_VLLM_CACHE_AWARE) == ["a", "c", "b"]
    assert _admissions(vllm_settings.VLLM_V1_CACHE_AWARE) == ["a", "c", "b"]
    assert _admissions(REAL_VLLM_PREFIX) == ["a", "b", "c"]


def test_vllm_ranks_a_prompt_scoring_request_by_a_prefix_it_may_not_read() -> None:
    """The finding: c scores its prompt from row 1 on (`prompt_logprob_start=1`), so its
    admission reads none of a's 2 cached blocks; vLLM 0.34.0 still moves it ahead of b, and the
    spec names the reordered queue. With `bounded-cache-probe` vLLM keeps arrival order, as the
    twin does; from row 2 on c may read one block, and all three move it ahead. A request that
    skips the cache (0) is ranked as holding nothing, as it should be."""
    if not has_the_setting():
        return
    with pytest.raises(SpecViolation) as caught:
        _admissions(REAL_VLLM_CACHE_AWARE, c_reads=1)
    err = caught.value
    assert err.rule == "waiting_order", err
    assert "implementation queue ['c', 'b'], FCFS order ['b', 'c']" in str(err), err
    for impl in (REAL_VLLM_CACHE_AWARE_FIXED, vllm_settings.VLLM_V1_CACHE_AWARE):
        assert _admissions(impl, c_reads=1) == ["a", "b", "c"], impl.description
        assert _admissions(impl, c_reads=0) == ["a", "b", "c"], impl.description
    for impl in (
        REAL_VLLM_CACHE_AWARE,
        REAL_VLLM_CACHE_AWARE_FIXED,
        vllm_settings.VLLM_V1_CACHE_AWARE,
    ):
        assert _admissions(impl, c_reads=2) == ["a", "c", "b"], impl.description
    assert _admissions(REAL_VLLM_CACHE_AWARE, c_reads=0) == ["a", "b", "c"]


def test_the_probe_fix_is_a_patch_of_the_kv_cache_manager(tmp_path: Path) -> None:
    """`scripts/engine_fixes_diff.py vllm-cache-probe` prints the edit the tests run (the
    probe's bound becomes `get_max_cache_hit_length()`): applied with `git apply -p1` to a copy
    of vLLM 0.34.0's `kv_cache_manager.py`, it gives the very text they run."""
    if not has_the_setting():
        return
    diff, patched = apply_fix_set(tmp_path, CACHE_PROBE_FIXES)
    assert diff.startswith("--- a/vllm/v1/core/kv_cache_manager.py"), diff[:200]
    assert "-            request.block_hashes, request.num_tokens - 1\n" in diff, diff
    assert "request.block_hashes, request.get_max_cache_hit_length()" in next(
        iter(patched.values())
    )


def test_on_a_release_without_the_probe_the_fix_does_not_apply(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On 0.33.0, which has no cache-aware probe, giving a scheduler `bounded-cache-probe` is
    `FixDoesNotApply` naming the method and the release that has it, and the patch script
    exits 2 with one line."""
    if has_the_setting():
        return
    from integrations.patches import FixDoesNotApply
    from integrations.vllm.cache_probe_fix import apply_cache_probe_fix
    from tests.script_module import load_script

    adapter = RealVllmScheduler(ONE_SEAT, lambda _: None, SETTINGS_SPACE)
    with pytest.raises(FixDoesNotApply, match=r"get_num_cached_tokens.*new in vLLM 0\.34\.0"):
        apply_cache_probe_fix(adapter.sched)
    assert load_script("engine_fixes_diff").main(["vllm-cache-probe"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err


def test_real_vllm_with_the_window_conforms_and_decides_as_its_twin(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`verify --impl integrations.vllm.cache_probe_fix:REAL_VLLM_CACHE_AWARE_FIXED --twin
    reference.ar.vllm_settings:VLLM_V1_CACHE_AWARE`: the suite under the declared profile
    (prefix caching off and on, FCFS and priority, requests that bound their cache reads),
    each example replayed through the twin. The released scheduler fails it where a
    prompt-scoring request is ranked (the finding above), so the fix is applied."""
    from schedspec_cli.main import main

    if not has_the_setting():
        return
    assert vllm_settings.VLLM_CACHE_AWARE_WINDOW == VLLM_CACHE_AWARE_WINDOW
    argv = [
        "verify",
        "--impl",
        "integrations.vllm.cache_probe_fix:REAL_VLLM_CACHE_AWARE_FIXED",
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
    if not has_the_setting():
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
    if not has_the_setting():
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


def window_logs(count: int, threshold: float) -> Iterator[list[str]]:
    """The live logs of the first `count` generated programs the window applies to (FCFS with
    prefix caching), vLLM 0.34.0 serving each with the window at `threshold`."""
    found, seed = 0, 0
    while found < count:
        program = core_program(seed)
        seed += 1
        if not program.config.enable_prefix_caching or program.config.policy is not Policy.FCFS:
            continue
        found += 1
        lines: list[str] = []

        def attach(sched: Any, into: list[str] = lines) -> None:
            VllmEventLog(sched, into.append)

        EngineCoreLoop(
            program.config,
            async_scheduling=False,
            mutate=attach,
            settings_034=Vllm034Settings(VLLM_CACHE_AWARE_WINDOW, threshold),
        ).run(program)
        yield lines


def test_a_live_log_at_threshold_0_decides_as_its_twin(tmp_path: Path) -> None:
    """Logs of vLLM 0.34.0 with the window at threshold 0 declare it; `check-trace --twin`
    runs `VLLM_V1_CACHE_AWARE` at that threshold and decides alike on each, where the twin at
    its own threshold (0.5) decides otherwise on some (a false twin_decisions before the twin
    took the log's settings)."""
    if not has_the_setting():
        return
    twin = "reference.ar.vllm_settings:VLLM_V1_CACHE_AWARE"
    as_declared = vllm_settings.VLLM_V1_CACHE_AWARE.profile
    raw = ArTwin("raw", vllm_settings.VLLM_V1_CACHE_AWARE.factory, as_declared.policy)
    apart = 0
    for lines in window_logs(depth(20, 100), 0.0):
        assert json.loads(lines[0])["declared_policy"]["cache_aware_threshold"] == 0.0
        path = tmp_path / "log.jsonl"
        path.write_text("".join(f"{line}\n" for line in lines))
        code, said = check(str(path), "--twin", twin)
        assert code == 0 and f"{twin} (with cache_aware_threshold=0.0) decides" in said
        kept: list[ArEvent] = []
        log = check_ar_trace(lines, keep=kept)
        assert log.config is not None
        as_is = ar_log_difference(
            raw, kept, log.config, log.policy, log.idle_at_end, log.sampled_stops
        )
        apart += as_is is not None
    assert apart >= 1, "no program where the threshold decides"
