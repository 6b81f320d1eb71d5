"""A known-fix trial's verdicts (`schedspec_cli.known_fixes`), engine aside: a pass that admits
otherwise by design is "probably" a known finding, and stays so when the finding's witness saw
its mechanism act (a lead, quoted, never a verdict: the mechanism acts in passing runs too); a
set that breaks an accepted rule is said to stop there, unless it hung."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from integrations.patches import KnownFix
from schedspec_cli.known_fixes import FixTrial, _trial
from spec.errors import SpecViolation


def _apply(names: Iterable[str]) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


FIX = KnownFix("kept-incoming", "refused requests stay incoming", frozenset({"x"}), _apply, True)
OTHER = KnownFix("reserve", "reserve future blocks", frozenset({"x"}), _apply, True)
NOTE = "PrefillAdder.add_dllm_staging_req took 'r0' without a row (extending it by 2 tokens)"


def _verdict(**fields: object) -> FixTrial:
    base: dict[str, object] = {
        "rule": "x",
        "tried": (FIX, OTHER),
        "replayed": True,
        "passes_with": (("kept-incoming",), ("reserve",)),
        "on_purpose": ((("kept-incoming",), 4), (("reserve",), 4)),
        "unit": "round",
        "stops": True,
    }
    return FixTrial(**(base | fields))  # type: ignore[arg-type]


def test_a_by_design_pass_is_probably_the_finding() -> None:
    trial = _verdict()
    assert [line.split(":")[0] for line in trial.lines()] == ["PROBABLY A KNOWN FINDING"] * 2
    assert trial.identified_by() == ()


def test_a_seen_mechanism_is_a_quoted_lead_never_a_verdict() -> None:
    """A review planted a bug of its own beside a mechanism that acts in passing runs too:
    naming the finding on it named the wrong cause. The verdicts stay "probably"."""
    trial = _verdict(witnessed=(("kept-incoming", (NOTE, "another")), ("reserve", ())))
    first, second, lead = trial.lines()
    assert first.startswith("PROBABLY A KNOWN FINDING") and "`kept-incoming`" in first
    assert second.startswith("PROBABLY A KNOWN FINDING") and "`reserve`" in second
    assert lead == (
        "A lead, not proof: run again with no fix, the program showed the mechanism of "
        f"`kept-incoming`'s finding acting: {NOTE} (and 1 more) (it acts in runs that pass too, "
        "so this does not tie it to the failure)."
    )
    assert trial.identified_by() == ()
    assert trial.to_json()["witnessed"] == {"kept-incoming": [NOTE, "another"], "reserve": []}


def test_a_seen_mechanism_does_not_lift_no_evidence() -> None:
    """A set admitting otherwise from round 0 has no evidence, whatever its witness saw."""
    trial = _verdict(
        passes_with=(("kept-incoming", "reserve"),),
        on_purpose=((("kept-incoming", "reserve"), 0),),
        witnessed=(("kept-incoming", (NOTE,)),),
    )
    assert trial.lines()[0].startswith("NO EVIDENCE EITHER WAY")
    assert trial.identified_by() == ()


def test_a_seen_mechanism_is_quoted_when_no_set_passes() -> None:
    trial = _verdict(passes_with=(), on_purpose=(), witnessed=(("kept-incoming", (NOTE,)),))
    lines = trial.lines()
    assert lines[0].startswith("NO KNOWN FIX IDENTIFIES IT")
    assert lines[1].startswith("A lead, not proof: run again with no fix, the program showed")


def test_a_set_that_breaks_an_accepted_rule_stops_there() -> None:
    trial = _verdict(passes_with=(), on_purpose=(), accepted_stops=((("reserve",), "progress"),))
    assert trial.lines()[0].endswith(
        "(a new finding, or several at once; 1 set stopped at a rule this run accepts, "
        "unchecked past it)."
    )
    assert trial.lines()[-1] == (
        "With the engine fix `reserve` it breaks [progress], which this run accepts: it stops "
        "there, unchecked, so that says nothing of [x]."
    )
    assert trial.to_json()["accepted_stops"] == [{"fixes": ["reserve"], "rule": "progress"}]


# ------------------------------------------------------- the trial itself, on a scripted example
_ON: list[tuple[str, ...]] = [()]


@contextlib.contextmanager
def _scripted(names: Iterable[str]) -> Iterator[None]:
    _ON[0] = tuple(names)
    try:
        yield
    finally:
        _ON[0] = ()


HANG = "the implementation did not return from run_round within 5 s"


class _Scripted:
    """An example whose run fails by `x` as released, hangs under fix `a` (a `progress`
    violation of the call deadline) and breaks `progress` plainly under `b`."""

    unit = "round"
    by_design_stops = True

    def run(self, factory: Any) -> tuple[SpecViolation | None, Sequence[Any]]:
        on = _ON[0]
        if not on:
            return SpecViolation("x", "released fails"), []
        if on == ("a",):
            return SpecViolation("progress", HANG), []
        if on == ("b",):
            return SpecViolation("progress", "idle round"), []
        return SpecViolation("x", "still"), []

    def first_other_decision(self, *args: Any, **kwargs: Any) -> int | None:
        return None


def test_a_hang_is_a_failure_even_where_progress_is_accepted() -> None:
    """The campaign treats a hang as a failure even with `progress` accepted (it cannot go
    on); so does the trial: a fix that hangs the engine is not a harmless accepted stop
    (found by a review)."""
    a = KnownFix("a", "fix a", frozenset({"x"}), _scripted, True)
    b = KnownFix("b", "fix b", frozenset({"x"}), _scripted, True)
    trial = _trial(_Scripted(), None, "x", (a, b), (a, b), frozenset({"progress"}))  # type: ignore[arg-type]
    assert trial.accepted_stops == ((("b",), "progress"),)
    assert trial.other == (("a", "progress"),)


def test_a_twin_of_another_policy_is_said_to_differ_by_design_and_nothing_is_tried() -> None:
    trial = FixTrial("twin_decisions", (), twin_differs="admission: fcfs, the implementation x")
    (line,) = trial.lines()
    assert line.startswith("NOT TRIED: the decision twin declares another policy than the")
    assert "(admission: fcfs, the implementation x)" in line and "by design" in line, line
    data = trial.to_json()
    assert data["twin_differs"] == "admission: fcfs, the implementation x"
    assert "known_rules" not in data and data["identified_by"] == [], data
