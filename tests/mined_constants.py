"""What a derandomized Hypothesis test draws in a fresh process beside a module of constants.

Hypothesis mines the constants of every loaded module it takes for the user's code and draws
them now and then. The tests of the engines' `site-packages/` layout and of the ci profile both
ask whether a module's constants reach the draws; each case needs a fresh process, since this
one has loaded most of the project and a profile already.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# argv: the profile to load ("none": Hypothesis as it is), the directory of the module, and the
# module to import there ("" for none).
DRAWS = """
import sys
from hypothesis import given, settings, strategies as st
from properties.profiles import load_profile

if sys.argv[1] != "none":
    load_profile(sys.argv[1])
if sys.argv[3]:
    sys.path.insert(0, sys.argv[2])
    __import__(sys.argv[3])


@settings(derandomize=True, max_examples=300, database=None)
@given(st.integers(0, 10**6), st.text(max_size=8))
def draws(number, text):
    seen.append((number, text))


seen = []
draws()
print(seen)
"""


def run_fresh(script: str, work: Path, *argv: str) -> str:
    """`script`'s output, run with `argv` in a fresh process in `work` (where Hypothesis keeps
    its cache of mined constants), the project importable and no profile chosen by the
    environment."""
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SCHEDSPEC_PROFILE", None)
    res = subprocess.run(
        [sys.executable, "-c", script, *argv],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def draws(
    work: Path, *, profile: str = "none", directory: Path | None = None, module: str = ""
) -> str:
    """The inputs `DRAWS` draws in a fresh process run in `work`, after loading `profile` and
    importing `module` from `directory`."""
    return run_fresh(DRAWS, work, profile, str(directory or ""), module)
