"""The inductive proofs cover the prefix cache: in a cache geometry every named invariant and
lemma is inductive with the cache's four event kinds enabled, and breaking the cache's
encoding (an effect, the eviction's unread guard, the hit's index guard) breaks the proof with
a counterexample to induction naming the event kind."""

from __future__ import annotations

import pytest

from properties.symbolic.encoding import Encoding
from properties.symbolic.events import EVENTS, EventEncoding, cache_evicted, cache_hit, kv_cached
from properties.symbolic.geometry import Geometry
from properties.symbolic.guard import Guard
from properties.symbolic.induction import DEFAULT_GEOMETRIES, prove_invariants
from properties.symbolic.params import Params
from properties.symbolic.state import State

CACHE_GEOMETRY = Geometry(1, 1, 8, prefix_cache=True)  # not the default one: pages of a block


def test_the_default_sizes_include_a_cache_geometry() -> None:
    assert any(g.prefix_cache for g in DEFAULT_GEOMETRIES)


def test_every_invariant_is_inductive_with_the_cache() -> None:
    results = prove_invariants([CACHE_GEOMETRY])
    assert results and all(r.status == "proved" for r in results), [
        (r.name, r.detail[:200]) for r in results if r.status != "proved"
    ]


def _caching_keeps_owners(enc: Encoding, s: State, p: Params) -> State:
    """KvCached that leaves the block's slots owned while the cache holds them."""
    after = kv_cached.effect(enc, s, p)
    return after.replace(owner_request=s.owner_request, owner_block=s.owner_block)


def _evicts_read_blocks(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """CacheEvicted without its unread guard."""
    return [g for g in cache_evicted.guards(enc, s, p) if g.tag != "unread"]


def _hits_any_index(enc: Encoding, s: State, p: Params) -> list[Guard]:
    """CacheHit without its index guard (a block past its next one, or one it reads)."""
    return [g for g in cache_hit.guards(enc, s, p) if g.tag != "index"]


@pytest.mark.parametrize(
    ("kind", "broken", "failing"),
    [
        (
            "kv_cached",
            EventEncoding("kv_cached", kv_cached.guards, _caching_keeps_owners),
            "inductive/no_leak",
        ),
        (
            "cache_evicted",
            EventEncoding("cache_evicted", _evicts_read_blocks, cache_evicted.effect),
            "lemma/cache_off_holds_nothing",
        ),
        (
            "cache_hit",
            EventEncoding("cache_hit", _hits_any_index, cache_hit.effect),
            "lemma/cache_reads_are_committed_once",
        ),
    ],
)
def test_a_broken_cache_encoding_breaks_the_induction(
    kind: str, broken: EventEncoding, failing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("properties.symbolic.relation.EVENTS", {**EVENTS, kind: broken})
    results = {r.name: r for r in prove_invariants([CACHE_GEOMETRY])}
    assert results[failing].status == "counterexample", results[failing].detail
    assert f"a {kind} event breaks it" in results[failing].detail
