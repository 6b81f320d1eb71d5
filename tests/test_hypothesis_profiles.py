"""The ci profile replays identically: a derandomized test draws the same inputs whatever else
the process has imported (`properties.profiles.draw_no_mined_constants`).

Hypothesis mines constants from every loaded module it takes for the user's code and draws
them now and then, so without that a test's inputs depended on which project modules had been
imported before it ran: in a whole CI run, after other tests had lazily imported scripts and
commands, they differed from the same test run on its own. Each case runs in a fresh process
(this one has loaded most of the project already, and its profile is loaded): it loads a
profile, imports a module of constants or not, and prints what a derandomized test draws.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DRAWS = """
import sys
from hypothesis import given, settings, strategies as st
from properties.profiles import load_profile

if sys.argv[1] != "none":
    load_profile(sys.argv[1])
if sys.argv[2] == "yes":
    import extra_constants  # noqa: F401  (a project module some earlier test imported)


@settings(derandomize=True, max_examples=300, database=None)
@given(st.integers(0, 10**6), st.text(max_size=8))
def draws(number, text):
    seen.append((number, text))


seen = []
draws()
print(seen)
"""

# Constants no strategy would reach by itself, more than the few the modules this script loads
# hold: about one draw in forty picks a mined constant, most often one of these. (Hypothesis
# skips a module with 1,024 constants or more.)
EXTRA = (
    f"NUMBERS = {tuple(range(100_003, 100_003 + 300 * 97, 97))}\n"
    f"WORDS = {tuple(f'w{i}xyz' for i in range(300))}\n"
)

# Whether loading a profile stopped the mining: what `load_profile` promises for a
# derandomized profile only. (Hypothesis loads its own derandomized ci profile when it sees a
# CI environment, and the project's profiles inherit from it there: then all of them are.)
STOPPED = """
import sys
from hypothesis import settings
from hypothesis.internal.conjecture import providers
from properties.profiles import load_profile

mining = providers._get_local_constants
load_profile(sys.argv[1])
print(settings.default.derandomize, providers._get_local_constants is not mining)
"""


def run(script: str, tmp_path: Path, *argv: str) -> str:
    modules = tmp_path / "modules"
    if not modules.exists():
        modules.mkdir()
        (modules / "extra_constants.py").write_text(EXTRA)
    work = tmp_path / ("work-" + "-".join(argv))
    work.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(modules)])}
    env.pop("SCHEDSPEC_PROFILE", None)
    res = subprocess.run(
        [sys.executable, "-c", script, *argv],
        cwd=work,  # Hypothesis's cache of mined constants (.hypothesis/) goes here
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_ci_draws_the_same_inputs_whatever_the_process_imported(tmp_path: Path) -> None:
    assert run(DRAWS, tmp_path, "ci", "no") == run(DRAWS, tmp_path, "ci", "yes")


def test_without_the_profile_the_imported_constants_change_the_draws(tmp_path: Path) -> None:
    """The control: Hypothesis left as it is draws some of the module's constants, so the same
    derandomized test draws other inputs once the module is imported."""
    assert run(DRAWS, tmp_path, "none", "no") != run(DRAWS, tmp_path, "none", "yes")


@pytest.mark.parametrize("profile", ["dev", "ci", "release"])
def test_a_profile_stops_the_mining_exactly_when_it_is_derandomized(
    tmp_path: Path, profile: str
) -> None:
    derandomized, stopped = run(STOPPED, tmp_path, profile).split()
    assert stopped == derandomized, (profile, derandomized, stopped)
    if profile == "ci":
        assert derandomized == "True"
