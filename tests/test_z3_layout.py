"""The Z3 layer reads like the spec it encodes: every spec rule's encoding is found by name in
one step (the rule index, also printed in docs/proofs.md), every event kind has one guards and
one effect function named as `SpecMachine`'s handler, the invariants are the spec's, no module
is longer than 500 lines, and nothing reads `SpecMachine` internals."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path

from properties.symbolic import invariants as sym_invariants
from properties.symbolic import lemmas as sym_lemmas
from properties.symbolic.encoding import Encoding
from properties.symbolic.events import EVENTS
from properties.symbolic.geometry import Geometry
from properties.symbolic.rules import NOT_ENCODED, markdown_table, rule_index
from spec.events import EVENT_TYPES
from spec.invariants import INVARIANTS
from spec.machine import SpecMachine
from spec.rules import RULES

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "properties" / "symbolic"


def test_every_rule_is_encoded_or_has_a_stated_reason() -> None:
    index = rule_index()
    for rule in RULES:
        assert (rule in index) != (rule in NOT_ENCODED), rule
        if rule in index:
            for where in index[rule]:
                path = where.split(":")[0]
                assert (PACKAGE / path).is_file(), f"{rule}: {where} does not exist"
    assert set(NOT_ENCODED) <= set(RULES)


def test_every_guard_is_labelled_with_a_spec_rule() -> None:
    enc = Encoding(Geometry(2, 4, 2, requests=2, rows=2, running=2))
    s, p = enc.state("s"), enc.params("p")
    for kind, guards in enc.guards(s, p).items():
        assert guards, f"{kind} has no guard"
        for g in guards:
            assert g.rule in RULES, f"{kind}: guard labelled {g.rule!r}, not a spec rule"


def test_docs_list_the_rule_index() -> None:
    docs = (ROOT / "docs" / "proofs.md").read_text()
    assert markdown_table() in docs, (
        "docs/proofs.md is out of date: paste the output of "
        "`python -m properties.symbolic.rules` into its rule table"
    )


def test_one_module_per_event_kind_named_as_the_spec_handler() -> None:
    assert list(EVENTS) == [t.kind for t in EVENT_TYPES]
    for kind, e in EVENTS.items():
        assert (PACKAGE / "events" / f"{kind}.py").is_file()
        assert e.guards.__module__ == e.effect.__module__ == f"properties.symbolic.events.{kind}"
        # RowAcquired is the one kind SpecMachine has no handler for (never enabled)
        assert hasattr(SpecMachine, f"_{kind}") or kind == "row_acquired", kind


def test_invariants_are_the_spec_invariants() -> None:
    assert list(sym_invariants.INVARIANTS) == list(INVARIANTS)


def test_every_formula_function_states_its_formula() -> None:
    functions: list[Callable[..., object]] = [
        f for e in EVENTS.values() for f in (e.guards, e.effect)
    ]
    functions += list(sym_invariants.INVARIANTS.values()) + list(sym_lemmas.LEMMAS.values())
    for fn in functions:
        doc = inspect.getdoc(fn)
        assert doc and len(doc) > 10, f"{fn.__module__}.{fn.__name__} has no formula docstring"


def test_no_module_is_over_500_lines() -> None:
    for path in PACKAGE.rglob("*.py"):
        lines = len(path.read_text().splitlines())
        assert lines <= 500, f"{path.relative_to(ROOT)} has {lines} lines"


def test_no_private_spec_machine_reads() -> None:
    private = re.compile(r"\._(requests|queue|round|rows|owner)\b")
    for path in PACKAGE.rglob("*.py"):
        hits = [ln for ln in path.read_text().splitlines() if private.search(ln)]
        assert not hits, f"{path.relative_to(ROOT)} reads SpecMachine internals: {hits}"
