"""Hypothesis profiles, selected by the SCHEDSPEC_PROFILE environment variable.

dev     quick local runs (default)
ci      the CI run: more examples, derandomized so a red CI replays identically
release the pre-release run: many examples, no deadline

They are registered under their own names, `schedspec-dev`, `schedspec-ci` and
`schedspec-release` (`registered_name`), never `dev`, `ci` or `release`: an engine's project
importing schedspec keeps its own profiles of those names, and Hypothesis's built-in `ci`
(which it loads itself where it sees a CI environment). Re-registering the name of the active
profile makes Hypothesis re-load it, so taking such a name would change the settings of every
other test of the engine's session merely by importing schedspec. $SCHEDSPEC_PROFILE (and
`name` below) takes the short names, case-insensitively, or the registered ones.

Two ways to use a profile:

- `profile_settings(name)` returns its settings, to assign to one generated test class
  (`TestX.settings = profile_settings()`): schedspec's machines run under it, every other test
  keeps the session's profile. What the implementer guide recommends for an engine's suite.
- `load_profile(name)` makes it the session-wide default (every Hypothesis test of the
  process): what this project's own `tests/conftest.py` does. pytest's
  `--hypothesis-profile=schedspec-ci` does the same once this module is imported (from a
  `conftest.py`, before pytest reads the option).

What every profile sets, and why: no per-example deadline (an example drives a whole scheduler;
`properties.deadline` guards calls that hang instead) and `report_multiple_bugs=False` (one
scheduler bug, met at several places, was reported three times in one ExceptionGroup; a
campaign, `schedspec verify --keep-going`, is the way to see every rule broken). The `ci` and
`dev` profiles leave out Hypothesis's explain phase: it re-runs the shrunk program under
coverage to name the lines only failing runs reach, which in these machines are the checker's
own (the rule that fired), and it took most of the time to a report (a seeded leak: 25.8 s with
it, 4.4 s without, under `ci`). `release` keeps it: a pre-release run has time to spare, and on
the project's own non-stateful tests the lines it names can be the code under test.

Derandomized is not enough for "replays identically". Hypothesis mines the integer, float and
string constants of every loaded module it takes for the user's own code and now and then
draws one of them (`hypothesis.internal.conjecture.providers`): what a test generates then
depends on which of those modules the process has loaded by the time it runs. That differs
between a whole CI run (a worker has run other tests first, which imported scripts and
commands lazily) and the one test replayed on its own, and between two CI runs (pytest-xdist
hands tests to workers as they finish). So a derandomized schedspec run stops Hypothesis from
drawing mined constants, whichever way its profile was chosen: `load_profile` of a
derandomized profile (ci) stops it for the rest of the process (`draw_no_mined_constants`), and
every conformance machine stops it for its own examples when the settings it runs under are
derandomized (`hold_no_mined_constants`, from `properties.conformance_base`): the path of
`profile_settings("ci")` and of `--hypothesis-profile=schedspec-ci`. dev and release keep the
mining, for the variety. (Where Hypothesis sees a CI environment, such as `CI` set, these
profiles inherit from its own derandomized `ci` settings instead of its defaults: there every
one of them is derandomized, and stops the mining.) The command line's derandomized runs
(`schedspec verify`, `bench conformance`) stop it too, so that a command draws the same
programs from a checkout, whose modules Hypothesis mines, and from the installed wheel, whose
it does not.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from hypothesis import HealthCheck, Phase, settings

PROFILE_ENV = "SCHEDSPEC_PROFILE"
PROFILES = ("dev", "ci", "release")
"""The short names $SCHEDSPEC_PROFILE and `name` take."""
PREFIX = "schedspec-"
"""Each profile is registered with Hypothesis as PREFIX + its short name."""


def _hypothesis_parent() -> settings:
    """What the profiles inherit from: Hypothesis's own defaults, or its own ci settings where
    it sees a CI environment (as it then loads them itself). Not whatever profile is active
    when this module is imported: an engine's own profile must not leak into schedspec's."""
    try:  # internals, pinned by constraints.txt; without them, the defaults
        from hypothesis._settings import CI, is_in_ci
    except ImportError:  # pragma: no cover - the pinned Hypothesis has both
        return settings.get_profile("default")
    return CI if is_in_ci() else settings.get_profile("default")


_NO_EXPLAIN = tuple(p for p in Phase if p is not Phase.explain)
_base = settings(
    _hypothesis_parent(),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    report_multiple_bugs=False,
)
settings.register_profile(
    PREFIX + "dev", parent=_base, max_examples=40, stateful_step_count=30, phases=_NO_EXPLAIN
)
settings.register_profile(
    PREFIX + "ci",
    parent=_base,
    max_examples=60,
    stateful_step_count=40,
    derandomize=True,
    print_blob=True,
    phases=_NO_EXPLAIN,
)
settings.register_profile(
    PREFIX + "release", parent=_base, max_examples=500, stateful_step_count=60, print_blob=True
)


def profile_name(name: str | None = None) -> str:
    """The short name of the profile `name` selects (or $SCHEDSPEC_PROFILE, or 'dev'): one of
    `PROFILES`, given as such or as its registered name, in any case. Raises
    `spec.errors.ConfigError` naming $SCHEDSPEC_PROFILE and the valid values otherwise."""
    given = name or os.environ.get(PROFILE_ENV) or "dev"
    chosen = given.strip().lower().removeprefix(PREFIX)
    if chosen not in PROFILES:
        from spec.errors import ConfigError

        raise ConfigError(PROFILE_ENV, given, f"one of {list(PROFILES)}")
    return chosen


def registered_name(name: str | None = None) -> str:
    """The name Hypothesis knows the selected profile by (`schedspec-ci`, ...), as pytest's
    `--hypothesis-profile` takes it; `name` as for `profile_name`."""
    return PREFIX + profile_name(name)


def profile_settings(name: str | None = None) -> settings:
    """The settings of the selected profile (`name` as for `profile_name`), to assign to one
    test class: `TestX.settings = profile_settings()`. Changes no session-wide setting; a
    conformance machine run under derandomized settings stops the mining of constants for its
    own examples (module docstring)."""
    return settings.get_profile(registered_name(name))


def load_profile(name: str | None = None) -> str:
    """Make the selected profile (`name` as for `profile_name`) Hypothesis's session-wide
    default, for every test of the process, and return its short name. A derandomized one also
    stops the mining of constants for the rest of the process (`draw_no_mined_constants`). For
    schedspec's machines alone, without touching the other tests, use `profile_settings`."""
    chosen = profile_name(name)
    settings.load_profile(PREFIX + chosen)
    if settings.get_profile(PREFIX + chosen).derandomize:
        draw_no_mined_constants()
    return chosen


def _providers() -> object | None:
    """Hypothesis's provider module when it mines constants (6.131 on), else None."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants  # noqa: F401 - used by _stop
    except ImportError:
        return None
    return providers if hasattr(providers, "_get_local_constants") else None


def _stop(providers: object) -> None:
    """Make the provider read "no constants" for the loaded modules, and drop the constants it
    already picked for some draws (its cache holds them)."""
    from hypothesis.internal.constants_ast import Constants

    none = Constants()
    providers._get_local_constants = lambda: none  # type: ignore[attr-defined]
    _forget_picked(providers)


def _forget_picked(providers: object) -> None:
    """Drop the constants Hypothesis picked for some kinds of draws (its cache holds them)."""
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if cache is not None:
        cache.cache.clear()


_stopped_for_good = False  # `draw_no_mined_constants` ran: no hold's release undoes it
_held = 0  # holds of `hold_no_mined_constants` not yet released
_held_saved: object = None  # what the provider read before the first of them


def draw_no_mined_constants() -> None:
    """Stop Hypothesis from drawing the constants it mines from loaded modules (for the rest
    of the process), so that a derandomized test generates the same inputs whatever else the
    process has imported. Nothing to do on a Hypothesis that mines none (before 6.131).
    Reaches into Hypothesis's internals, which the project pins (constraints.txt);
    `tests/test_hypothesis_profiles.py` checks it still works."""
    global _stopped_for_good
    providers = _providers()
    if providers is None:
        return
    _stopped_for_good = True
    _stop(providers)


def hold_no_mined_constants() -> Callable[[], None]:
    """Stop the mining of constants until the returned function is called (once; later calls
    do nothing), then put back what was there, so that the tests that run after keep drawing
    as they would have. A conformance machine holds it for each example it runs under
    derandomized settings, from its construction (before the example's first draw) to its
    teardown. Holds nest (the last release restores); after `draw_no_mined_constants` the
    mining stays stopped."""
    global _held, _held_saved
    providers = _providers()
    if providers is None:
        return lambda: None
    if _held == 0:
        _held_saved = providers._get_local_constants  # type: ignore[attr-defined]
        _stop(providers)
    _held += 1
    released = False

    def release() -> None:
        global _held
        nonlocal released
        if released:
            return
        released = True
        _held -= 1
        if _held == 0 and not _stopped_for_good:
            providers._get_local_constants = _held_saved  # type: ignore[attr-defined]
            _forget_picked(providers)  # picked from no constants: the mined ones come back

    return release


__all__ = [
    "PREFIX",
    "PROFILES",
    "PROFILE_ENV",
    "draw_no_mined_constants",
    "hold_no_mined_constants",
    "load_profile",
    "profile_name",
    "profile_settings",
    "registered_name",
]
