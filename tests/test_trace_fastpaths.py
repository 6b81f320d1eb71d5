"""The trace checker's fast paths decide exactly what the careful paths decide.

- `spec.trace`: a line the scanner takes whole is the object `json.loads` returns; an event the
  fast decoders accept is the event the field-by-field decoder builds (and a line they refuse
  goes to that decoder, which names the problem).
- `SpecMachine._changed_hold` says "all hold" only when `_changed_failure` finds nothing, on
  reference runs, mutant runs and machines whose tables were corrupted at random.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from properties.harness import Harness
from properties.strategies import dllm_configs
from reference.dllm import make_scheduler
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SpecViolation
from spec.events import Event
from spec.lifecycles import BlockPhase, RequestPhase
from spec.machine import SpecMachine
from spec.trace import (
    _FAST,
    TraceFormatError,
    _event_from_dict_checked,
    _scanned,
    event_from_dict,
    event_to_dict,
)
from tests.mutants import MUTANTS
from tests.test_spec_incremental import fitting_request, request_room
from tests.test_spec_prefix_cache import WHOLE_RUN

LINES = [
    '{"a":1}\n',
    '{"a":1}',
    '{"a":1} x\n',
    ' {"a":1}\n',
    '{"a":1}  \r\n',
    '{"a":1}\t\n',
    '{"a": NaN}\n',
    '{"a":1',
    '{"a":"\\ud800"}\n',
    '\ufeff{"a":1}\n',
    '{"a":1}{"b":2}\n',
    "{}\n",
    '{"a":1,}\n',
    '{"a":1e400}\n',
    '{"a":1}\x00\n',
    '{"a":1}\xa0\n',
    '{"a":1}\u2028\n',
    '{"a":1}\x0b\n',
    "[1]\n",
    '{"a":{"b":[{"c":1}]}}\n',
    '{"kind":"aborted","request_id":"r1"}\n',
    "\n",
    "   \n",
]


@pytest.mark.parametrize("line", LINES)
def test_scanner_takes_a_line_only_as_json_loads_reads_it(line: str) -> None:
    data = _scanned(line)
    if data is None:
        return  # the careful path (json.loads) decides
    assert data == json.loads(line)


def _reference_events() -> list[Event]:
    events: list[Event] = []
    for mode, reuse, eos in (
        (Mode.FDFO, True, 15),
        (Mode.FDFO, False, None),
        (Mode.SYNC, False, 15),
    ):
        cfg = DllmConfig(
            block_size=2,
            page_size=4,
            kv_pages=8,
            req_pool_rows=3,
            max_running_requests=2,
            max_context=16,
            mode=mode,
            in_place_reuse=reuse,
            eos_token_id=eos,
        )
        h = Harness(make_scheduler, cfg)
        rng = random.Random(7)
        for i in range(8):
            prompt = tuple(rng.randint(0, 15) for _ in range(rng.randint(1, 6)))
            h.submit(RequestSpec(f"r{i}", prompt, rng.randint(1, 8)))
            h.round()
            if i == 3:
                h.abort(f"r{i}")
        h.drain()
        events.extend(h.events)
    return events + WHOLE_RUN  # the prefix cache's kinds (the reference scheduler has none)


EVENTS = _reference_events()
WRONG_VALUES: list[Any] = ["0", True, 1.0, None, ["0"], [True], [1.5], {}, -1, 0, [], "eos"]


def _variants(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The event's dict with one thing wrong (or, by chance, still right)."""
    out: list[dict[str, Any]] = []
    for name in data:
        if name == "kind":
            continue
        out.append({k: v for k, v in data.items() if k != name})  # missing
        out.extend({**data, name: bad} for bad in WRONG_VALUES)
    out.append({**data, "extra": 1})
    for row_field in ("request_id", "block_index", "reused", "num_tokens", "masked"):
        if data.get("rows"):
            rows = [dict(r) for r in data["rows"]]
            del rows[0][row_field]
            out.append({**data, "rows": rows})
            for bad in WRONG_VALUES:
                rows = [dict(r) for r in data["rows"]]
                rows[0][row_field] = bad
                out.append({**data, "rows": rows})
            rows = [dict(r) for r in data["rows"]]
            rows[0]["extra"] = 0
            out.append({**data, "rows": rows})
    return out


def test_every_event_kind_is_covered() -> None:
    assert {e.kind for e in EVENTS} >= set(_FAST) - {"row_acquired"}


def test_fast_decoders_build_the_careful_decoders_event() -> None:
    for event in EVENTS:
        data = event_to_dict(event)
        assert _FAST[event.kind](data) == event == _event_from_dict_checked(data, 1)


def test_fast_decoders_accept_nothing_the_careful_decoder_refuses() -> None:
    accepted = refused = 0
    for event in EVENTS:
        for data in _variants(event_to_dict(event)):
            fast = _FAST[event.kind](data)
            try:
                careful: Event | None = _event_from_dict_checked(data, 3)
            except TraceFormatError:
                careful = None
            if fast is not None:
                accepted += 1
                assert fast == careful, data
            else:
                refused += 1
            # the public decoder: the careful answer, or its error naming the line
            if careful is None:
                with pytest.raises(TraceFormatError, match="trace line 3"):
                    event_from_dict(data, 3)
            else:
                assert event_from_dict(data, 3) == careful
    assert accepted and refused  # both branches were exercised


class BothChecks(SpecMachine):
    """Evaluates the fast invariant pass beside the ordered one after every event."""

    compared = 0

    def check_changed(self) -> None:
        reqs = [self._requests[rid] for rid in self._dirty]
        rows, blocks = set(self._dirty_rows), set(self._dirty_blocks)
        if self._changed_hold(reqs, rows, blocks):
            assert self._changed_failure(reqs, rows, blocks) is None
        BothChecks.compared += 1
        super().check_changed()


def _drive(factory: object, config: DllmConfig, seed: int) -> Harness:
    h = Harness(factory, config)  # type: ignore[arg-type]
    h.spec = BothChecks(config)
    rng = random.Random(seed)
    try:
        for i in range(rng.randint(3, 10)):
            # requests the config accepts: a pool or context too small for every request
            # left a program without rounds with no event to compare (one seed in forty)
            request = fitting_request(rng, config, f"r{i}")
            if request is not None:
                h.submit(request)
            for _ in range(rng.randint(0, 3)):
                h.round()
        h.drain()
    except SpecViolation:
        pass  # a mutant's violation ends the program
    return h


@settings(max_examples=20, deadline=None, database=None)
@given(config=dllm_configs(), seed=st.integers(0, 2**16))
def test_fast_pass_agrees_on_reference_programs(config: DllmConfig, seed: int) -> None:
    assume(request_room(config) >= 2)  # a pool smaller than any request accepts none
    before = BothChecks.compared
    h = _drive(make_scheduler, config, seed)
    assert h.violation is None
    assert BothChecks.compared > before


@pytest.mark.parametrize(
    "name", ["no_free_on_finish", "double_free", "misaligned_page", "abort_leaks_retained_block"]
)
def test_fast_pass_agrees_on_mutant_programs(name: str) -> None:
    cfg = DllmConfig(block_size=2, page_size=4, kv_pages=12, max_context=24, mode=Mode.FDFO)
    for seed in range(10):
        _drive(MUTANTS[name].factory, cfg, seed)


def _corrupt(m: SpecMachine, rng: random.Random) -> None:
    """A random edit of the machine's tables (then its indexes follow, everything dirty)."""
    cfg = m.config
    reqs = list(m._requests.values())
    for _ in range(rng.randint(1, 3)):
        choice = rng.randrange(7)
        if choice == 0 and reqs:  # a slot given to some block, perhaps outside the pool
            slot = rng.randrange(-1, cfg.kv_slots + 1)
            m._owner[slot] = (rng.choice(reqs).request_id, rng.randrange(4))
        elif choice == 1 and m._owner:
            del m._owner[rng.choice(sorted(m._owner))]
        elif choice == 2 and reqs:
            rng.choice(reqs).phase = rng.choice(list(RequestPhase))
        elif choice == 3 and reqs:
            r = rng.choice(reqs)
            if r.current is not None:
                r.current.phase = rng.choice(list(BlockPhase))
                r.current.masks = rng.choice([None, 0, 1])
                r.current.slots = rng.choice([None, r.current.slots, (0, 1)])
        elif choice == 4 and reqs:
            rng.choice(reqs).row = rng.choice([None, *range(cfg.req_pool_rows + 1)])
        elif choice == 5 and reqs:
            m._rows[rng.randrange(cfg.req_pool_rows + 1)] = rng.choice(reqs).request_id
        elif choice == 6 and reqs:
            r = rng.choice(reqs)
            r.committed_blocks = max(0, r.committed_blocks + rng.choice([-1, 1]))
    m.reindex()


@settings(max_examples=60, deadline=None, database=None)
@given(config=dllm_configs(), seed=st.integers(0, 2**16), cut=st.integers(1, 150))
def test_fast_pass_never_passes_a_corrupted_state(config: DllmConfig, seed: int, cut: int) -> None:
    h = _drive(make_scheduler, config, seed)
    m = SpecMachine(config)
    for e in h.events[:cut]:
        m.apply(e)
        m.check_changed()
    rng = random.Random(seed)
    _corrupt(m, rng)
    reqs = [m._requests[rid] for rid in m._dirty]
    rows, blocks = set(m._dirty_rows), set(m._dirty_blocks)
    failure = m._changed_failure(reqs, rows, blocks)
    if m._changed_hold(reqs, rows, blocks):
        assert failure is None, failure
