"""`admission_progress` on vLLM 0.33.0's live log under chunked prefill: vLLM's waiting pass
admits a chunk of a prompt longer than the budget left (`num_new_tokens = min(num_new_tokens,
request_token_budget)`) and stops (`break`) at one only with chunked prefill off. A vLLM whose
pass stops there with chunked prefill on (seeded bug `whole_prompts_only`, an edit of
`Scheduler.schedule`) fails the rule, naming the chunk that fit, where the rule asked only
for requests that fit whole before; released vLLM conforms on the same programs.

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from integrations.vllm import MANIFEST
from integrations.vllm.engine_core import EngineCoreLoop, core_program
from integrations.vllm.event_log import VllmEventLog
from properties.ar.trace_check import check_ar_trace
from spec.ar.rules import ArRule
from tests.engine_gate import require_engine
from tests.vllm_seeded_bugs import whole_prompts_only

#: `core_program` seeds on which the seeded pass leaves a request waiting whose chunk fits
#: (15 of the first 200 are; the others stall it for good, `progress`, are stopped by the
#: loop, or never offer a seat beside a budget too short for the prompt).
SEEDS = (11, 13, 14, 45, 59)


@pytest.fixture(autouse=True)
def _vllm() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def live_log(seed: int, bug: Callable[[Any], None] | None = None) -> list[str]:
    """The live log of the engine-core loop serving `core_program(seed)`, `bug` planted in
    the scheduler before the log is attached (the log's wrapper then calls the bug's
    `schedule`); a run the loop stops keeps the lines written until then."""
    program = core_program(seed)
    lines: list[str] = []

    def attach(scheduler: Any) -> None:
        if bug is not None:
            bug(scheduler)
        VllmEventLog(scheduler, lines.append)

    try:
        EngineCoreLoop(program.config, async_scheduling=False, mutate=attach).run(program)
    except Exception:
        if bug is None:
            raise
    return lines


@pytest.mark.parametrize("seed", SEEDS)
def test_a_pass_that_admits_prompts_only_whole_is_caught(seed: int) -> None:
    assert core_program(seed).config.enable_chunked_prefill
    released = check_ar_trace(live_log(seed))
    assert released.ok, released.violation
    seeded = check_ar_trace(live_log(seed, whole_prompts_only))
    assert seeded.violation is not None and seeded.violation.rule is ArRule.ADMISSION_PROGRESS
    said = str(seeded.violation)
    assert "though a chunk of it fits (chunked prefill): a seat free" in said, said
