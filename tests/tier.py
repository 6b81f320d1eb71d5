"""The suite's two depths, chosen by $SCHEDSPEC_TIER.

push  (the default; what `./run-tests` and CI run) every rule's seeded bugs, every engine
      finding on the engines' default releases, the installed wheel; the long searches at half
      their depth, and without the checks marked `full_tier`.
full  (`SCHEDSPEC_TIER=full ./run-tests`: before a release, and nightly) everything at full
      depth: the per-push tests at their full example and program counts, and the
      `full_tier` tests, which repeat a per-push check on another release or another
      packaging (vLLM's and Vidur's newest releases, the wheel with the engine extra), run a
      control or a script's figures whose checks run in-process per push, or measure a cost.

The split sizes a push for CI's 15-minute budget on two cores (docs/performance.md has the
measured runs); docs/release.md says what the full tier adds and when to run it.
"""

from __future__ import annotations

import os

import pytest

TIER_ENV = "SCHEDSPEC_TIER"
TIERS = ("push", "full")

#: Marks a test that only the full tier runs; per push it is skipped, saying how to run it.
full_tier = pytest.mark.full_tier


class TierError(ValueError):
    """$SCHEDSPEC_TIER names no tier."""


def tier() -> str:
    """The selected tier: $SCHEDSPEC_TIER, or push when unset or empty; TierError naming the
    valid values otherwise."""
    chosen = os.environ.get(TIER_ENV) or "push"
    if chosen not in TIERS:
        raise TierError(f"{TIER_ENV}={chosen!r} is not a tier: choose one of {', '.join(TIERS)}")
    return chosen


def is_full() -> bool:
    """True under the full tier."""
    return tier() == "full"


def depth(push: int, full: int) -> int:
    """A search's size: `full` under the full tier, `push` otherwise (`push` <= `full`)."""
    if not 0 < push <= full:
        raise ValueError(f"depth(push={push}, full={full}): need 0 < push <= full")
    return full if is_full() else push


def skip_reason() -> str:
    """What a skipped `full_tier` test says."""
    return f"full tier only: {TIER_ENV}=full ./run-tests runs it"
