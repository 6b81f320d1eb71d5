"""Hand-written AR event runs replayed through the spec (the AR side of tests/event_runs.py)."""

from __future__ import annotations

from spec.ar.config import ArConfig
from spec.ar.events import ArEvent
from spec.ar.machine import ArSpecMachine
from spec.ar.profile import ArPolicy
from spec.errors import SpecViolation


def first_ar_violation(
    config: ArConfig, policy: ArPolicy | None, events: list[ArEvent]
) -> SpecViolation | None:
    """Apply `events` to a fresh `ArSpecMachine(config, policy)`: the first violation raised,
    or None when every event conforms."""
    machine = ArSpecMachine(config, policy)
    try:
        for event in events:
            machine.apply(event)
    except SpecViolation as violation:
        return violation
    return None
