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
that `scripts/sglang_vs_reference.py` ran (docs/engines.md); this module is that claim as code.
"""

from __future__ import annotations

from reference.dllm import ReferenceDllmScheduler, replaying_twin
from spec.adapter import EventSink
from spec.config import DllmConfig
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


def make_sglang_order_scheduler(config: DllmConfig, sink: EventSink) -> SglangOrderScheduler:
    """Factory for `schedspec verify --impl sglang-dllm-order`."""
    return SglangOrderScheduler(config, sink, policy=SGLANG_ORDER_POLICY)


#: SGLang's decision twin: for one run of SGLang, its admission order replaying that run's step
#: outcomes (`conformance_machine(..., twin=SGLANG_ORDER_TWIN)`; rule `twin_decisions`).
SGLANG_ORDER_TWIN = replaying_twin(SglangOrderScheduler, SGLANG_ORDER_POLICY)

SGLANG_DLLM_ORDER = DllmImplementation(
    make_sglang_order_scheduler,
    DllmProfile(policy=SGLANG_ORDER_POLICY, ignore_eos=True, stop_token_ids=True),
    "SGLang 0.5.23's dLLM admission order (PREFILL_FIRST in its window, phase-separated), "
    "re-implemented on the reference",
)

__all__ = [
    "SGLANG_DLLM_ORDER",
    "SGLANG_ORDER_POLICY",
    "SGLANG_ORDER_TWIN",
    "SglangOrderScheduler",
    "make_sglang_order_scheduler",
]
