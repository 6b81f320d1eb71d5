"""Check a recorded AR event log (JSON Lines, `spec.ar.trace`) against the AR spec, streaming.

The log is read one line at a time and replayed into an `ArSpecMachine` with incremental
invariant checks (time proportional to what each event changed; finished requests retired), so
a log of millions of events is checked in constant memory. The between-steps invariants are
checked at every step boundary: before the first scheduling-phase event of a step and at the
end of a log that ends idle. The first violation is reported with its line number. A log that
ends with requests still waiting or running is reported as such (`idle_at_end`, the requests
in `waiting_ids` / `running_ids`), not as a violation: it may have been cut inside a step or
its update phase (a block freed, its request's `ArFinished` not yet written), where the
between-steps invariants do not hold yet, so what they would say there is kept apart
(`unjudged_at_end`), not a verdict.

Configuration: the trace's header wins. `config` (a CLI's `--config`) is used only for a trace
without a header; given both, they must agree, else a `ConfigError` names the difference. The
policy likewise: the header's `declared_policy` or the caller's `policy` (an implementation
profile's), and given both they must agree; neither is the idealised spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spec.ar.config import ArConfig
from spec.ar.events import (
    ArAborted,
    ArAwaiting,
    ArBlocksFreed,
    ArDraftsProposed,
    ArDraftsVerified,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArInputFailed,
    ArOutputTokens,
    ArReady,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.machine import ArSpecMachine
from spec.ar.profile import ArPolicy
from spec.ar.trace import ArTraceReader, ar_policy_to_dict
from spec.errors import ConfigError, SpecViolation

# Events that may come between steps (no scheduling phase starts with them): the update
# phase's, after which the between-steps invariants are checked.
_BETWEEN = (
    ArSubmitted,
    ArAborted,
    ArBlocksFreed,
    ArFinished,
    ArStepEnd,
    ArDraftsVerified,
    ArDraftsProposed,
    ArOutputTokens,
    ArAwaiting,
    ArInputFailed,
)


@dataclass(frozen=True, slots=True)
class ArTraceResult:
    """The verdict on one AR trace: the first violation (if any), where, and the end state."""

    path: str
    events: int
    steps: int
    violation: SpecViolation | None
    line: int | None  # the line of the violating event (None: at the end of the log)
    idle_at_end: bool
    waiting_at_end: int
    running_at_end: int
    config: ArConfig | None = None  # what the trace was checked under
    policy: ArPolicy | None = None
    # with `keep`: per request whose stop was sampled (`ArSubmitted.stop_sampled`) and that
    # finished with reason stop, its outputs then (what a scripted replay sets as `stop_after`)
    sampled_stops: dict[str, int] = dataclasses.field(default_factory=dict)
    # a log that conformed: the requests it leaves waiting and running
    waiting_ids: tuple[str, ...] = ()
    running_ids: tuple[str, ...] = ()
    # a log that ends with work left: the between-steps violation its end would be, were it a
    # step boundary (it may be a cut inside a step), reported as a warning, not a verdict
    unjudged_at_end: SpecViolation | None = None

    @property
    def ok(self) -> bool:
        """No violation (a log that ends with work left, `idle_at_end` False, is still ok)."""
        return self.violation is None


def _resolve(header: ArConfig | None, given: ArConfig | None) -> ArConfig:
    if header is None:
        if given is None:
            raise ConfigError(
                "config",
                None,
                'an AR trace needs a {"kind": "config", "family": "ar", ...} header line, or '
                "pass --config PATH",
            )
        return given
    if given is not None and given != header:
        diff = [
            f"{f.name}: header {getattr(header, f.name)!r}, --config {getattr(given, f.name)!r}"
            for f in dataclasses.fields(ArConfig)
            if getattr(header, f.name) != getattr(given, f.name)
        ]
        raise ConfigError(
            "config",
            "; ".join(diff),
            "the trace's own header (drop --config, or pass one equal to the header)",
        )
    return header


def _resolve_policy(declared: ArPolicy | None, given: ArPolicy | None) -> ArPolicy:
    """The header's declared policy or the caller's; given both, they must agree (a header
    that leaves the ordering rules open agrees with any)."""
    if declared is None or declared == ArPolicy():
        return given if given is not None else ArPolicy()
    if given is None:
        return declared
    given_open = dataclasses.replace(given, rules=None) if declared.rules is None else given
    if given_open != declared:
        raise ConfigError(
            "profile",
            ar_policy_to_dict(given),
            f"the trace's own header, which declares {ar_policy_to_dict(declared)} (omit the "
            "profile, or name one with the same policy)",
        )
    return given


def check_ar_trace(
    source: str | Path | Iterable[str],
    config: ArConfig | None = None,
    policy: ArPolicy | None = None,
    keep: list[ArEvent] | None = None,
) -> ArTraceResult:
    """Replay the AR trace (a path or its lines, see `spec.ar.trace.ArTraceReader`), read
    once and front to back; raises `TraceFormatError` / `ConfigError` for bad input (exit 2 in
    the CLI), returns the result at the first violation (exit 1) without reading further.
    `keep`, when given, receives every event that conformed (the log is then held in memory),
    and the result's `sampled_stops` are filled."""
    path = str(source) if isinstance(source, str | Path) else "<stream>"
    with ArTraceReader(source) as reader:
        head = reader.header
        cfg = _resolve(head.config if head else None, config)
        pol = _resolve_policy(head.policy if head else None, policy)
        machine = ArSpecMachine(cfg, pol)
        count = 0
        in_step = False
        sampled: set[str] = set()
        stops: dict[str, int] = {}
        for line, event in reader:
            try:
                between = isinstance(event, _BETWEEN) or (
                    isinstance(event, ArReady) and not event.in_step
                )
                if not in_step and not between:
                    machine.check_invariants(between_steps=True)  # a step boundary
                    in_step = True
                machine.apply(event)
                machine.check_invariants()
                if isinstance(event, ArStepEnd):
                    in_step = False
            except SpecViolation as v:
                return ArTraceResult(
                    path, count, machine.step_index, v, line, False, 0, 0, cfg, pol
                )
            if keep is not None:
                keep.append(event)
                if isinstance(event, ArSubmitted) and event.stop_sampled:
                    sampled.add(event.request_id)
                elif isinstance(event, ArFinished) and event.request_id in sampled:
                    sampled.discard(event.request_id)
                    if event.reason is ArFinishReason.STOP:
                        stops[event.request_id] = machine.num_output(event.request_id)
            count += 1
        idle = machine.is_idle()
        unjudged: SpecViolation | None = None
        try:
            machine.check_invariants(between_steps=True)
        except SpecViolation as v:
            if idle:  # the log's end is a step boundary: nothing of a step is left out
                return ArTraceResult(
                    path, count, machine.step_index, v, None, False, 0, 0, cfg, pol
                )
            unjudged = v
        waiting, running = machine.unfinished_ids()
        return ArTraceResult(
            path,
            count,
            machine.step_index,
            None,
            None,
            idle,
            len(waiting),
            len(running),
            cfg,
            pol,
            stops,
            waiting,
            running,
            unjudged,
        )


__all__ = ["ArTraceResult", "check_ar_trace"]
