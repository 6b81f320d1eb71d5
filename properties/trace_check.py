"""Check a recorded event log (JSON Lines) against the spec, e.g. one written by a foreign engine.

The trace may start with a config header line (`{"kind": "config", ...}`); otherwise the config
is given by the caller. Events are replayed in order; the first violation is reported with its
line number. At the end, a trace that left work running is reported as incomplete, not failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spec.config import DllmConfig
from spec.errors import ConfigError, SpecViolation
from spec.machine import SpecMachine
from spec.trace import read_trace


@dataclass(frozen=True, slots=True)
class TraceResult:
    path: str
    events: int
    rounds: int
    violation: SpecViolation | None
    line: int | None  # line of the violating event
    idle_at_end: bool

    @property
    def ok(self) -> bool:
        return self.violation is None


def check_trace(path: str | Path, config: DllmConfig | None = None) -> TraceResult:
    header, events = read_trace(path)
    cfg = config or header
    if cfg is None:
        raise ConfigError(
            "config",
            None,
            'the trace has no {"kind": "config", ...} header line: pass --config PATH',
        )
    machine = SpecMachine(cfg)
    for count, (line, event) in enumerate(events):
        try:
            machine.apply(event)
            machine.check_invariants()
        except SpecViolation as v:
            return TraceResult(str(path), count, machine.round_index, v, line, False)
    return TraceResult(str(path), len(events), machine.round_index, None, None, machine.is_idle())
