"""The seeded symbolic mutants of the prefix cache (`DllmConfig.prefix_cache`): each is one
of the caching reference's seeded bugs in tests/mutants.py (same name), as a relaxed guard of
the relation plus what the bug looks like on the bad step.

Three of those reference mutants also fail Z3's trace when it is run as a workload
(`reference`). `allocates_cached_pages` does because its bad step is constrained to what the
caching reference does wrong: the page it hands out is an unread cached block, at a moment when
the pool has no free slot (only then does the reference reach for a cached page). The other two
need traces too long for a quick search (docs/proofs.md has the trials): the caching reference
evicts a read block only when a third request brings pool pressure after a second has
refreshed a newer block (evicts_read_blocks), and it keys a block alone only on a duplicate
commit, after both requests have computed two blocks each (keys_blocks_alone)."""

from __future__ import annotations

import z3

from properties.symbolic.codes import DONE
from properties.symbolic.encoding import Encoding
from properties.symbolic.guard import Relaxation
from properties.symbolic.mutant import SymbolicMutant
from properties.symbolic.params import Params
from properties.symbolic.state import State
from properties.symbolic.terms import Z
from properties.symbolic.workloads import dllm_config
from spec.config import DllmConfig


def _cache_config(block: int, *, pages: int = 2) -> DllmConfig:
    """A small caching configuration: pages of one block, 2 pages unless `pages` says, 2 rows,
    2 running."""
    return dllm_config(
        block_size=block, page_size=block, kv_pages=pages, max_context=4 * block, prefix_cache=True
    )


def _caches_its_done_block(enc: Encoding, s: State, p: Params) -> Z:
    """CachesBeforeCommit: the block it caches is its current block, done (the step's results
    are in), not yet committed."""
    return z3.Or(
        [
            z3.And(
                p.request == i,
                p.block_index == s.committed_blocks[i],
                s.block_phase[i] == DONE,
            )
            for i in range(enc.N)
        ]
    )


def _same_index_only(enc: Encoding, s: State, p: Params) -> Z:
    """KeysBlocksAlone: the hit reads a cached block of the same block index (the key is the
    block's own place, not the prefix before it)."""
    return z3.And(
        [
            z3.Implies(enc.in_block(p.first_slot, t), s.cache_block[t] == p.block_index)
            for t in range(enc.S)
        ]
    )


def _onto_an_unread_cached_page(enc: Encoding, s: State, p: Params) -> Z:
    """AllocatesCachedPages: with no free slot left in the pool, the block gets a whole page
    that no request owns or reads, and the cache still holds it (the pool picked it to evict
    and forgot to evict it)."""
    a = p.first_slot
    unread = [z3.Not(enc.read_by(s, t, i)) for t in range(enc.S) for i in range(enc.N)]
    return z3.And(
        a >= 0,
        a + enc.B <= enc.pool,
        a % enc.P == 0,
        *[
            z3.Implies(
                enc.in_block(a, t),
                z3.And(s.owner_request[t] == -1, s.cached[t], *unread[t * enc.N : (t + 1) * enc.N]),
            )
            for t in range(enc.S)
        ],
        *[z3.Implies(t < enc.pool, z3.Not(enc.free(s, t))) for t in range(enc.S)],
    )


CACHE_MUTANTS: tuple[SymbolicMutant, ...] = (
    SymbolicMutant(
        "caches_before_commit",
        "a done block enters the prefix cache before its commit is reported",
        "cache_committed_only",
        _cache_config(2),
        "kv_cached",
        (Relaxation("kv_cached", "cache_committed_only", "committed"),),
        ("cache_committed_only", "committed"),
        extra=_caches_its_done_block,
        reference=("caches_before_commit",),
        requests=1,
        depths=(4, 6, 8),
    ),
    SymbolicMutant(
        "keys_blocks_alone",
        "a cache hit reads the cached block with the same index, whatever the prefix before "
        "it: a request reads KV computed after another prompt",
        "cache_hit_content",
        _cache_config(1),
        "cache_hit",
        (Relaxation("cache_hit", "cache_hit_content", "key"),),
        ("cache_hit_content", "key"),
        extra=_same_index_only,
        depths=(8, 10, 12),
    ),
    SymbolicMutant(
        "evicts_read_blocks",
        "eviction takes a cached block that a request still reads",
        "evict_unread_only",
        _cache_config(2),
        "cache_evicted",
        (Relaxation("cache_evicted", "evict_unread_only", "unread"),),
        ("evict_unread_only", "unread"),
        requests=1,
        depths=(6, 8, 10),
    ),
    SymbolicMutant(
        "never_releases_reads",
        "a request finishes still reading its cached blocks",
        "terminal_owns_nothing",
        _cache_config(2),
        "finished",
        (Relaxation("finished", "terminal_owns_nothing", "reads"),),
        ("terminal_owns_nothing", "reads"),
        reference=("never_releases_reads",),
        requests=1,
        depths=(8, 10, 12),
    ),
    SymbolicMutant(
        "allocates_cached_pages",
        "an allocation takes the page of a cached block the cache still holds",
        "kv_exclusive",
        # one page of one block: the second request's first block finds the first's cached
        _cache_config(2, pages=1),
        "kv_allocated",
        (
            Relaxation("kv_allocated", "kv_exclusive"),
            Relaxation("kv_allocated", "page_alignment", "aligned"),
        ),
        ("kv_exclusive", ""),
        extra=_onto_an_unread_cached_page,
        reference=("allocates_cached_pages",),
        depths=(18, 20),
    ),
)
