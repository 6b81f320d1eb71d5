"""The fast Vidur replicas decide exactly as the reference classes run through `ArReplica`.

Each fast replica is compared batch for batch (start, end, sequences, token figures) and request
for request (scheduled, first token, completion, restarts) with `ArReplica` over the
`reference/ar/vidur.py` class on generated workloads (Poisson and bursts, tight pools that force
restarts, several replicas, round-robin and LOR), with and without fused decode stretches. A
fixed workload's whole decision trace is also held byte for byte by its SHA-256, so speed work
that changes a decision fails here.
"""

from __future__ import annotations

import hashlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.ar import vidur
from reference.sim import workload as wl
from reference.sim.cluster import ClusterResult, simulate_cluster
from reference.sim.exec_model import Linear
from reference.sim.fast_vllm import FastVidurVllm
from reference.sim.replica import ArReplica
from spec.ar.config import ArConfig

MODEL = Linear(0.01, 1e-5, 2e-4, 1e-7)


def _trace_text(res: ClusterResult) -> str:
    """The decision trace: one line per batch, then one per request."""
    lines = [
        f"b {b.replica} {b.start!r} {b.end!r} {b.seqs} {b.prefill_tokens} {b.decode_tokens}"
        for b in res.batches
    ]
    m = res.metrics
    lines += [
        f"r {i} {m.replica[i]} {m.scheduled[i]!r} {m.first_token[i]!r} {m.completed[i]!r} "
        f"{m.restarts[i]}"
        for i in range(len(m.arrived))
    ]
    return "\n".join(lines) + "\n"


def _same(a: ClusterResult, b: ClusterResult, batches: bool) -> None:
    m, n = a.metrics, b.metrics
    assert np.array_equal(m.completed, n.completed)
    assert np.array_equal(m.first_token, n.first_token, equal_nan=True)
    assert np.array_equal(m.scheduled, n.scheduled, equal_nan=True)
    assert np.array_equal(m.restarts, n.restarts)
    assert np.array_equal(m.replica, n.replica)
    assert a.num_batches == b.num_batches
    if batches:
        assert a.batches == b.batches


@st.composite
def _cases(draw: st.DrawFn) -> tuple[ArConfig, wl.Workload, int, str]:
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    mml = draw(st.sampled_from([32, 64]))
    cfg = ArConfig(
        block_size=bs,
        num_blocks=draw(st.integers(-(-mml // bs) + 2, 4 * mml // bs + 2)),
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(mml, 3 * mml)),
        max_model_len=mml,
        enable_chunked_prefill=False,
    )
    n = draw(st.integers(1, 60))
    seed = draw(st.integers(0, 10_000))
    lengths = wl.Lengths(1, mml // 2)
    if draw(st.booleans()):
        w = wl.poisson(n, draw(st.floats(1.0, 200.0)), lengths, lengths, seed)
    else:
        w = wl.bursts(
            n, draw(st.integers(1, 6)), draw(st.floats(0.05, 1.0)), lengths, lengths, seed
        )
    return cfg, w, draw(st.integers(1, 3)), draw(st.sampled_from(["round_robin", "lor"]))


@settings(max_examples=60, deadline=None)
@given(case=_cases())
def test_fast_vllm_decides_as_the_reference(case: tuple[ArConfig, wl.Workload, int, str]) -> None:
    cfg, w, r, gs = case
    ref = simulate_cluster(
        w, [ArReplica(vidur.make_vidur_vllm, cfg) for _ in range(r)], MODEL, gs, record_batches=True
    )
    for fuse in (False, True):
        fast = simulate_cluster(
            w, [FastVidurVllm(cfg) for _ in range(r)], MODEL, gs, record_batches=True, fuse=fuse
        )
        _same(ref, fast, batches=not fuse)


VLLM_CFG = ArConfig(
    block_size=4,
    num_blocks=40,
    max_num_seqs=6,
    max_num_batched_tokens=96,
    max_model_len=64,
    enable_chunked_prefill=False,
)
# sha256 of `_trace_text` for the fixed workload below (the reference and fast replicas agree,
# and 3 of its requests restart: a tight pool)
VLLM_TRACE_SHA = "afe9c3bee22f2410cf26780dee3f7cd5c17da7eeaf634121db8a2b0ed4974764"


def _fixed_workload() -> wl.Workload:
    return wl.bursts(200, 5, 0.2, wl.Lengths(1, 40), wl.Lengths(1, 24), seed=11)


def test_fixed_workload_decision_trace_is_held_byte_for_byte() -> None:
    w = _fixed_workload()
    ref = simulate_cluster(
        w,
        [ArReplica(vidur.make_vidur_vllm, VLLM_CFG) for _ in range(2)],
        MODEL,
        "lor",
        record_batches=True,
    )
    fast = simulate_cluster(
        w,
        [FastVidurVllm(VLLM_CFG) for _ in range(2)],
        MODEL,
        "lor",
        record_batches=True,
        fuse=False,
    )
    text = _trace_text(ref)
    assert _trace_text(fast) == text
    assert int(ref.metrics.restarts.sum()) > 0
    assert hashlib.sha256(text.encode()).hexdigest() == VLLM_TRACE_SHA
