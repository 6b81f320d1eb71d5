"""The conformance suites submit every accepted request again under its id
(`ConformanceBase.submit_again`): right after it is accepted, and when `abort_again_or_late`
picks it. The calls draw nothing and are no steps of the program: the step count and the
programs drawn are what they were before the check, and the calls as made mark each one as
the suite's own. (The seeded bugs `accepts_ended_ids`, in tests/mutants.py and
tests/ar_mutants.py, show the check has teeth.)"""

from __future__ import annotations

from typing import Any

from properties.conformance import conformance_machine
from reference.dllm import make_scheduler
from spec.config import DllmConfig, Mode

CONFIG = DllmConfig(
    block_size=2, page_size=2, kv_pages=8, req_pool_rows=2, max_running_requests=2, mode=Mode.FDFO
)
MARK = "  # the same id again: must be refused (DuplicateRequest)"


def test_a_submit_is_one_step_and_its_repeat_is_marked_in_the_calls() -> None:
    # driven by hand, rule by rule (the built class is typed as Hypothesis's base)
    machine_class: Any = conformance_machine(make_scheduler)
    machine = machine_class()
    machine.configure(config=CONFIG)
    before = machine_class.counter.steps
    rid = machine.submit(prompt=(1, 2), max_new_tokens=2, ignore_eos=False, stop_token_ids=())
    assert rid == "r0"
    assert machine_class.counter.steps - before == 1
    first, again = machine.calls[-2:]
    assert first.startswith("submit(RequestSpec(request_id='r0'") and not first.endswith(MARK)
    assert again == first + MARK
    machine.round()
    machine.abort_again_or_late("r0")  # the abort, then the id again
    assert machine.calls[-2].startswith("abort('r0')") and machine.calls[-1] == first + MARK
    assert machine_class.counter.steps - before == 3  # submit, round, abort
    machine.teardown()
