"""The suites have teeth on the torch engine: each seeded bug (a subclass of `DllmEngine`
overriding one method) makes the harness / conformance machine FAIL, naming the right rule."""

from __future__ import annotations

import dataclasses
import heapq

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from gpu.engine import DllmEngine, _algorithm, tiny_model
from gpu.model import BlockPlan
from gpu.request import Carry, EngineRequest
from properties.conformance import conformance_machine
from properties.harness import Harness
from properties.strategies import dllm_configs
from properties.verify import failure_from, run_machine
from spec.adapter import EventSink
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SpecViolation
from spec.events import FinishReason, RowReleased
from tests.tier import full_tier

torch.set_num_threads(1)

# No shrinking: the point here is which rule fires (shrinking a torch-engine counterexample
# costs tens of seconds on two shared cores; `schedspec verify` shrinks when a human reads it).
HUNT = settings(
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    stateful_step_count=30,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)


# ---------------------------------------------------------------------------- mutants
class AbortLeaksRetainedBlock(DllmEngine):
    """SGLang #32992: releasing a request frees its committed blocks only, so aborting an FDFO
    request leaks the unfinished block it retains for in-place reuse."""

    def _release(self, req: EngineRequest) -> None:
        self.allocator.free_blocks(req.handle, list(req.block_first_slots))
        req.block_first_slot = None
        req.block_first_slots.clear()
        req.carry = None
        if req.row is not None:
            self.req_pool.release(req.row, req.handle)
            self.sink(RowReleased(req.rid, req.row))
            req.row = None
        self.allocator.unreserve(req.pages_needed)


class LostAlgorithmState(DllmEngine):
    """FDFO carries incomplete_ids but not algo_state: the next round re-initialises the
    algorithm state from the carried tokens (JointThreshold then treats generated positions as
    prompt and forgets its edit count)."""

    def _carry(self, req: EngineRequest, incomplete_ids: torch.Tensor, algo_state: object) -> None:
        super()._carry(req, incomplete_ids, self.algorithm.init_step_state(incomplete_ids))


class ReuseAllocatesFreshSlots(DllmEngine):
    """In-place reuse that still allocates new slots for the carried block (and writes its KV
    there) while the old slots stay owned."""

    def _ensure_block_kv(self, req: EngineRequest) -> bool:
        if req.carry is not None and req.block_first_slot is not None:
            self._allocate_block_kv(req)
            return True
        return super()._ensure_block_kv(req)


class ReuseWritesFreshSlotsSilently(DllmEngine):
    """The same bug behind the allocator's back: the carried block is moved to a fresh page
    taken straight from the free-page heap, with no event. Only the snapshot, read from the
    allocator's owner tensors, can see it."""

    def _ensure_block_kv(self, req: EngineRequest) -> bool:
        if req.carry is not None and req.block_first_slot is not None:
            alloc = self.allocator
            page = heapq.heappop(alloc._free_pages)
            start = page * alloc.page_size
            b = alloc.block_size
            alloc.owner_req[start : start + b] = req.handle
            alloc.owner_block[start : start + b] = req.committed_blocks
            alloc._page_used[page] += b
            req.block_first_slot = start
            return True
        return super()._ensure_block_kv(req)


class CarryForgetsTokens(DllmEngine):
    """FDFO keeps algo_state but re-creates incomplete_ids from the block's initial tokens
    (the denoised positions are lost; the row is fed its masks again)."""

    def _carry(self, req: EngineRequest, incomplete_ids: torch.Tensor, algo_state: object) -> None:
        super()._carry(req, incomplete_ids, algo_state)
        b = self.config.block_size
        start = req.committed_blocks * b
        ids = [
            req.prompt_ids[p] if p < len(req.prompt_ids) else self.mask_id
            for p in range(start, start + b)
        ]
        req.carry = Carry(torch.tensor(ids, dtype=torch.long), algo_state)


# ---------------------------------------------------------------- batch-dependent mutants
# Each is invisible at batch size 1 (or at the solo sync run the parity check compares with):
# only a check of outputs at batch > 1 against each request's solo output catches it.
class PaddedContextLeaks(DllmEngine):
    """Padding that leaks into attention: every row attends to the batch's longest context,
    i.e. to its table entries beyond its own context (stale slots of earlier holders of the
    row, or slot 0), with no mask. At batch size 1 the longest context is the row's own."""

    def _plan_batch(self, starts: list[int], rows: list[int]) -> BlockPlan:
        real = super()._plan_batch(starts, rows)
        wide = super()._plan_batch([max(starts)] * len(starts), rows)
        return dataclasses.replace(
            real, ctx_slots=wide.ctx_slots, order=None, unorder=None, groups=wide.groups
        )


class StaleTableAfterReallocation(DllmEngine):
    """A page table left stale after re-allocation: a carried block whose slots were freed (no
    in-place reuse) gets fresh slots, but the request-to-token table is not rewritten ("the
    carried block is already in the table"), so the block writes and reads the OLD slots, which
    another request may own by now. Alone, a request gets its own old slots back (the page
    rule), so only a batch shows it."""

    def _ensure_block_kv(self, req: EngineRequest) -> bool:
        if req.carry is not None and req.block_first_slot is None:
            self._allocate_block_kv(req)
            return False  # the table write is skipped
        return super()._ensure_block_kv(req)


class FdfoDropsAlgorithmParams(DllmEngine):
    """An algorithm parameter dropped on one code path: the FDFO path builds its algorithm by
    name with the defaults (JointThreshold: max_post_edit_steps 16 instead of the configured
    4), while sync keeps the configured one."""

    def __init__(self, config: DllmConfig, sink: EventSink, **kwargs: object) -> None:
        super().__init__(config, sink, **kwargs)  # type: ignore[arg-type]
        if config.mode is Mode.FDFO:
            self.algorithm = _algorithm(type(self.algorithm).__name__)


class HandsOverWholeBlocks(DllmEngine):
    """The output handed to the client is every committed token, not cut at max_new_tokens or
    after the EOS. The events are right (the spec's own output, golden and parity all read
    them): only the output the engine reports (`collect_outputs`) shows it."""

    def _finish(self, req: EngineRequest, reason: FinishReason, output: tuple[int, ...]) -> None:
        super()._finish(req, reason, tuple(req.generated))


def _factory(cls: type[DllmEngine], algorithm: str = "LowConfidence") -> object:
    params = {"max_post_edit_steps": 4} if algorithm == "JointThreshold" else {}

    def build(config: DllmConfig, sink: EventSink) -> DllmEngine:
        return cls(config, sink, model=tiny_model("cpu"), algorithm=_algorithm(algorithm, **params))

    return build


def _fdfo(reuse: bool | None = None, max_running: int = 4) -> st.SearchStrategy[DllmConfig]:
    configs = dllm_configs(modes=(Mode.FDFO,), max_running=max_running)
    if reuse is not None:
        configs = configs.map(lambda c: c.replace(in_place_reuse=reuse))
    return configs


def _busy(c: DllmConfig) -> DllmConfig:
    """Every request admitted at once into a roomy pool: more requests mid-block at any time
    (and room for a mutant's extra pages, so the spec, not the pool, stops it)."""
    return c.replace(max_running_requests=4, req_pool_rows=4, kv_pages=64)


CASES = {
    # name: (factory, configs, expected rule)
    "abort_leaks_retained_block": (
        _factory(AbortLeaksRetainedBlock),
        _fdfo(reuse=True).map(_busy),
        "terminal_owns_nothing",
    ),
    "lost_algorithm_state": (
        _factory(LostAlgorithmState, "JointThreshold"),
        _fdfo(max_running=1),
        "golden_output",  # after the round it finishes in; parity would see it at teardown
    ),
    "reuse_allocates_fresh_slots": (
        _factory(ReuseAllocatesFreshSlots),
        _fdfo(reuse=True).map(lambda c: _busy(c).replace(page_size=c.block_size)),
        "whole_block_alloc",
    ),
    "carry_forgets_tokens": (
        _factory(CarryForgetsTokens),
        _fdfo(),
        "carrier_continuity",
    ),
    # batch-dependent bugs: invisible at batch size 1; the harness's golden check (every output
    # against the request decoded alone) sees them after the round the request finishes in,
    # before batch parity (the default policy, "always") would at teardown
    "padded_context_leaks": (
        _factory(PaddedContextLeaks),
        dllm_configs(max_running=4).map(_busy),
        "golden_output",
    ),
    "stale_table_after_reallocation": (
        _factory(StaleTableAfterReallocation),
        _fdfo(reuse=False).map(lambda c: _busy(c).replace(page_size=c.block_size)),
        "golden_output",
    ),
    "fdfo_drops_algorithm_params": (
        _factory(FdfoDropsAlgorithmParams, "JointThreshold"),
        _fdfo().map(_busy),
        "golden_output",
    ),
    "hands_over_whole_blocks": (
        _factory(HandsOverWholeBlocks),
        dllm_configs().filter(lambda c: c.block_size > 1),
        "reported_output",
    ),
}
JOINT = {"lost_algorithm_state", "fdfo_drops_algorithm_params"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_conformance_catches_engine_mutant(name: str) -> None:
    factory, configs, rule = CASES[name]
    machine = conformance_machine(factory, configs=configs)  # type: ignore[arg-type]
    err, printed = run_machine(machine, HUNT)
    assert err is not None, f"the conformance suite did not catch engine mutant {name!r}"
    failure = failure_from(err, printed)
    assert isinstance(err, SpecViolation), err
    assert err.rule == rule, f"{name}: expected [{rule}], got:\n{err}"
    assert "state.configure(config=" in failure.program


def test_silent_fresh_slots_are_caught_by_the_snapshot() -> None:
    """No event betrays the silent move; the snapshot (allocator tensors) does, at the end of
    the round in which it happened."""
    config = DllmConfig(block_size=4, page_size=4, kv_pages=12, max_context=32, mode=Mode.FDFO)
    h = Harness(_factory(ReuseWritesFreshSlotsSilently), config)  # type: ignore[arg-type]
    h.submit(RequestSpec("a", (3, 4, 5, 6, 7), 16))
    with pytest.raises(SpecViolation) as info:
        for _ in range(8):
            h.round()
    assert info.value.rule == "snapshot_matches"
    assert "slot owners differ" in info.value.detail


@full_tier
def test_unmutated_engine_survives_the_same_hunts() -> None:
    """Control: the real engine passes every hunt above (same configs, same settings), 20
    examples each. The full tier's (tests/tier.py): per push the unmutated engine passes the
    suite in tests/test_engine_conformance.py."""
    from gpu.engine import make_small_engine, make_small_joint_engine

    quick = settings(HUNT, max_examples=20)
    for name, (_, configs, _) in CASES.items():
        factory = make_small_joint_engine if name in JOINT else make_small_engine
        err, printed = run_machine(conformance_machine(factory, configs=configs), quick)
        assert err is None, f"{name}: " + failure_from(err, printed).message


# ---------------------------------------------------------------- the golden oracle
GOLDEN_CASES = {
    # name: (engine class, algorithm, configs the hunt runs it under)
    "padded_context_leaks": (PaddedContextLeaks, "LowConfidence", ("sync", "fdfo+reuse")),
    "stale_table_after_reallocation": (StaleTableAfterReallocation, "LowConfidence", ("fdfo",)),
    "fdfo_drops_algorithm_params": (FdfoDropsAlgorithmParams, "JointThreshold", ("fdfo+reuse",)),
}


def _golden_workload() -> list[RequestSpec]:
    import random

    rng = random.Random(16)
    return [
        RequestSpec(
            f"g{i:02d}",
            tuple(rng.randrange(0, 15) for _ in range(rng.randint(1, 11))),
            rng.randint(4, 20),
        )
        for i in range(12)
    ]


def golden_config(variant: str) -> DllmConfig:
    """The golden workload's configuration: 4 seats of block 4 in a roomy pool, in `variant`
    ("sync", "fdfo" or "fdfo+reuse")."""
    return DllmConfig(
        block_size=4,
        page_size=4,
        kv_pages=64,
        req_pool_rows=4,
        max_running_requests=4,
        max_context=32,
        mode=Mode.SYNC if variant == "sync" else Mode.FDFO,
        in_place_reuse="reuse" in variant,
        eos_token_id=15,
    )


def _golden_mismatches(cls: type[DllmEngine], algorithm: str, variant: str) -> list[str]:
    """Run the workload at batch 4 and return one readable line per output that differs from
    the request's golden decoding (dense, unpaged, unbatched: gpu.golden)."""
    from gpu.algorithms import make_algorithm
    from gpu.golden import golden_decode

    params = {"max_post_edit_steps": 4} if algorithm == "JointThreshold" else {}
    config = golden_config(variant)
    engine = cls(
        config,
        lambda event: None,
        model=tiny_model("cpu"),
        algorithm=_algorithm(algorithm, **params),
    )
    requests = _golden_workload()
    for r in requests:
        engine.submit(r)
    engine.drain()
    outputs = engine.take_outputs()
    lines = []
    for r in requests:
        want = golden_decode(tiny_model("cpu"), make_algorithm(algorithm, params), config, r)
        if outputs[r.request_id] != want.tokens:
            lines.append(
                f"{r.request_id} ({variant}, batch 4): engine {list(outputs[r.request_id])} "
                f"!= golden {list(want.tokens)}"
            )
    return lines


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_oracle_catches_batch_mutant(name: str) -> None:
    """Every batch-bug mutant makes some output differ from its golden decoding in every mode it
    corrupts — for the padded context, sync and FDFO alike (so FDFO-vs-sync parity at the same
    batch could not see it) — and the unmutated engine equals golden on the same workload."""
    cls, algorithm, variants = GOLDEN_CASES[name]
    for variant in variants:
        assert _golden_mismatches(DllmEngine, algorithm, variant) == [], "control"
        mismatches = _golden_mismatches(cls, algorithm, variant)
        assert mismatches, f"{name}: every output equals golden under {variant}"
        assert "!= golden" in mismatches[0]
