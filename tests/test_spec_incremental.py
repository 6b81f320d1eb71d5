"""Incremental invariant checking (`SpecMachine.check_changed`) agrees with the full check
(`check_invariants`) on random programs, and on states corrupted in every way an invariant
forbids; the reference keeps bounded state in a server-like run."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from properties.harness import Harness
from properties.strategies import dllm_configs
from reference.dllm import ReferenceDllmScheduler, make_scheduler
from spec.config import DllmConfig, RequestSpec
from spec.errors import SpecViolation
from spec.invariants import check_all
from spec.lifecycles import BlockPhase, RequestPhase
from spec.machine import SpecMachine, _Block
from spec.prefix_cache import BlockKey
from tests.mutants import MUTANTS


class BothChecks(SpecMachine):
    """Runs the full check beside the incremental one after every event and compares."""

    checks = 0

    def check_changed(self) -> None:
        full = check_all(self.state())
        try:
            super().check_changed()
            incremental = None
        except SpecViolation as v:
            incremental = str(v.rule)
        BothChecks.checks += 1
        assert (full[0] if full else None) == incremental, (full, incremental)
        if incremental is not None:
            raise SpecViolation(incremental, "both checks agree")


def request_room(config: DllmConfig) -> int:
    """The most tokens (prompt + new) a request may have and still be accepted: within the
    context and the KV pool, in whole blocks (`spec.config.validate_request`). Below 2 the
    configuration accepts no request at all (the config strategy draws pools smaller than one
    request, to test refusals)."""
    return min(config.max_context, config.kv_slots) // config.block_size * config.block_size


def fitting_request(rng: random.Random, config: DllmConfig, rid: str) -> RequestSpec | None:
    """A random request of at most 12 prompt and 12 new tokens that `config` accepts; None
    where it accepts none (`request_room` under 2)."""
    room = request_room(config)
    if room < 2:
        return None
    prompt = tuple(rng.randint(0, 14) for _ in range(rng.randint(1, min(12, room - 1))))
    return RequestSpec(rid, prompt, rng.randint(1, min(12, room - len(prompt))))


def _drive(factory: object, config: DllmConfig, seed: int) -> Harness:
    """A random program: submits, aborts, rounds and a drain, checked by both checks."""
    h = Harness(factory, config)  # type: ignore[arg-type]
    h.spec = BothChecks(config)
    rng = random.Random(seed)
    ids: list[str] = []
    try:
        for i in range(rng.randint(3, 12)):
            # within the context and the pool (a config with max_context 2, or one pool slot,
            # refused every request before, and a program without rounds then had no event)
            request = fitting_request(rng, config, f"r{i}")
            if request is not None and h.submit(request) is None:
                ids.append(f"r{i}")
            for _ in range(rng.randint(0, 3)):
                h.round()
            if ids and rng.random() < 0.2:
                h.abort(ids.pop(rng.randrange(len(ids))))
        h.drain()
    except SpecViolation:
        pass  # a mutant's guard violation ends the program; the checks agreed until then
    return h


@settings(max_examples=25, deadline=None, database=None)
@given(config=dllm_configs(), seed=st.integers(0, 2**16))
def test_incremental_equals_full_on_random_reference_programs(
    config: DllmConfig, seed: int
) -> None:
    assume(request_room(config) >= 2)  # a pool smaller than any request accepts none
    h = _drive(make_scheduler, config, seed)
    assert h.violation is None
    assert len(h.events) > 0


@pytest.mark.parametrize("name", ["no_free_on_finish", "double_free", "misaligned_page"])
def test_incremental_equals_full_on_mutant_programs(name: str) -> None:
    mutant = MUTANTS[name]
    for seed in range(15):
        cfg = DllmConfig(block_size=2, page_size=4, kv_pages=12, max_context=24)
        _drive(mutant.factory, cfg, seed)


def _corruptions(m: SpecMachine, rng: random.Random) -> list[str]:
    """Corrupt the machine's tables the way a broken handler would (marking what changed)."""
    st_ = m.state()
    done: list[str] = []
    active = sorted(st_.running)
    free = sorted(st_.free_slots)
    if active and free:
        rid = rng.choice(active)
        block = m.state().requests[rid].committed_blocks
        m._own(rng.choice(free), (rid, block + rng.randint(0, 2)))
        m._dirty[rid] = None
        done.append("own a free slot")
    owned = sorted(st_.slot_owners)
    if owned and rng.random() < 0.5:
        slot = rng.choice(owned)
        rid = st_.slot_owners[slot][0]
        m._disown(slot)
        m._dirty[rid] = None
        done.append("drop a slot")
    if active and rng.random() < 0.5:
        r = m._requests[rng.choice(active)]
        if r.row is not None:
            m._dirty_rows.add(r.row)  # a handler that changes a row touches it
            r.row = None
            m._dirty[r.request_id] = None
            done.append("forget a row")
    finished = [rid for rid, r in st_.requests.items() if r.phase is RequestPhase.FINISHED]
    free_rows = [row for row in range(m.config.req_pool_rows) if row not in st_.rows]
    if finished and free_rows and rng.random() < 0.5:
        row = rng.choice(free_rows)
        m._rows[row] = rng.choice(finished)
        m._dirty_rows.add(row)
        done.append("give a row to a finished request")
    return done


@settings(max_examples=40, deadline=None, database=None)
@given(config=dllm_configs(), seed=st.integers(0, 2**16), cut=st.integers(1, 200))
def test_incremental_equals_full_on_corrupted_states(
    config: DllmConfig, seed: int, cut: int
) -> None:
    h = _drive(make_scheduler, config, seed)
    m = SpecMachine(config)
    for e in h.events[: min(cut, len(h.events))]:
        m.apply(e)
        m.check_changed()
    done = _corruptions(m, random.Random(seed))
    full, incremental = _both_checks(m)
    assert full == incremental, (done, full, incremental)


def _both_checks(m: SpecMachine) -> tuple[str | None, str | None]:
    """The rule the full check names on `m`'s state, and the one `check_changed` names on
    what changed (None: none)."""
    full = check_all(m.state())
    try:
        m.check_changed()
        incremental = None
    except SpecViolation as v:
        incremental = str(v.rule)
    return (full[0] if full else None), incremental


def test_server_like_run_keeps_bounded_state() -> None:
    """2,000 requests through the reference, outputs collected as a server would: nothing
    grows with the number of requests served except the remembered ids, which are capped."""
    cfg = DllmConfig(block_size=2, page_size=2, kv_pages=64, max_context=16)
    sched = ReferenceDllmScheduler(cfg, lambda e: None, id_memory=100)
    rng = random.Random(0)
    peak = 0
    for i in range(2000):
        sched.submit(RequestSpec(f"r{i}", tuple(rng.randint(0, 14) for _ in range(3)), 4))
        if i % 7 == 3:
            sched.abort(f"r{i}")
        for _ in range(4):  # arrivals slower than service, as in a server that keeps up
            sched.run_round()
        sched.collect_outputs()
        peak = max(peak, len(sched.seen) + len(sched.outputs) + len(sched.waiting))
    sched.drain()
    assert len(sched.seen) <= 100 + cfg.max_running_requests + len(sched.waiting)
    assert peak < 200


def test_retired_requests_keep_only_what_later_events_need() -> None:
    """retain_finished=False (trace checking) drops tokens but still refuses a reused id and
    events for a finished request."""
    cfg = DllmConfig(block_size=2, page_size=2, kv_pages=16, max_context=16)
    h = Harness(make_scheduler, cfg)
    h.submit(RequestSpec("a", (1, 2, 3), 3))
    h.drain()
    m = SpecMachine(cfg, retain_finished=False)
    m.apply_all(h.events)
    assert m.state().requests["a"].tokens == ()
    from spec.events import Admitted, Submitted

    assert m.enabled(Submitted("a", (1,), 1)) == "unique_submission"
    assert m.enabled(Admitted("a", 0)) == "lifecycle"


# One corruption at a time, each reaching the clause of one invariant that the combined
# corruptions above mask (a mutation review found those clauses of `check_changed` could
# drift from the full check unnoticed): (what it does, the rule the full check names).
def _cache_an_owned_block(m: SpecMachine, rng: random.Random) -> bool:
    """A handler that caches a block and forgets to give up its slots (owned and cached)."""
    owners = sorted(set(m.state().slot_owners.values()))
    if not owners:
        return False
    rid, block = rng.choice(owners)
    slots = tuple(sorted(m._blocks[rid][block]))
    if rng.random() < 0.5:  # sometimes only its first slot: every slot is checked
        slots = slots[:1]
    m._cache.insert(slots, BlockKey(block, (), b""), (rid, block))
    m._dirty_blocks.add((rid, block))
    return True


def _give_a_queued_request_a_block(m: SpecMachine, rng: random.Random) -> bool:
    """A handler that starts a request's block before admitting it."""
    queued = sorted(rid for rid, r in m._requests.items() if r.phase is RequestPhase.QUEUED)
    if not queued:
        return False
    r = m._requests[rng.choice(queued)]
    r.current = _Block(r.committed_blocks, BlockPhase.MASKED, None, None)
    m._dirty[r.request_id] = None
    return True


def _move_a_block_into_another_page(m: SpecMachine, rng: random.Random) -> bool:
    """A handler that moves a block to free slots, whole and at its offset, in a page another
    request uses (only the shared-page clause of `page_alignment` sees it)."""
    st_ = m.state()
    b, p = m.config.block_size, m.config.page_size
    users: dict[int, set[str]] = {}
    for slot, (rid, _block) in st_.slot_owners.items():
        users.setdefault(slot // p, set()).add(rid)
    moves = []
    for (rid, block), held in sorted((k, sorted(v)) for k, v in _by_block(m).items()):
        for page, there in sorted(users.items()):
            start = page * p + (block * b) % p
            slots = list(range(start, start + b))
            if there - {rid} and all(s in st_.free_slots for s in slots):
                moves.append((rid, block, held, slots))
    if not moves:
        return False
    rid, block, held, slots = rng.choice(moves)
    for slot in held:
        m._disown(slot)
    for slot in slots:
        m._own(slot, (rid, block))
    m._dirty[rid] = None
    return True


def _by_block(m: SpecMachine) -> dict[tuple[str, int], set[int]]:
    return {
        (rid, k): set(slots) for rid, blocks in m._blocks.items() for k, slots in blocks.items()
    }


ONE_CORRUPTION = {
    "no_leak": _cache_an_owned_block,
    "carriers_iff_unfinished": _give_a_queued_request_a_block,
    "page_alignment": _move_a_block_into_another_page,
}


@pytest.mark.parametrize("rule", sorted(ONE_CORRUPTION))
def test_incremental_equals_full_on_one_corruption(rule: str) -> None:
    """Over 60 reference programs cut at random, one corruption each: both checks name the
    same rule every time, and the corruption's own rule at least five times."""
    corrupt = ONE_CORRUPTION[rule]
    named = 0
    config = DllmConfig(block_size=2, page_size=4, kv_pages=12, max_context=24)
    for seed in range(60):
        h = _drive(make_scheduler, config, seed)
        rng = random.Random(seed)
        m = SpecMachine(config)
        for e in h.events[: rng.randint(1, len(h.events))]:
            m.apply(e)
            m.check_changed()
        if not corrupt(m, rng):
            continue
        full, incremental = _both_checks(m)
        assert full == incremental, (seed, full, incremental)
        named += full == rule
    assert named >= 5, f"the corruption reached {rule} {named} times in 60 programs"
