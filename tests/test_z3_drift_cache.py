"""Drift guard for the prefix cache: the Z3 relation and `SpecMachine.apply` agree on walks
with `DllmConfig.prefix_cache` on (pages of one block and of two).

The walks reuse the scheduler-like proposals of `test_z3_drift` and add the cache's: a
request caches a committed block it owns (or, wrongly, its current one or one it reads), hits
cached blocks as its next block or as a committed duplicate (with the right content and the
wrong), releases what it reads (or the wrong block), and cached blocks are evicted (read or
unread, whole or in part). Prompts are built as a tree: a request mostly starts with whole
blocks of an earlier request's prompt, then holds tokens of its own, so requests share cached
blocks along a prefix tree (`concrete.shared_prompt_blocks` counts them back).

Under PREFILL_FIRST the block a request computes right after a cache hit in the same round is
a prefill row (SGLang sorts the request by its prompt length before the match); the walks
seldom reach it, so a fixed scenario compares it both ways.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from properties.symbolic.codes import TAIL_TOKEN
from properties.symbolic.concrete import NotEncodable, encode_state, shared_prompt_blocks
from properties.symbolic.drift import stepper_for
from properties.symbolic.geometry import Geometry
from spec.config import DllmConfig, Mode
from spec.events import (
    Admitted,
    BlockCommitted,
    CacheEvicted,
    CacheHit,
    CacheReleased,
    ControlReturned,
    Event,
    Finished,
    Forward,
    ForwardRow,
    KvAllocated,
    KvCached,
    RowReleased,
    StepResult,
    Submitted,
)
from spec.machine import SpecMachine, finish_condition
from spec.profile import DllmAdmission, DllmPolicy
from spec.state import ACTIVE_PHASES, AbstractState
from tests import test_z3_drift as drift

# one worker runs the module: its walks share the Z3 relations compiled per geometry, about
# 10 s of a worker's time that a second worker would spend again
pytestmark = pytest.mark.xdist_group("z3-drift-cache")

# (B, P, pages)
CACHE_GEOMETRIES = ((1, 1, 8), (2, 2, 4), (3, 3, 3), (1, 2, 4), (2, 4, 2), (1, 3, 3), (1, 4, 2))
KEEP = {drift.EOS, drift.STOP_TOKEN, *drift.STOP_IDS}  # tokens that end requests
SMALL = DllmConfig(  # one-slot blocks and pages, 8 of them, two requests at a time
    block_size=1,
    page_size=1,
    kv_pages=8,
    req_pool_rows=2,
    max_running_requests=2,
    max_context=8,
    prefix_cache=True,
)


def _tree_prompt(
    index: int, length: int, earlier: list[tuple[int, ...]], b: int, rng: random.Random
) -> tuple[int, ...]:
    """A prompt of `length` tokens: mostly the first whole blocks of an earlier prompt (as
    many as both have, now and then; else some), then tokens of its own."""
    donors = [p for p in earlier if len(p) >= b and length >= b]
    shared = 0
    if donors and rng.random() < 0.8:
        donor = rng.choice(donors)
        most = min(len(donor), length) // b
        shared = most if rng.random() < 0.3 else rng.randint(1, most)
        return donor[: shared * b] + (TAIL_TOKEN + index,) * (length - shared * b)
    return (TAIL_TOKEN + index,) * length


def _own_tokens(
    index: int, tokens: tuple[int, ...], prompt_len: int, start: int
) -> tuple[int, ...]:
    """A committed block's generated tokens made the request's own (so no two requests'
    generated blocks share a key), keeping the ones that end requests."""
    out = []
    for j, tok in enumerate(tokens):
        gen = start + j >= prompt_len
        out.append(tok if not gen or tok in KEEP else 20 + 10 * index + tok % 10)
    return tuple(out)


def _free_for(m: SpecMachine, e: KvAllocated, rng: random.Random) -> tuple[int, ...]:
    """`test_z3_drift`'s slots for an allocation, where the cache changes them: a block that
    continues the page of the cached block the request reads as its previous one goes right
    after it, and a block that starts a page mostly gets a page the cache holds nothing of."""
    s = m.state()
    b, p = m.config.block_size, m.config.page_size
    k = e.block_index
    read = s.requests[e.request_id].cache_reads.get(k - 1)
    if (k * b) % p and read is not None and rng.random() < 0.9:
        return tuple(range(read[-1] + 1, read[-1] + 1 + b))
    if (k * b) % p == 0 and rng.random() < 0.9:
        taken = set(s.slot_owners) | s.cached_slots
        pages = [g for g in range(m.config.kv_pages) if taken.isdisjoint(range(g * p, g * p + p))]
        if pages:
            return tuple(range(pages[0] * p, pages[0] * p + b))
    return tuple(e.slots)


def _cache_events(m: SpecMachine, rng: random.Random) -> list[Event]:
    """Cache events a caching scheduler could emit now, and some it must not."""
    s = m.state()
    b = m.config.block_size
    out: list[Event] = []
    owners = s.slot_owners
    for r in s.requests.values():
        if r.phase not in ACTIVE_PHASES:
            continue
        rid = r.request_id
        owned_blocks: dict[int, tuple[int, ...]] = {}
        for t, (o, k) in sorted(owners.items()):
            if o == rid:
                owned_blocks[k] = (*owned_blocks.get(k, ()), t)
        for k, slots in owned_blocks.items():
            # a committed block: cache it; the current one: wrongly, now and then
            if k < r.committed_blocks or rng.random() < 0.1:
                out.append(KvCached(rid, k, slots))
        ending = finish_condition(m.config, r) is not None
        for k, slots in r.cache_reads.items():
            # mostly when it may end: an active request needs what it reads (a release
            # before then is refused at its next forward, on committed_prefix_kept)
            if ending or rng.random() < 0.05:
                out.append(CacheReleased(rid, k, slots))
            if rng.random() < 0.1:
                out.append(KvCached(rid, k, slots))  # a block it reads: wrongly
                out.append(CacheReleased(rid, k + 1, slots))
        for block in s.cache:
            k = block.block_index
            nxt = (
                k == r.committed_blocks
                and r.current is None
                and r.row is not None
                and not s.round.forwards
            )
            duplicate = k < r.committed_blocks and k in owned_blocks
            # its next block or a duplicate it owns: the content decides; others now and then
            if nxt or duplicate or rng.random() < 0.1:
                out.append(CacheHit(rid, k, block.slots))
    pressed = len(s.free_slots) < 2 * b  # an engine evicts when it runs out of pages
    for block in s.cache:
        if (not block.readers and (pressed or rng.random() < 0.05)) or rng.random() < 0.05:
            out.append(CacheEvicted(block.slots))
        if rng.random() < 0.1 and len(block.slots) > 1:
            out.append(CacheEvicted(block.slots[1:]))
    if len(s.cache) > 1 and rng.random() < 0.2:
        two = rng.sample(list(s.cache), 2)
        out.append(CacheEvicted(tuple(sorted(two[0].slots + two[1].slots))))
    return out


def _proposals(m: SpecMachine, rng: random.Random) -> list[Event]:
    """`test_z3_drift`'s proposals with tree prompts and own generated tokens, and the
    cache's."""
    s = m.state()
    b = m.config.block_size
    out: list[Event] = []
    policy = m.policy
    for e in drift._good_events(m, rng):
        r = s.requests.get(getattr(e, "request_id", ""))
        if (
            isinstance(e, RowReleased)
            and r is not None
            and finish_condition(m.config, r) is None
            and not (policy.rows_released_between_rounds or policy.aborts_after_commit)
            and rng.random() < 0.9
        ):
            # `test_z3_drift` gives a row back on its way to an abort after a commit; a
            # request that caches its blocks owns no KV to free first, so that way (refused
            # without those options) would end most walks' requests stuck without a row
            continue
        if isinstance(e, Submitted):
            index = len(s.requests)
            earlier = [r.prompt for r in s.requests.values()]
            prompt = _tree_prompt(index, len(e.prompt), earlier, b, rng)
            e = Submitted(
                e.request_id,
                prompt,
                e.max_new_tokens,
                stop_sampled=e.stop_sampled,
                ignore_eos=e.ignore_eos,
                stop_token_ids=e.stop_token_ids,
                priority=e.priority,
            )
        elif isinstance(e, KvAllocated) and e.request_id in s.requests:
            e = KvAllocated(e.request_id, e.block_index, _free_for(m, e, rng))
        elif isinstance(e, BlockCommitted) and e.request_id in s.requests:
            index = list(s.requests).index(e.request_id)
            prompt_len = len(s.requests[e.request_id].prompt)
            toks = _own_tokens(index, e.tokens, prompt_len, e.block_index * b)
            e = BlockCommitted(e.request_id, e.block_index, toks)
        out.append(e)
    return out + _cache_events(m, rng)


STATS: Counter[str] = Counter()


def _successor_encodable(m: SpecMachine, e: Event) -> bool:
    """Whether the state after `e` (if the spec accepts it) is in the encoding: two requests
    of one whole-stem prompt that both commit an EOS first share a generated block, which the
    content model cannot tell (`concrete.encode_state` refuses it)."""
    trial = m.copy()
    try:
        trial.apply(e)
    except Exception:  # refused (or odd): the comparison decides
        return True
    try:
        encode_state(trial.state(), stepper_for(m.config).geom, m.policy)
    except NotEncodable:
        return False
    return True


def same_rules(before: Counter[str]) -> list[str]:
    """The rules both sides refused on since `before` (a copy of `test_z3_drift.STATS`)."""
    return [k[len("same rule ") :] for k in drift.STATS - before if k.startswith("same rule ")]


def _compare(m: SpecMachine, e: Event) -> bool:
    """`test_z3_drift._compare`, counting the cache's cases."""
    s = m.state()
    r = s.requests.get(getattr(e, "request_id", ""))
    if not _successor_encodable(m, e):
        STATS["successor not encodable"] += 1
        return False
    before = Counter(drift.STATS)
    applied = drift._compare(m, e)
    rejected = drift.STATS["both reject"] > before["both reject"]
    same = same_rules(before)
    if isinstance(e, KvAllocated) and r is not None and e.block_index - 1 in r.cache_reads:
        b, page = m.config.block_size, m.config.page_size
        if (e.block_index * b) % page and (applied or "page_alignment" in same):
            # it continues the page of the cached block it reads as its previous one
            STATS[f"{'accept' if applied else 'reject'} kv_allocated after a read block"] += 1
    if applied:
        STATS[f"accept {e.kind}"] += 1
        if isinstance(e, CacheHit) and r is not None:
            nxt = e.block_index == r.committed_blocks
            STATS["accept cache_hit " + ("next" if nxt else "dup")] += 1
    elif rejected:
        for rule in same:
            STATS[f"reject {e.kind} on {rule}"] += 1
        if isinstance(e, Finished) and r is not None and r.cache_reads and same:
            STATS[f"reject finished while reading on {same[0]}"] += 1
    return applied


WEIGHT = {**drift.WEIGHT, "cache_hit": 6.0, "kv_cached": 2.0, "cache_released": 1.5}


def _walk(m: SpecMachine, rng: random.Random, steps: int) -> None:
    for _ in range(steps):
        drift._check_invariants(m)
        good = _proposals(m, rng)
        x = rng.random()
        if good and x < 0.85:
            e = rng.choices(good, weights=[WEIGHT.get(e.kind, 1.0) for e in good])[0]
        elif good and x < 0.95:
            e = drift._mutate(rng.choice(good), m, rng)
        else:
            e = drift._random_event(m, rng)
        _compare(m, e)


@drift._WALKS
@given(
    config=drift.configs(CACHE_GEOMETRIES, min_context_blocks=2, prefix_cache=True),
    policy=drift.policies(),
    rng=st.randoms(use_true_random=False),
    steps=st.integers(30, 120),
)
def test_relation_agrees_with_spec_machine_on_cache_walks(
    config: DllmConfig, policy: DllmPolicy, rng: random.Random, steps: int
) -> None:
    _walk(SpecMachine(config, policy), rng, steps)


def test_the_cache_walks_reach_every_cache_rule_both_ways() -> None:
    """Every cache event kind is accepted and refused on each of its rules by both sides, and
    a hit is accepted both as a next block and as a committed duplicate."""
    wanted = [
        "accept kv_cached",
        "accept cache_hit next",
        "accept cache_hit dup",
        "accept cache_released",
        "accept cache_evicted",
        "reject kv_cached on cache_committed_only",
        "reject cache_hit on cache_hit_content",
        "reject cache_released on free_owned_only",
        "reject cache_evicted on evict_unread_only",
        "reject kv_allocated on kv_exclusive",
        "accept kv_allocated after a read block",
        "reject finished while reading on terminal_owns_nothing",
    ]
    STATS.clear()
    rng = random.Random(7)
    for seed in range(40):
        if all(STATS[w] for w in wanted):
            break  # every case reached (8 walks do it); the walks after add nothing checked
        b, page, pages = CACHE_GEOMETRIES[seed % len(CACHE_GEOMETRIES)]
        config = DllmConfig(
            block_size=b,
            page_size=page,
            kv_pages=pages,
            req_pool_rows=2,
            max_running_requests=1 + seed % 4 // 2,  # one at a time: later ones hit the cache
            max_context=b * (min(8, page * pages) // b),
            mode=(Mode.FDFO, Mode.SYNC)[seed % 3 == 0],
            in_place_reuse=seed % 3 == 1,
            prefix_cache=True,
        )
        _walk(SpecMachine(config), random.Random(rng.random()), 150)
    missing = [w for w in wanted if not STATS[w]]
    assert not missing, f"never reached: {missing}; reached: {dict(STATS)}"


# ---------------------------------------------------------------------------- the content model


def test_shared_prompt_blocks_counts_the_whole_blocks_alike() -> None:
    assert shared_prompt_blocks((1, 2, 3, 4, 5), (1, 2, 3, 4, 6), 2) == 2
    assert shared_prompt_blocks((1, 2, 3, 4, 5), (1, 2, 3, 9), 2) == 1
    assert shared_prompt_blocks((1, 2, 3), (1, 2), 2) == 1
    assert shared_prompt_blocks((1,), (1,), 2) == 0  # no whole block
    assert shared_prompt_blocks((), (1, 2), 2) == 0


def _served(config: DllmConfig, prompts: list[tuple[int, ...]]) -> AbstractState:
    m = SpecMachine(config)
    for i, prompt in enumerate(prompts):
        m.apply(Submitted(f"r{i}", prompt, 1))
    return m.state()


def test_any_tree_of_prompts_is_encoded_as_it_is() -> None:
    """Two branches, each shared by two requests (no single stem tells it): r0 and r2 share
    two blocks, r1 and r3 two, the branches one."""
    config = DllmConfig(block_size=1, page_size=1, kv_pages=8, max_context=8, prefix_cache=True)
    prompts: list[tuple[int, ...]] = [(1, 2, 3), (1, 5, 6), (1, 2, 7), (1, 5, 8)]
    values = encode_state(_served(config, prompts), Geometry(1, 1, 8, prefix_cache=True))
    shared = [[values[f"shared_prefix[{i * 4 + j}]"] for j in range(4)] for i in range(4)]
    assert shared == [[0, 1, 2, 1], [1, 0, 1, 2], [2, 1, 0, 1], [1, 2, 1, 0]]


def test_a_shared_generated_block_is_not_encodable() -> None:
    """Two requests of one prompt that commit the same first generated token share a block the
    encoding keeps as each one's own: the state is refused, not compared."""
    config = DllmConfig(block_size=2, page_size=2, kv_pages=4, max_context=8, prefix_cache=True)
    geom = Geometry(2, 2, 4, prefix_cache=True)
    m = SpecMachine(config)
    events: list[Event] = [Submitted("r0", (7,), 1), Submitted("r1", (7,), 1)]
    events += [Admitted("r0", 0), Admitted("r1", 1)]
    events += [KvAllocated("r0", 0, (0, 1)), KvAllocated("r1", 0, (2, 3))]
    events += [Forward((ForwardRow("r0", 0, False, 2, 1), ForwardRow("r1", 0, False, 2, 1)))]
    events += [StepResult("r0", 0, 0, 0), StepResult("r1", 0, 0, 0), ControlReturned(0)]
    events += [Forward((ForwardRow("r0", 0, True, 2, 0), ForwardRow("r1", 0, True, 2, 0)))]
    events += [StepResult("r0", 0, 2, 0), StepResult("r1", 0, 2, 0)]
    for e in events:
        m.apply(e)
    encode_state(m.state(), geom)
    m.apply(BlockCommitted("r0", 0, (7, 9)))
    encode_state(m.state(), geom)
    m.apply(BlockCommitted("r1", 0, (7, 9)))
    with pytest.raises(NotEncodable, match="share 1 blocks, 0 of them whole prompt blocks"):
        encode_state(m.state(), geom)
    # without the cache the content is not read
    plain = dataclasses.replace(config, prefix_cache=False)
    encode_state(_served(plain, [(7, 7, 51), (7, 7, 52)]), Geometry(2, 2, 4))


def test_a_cache_config_outside_a_cache_geometry_is_not_encodable() -> None:
    config = DllmConfig(block_size=2, page_size=4, kv_pages=2, max_context=8, prefix_cache=True)
    with pytest.raises(NotEncodable, match="prefix_cache=True outside a geometry"):
        encode_state(SpecMachine(config).state(), Geometry(2, 4, 2))
    assert stepper_for(config).geom.prefix_cache  # the drift guard's geometry has it


# ---------------------------------------------------------------------------- teeth


@pytest.mark.parametrize(
    ("module", "tag", "kind"),
    [
        ("cache_evicted", "unread", "cache_evicted"),
        ("cache_hit", "key", "cache_hit"),
        ("kv_cached", "read", "kv_cached"),
    ],
)
def test_the_cache_walks_catch_a_dropped_cache_guard(
    module: str, tag: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drop one cache guard from the relation: the walks find an event SpecMachine refuses and
    the relation accepts, and say which."""
    import importlib

    from properties.symbolic import drift as drift_module
    from properties.symbolic.encoding import Encoding
    from properties.symbolic.events import EVENTS, EventEncoding
    from properties.symbolic.guard import Guard
    from properties.symbolic.params import Params
    from properties.symbolic.state import State

    events = importlib.import_module(f"properties.symbolic.events.{module}")
    original = events.guards

    def weaker(enc: Encoding, s: State, p: Params) -> list[Guard]:
        return [g for g in original(enc, s, p) if g.tag != tag]

    patched = dict(EVENTS)
    patched[kind] = EventEncoding(kind, weaker, EVENTS[kind].effect)
    monkeypatch.setattr("properties.symbolic.relation.EVENTS", patched)
    monkeypatch.setattr(drift_module, "_STEPPERS", {})
    rng = random.Random(3)
    with pytest.raises(AssertionError, match=f"enabledness differs on {type_name(kind)}"):
        for seed in range(60):
            _walk(SpecMachine(SMALL), random.Random(rng.random() + seed), 150)


def type_name(kind: str) -> str:
    """The event class name of a kind (`cache_hit` -> `CacheHit`)."""
    return "".join(part.capitalize() for part in kind.split("_"))


# ---------------------------------------------------------------------------- PREFILL_FIRST


def _after_a_hit() -> SpecMachine:
    """Under PREFILL_FIRST: r0 cached its prompt block and waits with a decode block; r1, of
    the same prompt, read that block from the cache in this round and waits with the block
    after it, which holds no prompt token but counts as a prefill row."""
    config = dataclasses.replace(SMALL, in_place_reuse=False)
    m = SpecMachine(config, DllmPolicy(admission=DllmAdmission.PREFILL_FIRST))
    stem = (TAIL_TOKEN,)
    for e in (
        Submitted("r0", stem, 2),
        Admitted("r0", 0),
        KvAllocated("r0", 0, (0,)),
        Forward((ForwardRow("r0", 0, False, 1, 0),)),
        StepResult("r0", 0, 1, 0),
        BlockCommitted("r0", 0, stem),
        KvCached("r0", 0, (0,)),
        ControlReturned(0),
        Submitted("r1", stem, 2),
        Admitted("r1", 1),
        CacheHit("r1", 0, (0,)),
        KvAllocated("r1", 1, (1,)),
        KvAllocated("r0", 1, (2,)),
    ):
        m.apply(e)
    return m


_R0, _R1 = ForwardRow("r0", 1, False, 1, 1), ForwardRow("r1", 1, False, 1, 1)


def test_a_block_after_a_hit_is_a_prefill_row_both_ways() -> None:
    m = _after_a_hit()
    assert drift._compare(m.copy(), Forward((_R1,)))  # the prefill batch first
    for rows in ((_R0, _R1), (_R0,)):  # mixed; a decode batch while r1's block waits
        before = Counter(drift.STATS)
        assert not drift._compare(m.copy(), Forward(rows))
        assert "prefill_first" in same_rules(before), rows


def test_the_drift_guard_catches_a_prefill_kind_blind_to_hits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from properties.symbolic import drift as drift_module
    from properties.symbolic.encoding import Encoding

    monkeypatch.setattr(Encoding, "prefill_kind", Encoding.prefill_block)
    monkeypatch.setattr(drift_module, "_STEPPERS", {})
    with pytest.raises(AssertionError, match="enabledness differs on Forward"):
        drift._compare(_after_a_hit(), Forward((_R0,)))  # decode while r1's block waits
