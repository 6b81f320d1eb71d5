"""Deliberately broken adapters for campaign tests: several independent bugs in one scheduler,
so a campaign (`schedspec verify --keep-going`) must report more than one rule."""

from __future__ import annotations

from reference.seeded_bugs import DoubleFree
from spec.adapter import EventSink
from spec.config import DllmConfig
from tests.mutants import AdmitsBeyondMaxRunning, RaggedRow


class ThreeBugs(DoubleFree, RaggedRow, AdmitsBeyondMaxRunning):
    """Frees a finished request's slots twice, feeds ragged prompt rows, and admits one request
    more than max_running_requests: three rules, each in its own method."""


def make_three_bugs(config: DllmConfig, sink: EventSink) -> ThreeBugs:
    return ThreeBugs(config, sink)


def not_an_adapter(config: DllmConfig, sink: EventSink) -> dict[str, int]:
    """A factory that returns something that is not an adapter."""
    return {"block_size": config.block_size}


def no_family(config, sink):  # type: ignore[no-untyped-def]
    """A factory whose family cannot be told (no annotation)."""
    from reference.dllm import make_scheduler

    return make_scheduler(config, sink)
