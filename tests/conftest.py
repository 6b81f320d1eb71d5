"""Test configuration: the Hypothesis profile comes from $SCHEDSPEC_PROFILE (dev, ci, release),
loaded session-wide for every test of this suite (`properties.profiles.load_profile`; an
engine's suite applies it to schedspec's classes alone with `profile_settings`), the suite's
depth from $SCHEDSPEC_TIER (push, full; tests/tier.py)."""

from __future__ import annotations

import pytest

from properties.profiles import load_profile
from tests.tier import TierError, is_full, skip_reason

load_profile()


def pytest_configure(config: pytest.Config) -> None:
    """Refuse a $SCHEDSPEC_TIER that names no tier before anything runs (a usage error)."""
    try:
        is_full()
    except TierError as err:
        raise pytest.UsageError(str(err)) from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every `test_finding_*` `finding` (a reproduction of an engine's behaviour as
    released, which fails once the engine changes it: `-m "not finding"` leaves them out);
    per push, skip the tests marked `full_tier`, saying how to run them."""
    for item in items:
        if item.name.startswith("test_finding_"):
            item.add_marker(pytest.mark.finding)
    if is_full():
        return
    skip = pytest.mark.skip(reason=skip_reason())
    for item in items:
        if item.get_closest_marker("full_tier") is not None:
            item.add_marker(skip)
