"""Scheduling decisions, compared: one implementation's event stream against another's.

Two dLLM schedulers that denoise alike (the second replays the first's step outcomes, e.g. with
`reference.oracle.RecordedOracle`) can still differ in what they decide: which request is
admitted when, and which blocks each forward runs. This module reads those decisions out of an
event stream, recovers the operations a stream records so a second implementation can be driven
through the same ones, and names the first decision where two streams part.

- `operations(events)`: the submissions, effective aborts and rounds, in order. A rejected
  submission and an abort of a request that had already ended leave no event and change
  nothing, so they are not needed to reproduce the run; `drain` shows as the rounds it ran.
  They are `properties.workload` operations: `apply_ops(harness, ops)` runs them on another
  implementation.
- `admissions(events)`: the request ids in the order they were admitted;
  `admissions_by_round(events)`: the same, per round.
- `forward_rounds(events)`: per round, per forward, the sorted (request, block) rows.
- `first_difference(ours, theirs)`: None when both streams admit alike and forward alike,
  else one readable line naming the first round where they do not.
- `twin_difference(events, config, twin, profile)`: the rule `twin_decisions` for one run: its
  operations through the twin (`DecisionTwin`: built from the run's events, so it can replay
  the implementation's step outcomes), then `first_difference`. `conformance_machine(...,
  twin=...)` checks it at the end of every example.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from properties.deadline import CallDeadlineExceeded, TwinHung, call_deadline
from properties.harness import Harness
from properties.workload import Abort, Op, Round, Submit, apply_ops
from spec.adapter import ImplementationFactory, SchedulerAdapter
from spec.config import DllmConfig, RequestSpec
from spec.errors import CannotDrive, ConfigError
from spec.events import Aborted, Admitted, ControlReturned, Event, Forward, Submitted
from spec.profile import DllmProfile

#: Builds, from one run's events and config, a factory for the twin that replays that run's step
#: outcomes (e.g. a reference scheduler with `RecordedOracle.from_events(events, config)`).
DecisionTwin = Callable[[Sequence[Event], DllmConfig], ImplementationFactory]

T = TypeVar("T")

Rows = list[tuple[str, int]]  # one forward's (request id, block index) rows, sorted
Rounds = list[list[Rows]]  # per round, its forwards


def operations(events: Sequence[Event], *, aborts_in_round: bool = False) -> list[Op]:
    """The operations that reproduce `events`' run: one per `Submitted`, `Aborted` and
    `ControlReturned`, in stream order.

    An `Aborted` inside a round (after its first forward: the engine's own, under
    `DllmPolicy.aborts_after_commit`) is no client's operation. For a twin that aborts in a
    round too (`aborts_in_round`) it is none: a replaying twin repeats it from the record
    (`reference.oracle.EngineAborts`). For one that cannot, it is the nearest the idealised
    spec allows: an abort right after that round."""
    ops: list[Op] = []
    in_round = False  # a forward ran since the round began
    deferred: list[Op] = []  # in-round aborts, as aborts right after the round
    for e in events:
        if isinstance(e, Forward):
            in_round = True
        elif isinstance(e, Submitted):
            ops.append(Submit.of(e))
        elif isinstance(e, Aborted):
            if not in_round:
                ops.append(Abort(e.request_id))
            elif not aborts_in_round:
                deferred.append(Abort(e.request_id))
        elif isinstance(e, ControlReturned):
            ops.append(Round())
            ops.extend(deferred)
            deferred.clear()
            in_round = False
    return ops


def admissions(events: Sequence[Event]) -> list[str]:
    """The request ids of the `Admitted` events, in stream order."""
    return [e.request_id for e in events if isinstance(e, Admitted)]


def admissions_by_round(events: Sequence[Event]) -> list[list[str]]:
    """Per round (split at each `ControlReturned`), the request ids it admitted, in order; the
    last entry holds what came after the last `ControlReturned`."""
    return _by_round(events, _admitted)


def forward_rounds(events: Sequence[Event]) -> Rounds:
    """Per round (split at each `ControlReturned`), per `Forward`, its sorted (request id,
    block index) rows; the last entry holds what came after the last `ControlReturned`."""
    return _by_round(events, _forward_rows)


def _forward_rows(e: Event) -> Rows | None:
    return sorted((r.request_id, r.block_index) for r in e.rows) if isinstance(e, Forward) else None


def _admitted(e: Event) -> str | None:
    return e.request_id if isinstance(e, Admitted) else None


def _by_round(events: Sequence[Event], pick: Callable[[Event], T | None]) -> list[list[T]]:
    """Per round (split at each `ControlReturned`), what `pick` takes from its events."""
    rounds: list[list[T]] = [[]]
    for e in events:
        if isinstance(e, ControlReturned):
            rounds.append([])
        elif (item := pick(e)) is not None:
            rounds[-1].append(item)
    return rounds


def first_difference(
    ours: Sequence[Event],
    theirs: Sequence[Event],
    names: tuple[str, str] = ("the implementation", "the other"),
) -> str | None:
    """None when both streams admit the same requests in the same rounds and order and run
    the same rows in every forward; else the first round where they differ, in one line."""
    a_admit, b_admit = admissions_by_round(ours), admissions_by_round(theirs)
    a_fwd, b_fwd = forward_rounds(ours), forward_rounds(theirs)
    for i in range(max(len(a_admit), len(b_admit), len(a_fwd), len(b_fwd))):
        pairs = (
            ("admits", _at(a_admit, i), _at(b_admit, i)),
            ("forwards", _at(a_fwd, i), _at(b_fwd, i)),
        )
        for what, a, b in pairs:
            if a != b:
                return f"round {i}: {names[0]} {what} {a}, {names[1]} {what} {b}"
    return None


def twin_difference(
    events: Sequence[Event],
    config: DllmConfig,
    twin: DecisionTwin,
    profile: DllmProfile,
    *,
    drain: bool = True,
    subject: str = "the implementation",
    checked: bool = True,
) -> str | None:
    """None when `events`' operations, run through the twin (checked against the spec under
    `profile`, then drained unless `drain` is False: a log that stops with work running,
    compared only up to its last complete round, its last `ControlReturned`), decide exactly
    as `events` did; else the first difference in one line, calling `events`' author
    `subject`. A twin that raises (a replayed record that runs out, a violation of its
    own) is reported with the first difference up to that point, which caused it; one that
    refuses the configuration is `CannotDrive` (no check, no finding); a call of its that
    hangs (each is under the call deadline) is `TwinHung`.

    `checked=False` drives the twin bare, its events unchecked: for a long recorded log that
    was itself checked, where the harness's per-round comparisons with the whole abstract
    state would make the replay quadratic in the log's length. Of `profile` only
    `aborts_after_commit` is then read (whether the twin aborts inside a round: `operations`)."""
    if not drain:  # a round the log cut short is not compared: the twin would finish it
        events = events[: _after_last_round(events)]
    in_round = profile.policy.aborts_after_commit  # can the twin abort inside a round?
    stopped = ""
    twin_events: list[Event] = []
    try:
        with call_deadline("being given the run"):
            factory = twin(events, config)
        if checked:
            # no golden check of the twin: its outputs replay the run's own steps, and a block
            # the run read from a prefix cache has none to decode it alone with
            with call_deadline("being built"):
                h = Harness(factory, config, profile=profile, check_golden=False)
            twin_events = h.events
            for op in operations(events, aborts_in_round=in_round):  # each call its deadline
                with call_deadline(f"its {type(op).__name__.lower()}"):
                    apply_ops(h, [op])
            if drain:
                with call_deadline("its drain"):
                    h.drain()
        else:
            _run_bare(
                factory, config, operations(events, aborts_in_round=in_round), drain, twin_events
            )
    except ConfigError as err:  # a configuration the twin does not run: no check, no finding
        raise CannotDrive(
            f"the decision twin refuses the configuration it was given ({err}): name a twin that "
            "runs every configuration the implementation is checked in"
        ) from None
    except Exception as err:  # the twin's own failure is part of the report
        stopped = f" (the twin then stopped: {type(err).__name__}: {err})"
    except CallDeadlineExceeded as hang:  # a twin that hangs must not hang the run
        raise TwinHung(hang.what, hang.seconds) from None
    difference = first_difference(events, twin_events, (subject, "its twin"))
    if difference is None and not stopped:
        return None
    return f"{difference or 'no decision differed'}{stopped}"


def _after_last_round(events: Sequence[Event]) -> int:
    """The index just past the last `ControlReturned` of `events` (0 if none)."""
    for i in range(len(events) - 1, -1, -1):
        if isinstance(events[i], ControlReturned):
            return i + 1
    return 0


def _run_bare(
    factory: ImplementationFactory,
    config: DllmConfig,
    ops: Sequence[Op],
    drain: bool,
    events: list[Event],
) -> None:
    """Run `ops` on a fresh implementation, its events appended to `events` unchecked."""
    with call_deadline("being built"):
        impl = _Bare(factory(config, events.append))
    for op in ops:  # each call under its deadline
        with call_deadline(f"its {type(op).__name__.lower()}"):
            apply_ops(impl, [op])
    if drain:
        with call_deadline("its drain"):
            impl.drain()


class _Bare:
    """An implementation as an `OpDriver`: its own calls, nothing checked."""

    def __init__(self, impl: SchedulerAdapter) -> None:
        self.impl = impl

    def submit(self, request: RequestSpec) -> None:
        self.impl.submit(request)

    def abort(self, request_id: str) -> None:
        self.impl.abort(request_id)

    def round(self) -> None:
        self.impl.run_round()

    def drain(self) -> None:
        self.impl.drain()


def _at(rounds: Sequence[object], i: int) -> object:
    return rounds[i] if i < len(rounds) else "nothing (no such round)"


__all__ = [
    "DecisionTwin",
    "admissions",
    "admissions_by_round",
    "first_difference",
    "forward_rounds",
    "operations",
    "twin_difference",
]
