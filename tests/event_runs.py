"""Hand-written dLLM event runs: replay them through the spec, or write them as a log.

Shared by the tests that spell a run out event by event (tests/test_spec_stop.py,
tests/test_spec_ignore_eos.py, tests/test_spec_stop_token_ids.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference.dllm import ReferenceDllmScheduler, replaying_twin
from reference.golden import golden_output
from reference.oracle import RecordedOracle
from spec import DllmConfig, Mode, RequestSpec, SpecMachine, SpecViolation
from spec.events import (
    Admitted,
    BlockCommitted,
    ControlReturned,
    Event,
    Finished,
    FinishReason,
    Forward,
    ForwardRow,
    KvAllocated,
    KvFreed,
    RowReleased,
    StepResult,
    Submitted,
)
from spec.snapshot import FinishedOutput
from spec.trace import config_to_dict, event_to_dict

# The runs' configuration: sync, blocks and pages of 2, 8 pages, 2 rows and seats, context 12.
SMALL_SYNC = DllmConfig(
    block_size=2,
    page_size=2,
    kv_pages=8,
    req_pool_rows=2,
    max_running_requests=2,
    max_context=12,
    mode=Mode.SYNC,
    in_place_reuse=False,
)


def block(rid: str, k: int, tokens: tuple[int, ...], slots: tuple[int, int]) -> list[Event]:
    """Block k of `rid` (both positions masked, or none for the prompt block 0) allocated,
    stepped until done and committed, in one sync round."""
    masked = 0 if k == 0 else 2
    unmask: list[Event] = [
        Forward((ForwardRow(rid, k, False, 2, masked),)),
        StepResult(rid, k, 0, 0),
    ]
    return [
        KvAllocated(rid, k, slots),
        *(unmask if masked else []),
        Forward((ForwardRow(rid, k, False, 2, 0),)),
        StepResult(rid, k, 2, 0),
        BlockCommitted(rid, k, tokens),
    ]


def run_to_length(first: Submitted, second: tuple[int, int], third: tuple[int, int]) -> list[Event]:
    """`a` (submitted as `first`: prompt (3, 4), 4 new) commits its prompt block in round 0
    and the output blocks `second` and `third` in rounds 1 and 2, under a sync configuration
    of blocks and pages of 2; it then finishes with LENGTH."""
    return [
        first,
        Admitted("a", 0),
        *block("a", 0, (3, 4), (0, 1)),
        ControlReturned(0),
        *block("a", 1, second, (2, 3)),
        ControlReturned(1),
        *block("a", 2, third, (4, 5)),
        KvFreed("a", (0, 1, 2, 3, 4, 5)),
        RowReleased("a", 0),
        Finished("a", FinishReason.LENGTH),
        ControlReturned(2),
    ]


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


def twin_replay(
    config: DllmConfig, record: list[Event], request: RequestSpec
) -> tuple[list[Event], dict[str, FinishedOutput], FinishedOutput]:
    """`request` served alone by the reference replaying `record`'s steps (`RecordedOracle`):
    its events (replayed through the spec, which must accept them), its outputs, and the
    golden decoder's output for it on the same steps."""
    events: list[Event] = []
    twin = replaying_twin()(record, config)(config, events.append)
    assert isinstance(twin, ReferenceDllmScheduler)
    twin.submit(request)
    twin.drain()
    replay(config, events)
    golden = golden_output(config, RecordedOracle.from_events(record, config), request)
    return events, dict(twin.collect_outputs()), golden
