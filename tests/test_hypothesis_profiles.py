"""The ci profile replays identically: a derandomized test draws the same inputs whatever else
the process has imported (`properties.profiles.draw_no_mined_constants`).

Hypothesis mines constants from every loaded module it takes for the user's code and draws
them now and then, so without that a test's inputs depended on which project modules had been
imported before it ran: in a whole CI run, after other tests had lazily imported scripts and
commands, they differed from the same test run on its own. Each case runs in a fresh process
(`tests.mined_constants`): it loads a profile, imports a module of constants or not, and
prints what a derandomized test draws.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mined_constants import draws, run_fresh

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


def beside(tmp_path: Path, profile: str, imported: bool) -> str:
    """What the shared derandomized test draws after loading `profile`, with the module of
    `EXTRA` imported or not."""
    modules = tmp_path / "modules"
    if not modules.exists():
        modules.mkdir()
        (modules / "extra_constants.py").write_text(EXTRA)
    module = "extra_constants" if imported else ""
    return draws(
        tmp_path / f"work-{profile}-{imported}", profile=profile, directory=modules, module=module
    )


def stopped(tmp_path: Path, profile: str) -> list[str]:
    """[whether `profile` is derandomized, whether loading it stopped the mining]."""
    return run_fresh(STOPPED, tmp_path, profile).split()


def test_ci_draws_the_same_inputs_whatever_the_process_imported(tmp_path: Path) -> None:
    assert beside(tmp_path, "ci", False) == beside(tmp_path, "ci", True)


def test_without_the_profile_the_imported_constants_change_the_draws(tmp_path: Path) -> None:
    """The control: Hypothesis left as it is draws some of the module's constants, so the same
    derandomized test draws other inputs once the module is imported."""
    assert beside(tmp_path, "none", False) != beside(tmp_path, "none", True)


@pytest.mark.parametrize("profile", ["dev", "ci", "release"])
def test_a_profile_stops_the_mining_exactly_when_it_is_derandomized(
    tmp_path: Path, profile: str
) -> None:
    derandomized, stops = stopped(tmp_path, profile)
    assert stops == derandomized, (profile, derandomized, stops)
    if profile == "ci":
        assert derandomized == "True"
