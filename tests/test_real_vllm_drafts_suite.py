"""Real vLLM's drafting under the AR suite (`verify --impl real-vllm --drafts`): the adapter
scripts each proposal as vLLM's engine core hands it over (`update_draft_token_ids`) and
samples the accepted drafts (`RealVllmScheduler.propose_drafts`: ngram's, and without prefix
caching EAGLE's and a draft model's too, with their lookahead slots and rows). vLLM 0.33.0's
scheduler conforms and decides as the `vllm-v1` twins, with prefix caching and without, each
drafter drafting; a vLLM that stopped padding a new decode to 1 + k tokens conforms too, and
only the twin tells.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
from hypothesis import settings

from integrations.vllm import MANIFEST, REAL_VLLM, REAL_VLLM_PREFIX
from integrations.vllm.adapter import RealVllmScheduler
from properties.ar.conformance import ar_conformance_machine
from properties.verify import run_machine
from reference.ar.prefix_cache import VLLM_V1_PREFIX
from reference.ar.vllm_v1 import VLLM_V1
from spec.ar.adapter import ArEventSink
from spec.ar.config import ArConfig
from spec.ar.events import ArEvent, ArScheduled
from spec.errors import SpecViolation
from spec.implementation import ArImplementation
from tests.engine_gate import require_engine
from tests.test_ar_mutants import HUNT
from tests.test_real_vllm_event_log_drafts import PADS_NOTHING
from tests.tier import depth

EXAMPLES = int(os.environ.get("SCHEDSPEC_VLLM_EXAMPLES", depth(40, 200)))

RUN = HUNT  # the reference suite's settings (derandomized, no shrinking)


@pytest.fixture(autouse=True)
def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


@pytest.mark.parametrize(
    ("implementation", "twin"),
    [(REAL_VLLM, VLLM_V1), (REAL_VLLM_PREFIX, VLLM_V1_PREFIX)],
    ids=["plain", "prefix"],
)
def test_real_vllm_drafts_conform_and_decide_as_the_twin(
    implementation: ArImplementation, twin: ArImplementation
) -> None:
    """Every example conforms and decides alike; the drafters the adapter builds (without
    prefix caching all three, with it ngram's) each schedule drafts."""
    drafted: Counter[str] = Counter()

    def counting(config: ArConfig, sink: ArEventSink) -> Any:
        drafter = "ngram"
        if config.num_drafting_slots:
            drafter = "draft_model"
        elif config.num_lookahead_tokens:
            drafter = "eagle"

        def sink_counting(event: ArEvent) -> None:
            if isinstance(event, ArScheduled) and event.drafts:
                drafted[drafter] += 1
            sink(event)

        return implementation.factory(config, sink_counting)

    machine = ar_conformance_machine(
        counting,
        profile=implementation.profile,
        twin=twin.factory,
        twin_policy=twin.profile.policy,
        drafts=True,
    )
    err, printed = run_machine(machine, settings(RUN, max_examples=EXAMPLES))
    assert err is None, printed
    caching = implementation is REAL_VLLM_PREFIX
    expected = {"ngram"} if caching else {"ngram", "eagle", "draft_model"}
    assert set(drafted) == expected, drafted


def _pads_nothing(config: ArConfig, sink: ArEventSink) -> Any:
    adapter = REAL_VLLM_PREFIX.factory(config, sink)
    assert isinstance(adapter, RealVllmScheduler)
    PADS_NOTHING.apply(adapter.sched)
    return adapter


def test_a_vllm_that_pads_nothing_is_caught_by_the_twin_alone() -> None:
    """Padding is vLLM's choice, which the spec allows and does not require: without the
    twin the seeded vLLM passes, with it the suite names `twin_decisions`."""
    common: dict[str, Any] = {"profile": REAL_VLLM_PREFIX.profile, "drafts": True}
    alone = ar_conformance_machine(_pads_nothing, **common)
    err, printed = run_machine(alone, settings(RUN, max_examples=EXAMPLES))
    assert err is None, printed
    twinned = ar_conformance_machine(
        _pads_nothing,
        twin=VLLM_V1_PREFIX.factory,
        twin_policy=VLLM_V1_PREFIX.profile.policy,
        **common,
    )
    err, printed = run_machine(twinned, settings(RUN, max_examples=1000))
    assert isinstance(err, SpecViolation), printed
    assert err.rule == "twin_decisions", str(err)
    assert "propose_drafts(" in printed or "schedules" in str(err), printed
