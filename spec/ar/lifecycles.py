"""AR lifecycles as transition tables (data): a request and a KV block.

    waiting --scheduled--> running --preempted--> preempted --step_end--> waiting
    running --finished--> finished;   waiting | running | preempted --aborted--> aborted

A preempted request waits at the head of the queue; it holds no KV and recomputes from zero.
"""

from __future__ import annotations

import enum

from spec.lifecycles import Lifecycle, Transition


class ArPhase(enum.Enum):
    """Where an AR request is in its lifecycle (`AR_REQUEST_LIFECYCLE`)."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # preempted in the current step; waiting again from its end
    FINISHED = "finished"
    ABORTED = "aborted"


class ArBlockPhase(enum.Enum):
    """Where a KV block of the AR pool is in its lifecycle."""

    FREE = "free"
    CACHED = "cached"  # free (reference count 0) but still holding a cached prefix (hittable)
    HELD = "held"  # reference count >= 1 (several holders only through cache hits)
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
            "max_tokens produced or end token sampled; holds no block (where declared, "
            "free_at_batch_end: keeps them while a request of its static batch runs)",
        ),
        Transition(
            _P.FINISHED.value,
            "ar_blocks_freed",
            _P.FINISHED.value,
            "where declared (free_at_batch_end): the blocks it kept, by the end of the update "
            "phase in which its static batch's last request ended",
        ),
        Transition(
            _P.WAITING.value,
            "ar_cache_hit",
            _P.WAITING.value,
            "prefix caching on; holds nothing; cached blocks of its own prefix; at most known - 1 "
            "tokens; admitted in the same step",
        ),
        Transition(
            _P.PREEMPTED.value,
            "ar_cache_hit",
            _P.PREEMPTED.value,
            "as from waiting, where the implementation re-admits after preempting",
        ),
        Transition(_P.WAITING.value, "ar_aborted", _P.ABORTED.value, "holds no block"),
        Transition(_P.RUNNING.value, "ar_aborted", _P.ABORTED.value, "holds no block"),
        Transition(_P.PREEMPTED.value, "ar_aborted", _P.ABORTED.value, "holds no block"),
    ),
)

_B = ArBlockPhase

AR_BLOCK_LIFECYCLE = Lifecycle(
    name="ar_kv_block",
    states=tuple(p.value for p in ArBlockPhase),
    initial=_B.FREE.value,
    terminal=(),
    transitions=(
        Transition(_B.FREE.value, "ar_blocks_allocated", _B.HELD.value, "reference count 1"),
        Transition(
            _B.CACHED.value,
            "ar_blocks_allocated",
            _B.HELD.value,
            "evicts the cached content; reference count 1",
        ),
        Transition(
            _B.HELD.value,
            "ar_scheduled",
            _B.HELD.value,
            "prefix caching: a full block whose tokens are computed this step becomes cached",
        ),
        Transition(
            _B.CACHED.value, "ar_cache_hit", _B.HELD.value, "its content is the hitter's prefix"
        ),
        Transition(
            _B.HELD.value,
            "ar_cache_hit",
            _B.HELD.value,
            "shared: reference count + 1; its content is the hitter's prefix",
        ),
        Transition(
            _B.HELD.value,
            "ar_blocks_freed",
            _B.FREE.value,
            "by a holder; the last reference (cached blocks stay cached)",
        ),
        Transition(_B.HELD.value, "ar_blocks_freed", _B.CACHED.value, "the last reference"),
        Transition(
            _B.HELD.value,
            "ar_preempted",
            _B.FREE.value,
            "every block of the victim loses its reference (cached blocks stay cached)",
        ),
        Transition(_B.CACHED.value, "ar_cache_evicted", _B.FREE.value, "reference count 0"),
    ),
)

AR_LIFECYCLES: tuple[Lifecycle, ...] = (AR_REQUEST_LIFECYCLE, AR_BLOCK_LIFECYCLE)
