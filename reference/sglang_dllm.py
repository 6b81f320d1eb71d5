"""SGLang 0.5.23's dLLM admission order, re-implemented on the reference scheduler.

SGLang's dLLM path (python/sglang/srt/dllm/mixin/scheduler.py) follows PREFILL_FIRST with two
choices of its own, both inside the spec's policy:

1. A window. `_fetch_waiting_reqs` moves at most `max_running_requests` minus what the dLLM
   manager holds (the running requests) from the head of the waiting queue into the manager,
   and only those are considered: a request whose first block is prompt-only passes the
   requests ahead of it only within that window.
2. Phase-separated admission. A round that forwards prompt-only blocks (a prefill batch) admits
   no decode request; those are admitted in a round that forwards a decode batch. So a decode
   request that fits may wait while prefill runs: not work-conserving, as SGLang's profile
   declares.

Everything else is the reference's: worst-case KV reservation at admission, the batch (prefill
first), whole blocks, in-place reuse. With the five candidate fixes of
`integrations.sglang.fixes`, SGLang makes exactly these decisions on every generated program
that `scripts/sglang_vs_reference.py` ran (docs/engines/sglang.md); this module is that claim as
code.

Under priority scheduling (`sglang-dllm-order-priority`) the queue is in priority order, lower
first (`DllmPolicy.priority_order`), and the window is its head, recomputed every round. That
is the order SGLang means to follow, not the one 0.5.23 follows: its window is sticky (a
request `_fetch_waiting_reqs` moved into the dLLM manager stays there, admitted or not, and is
never sorted again), so a later arrival of a higher priority waits behind it. The candidate
fix `priority-window` (`integrations.sglang.fixes`) makes SGLang decide as this twin does.

Under `--schedule-policy lof` (`sglang-dllm-order-lof`) the queue is by `max_new_tokens`,
longest first, submission order breaking ties (`DllmPolicy.longest_output_first`), and the
window is again its head every round; with priority scheduling too
(`sglang-dllm-order-priority-lof`) by priority, then `max_new_tokens`. SGLang 0.5.23's window
is just as sticky under these orders, and `priority-window` covers them as well (it re-sorts
the window under any order `calc_priority` applies).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeAlias

from reference.dllm import ReferenceDllmScheduler, replaying_twin
from spec.adapter import EventSink, ImplementationFactory
from spec.config import DllmConfig
from spec.events import Event
from spec.implementation import DllmImplementation
from spec.profile import DllmAdmission, DllmPolicy, DllmProfile

SGLANG_ORDER_POLICY = DllmPolicy(
    admission=DllmAdmission.PREFILL_FIRST, work_conserving=False, aborts_after_commit=True
)


class SglangOrderScheduler(ReferenceDllmScheduler):
    """The reference under PREFILL_FIRST with SGLang's window and phase-separated admission."""

    def _admit(self) -> None:
        window = self.waiting[: max(0, self.config.max_running_requests - len(self.running))]
        self._admit_prefill_requests(window)
        if self._prefill_rows():
            return  # a prefill round: decode requests wait for a decode round
        self._admit_fcfs()


#: What builds an `SglangOrderScheduler` (an `ImplementationFactory` whose schedulers are that).
SglangOrderFactory: TypeAlias = Callable[[DllmConfig, EventSink], SglangOrderScheduler]


class SglangOrderVariant(NamedTuple):
    """SGLang's admission order under one policy, as the built-ins need it: the factory
    (`schedspec verify --impl`), the decision twin replaying a run's step outcomes
    (`conformance_machine(..., twin=...)`, `verify --twin`; rule `twin_decisions`) and the
    implementation with its profile."""

    factory: SglangOrderFactory
    twin: Callable[[Sequence[Event], DllmConfig], ImplementationFactory]
    implementation: DllmImplementation


def sglang_order_variant(policy: DllmPolicy, description: str) -> SglangOrderVariant:
    """`SglangOrderScheduler` under `policy` (one of SGLang's orders), its twin and its built-in
    (it takes requests with `ignore_eos` and `stop_token_ids`, as SGLang does)."""

    def factory(config: DllmConfig, sink: EventSink) -> SglangOrderScheduler:
        return SglangOrderScheduler(config, sink, policy=policy)

    profile = DllmProfile(policy=policy, ignore_eos=True, stop_token_ids=True)
    return SglangOrderVariant(
        factory,
        replaying_twin(SglangOrderScheduler, policy),
        DllmImplementation(factory, profile, description),
    )


# `schedspec verify --impl sglang-dllm-order` and `--twin sglang-dllm-order`: FCFS
make_sglang_order_scheduler: SglangOrderFactory
make_sglang_order_scheduler, SGLANG_ORDER_TWIN, SGLANG_DLLM_ORDER = sglang_order_variant(
    SGLANG_ORDER_POLICY,
    "SGLang 0.5.23's dLLM admission order (PREFILL_FIRST in its window, phase-separated), "
    "re-implemented on the reference",
)

#: The same under priority scheduling: the queue in priority order, lower first.
SGLANG_ORDER_PRIORITY_POLICY = dataclasses.replace(SGLANG_ORDER_POLICY, priority_order=True)
make_sglang_order_priority_scheduler: SglangOrderFactory
(
    make_sglang_order_priority_scheduler,
    SGLANG_ORDER_PRIORITY_TWIN,
    SGLANG_DLLM_ORDER_PRIORITY,
) = sglang_order_variant(
    SGLANG_ORDER_PRIORITY_POLICY,
    "SGLang 0.5.23's dLLM admission order under priority scheduling (the queue in priority "
    "order, lower first; its window the head of that order every round), re-implemented on "
    "the reference",
)

#: The same under `--schedule-policy lof`: the queue by max_new_tokens, longest first.
SGLANG_ORDER_LOF_POLICY = dataclasses.replace(SGLANG_ORDER_POLICY, longest_output_first=True)
make_sglang_order_lof_scheduler: SglangOrderFactory
make_sglang_order_lof_scheduler, SGLANG_ORDER_LOF_TWIN, SGLANG_DLLM_ORDER_LOF = (
    sglang_order_variant(
        SGLANG_ORDER_LOF_POLICY,
        "SGLang 0.5.23's dLLM admission order under --schedule-policy lof (the queue by "
        "max_new_tokens, longest first; its window the head of that order every round), "
        "re-implemented on the reference",
    )
)

#: Both: the queue by priority, lower first, then by max_new_tokens, longest first.
SGLANG_ORDER_PRIORITY_LOF_POLICY = dataclasses.replace(
    SGLANG_ORDER_POLICY, priority_order=True, longest_output_first=True
)
make_sglang_order_priority_lof_scheduler: SglangOrderFactory
(
    make_sglang_order_priority_lof_scheduler,
    SGLANG_ORDER_PRIORITY_LOF_TWIN,
    SGLANG_DLLM_ORDER_PRIORITY_LOF,
) = sglang_order_variant(
    SGLANG_ORDER_PRIORITY_LOF_POLICY,
    "SGLang 0.5.23's dLLM admission order under --schedule-policy lof with priority "
    "scheduling (the queue by priority, lower first, then by max_new_tokens, longest first), "
    "re-implemented on the reference",
)

__all__ = [
    "SGLANG_DLLM_ORDER",
    "SGLANG_DLLM_ORDER_LOF",
    "SGLANG_DLLM_ORDER_PRIORITY",
    "SGLANG_DLLM_ORDER_PRIORITY_LOF",
    "SGLANG_ORDER_LOF_POLICY",
    "SGLANG_ORDER_LOF_TWIN",
    "SGLANG_ORDER_POLICY",
    "SGLANG_ORDER_PRIORITY_LOF_POLICY",
    "SGLANG_ORDER_PRIORITY_LOF_TWIN",
    "SGLANG_ORDER_PRIORITY_POLICY",
    "SGLANG_ORDER_PRIORITY_TWIN",
    "SGLANG_ORDER_TWIN",
    "SglangOrderFactory",
    "SglangOrderScheduler",
    "SglangOrderVariant",
    "make_sglang_order_lof_scheduler",
    "make_sglang_order_priority_lof_scheduler",
    "make_sglang_order_priority_scheduler",
    "make_sglang_order_scheduler",
    "sglang_order_variant",
]
