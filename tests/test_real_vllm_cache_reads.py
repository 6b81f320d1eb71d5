"""Per-request cache read limits on vLLM's real scheduler (`ArRequest.cache_read_limit`): 0 is
`skip_reading_prefix_cache` on both releases; a first scored prompt row
(`prompt_logprob_start`, 0.34.0's `Request.prefix_cache_hit_limit`) bounds a hit on 0.34.0 and
is refused, as a typed error, on 0.33.0. The spec checks every hit against the limit, a live
scheduler's log carries it, and `check-trace` holds the log to it. (Cache-aware admission's
ranking of such a request, a 0.34.0 finding, is in tests/test_real_vllm_cache_aware.py.)"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm import MANIFEST, REAL_VLLM_PREFIX, VLLM_CACHE_READ_LIMITS
from integrations.vllm.adapter import RealVllmScheduler
from integrations.vllm.cache_reads import with_cache_read_limits
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.engine_core import LoopOptions, check_both, run_loop
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from properties.ar.harness import ArHarness
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArCacheHit, ArEvent
from spec.ar.profile import CacheReadLimits
from spec.errors import InvalidRequest
from tests.engine_gate import require_engine
from tests.vllm_seeded_bugs import cache_limit_ignored, connector_limit_ignored

# 9 usable blocks of 2 tokens (the null block besides), two seats
CONFIG = ArConfig(
    block_size=2,
    num_blocks=10,
    max_num_seqs=2,
    max_num_batched_tokens=16,
    max_model_len=8,
    enable_prefix_caching=True,
    reserve_null_block=True,
)
A = (1, 2, 3, 4, 5, 6, 7)
C = (1, 2, 3, 4, 5, 6, 9)  # shares a's first 3 blocks


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def _bounded_on_this_release() -> bool:
    return VLLM_CACHE_READ_LIMITS is CacheReadLimits.BOUNDED


def _c_hits(limit: int | None) -> int:
    """a runs to its end, then c (a's first 6 tokens cached) with `cache_read_limit=limit`:
    the blocks c's hit takes on vLLM, the spec checking every event."""
    h = ArHarness(REAL_VLLM_PREFIX.factory, CONFIG, policy=REAL_VLLM_PREFIX.profile.policy)
    assert h.submit(ArRequest("a", 7, 1, prompt=A)) is None
    h.drain()
    err = h.submit(ArRequest("c", 7, 1, prompt=C, cache_read_limit=limit))
    if err is not None:
        raise err
    h.drain()
    assert h.violation is None, h.violation
    return len(next((e.blocks for e in h.events if isinstance(e, ArCacheHit)), ()))


def test_vllm_reads_a_cached_prefix_only_up_to_the_limit() -> None:
    """Unbounded, c takes a's 3 cached blocks (6 tokens: its 7th is computed); skipping the
    cache, none. On 0.34.0 a first scored row s gives it the whole blocks below s, as the
    spec and the reference do (tests/test_ar_cache_reads.py)."""
    assert _c_hits(None) == 3
    assert _c_hits(0) == 0
    if not _bounded_on_this_release():
        return
    assert [_c_hits(s) for s in (5, 4, 3, 2, 1)] == [2, 2, 1, 1, 0]


def test_a_scored_row_is_a_typed_error_where_the_release_cannot_bound_a_hit() -> None:
    """vLLM 0.33.0 reads a request's whole cached prefix or none of it: a bounded limit is
    refused before anything changes, naming the release that has it; the request is then
    accepted without it."""
    if _bounded_on_this_release():
        return
    adapter = RealVllmScheduler(CONFIG, lambda _: None, REAL_VLLM_PREFIX.profile.space)
    with pytest.raises(InvalidRequest) as caught:
        adapter.submit(ArRequest("c", 7, 1, prompt=C, cache_read_limit=3))
    assert "invalid cache_read_limit=3: 0 or None on vLLM 0.33.0" in str(caught.value)
    assert "new in vLLM 0.34.0" in str(caught.value)
    assert not adapter.sched.requests
    adapter.submit(ArRequest("c", 7, 1, prompt=C))
    assert list(adapter.sched.requests) == ["c"]


def _live_log(limit: int) -> list[str]:
    """vLLM's scheduler, driven by the adapter, with `VllmEventLog` attached: a, then c with
    `cache_read_limit=limit`."""
    from integrations.vllm.event_log import VllmEventLog

    lines: list[str] = []
    events: list[ArEvent] = []
    adapter = RealVllmScheduler(CONFIG, events.append, REAL_VLLM_PREFIX.profile.space)
    VllmEventLog(adapter.sched, lines.append)
    adapter.submit(ArRequest("a", 7, 1, prompt=A))
    adapter.drain(100)
    adapter.submit(ArRequest("c", 7, 1, prompt=C, cache_read_limit=limit))
    adapter.drain(100)
    return lines


def test_a_live_log_carries_the_limit_and_check_trace_holds_a_hit_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The log of a live scheduler writes each request's limit as vLLM holds it, and
    `check-trace` passes it; the same log with c's limit lowered below the hit it took fails
    `cache_hit_bounded` (exit 1)."""
    from schedspec_cli.main import main

    limit = 4 if _bounded_on_this_release() else 0
    lines = _live_log(limit)
    records = [json.loads(line) for line in lines]
    submitted = {r["request_id"]: r for r in records if r.get("kind") == "ar_submitted"}
    assert "cache_read_limit" not in submitted["a"], submitted["a"]
    assert submitted["c"]["cache_read_limit"] == limit, submitted["c"]
    log = tmp_path / "live.jsonl"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["check-trace", str(log)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    if not _bounded_on_this_release():
        return  # c took no hit: nothing to lower the limit below
    tampered = [
        json.dumps({**r, "cache_read_limit": 1}) if r is submitted["c"] else line
        for r, line in zip(records, lines, strict=True)
    ]
    log.write_text("\n".join(tampered) + "\n", encoding="utf-8")
    assert main(["check-trace", str(log)]) == 1
    out = capsys.readouterr().out
    assert "cache_hit_bounded" in out, out
    assert "its cache_read_limit is 1: at most 0" in out, out


# --- the engine-core loop (integrations.vllm.cache_reads) ---------------------------------------

LIMITED = LoopOptions(cache_read_limits=True)
#: A KV connector whose loads all succeed, so a request's computed tokens at its admission are
#: what it read.
CONNECTED = dataclasses.replace(LIMITED, kv_connector="fail", kv_load_failures=False)


def test_limits_are_given_in_turn_and_only_where_the_release_has_them() -> None:
    """None, skip, a scored row (the middle one) in turn; a prompt too short to score from a
    row, or a release without rows, skips instead."""
    program = with_cache_read_limits(shared_prompt_program(3), bounded=True)
    requests = [r for batch in program.arrivals for r in batch]
    for i, r in enumerate(requests):
        want = [None, 0, (r.prompt_len - 1) // 2 if r.prompt_len >= 3 else 0][i % 3]
        assert r.cache_read_limit == want, (i, r)
    skipping = with_cache_read_limits(shared_prompt_program(3), bounded=False)
    assert {r.cache_read_limit for b in skipping.arrivals for r in b} == {None, 0}


@pytest.mark.parametrize("options", [LIMITED, CONNECTED], ids=["prefix-cache", "kv-connector"])
def test_the_loops_hold_every_admission_to_its_limit(options: LoopOptions) -> None:
    """Both loops pass the prefix-caching programs of the first 60 shared-prompt ones, their
    requests bounding their reads, and the rule is not vacuous: bounded requests are admitted,
    and on 0.34.0 some read part of a hit (5 programs: seeds 32, 39, 43, 51 and 55)."""
    bounded = partial = 0
    programs = (shared_prompt_program(seed) for seed in range(60))
    for program in (p for p in programs if p.config.enable_prefix_caching):
        for run in check_both(program, options):
            bounded += run.bounded_admissions
            partial += run.partial_reads
    assert bounded > 0
    assert (partial > 0) == _bounded_on_this_release(), partial


#: The seeded bugs, and the rule that catches each.
SEEDED_BUGS: tuple[tuple[Callable[[Any], None], str], ...] = (
    (cache_limit_ignored, "cache_read_limit"),
    (connector_limit_ignored, "cache_read_limit"),
)


@pytest.mark.parametrize(
    ("bug", "options"),
    [(cache_limit_ignored, LIMITED), (connector_limit_ignored, CONNECTED)],
    ids=["prefix-cache", "kv-connector"],
)
def test_the_rule_catches_reads_past_the_limit(
    bug: Callable[[Any], None], options: LoopOptions
) -> None:
    """A scheduler whose cache lookup, or whose take of a connector's hit, ignores the limit
    fails `cache_read_limit` within the first programs, naming the request and its limit."""
    for seed in range(40):
        try:
            run_loop(
                shared_prompt_program(seed),
                async_scheduling=False,
                options=dataclasses.replace(options, fix=bug),
            )
        except EngineCoreViolation as err:
            assert err.rule == "cache_read_limit", err
            assert "computed tokens, read from the prefix cache or a KV connector" in err.detail
            assert "its cache read limit is" in err.detail, err.detail
            return
    pytest.fail(f"no program caught {bug.__name__}")
