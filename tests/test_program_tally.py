"""`integrations.vllm.program_tally.ProgramTally`, without vLLM: what the engine-core check
scripts report for programs that pass, fail in one loop or fail in both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import pytest

from integrations.vllm.core_loop import EngineCoreViolation, run_both, run_named
from integrations.vllm.program_tally import ProgramTally


@dataclass(frozen=True)
class _Run:
    steps: int


def _loop(fails_in: frozenset[str], steps: int) -> Callable[[bool], _Run]:
    """`run(async_scheduling)` for a program that breaks `rule_x` in the loops named."""

    def run(async_scheduling: bool) -> _Run:
        mode = "async" if async_scheduling else "sync"
        if mode in fails_in:
            raise EngineCoreViolation("rule_x", f"{mode} detail")
        return _Run(steps)

    return run


def _named(run: Callable[[bool], _Run], async_scheduling: bool) -> _Run:
    return run_named(async_scheduling, run)


def test_check_each_records_each_loop_and_counts_only_programs_passing_both() -> None:
    tally = ProgramTally(("steps",))
    for seed, fails_in in enumerate([set(), {"sync"}, {"async"}, {"sync", "async"}, set()]):
        run = _loop(frozenset(fails_in), steps=10 + seed)
        tally.check_each(seed, partial(_named, run))
    assert tally.programs == 5
    assert tally.passed == 2  # seeds 0 and 4: a program failing both loops counts once
    assert tally.failures == {"rule_x, sync loop": [1, 3], "rule_x, async loop": [2, 3]}
    assert tally.first["rule_x, async loop"] == "async loop: async detail"
    assert tally.totals["sync"]["steps"] == tally.totals["async"]["steps"] == 10 + 14
    lines = tally.report({"steps": "steps"}, 10)
    assert "FAIL [rule_x, sync loop] 2 programs, first seeds [1, 3]: sync loop: sync detail" in (
        lines
    )
    fields = tally.json_fields()
    assert fields["failures"] == {
        "rule_x, sync loop": {"seeds": [1, 3], "first": "sync loop: sync detail"},
        "rule_x, async loop": {"seeds": [2, 3], "first": "async loop: async detail"},
    }


def test_check_stops_at_the_first_loop_that_fails() -> None:
    """`check` (both loops through `run_both`): a program failing the synchronous loop is
    recorded once, under its rule, whatever the asynchronous loop would do."""
    tally = ProgramTally(("steps",))
    for seed, fails_in in enumerate([{"sync", "async"}, {"async"}, set()]):
        run = _loop(frozenset(fails_in), steps=7)
        tally.check(seed, partial(run_both, run))
    assert tally.failures == {"rule_x": [0, 1]}
    assert tally.first["rule_x"] == "sync loop: sync detail"
    assert tally.passed == 1
    assert tally.totals["async"]["steps"] == 7


def test_run_named_names_the_loop() -> None:
    with pytest.raises(EngineCoreViolation) as caught:
        run_named(True, _loop(frozenset({"async"}), 1))
    assert str(caught.value) == "[rule_x] async loop: async detail"


def test_check_each_records_a_refused_configuration_apart() -> None:
    """A program whose configuration vLLM refuses (`ConfigError`) is neither passed nor
    failed: its seed and the first refusal are reported, and in the JSON."""
    from spec.errors import ConfigError

    def refused(async_scheduling: bool) -> _Run:
        raise ConfigError("num_blocks", 2, ">= 3 (vLLM's start-up)")

    tally = ProgramTally(("steps",))
    tally.check_each(0, _loop(frozenset(), steps=5))
    tally.check_each(1, refused)
    assert tally.programs == 2 and tally.passed == 1 and tally.failures == {}
    assert tally.refused == [1]
    assert tally.report({"steps": "steps"}, 10)[-1].startswith(
        "refused by vLLM: 1 programs, first seeds [1]: invalid num_blocks=2"
    )
    assert tally.json_fields()["refused"] == [1]
    assert tally.totals["sync"]["steps"] == 5
