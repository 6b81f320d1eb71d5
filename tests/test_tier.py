"""The suite's two tiers (tests/tier.py): what each selects, and a tier that is not one refused
in one line by `./run-tests` and by pytest alike."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from tests import conftest
from tests.tier import TIER_ENV, TierError, depth, is_full, skip_reason, tier

ROOT = Path(__file__).resolve().parents[1]
NEWEST_SUBPROCESS = (
    "tests/test_real_vllm_newest.py::test_the_release_independent_checks_pass_on_the_newest_release"
)


@pytest.mark.parametrize(("value", "chosen"), [(None, "push"), ("", "push"), ("push", "push")])
def test_push_is_the_default_and_takes_the_smaller_depth(
    monkeypatch: pytest.MonkeyPatch, value: str | None, chosen: str
) -> None:
    if value is None:
        monkeypatch.delenv(TIER_ENV, raising=False)
    else:
        monkeypatch.setenv(TIER_ENV, value)
    assert tier() == chosen and not is_full()
    assert depth(20, 40) == 20


def test_full_takes_the_full_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIER_ENV, "full")
    assert tier() == "full" and is_full()
    assert depth(20, 40) == 40


def test_a_value_that_names_no_tier_is_refused_naming_the_tiers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TIER_ENV, "deep")
    with pytest.raises(TierError, match=r"SCHEDSPEC_TIER='deep' is not a tier: .*push, full"):
        tier()


@pytest.mark.parametrize(("push", "full"), [(0, 10), (30, 20), (-1, 5)])
def test_a_depth_must_be_positive_and_no_deeper_per_push(push: int, full: int) -> None:
    with pytest.raises(ValueError, match="need 0 < push <= full"):
        depth(push, full)


def _pytest(*argv: str, tier_value: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, TIER_ENV: tier_value}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rs", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_per_push_a_full_tier_test_is_skipped_saying_how_to_run_it() -> None:
    """The newest vLLM release's subprocess run, marked `full_tier`, is skipped per push with
    the reason naming the command (and is not started: no engine is needed to skip it)."""
    res = _pytest(NEWEST_SUBPROCESS, tier_value="push")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "1 skipped" in res.stdout and skip_reason() in res.stdout, res.stdout[-2000:]


class _Item:
    """As much of a collected test as the tier hook reads and writes."""

    def __init__(self, marked: bool) -> None:
        self.marked = marked
        self.name = "test_something"  # not a `test_finding_*`: the finding mark stays off
        self.added: list[pytest.MarkDecorator] = []

    def get_closest_marker(self, name: str) -> object | None:
        return object() if self.marked and name == "full_tier" else None

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.added.append(marker)


@pytest.mark.parametrize(("value", "skipped"), [("push", [True, False]), ("full", [False, False])])
def test_the_hook_skips_exactly_the_marked_tests_per_push(
    monkeypatch: pytest.MonkeyPatch, value: str, skipped: list[bool]
) -> None:
    monkeypatch.setenv(TIER_ENV, value)
    items = [_Item(marked=True), _Item(marked=False)]
    conftest.pytest_collection_modifyitems(
        cast(pytest.Config, None), cast(list[pytest.Item], items)
    )
    assert [bool(item.added) for item in items] == skipped
    for item in items:
        for marker in item.added:
            assert marker.name == "skip" and marker.kwargs == {"reason": skip_reason()}


def test_pytest_refuses_a_tier_that_is_not_one_before_running() -> None:
    res = _pytest("--collect-only", "tests/test_tier.py", tier_value="deep")
    assert res.returncode == 4, res.stdout[-2000:] + res.stderr[-2000:]
    assert "SCHEDSPEC_TIER='deep' is not a tier: choose one of push, full" in res.stderr
    assert "Traceback" not in res.stderr, res.stderr[-2000:]


def test_run_tests_refuses_a_tier_that_is_not_one_in_one_line() -> None:
    """Before it sets anything up: exit 2 and one line naming the tiers."""
    res = subprocess.run(
        [str(ROOT / "run-tests")],
        cwd=ROOT,
        env={**os.environ, TIER_ENV: "nightly"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        "run-tests: SCHEDSPEC_TIER=nightly is not a tier: choose one of push, full"
    ]


def _ci_script_runs(script: str, tmp_path: Path) -> str:
    """What `.ci/<script>` hands to the README's test command: the script run from a copy of
    the tree whose `run-tests` only prints its tier and arguments."""
    (tmp_path / ".ci").mkdir()
    copy = tmp_path / ".ci" / script
    copy.write_text((ROOT / ".ci" / script).read_text(encoding="utf-8"), encoding="utf-8")
    stub = tmp_path / "run-tests"
    stub.write_text('#!/usr/bin/env bash\necho "tier=${SCHEDSPEC_TIER:-} args=$*"\n')
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != TIER_ENV}
    res = subprocess.run(
        ["bash", str(copy), "--durations=5"],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.strip()


def test_ci_runs_the_readme_command_at_the_push_tier(tmp_path: Path) -> None:
    assert _ci_script_runs("run", tmp_path) == "tier= args="


def test_the_nightly_script_runs_the_readme_command_at_the_full_tier(tmp_path: Path) -> None:
    assert _ci_script_runs("nightly", tmp_path) == "tier=full args=--durations=5"
