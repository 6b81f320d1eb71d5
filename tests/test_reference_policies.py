"""The reference's policy options (`reference.dllm`, `policy=`): PREFILL_FIRST admission and
batches, and rows released between rounds, seen in the events they produce; every run is
checked by the spec machine under the same policy (a harness with the built-in's profile)."""

from __future__ import annotations

import pytest

from properties.harness import Harness
from reference.dllm import (
    REFERENCE_DLLM_PREFILL_FIRST,
    REFERENCE_DLLM_ROWS_RELEASED,
    ReferenceDllmScheduler,
)
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError
from spec.events import Admitted, ControlReturned, Finished, Forward, RowAcquired, RowReleased
from spec.implementation import DllmImplementation
from spec.profile import DllmPolicy

BLOCK = 4


def _config(**changes: object) -> DllmConfig:
    base = DllmConfig(
        block_size=BLOCK,
        page_size=BLOCK,
        kv_pages=32,
        req_pool_rows=2,
        max_running_requests=2,
        max_context=64,
        mode=Mode.FDFO,
        in_place_reuse=False,
    )
    return base.replace(**changes)


def _run(impl: DllmImplementation, config: DllmConfig, requests: list[RequestSpec]) -> Harness:
    h = Harness(impl.factory, config, profile=impl.profile)
    for request in requests:
        h.submit(request)
    h.drain()
    assert h.violation is None
    return h


def _prompt_only(request: RequestSpec, block: int) -> bool:
    return (block + 1) * BLOCK <= len(request.prompt)


SHORT_A = RequestSpec("a", (1, 2), 8)  # first block holds masks: a decode request
LONG_B = RequestSpec("b", tuple(range(1, 10)), 4)  # two prompt-only blocks: a prefill request
SHORT_C = RequestSpec("c", (3,), 4)
LONG_D = RequestSpec("d", tuple(range(5, 13)), 4)


@pytest.mark.parametrize("mode", [Mode.SYNC, Mode.FDFO])
def test_prefill_first_admits_prefill_requests_first_in_their_own_order(mode: Mode) -> None:
    h = _run(
        REFERENCE_DLLM_PREFILL_FIRST,
        _config(mode=mode),
        [SHORT_A, LONG_B, SHORT_C, LONG_D],
    )
    admitted = [e.request_id for e in h.events if isinstance(e, Admitted)]
    assert admitted == ["b", "d", "a", "c"]


@pytest.mark.parametrize("mode", [Mode.SYNC, Mode.FDFO])
def test_prefill_first_batches_are_one_kind_and_prefill_goes_first(mode: Mode) -> None:
    """Every forward feeds prompt-only blocks only or none; while a running request's next
    block is prompt-only, no decode forward runs: the decode request waits a round."""
    requests = {r.request_id: r for r in (SHORT_A, LONG_B)}
    config = _config(mode=mode, max_running_requests=2)
    h = Harness(
        REFERENCE_DLLM_PREFILL_FIRST.factory, config, profile=REFERENCE_DLLM_PREFILL_FIRST.profile
    )
    h.submit(SHORT_A)
    h.round()  # a runs alone
    h.submit(LONG_B)
    h.drain()
    forwards = [e for e in h.events if isinstance(e, Forward)]
    kinds = [
        {_prompt_only(requests[r.request_id], r.block_index) for r in f.rows} for f in forwards
    ]
    assert all(len(k) == 1 for k in kinds)
    prefill_forwards = [f for f, k in zip(forwards, kinds, strict=True) if k == {True}]
    assert [{r.request_id for r in f.rows} for f in prefill_forwards] == [{"b"}, {"b"}]
    # a, a decode request, is still running while b's prompt blocks go first: it waits
    last_prefill = max(i for i, e in enumerate(h.events) if e in prefill_forwards)
    a_finished = next(
        i for i, e in enumerate(h.events) if isinstance(e, Finished) and e.request_id == "a"
    )
    assert a_finished > last_prefill


def test_rows_are_released_between_rounds_and_taken_again() -> None:
    """FDFO without reuse: a carried block's request gives its row back at the end of the round
    and takes one again before the next round's admission; at every round's end the requests
    without a row are exactly the ones carrying a block."""
    h = _run(REFERENCE_DLLM_ROWS_RELEASED, _config(), [SHORT_A, SHORT_C])
    released = [e for e in h.events if isinstance(e, RowReleased)]
    acquired = [e for e in h.events if isinstance(e, RowAcquired)]
    assert len(acquired) > 0
    # every row released by a running request comes back (the rest are the two finishes)
    assert len(released) == len(acquired) + 2
    for i, e in enumerate(h.events):
        if isinstance(e, RowAcquired):
            # taken in the scheduler phase: after the previous round ended, before any forward
            before = [x for x in h.events[:i] if isinstance(x, ControlReturned | Forward)]
            assert isinstance(before[-1], ControlReturned)


def test_rows_stay_with_their_requests_under_reuse() -> None:
    """The policy is about FDFO without reuse: with in-place reuse nothing is released early."""
    h = _run(REFERENCE_DLLM_ROWS_RELEASED, _config(in_place_reuse=True), [SHORT_A, SHORT_C])
    assert not [e for e in h.events if isinstance(e, RowAcquired)]


def test_the_reference_refuses_reserved_pages_or_rows() -> None:
    with pytest.raises(ConfigError, match="0 for the reference"):
        ReferenceDllmScheduler(_config(), lambda e: None, policy=DllmPolicy(reserved_rows=1))
