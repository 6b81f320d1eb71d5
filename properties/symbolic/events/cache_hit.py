"""`CacheHit` (`SpecMachine._cache_hit`): a request reads a cached block as one of its own. The
encoding has no prefix cache (`DllmConfig.prefix_cache` is off in every encoded geometry), so
the event is never enabled, as `SpecMachine` refuses it without a cache (rule prefix_cache_on)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from properties.symbolic.events.common import no_prefix_cache
from properties.symbolic.guard import Guard
from properties.symbolic.params import Params
from properties.symbolic.state import State

if TYPE_CHECKING:
    from properties.symbolic.encoding import Encoding


def guards(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """One labelled guard (rule  formula):
    prefix_cache_on    false"""
    return no_prefix_cache()


def effect(enc: Encoding, s: State, p: Params) -> State:
    """s' = s (never enabled)."""
    return s
