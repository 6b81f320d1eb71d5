"""Test configuration: the Hypothesis profile comes from $SCHEDSPEC_PROFILE (dev, ci, release)."""

from properties.profiles import load_profile

load_profile()
