"""The torch engine with rows released between rounds (`DllmEngine(rows_released_between_rounds=
True)`, built-in `engine-rows-released`): FDFO without in-place reuse gives a carried block's
request-pool row back with its KV at the end of every round and takes one again in the next, as
SGLang's FDFO did before #27877. It conforms under the profile that declares the option, the
default profile refuses it, a seeded bug in taking the row back is caught, and its outputs are
the default engine's byte for byte."""

from __future__ import annotations

import torch
from hypothesis.stateful import run_state_machine_as_test

from gpu.engine import (
    SMALL_ENGINE_ROWS_RELEASED,
    DllmEngine,
    make_small_engine,
    make_small_rows_released_engine,
)
from gpu.request import EngineRequest
from properties.conformance import conformance_machine
from properties.harness import Harness
from properties.verify import failure_from, run_machine
from spec.adapter import EventSink
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SpecViolation
from spec.events import Admitted, Event, Forward, RowAcquired, RowReleased
from tests.test_engine_conformance import SUITE
from tests.test_engine_mutants import HUNT, _busy, _factory, _fdfo
from tests.tier import full_tier

torch.set_num_threads(1)

PROFILE = SMALL_ENGINE_ROWS_RELEASED.profile
NO_REUSE = _fdfo(reuse=False).map(_busy)


class RowsReleased(DllmEngine):
    """The engine with the option on, as the mutant hunts build it (`_factory` passes the
    model and algorithm only)."""

    def __init__(self, config: DllmConfig, sink: EventSink, **kwargs: object) -> None:
        super().__init__(config, sink, rows_released_between_rounds=True, **kwargs)  # type: ignore[arg-type]


class ReacquireForgetsTable(RowsReleased):
    """Taking a row back without writing the request's committed blocks into it: a request
    that gets another row than the one it gave back attends to whatever that row's table
    entries held (another request's KV, or none of its own)."""

    def _reacquire_rows(self) -> None:
        for req in self.running:
            if req.row is None and self.req_pool.has_free():
                req.row = self.req_pool.acquire(req.handle)
                self.sink(RowAcquired(req.rid, req.row))


def test_rows_released_engine_conforms_under_its_profile() -> None:
    machine = conformance_machine(
        make_small_rows_released_engine, profile=PROFILE, configs=NO_REUSE
    )
    run_state_machine_as_test(machine, settings=SUITE)


def test_the_default_profile_refuses_released_rows() -> None:
    """The suite sees the rows go: under the idealised spec a running request holds its row
    from admission to the end."""
    err, printed = run_machine(
        conformance_machine(make_small_rows_released_engine, configs=NO_REUSE), HUNT
    )
    assert isinstance(err, SpecViolation), failure_from(err, printed).message if err else None
    assert err.rule == "row_exclusive"
    assert "running without a row" in err.detail


def test_a_reacquired_row_without_its_table_is_caught() -> None:
    err, printed = run_machine(
        conformance_machine(
            _factory(ReacquireForgetsTable),  # type: ignore[arg-type]
            profile=PROFILE,
            configs=NO_REUSE,
        ),
        HUNT,
    )
    assert isinstance(err, SpecViolation), "the suite did not catch reacquire_forgets_table"
    assert err.rule == "golden_output", str(err)
    assert "state.configure(config=" in failure_from(err, printed).program


# a control (the engine passes its suite per push: test_rows_released_engine_conforms_under_its_
# profile): full tier, as tests/tier.py says
@full_tier
def test_the_same_hunt_passes_the_unmutated_engine() -> None:
    """Control for the mutant above: the same configs and settings, the real engine."""
    err, printed = run_machine(
        conformance_machine(_factory(RowsReleased), profile=PROFILE, configs=NO_REUSE),  # type: ignore[arg-type]
        HUNT,
    )
    assert err is None, failure_from(err, printed).message


CONFIG = DllmConfig(
    block_size=4,
    page_size=4,
    kv_pages=64,
    req_pool_rows=4,
    max_running_requests=4,
    max_context=64,
    mode=Mode.FDFO,
    in_place_reuse=False,
)
WORKLOAD = [
    RequestSpec("a", (1, 2, 3), 4),
    RequestSpec("b", (4, 5, 6, 7, 8, 9), 24),
    RequestSpec("c", (10, 11), 20),
    RequestSpec("d", (12, 13, 14, 1, 2), 16),
    RequestSpec("e", (3, 3, 3), 12),
]


def _serve(factory: object) -> tuple[dict[str, tuple[int, ...]], list[Event]]:
    events: list[Event] = []
    engine = factory(CONFIG, events.append)  # type: ignore[operator]
    assert isinstance(engine, DllmEngine)
    for req in WORKLOAD:
        engine.submit(req)
    engine.drain()
    snap = engine.snapshot()
    assert snap.leaked_slots() == 0 and snap.held_rows() == 0
    return engine.take_outputs(), events


def test_outputs_equal_the_default_engine_and_rows_do_move() -> None:
    """Byte-identical outputs to the engine that keeps its rows, although some request takes
    back another row than the one it gave (so its table was rewritten, not left in place);
    every forward runs only rows that hold a row, after the round's `RowAcquired`."""
    kept, _ = _serve(make_small_engine)
    released, events = _serve(make_small_rows_released_engine)
    assert released == kept
    gave: dict[str, int] = {}
    moved = 0
    holds: set[str] = set()
    for e in events:
        if isinstance(e, RowReleased):
            gave[e.request_id] = e.row
            holds.discard(e.request_id)
        elif isinstance(e, RowAcquired):
            moved += gave.get(e.request_id, e.row) != e.row
            holds.add(e.request_id)
        elif isinstance(e, Forward):
            assert {r.request_id for r in e.rows} <= holds
        elif isinstance(e, Admitted):
            holds.add(e.request_id)
    assert sum(isinstance(e, RowAcquired) for e in events) > 0
    assert moved > 0, "no request took back another row: the table rewrite went untested"


def test_a_carried_request_holds_no_row_between_rounds() -> None:
    h = Harness(make_small_rows_released_engine, CONFIG, profile=PROFILE)
    engine = h.impl
    assert isinstance(engine, DllmEngine)
    h.submit(RequestSpec("b", (4, 5, 6, 7, 8, 9), 24))
    carried: EngineRequest | None = None
    for _ in range(12):
        h.round()
        carried = next((r for r in engine.running if r.carry is not None), None)
        if carried is not None:
            break
    assert carried is not None, "no block was carried"
    assert carried.row is None and carried.block_first_slot is None
    assert engine.snapshot().rows == {}
    owned = {s for s, o in engine.snapshot().slot_owners.items() if o[0] == "b"}
    assert len(owned) == carried.committed_blocks * CONFIG.block_size  # committed blocks only
    h.drain()  # the harness checks every round against the spec under the declared policy
    assert engine.snapshot().held_rows() == 0 and engine.snapshot().leaked_slots() == 0


def test_the_option_changes_nothing_outside_fdfo_without_reuse() -> None:
    for mode, reuse in ((Mode.SYNC, False), (Mode.FDFO, True)):
        config = CONFIG.replace(mode=mode, in_place_reuse=reuse)
        engine = make_small_rows_released_engine(config, lambda e: None)
        assert not engine.releases_rows
    assert make_small_rows_released_engine(CONFIG, lambda e: None).releases_rows
