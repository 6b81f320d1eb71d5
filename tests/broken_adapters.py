"""Deliberately broken adapters: several independent bugs in one scheduler, so a campaign
(`schedspec verify --keep-going`) must report more than one rule; and factories whose adapter a
user got partly wrong (a member missing or of the wrong type, an optional method returning the
wrong type), which must be refused or reported in the user's terms."""

from __future__ import annotations

from typing import Any

from reference.ar.vllm_v1 import make_vllm_v1
from reference.dllm import make_scheduler
from reference.seeded_bugs import DoubleFree
from spec.adapter import EventSink
from spec.ar.adapter import ArEventSink
from spec.ar.config import ArConfig
from spec.config import DllmConfig, RequestSpec
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
    return make_scheduler(config, sink)


class Altered:
    """Forwards every member to a working adapter but those `hidden` (missing) and those given
    as keywords (these values instead): an adapter a user got partly wrong."""

    def __init__(self, inner: Any, hidden: tuple[str, ...] = (), **values: Any) -> None:
        self._inner = inner
        self._hidden = hidden
        for name, value in values.items():
            setattr(self, name, value)

    def __getattr__(self, name: str) -> Any:
        if name in self._hidden:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self._inner, name)


class NoConfig(Altered):
    """A dLLM adapter with every method but no `config`."""


class NoRules(Altered):
    """An AR adapter with every method but no `rules`."""


class RulesAsText(Altered):
    """An AR adapter whose `rules` is a policy's name, not an `ArRules`."""


class ConfigAsDict(Altered):
    """A dLLM adapter whose `config` is a dict of the configuration's fields."""


def no_config(config: DllmConfig, sink: EventSink) -> Any:
    """A factory whose adapter lacks `config`."""
    return NoConfig(make_scheduler(config, sink), ("config",))


def config_as_dict(config: DllmConfig, sink: EventSink) -> Any:
    """A factory whose adapter's `config` is a dict."""
    return ConfigAsDict(make_scheduler(config, sink), config={"block_size": config.block_size})


def no_rules(config: ArConfig, sink: ArEventSink) -> Any:
    """An AR factory whose adapter lacks `rules`."""
    return NoRules(make_vllm_v1(config, sink), ("rules",))


def rules_as_text(config: ArConfig, sink: ArEventSink) -> Any:
    """An AR factory whose adapter's `rules` is the string 'fcfs'."""
    return RulesAsText(make_vllm_v1(config, sink), rules="fcfs")


def outputs_as_list(config: DllmConfig, sink: EventSink) -> Any:
    """A factory whose adapter's `collect_outputs()` returns a list of its outputs, not a
    mapping of request id to output."""
    inner = make_scheduler(config, sink)
    return Altered(inner, collect_outputs=lambda: list(inner.collect_outputs().values()))


def outputs_as_tuples(config: DllmConfig, sink: EventSink) -> Any:
    """A factory whose adapter's `collect_outputs()` maps ids to bare token tuples."""
    inner = make_scheduler(config, sink)

    def collect() -> dict[str, tuple[int, ...]]:
        return {rid: out.tokens for rid, out in inner.collect_outputs().items()}

    return Altered(inner, collect_outputs=collect)


def golden_as_none(config: DllmConfig, sink: EventSink) -> Any:
    """A factory whose adapter's `golden_output()` returns None."""
    return Altered(make_scheduler(config, sink), golden_output=lambda request: None)


def golden_as_tuple(config: DllmConfig, sink: EventSink) -> Any:
    """A factory whose adapter's `golden_output()` returns (tokens, reason), not a
    `FinishedOutput`."""
    inner = make_scheduler(config, sink)

    def golden(request: RequestSpec) -> tuple[tuple[int, ...], Any]:
        out = inner.golden_output(request)
        return (out.tokens, out.reason)

    return Altered(inner, golden_output=golden)
