"""The shrunk programs of docs/shrunk/ (`scripts/vllm_shrink.py --json`, and
`scripts/vllm_dllm_shrink.py --json` for the diffusion path's), one per finding of vLLM in
docs/engines/vllm.md that breaks a rule: each, run as recorded (its loop, options, fixes and draw
seed), breaks its rule in its loop, and passes once the fix it was shrunk under
(`--lifted-by`) is made too. They are the smallest reproductions of the findings, for upstream
reports; this keeps them reproducing. (The message's block ids may differ from the recorded
one: Python's per-process string hashing orders some of vLLM's sets. The rule and the loop do
not; each program was run under PYTHONHASHSEED 0 to 7 too.) On a release without its finding
(`GONE`: vLLM 0.34.0 rebuilt the offloading event tracker and fixed the store on error; 0.33.0
kept the draft guard whose removal is 0.34.0's guided-drafts finding), the program passes as
released; on a release without a setting the program needs (`REFUSED`: 0.33.0 has no
cache-aware admission), building its loop is a `ConfigError` naming the setting.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.diffusion import DllmProgram, DllmRequest, DllmServing
from integrations.vllm.dllm_shrink import run_dllm_named
from integrations.vllm.engine_core import CoreProgram, LoopOptions, run_loop
from integrations.vllm.loop_arguments import make_fixes
from integrations.vllm.mm_upstream_fixes import fixed_upstream as mm_fixed_upstream
from integrations.vllm.offload_error_store_fix import fixed_upstream
from integrations.vllm.offload_restore_fix import tracker_rebuilt
from integrations.vllm.sessions import SessionInput
from integrations.vllm.shrink import options_of_record
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.script_module import load_script
from tests.test_real_vllm_structured import draft_guard_removed

SHRUNK = sorted((Path(__file__).resolve().parents[1] / "docs" / "shrunk").glob("vllm-*.json"))
#: What a recorded program's source names.
NAMES = {
    "CoreProgram": CoreProgram,
    "ArConfig": ArConfig,
    "ArRequest": ArRequest,
    "Policy": Policy,
    "SessionInput": SessionInput,
}
DLLM_NAMES = {"DllmProgram": DllmProgram, "DllmServing": DllmServing, "DllmRequest": DllmRequest}


#: The programs whose finding the installed release may lack, with what tells that it does:
#: those `scripts/upstream_reports.py` reports gone from vLLM 0.34.0 (`GONE_IN_0_34`) and those
#: found in 0.34.0 that 0.33.0 lacks (`ONLY_IN_0_34`).
GONE: dict[str, Callable[[], bool]] = {
    "vllm-offloading-restore-events": tracker_rebuilt,
    "vllm-offloading-error-store": fixed_upstream,
    "vllm-mm-item-split": mm_fixed_upstream,
    "vllm-mm-prompt-split": mm_fixed_upstream,
    "vllm-guided-drafts": lambda: not draft_guard_removed(),  # 0.33.0 guards its drafts
    "vllm-cache-probe": lambda: _refused("vllm-cache-probe") is not None,
}
#: The programs a release without one of their settings refuses, and the setting.
REFUSED = {"vllm-cache-probe": "cache_aware_admission_window"}


def _refused(stem: str) -> str | None:
    """The `ConfigError` the loaded release gives building the recorded loop of `stem` (a
    setting it lacks), or None if it builds it."""
    record = json.loads((SHRUNK[0].parent / f"{stem}.json").read_text())
    program = eval(record["program"], dict(NAMES))
    try:
        run_loop(program, async_scheduling=False, options=_options(record))
    except ConfigError as err:
        return str(err)
    except EngineCoreViolation:
        pass
    return None


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _options(record: dict[str, Any], *more: str) -> LoopOptions:
    names = [n for n in (record["fix"] or "").split(" + ") if n] + list(more)
    fix = make_fixes(names)
    return options_of_record(record["options"], fix=fix, draw_seed=record["draw_seed"])


def test_there_is_a_shrunk_program_per_finding() -> None:
    assert len(SHRUNK) >= 11, SHRUNK
    lifted = {json.loads(path.read_text())["lifted_by"] for path in SHRUNK}
    wanted = {"uncache-preempted", "pad-what-fits", "cap-draft-margin"}
    assert wanted | {"whole-canvas", "model-len-hold"} <= lifted, lifted


@pytest.mark.parametrize("path", SHRUNK, ids=lambda p: p.stem)
def test_a_shrunk_program_breaks_its_rule_until_its_fix_is_made(path: Path) -> None:
    record = json.loads(path.read_text())
    if record.get("path") == "diffusion":
        _diffusion_record_breaks_its_rule_until_its_fix_is_made(record)
        return
    program = eval(record["program"], dict(NAMES))
    assert isinstance(program, CoreProgram)
    async_scheduling = record["loop"] == "async"
    if path.stem in REFUSED and (refused := _refused(path.stem)) is not None:
        assert REFUSED[path.stem] in refused and "new in vLLM 0.34.0" in refused, refused
        return
    if path.stem in GONE and GONE[path.stem]():
        run = run_loop(program, async_scheduling=async_scheduling, options=_options(record))
        assert run.outputs, run
        return
    with pytest.raises(EngineCoreViolation) as caught:
        run_loop(program, async_scheduling=async_scheduling, options=_options(record))
    assert caught.value.rule == record["rule"], caught.value
    assert caught.value.detail.startswith(f"{record['loop']} loop: ")
    fixed = _options(record, *record["lifted_by"].split(" + "))
    run_loop(program, async_scheduling=async_scheduling, options=fixed)


def test_the_findings_gone_are_those_the_upstream_reports_name() -> None:
    """And the programs found in 0.34.0 are recorded as run on it, every other on 0.33.0."""
    reports = load_script("upstream_reports")
    assert set(GONE) == set(reports.GONE_IN_0_34) | set(reports.ONLY_IN_0_34)
    releases = {path.stem: json.loads(path.read_text())["release"] for path in SHRUNK}
    assert set(releases) >= set(GONE)
    assert {stem for stem, release in releases.items() if release == "0.34.0"} == set(
        reports.ONLY_IN_0_34
    )
    assert set(releases.values()) <= {"0.33.0", "0.34.0"}


def _diffusion_record_breaks_its_rule_until_its_fix_is_made(record: dict[str, Any]) -> None:
    program = eval(record["program"], dict(DLLM_NAMES))
    assert isinstance(program, DllmProgram)
    async_scheduling = record["loop"] == "async"
    fixes = [n for n in (record["fix"] or "").split(" + ") if n]
    with pytest.raises(EngineCoreViolation) as caught:
        run_dllm_named(program, async_scheduling, fixes)
    assert caught.value.rule == record["rule"], caught.value
    assert caught.value.detail.startswith(f"{record['loop']} loop: ")
    run_dllm_named(program, async_scheduling, [*fixes, *record["lifted_by"].split(" + ")])
