"""schedspec's specification: dLLM scheduling lifecycles, events, invariants and the adapter
protocol. Standard library only; `mypy --strict` clean; ships `py.typed`.
"""

from spec.adapter import EventSink, ImplementationFactory, ReportsOutputs, SchedulerAdapter
from spec.config import DllmConfig, Mode, RequestShape, RequestSpec, request_shape, validate_request
from spec.errors import (
    ConfigError,
    DuplicateRequest,
    EmptyPrompt,
    InvalidRequest,
    PromptTooLong,
    RequestError,
    RequestTooLarge,
    SchedSpecError,
    SchedulerStalled,
    SpecViolation,
    UnknownRequest,
)
from spec.events import (
    Aborted,
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
    RowAcquired,
    RowReleased,
    StepResult,
    Submitted,
)
from spec.lifecycles import BlockPhase, RequestPhase
from spec.machine import (
    SpecMachine,
    finish_condition,
    finished_output,
    initial_masks,
    request_output,
    stop_output_lengths,
)
from spec.machine_base import MachineBase
from spec.parity import LeakReport, Mismatch, compare_outputs, leak_report
from spec.reconstruct import PoolView, reconstruct
from spec.rules import RULES, Rule
from spec.snapshot import FinishedOutput, Snapshot

__all__ = [
    "RULES",
    "Aborted",
    "Admitted",
    "BlockCommitted",
    "BlockPhase",
    "ConfigError",
    "ControlReturned",
    "DllmConfig",
    "DuplicateRequest",
    "EmptyPrompt",
    "Event",
    "EventSink",
    "FinishReason",
    "Finished",
    "FinishedOutput",
    "Forward",
    "ForwardRow",
    "ImplementationFactory",
    "InvalidRequest",
    "KvAllocated",
    "KvFreed",
    "LeakReport",
    "MachineBase",
    "Mismatch",
    "Mode",
    "PoolView",
    "PromptTooLong",
    "ReportsOutputs",
    "RequestError",
    "RequestPhase",
    "RequestShape",
    "RequestSpec",
    "RequestTooLarge",
    "RowAcquired",
    "RowReleased",
    "Rule",
    "SchedSpecError",
    "SchedulerAdapter",
    "SchedulerStalled",
    "Snapshot",
    "SpecMachine",
    "SpecViolation",
    "StepResult",
    "Submitted",
    "UnknownRequest",
    "compare_outputs",
    "finish_condition",
    "finished_output",
    "initial_masks",
    "leak_report",
    "reconstruct",
    "request_output",
    "request_shape",
    "stop_output_lengths",
    "validate_request",
]
