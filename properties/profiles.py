"""Hypothesis profiles, selected by the SCHEDSPEC_PROFILE environment variable.

dev     quick local runs (default)
ci      the CI run: more examples, derandomized so a red CI replays identically
release the pre-release run: many examples, no deadline
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
    return chosen
