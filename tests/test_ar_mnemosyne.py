"""The project's re-implementation of Vidur's Mnemosyne FCFS fixed-chunk replica scheduler
(`reference.ar.mnemosyne`): the decisions that set it apart and bad configurations (its
conformance under its declared profile is tests/test_ar_vidur.py's). Its decision identity
with Vidur's real class is checked in tests/test_real_vidur.py (0.0.25) and
tests/test_real_vidur_newest.py (0.0.26)."""

from __future__ import annotations

import pytest

from properties.ar.harness import ArHarness
from reference.ar.mnemosyne import (
    MAX_NUM_SKIPPED_REQUESTS,
    VIDUR_MNEMOSYNE,
    VIDUR_MNEMOSYNE_ONE_QUEUE,
    make_vidur_mnemosyne,
)
from spec.ar.config import ArConfig, ArRequest
from spec.ar.decisions import StepDecision, first_difference, step_decisions
from spec.ar.events import (
    ArBlocksAllocated,
    ArBlocksFreed,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
)
from spec.errors import ConfigError
from spec.implementation import ArImplementation


def config(**kw: object) -> ArConfig:
    base: dict[str, object] = {
        "block_size": 1,
        "reserve_null_block": False,
        "enable_chunked_prefill": True,
    }
    base.update(kw)
    return ArConfig(**base)  # type: ignore[arg-type]


def run(impl: ArImplementation, cfg: ArConfig, *requests: ArRequest) -> ArHarness:
    """Submit `requests` and drain, the spec checking every event (a violation raises)."""
    h = ArHarness(impl.factory, cfg, policy=impl.profile.policy)
    for r in requests:
        h.submit(r)
    h.drain(200)
    return h


# Pool 5, chunk 2, two seats. Step 0 admits r0 (3 blocks) for 2 tokens; r1 (3 blocks) does not
# fit and r2 has no token left in the chunk. Step 1 ends r0's prefill (it finishes) and admits
# r2 past r1 for 1 token. In step 2 r1 fits and r2 is one token short of its prefill.
QUEUES = config(num_blocks=5, max_num_batched_tokens=2, max_num_seqs=2, max_model_len=5)
QUEUE_REQUESTS = (ArRequest("r0", 3, 1), ArRequest("r1", 3, 2), ArRequest("r2", 2, 1))


def decisions(
    impl: ArImplementation, cfg: ArConfig, requests: tuple[ArRequest, ...]
) -> list[StepDecision]:
    return step_decisions(run(impl, cfg, *requests).events)


def queue_decisions(impl: ArImplementation) -> list[StepDecision]:
    return decisions(impl, QUEUES, QUEUE_REQUESTS)


def test_the_releases_order_a_partial_prefill_and_an_earlier_arrival_differently() -> None:
    """0.0.26 reads the requests between prefill chunks first: r2 finishes its prefill and r1
    gets the chunk's last token. 0.0.25 reads them in one queue by arrival: r1, which arrived
    first, takes the whole chunk and r2 waits. Both conform; the decision twin tells them
    apart."""
    new, one = queue_decisions(VIDUR_MNEMOSYNE), queue_decisions(VIDUR_MNEMOSYNE_ONE_QUEUE)
    assert new[1].scheduled == one[1].scheduled == (("r0", 1), ("r2", 1))
    assert new[2].scheduled == (("r1", 1), ("r2", 1))
    assert one[2].scheduled == (("r1", 2),)
    assert first_difference(new, one) == (
        "step 2: the implementation schedules [('r1', 1), ('r2', 1)], "
        "the other schedules [('r1', 2)]"
    )


def test_a_decode_needing_no_block_restarts_when_none_is_free() -> None:
    """Vidur's `_can_append_slot` wants one free block for every decode. r1 (one prompt token,
    six outputs) holds the whole pool (3 blocks of 2) after its fourth output; its next decode
    fits its blocks, but with none free it restarts itself and is re-admitted in the same
    batch (`admit_after_preemption`), recomputing its 6 known tokens one per step (chunk 1).
    One token short of that recompute it is still in its prefill: no second restart."""
    cfg = config(
        block_size=2, num_blocks=3, max_num_batched_tokens=1, max_num_seqs=1, max_model_len=7
    )
    h = run(VIDUR_MNEMOSYNE, cfg, ArRequest("r0", 1, 1), ArRequest("r1", 1, 6))
    restarts = [i for i, e in enumerate(h.events) if isinstance(e, ArPreempted)]
    assert len(restarts) == 1, h.events
    after = h.events[restarts[0] + 1 : restarts[0] + 3]
    assert after == [ArBlocksAllocated("r1", (1, 2, 0)), ArScheduled("r1", 1)], after
    assert h.outputs() == {"r0": 1, "r1": 6}


# Pool 100 (watermark int(0.01 * 100) = 1), chunk 10. r1 (71 blocks) is admitted in step 2
# beside r0's last prefill chunk, leaving 4 blocks free; r0's decodes take them one a step, so
# after r0's decode in step 6 none is free.
WATERMARK = config(num_blocks=100, max_num_batched_tokens=10, max_num_seqs=2, max_model_len=100)
WATERMARK_REQUESTS = (ArRequest("r0", 25, 9), ArRequest("r1", 71, 28))


def test_a_request_between_chunks_continues_below_the_watermark() -> None:
    """The watermark gates a new request's allocation only: Vidur's `_allocate_request` returns
    at once for a request that holds its blocks, so r1's next chunk runs in step 6 with no
    block free."""
    events = run(VIDUR_MNEMOSYNE, WATERMARK, *WATERMARK_REQUESTS).events
    steps = step_decisions(events)
    assert steps[2].scheduled == (("r0", 5), ("r1", 5))
    assert steps[6].scheduled == (("r0", 1), ("r1", 9))
    held = 0  # blocks held when step 6 is formed: all 100
    for e in events[: events.index(ArStepEnd(6))]:
        if isinstance(e, ArBlocksAllocated):
            held += len(e.blocks)
        elif isinstance(e, ArBlocksFreed):
            held -= len(e.blocks)
    assert held == 100


def lookahead_run(unfit: int) -> list[dict[str, int]]:
    """r0 takes 6 of 12 blocks; `unfit` requests of 7 prompt tokens wait behind it; then a
    request of 2. The steps' scheduled tokens."""
    cfg = config(num_blocks=12, max_num_batched_tokens=24, max_num_seqs=4, max_model_len=12)
    requests = [ArRequest("r0", 6, 3)]
    requests += [ArRequest(f"big{i}", 7, 1) for i in range(unfit)]
    requests.append(ArRequest("small", 2, 1))
    return [dict(s.scheduled) for s in decisions(VIDUR_MNEMOSYNE, cfg, tuple(requests))]


def test_admission_passes_at_most_nine_requests_that_do_not_fit() -> None:
    """`MAX_NUM_SKIPPED_REQUESTS` = 10: the queue is read until ten were skipped. Behind nine
    requests that do not fit, the small one is admitted beside r0 in step 0; behind ten it is
    never read, and waits until r0 has finished. (The declared look-ahead is therefore 9.)"""
    assert MAX_NUM_SKIPPED_REQUESTS == 10
    assert VIDUR_MNEMOSYNE.profile.policy.rules_for(config()).fcfs_lookahead == 9
    assert lookahead_run(9)[0] == {"r0": 6, "small": 2}
    ten = lookahead_run(10)
    assert ten[0] == {"r0": 6}
    first = next(i for i, s in enumerate(ten) if "small" in s)
    assert first > max(i for i, s in enumerate(ten) if "r0" in s)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 32}, "enable_chunked_prefill"),
        ({"policy": "priority"}, "policy"),
        ({"num_stages": 2}, "num_stages"),
        ({"enable_prefix_caching": True}, "enable_prefix_caching"),
    ],
)
def test_mnemosyne_bad_config(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_vidur_mnemosyne(config(**kw), lambda e: None)
    assert err.value.field == field
