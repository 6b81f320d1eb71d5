"""`verify` names a failure that is a known finding: the failing example, kept by the AR harness
(`SpecViolation.example`), is run again as it is and then with each of the engine's known fixes
applied alone; a fix under which it passes names the finding. A new bug is said to be none of
them, and an example that does not fail again the same way claims nothing.

The real-engine cases need Vidur installed (`schedspec install-engines vidur`)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from integrations.patches import FixDoesNotApply, KnownFix
from integrations.vidur import MANIFEST
from properties.ar.conformance import ar_conformance_machine
from properties.ar.example import ArExample
from properties.verify import Failure, failure_from, run_machine, verify_settings
from schedspec_cli.known_fixes import try_known_fixes
from schedspec_cli.main import main
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


def _verify(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, impl: str, n: int
) -> tuple[int, str, dict[str, Any]]:
    out_json = tmp_path / "verify.json"
    code = main(
        ["verify", "--impl", impl, "--examples", str(n), "--keep-going", "--json", str(out_json)]
    )
    return code, capsys.readouterr().out, json.loads(out_json.read_text())


def _mutant_failure(name: str) -> Failure:
    mutant = AR_MUTANTS[name]
    machine = ar_conformance_machine(mutant.factory, configs=mutant.configs, profile=mutant.profile)
    err, printed = run_machine(machine, verify_settings(200))
    assert err is not None, name
    return failure_from(err, printed)


def test_the_failing_example_is_kept_and_fails_again_the_same_way() -> None:
    """The example attached to a violation replays outside Hypothesis to the same rule."""
    failure = _mutant_failure("budget_overflow")
    example = failure.example
    assert isinstance(example, ArExample) and example.ops
    again = example.replay(AR_MUTANTS["budget_overflow"].factory)
    assert again is not None and again.rule == failure.rule == "token_budget"
    assert set(failure.to_json()) == {"rule", "message", "program"}  # kept in memory only


def test_a_fix_under_which_the_example_passes_names_it() -> None:
    """With the seeded bug's own class swapped for the reference inside the 'fix', the example
    passes; a fix that changes nothing leaves it failing; one that breaks another rule is
    named with that rule."""
    mutant = AR_MUTANTS["budget_overflow"]
    failure = _mutant_failure("budget_overflow")
    cured = {"on": False}

    @contextlib.contextmanager
    def curing() -> Any:
        cured["on"] = True
        try:
            yield
        finally:
            cured["on"] = False

    def factory(config: Any, sink: Any) -> Any:
        if cured["on"]:
            from reference.ar.vllm_v1 import VLLM_V1

            return VLLM_V1.factory(config, sink)
        return mutant.factory(config, sink)

    fixes = (
        KnownFix("nothing", "changes nothing", contextlib.nullcontext),
        KnownFix("cure", "runs the reference", curing),
    )
    trial = try_known_fixes(failure, factory, fixes)
    assert trial is not None and trial.replayed
    assert trial.passes_with == ("cure",) and trial.other == ()
    text = "\n".join(trial.lines("token_budget"))
    assert "KNOWN FINDING: this program passes with the engine fix `cure` applied" in text
    assert trial.to_json() == {
        "tried": ["nothing", "cure"],
        "replayed": True,
        "passes_with": ["cure"],
        "passes_otherwise": {},
        "other": {},
        "unapplied": {},
    }


def test_a_fix_the_install_does_not_take_is_said_so() -> None:
    """A patched install lacks the place a fix edits: the fix is reported unapplied, not a
    traceback."""
    failure = _mutant_failure("budget_overflow")

    @contextlib.contextmanager
    def refused() -> Any:
        raise FixDoesNotApply("vidur/x.py has no line 'if not requests:' (needs the fix f)")
        yield

    trial = try_known_fixes(
        failure, AR_MUTANTS["budget_overflow"].factory, (KnownFix("f", "a fix", refused),)
    )
    assert trial is not None and trial.unapplied == (
        ("f", "vidur/x.py has no line 'if not requests:' (needs the fix f)"),
    )
    assert "The engine fix `f` could not be applied to the install: vidur/x.py" in "\n".join(
        trial.lines("token_budget")
    )


def test_an_example_that_does_not_fail_again_claims_nothing() -> None:
    failure = _mutant_failure("budget_overflow")
    from reference.ar.vllm_v1 import VLLM_V1

    fixes = (KnownFix("nothing", "changes nothing", contextlib.nullcontext),)
    trial = try_known_fixes(failure, VLLM_V1.factory, fixes)
    assert trial is not None and not trial.replayed and trial.passes_with == ()
    assert "KNOWN FIXES NOT TRIED (`nothing`)" in trial.lines("token_budget")[0]
    assert "(it passed)" in trial.lines("token_budget")[0]
    assert try_known_fixes(failure, VLLM_V1.factory, ()) is None
    kept_none = Failure("token_budget", "m", "p")
    assert try_known_fixes(kept_none, VLLM_V1.factory, fixes) is None
    assert isinstance(SpecViolation("r", "d").example, type(None))


def test_verify_names_vidurs_known_findings_by_their_fixes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """FasterTransformer as released: its two findings, each named by the fix under which the
    failing program passes (`--keep-going` reports both)."""
    require_engine(MANIFEST, "vidur", "Vidur")
    code, out, data = _verify(capsys, tmp_path, "real-vidur-ft", 100)
    assert code == 1
    found = {f["rule"]: f["known_fixes"] for f in data["failures"]}
    assert found["kv_covers_scheduled"]["passes_with"] == ["reservation-ceil"]
    assert found["terminal_holds_nothing"]["passes_with"] == ["ft-free-at-batch-end"]
    # the reservation fix admits fewer requests at once: the leak's program passes with it
    # too, by other decisions, which is no evidence of that finding
    assert set(found["terminal_holds_nothing"]["passes_otherwise"]) <= {"reservation-ceil"}
    for trial in found.values():
        assert trial["replayed"] and trial["tried"] == ["ft-free-at-batch-end", "reservation-ceil"]
    assert "KNOWN FINDING: this program passes with the engine fix `ft-free-at-batch-end`" in out


def test_verify_says_a_new_bug_is_no_known_finding(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FasterTransformer subclass that leaks on every free: Vidur's own fixes do not remove
    its failure."""
    require_engine(MANIFEST, "vidur", "Vidur")
    write_user_module(tmp_path, monkeypatch, "my_ft", USER_MODULE)
    monkeypatch.setenv("SCHEDSPEC_VIDUR_SCHEDULER_CLS", "my_ft.FtLeaksOnFree")
    code, out, data = _verify(capsys, tmp_path, "real-vidur-ft", 100)
    assert code == 1
    leak = [f for f in data["failures"] if f["rule"] == "snapshot_matches"]
    assert leak, [f["rule"] for f in data["failures"]]
    assert leak[0]["known_fixes"]["replayed"] and leak[0]["known_fixes"]["passes_with"] == []
    assert "NO KNOWN FIX IDENTIFIES IT: with none of `ft-free-at-batch-end`" in out
