"""AR lifecycles as transition tables (data): a request and a KV block.

    waiting --scheduled--> running --preempted--> preempted --step_end--> waiting
    running --finished--> finished;   waiting | running | preempted --aborted--> aborted

A preempted request waits at the head of the queue; it holds no KV and recomputes from zero.
"""

from __future__ import annotations

import enum

from spec.lifecycles import Lifecycle, Transition


class ArPhase(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # preempted in the current step; waiting again from its end
    FINISHED = "finished"
    ABORTED = "aborted"


class ArBlockPhase(enum.Enum):
    FREE = "free"
    HELD = "held"
    RESERVED = "reserved"  # the null block (vLLM): never allocated


AR_QUEUED_PHASES = frozenset({ArPhase.WAITING, ArPhase.PREEMPTED})
AR_ACTIVE_PHASES = frozenset({ArPhase.WAITING, ArPhase.PREEMPTED, ArPhase.RUNNING})
AR_TERMINAL_PHASES = frozenset({ArPhase.FINISHED, ArPhase.ABORTED})

_P = ArPhase

AR_REQUEST_LIFECYCLE = Lifecycle(
    name="ar_request",
    states=tuple(p.value for p in ArPhase),
    initial="(new)",
    terminal=(_P.FINISHED.value, _P.ABORTED.value),
    transitions=(
        Transition("(new)", "ar_submitted", _P.WAITING.value, "unique id; valid request"),
        Transition(
            _P.WAITING.value,
            "ar_scheduled",
            _P.RUNNING.value,
            "admission order of the policy; seat free; KV covers the tokens; no preemption "
            "earlier in this step (unless the implementation admits after preempting)",
        ),
        Transition(
            _P.RUNNING.value,
            "ar_scheduled",
            _P.RUNNING.value,
            "once per step; within the token budget; KV covers computed + scheduled",
        ),
        Transition(
            _P.RUNNING.value,
            "ar_preempted",
            _P.PREEMPTED.value,
            "victim order of the policy; not scheduled in this step; frees every block",
        ),
        Transition(
            _P.PREEMPTED.value,
            "ar_scheduled",
            _P.RUNNING.value,
            "re-admitted in the same step (only where the implementation admits after "
            "preempting, e.g. Vidur's Sarathi)",
        ),
        Transition(_P.PREEMPTED.value, "ar_step_end", _P.WAITING.value, "head of the queue"),
        Transition(
            _P.RUNNING.value,
            "ar_finished",
            _P.FINISHED.value,
            "max_tokens produced or end token sampled; holds no block",
        ),
        Transition(_P.WAITING.value, "ar_aborted", _P.ABORTED.value, "holds no block"),
        Transition(_P.RUNNING.value, "ar_aborted", _P.ABORTED.value, "holds no block"),
        Transition(_P.PREEMPTED.value, "ar_aborted", _P.ABORTED.value, "holds no block"),
    ),
)

AR_BLOCK_LIFECYCLE = Lifecycle(
    name="ar_kv_block",
    states=tuple(p.value for p in ArBlockPhase),
    initial=ArBlockPhase.FREE.value,
    terminal=(),
    transitions=(
        Transition(
            ArBlockPhase.FREE.value, "ar_blocks_allocated", ArBlockPhase.HELD.value, "one owner"
        ),
        Transition(
            ArBlockPhase.HELD.value, "ar_blocks_freed", ArBlockPhase.FREE.value, "by its owner"
        ),
        Transition(
            ArBlockPhase.HELD.value,
            "ar_preempted",
            ArBlockPhase.FREE.value,
            "all blocks of the victim",
        ),
    ),
)

AR_LIFECYCLES: tuple[Lifecycle, ...] = (AR_REQUEST_LIFECYCLE, AR_BLOCK_LIFECYCLE)
