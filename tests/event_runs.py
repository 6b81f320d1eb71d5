"""Hand-written dLLM event runs: replay them through the spec, or write them as a log.

Shared by the tests that spell a run out event by event (tests/test_spec_stop.py,
tests/test_spec_ignore_eos.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spec import DllmConfig, SpecMachine, SpecViolation
from spec.events import Event
from spec.trace import config_to_dict, event_to_dict


def replay(config: DllmConfig, events: list[Event]) -> SpecMachine:
    """`events` through the idealised spec, the invariants checked after each."""
    m = SpecMachine(config)
    for e in events:
        m.apply(e)
        m.check_invariants()
    return m


def violation_of(config: DllmConfig, events: list[Event]) -> SpecViolation:
    """The violation `replay` raises (the test fails if there is none)."""
    with pytest.raises(SpecViolation) as info:
        replay(config, events)
    return info.value


def write_log(folder: Path, config: DllmConfig, events: list[Event]) -> Path:
    """`events` as a JSON-lines log with `config` as its header, in a new file of `folder`."""
    path = folder / f"log{len(list(folder.iterdir()))}.jsonl"
    lines = [json.dumps(config_to_dict(config)), *(json.dumps(event_to_dict(e)) for e in events)]
    path.write_text("\n".join(lines) + "\n")
    return path
