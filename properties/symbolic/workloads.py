"""Concrete artefacts of Z3 models shared by the mutant and boundary searches: small
configurations, workloads from traces, readable workloads, and the replay through the spec."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from properties.workload import Abort, Op, Round, Submit, Workload
from spec.config import DllmConfig, Mode
from spec.errors import SpecViolation
from spec.events import Aborted, ControlReturned, Event, Submitted
from spec.machine import SpecMachine
from spec.profile import DllmPolicy


def dllm_config(**overrides: Any) -> DllmConfig:
    """A small FDFO configuration with in-place reuse (B=2, P=4, 4 pages, 2 rows, 2 running,
    max_context 8, no EOS), with `overrides` applied."""
    fields: dict[str, Any] = {
        "block_size": 2,
        "page_size": 4,
        "kv_pages": 4,
        "req_pool_rows": 2,
        "max_running_requests": 2,
        "max_context": 8,
        "mode": Mode.FDFO,
        "in_place_reuse": True,
        "reloop": False,
        "eos_token_id": None,
    }
    fields.update(overrides)
    return DllmConfig(**fields)


def describe_ops(w: Workload) -> str:
    """The workload's operations in one line: submit(r0, prompt_len=.., max_new=..), round, ..."""
    parts = []
    for op in w.ops:
        if isinstance(op, Submit):
            r = op.request
            stop = (
                (", stop_sampled" if r.stop_sampled else "")
                + (", ignore_eos" if r.ignore_eos else "")
                + (f", stop_token_ids={list(r.stop_token_ids)}" if r.stop_token_ids else "")
                + (f", priority={r.priority}" if r.priority else "")
            )
            parts.append(
                f"submit({r.request_id}, prompt_len={len(r.prompt)}, "
                f"max_new={r.max_new_tokens}{stop})"
            )
        elif isinstance(op, Abort):
            parts.append(f"abort({op.request_id})")
        elif isinstance(op, Round):
            parts.append("round")
        else:
            parts.append("drain")
    return ", ".join(parts)


def workload_from_events(config: DllmConfig, events: Sequence[Event], name: str) -> Workload:
    """The operations an implementation needs to see to produce (roughly) this trace:
    submissions (with their flags) and aborts in order, a round per
    `ControlReturned`; a drain is implied."""
    ops: list[Op] = []
    for e in events:
        if isinstance(e, Submitted):
            ops.append(Submit.of(e))
        elif isinstance(e, Aborted):
            ops.append(Abort(e.request_id))
        elif isinstance(e, ControlReturned):
            ops.append(Round())
    return Workload(config, tuple(ops), name=name, notes=("synthesised by Z3 BMC",))


def replay(
    config: DllmConfig, events: Sequence[Event], policy: DllmPolicy | None = None
) -> tuple[str, SpecViolation | None]:
    """Apply all but the last event (must be accepted) under `policy` (default `DllmPolicy()`),
    then the last; return the state rendering before the last event and the violation it raised
    (None if accepted)."""
    m = SpecMachine(config, policy)
    for e in events[:-1]:
        m.apply(e)
    before = m.render()
    try:
        m.apply(events[-1])
    except SpecViolation as v:
        return before, v
    return before, None
