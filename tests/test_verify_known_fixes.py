"""`verify` names a failure that is a known finding: the failing example, kept by the AR harness
(`SpecViolation.example`), is run again as it is and then with each known fix whose finding
breaks the failure's rule, then under larger sets of the known fixes holding one of them; the
smallest sets under which it passes, deciding as before up to the failure, name the finding. A
new bug is said to be none of them, an example that does not fail again the same way claims
nothing, and a fix that passes only by deciding otherwise is no evidence.

The real-engine cases need Vidur installed (`schedspec install-engines vidur`)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from integrations.patches import FixDoesNotApply, KnownFix
from integrations.vidur import MANIFEST
from properties.ar.conformance import ar_conformance_machine
from properties.ar.example import ArExample
from properties.deadline import call_timeout_set
from properties.verify import Failure, failure_from, run_machine, verify_settings
from reference.ar.vllm_v1 import VLLM_V1
from schedspec_cli.known_fixes import try_known_fixes
from schedspec_cli.main import main
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig
from spec.ar.events import ArBlocksAllocated, ArEvent, ArScheduled, ArStepEnd
from spec.errors import SpecViolation
from tests.ar_mutants import AR_MUTANTS
from tests.engine_gate import require_engine
from tests.user_module import write_user_module

#: A FasterTransformer subclass with a bug of its own: a free leaves one block counted.
USER_MODULE = """
from vidur.scheduler.replica_scheduler.faster_transformer_replica_scheduler import (
    FasterTransformerReplicaScheduler,
)


class FtLeaksOnFree(FasterTransformerReplicaScheduler):
    def free(self, *request_ids):
        for request_id in request_ids:
            self._num_allocated_blocks -= self._allocation_map.pop(request_id) - 1
"""

MUTANT = AR_MUTANTS["budget_overflow"]  # schedules one token past the budget: `token_budget`


def _verify(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str, n: int
) -> tuple[int, str, dict[str, Any]]:
    out_json = tmp_path / "verify.json"
    args = ["verify", "--impl", impl, "--examples", str(n), "--keep-going"]
    code = main([*args, "--json", str(out_json), "--report", str(tmp_path / "report")])
    return code, capsys.readouterr().out, json.loads(out_json.read_text())


@pytest.fixture(scope="module")
def failure() -> Failure:
    """The seeded budget overflow's failure, as `verify` reports it."""
    machine = ar_conformance_machine(MUTANT.factory, configs=MUTANT.configs)
    err, printed = run_machine(machine, verify_settings(200))
    assert err is not None
    return failure_from(err, printed)


class Fixes:
    """Fake fixes of one fix set: applying names makes them active; `factory` builds the
    reference (which conforms) once every name in `cures` is active, else the mutant."""

    def __init__(self, cures: set[str], refused: frozenset[str] = frozenset()) -> None:
        self.active: set[str] = set()
        self.cures = cures
        self.refused = refused

    @contextlib.contextmanager
    def apply(self, names: Iterable[str]) -> Iterator[None]:
        wanted = set(names)
        if wanted & self.refused:
            raise FixDoesNotApply(f"vidur/x.py has no line 'if not requests:' ({wanted})")
        before = set(self.active)
        self.active |= wanted
        try:
            yield
        finally:
            self.active = before

    def fix(self, name: str, rules: Iterable[str] = ("token_budget",)) -> KnownFix:
        return KnownFix(name, f"fixes {name}", frozenset(rules), self.apply)

    def factory(self, config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        make: Callable[[ArConfig, ArEventSink], ArSchedulerAdapter] = (
            VLLM_V1.factory if self.cures <= self.active else MUTANT.factory
        )
        return make(config, sink)


def test_the_failing_example_is_kept_and_fails_again_the_same_way(failure: Failure) -> None:
    example = failure.example
    assert isinstance(example, ArExample) and example.ops
    again = example.replay(MUTANT.factory)
    assert again is not None and again.rule == failure.rule == "token_budget"
    assert set(failure.to_json()) == {"rule", "message", "program"}  # kept in memory only


def test_a_fix_under_which_the_example_passes_names_it(failure: Failure) -> None:
    fixes = Fixes({"cure"})
    trial = try_known_fixes(failure, fixes.factory, (fixes.fix("nothing"), fixes.fix("cure")))
    assert trial is not None and trial.replayed
    assert trial.passes_with == (("cure",),) and trial.other == ()
    text = "\n".join(trial.lines())
    assert "KNOWN FINDING: this program passes with the engine fix `cure` (fixes cure)" in text
    data = trial.to_json()
    assert data["tried"] == ["nothing", "cure"] and data["passes_with"] == [["cure"]]
    assert data["verdict"] == trial.lines()


def test_only_fixes_of_findings_that_break_the_rule_are_tried(failure: Failure) -> None:
    """A fix whose finding breaks another rule is no candidate, whatever it does: a new bug's
    failure is said to be no known finding."""
    fixes = Fixes({"cure"})
    trial = try_known_fixes(failure, fixes.factory, (fixes.fix("cure", ["kv_covers_scheduled"]),))
    assert trial is not None and trial.tried == () and trial.passes_with == ()
    assert trial.lines() == [
        "NO KNOWN FINDING BREAKS [token_budget]: the known ones break [kv_covers_scheduled]."
    ]


def test_a_fix_that_needs_another_findings_fix_is_named_with_it(failure: Failure) -> None:
    """A fix may pass the program only once another finding's fix is applied too: the
    smallest such set is named (a set holding no candidate is never tried)."""
    fixes = Fixes({"first", "second"})
    both = (fixes.fix("first", ["implementation_error"]), fixes.fix("second"))
    trial = try_known_fixes(failure, fixes.factory, both)
    assert trial is not None and trial.passes_with == (("first", "second"),)
    assert [fix.name for fix in trial.tried] == ["second"]
    lines = trial.lines()
    assert lines[0].startswith(
        "KNOWN FINDING: this program passes with the engine fixes `first` (fixes first) and "
        "`second` (fixes second) applied, deciding as before up to the failure; without them"
    ), lines
    assert trial.to_json()["passes_with"] == [["first", "second"]]
    alone = try_known_fixes(failure, fixes.factory, both[1:])
    assert alone is not None and alone.passes_with == ()
    assert alone.lines()[0].startswith("NO KNOWN FIX IDENTIFIES IT: under no set of the known")
    smallest = Fixes({"second"})
    three = (smallest.fix("first"), smallest.fix("second"), smallest.fix("third"))
    trial = try_known_fixes(failure, smallest.factory, three)
    assert trial is not None and trial.passes_with == (("second",),)  # no larger set


def test_passing_by_other_decisions_is_no_evidence() -> None:
    """The first step, among those that ended before the failure, decided otherwise: what is
    scheduled, preempted or allocated."""
    before: list[ArEvent] = [
        ArBlocksAllocated("r0", (0,)),
        ArScheduled("r0", 2),
        ArStepEnd(0),
        ArScheduled("r0", 1),
        ArStepEnd(1),
        ArScheduled("r0", 9),  # the failing step, never ended
    ]
    _first_other_step = ArExample.first_other_decision
    assert _first_other_step(before, before[:5]) is None
    more_blocks = [ArBlocksAllocated("r0", (0, 1)), *before[1:]]
    assert _first_other_step(before, more_blocks) == 0
    assert _first_other_step(before, [*before[:3], ArScheduled("r0", 2), ArStepEnd(1)]) == 1
    assert _first_other_step(before, before[:3]) == 1  # it ended sooner
    assert _first_other_step(before, more_blocks, by_design=True) is None  # by design


def test_a_fix_the_install_does_not_take_is_said_so(failure: Failure) -> None:
    fixes = Fixes({"cure"}, refused=frozenset({"f"}))
    trial = try_known_fixes(failure, fixes.factory, (fixes.fix("f"),))
    assert trial is not None and trial.unapplied[0][0] == "f"
    assert "The engine fix `f` could not be applied to the install: vidur/x.py" in "\n".join(
        trial.lines()
    )


def test_an_example_that_does_not_fail_again_claims_nothing(failure: Failure) -> None:
    fixes = Fixes({"cure"})
    trial = try_known_fixes(failure, VLLM_V1.factory, (fixes.fix("nothing"),))
    assert trial is not None and not trial.replayed and trial.passes_with == ()
    assert trial.lines()[0].startswith("KNOWN FIXES NOT TRIED (`nothing`)")
    assert "(it passed)" in trial.lines()[0]
    assert try_known_fixes(failure, VLLM_V1.factory, ()) is None
    kept_none = Failure("token_budget", "m", "p")
    assert try_known_fixes(kept_none, VLLM_V1.factory, (fixes.fix("nothing"),)) is None
    assert SpecViolation("r", "d").example is None


def test_a_fix_under_which_the_example_hangs_is_reported_not_raised(failure: Failure) -> None:
    """A fix whose run hangs is a `progress` failure of that fix, within the call deadline."""
    fixes = Fixes({"cure"})

    def factory(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        adapter = fixes.factory(config, sink)
        if "hang" in fixes.active:
            adapter.step = lambda: time.sleep(30)  # type: ignore[method-assign]
        return adapter

    with call_timeout_set(0.2):
        trial = try_known_fixes(failure, factory, (fixes.fix("hang"),))
    assert trial is not None and trial.other == (("hang", "progress"),), trial


def test_a_fix_under_which_building_hangs_is_reported_not_raised(failure: Failure) -> None:
    """Building the implementation under a fix runs under the call deadline too."""
    fixes = Fixes({"cure"})

    def factory(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        if "hang" in fixes.active:
            time.sleep(30)
        return fixes.factory(config, sink)

    with call_timeout_set(0.2):
        trial = try_known_fixes(failure, factory, (fixes.fix("hang"),))
    assert trial is not None and trial.other == (("hang", "progress"),), trial


def test_no_set_holding_a_fix_that_hung_is_tried(failure: Failure) -> None:
    """A replay that hangs costs a call deadline: the sets that hold its fix are skipped."""
    fixes = Fixes({"never"})
    hangs: list[int] = []

    def factory(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        adapter = fixes.factory(config, sink)
        if "hang" in fixes.active:
            hangs.append(1)
            adapter.step = lambda: time.sleep(30)  # type: ignore[method-assign]
        return adapter

    known = (fixes.fix("hang"), fixes.fix("other", ["implementation_error"]), fixes.fix("y"))
    with call_timeout_set(0.2):
        trial = try_known_fixes(failure, factory, known)
    assert trial is not None and trial.passes_with == ()
    assert len(hangs) == 1, hangs  # alone; never again in (hang, other), (hang, y), ...


def test_a_replay_whose_implementation_cannot_be_built_is_an_implementation_error(
    failure: Failure,
) -> None:
    example = failure.example
    assert isinstance(example, ArExample)

    def broken(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        raise AssertionError("reservation beyond max_tokens")

    found, events = example.run(broken)
    assert found is not None and found.rule == "implementation_error" and events == []
    assert "building the implementation raised AssertionError" in str(found)


def test_verify_names_vidurs_known_findings_by_their_fixes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """FasterTransformer as released: its two findings, each named by its fix (`--keep-going`
    reports both); the reservation fix is not tried on the leak (its finding breaks
    `kv_covers_scheduled`), and it passes the leak's program only by admitting fewer."""
    require_engine(MANIFEST, "vidur", "Vidur")
    code, out, data = _verify(capsys, tmp_path, "real-vidur-ft", 100)
    assert code == 1
    found = {f["rule"]: f["known_fixes"] for f in data["failures"]}
    assert found["kv_covers_scheduled"]["passes_with"] == [["reservation-ceil"]]
    assert found["terminal_holds_nothing"]["passes_with"] == [["ft-free-at-batch-end"]]
    assert found["terminal_holds_nothing"]["tried"] == ["ft-free-at-batch-end"]
    assert "KNOWN FINDING: this program passes with the engine fix `ft-free-at-batch-end`" in out
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Known fixes:\n\n- KNOWN FINDING: this program passes with the engine fix" in report


def test_verify_says_a_new_bug_is_no_known_finding(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FasterTransformer subclass that leaks on every free breaks a rule no known finding of
    FasterTransformer breaks."""
    require_engine(MANIFEST, "vidur", "Vidur")
    write_user_module(tmp_path, monkeypatch, "my_ft", USER_MODULE)
    monkeypatch.setenv("SCHEDSPEC_VIDUR_SCHEDULER_CLS", "my_ft.FtLeaksOnFree")
    code, out, data = _verify(capsys, tmp_path, "real-vidur-ft", 100)
    assert code == 1
    leak = [f for f in data["failures"] if f["rule"] == "snapshot_matches"]
    assert leak, [f["rule"] for f in data["failures"]]
    assert leak[0]["known_fixes"]["tried"] == [] and leak[0]["known_fixes"]["passes_with"] == []
    assert "NO KNOWN FINDING BREAKS [snapshot_matches]" in out
