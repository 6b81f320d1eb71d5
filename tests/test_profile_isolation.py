"""schedspec's Hypothesis profiles in an engine's own pytest session (`properties.profiles`).

- Importing schedspec changes none of the engine's settings: its profiles are registered as
  `schedspec-dev`, `schedspec-ci` and `schedspec-release`. Under the names `dev`, `ci` and
  `release` they overwrote an engine's own profile of that name, and Hypothesis's built-in `ci`,
  and Hypothesis re-loads the active profile when its name is registered again, so the import
  alone changed every other test of the session.
- `profile_settings(name)` applies one to schedspec's machines only.
- A derandomized run draws no constants mined from loaded modules by every path that chooses
  the profile: `profile_settings("ci")` and pytest's `--hypothesis-profile=schedspec-ci`
  reach no `load_profile`; the conformance machine itself stops the mining for its examples.
- The profiles report one bug once, and `ci` and `dev` leave out the explain phase.

Cases that load profiles or import modules of constants run in fresh processes
(`tests.mined_constants.run_fresh`), so that this process's Hypothesis state stays as it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import Phase, settings

from properties.profiles import PROFILE_ENV, profile_name, profile_settings, registered_name
from spec.errors import ConfigError
from tests.mined_constants import ROOT, run_fresh
from tests.tier import full_tier

# An engine's conftest: its own "ci" profile, registered and loaded, then schedspec imported
# (the command line's module imports properties.profiles too).
ENGINE_FIRST = """
from hypothesis import settings

settings.register_profile("ci", max_examples=7, deadline=1000, database=None)
settings.load_profile("ci")
engine_ci = settings.get_profile("ci")
import properties.profiles
import schedspec_cli.main
from properties.conformance import conformance_machine

print(settings.get_profile("ci") is engine_ci, settings.get_current_profile_name(),
      settings.default.max_examples, settings.default.deadline.total_seconds())
"""

BUILTIN_CI = """
from hypothesis import settings

builtin = settings.get_profile("ci")
current = settings.get_current_profile_name()
import properties.profiles

print(settings.get_profile("ci") is builtin, settings.get_current_profile_name() == current,
      settings.get_profile("schedspec-ci").derandomize)
"""


def test_importing_schedspec_keeps_the_engines_own_ci_profile(tmp_path: Path) -> None:
    assert run_fresh(ENGINE_FIRST, tmp_path).split() == ["True", "ci", "7", "1.0"]


def test_importing_schedspec_keeps_hypothesis_built_in_ci_profile(tmp_path: Path) -> None:
    assert run_fresh(BUILTIN_CI, tmp_path).split() == ["True", "True", "True"]


def test_profile_settings_changes_no_session_setting() -> None:
    before, name = settings.default, settings.get_current_profile_name()
    chosen = profile_settings("release")
    assert chosen.max_examples == 500
    assert settings.default is before
    assert settings.get_current_profile_name() == name


@pytest.mark.parametrize(
    ("given", "short"),
    [("ci", "ci"), ("CI", "ci"), (" Release ", "release"), ("schedspec-dev", "dev")],
)
def test_the_profile_is_named_short_or_registered_in_any_case(given: str, short: str) -> None:
    assert profile_name(given) == short
    assert registered_name(given) == f"schedspec-{short}"


def test_an_unknown_profile_is_a_config_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PROFILE_ENV, "bogus")
    with pytest.raises(ConfigError) as err:
        profile_settings()
    assert PROFILE_ENV in str(err.value) and "'ci'" in str(err.value), str(err.value)


def test_one_bug_is_reported_once_and_ci_and_dev_skip_explaining() -> None:
    for name in ("dev", "ci", "release"):
        assert profile_settings(name).report_multiple_bugs is False, name
    assert Phase.explain not in profile_settings("ci").phases
    assert Phase.explain not in profile_settings("dev").phases
    assert Phase.explain in profile_settings("release").phases
    assert profile_settings("ci").derandomize


# ------------------------------------------------------------------ mined constants
# argv: "hook" or "nohook" (the control: the machines' stop undone), "1" to import a module of
# constants beside the machine, the modules' directory. Prints the steps run after each example
# of the reference under profile_settings("ci"), and whether the mining is back after the run.
UNDER_PROFILE_SETTINGS = """
import sys
import unittest

import properties.conformance_base as base
from hypothesis.internal.conjecture import providers

if sys.argv[1] == "nohook":
    base.hold_no_mined_constants = lambda: (lambda: None)
from properties.conformance import StepCounter, conformance_machine
from properties.profiles import profile_settings
from reference.dllm import make_scheduler

mining = providers._get_local_constants
counter = StepCounter()
steps = []
counter.on_example = lambda examples, n: steps.append(n)
Machine = conformance_machine(make_scheduler, counter=counter)
if sys.argv[2] == "1":
    sys.path.insert(0, sys.argv[3])
    import extra_constants
Test = Machine.TestCase
Test.settings = profile_settings("ci")
result = unittest.TextTestRunner(stream=sys.stderr).run(Test("runTest"))
assert result.wasSuccessful()
print(steps, providers._get_local_constants is mining)
"""

# Every integer under 1,000: some lie in the ranges the dLLM machine draws from that the loaded
# project modules lack (Hypothesis mines no integer below 100, skips a module of 1,024).
CONSTANTS = f"NUMBERS = {tuple(range(1000))}\n"


def constants_dir(tmp_path: Path) -> Path:
    modules = tmp_path / "modules"
    modules.mkdir(exist_ok=True)
    (modules / "extra_constants.py").write_text(CONSTANTS, encoding="utf-8")
    return modules


def under_profile_settings(tmp_path: Path, mode: str, imported: bool) -> tuple[str, str]:
    """(the steps after each example, whether the mining came back) of the reference's machine
    run as a TestCase under `profile_settings("ci")` in a fresh process."""
    work = tmp_path / f"work-{mode}-{imported}"
    out = run_fresh(
        UNDER_PROFILE_SETTINGS, work, mode, str(int(imported)), str(constants_dir(tmp_path))
    )
    steps, restored = out.rsplit(" ", 1)
    return steps, restored.strip()


def test_a_machine_under_profile_settings_ci_draws_alike_whatever_was_imported(
    tmp_path: Path,
) -> None:
    """Every example, the first included, draws the same with the module of constants loaded
    or not; after the run the mining is as it was, for the session's other tests."""
    plain, restored = under_profile_settings(tmp_path, "hook", False)
    beside, _ = under_profile_settings(tmp_path, "hook", True)
    assert plain == beside
    assert restored == "True"


@full_tier  # a second case / control: per push the other tests cover it
def test_without_the_machines_stop_the_imported_constants_change_the_draws(
    tmp_path: Path,
) -> None:
    """The control: the same run, the machines' stop undone, draws other programs."""
    assert (
        under_profile_settings(tmp_path, "nohook", False)[0]
        != (under_profile_settings(tmp_path, "nohook", True)[0])
    )


ENGINE_CONFTEST = "import properties.profiles  # registers the schedspec-* profiles\n"
ENGINE_TEST = """
import json
import os
import sys

from properties.conformance import StepCounter, conformance_machine
from reference.dllm import make_scheduler

counter = StepCounter()
steps = []
counter.on_example = lambda examples, n: steps.append(n)
TestReference = conformance_machine(make_scheduler, counter=counter).TestCase
if os.environ["WITH_CONSTANTS"] == "1":
    import extra_constants


def test_zz_record():
    with open(os.environ["STEPS_OUT"], "w") as out:
        json.dump(steps, out)
"""


def pytest_with_schedspec_ci(tmp_path: Path, imported: bool) -> list[int]:
    """The steps after each example of the reference's machine, run by pytest in a fresh
    project with `--hypothesis-profile=schedspec-ci` (no load_profile, no profile_settings)."""
    project = tmp_path / f"engine-{imported}"
    project.mkdir()
    (project / "conftest.py").write_text(ENGINE_CONFTEST, encoding="utf-8")
    (project / "test_engine.py").write_text(ENGINE_TEST, encoding="utf-8")
    out = project / "steps.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(constants_dir(tmp_path))]),
        "WITH_CONSTANTS": str(int(imported)),
        "STEPS_OUT": str(out),
    }
    env.pop(PROFILE_ENV, None)
    argv = ["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--hypothesis-profile=schedspec-ci"]
    res = subprocess.run(
        [sys.executable, "-m", "pytest", *argv, "test_engine.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    steps: list[int] = json.loads(out.read_text(encoding="utf-8"))
    assert len(steps) >= 60  # schedspec-ci's examples ran
    return steps


def test_pytest_hypothesis_profile_schedspec_ci_draws_alike_whatever_was_imported(
    tmp_path: Path,
) -> None:
    assert pytest_with_schedspec_ci(tmp_path, False) == pytest_with_schedspec_ci(tmp_path, True)


def test_verify_help_says_it_does_not_read_the_profile_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`verify` is set by its flags alone: `SCHEDSPEC_PROFILE=bogus schedspec verify ...` is
    not an error, by design, and its help says the variable is not read."""
    from schedspec_cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["verify", "--help"])
    assert done.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"${PROFILE_ENV} is not read" in help_text, help_text[-600:]
