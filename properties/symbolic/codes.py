"""Integer codes of the spec's finite domains: lifecycle phases, event kinds, finish reasons.

Phase codes are read from the lifecycle tables of `spec.lifecycles` (the table's initial
pseudo-phase is 0, its states 1, 2, ... in table order), so the encoding cannot drift from the
tables' phase names.
"""

from __future__ import annotations

from spec.events import EVENT_TYPES, FinishReason
from spec.lifecycles import BLOCK_LIFECYCLE, REQUEST_LIFECYCLE, BlockPhase, Lifecycle, RequestPhase


def _codes(lc: Lifecycle) -> dict[str, int]:
    """Integer codes of a lifecycle's phases: its initial pseudo-phase is 0."""
    codes = {lc.initial: 0}
    for i, name in enumerate(lc.states):
        codes[name] = i + 1
    return codes


REQ = _codes(REQUEST_LIFECYCLE)  # "(new)" = 0 (not submitted), "queued" = 1, ...
BLK = _codes(BLOCK_LIFECYCLE)  # "(none)" = 0 (no current block), "masked" = 1, ...
REQ_NAME = {v: k for k, v in REQ.items()}
BLK_NAME = {v: k for k, v in BLK.items()}

NEW = REQ[REQUEST_LIFECYCLE.initial]
QUEUED = REQ[RequestPhase.QUEUED.value]
ADMITTED = REQ[RequestPhase.ADMITTED.value]
RUNNING = REQ[RequestPhase.RUNNING.value]
FINISHED = REQ[RequestPhase.FINISHED.value]
ABORTED = REQ[RequestPhase.ABORTED.value]

NONE_BLOCK = BLK[BLOCK_LIFECYCLE.initial]
MASKED = BLK[BlockPhase.MASKED.value]
DENOISING = BLK[BlockPhase.DENOISING.value]
COMPLETE = BLK[BlockPhase.COMPLETE.value]
DONE = BLK[BlockPhase.DONE.value]
COMMITTED = BLK[BlockPhase.COMMITTED.value]

KIND = {t.kind: i for i, t in enumerate(EVENT_TYPES)}  # event kind -> code, spec order
KIND_NAME = {v: k for k, v in KIND.items()}
REASON = {FinishReason.LENGTH: 0, FinishReason.EOS: 1, FinishReason.STOP: 2}
REASON_OF = {v: k for k, v in REASON.items()}

# tokens of decoded (concrete) requests; the encoding itself has no token contents
PROMPT_TOKEN = 1  # every prompt position of a decoded request
FILLER_TOKEN = 2  # generated positions of a decoded block
EOS_TOKEN = 15  # the EOS id of decoded configurations (properties.strategies.EOS)
STOP_ID_TOKEN = 4  # the one stop token id of a decoded request that lists any
TAIL_TOKEN = 50  # with the prefix cache, the unshared prompt positions of decoded request i
