"""An AR implementation's scheduling decisions, read out of its event stream, step by step.

Two AR schedulers given the same operations (submissions, aborts, steps, drains) can be
compared by what they decide in each step, not by how they word it: the event order inside a
phase and the names of the blocks are theirs to choose, and the spec does not fix them. What
they decide is, per step:

- `scheduled`: the tokens scheduled per request (a request scheduled and then preempted in the
  same step, as vLLM 0.33's priority policy may do, counts as unscheduled), sorted;
- `preempted`: the requests preempted, in order (the victim order is a decision);
- `allocated`: the number of fresh blocks each request was given, sorted (a request preempted
  later in the step gave them back with the rest: whether an implementation reports that
  passing allocation is not a decision);
- `finished`: the requests that finished, sorted (events after a step's end that finish its
  requests belong to that step: where an implementation reports them is not a decision).

`step_decisions(events)` reads them; `first_difference(ours, theirs)` names the first step
where two lists differ, in one line (rule `twin_decisions` of the AR spec). Standard library
only, so engine adapters may use it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from spec.ar.events import (
    ArBlocksAllocated,
    ArEvent,
    ArFinished,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
)


@dataclass(frozen=True, slots=True)
class StepDecision:
    """What one step decided (see the module docstring for each part)."""

    scheduled: tuple[tuple[str, int], ...] = ()
    preempted: tuple[str, ...] = ()
    allocated: tuple[tuple[str, int], ...] = ()
    finished: tuple[str, ...] = ()

    def parts(self) -> tuple[tuple[str, object], ...]:
        """(name, value) of every part, in the order a difference is reported."""
        return (
            ("schedules", list(self.scheduled)),
            ("preempts", list(self.preempted)),
            ("allocates blocks", list(self.allocated)),
            ("finishes", list(self.finished)),
        )


@dataclass(slots=True)
class _Step:
    scheduled: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    allocated: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)

    def decision(self) -> StepDecision:
        return StepDecision(
            tuple(sorted(self.scheduled.items())),
            tuple(self.preempted),
            tuple(sorted(self.allocated.items())),
            tuple(sorted(self.finished)),
        )


def step_decisions(events: Sequence[ArEvent]) -> list[StepDecision]:
    """One `StepDecision` per `ArStepEnd`, in order. A finish reported after a step's end (and
    before the next step's first decision) is counted in that step; finishes before the first
    step (none in a valid stream) and anything after the last step end that is not a finish
    are dropped (a step that never ended is no step)."""
    steps: list[StepDecision] = []
    current = _Step()
    for e in events:
        if isinstance(e, ArScheduled):
            current.scheduled[e.request_id] = current.scheduled.get(e.request_id, 0) + e.num_tokens
        elif isinstance(e, ArPreempted):
            current.preempted.append(e.request_id)
            current.scheduled.pop(e.request_id, None)  # unscheduled with its tokens
            current.allocated.pop(e.request_id, None)  # and its blocks given back
        elif isinstance(e, ArBlocksAllocated):
            current.allocated[e.request_id] = current.allocated.get(e.request_id, 0) + len(e.blocks)
        elif isinstance(e, ArFinished):
            if steps and not _started(current):
                last = steps[-1]
                steps[-1] = StepDecision(
                    last.scheduled,
                    last.preempted,
                    last.allocated,
                    tuple(sorted((*last.finished, e.request_id))),
                )
            else:
                current.finished.append(e.request_id)
        elif isinstance(e, ArStepEnd):
            steps.append(current.decision())
            current = _Step()
    return steps


def _started(step: _Step) -> bool:
    return bool(step.scheduled or step.preempted or step.allocated or step.finished)


def first_difference(
    ours: Sequence[StepDecision],
    theirs: Sequence[StepDecision],
    names: tuple[str, str] = ("the implementation", "the other"),
) -> str | None:
    """None when both lists are equal; else the first step and part that differ, in one line
    (a step one side never ran reads 'nothing (no such step)')."""
    for i in range(max(len(ours), len(theirs))):
        if i < len(ours) and i < len(theirs) and ours[i] == theirs[i]:
            continue
        mine = ours[i].parts() if i < len(ours) else None
        other = theirs[i].parts() if i < len(theirs) else None
        if mine is None or other is None:
            ran = names[0] if mine is not None else names[1]
            idle = names[1] if mine is not None else names[0]
            n = min(len(ours), len(theirs))
            return f"step {i}: {ran} runs it, {idle} ran only {n} step{'' if n == 1 else 's'}"
        for (what, a), (_, b) in zip(mine, other, strict=True):
            if a != b:
                return f"step {i}: {names[0]} {what} {a}, {names[1]} {what} {b}"
    return None


__all__ = ["StepDecision", "first_difference", "step_decisions"]
