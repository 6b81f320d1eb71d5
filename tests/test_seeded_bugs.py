"""The seeded bugs that ship in the wheel (`reference.seeded_bugs`, `reference.ar.seeded_bugs`)
are caught by `verify` as their catalogue says: exit 1, the declared rule named, under the
command's default configurations and the README tour's example count. Each is the reference
scheduler with one bug planted, and the unplanted reference passes the same command (its own
tests), so a pass here would mean the suite lost the power to see that bug."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Protocol

import pytest

import reference.ar.seeded_bugs as ar_seeded
import reference.seeded_bugs as seeded
import tests.ar_mutants
import tests.mutants
from reference.ar.seeded_bugs import AR_SEEDED_BUGS
from reference.seeded_bugs import SEEDED_BUGS, SeededBug
from schedspec_cli.main import main
from tests.ar_mutants import AR_MUTANTS
from tests.mutants import MUTANTS
from tests.tier import full_tier


class Catalogued(Protocol):
    """What both catalogues' entries have."""

    @property
    def rule(self) -> str: ...
    @property
    def factory(self) -> Callable[..., object]: ...


#: The bugs whose catch takes 5-10 s through `verify` (more examples before it): per push the
#: mutant hunts of tests/test_mutants.py and tests/test_ar_mutants.py catch the same classes,
#: so their command-line runs are full tier (tests/tier.py).
SLOW = {
    "reference.seeded_bugs:abort_leaks_retained_block",
    "reference.ar.seeded_bugs:preempts_head",
    "reference.ar.seeded_bugs:skips_to_head",
}


@pytest.mark.parametrize(
    "bug",
    [
        pytest.param(bug, id=bug.target, marks=[full_tier] if bug.target in SLOW else [])
        for bug in SEEDED_BUGS + AR_SEEDED_BUGS
    ],
)
def test_verify_catches_each_shipped_seeded_bug_under_its_rule(
    bug: SeededBug, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "verify.json"
    argv = ["verify", "--impl", bug.target, "--examples", "100", "--json", str(report)]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert f"[{bug.rule}]" in out, out[-3000:]
    assert bug.rule in json.loads(report.read_text(encoding="utf-8"))["rules"]


@pytest.mark.parametrize(
    ("bugs", "module", "catalogue"),
    [(SEEDED_BUGS, seeded, MUTANTS), (AR_SEEDED_BUGS, ar_seeded, AR_MUTANTS)],
    ids=["dllm", "ar"],
)
def test_the_catalogue_checks_the_shipped_classes_under_the_same_rules(
    bugs: tuple[SeededBug, ...], module: ModuleType, catalogue: Mapping[str, Catalogued]
) -> None:
    """The checkout's full catalogue runs the very classes the wheel ships (not copies), and
    expects the rules the shipped listing declares."""
    for bug in bugs:
        name = bug.target.rsplit(":", 1)[1]
        assert catalogue[name].rule == bug.rule, name
        cls = "".join(part.capitalize() for part in name.split("_"))
        assert catalogue[name].factory.__name__ == f"make_{cls}", name
        assert getattr(catalogues[module.__name__], cls) is getattr(module, cls), cls


catalogues = {seeded.__name__: tests.mutants, ar_seeded.__name__: tests.ar_mutants}
