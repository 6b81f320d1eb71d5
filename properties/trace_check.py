"""Check a recorded event log (JSON Lines) against the spec, e.g. one written by a foreign engine.

The trace may start with a config header line (`{"kind": "config", ...}`); otherwise the config
is given by the caller. When both are given they must agree (the header is what the engine ran
with; a different `config` is refused, never silently preferred). The same holds for the policy
the engine follows on purpose: the header's `declared_policy`, or the caller's `policy` (an
implementation profile's), or both when they agree; with neither, the idealised spec.

Events are streamed and replayed in order with the incremental invariant check (cost per event
~ what it changed, so a log of any length checks in linear time and bounded memory); the first
violation is reported with its line number. At the end, a trace that left work running is
reported as incomplete, not failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from spec.config import DllmConfig
from spec.errors import ConfigError, SpecViolation
from spec.events import Event
from spec.machine import SpecMachine
from spec.profile import DllmPolicy
from spec.trace import iter_trace, policy_to_dict


@dataclass(frozen=True, slots=True)
class TraceResult:
    """The verdict on one dLLM trace: the first violation (if any), where, and the end state."""

    path: str
    events: int
    rounds: int
    violation: SpecViolation | None
    line: int | None  # line of the violating event
    idle_at_end: bool
    config: DllmConfig | None = None  # what the trace was checked under
    policy: DllmPolicy | None = None
    # a log that conformed: the requests it leaves queued and active (admitted or running)
    queued_at_end: tuple[str, ...] = ()
    active_at_end: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No violation (a log that ends with work left, `idle_at_end` False, is still ok)."""
        return self.violation is None


def check_trace(
    source: str | Path | Iterable[str],
    config: DllmConfig | None = None,
    policy: DllmPolicy | None = None,
    keep: list[Event] | None = None,
) -> TraceResult:
    """Replay the trace into a `SpecMachine`; `policy` is the engine's declared one (None: the
    header's, else the idealised spec's; given both, they must agree).

    `source` is a path or the trace's lines (see `spec.trace.iter_trace`). It is read once,
    front to back, and the check returns at the first violation without reading further, so a
    live stream gets its verdict as soon as the violating line arrives. `keep`, when given,
    receives every event that conformed (for a second look, such as a decision twin's; the log
    is then held in memory).
    """
    path = str(source) if isinstance(source, str | Path) else "<stream>"
    machine: SpecMachine | None = None
    count = 0
    for line, item in iter_trace(source):
        if isinstance(item, DllmPolicy):
            if policy is not None and policy != item:
                raise ConfigError(
                    "profile",
                    policy_to_dict(policy),
                    f"the trace's own header (line {line}) declares {policy_to_dict(item)}; "
                    "omit the profile or name one with the same policy",
                )
            policy = item
            continue
        if isinstance(item, DllmConfig):
            if config is not None and config != item:
                raise ConfigError(
                    "config",
                    config,
                    f"the trace's own header (line {line}) says {item}; omit --config or pass "
                    f"the same configuration",
                )
            config = item
            continue
        if machine is None:
            if config is None:
                raise ConfigError(
                    "config",
                    None,
                    'the trace has no {"kind": "config", ...} header line: pass --config PATH',
                )
            machine = SpecMachine(config, policy, retain_finished=False)
        try:
            machine.apply(item)
            machine.check_changed()
        except SpecViolation as v:
            return TraceResult(path, count, machine.round_index, v, line, False, config, policy)
        if keep is not None:
            keep.append(item)
        count += 1
    if machine is None:
        if config is None:
            raise ConfigError(
                "config",
                None,
                'the trace has no {"kind": "config", ...} header line: pass --config PATH',
            )
        machine = SpecMachine(config, policy)
    queued, active = machine.unfinished_ids()
    return TraceResult(
        path,
        count,
        machine.round_index,
        None,
        None,
        machine.is_idle(),
        config,
        policy,
        queued,
        active,
    )
