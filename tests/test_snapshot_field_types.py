"""A snapshot whose fields are of the wrong container type is named as such, in one line.

An engine's adapter that built `Snapshot(free_slots=sorted(...), running=list(...))` was
reported as `[implementation_error] ... TypeError: unsupported operand type(s) for -: 'list'
and 'frozenset' (at spec/machine.py:129 in _set_difference)`, which blames the checker's own
line. Now `check_snapshot` checks each field's container type (not its elements) before
comparing, for both families: `snapshot() returned free_slots as list, not frozenset`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from properties.ar.conformance import ar_conformance_machine
from properties.conformance import conformance_machine
from reference.ar.vidur import make_vidur_orca
from reference.dllm import ReferenceDllmScheduler
from spec import DllmConfig, EventSink, Snapshot
from spec.adapter import ImplementationFactory
from spec.ar.adapter import ArEventSink, ArImplementationFactory, ArSchedulerAdapter
from spec.ar.config import ArConfig
from spec.ar.snapshot import AR_SNAPSHOT_FIELDS, ArSnapshot
from spec.errors import SpecViolation
from spec.snapshot import SNAPSHOT_FIELDS

FEW = settings(
    max_examples=5, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)


def violation_of(machine: type[RuleBasedStateMachine]) -> SpecViolation:
    """The violation the machine's run ends with (it must end with one)."""
    with pytest.raises(SpecViolation) as caught:
        run_state_machine_as_test(machine, settings=FEW)
    return caught.value


# ------------------------------------------------------------------ dLLM
class ListsInItsSnapshot(ReferenceDllmScheduler):
    """The reference, reporting its free slots and running set as lists (the reviewer's)."""

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        return dataclasses.replace(
            snap,
            free_slots=sorted(snap.free_slots),  # type: ignore[arg-type]
            running=list(snap.running),  # type: ignore[arg-type]
        )


class ListOfCarriers(ReferenceDllmScheduler):
    """Every other field right: the carriers as a list."""

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        return dataclasses.replace(snap, carrying=list(snap.carrying))  # type: ignore[arg-type]


class PlainSets(ReferenceDllmScheduler):
    """Sets and a dict's key view where frozensets are declared: they compare alike, accepted."""

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        return dataclasses.replace(
            snap,
            free_slots=set(snap.free_slots),  # type: ignore[arg-type]
            running=dict.fromkeys(snap.running).keys(),  # type: ignore[arg-type]
        )


def dllm(cls: type[ReferenceDllmScheduler]) -> ImplementationFactory:
    def factory(config: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
        return cls(config, sink)

    return cast(ImplementationFactory, factory)


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (ListsInItsSnapshot, "snapshot() returned free_slots as list, not frozenset"),
        (ListOfCarriers, "snapshot() returned carrying as list, not frozenset"),
    ],
)
def test_a_dllm_snapshot_of_lists_is_named_by_field_and_type(
    cls: type[ReferenceDllmScheduler], message: str
) -> None:
    v = violation_of(conformance_machine(dllm(cls)))
    assert v.rule == "snapshot_matches", str(v)
    assert str(v).splitlines()[0] == f"[snapshot_matches] {message}"
    assert "TypeError" not in str(v)


def test_any_set_is_accepted_where_a_frozenset_is_declared() -> None:
    run_state_machine_as_test(conformance_machine(dllm(PlainSets)), settings=FEW)


# ------------------------------------------------------------------ AR
class ArWrapped:
    """An AR adapter whose snapshot is rewritten by `change` (every other call passed on)."""

    def __init__(self, inner: ArSchedulerAdapter, change: Callable[[ArSnapshot], ArSnapshot]):
        self.inner = inner
        self.change = change

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def snapshot(self) -> ArSnapshot:
        return self.change(self.inner.snapshot())


def ar(change: Callable[[ArSnapshot], ArSnapshot]) -> ArImplementationFactory:
    def factory(config: ArConfig, sink: ArEventSink) -> ArWrapped:
        return ArWrapped(make_vidur_orca(config, sink), change)

    return cast(ArImplementationFactory, factory)  # an adapter by delegation


def test_an_ar_snapshot_of_lists_is_named_by_field_and_type() -> None:
    def lists(s: ArSnapshot) -> ArSnapshot:
        return dataclasses.replace(s, free_blocks=sorted(s.free_blocks))  # type: ignore[arg-type]

    v = violation_of(ar_conformance_machine(ar(lists)))
    assert v.rule == "snapshot_matches", str(v)
    assert "snapshot() returned free_blocks as list, not frozenset" in str(v).splitlines()[0]


def test_an_unordered_ar_queue_is_refused_and_a_list_accepted() -> None:
    """`running` is a tuple in running order: a set has none (refused); a list keeps one."""

    def a_set(s: ArSnapshot) -> ArSnapshot:
        return dataclasses.replace(s, running=set(s.running))  # type: ignore[arg-type]

    def a_list(s: ArSnapshot) -> ArSnapshot:
        return dataclasses.replace(s, waiting=list(s.waiting))  # type: ignore[arg-type]

    v = violation_of(ar_conformance_machine(ar(a_set)))
    assert "snapshot() returned running as set, not tuple" in str(v).splitlines()[0]
    run_state_machine_as_test(ar_conformance_machine(ar(a_list)), settings=FEW)


def test_an_optional_field_names_none_as_allowed() -> None:
    def cached_list(s: ArSnapshot) -> ArSnapshot:
        return dataclasses.replace(s, cached_blocks=[])  # type: ignore[arg-type]

    v = violation_of(ar_conformance_machine(ar(cached_list)))
    assert "snapshot() returned cached_blocks as list, not frozenset or None" in str(v)


@pytest.mark.parametrize(
    ("cls", "known"), [(Snapshot, SNAPSHOT_FIELDS), (ArSnapshot, AR_SNAPSHOT_FIELDS)]
)
def test_every_snapshot_field_has_its_container_type_checked(
    cls: type[object], known: dict[str, tuple[str, bool]]
) -> None:
    """A field added later with a type the check does not know would go unchecked."""
    assert set(known) == {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
