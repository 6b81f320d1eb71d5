"""Per-request cache read limits (`ArRequest.cache_read_limit`: vLLM's
`skip_reading_prefix_cache`, and 0.34's prompt scoring from `prompt_logprob_start`): the spec
bounds a hit by them (`cache_hit_bounded`), the reference honours them, the strategies draw
them only where a profile declares them, traces carry them, and the harness insists that an
adapter reports them."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from properties.ar.decisions import operations
from properties.ar.harness import ArHarness, ArSubmit
from properties.ar.strategies import cache_read_limits
from reference.ar.prefix_cache import VLLM_V1_PREFIX, make_vllm_v1_prefix
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRequest, validate_ar_request
from spec.ar.events import ArBlocksAllocated, ArCacheHit, ArEvent, ArScheduled, ArSubmitted
from spec.ar.machine import ArSpecMachine
from spec.ar.profile import CacheReadLimits
from spec.ar.trace import ar_event_from_dict, ar_event_to_dict, write_ar_trace
from spec.errors import InvalidRequest, SpecViolation
from spec.trace import TraceFormatError
from tests.test_ar_prefix import CFG, _a_done
from tests.test_twin_settings import CFG as SHARED_PROMPTS
from tests.test_twin_settings import check


def _b_reads(limit: int | None, blocks: tuple[int, ...]) -> list[ArEvent]:
    """b (5 tokens, sharing a's first 4) with `cache_read_limit=limit` hits `blocks` (none:
    no hit) and is admitted: the rest of its 3 blocks allocated, the rest of its tokens
    scheduled."""
    fresh = (4, 5, 6)[: 3 - len(blocks)]
    hit: list[ArEvent] = [ArCacheHit("b", blocks)] if blocks else []
    return [
        *_a_done(),
        ArSubmitted("b", 5, 1, prompt=(1, 2, 3, 4, 9), cache_read_limit=limit),
        *hit,
        ArBlocksAllocated("b", fresh),
        ArScheduled("b", 5 - 2 * len(blocks)),
    ]


def _violation(events: list[ArEvent]) -> SpecViolation | None:
    m = ArSpecMachine(CFG)
    try:
        m.apply_all(events)
    except SpecViolation as v:
        return v
    return None


@pytest.mark.parametrize(
    ("limit", "blocks"), [(None, (1, 2)), (4, (1, 2)), (3, (1,)), (2, (1,)), (1, ()), (0, ())]
)
def test_a_hit_within_the_limit_is_accepted(limit: int | None, blocks: tuple[int, ...]) -> None:
    assert _violation(_b_reads(limit, blocks)) is None


@pytest.mark.parametrize(
    ("limit", "blocks", "says"),
    [
        (3, (1, 2), "at most 2 (its prompt is scored from row 3 on"),
        (1, (1,), "at most 0 (its prompt is scored from row 1 on"),
        (0, (1,), "at most 0 (it skips reading the prefix cache)"),
    ],
)
def test_a_hit_past_the_limit_breaks_cache_hit_bounded(
    limit: int, blocks: tuple[int, ...], says: str
) -> None:
    err = _violation(_b_reads(limit, blocks))
    assert err is not None and err.rule == "cache_hit_bounded", err
    assert f"its cache_read_limit is {limit}: {says}" in str(err), err


def test_the_cache_aware_ranking_counts_only_what_a_request_may_read() -> None:
    """The spec's cache-aware order ranks a request by the hit it may take: with its limit
    below its cached prefix, it keeps its place (tests/test_ar_cache_aware.py's scenario)."""
    from reference.ar.vllm_settings import VLLM_V1_CACHE_AWARE
    from tests.test_ar_cache_aware import admission_order

    policy = VLLM_V1_CACHE_AWARE.profile.policy
    assert admission_order(VLLM_V1_CACHE_AWARE.factory, policy, c_reads=None) == ["a", "c", "b"]
    assert admission_order(VLLM_V1_CACHE_AWARE.factory, policy, c_reads=1) == ["a", "b", "c"]


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_a_bad_limit_is_an_invalid_request(bad: object) -> None:
    req = ArRequest("r", 4, 1, cache_read_limit=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match=r"invalid cache_read_limit=.*must be an integer >= 0"):
        validate_ar_request(CFG, req)
    err = _violation([ArSubmitted("r", 4, 1, cache_read_limit=bad)])  # type: ignore[arg-type]
    assert err is not None and err.rule == "valid_request", err


def test_traces_carry_a_limit_only_when_there_is_one() -> None:
    plain = ArSubmitted("r", 4, 1)
    assert "cache_read_limit" not in ar_event_to_dict(plain)
    scored = ArSubmitted("r", 4, 1, prompt=(1, 2, 3, 4), cache_read_limit=2)
    line = ar_event_to_dict(scored)
    assert line["cache_read_limit"] == 2
    assert ar_event_from_dict(line) == scored
    assert ar_event_from_dict(ar_event_to_dict(plain)) == plain
    for bad in (-1, "2", True):
        with pytest.raises(TraceFormatError, match=r"cache_read_limit.*an integer >= 0 or null"):
            ar_event_from_dict({**line, "cache_read_limit": bad}, 7)


def _hits(limit: int | None) -> tuple[int, ...]:
    """The blocks the reference's c hits, c sharing a's first 6 tokens (3 blocks)."""
    h = ArHarness(make_vllm_v1_prefix, CFG, policy=VLLM_V1_PREFIX.profile.policy)
    assert h.submit(ArRequest("a", 7, 1, prompt=(1, 2, 3, 4, 5, 6, 7))) is None
    h.drain()
    assert (
        h.submit(ArRequest("c", 7, 1, prompt=(1, 2, 3, 4, 5, 6, 9), cache_read_limit=limit)) is None
    )
    h.drain()
    assert h.violation is None, h.violation
    return next((e.blocks for e in h.events if isinstance(e, ArCacheHit)), ())


def test_the_reference_reads_up_to_the_limit_in_whole_blocks() -> None:
    assert len(_hits(None)) == 3
    assert len(_hits(6)) == 3
    assert len(_hits(5)) == 2
    assert len(_hits(2)) == 1
    assert _hits(1) == ()
    assert _hits(0) == ()


def _drops_limits(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """The reference, its `ArSubmitted` events stripped of their cache read limit."""

    def stripped(e: ArEvent) -> None:
        if isinstance(e, ArSubmitted):
            e = dataclasses.replace(e, cache_read_limit=None)
        sink(e)

    return make_vllm_v1_prefix(config, stripped)


def test_an_adapter_that_does_not_report_a_limit_breaks_valid_request() -> None:
    h = ArHarness(_drops_limits, CFG)
    with pytest.raises(SpecViolation, match="cache_read_limit=0, but its ArSubmitted carries None"):
        h.submit(ArRequest("r", 4, 1, prompt=(1, 2, 3, 4), cache_read_limit=0))
    assert ArHarness(_drops_limits, CFG).submit(ArRequest("r", 4, 1)) is None


@given(st.integers(1, 24), st.data())
def test_the_strategy_draws_only_the_limits_a_profile_honours(
    prompt_len: int, data: st.DataObject
) -> None:
    assert data.draw(cache_read_limits(prompt_len, CacheReadLimits.NONE)) is None
    assert data.draw(cache_read_limits(prompt_len, CacheReadLimits.SKIP)) in (None, 0)
    limit = data.draw(cache_read_limits(prompt_len, CacheReadLimits.BOUNDED))
    # vLLM 0.34 refuses a first scored row from prompt_len - 1 on
    assert limit is None or limit == 0 or 1 <= limit <= prompt_len - 2, limit


def test_a_logs_twin_replays_each_requests_cache_read_limit(tmp_path: Path) -> None:
    """`check-trace --twin` submits each request with the cache read limit its
    `ar_submitted` carries: logs of vllm-v1-prefix whose requests bound their reads decide
    alike (before, the twin read whole cached prefixes and every such log failed
    twin_decisions)."""
    config = SHARED_PROMPTS  # 24 usable blocks of 4 tokens, two seats, prefix caching
    policy = VLLM_V1_PREFIX.profile.policy
    for seed in range(6):
        rng = random.Random(seed)
        h = ArHarness(VLLM_V1_PREFIX.factory, config, policy=policy)
        stem = tuple(rng.randrange(100) for _ in range(12))
        for i in range(8):
            tail = tuple(rng.randrange(100, 200) for _ in range(rng.randrange(1, 6)))
            prompt = stem[: rng.choice((4, 8, 12))] + tail
            limit = rng.choice((None, 0, 2, 5))
            h.submit(ArRequest(f"r{i}", len(prompt), 3, prompt=prompt, cache_read_limit=limit))
            if rng.random() < 0.5:
                h.step()
        h.drain()
        assert h.violation is None, h.violation
        ops = operations(h.events, {}, config, policy)
        limits = [op.request.cache_read_limit for op in ops if isinstance(op, ArSubmit)]
        assert limits == [
            r.cache_read_limit for r in (o.request for o in h.ops if isinstance(o, ArSubmit))
        ]
        path = tmp_path / f"{seed}.jsonl"
        with path.open("w") as out:
            write_ar_trace(h.events, out, config, policy)
        code, said = check(str(path), "--twin", "vllm-v1-prefix")
        assert code == 0 and "its twin vllm-v1-prefix decides alike" in said, said
