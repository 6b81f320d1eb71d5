"""The differential between vLLM 0.33.0's real scheduler and the `vllm-v1` reference.

Generated programs (a configuration plus, per step, the requests that arrive before it) go
through two AR implementations; their decisions are compared step by step
(`spec.ar.decisions`: the tokens scheduled per request, the requests preempted, a victim
scheduled earlier in its step counting as unscheduled, the fresh blocks each request was given
and the requests that finished). Depends on `spec` only: the callers
compose the implementations (tests/test_real_vllm.py, and scripts/vllm_differential.py for the
figures in docs/engines/vllm.md).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence

from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.decisions import StepDecision, first_difference, step_decisions
from spec.ar.events import ArEvent
from spec.errors import RequestError


def program(seed: int) -> tuple[ArConfig, list[list[ArRequest]]]:
    """A random configuration inside vLLM's space and, per step, the requests arriving."""
    rnd = random.Random(seed)
    bs = rnd.choice([1, 2, 4])
    max_model_len = rnd.randint(4, 24)
    seqs = rnd.randint(1, 4)
    chunked = rnd.random() < 0.8
    low = max(seqs, 1 if chunked else max_model_len)
    one = -(-(max_model_len - 1) // bs)
    config = ArConfig(
        block_size=bs,
        num_blocks=rnd.randint(one, 2 * one + 1) + 1,
        max_num_batched_tokens=rnd.randint(low, max(low, 2 * max_model_len)),
        max_num_seqs=seqs,
        max_model_len=max_model_len,
        long_prefill_token_threshold=(
            rnd.randint(1, max_model_len) if chunked and rnd.random() < 0.4 else 0
        ),
        enable_chunked_prefill=chunked,
        policy=rnd.choice([Policy.FCFS, Policy.FCFS, Policy.PRIORITY]),
    )
    arrivals: list[list[ArRequest]] = []
    n = 0
    for _ in range(rnd.randint(1, 8)):
        batch = []
        for _ in range(rnd.choice([0, 1, 1, 2, 3])):
            prompt = rnd.randint(1, max_model_len - 1)
            batch.append(
                ArRequest(
                    f"r{n}",
                    prompt,
                    rnd.randint(1, max_model_len - prompt),
                    stop_after=rnd.choice([None, None, rnd.randint(1, 6)]),
                    priority=rnd.randint(0, 3),
                )
            )
            n += 1
        arrivals.append(batch)
    return config, arrivals


def decisions(
    factory: ArImplementationFactory, config: ArConfig, arrivals: Sequence[Sequence[ArRequest]]
) -> list[StepDecision]:
    """Run the program (arrivals, one step after each batch, then drain); its decisions, step
    by step (`spec.ar.decisions`: tokens scheduled, preemptions, fresh blocks, finishes)."""
    events: list[ArEvent] = []
    impl = factory(config, events.append)
    for batch in arrivals:
        for req in batch:
            # both refuse the same invalid requests (validate_ar_request)
            with contextlib.suppress(RequestError):
                impl.submit(req)
        impl.step()
    impl.drain(2_000)
    return step_decisions(events)


def count_differences(
    first: ArImplementationFactory, second: ArImplementationFactory, programs: int
) -> list[int]:
    """Seeds (0..programs-1) of the programs on which the two differ."""
    seeds = []
    for seed in range(programs):
        config, arrivals = program(seed)
        a = decisions(first, config, arrivals)
        if first_difference(a, decisions(second, config, arrivals)) is not None:
            seeds.append(seed)
    return seeds


__all__ = ["count_differences", "decisions", "first_difference", "program"]
