"""vLLM 0.34.0's cap on in-flight KV loads (`max_num_inflight_kv_loads`) in its engine-core loop
with a KV connector (`LoopOptions.max_inflight_kv_loads`, `--max-inflight-kv-loads N`): the
programs pass both loops with the cap reached and the admission order kept within each of
vLLM's waiting queues (the requests the connector may load asynchronously queue apart and start
their loads while the batch is full), and the rule `inflight_kv_loads` catches the cap ignored.

These run on 0.34.0 in `test_real_vllm_newest`. On 0.33.0, which has no such setting, each
checks instead that asking for it is a `ConfigError` naming the setting and the release."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.engine_core import (
    RULES,
    EngineCoreViolation,
    LoopOptions,
    check_both,
    core_program,
    run_loop,
)
from spec.errors import ConfigError
from tests.engine_gate import require_engine
from tests.script_module import load_script

PROGRAMS = range(int(os.environ.get("SCHEDSPEC_VLLM_PROGRAMS", "30")))
CAPPED = LoopOptions(kv_connector="fail", max_inflight_kv_loads=1)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _has_the_setting() -> bool:
    """Whether the loaded release caps in-flight loads; on one without (0.33.0), asking for it
    must be a `ConfigError` naming the setting and the release that has it."""
    try:
        run_loop(core_program(0), async_scheduling=False, options=CAPPED)
    except ConfigError as err:
        assert "max_num_inflight_kv_loads" in str(err), err
        assert "new in vLLM 0.34.0" in str(err), err
        return False
    return True


def test_capped_programs_pass_both_loops_and_reach_the_cap() -> None:
    """With one load at most holding blocks, the programs pass every check in both loops
    (the admission order within each queue included), and calls leave the cap reached."""
    if not _has_the_setting():
        return
    assert "inflight_kv_loads" in RULES
    reached = loads = 0
    for seed in PROGRAMS:
        sync_run, async_run = check_both(core_program(seed), CAPPED)
        reached += sync_run.inflight_cap_reached + async_run.inflight_cap_reached
        loads += sync_run.loads + async_run.loads
    assert reached > 0 and loads > 0, (reached, loads)


def _ignores_the_cap(sched: Any) -> None:
    """Seeded bug: every new asynchronous load is admitted, whatever the cap."""
    sched._admits_inflight_kv_load = lambda: True


#: The rule's seeded bug, and the rule that catches it.
SEEDED_BUGS: tuple[tuple[Callable[[Any], None], str], ...] = (
    (_ignores_the_cap, "inflight_kv_loads"),
)


def test_the_cap_rule_catches_the_cap_ignored() -> None:
    """The first program that fails with the seeded bug breaks `inflight_kv_loads`, naming the
    requests that hold blocks for a load and the cap."""
    if not _has_the_setting():
        return
    ((bug, rule),) = SEEDED_BUGS
    options = LoopOptions(kv_connector="fail", max_inflight_kv_loads=1, fix=bug)
    for seed in PROGRAMS:
        try:
            run_loop(core_program(seed), async_scheduling=False, options=options)
        except EngineCoreViolation as err:
            assert err.rule == rule, err
            assert "hold KV blocks for an asynchronous load" in err.detail, err.detail
            assert "max_num_inflight_kv_loads=1" in err.detail, err.detail
            return
    pytest.fail(f"no program of {PROGRAMS} caught the cap ignored")


def test_the_flag_needs_a_connector_and_a_positive_cap(capsys: pytest.CaptureFixture[str]) -> None:
    """`--max-inflight-kv-loads`: 0, or without `--kv-connector`, or on a release without the
    setting, is a usage error (exit 2, one line)."""
    check = load_script("vllm_async_check")
    for argv in (
        ["--programs", "1", "--max-inflight-kv-loads", "1"],
        ["--programs", "1", "--kv-connector", "fail", "--max-inflight-kv-loads", "0"],
    ):
        with pytest.raises(SystemExit) as exit_:
            check.main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "--max-inflight-kv-loads: an int >= 1, with --kv-connector" in err, err
    if _has_the_setting():
        return
    # a release without the setting refuses the flag before any program runs
    with pytest.raises(SystemExit) as exit_:
        check.main(["--programs", "1", "--kv-connector", "fail", "--max-inflight-kv-loads", "1"])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--max-inflight-kv-loads: invalid max_num_inflight_kv_loads=1" in last, last
    assert "new in vLLM 0.34.0" in last, last
