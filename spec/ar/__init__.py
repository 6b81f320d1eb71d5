"""The autoregressive (AR) scheduling specification: vLLM-v1 / Vidur style iteration-level
scheduling with a token budget, a seat cap, paged KV blocks and preemption by recomputation.
Standard library only; `mypy --strict` clean.
"""

from spec.ar.adapter import (
    ArAwaitingAdapter,
    ArEventSink,
    ArImplementationFactory,
    ArSchedulerAdapter,
)
from spec.ar.config import (
    AdmissionOrder,
    ArConfig,
    ArRequest,
    ArRequestTooLong,
    ArRules,
    Policy,
    VictimOrder,
    rules_for,
    validate_ar_request,
)
from spec.ar.events import (
    AR_EVENT_BY_KIND,
    AR_EVENT_TYPES,
    ArAborted,
    ArAwaiting,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheEvicted,
    ArCacheHit,
    ArCacheReset,
    ArDraftsVerified,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArOutputTokens,
    ArPauseSet,
    ArPreempted,
    ArReady,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.lifecycles import AR_LIFECYCLES, ArPhase
from spec.ar.machine import ArSpecMachine, finish_reason
from spec.ar.pipeline import (
    PIPELINE_RULES,
    BatchInFlight,
    PipelineRule,
    PipelineSnapshot,
    check_pipeline,
)
from spec.ar.profile import ArConfigSpace, ArPolicy, ArProfile, CacheReadLimits
from spec.ar.reconstruct import ArPoolView, release_events, scheduling_events
from spec.ar.routing import ROUTING_RULES, ROUTINGS, RoutingRule, check_routing, expected_routes
from spec.ar.rules import AR_RULES, ArRule
from spec.ar.snapshot import ArSnapshot

__all__ = [
    "AR_EVENT_BY_KIND",
    "AR_EVENT_TYPES",
    "AR_LIFECYCLES",
    "AR_RULES",
    "PIPELINE_RULES",
    "ROUTINGS",
    "ROUTING_RULES",
    "AdmissionOrder",
    "ArAborted",
    "ArAwaiting",
    "ArAwaitingAdapter",
    "ArBlocksAllocated",
    "ArBlocksFreed",
    "ArCacheEvicted",
    "ArCacheHit",
    "ArCacheReset",
    "ArConfig",
    "ArConfigSpace",
    "ArDraftsVerified",
    "ArEvent",
    "ArEventSink",
    "ArFinishReason",
    "ArFinished",
    "ArImplementationFactory",
    "ArOutputTokens",
    "ArPauseSet",
    "ArPhase",
    "ArPolicy",
    "ArPoolView",
    "ArPreempted",
    "ArProfile",
    "ArReady",
    "ArRequest",
    "ArRequestTooLong",
    "ArRule",
    "ArRules",
    "ArScheduled",
    "ArSchedulerAdapter",
    "ArSnapshot",
    "ArSpecMachine",
    "ArStepEnd",
    "ArSubmitted",
    "BatchInFlight",
    "CacheReadLimits",
    "PipelineRule",
    "PipelineSnapshot",
    "Policy",
    "RoutingRule",
    "VictimOrder",
    "check_pipeline",
    "check_routing",
    "expected_routes",
    "finish_reason",
    "release_events",
    "rules_for",
    "scheduling_events",
    "validate_ar_request",
]
