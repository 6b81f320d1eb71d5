"""Lifecycles as transition tables (data, not code).

`SpecMachine` looks phase changes up here, the docs render them as state diagrams, and the Z3
layer encodes them. A trigger is an event kind, qualified where one event kind leads to
different phases (a step result that is done, or not done with masks left, ...).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RequestPhase(enum.Enum):
    """Where a dLLM request is in its lifecycle (`REQUEST_LIFECYCLE`)."""

    QUEUED = "queued"  # submitted, waiting for admission (FCFS)
    ADMITTED = "admitted"  # in the running set with a request-pool row, between blocks
    RUNNING = "running"  # in the running set with block k in flight
    FINISHED = "finished"
    ABORTED = "aborted"


class BlockPhase(enum.Enum):
    """Where a request's diffusion block is in its lifecycle (`BLOCK_LIFECYCLE`)."""

    MASKED = "masked"  # KV allocated, not stepped yet (initial content: prompt and/or masks)
    DENOISING = "denoising"  # stepped; masks remain
    COMPLETE = "complete"  # no masks left; awaiting the final forward that writes its KV
    DONE = "done"  # the step reported done (the block was complete when it started)
    COMMITTED = "committed"  # part of the request; its KV is the prefix of later blocks


class SlotPhase(enum.Enum):
    """A KV slot: free, or owned by one (request, block)."""

    FREE = "free"
    OWNED = "owned"  # by (request, block)


class RowPhase(enum.Enum):
    """A request-pool row: free, or held by one request."""

    FREE = "free"
    HELD = "held"  # by one request, from admission to finish / abort


@dataclass(frozen=True, slots=True)
class Transition:
    """One edge of a lifecycle: `trigger` takes `source` to `target` when `guard` holds."""

    source: str
    trigger: str
    target: str
    guard: str = ""  # the rule(s) that must also hold, in words


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """A state machine in table form: its states, initial and terminal states, and
    transitions (rendered in docs/spec.md; the spec machines look their moves up here)."""

    name: str
    states: tuple[str, ...]
    initial: str
    terminal: tuple[str, ...]
    transitions: tuple[Transition, ...]

    def target(self, source: str, trigger: str) -> str | None:
        """The phase `trigger` leads to from `source`, or None if it is not enabled there."""
        for t in self.transitions:
            if t.source == source and t.trigger == trigger:
                return t.target
        return None

    def triggers_from(self, source: str) -> tuple[str, ...]:
        """The triggers of every transition out of `source`, in table order."""
        return tuple(t.trigger for t in self.transitions if t.source == source)


_R = RequestPhase
_B = BlockPhase

# Step-result triggers: which of the three outcomes a `StepResult` is.
STEP_NOT_DONE_MASKED = "step_result(accept=0, masks>0)"
STEP_NOT_DONE_COMPLETE = "step_result(accept=0, masks=0)"
STEP_DONE = "step_result(accept=block_size)"

REQUEST_LIFECYCLE = Lifecycle(
    name="request",
    states=tuple(p.value for p in RequestPhase),
    initial="(new)",
    terminal=(_R.FINISHED.value, _R.ABORTED.value),
    transitions=(
        Transition("(new)", "submitted", _R.QUEUED.value, "unique id; valid request"),
        Transition(
            _R.QUEUED.value,
            "admitted",
            _R.ADMITTED.value,
            "head of the queue (FCFS); running < max_running_requests; row free",
        ),
        Transition(
            _R.ADMITTED.value,
            "kv_allocated",
            _R.RUNNING.value,
            "next block; page-aligned; slots free; before the round's first forward",
        ),
        Transition(
            _R.RUNNING.value,
            "kv_allocated",
            _R.RUNNING.value,
            "re-allocation of a carried block's slots (FDFO without in-place reuse)",
        ),
        Transition(
            _R.RUNNING.value,
            "block_committed",
            _R.ADMITTED.value,
            "block is done (final-KV forward ran)",
        ),
        Transition(
            _R.ADMITTED.value,
            "finished",
            _R.FINISHED.value,
            "finish condition holds; owns no slot and no row",
        ),
        Transition(_R.QUEUED.value, "aborted", _R.ABORTED.value, "owns nothing"),
        Transition(_R.ADMITTED.value, "aborted", _R.ABORTED.value, "owns no slot and no row"),
        Transition(_R.RUNNING.value, "aborted", _R.ABORTED.value, "owns no slot and no row"),
    ),
)

BLOCK_LIFECYCLE = Lifecycle(
    name="block",
    states=tuple(p.value for p in BlockPhase),
    initial="(none)",
    terminal=(_B.COMMITTED.value,),
    transitions=(
        Transition("(none)", "kv_allocated", _B.MASKED.value, "block_size slots, page-aligned"),
        Transition(_B.MASKED.value, STEP_NOT_DONE_MASKED, _B.DENOISING.value),
        Transition(_B.MASKED.value, STEP_NOT_DONE_COMPLETE, _B.COMPLETE.value),
        Transition(_B.MASKED.value, STEP_DONE, _B.DONE.value, "the forward's input had no masks"),
        Transition(_B.DENOISING.value, STEP_NOT_DONE_MASKED, _B.DENOISING.value),
        Transition(_B.DENOISING.value, STEP_NOT_DONE_COMPLETE, _B.COMPLETE.value),
        Transition(
            _B.COMPLETE.value,
            STEP_NOT_DONE_COMPLETE,
            _B.COMPLETE.value,
            "post-completion edits (JointThreshold)",
        ),
        Transition(_B.COMPLETE.value, STEP_DONE, _B.DONE.value, "final-KV forward"),
        Transition(_B.DONE.value, STEP_DONE, _B.DONE.value, "sync only: a done row re-stepped"),
        Transition(_B.DONE.value, "block_committed", _B.COMMITTED.value, "tokens keep the prompt"),
    ),
)

SLOT_LIFECYCLE = Lifecycle(
    name="kv_slot",
    states=tuple(p.value for p in SlotPhase),
    initial=SlotPhase.FREE.value,
    terminal=(),
    transitions=(
        Transition(SlotPhase.FREE.value, "kv_allocated", SlotPhase.OWNED.value, "one owner"),
        Transition(
            SlotPhase.OWNED.value, "kv_freed", SlotPhase.FREE.value, "freed by its owner, once"
        ),
    ),
)

ROW_LIFECYCLE = Lifecycle(
    name="request_pool_row",
    states=tuple(p.value for p in RowPhase),
    initial=RowPhase.FREE.value,
    terminal=(),
    transitions=(
        Transition(RowPhase.FREE.value, "admitted", RowPhase.HELD.value, "one holder"),
        Transition(RowPhase.HELD.value, "row_released", RowPhase.FREE.value, "by its holder"),
    ),
)

LIFECYCLES: tuple[Lifecycle, ...] = (
    REQUEST_LIFECYCLE,
    BLOCK_LIFECYCLE,
    SLOT_LIFECYCLE,
    ROW_LIFECYCLE,
)


def mermaid(lifecycle: Lifecycle) -> str:
    """A Mermaid `stateDiagram-v2` rendering of a lifecycle table."""

    def node(name: str) -> str:
        return "[*]" if name.startswith("(") else name

    lines = ["stateDiagram-v2"]
    if not lifecycle.initial.startswith("("):
        lines.append(f"    [*] --> {lifecycle.initial}")
    for t in lifecycle.transitions:
        label = t.trigger.replace(":", " ")
        lines.append(f"    {node(t.source)} --> {node(t.target)}: {label}")
    for term in lifecycle.terminal:
        lines.append(f"    {term} --> [*]")
    return "\n".join(lines)
