"""A scheduler whose decisions are not a function of its calls is reported as such.

Hypothesis replays a failing program to shrink and print it; when the replay behaves
differently it raises one of its `Flaky` errors, which `verify` used to report under the
error's type name (`FlakyFailure`, `FlakyStrategyDefinition`). Vidur's Mnemosyne was the first
real case (its batch lists its requests in address order). `failure_from` now names the rule
`nondeterministic` and says why no counterexample can be replayed, with the violation the
first run saw.
"""

from __future__ import annotations

from typing import Any

from properties.verify import NONDETERMINISTIC, verify_implementation
from reference.ar.vllm_v1 import VLLM_V1
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig
from spec.ar.events import ArEvent, ArScheduled
from spec.implementation import ArImplementation


def _flaky_factory() -> Any:
    """The reference scheduler that, once in the process, reports one token more for a
    request it schedules more than one token: a bug that shows on one run of a program and
    not on its replay."""
    fired = [False]

    def make(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        def tampered(event: ArEvent) -> None:
            if not fired[0] and isinstance(event, ArScheduled) and event.num_tokens > 1:
                fired[0] = True
                event = ArScheduled(event.request_id, event.num_tokens + 1)
            sink(event)

        return VLLM_V1.factory(config, tampered)

    return make


def test_a_scheduler_that_decides_differently_on_replay_is_reported_nondeterministic() -> None:
    impl = ArImplementation(_flaky_factory(), VLLM_V1.profile, "every other run misreports")
    result = verify_implementation("flaky", impl, 100)
    assert not result.passed
    failure = result.failures[0]
    assert failure.rule == NONDETERMINISTIC, failure
    assert failure.message.startswith("the implementation is not deterministic:"), failure.message
    assert "Hypothesis replayed the same program" in failure.message
    assert "first seen as: [" in failure.message, failure.message


def test_a_deterministic_failure_keeps_its_rule() -> None:
    """The control: the same misreport on every run is an ordinary violation, named by rule."""

    def always(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        def tampered(event: ArEvent) -> None:
            if isinstance(event, ArScheduled) and event.num_tokens > 1:
                event = ArScheduled(event.request_id, event.num_tokens + 1)
            sink(event)

        return VLLM_V1.factory(config, tampered)

    result = verify_implementation("wrong", ArImplementation(always, VLLM_V1.profile), 100)
    assert not result.passed
    assert result.failures[0].rule not in (NONDETERMINISTIC, "FlakyFailure"), result.failures
