"""The stage scheduler: pipeline stages over a Vidur replica, one batch per stage in flight."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from properties.ar.strategies import ar_configs
from reference.ar.stages import STAGE_REPLICAS, StageScheduler
from reference.ar.vidur import make_vidur_lightllm, make_vidur_vllm
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArEvent
from spec.ar.machine import ArSpecMachine
from spec.errors import ConfigError, RequestError

CHUNKED = {
    "vidur-vllm": False,
    "vidur-sarathi": True,
    "vidur-orca": False,
    "vidur-ft": False,
    "vidur-vllm-released": False,
    "vidur-sarathi-released": True,
    "vidur-mnemosyne": True,
    "vidur-mnemosyne-one-queue": True,
}

# the replicas that run with sequence pipeline parallelism
SEQUENCE_PARALLEL = ("vidur-sarathi-released", "vidur-mnemosyne", "vidur-mnemosyne-one-queue")

Op = tuple[str, int, int]  # ("submit", prompt, max_tokens) | ("tick", n, 0) | ("abort", i, 0)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[str, ArConfig, list[Op]]:
    replica = draw(
        st.sampled_from([*sorted(STAGE_REPLICAS), *(f"{r}+sp" for r in SEQUENCE_PARALLEL)])
    )
    chunked = CHUNKED[replica.removesuffix("+sp")]
    cfg = draw(ar_configs(chunked=(chunked,), thresholds=False, stages=(1, 2, 3, 4)))
    if replica in ("vidur-orca", "vidur-ft"):
        cfg = cfg.replace(num_blocks=cfg.num_blocks + 2 * cfg.max_blocks_per_request)
    limit = cfg.max_model_len
    submit = st.tuples(st.just("submit"), st.integers(1, limit - 1), st.integers(1, limit))
    op = st.one_of(
        submit,
        submit,
        st.tuples(st.just("tick"), st.integers(1, 3), st.just(0)),
        st.tuples(st.just("abort"), st.integers(0, 20), st.just(0)),
    )
    return replica, cfg, draw(st.lists(op, min_size=4, max_size=40))


def _check_tick(s: StageScheduler) -> None:
    """One tick with the pipeline invariants before and after it."""
    s.check_pipeline()
    before = s.occupancy()
    leaving = {rid for b in s.stages[-1:] if b is not None for rid in b.tokens}
    s.step()
    after = s.occupancy()
    s.check_pipeline()
    assert after[0] is None  # stage 0 handed its batch on
    assert after[2:] == before[1:-1]  # every other batch moved exactly one stage
    flying = [b for b in after if b is not None]
    assert len(flying) == len(set(flying)) <= s.config.num_stages
    if not s.replica.sequence_parallel:  # else a later chunk of the request may still run
        assert not leaving & set(s.in_flight())  # a completed batch is out of the pipeline


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenarios())
def test_one_batch_per_stage_and_requests_conserved(
    scenario: tuple[str, ArConfig, list[Op]],
) -> None:
    name, cfg, ops = scenario
    replica = name.removesuffix("+sp")  # "+sp": with sequence pipeline parallelism
    s = StageScheduler(cfg, lambda e: None, replica, sequence_parallel=name != replica)
    ids: list[str] = []
    for kind, a, b in ops:
        if kind == "submit":
            rid = f"r{len(ids)}"
            try:
                s.submit(ArRequest(rid, a, b))
            except RequestError:
                continue
            ids.append(rid)
        elif kind == "tick":
            for _ in range(a):
                _check_tick(s)
        elif ids:
            rid = ids[a % len(ids)]
            if rid not in s.aborted and rid not in s.replica.finished:
                s.abort(rid)
        s.check_pipeline()
    for _ in range(100_000):
        if s.is_idle():
            break
        _check_tick(s)
    assert s.is_idle()
    assert s.replica.pool.num_free == cfg.usable_blocks
    for rid in ids:
        req = s.replica.finished.get(rid)
        assert (req is not None) != (rid in s.aborted)
        if req is not None:
            assert req.finish_reason() is not None


@pytest.mark.parametrize("replica", sorted(STAGE_REPLICAS))
def test_one_stage_is_the_replica_checked_by_the_spec(replica: str) -> None:
    cfg = ArConfig(
        block_size=2,
        num_blocks=40,
        max_num_batched_tokens=16,
        max_num_seqs=3,
        max_model_len=16,
        enable_chunked_prefill=CHUNKED[replica],
    )
    spec = ArSpecMachine(cfg)

    def sink(e: ArEvent) -> None:
        spec.apply(e)
        spec.check_invariants()

    s = StageScheduler(cfg, sink, replica)
    spec.rules = s.replica.rules
    for i in range(6):
        s.submit(ArRequest(f"r{i}", 3 + i, 2 + i % 3))
    s.drain()
    assert spec.is_idle() and spec.outputs() == {f"r{i}": 2 + i % 3 for i in range(6)}


def test_pipeline_fills_and_a_lone_request_pays_every_stage() -> None:
    cfg = ArConfig(
        num_blocks=40,
        max_num_seqs=1,
        max_model_len=16,
        num_stages=3,
        enable_chunked_prefill=False,
    )
    s = StageScheduler(cfg, lambda e: None, "vidur-vllm")
    s.submit(ArRequest("a", 4, 3))
    s.drain()
    assert s.tick == 3 * 3  # each of its 3 tokens needs a pass through the 3 stages
    s = StageScheduler(cfg.replace(max_num_seqs=6), lambda e: None, "vidur-vllm")
    for i in range(6):
        s.submit(ArRequest(f"r{i}", 4, 3))
    s.drain()
    assert s.peak_in_flight == 3  # one micro-batch of 6 // 3 requests in each stage
    assert len(s.replica.finished) == 6


@pytest.mark.parametrize("replica", ["vidur-mnemosyne", "vidur-mnemosyne-one-queue"])
def test_mnemosyne_reads_a_completed_prefill_when_its_batch_ends(replica: str) -> None:
    """Mnemosyne sends a request whose chunk completed its prefill to the decode queue when the
    batch ends (Vidur's `is_prefill_complete`, read from the request's computed and prefill
    tokens, not from the formation in between), and one still short to the partial prefills."""
    cfg = ArConfig(
        block_size=2,
        num_blocks=40,
        max_num_batched_tokens=6,
        max_num_seqs=4,
        max_model_len=16,
        num_stages=2,
        enable_chunked_prefill=True,
    )
    s = StageScheduler(cfg, lambda e: None, replica)
    s.submit(ArRequest("a", 4, 3))
    s.submit(ArRequest("b", 4, 2))
    s.step()  # tick 0 forms a:4, b:2 (the chunk of 6 is spent)
    assert s.in_flight() == {"a": 1, "b": 1}  # moved on to the last stage
    s.step()  # tick 1 forms nothing (both in flight); the batch of tick 0 ends
    assert [q.rid for q in s.replica.pending] == ["a"]  # its prefill is complete: decodes
    assert [q.rid for q in s.replica.between_batches()] == ["a", "b"]  # b waits for a chunk
    s.step()  # tick 2: a decodes first, then b's last 2 prompt tokens
    assert s.stages[1] is not None and s.stages[1].tokens == {"a": 1, "b": 2}


@pytest.mark.parametrize("replica", SEQUENCE_PARALLEL)
def test_sequence_parallelism_forms_the_next_chunk_once_the_last_left_stage_0(
    replica: str,
) -> None:
    """A 12-token prompt in chunks of 4 over 3 stages: with sequence parallelism its chunks are
    formed at ticks 0, 1 and 2, all three in flight at once (the pipeline rules hold as
    declared), and its first decode waits for the last chunk to leave the pipeline."""
    cfg = ArConfig(
        block_size=1,
        num_blocks=40,
        max_num_batched_tokens=4,
        max_num_seqs=3,
        max_model_len=16,
        num_stages=3,
        enable_chunked_prefill=True,
    )
    formed: list[tuple[int, int]] = []
    s = StageScheduler(cfg, lambda e: None, replica, sequence_parallel=True)
    s.submit(ArRequest("a", 12, 2))
    while not s.is_idle():
        s.step()
        s.check_pipeline()
        batch = s.stages[1]
        if batch is not None:
            formed.append((batch.formed_at, batch.tokens["a"]))
        if s.tick == 3:
            snapshot = s.pipeline_snapshot()
            assert [b.request_ids for b in snapshot.batches] == [("a",), ("a",)]
    assert formed == [(0, 4), (1, 4), (2, 4), (5, 1)]  # the decode after the last chunk's end
    assert s.replica.finished["a"].num_output == 2


def test_stage_config_errors() -> None:
    cfg = ArConfig(
        block_size=1, num_stages=2, enable_chunked_prefill=False, max_num_batched_tokens=32
    )
    with pytest.raises(ConfigError) as err:
        make_vidur_lightllm(cfg, lambda e: None)
    assert err.value.field == "num_stages"
    with pytest.raises(ConfigError) as err:
        StageScheduler(cfg, lambda e: None, "vidur-lightllm")
    assert err.value.field == "replica"
    with pytest.raises(ConfigError) as err:
        make_vidur_vllm(cfg, lambda e: None)  # alone it steps one stage: pipelines go through
    assert err.value.field == "num_stages"
    with pytest.raises(ConfigError, match="False for vidur-vllm: sequence pipeline") as err:
        StageScheduler(cfg, lambda e: None, "vidur-vllm", sequence_parallel=True)
    assert err.value.field == "sequence_parallel"
    StageScheduler(cfg, lambda e: None, "vidur-vllm")
