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

# Constants no strategy would reach by itself: a pool this size is drawn from often enough in
# 300 examples that a change of the pool changes the draws (the control below).
EXTRA = (
    f"NUMBERS = {tuple(range(100_003, 100_003 + 60 * 7919, 7919))}\n"
    f"WORDS = {tuple(f'w{i}xyz' for i in range(40))}\n"
)


def draws(tmp_path: Path, profile: str, extra: bool) -> str:
    modules = tmp_path / "modules"
    if not modules.exists():
        modules.mkdir()
        (modules / "extra_constants.py").write_text(EXTRA)
    work = tmp_path / f"work-{profile}-{extra}"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(modules)])}
    env.pop("SCHEDSPEC_PROFILE", None)
    res = subprocess.run(
        [sys.executable, "-c", DRAWS, profile, "yes" if extra else "no"],
        cwd=work,  # Hypothesis's cache of mined constants (.hypothesis/) goes here
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_ci_draws_the_same_inputs_whatever_the_process_imported(tmp_path: Path) -> None:
    assert draws(tmp_path, "ci", extra=False) == draws(tmp_path, "ci", extra=True)


@pytest.mark.parametrize("profile", ["dev", "release"])
def test_other_profiles_keep_drawing_mined_constants(tmp_path: Path, profile: str) -> None:
    """The control: without `draw_no_mined_constants` the module's constants change what the
    same derandomized test draws (dev and release keep them, for the variety)."""
    assert draws(tmp_path, profile, extra=False) != draws(tmp_path, profile, extra=True)
