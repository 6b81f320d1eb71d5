"""A known-fix trial's verdicts (`schedspec_cli.known_fixes.FixTrial`), engine aside: a pass
that admits otherwise by design is "probably" a known finding, unless the finding's witness saw
its mechanism act in the failing run; a witness's silence changes nothing; notes of a finding
no set names are said too; a set that breaks an accepted rule is said to stop there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from integrations.patches import KnownFix
from schedspec_cli.known_fixes import FixTrial


def _apply(names: Iterable[str]) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


FIX = KnownFix("kept-incoming", "refused requests stay incoming", frozenset({"x"}), _apply, True)
OTHER = KnownFix("reserve", "reserve future blocks", frozenset({"x"}), _apply, True)
NOTE = "PrefillAdder.add_dllm_staging_req took 'r0' without a row (extending it by 2 tokens)"


def _trial(**fields: object) -> FixTrial:
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
    trial = _trial()
    assert [line.split(":")[0] for line in trial.lines()] == ["PROBABLY A KNOWN FINDING"] * 2
    assert trial.identified_by() == ()


def test_a_seen_mechanism_names_the_finding_and_quotes_it() -> None:
    trial = _trial(witnessed=(("kept-incoming", (NOTE, "another")), ("reserve", ())))
    first, second = trial.lines()
    assert first.startswith("KNOWN FINDING, ITS MECHANISM SEEN: this program passes with the ")
    assert "deciding as before up to round 4, where it admits otherwise by design" in first
    assert f"the finding's fault: {NOTE} (and 1 more); without it" in first
    assert second.startswith("PROBABLY A KNOWN FINDING")  # its witness saw nothing
    assert trial.identified_by() == (("kept-incoming",),)
    assert trial.to_json()["witnessed"] == {"kept-incoming": [NOTE, "another"], "reserve": []}


def test_a_seen_mechanism_is_quoted_even_when_no_set_passes() -> None:
    trial = _trial(passes_with=(), on_purpose=(), witnessed=(("kept-incoming", (NOTE,)),))
    lines = trial.lines()
    assert lines[0].startswith("NO KNOWN FIX IDENTIFIES IT")
    assert lines[1] == (
        f"Run again as released, the program showed the fault of `kept-incoming`'s finding: "
        f"{NOTE}; but no set holding that fix passes it (that finding and another at once, or "
        "another alone)."
    )


def test_a_set_that_breaks_an_accepted_rule_stops_there() -> None:
    trial = _trial(passes_with=(), on_purpose=(), accepted_stops=((("reserve",), "progress"),))
    assert trial.lines()[-1] == (
        "With the engine fix `reserve` it breaks [progress], which this run accepts: it stops "
        "there, unchecked, so that says nothing of [x]."
    )
    assert trial.to_json()["accepted_stops"] == [{"fixes": ["reserve"], "rule": "progress"}]
