"""Hypothesis profiles, selected by the SCHEDSPEC_PROFILE environment variable.

dev     quick local runs (default)
ci      the CI run: more examples, derandomized so a red CI replays identically
release the pre-release run: many examples, no deadline

Derandomized is not enough for "replays identically". Hypothesis mines the integer, float and
string constants of every loaded module it takes for the user's own code and now and then
draws one of them (`hypothesis.internal.conjecture.providers`): what a test generates then
depends on which of those modules the process has loaded by the time it runs. That differs
between a whole CI run (a worker has run other tests first, which imported scripts and
commands lazily) and the one test replayed on its own, and between two CI runs (pytest-xdist
hands tests to workers as they finish). So `load_profile` of a derandomized profile (ci)
also stops Hypothesis from drawing mined constants (`draw_no_mined_constants`); dev and
release keep them, for the variety. (Where Hypothesis sees a CI environment, such as `CI` set,
it loads its own derandomized profile first, from which these inherit: there every one of them
is derandomized, and stops the mining.) The command line's derandomized runs (`schedspec
verify`, `bench conformance`) call it too, so that a command draws the same programs from a
checkout, whose modules Hypothesis mines, and from the installed wheel, whose it does not.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "SCHEDSPEC_PROFILE"
PROFILES = ("dev", "ci", "release")

_base = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("dev", parent=_base, max_examples=40, stateful_step_count=30)
settings.register_profile(
    "ci", parent=_base, max_examples=60, stateful_step_count=40, derandomize=True, print_blob=True
)
settings.register_profile(
    "release", parent=_base, max_examples=500, stateful_step_count=60, print_blob=True
)


def load_profile(name: str | None = None) -> str:
    """Load `name` (or $SCHEDSPEC_PROFILE, or 'dev'); return the profile loaded."""
    chosen = name or os.environ.get(PROFILE_ENV) or "dev"
    if chosen not in PROFILES:
        from spec.errors import ConfigError

        raise ConfigError(PROFILE_ENV, chosen, f"one of {list(PROFILES)}")
    settings.load_profile(chosen)
    if settings.get_profile(chosen).derandomize:
        draw_no_mined_constants()
    return chosen


def draw_no_mined_constants() -> None:
    """Stop Hypothesis from drawing the constants it mines from loaded modules (for the rest
    of the process), so that a derandomized test generates the same inputs whatever else the
    process has imported. Nothing to do on a Hypothesis that mines none (before 6.131).
    Reaches into Hypothesis's internals, which the project pins (constraints.txt);
    `tests/test_hypothesis_profiles.py` checks it still works."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:
        return
    if not hasattr(providers, "_get_local_constants"):
        return
    none = Constants()
    providers._get_local_constants = lambda: none
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if cache is not None:  # constants already picked for some draws: forget them too
        cache.cache.clear()
