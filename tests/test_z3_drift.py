"""Drift guard: the Z3 transition relation and `SpecMachine.apply` agree.

States are reached by random event sequences through SpecMachine from the initial state (a
proposal generator that mostly picks events a scheduler could emit, and sometimes a wrong
one), and also by random perturbations of the machine's internals. For every (state, event)
the symbolic relation (compiled to Python by `properties.symbolic.drift`) must agree with the
machine on enabledness, and when enabled on the successor (on the encoded part of the state).
The symbolic invariants must agree with `spec.invariants` on every state as well.
Some requests are submitted with `stop_sampled` and finish with STOP where the block they
committed last holds `STOP_TOKEN` (a stand-in for a stop string the spec cannot see); every
second request is submitted with `ignore_eos`, so an EOS it commits does not end it, and the
second and third with `stop_token_ids` (`STOP_IDS`), which end it with STOP unless it ignores
EOS too.
The walks also abort requests inside a round, mostly right after they committed a block (what
`DllmPolicy.aborts_after_commit` allows in a round's completion phase), under policies with and
without that option.

The forward-granularity policy model is checked against the reference scheduler driven by a
scripted oracle: same completion forward for every request, in both modes.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import z3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from properties.symbolic.concrete import NotEncodable
from properties.symbolic.drift import encoded, stepper_for
from properties.symbolic.policy import PolicyBounds, PolicyInputs, PolicyRun
from reference.dllm import ReferenceDllmScheduler
from reference.oracle import ScriptedOracle
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SpecViolation
from spec.events import (
    Aborted,
    Admitted,
    BlockCommitted,
    ControlReturned,
    Event,
    Finished,
    FinishReason,
    Forward,
    ForwardRow,
    KvAllocated,
    KvFreed,
    RowAcquired,
    RowReleased,
    StepResult,
    Submitted,
)
from spec.invariants import INVARIANTS
from spec.lifecycles import BlockPhase, RequestPhase
from spec.machine import SpecMachine, finish_condition, initial_masks, stop_output_lengths
from spec.profile import DllmAdmission, DllmPolicy
from spec.state import ACTIVE_PHASES, RequestState
from tests.tier import depth

EOS = 15
STOP_TOKEN = 7  # the proposals' "stop string": a request with a sampled stop ends on it
STOP_IDS = (4, 9, 12)  # the stop token ids of the walks' second and third requests
GEOMETRIES = (
    (1, 1, 8),
    (1, 2, 4),
    (2, 2, 4),
    (2, 4, 4),
    (3, 6, 2),
    (4, 4, 2),
    (1, 3, 3),
    (1, 4, 2),
)
STATS: Counter[str] = Counter()


@st.composite
def configs(
    draw: st.DrawFn,
    geometries: tuple[tuple[int, int, int], ...] = GEOMETRIES,
    *,
    min_context_blocks: int = 1,
    prefix_cache: bool = False,
) -> DllmConfig:
    """A configuration of one of `geometries` (block, page, pages), with a context of at
    least `min_context_blocks` blocks."""
    b, p, k = draw(st.sampled_from(geometries))
    mode = draw(st.sampled_from([Mode.SYNC, Mode.FDFO]))
    fdfo = mode is Mode.FDFO
    return DllmConfig(
        block_size=b,
        page_size=p,
        kv_pages=k,
        req_pool_rows=draw(st.integers(1, 4)),
        max_running_requests=draw(st.integers(1, 4)),
        max_context=b * draw(st.integers(min_context_blocks, (p * k) // b)),
        mode=mode,
        in_place_reuse=fdfo and draw(st.booleans()),
        reloop=fdfo and draw(st.booleans()),
        eos_token_id=draw(st.sampled_from([None, EOS])),
        prefix_cache=prefix_cache,
    )


@st.composite
def policies(draw: st.DrawFn) -> DllmPolicy:
    """The policy fields the relation takes as parameters (the default policy half the time)."""
    if draw(st.booleans()):
        return DllmPolicy()
    return DllmPolicy(
        admission=draw(st.sampled_from(list(DllmAdmission))),
        work_conserving=draw(st.booleans()),
        rows_released_between_rounds=draw(st.booleans()),
        aborts_after_commit=draw(st.booleans()),
        priority_order=(priority := draw(st.booleans())),
        longest_output_first=(longest := draw(st.booleans())),
        free_queue_order=not (priority or longest) and draw(st.booleans()),
    )


# ---------------------------------------------------------------------------- proposals


def _aligned_slots(m: SpecMachine, rid: str, k: int, rng: random.Random) -> tuple[int, ...]:
    c = m.config
    b, p = c.block_size, c.page_size
    owner = m.state().slot_owners
    off = (k * b) % p
    if off:
        prev = [s for s, o in owner.items() if o == (rid, k - 1)]
        start = max(prev) + 1 if prev else rng.randrange(c.kv_slots - b + 1)
    else:
        free_pages = [
            pg for pg in range(c.kv_pages) if not any(s in owner for s in range(pg * p, pg * p + p))
        ]
        pg = free_pages[0] if free_pages and rng.random() < 0.7 else rng.choice(free_pages or [0])
        start = pg * p
    return tuple(range(start, start + b))


def _good_events(m: SpecMachine, rng: random.Random) -> list[Event]:
    """Events a scheduler could emit now (most are enabled)."""
    c = m.config
    s = m.state()
    b = c.block_size
    rnd = s.round
    out: list[Event] = []
    n = len(s.requests)
    if n < 4:
        limit = min(c.max_context, c.kv_slots)
        pl = rng.randint(1, max(1, min(2 * b, limit - 1)))
        mn = rng.randint(1, max(1, min(2 * b, limit - pl)))
        prompt = tuple(rng.randrange(15) for _ in range(pl))
        # every second request ignores EOS, the second and third have stop token ids (by its
        # index: no extra draw)
        stop = rng.random() < 0.5
        out.append(
            Submitted(
                f"r{n}",
                prompt,
                mn,
                stop_sampled=stop,
                ignore_eos=n % 2 == 1,
                stop_token_ids=STOP_IDS if n in (1, 2) else (),
                # drawn only under a priority order (the other walks draw as before)
                priority=rng.randrange(3) if m.policy.priority_order else 0,
            )
        )
    free_rows = [r for r in range(c.req_pool_rows) if r not in s.rows]
    if s.queue and rnd.forwards == 0 and free_rows:
        out.append(Admitted(s.queue[0], rng.choice(free_rows)))
        if len(s.queue) > 1 and (
            m.policy.admission is DllmAdmission.PREFILL_FIRST
            or m.policy.orders_queue
            or m.policy.free_queue_order
        ):
            # a request whose first block is prompt-only may pass those whose first block is
            # not; under a priority order or longest-output-first, one that is not the head
            # must not pass it; under a free order any may
            out.append(Admitted(rng.choice(s.queue[1:]), rng.choice(free_rows)))
    owners = s.slot_owners
    for r in s.requests.values():
        rid = r.request_id
        cur = r.current
        owned = sorted(x for x, o in owners.items() if o[0] == rid)
        if r.phase in ACTIVE_PHASES:
            if rnd.forwards == 0 and (cur is None or cur.slots is None):
                k = r.committed_blocks
                out.append(KvAllocated(rid, k, _aligned_slots(m, rid, k, rng)))
            if rnd.forwards == 0 and r.row is None and free_rows:
                out.append(RowAcquired(rid, rng.choice(free_rows)))
            if (
                m.policy.rows_released_between_rounds
                and rnd.forwards
                and r.row is not None
                and cur is not None
                and cur.phase in (BlockPhase.DENOISING, BlockPhase.COMPLETE)
                and not rnd.pending_steps
            ):
                out.append(RowReleased(rid, r.row))
            batch_done = all(
                x.current is None or x.current.phase is BlockPhase.DONE
                for x in s.requests.values()
                if x.phase in ACTIVE_PHASES
            )
            if (
                cur is not None
                and cur.phase is BlockPhase.DONE
                and not rnd.pending_steps
                and (c.mode is Mode.FDFO or batch_done)
            ):
                toks = []
                for i in range(b):
                    pos = cur.index * b + i
                    if pos < len(r.prompt):
                        toks.append(r.prompt[pos])
                    elif c.eos_token_id is not None and rng.random() < 0.15:
                        toks.append(c.eos_token_id)
                    elif r.stop_sampled and rng.random() < 0.4:
                        toks.append(STOP_TOKEN)
                    else:
                        toks.append(rng.randrange(15))
                out.append(BlockCommitted(rid, cur.index, tuple(toks)))
            due = finish_condition(c, r)
            stops = _stops_now(m, r)
            if r.phase is RequestPhase.ADMITTED and (due is not None or stops):
                if owned:
                    out.append(KvFreed(rid, tuple(owned)))
                elif r.row is not None:
                    out.append(RowReleased(rid, r.row))
                else:
                    # a stop found in the block wins over EOS and LENGTH (as in SGLang)
                    out.append(Finished(rid, FinishReason.STOP if stops or due is None else due))
            # an abort inside the round right after a commit, in the completion phase (SGLang's
            # `to_finish`; accepted under aborts_after_commit when the block held a generated
            # token)
            # (most often once its KV and row are given back, where it could finish); the
            # other in-round aborts come from the 1% here and from the queued requests' below
            after_commit = (
                rnd.forwards
                and r.phase is RequestPhase.ADMITTED
                and r.last_commit_round == rnd.index
                and not any(k[0] == rid for k in rnd.pending_steps)
            )
            if rng.random() < 0.01 or (
                after_commit and rng.random() < (0.6 if not owned and r.row is None else 0.2)
            ):
                if owned:
                    out.append(KvFreed(rid, tuple(owned)))
                elif r.row is not None:
                    out.append(RowReleased(rid, r.row))
                else:
                    out.append(Aborted(rid))
            if (
                c.mode is Mode.FDFO
                and not c.in_place_reuse
                and rnd.forwards
                and cur is not None
                and cur.slots is not None
                and cur.phase is not BlockPhase.DONE
                and not rnd.pending_steps
            ):
                out.append(KvFreed(rid, tuple(cur.slots)))
        if r.phase is RequestPhase.QUEUED and rng.random() < 0.02:
            out.append(Aborted(rid))
    for rid, blk in rnd.pending_steps:
        masked_in = rnd.pending_masks[(rid, blk)]
        if masked_in == 0:
            accept, rem = (b, 0) if rng.random() < 0.85 else (0, 0)
        else:
            accept, rem = 0, rng.randint(0, masked_in - 1)
        out.append(StepResult(rid, blk, accept, rem))
    if not rnd.pending_steps:
        rows = []
        for r in s.requests.values():
            cur = r.current
            if r.phase in ACTIVE_PHASES and cur is not None:
                retained = cur.alloc_round is not None and cur.alloc_round < rnd.index
                masked = (
                    initial_masks(c, len(r.prompt), cur.index) if cur.masks is None else cur.masks
                )
                rows.append(ForwardRow(r.request_id, cur.index, retained, b, masked))
        if rows:
            out.append(Forward(tuple(rows)))
        if rows and m.policy.admission is DllmAdmission.PREFILL_FIRST:
            # PREFILL_FIRST batches: the prompt-only rows, or the others
            prompt_only = [
                x for x in rows if (x.block_index + 1) * b <= len(s.requests[x.request_id].prompt)
            ]
            rest = [x for x in rows if x not in prompt_only]
            for part in (prompt_only, rest):
                if part and len(part) < len(rows):
                    out.append(Forward(tuple(part)))
        out.append(ControlReturned(rnd.index))
    return out


def _stops_now(m: SpecMachine, r: RequestState) -> bool:
    """The proposals' engine stops `r` now: it samples its stops, committed a block this round,
    and that block holds `STOP_TOKEN` at a position a STOP output may end at."""
    if not r.stop_sampled or r.last_commit_round != m.round_index:
        return False
    return any(r.generated[n - 1] == STOP_TOKEN for n in stop_output_lengths(m.config, r))


def _mutate(e: Event, m: SpecMachine, rng: random.Random) -> Event:
    """A small change to an event (often making it wrong)."""
    ids = [*list(m.state().requests), "rX"]
    c = m.config
    if isinstance(e, Submitted):
        return rng.choice(
            [
                Submitted(rng.choice(ids), e.prompt, e.max_new_tokens),
                Submitted(e.request_id, (), e.max_new_tokens),
                Submitted(e.request_id, (*e.prompt, -1), e.max_new_tokens),
                Submitted(e.request_id, e.prompt, rng.randint(0, 2 * c.max_context)),
                Submitted(e.request_id, e.prompt, e.max_new_tokens, not e.stop_sampled),
            ]
        )
    if isinstance(e, Admitted):
        return rng.choice(
            [Admitted(rng.choice(ids), e.row), Admitted(e.request_id, rng.randrange(4))]
        )
    if isinstance(e, KvAllocated):
        start = rng.randrange(c.kv_slots - c.block_size + 1)
        return rng.choice(
            [
                KvAllocated(e.request_id, e.block_index, tuple(range(start, start + c.block_size))),
                KvAllocated(e.request_id, e.block_index + rng.choice([-1, 1]), e.slots),
                KvAllocated(rng.choice(ids), e.block_index, e.slots),
            ]
        )
    if isinstance(e, KvFreed):
        return rng.choice(
            [
                KvFreed(e.request_id, e.slots[:-1]),
                KvFreed(rng.choice(ids), e.slots),
                KvFreed(e.request_id, (*e.slots, rng.randrange(c.kv_slots))),
            ]
        )
    if isinstance(e, RowReleased):
        return RowReleased(e.request_id, rng.randrange(4))
    if isinstance(e, Forward):
        rows = list(e.rows)
        i = rng.randrange(len(rows))
        r = rows[i]
        rows[i] = rng.choice(
            [
                ForwardRow(r.request_id, r.block_index, not r.reused, r.num_tokens, r.masked),
                ForwardRow(r.request_id, r.block_index, r.reused, r.num_tokens - 1, r.masked),
                ForwardRow(r.request_id, r.block_index, r.reused, r.num_tokens, r.masked + 1),
                ForwardRow(r.request_id, r.block_index + 1, r.reused, r.num_tokens, r.masked),
            ]
        )
        if rng.random() < 0.3:
            rows.pop(i)
        return Forward(tuple(rows))
    if isinstance(e, StepResult):
        return rng.choice(
            [
                StepResult(e.request_id, e.block_index, c.block_size, e.masks_remaining),
                StepResult(e.request_id, e.block_index, 1, e.masks_remaining),
                StepResult(e.request_id, e.block_index, e.accept_length, e.masks_remaining + 1),
            ]
        )
    if isinstance(e, BlockCommitted):
        toks = list(e.tokens)
        toks[rng.randrange(len(toks))] = rng.choice([-1, 7, EOS])
        return BlockCommitted(e.request_id, e.block_index, tuple(toks))
    if isinstance(e, Finished):
        return Finished(e.request_id, rng.choice(list(FinishReason)))
    if isinstance(e, ControlReturned):
        return ControlReturned(e.round_index + rng.choice([-1, 1]))
    if isinstance(e, Aborted):
        return Aborted(rng.choice(ids))
    return e


def _random_event(m: SpecMachine, rng: random.Random) -> Event:
    ids = [*list(m.state().requests), f"r{len(m.state().requests)}"]
    c = m.config
    rid = rng.choice(ids)
    start = rng.randrange(c.kv_slots - c.block_size + 1)
    candidates: list[Event] = [
        Admitted(rid, rng.randrange(4)),
        RowAcquired(rid, rng.randrange(4)),
        KvAllocated(rid, rng.randrange(3), tuple(range(start, start + c.block_size))),
        KvFreed(rid, tuple(sorted(rng.sample(range(c.kv_slots), rng.randint(0, 3))))),
        Finished(rid, FinishReason.LENGTH),
        Finished(rid, FinishReason.STOP),
        ControlReturned(m.round_index),
        StepResult(rid, rng.randrange(3), c.block_size, 0),
    ]
    return rng.choice(candidates)


# ---------------------------------------------------------------------------- comparison


def _compare(m: SpecMachine, e: Event) -> bool:
    """Check agreement on (state, event) under the machine's policy; True if the event was
    applied to `m`."""
    stepper = stepper_for(m.config)
    try:
        verdict = stepper.verdict(m.state(), e, m.policy)
    except NotEncodable:
        STATS["not encodable"] += 1
        return False
    trial = m.copy()
    try:
        trial.apply(e)
        conc_ok, rule = True, ""
    except SpecViolation as v:
        conc_ok, rule = False, v.rule
    except Exception as err:  # the spec machine itself crashed on this (odd) state
        STATS[f"machine crash {type(err).__name__}"] += 1
        return False
    assert verdict.enabled == conc_ok, (
        f"enabledness differs on {e!r}: SpecMachine {'accepts' if conc_ok else rule}, "
        f"Z3 relation {'accepts' if verdict.enabled else verdict.failed_rules}\n{m.render()}"
    )
    stop = isinstance(e, Finished) and e.reason is FinishReason.STOP
    if isinstance(e, Aborted):
        _count_abort_in_round(m, e, conc_ok, rule, verdict.failed_rules)
    if not conc_ok:
        STATS["both reject"] += 1
        STATS[f"reject {rule}"] += 1
        if rule in verdict.failed_rules:
            STATS["same first rule"] += 1
            STATS[f"same rule {rule}"] += 1
            if stop and rule == "finish_condition":
                STATS["reject a stop on its finish condition"] += 1
            if _past_ignored_eos(m, e) and isinstance(e, Finished) and rule == "finish_condition":
                STATS[f"reject {e.reason.value} past an ignored EOS"] += 1
            if _at_stop_token(m, e) and isinstance(e, Finished) and rule == "finish_condition":
                STATS[f"reject {e.reason.value} at a stop token id"] += 1
            if rule == "fcfs_admission" and _passes_a_later_longer_output(m, e):
                STATS["refuse fcfs_admission past a later, longer output"] += 1
        return False
    STATS["both accept"] += 1
    if stop:
        STATS["accept a stop"] += 1
    STATS[f"accept {e.kind}"] += 1
    if _past_ignored_eos(m, e):
        STATS[f"accept {e.kind} past an ignored EOS"] += 1
    if _at_stop_token(m, e):
        STATS[f"accept {e.kind} at a stop token id"] += 1
    if _past_ignored_stop_token(m, e):
        STATS[f"accept {e.kind} past an ignored stop token id"] += 1
    _count_policy_cases(m, e)
    after = encoded(trial.state(), stepper.geom, m.policy)
    assert verdict.successor is not None
    diff = {k: (verdict.successor[k], v) for k, v in after.items() if verdict.successor[k] != v}
    assert not diff, f"successor differs on {e!r} (field: (Z3, SpecMachine)): {diff}\n{m.render()}"
    m.apply(e)
    return True


def _count_abort_in_round(
    m: SpecMachine, e: Aborted, accepted: bool, rule: str, failed: tuple[str, ...]
) -> None:
    """Count aborts after the round's first forward (rule scheduler_phase, and
    `DllmPolicy.aborts_after_commit`): accepted, or refused on scheduler_phase by both."""
    s = m.state()
    r = s.requests.get(e.request_id)
    if r is None or not s.round.forwards:
        return
    after_commit = r.last_commit_round == s.round.index and bool(stop_output_lengths(m.config, r))
    if accepted:
        STATS["accept an abort in a round"] += 1
        return
    if rule != "scheduler_phase" or rule not in failed:
        return
    if m.policy.aborts_after_commit:
        STATS["reject an abort in a round under aborts_after_commit"] += 1
    elif after_commit:
        STATS["reject an abort after a commit without aborts_after_commit"] += 1


def _past_ignored_eos(m: SpecMachine, e: Event) -> bool:
    """`e` finishes, or ends the round of, a request that committed an EOS it ignores."""
    if not isinstance(e, Finished | ControlReturned):
        return False
    eos = m.config.eos_token_id
    requests = m.state().requests.values()
    return any(
        r.ignore_eos
        and r.phase in ACTIVE_PHASES
        and eos in r.generated[: r.max_new_tokens]
        and (isinstance(e, ControlReturned) or r.request_id == e.request_id)
        for r in requests
    )


def _at_stop_token(m: SpecMachine, e: Event) -> bool:
    """`e` finishes a request without a sampled stop that one of its stop token ids ended."""
    if not isinstance(e, Finished):
        return False
    r = m.state().requests.get(e.request_id)
    return (
        r is not None
        and not r.stop_sampled
        and r.phase in ACTIVE_PHASES
        and finish_condition(m.config, r) is FinishReason.STOP
    )


def _past_ignored_stop_token(m: SpecMachine, e: Event) -> bool:
    """`e` finishes, or ends the round of, a request that committed a stop token id it ignores
    (with `ignore_eos`)."""
    if not isinstance(e, Finished | ControlReturned):
        return False
    return any(
        r.ignore_eos
        and r.phase in ACTIVE_PHASES
        and set(r.stop_token_ids) & set(r.generated[: r.max_new_tokens])
        and (isinstance(e, ControlReturned) or r.request_id == e.request_id)
        for r in m.state().requests.values()
    )


def _output_order(m: SpecMachine, e: Event) -> tuple[list[bool], list[bool]] | None:
    """When `e` admits a queued request r: for each request queued ahead of r, and for each
    queued behind it, whether it was submitted after r with a longer output (`max_new_tokens`)
    and whether it was submitted before r with a shorter one."""
    s = m.state()
    if not isinstance(e, Admitted) or e.request_id not in s.queue:
        return None
    queue, submitted = list(s.queue), list(s.requests)
    at, r = queue.index(e.request_id), s.requests[e.request_id]

    def later_longer(j: str) -> bool:
        later = submitted.index(j) > submitted.index(r.request_id)
        return later and s.requests[j].max_new_tokens > r.max_new_tokens

    def earlier_shorter(j: str) -> bool:
        earlier = submitted.index(j) < submitted.index(r.request_id)
        return earlier and s.requests[j].max_new_tokens < r.max_new_tokens

    return [later_longer(j) for j in queue[:at]], [earlier_shorter(j) for j in queue[at + 1 :]]


def _passes_a_later_longer_output(m: SpecMachine, e: Event) -> bool:
    """`e` admits a request the queue holds behind one submitted after it with a longer output:
    only `longest_output_first` puts that one ahead."""
    order = _output_order(m, e)
    return order is not None and any(order[0])


def _ahead_of_an_earlier_shorter_output(m: SpecMachine, e: Event) -> bool:
    """`e` admits a request the queue holds ahead of one submitted before it with a shorter
    output: only `longest_output_first` puts it there."""
    order = _output_order(m, e)
    return order is not None and any(order[1])


def _count_policy_cases(m: SpecMachine, e: Event) -> None:
    """Count accepted events that only a non-default policy allows."""
    s = m.state()
    if isinstance(e, Admitted) and s.queue and s.queue[0] != e.request_id:
        STATS["accept an admission past the head"] += 1
    queued = [rid for rid, r in s.requests.items() if r.phase is RequestPhase.QUEUED]
    if isinstance(e, Admitted) and queued and queued[0] != e.request_id:
        STATS["accept an admission ahead of an earlier submission"] += 1
    if _ahead_of_an_earlier_shorter_output(m, e):
        STATS["accept an admission ahead of an earlier, shorter output"] += 1
    if isinstance(e, ControlReturned) and any(
        r.row is None for r in s.requests.values() if r.phase in ACTIVE_PHASES
    ):
        STATS["accept a round end with a row released"] += 1
    if not m.policy.work_conserving and isinstance(e, Forward | ControlReturned):
        conserving = m.copy()
        conserving.policy = dataclasses.replace(m.policy, work_conserving=True)
        try:
            conserving.apply(e)
        except SpecViolation as v:
            if v.rule == "work_conserving":
                STATS["accept a round that leaves the head waiting"] += 1


def _check_invariants(m: SpecMachine) -> None:
    stepper = stepper_for(m.config)
    try:
        st_ = m.state()
        sym = stepper.invariants(st_, m.policy)
    except NotEncodable:
        return
    for name, pred in INVARIANTS.items():
        try:
            conc = pred(st_) is None
        except Exception:  # a predicate crashing on a perturbed state
            STATS["invariant crash"] += 1
            continue
        assert sym[name] == conc, f"invariant {name}: Z3 {sym[name]}, spec {conc}\n{m.render()}"


def _perturb(m: SpecMachine, rng: random.Random) -> None:
    """A random change to the machine's internals, within the encodable domain."""
    c = m.config
    reqs = list(m._requests.values())
    choice = rng.randrange(10)
    if choice == 0:
        s = rng.randrange(c.kv_slots)
        if s in m._owner and rng.random() < 0.5:
            del m._owner[s]
        elif reqs:
            m._owner[s] = (rng.choice(reqs).request_id, rng.randrange(3))
    elif choice == 1 and reqs:
        rng.choice(reqs).phase = rng.choice(list(RequestPhase))
    elif choice == 2 and reqs:
        r = rng.choice(reqs)
        if r.current is not None:
            r.current.phase = rng.choice(list(BlockPhase))
            r.current.masks = rng.choice([None, 0, 1, c.block_size])
    elif choice == 3:
        m._round.newly_done_in_last_forward = not m._round.newly_done_in_last_forward
    elif choice == 4:
        m._round.forwards = rng.randrange(3)
        m._round.committed = rng.randrange(2)
    elif choice == 5 and reqs:
        r = rng.choice(reqs)
        r.row = rng.choice([None, *range(c.req_pool_rows)])
    elif choice == 6 and reqs:
        row = rng.randrange(c.req_pool_rows)
        if row in m._rows and rng.random() < 0.5:
            del m._rows[row]
        else:
            m._rows[row] = rng.choice(reqs).request_id
    elif choice == 7 and reqs:
        r = rng.choice(reqs)
        if r.current is not None:
            r.current.alloc_round = rng.choice([None, 0, m._round.index])
            if rng.random() < 0.5:
                r.current.slots = None
    elif choice == 8 and reqs:
        r = rng.choice(reqs)
        if r.current is None:
            # a block more or less, its tokens with it (the encoding's committed length)
            if rng.random() < 0.5:
                r.committed_blocks += 1
                r.tokens.extend(rng.randrange(15) for _ in range(c.block_size))
            elif r.committed_blocks:
                r.committed_blocks -= 1
                del r.tokens[-c.block_size :]
    elif choice == 9 and reqs:
        r = rng.choice(reqs)
        x = rng.random()
        if x < 0.3:
            r.stop_sampled = not r.stop_sampled
        elif x < 0.4:
            r.ignore_eos = not r.ignore_eos
        elif x < 0.5:  # reindex keeps an ordered queue in order
            r.priority = rng.randrange(3)
            if m.policy.longest_output_first:  # a draw only then (the other walks as before)
                r.max_new_tokens = rng.randint(1, 2 * c.block_size)
        else:  # no later round than the current one (the encoding cannot hold that)
            idx = m._round.index
            r.last_commit_round = rng.choice([None, max(0, idx - 1), idx])
    m.reindex()  # the machine's derived indexes follow the edited tables


WEIGHT = {
    "submitted": 1.0,
    "admitted": 3.0,
    "kv_allocated": 3.0,
    "kv_freed": 3.0,
    "row_released": 3.0,
    "finished": 3.0,
    "aborted": 1.0,
    "forward": 3.0,
    "step_result": 4.0,
    "block_committed": 4.0,
    "control_returned": 0.7,
}


def _pick(good: list[Event], rng: random.Random) -> Event:
    return rng.choices(good, weights=[WEIGHT.get(e.kind, 1.0) for e in good])[0]


def _walk(m: SpecMachine, rng: random.Random, steps: int) -> None:
    for _ in range(steps):
        _check_invariants(m)
        good = _good_events(m, rng)
        x = rng.random()
        if good and x < 0.75:
            e = _pick(good, rng)
        elif good and x < 0.92:
            e = _mutate(rng.choice(good), m, rng)
        else:
            e = _random_event(m, rng)
        _compare(m, e)


# The random walks' settings: derandomized (CI replays the same walks), 60 walks each in the
# full tier, 30 per push (tests/tier.py). The directed tests below reach every case (both
# outcomes, stops, aborts, each policy rule; the cache's every rule within 8 walks), so these
# walks add states, not cases; 100 walks cost 25 s more of CI for the same cases.
_WALKS = settings(
    max_examples=depth(30, 60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)


@_WALKS
@given(
    config=configs(),
    policy=policies(),
    rng=st.randoms(use_true_random=False),
    steps=st.integers(20, 90),
)
def test_relation_agrees_with_spec_machine_on_reached_states(
    config: DllmConfig, policy: DllmPolicy, rng: random.Random, steps: int
) -> None:
    m = SpecMachine(config, policy)
    _walk(m, rng, steps)


@_WALKS
@given(
    config=configs(),
    policy=policies(),
    rng=st.randoms(use_true_random=False),
    steps=st.integers(5, 40),
)
def test_relation_agrees_with_spec_machine_on_perturbed_states(
    config: DllmConfig, policy: DllmPolicy, rng: random.Random, steps: int
) -> None:
    m = SpecMachine(config, policy)
    _walk(m, rng, steps)
    for _ in range(rng.randint(1, 3)):
        _perturb(m, rng)
    _check_invariants(m)
    for _ in range(8):
        good = _good_events(m, rng)
        e = _pick(good, rng) if good and rng.random() < 0.7 else _random_event(m, rng)
        _compare(m.copy(), e)
    _compare_stops(m, rng)


def _free_to_finish(m: SpecMachine, rid: str) -> SpecMachine:
    """A copy of `m` in which `rid` holds no slot and no row and, if it was running, sits
    between blocks: free to finish as far as every guard of `Finished` but its condition."""
    trial = m.copy()
    r = trial._requests[rid]
    for slot in [s for s, o in trial._owner.items() if o[0] == rid]:
        del trial._owner[slot]
    if r.row is not None:
        trial._rows.pop(r.row, None)
        r.row = None
    if r.phase is RequestPhase.RUNNING:
        r.phase, r.current = RequestPhase.ADMITTED, None
    return trial


def _compare_finishes_after(m: SpecMachine, change: Callable[[Any], None]) -> None:
    """`Finished` with each reason of every request, first made free to finish and then
    changed by `change` (given the spec's own request record)."""
    for rid in list(m._requests):
        trial = _free_to_finish(m, rid)
        change(trial._requests[rid])
        trial.reindex()
        for reason in FinishReason:
            _compare(trial, Finished(rid, reason))


def _compare_ignored_eos(m: SpecMachine, rng: random.Random) -> None:
    """`Finished` with each reason of every request, first made free to finish, given a
    drawn `ignore_eos` and (most of the time) an EOS among its generated tokens: walks seldom
    reach a finish past an ignored EOS."""
    eos = m.config.eos_token_id

    def change(r: Any) -> None:
        r.ignore_eos = rng.random() < 0.7
        generated = range(len(r.prompt), len(r.tokens))
        if eos is not None and generated and rng.random() < 0.8:
            r.tokens[rng.choice(generated)] = eos

    _compare_finishes_after(m, change)


def _compare_stop_token_ids(m: SpecMachine, rng: random.Random) -> None:
    """`Finished` with each reason of every request, first made free to finish and given
    `STOP_IDS` (most of the time), a drawn `ignore_eos` and `stop_sampled`, and a stop token id
    and an EOS among its generated tokens (each most of the time, in either order)."""
    eos = m.config.eos_token_id

    def change(r: Any) -> None:
        r.stop_token_ids = STOP_IDS if rng.random() < 0.8 else ()
        r.ignore_eos = rng.random() < 0.3
        r.stop_sampled = rng.random() < 0.3
        generated = range(len(r.prompt), len(r.tokens))
        for token in (rng.choice(STOP_IDS), eos):
            if token is not None and generated and rng.random() < 0.7:
                r.tokens[rng.choice(generated)] = token

    _compare_finishes_after(m, change)


def _compare_stops(m: SpecMachine, rng: random.Random) -> None:
    """`Finished(STOP)` of every request, first made free to finish (between blocks, holding
    no slot and no row) and given a drawn stop flag, latest commit round, 0 to 2 more
    committed blocks and (half the time) max_new_tokens: walks seldom reach a request free to
    finish whose STOP is wrong, so each part of the STOP condition is compared here with the
    other guards of `Finished` true. `Aborted` of the same request is compared too, at a drawn
    number of forwards into the round and under both settings of aborts_after_commit (the
    same conjuncts, without stop_sampled, decide an abort in a round)."""
    idx = m.round_index
    for rid in list(m._requests):
        trial = _free_to_finish(m, rid)
        r = trial._requests[rid]
        r.stop_sampled = rng.random() < 0.7
        r.last_commit_round = rng.choice([None, max(0, idx - 1), idx, idx])
        more = rng.choice([0, 0, 1, 2])  # blocks more, as if committed this round
        r.committed_blocks += more
        r.tokens.extend(rng.randrange(15) for _ in range(more * trial.config.block_size))
        if rng.random() < 0.5:  # at most its generated tokens: maybe reached before the last
            r.max_new_tokens = rng.randint(1, max(1, len(r.tokens) - len(r.prompt)))
        trial.reindex()
        _compare(trial, Finished(rid, FinishReason.STOP))
        # the same request aborted, maybe inside the round, under both settings of
        # aborts_after_commit: each conjunct of committed_generated_this_round, both ways
        for after_commit in (False, True):
            aborting = trial.copy()
            aborting.policy = dataclasses.replace(m.policy, aborts_after_commit=after_commit)
            aborting._round.forwards = rng.choice([0, 1, 1, 2])
            for key in [k for k in aborting._round.pending if k[0] == rid]:
                del aborting._round.pending[key]
            aborting.reindex()
            _compare(aborting, Aborted(rid))


def _walk_config(mode: Mode, **changes: Any) -> DllmConfig:
    """The coverage tests' small configuration (block 2, four pages of 4) in `mode`."""
    return DllmConfig(block_size=2, page_size=4, kv_pages=4, mode=mode, **changes)


def _walk_then(
    compare: Callable[[SpecMachine, random.Random], None], *, seed: int, walks: int
) -> None:
    """`walks` walks of 100 steps per mode (FDFO with reuse, sync; short requests with an EOS),
    each followed by `compare` on its final machine."""
    rng = random.Random(seed)
    for mode in (Mode.FDFO, Mode.SYNC):
        config = _walk_config(
            mode, max_context=8, in_place_reuse=mode is Mode.FDFO, eos_token_id=EOS
        )
        for _ in range(walks):
            m = SpecMachine(config)
            _walk(m, rng, 100)
            compare(m, rng)


def _require_seen(before: Counter[str], cases: Iterable[str]) -> None:
    """Each case was counted since `before`."""
    seen = STATS - before
    for case in cases:
        assert seen[case] > 0, (case, seen)


def test_the_walks_cover_both_outcomes() -> None:
    """The comparisons above saw many accepted and many rejected events (not vacuous)."""
    config = DllmConfig(block_size=2, page_size=4, kv_pages=4, max_context=16)
    rng = random.Random(0)
    before = STATS.copy()
    # a fresh machine per walk: one that strands its machine (a carried block's KV freed, say:
    # no round can end) does not stall the others
    for _ in range(5):
        _walk(SpecMachine(config), rng, 60)
    seen = STATS - before
    assert seen["both accept"] > 50 and seen["both reject"] > 20, seen


def test_the_walks_finish_with_stop_both_ways() -> None:
    """STOP is exercised: the machine and the relation both accept a STOP (a request with a
    sampled stop, right after it committed a block holding a generated token) and both reject
    one on its finish condition, over FDFO and sync walks."""
    before = STATS.copy()
    rng = random.Random(2)
    for mode in (Mode.FDFO, Mode.SYNC):
        # short requests: more of them finish within a walk
        config = _walk_config(
            mode, max_context=8, in_place_reuse=mode is Mode.FDFO, eos_token_id=EOS
        )
        for _ in range(5):
            _walk(SpecMachine(config), rng, 80)
    _require_seen(before, ("accept a stop", "reject a stop on its finish condition"))


def test_the_walks_run_past_an_ignored_eos_both_ways() -> None:
    """`Submitted.ignore_eos` is exercised: a request that committed an EOS it ignores is
    still running when its round ends, and finishes with LENGTH, in both; a Finished(EOS) for
    it is refused by both on finish_condition, over FDFO and sync walks."""
    before = STATS.copy()
    _walk_then(_compare_ignored_eos, seed=5, walks=12)
    _require_seen(
        before,
        (
            "accept control_returned past an ignored EOS",
            "accept finished past an ignored EOS",
            "reject eos past an ignored EOS",
        ),
    )


def test_the_walks_stop_at_stop_token_ids_both_ways() -> None:
    """`Submitted.stop_token_ids` is exercised: a request whose first ending token is one of
    its stop token ids finishes (with STOP) in both, and a Finished(eos) or Finished(length)
    for it is refused by both on finish_condition; one that ignores EOS finishes past its stop
    token ids in both, over FDFO and sync walks (few walks reach a stop token: 30 each)."""
    before = STATS.copy()
    _walk_then(_compare_stop_token_ids, seed=9, walks=30)
    _require_seen(
        before,
        (
            "accept finished at a stop token id",
            "reject eos at a stop token id",
            "reject length at a stop token id",
            "accept finished past an ignored stop token id",
        ),
    )


def _one_output_block(ignore_eos: bool) -> SpecMachine:
    """Sync, block 2: `r0` (prompt 2 tokens, 3 new, stop token id 4) has committed its prompt
    block in round 0 and stepped its first output block to done in round 1."""
    m = SpecMachine(_walk_config(Mode.SYNC, max_context=8, in_place_reuse=False, eos_token_id=EOS))
    for e in (
        Submitted("r0", (1, 1), 3, ignore_eos=ignore_eos, stop_token_ids=(4,)),
        Admitted("r0", 0),
        KvAllocated("r0", 0, (0, 1)),
        Forward((ForwardRow("r0", 0, False, 2, 0),)),
        StepResult("r0", 0, 2, 0),
        BlockCommitted("r0", 0, (1, 1)),
        ControlReturned(0),
        KvAllocated("r0", 1, (2, 3)),
        Forward((ForwardRow("r0", 1, False, 2, 2),)),
        StepResult("r0", 1, 0, 0),
        Forward((ForwardRow("r0", 1, False, 2, 0),)),  # the final-KV forward
        StepResult("r0", 1, 2, 0),
    ):
        m.apply(e)
    return m


@pytest.mark.parametrize("ignore_eos", [False, True])
@pytest.mark.parametrize(
    ("tokens", "due"),
    [
        ((EOS, 4), FinishReason.EOS),
        ((4, EOS), FinishReason.STOP),
        ((2, 4), FinishReason.STOP),
        ((EOS, 2), FinishReason.EOS),
        ((2, 2), None),
    ],
)
def test_a_block_with_an_eos_and_a_stop_token_id_agrees_in_either_order(
    tokens: tuple[int, int], due: FinishReason | None, ignore_eos: bool
) -> None:
    """The first ending token of a block decides, in both: committing it, then each
    `Finished` (after its KV and row are given back) and the end of the round; with
    `ignore_eos` neither token ends the request. The walks seldom commit both in one block."""
    m = _one_output_block(ignore_eos)
    assert _compare(m, BlockCommitted("r0", 1, tokens))
    want = None if ignore_eos else due
    free = _free_to_finish(m, "r0")
    free.reindex()
    ended = {r for r in FinishReason if _compare(free.copy(), Finished("r0", r))}
    assert ended == (set() if want is None else {want})
    assert _compare(m.copy(), ControlReturned(1)) is (want is None)


@pytest.mark.parametrize("mode", [Mode.FDFO, Mode.SYNC])
def test_the_walks_abort_in_a_round_both_ways(mode: Mode) -> None:
    """Rule scheduler_phase of `Aborted` under `DllmPolicy.aborts_after_commit` is exercised by
    the walks themselves: with the option, an abort right after a commit in the completion
    phase is accepted by both and one elsewhere in the round refused by both on
    scheduler_phase; without it, an abort right after such a commit is refused by both."""
    fdfo = mode is Mode.FDFO
    config = _walk_config(
        mode, max_context=8, max_running_requests=2, in_place_reuse=fdfo, reloop=fdfo
    )
    rng = random.Random(4)
    before = STATS.copy()
    for policy in (DllmPolicy(aborts_after_commit=True), DllmPolicy()):
        for _ in range(12):
            _walk(SpecMachine(config, policy), rng, 100)
    _require_seen(
        before,
        (
            "accept an abort in a round",
            "reject an abort in a round under aborts_after_commit",
            "reject an abort after a commit without aborts_after_commit",
        ),
    )


@pytest.mark.parametrize(
    ("policy", "mode", "expected"),
    [
        (DllmPolicy(), Mode.SYNC, ("reject work_conserving",)),
        (
            DllmPolicy(work_conserving=False),
            Mode.SYNC,
            ("accept a round that leaves the head waiting",),
        ),
        (
            DllmPolicy(admission=DllmAdmission.PREFILL_FIRST, work_conserving=False),
            Mode.FDFO,
            ("reject prefill_first", "reject fcfs_admission", "accept an admission past the head"),
        ),
        (
            DllmPolicy(rows_released_between_rounds=True),
            Mode.FDFO,
            ("accept row_acquired", "accept a round end with a row released"),
        ),
        (
            DllmPolicy(priority_order=True),
            Mode.SYNC,
            (
                "reject fcfs_admission",
                "reject work_conserving",
                "accept an admission ahead of an earlier submission",
            ),
        ),
        (
            DllmPolicy(admission=DllmAdmission.PREFILL_FIRST, priority_order=True),
            Mode.FDFO,
            ("reject fcfs_admission", "accept an admission ahead of an earlier submission"),
        ),
        (
            DllmPolicy(longest_output_first=True),
            Mode.SYNC,
            (
                "reject fcfs_admission",
                "reject work_conserving",
                "refuse fcfs_admission past a later, longer output",
                "accept an admission ahead of an earlier, shorter output",
            ),
        ),
        (
            DllmPolicy(admission=DllmAdmission.PREFILL_FIRST, longest_output_first=True),
            Mode.FDFO,
            (
                "reject fcfs_admission",
                "refuse fcfs_admission past a later, longer output",
                "accept an admission ahead of an earlier, shorter output",
            ),
        ),
    ],
    ids=[
        "work-conserving",
        "holding-back",
        "prefill-first",
        "rows-released",
        "priority-order",
        "prefill-first-priority",
        "longest-output-first",
        "prefill-first-longest-output-first",
    ],
)
def test_the_walks_reach_each_policy_rule_both_ways(
    policy: DllmPolicy, mode: Mode, expected: tuple[str, ...]
) -> None:
    """Each encoded policy rule is exercised: the machine and the relation both reject on the
    rule, or both accept what only the policy allows (the same rule in both when rejecting)."""
    config = _walk_config(
        mode,
        max_context=16,
        max_running_requests=2,
        in_place_reuse=False,
        reloop=mode is Mode.FDFO,
    )
    rng = random.Random(1)
    before = STATS.copy()
    for _ in range(12):
        _walk(SpecMachine(config, policy), rng, 60)
    _require_seen(before, expected)
    seen = STATS - before
    for case in expected:
        if case.startswith("reject "):
            assert seen[case.replace("reject", "same rule")] > 0, (case, seen)


def test_the_walks_reach_free_queue_order_both_ways() -> None:
    """Under `DllmPolicy.free_queue_order` both accept an admission past the head, and both
    reject on work_conserving a round that admits nothing while every queued request fits
    (rarer than the head fitting: 24 walks rather than 12)."""
    config = _walk_config(
        Mode.SYNC, max_context=16, max_running_requests=2, in_place_reuse=False, reloop=False
    )
    rng = random.Random(0)
    before = STATS.copy()
    for _ in range(24):
        _walk(SpecMachine(config, DllmPolicy(free_queue_order=True)), rng, 60)
    _require_seen(
        before, ("reject work_conserving", "accept an admission ahead of an earlier submission")
    )
    assert (STATS - before)["same rule work_conserving"] > 0


# ---------------------------------------------------------------------------- policy model


def _reference_completions(
    config: DllmConfig, requests: list[RequestSpec], pattern: dict[tuple[str, int], int]
) -> dict[str, int]:
    """Forward index (1-based) at which each request's last block got its done step."""
    forwards = 0
    done_at: dict[str, int] = {}
    events: list[Event] = []
    spec = SpecMachine(config, DllmPolicy(work_conserving=False))

    def sink(e: Event) -> None:
        nonlocal forwards
        spec.apply(e)
        events.append(e)
        if isinstance(e, Forward):
            forwards += 1
        if isinstance(e, StepResult) and e.accept_length == config.block_size:
            done_at.setdefault(f"{e.request_id}/{e.block_index}", forwards)

    oracle = ScriptedOracle(lambda r, k: pattern[(r, k)], config.mask_token_id)
    sched = ReferenceDllmScheduler(config, sink, oracle)
    for r in requests:
        sched.submit(r)
    sched.drain(1000)
    out = {}
    for r in requests:
        nb = -(-(len(r.prompt) + r.max_new_tokens) // config.block_size)
        out[r.request_id] = done_at[f"{r.request_id}/{nb - 1}"]
    return out


def _model_completions(nb: list[int], steps: list[list[int]], m: int, sync: bool) -> list[int]:
    n = len(nb)
    bounds = PolicyBounds(
        requests=n,
        blocks=max(nb),
        max_steps=max(max(x) for x in steps),
        max_arrival=0,
        max_running=m,
    )
    inp = PolicyInputs(bounds, name="x")
    run = PolicyRun(inp, sync=sync)
    sol = z3.Solver()
    sol.add(inp.constraints(), *run.constraints, inp.max_running == m)
    for i in range(n):
        sol.add(inp.nb[i] == nb[i], inp.arrival[i] == 0)
        for k in range(bounds.blocks):
            sol.add(inp.steps[i][k] == (steps[i][k] if k < nb[i] else 1))
    assert sol.check() == z3.sat
    model = sol.model()
    return [model.eval(run.completion(i)).as_long() for i in range(n)]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    data=st.data(),
    n=st.integers(1, 3),
    m=st.integers(1, 3),
    block=st.integers(2, 3),
)
def test_policy_model_agrees_with_the_reference(
    data: st.DataObject, n: int, m: int, block: int
) -> None:
    requests: list[RequestSpec] = []
    pattern: dict[tuple[str, int], int] = {}
    nbs: list[int] = []
    steps: list[list[int]] = []
    for i in range(n):
        pl = data.draw(st.integers(1, 2 * block))
        mn = data.draw(st.integers(1, 2 * block))
        rid = f"r{i}"
        requests.append(RequestSpec(rid, (3,) * pl, mn))
        nb = -(-(pl + mn) // block)
        nbs.append(nb)
        row = []
        for k in range(nb):
            masks = max(0, min(block, (k + 1) * block - pl))
            p = data.draw(st.integers(1, max(1, masks)))
            pattern[(rid, k)] = p
            row.append(1 if masks == 0 else p + 1)
        steps.append(row)
    kv_pages = sum(-(-(nb * block) // block) for nb in nbs) + 1
    for mode in (Mode.FDFO, Mode.SYNC):
        config = DllmConfig(
            block_size=block,
            page_size=block,
            kv_pages=kv_pages,
            req_pool_rows=m,
            max_running_requests=m,
            max_context=block * max(nbs),
            mode=mode,
            in_place_reuse=mode is Mode.FDFO,
        )
        ref = _reference_completions(config, requests, pattern)
        model = _model_completions(nbs, steps, m, sync=mode is Mode.SYNC)
        assert [ref[r.request_id] for r in requests] == model, (mode, steps, ref, model)
