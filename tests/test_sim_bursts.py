"""Same-time arrivals follow Vidur's event order (differential against facts about Vidur).

Vidur's simulator pops events by (time, creation id) (`vidur/events/base_event.py`,
`_get_priority_number`), and creates every `RequestArrivalEvent` before the run
(`vidur/simulator.py`, `_init_event_queue`). So at one instant all arrivals are queued (each adds a
`GlobalScheduleEvent`), batch ends are handled, and only then does the first global-schedule event
route every queued request and a `ReplicaScheduleEvent` let each replica form a batch. The
expected batches below are what Vidur's replica schedulers decide under that order at a constant
batch time of 1 s, derived by hand from `vidur/scheduler/replica_scheduler/*.py`:

- vLLM, 4 prompts of 8 tokens at t=0, budget 64: one prefill batch of all four
  (padded 4 x 8 = 32 <= 64), then one decode batch of all four.
- A fifth request arriving exactly at the first batch end (t=1) is queued before the replica
  schedules: vLLM's prefill-first rule runs its prefill alone at t=1, the decodes follow.
- Sarathi, chunk 16, 3 prompts of 10 at t=0: r0 whole (10) + r1's first 6 tokens; at t=1 r0's
  decode (1) + r1's last 4 + r2 whole (10) = 15 tokens in 3 sequences.
- LOR over 2 idle replicas, 3 requests at t=0: Vidur's one global-schedule event counts queued
  requests {0: 0, 1: 0} and increments as it routes: r0 -> 0, r1 -> 1, r2 -> 0.

The simulator before this rule started a batch on the first request of a burst (r0 alone).
"""

from __future__ import annotations

import numpy as np

from reference.ar.vidur import make_vidur_sarathi, make_vidur_vllm
from reference.sim.cluster import simulate_cluster
from reference.sim.exec_model import Constant
from reference.sim.replica import ArFactory, ArReplica, SimpleReplica
from reference.sim.stages import StagedReplica, simulate_stages
from reference.sim.workload import Workload
from spec.ar.config import ArConfig

T = Constant(1.0)
# (start, end, sequences, prefill tokens, decode tokens) per batch, in end order
Batch = tuple[float, float, int, int, int]


def _trace(*reqs: tuple[float, int, int]) -> Workload:
    at, pre, dec = zip(*reqs, strict=True)
    return Workload(np.array(at, float), np.array(pre, np.int64), np.array(dec, np.int64))


def _batches(
    w: Workload, factory: ArFactory, cfg: ArConfig, replicas: int = 1, gs: str = "round_robin"
) -> tuple[list[Batch], list[int]]:
    reps = [ArReplica(factory, cfg) for _ in range(replicas)]
    res = simulate_cluster(w, reps, T, gs, record_batches=True)
    got = [(b.start, b.end, b.seqs, b.prefill_tokens, b.decode_tokens) for b in res.batches]
    return got, res.metrics.replica.tolist()


VLLM = ArConfig(
    block_size=4,
    num_blocks=65,
    max_num_batched_tokens=64,
    max_num_seqs=8,
    max_model_len=32,
    enable_chunked_prefill=False,
)
SARATHI = ArConfig(
    block_size=4, num_blocks=65, max_num_batched_tokens=16, max_num_seqs=8, max_model_len=32
)


def test_vllm_burst_at_idle_replica_is_one_batch() -> None:
    w = _trace((0.0, 8, 2), (0.0, 8, 2), (0.0, 8, 2), (0.0, 8, 2))
    got, _ = _batches(w, make_vidur_vllm, VLLM)
    assert got == [(0.0, 1.0, 4, 32, 0), (1.0, 2.0, 4, 0, 4)]


def test_arrival_at_a_batch_end_joins_the_next_batch() -> None:
    w = _trace((0.0, 8, 2), (0.0, 8, 2), (0.0, 8, 2), (0.0, 8, 2), (1.0, 8, 2))
    got, _ = _batches(w, make_vidur_vllm, VLLM)
    assert got == [
        (0.0, 1.0, 4, 32, 0),
        (1.0, 2.0, 1, 8, 0),  # prefill-first: the newcomer alone
        (2.0, 3.0, 5, 0, 5),
    ]


def test_sarathi_burst_chunks_within_one_batch() -> None:
    w = _trace((0.0, 10, 3), (0.0, 10, 3), (0.0, 10, 3))
    got, _ = _batches(w, make_vidur_sarathi, SARATHI)
    assert got[:2] == [(0.0, 1.0, 2, 16, 0), (1.0, 2.0, 3, 14, 1)]


def test_lor_routes_a_burst_on_queue_counts_before_scheduling() -> None:
    w = _trace((0.0, 8, 2), (0.0, 8, 2), (0.0, 8, 2))
    _, placement = _batches(w, make_vidur_vllm, VLLM, replicas=2, gs="lor")
    assert placement == [0, 1, 0]


def test_bursts_in_the_staged_simulator_and_simple_replica() -> None:
    """The pipeline simulator and the SimpleReplica path obey the same order."""
    w = _trace((0.0, 8, 1), (0.0, 8, 1), (0.0, 8, 1))
    res = simulate_cluster(w, [SimpleReplica(max_batch=8)], T, record_batches=True)
    assert [(b.start, b.seqs) for b in res.batches] == [(0.0, 3)]
    staged = simulate_stages(w, [StagedReplica(lambda: SimpleReplica(max_batch=8), 1)], T)
    assert staged.num_batches == 1
    assert staged.metrics.completed.tolist() == [1.0, 1.0, 1.0]
