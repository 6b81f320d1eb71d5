"""`properties.shrink_order`: one seed shrinks to one program in every process.

Hypothesis orders one shrink pass by the values of span labels, and many labels hash objects
whose hash differs between processes (a rule's function, `None` on Python 3.11, a string). Two
runs of `verify --seed N` then shrank differently. Here the label values are chosen by hand
(elements whose `__hash__` we set) so that one process shows what two processes would: the
same programs under different label values.
"""

from __future__ import annotations

import contextlib
import unittest
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import shrinker as hypothesis_shrinker
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import properties.verify as verify_module
from properties.ar.conformance import ar_conformance_machine
from properties.conformance import conformance_machine
from properties.shrink_order import stable_shrink_order, supported
from properties.verify import forced_seed, run_machine, verify_settings
from reference.ar.vllm_v1 import VLLM_V1
from reference.dllm import REFERENCE_DLLM
from spec.adapter import EventSink
from spec.ar.adapter import ArEventSink
from spec.ar.config import ArConfig
from spec.config import DllmConfig

#: Pairs of hash values whose labels sort in different orders when written out.
LABEL_VALUES = ((1, 2), (2**40, 7), (12345, 99999), (3, 2**50))


class Key:
    """A sampled element whose hash (and so its `sampled_from` label) we choose."""

    def __init__(self, name: str, hashed: int) -> None:
        self.name = name
        self.hashed = hashed

    def __hash__(self) -> int:
        return self.hashed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and other.name == self.name

    def __repr__(self) -> str:
        return self.name


def keys(prefix: str, hashed: int) -> st.SearchStrategy[Key]:
    return st.sampled_from((Key(f"{prefix}0", hashed), Key(f"{prefix}1", hashed + 1)))


def size(tree: Any) -> int:
    return 1 if isinstance(tree, int) else 1 + sum(size(child) for child in tree[1:])


def leaves(tree: Any) -> list[int]:
    return [tree] if isinstance(tree, int) else [x for child in tree[1:] for x in leaves(child)]


def shrink_trees(a_hash: int, b_hash: int, order: Callable[[], Any]) -> list[str]:
    """Every tree tried, in order, while Hypothesis finds and shrinks a large tree with a
    large leaf sum: two recursive kinds of node, each labelled by its hand-set hash."""
    a, b = keys("a", a_hash), keys("b", b_hash)
    tree: st.SearchStrategy[Any] = st.deferred(
        lambda: st.one_of(st.integers(0, 3), st.tuples(a, tree, tree), st.tuples(b, tree))
    )
    tried: list[str] = []

    @settings(
        database=None,
        derandomize=True,
        max_examples=2000,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(tree)
    def big_and_heavy_is_absent(x: Any) -> None:
        tried.append(repr(x))
        assert not (size(x) >= 9 and sum(leaves(x)) >= 7)

    with order(), pytest.raises(AssertionError):
        big_and_heavy_is_absent()
    return tried


def test_this_hypothesis_orders_the_pass_through_the_replaced_property() -> None:
    """The property replaced is there; on a Hypothesis without it the context would change
    nothing, and this fails so that such a version is noticed."""
    assert supported()


def test_hypothesis_alone_shrinks_differently_when_only_label_values_differ() -> None:
    """The fault this module removes: the same generated programs, different label values,
    different programs tried while shrinking."""
    runs = [shrink_trees(a, b, contextlib.nullcontext) for a, b in LABEL_VALUES]
    assert len({tuple(r) for r in runs}) > 1, [len(r) for r in runs]


def test_inside_the_context_label_values_change_nothing() -> None:
    runs = [shrink_trees(a, b, stable_shrink_order) for a, b in LABEL_VALUES]
    assert len({tuple(r) for r in runs}) == 1, [r[-1] for r in runs]
    assert "a" in runs[0][-1]  # it did shrink a tree of nodes, not a bare leaf


def test_the_shrinkers_own_order_is_back_after_the_context_an_error_and_nesting() -> None:
    own = hypothesis_shrinker.Shrinker.__dict__["distinct_labels"]
    with stable_shrink_order():
        replaced = hypothesis_shrinker.Shrinker.__dict__["distinct_labels"]
        assert replaced is not own
        with stable_shrink_order():
            pass
        assert hypothesis_shrinker.Shrinker.__dict__["distinct_labels"] is replaced
    assert hypothesis_shrinker.Shrinker.__dict__["distinct_labels"] is own
    with pytest.raises(RuntimeError), stable_shrink_order():
        raise RuntimeError("inside")
    assert hypothesis_shrinker.Shrinker.__dict__["distinct_labels"] is own


def test_overlapping_contexts_keep_the_order_until_the_last_one_closes() -> None:
    """Two runs that overlap without nesting (threads): the one that opened first closes
    first, and the other still shrinks in the stable order; after both, the shrinker's own."""
    own = hypothesis_shrinker.Shrinker.__dict__["distinct_labels"]
    first, second = stable_shrink_order(), stable_shrink_order()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert hypothesis_shrinker.Shrinker.__dict__["distinct_labels"] is not own
    second.__exit__(None, None, None)
    assert hypothesis_shrinker.Shrinker.__dict__["distinct_labels"] is own


def counting_machine(a_hash: int, b_hash: int, tried: list[str]) -> type[RuleBasedStateMachine]:
    """A fresh machine class (fresh rule functions, so fresh rule labels, as in another
    process) that pushes trees of two labelled kinds and fails once they grow large and heavy
    together: nested spans of one label, as a burst of prompts makes in the conformance
    machines."""
    a, b = keys("a", a_hash), keys("b", b_hash)
    tree: st.SearchStrategy[Any] = st.deferred(
        lambda: st.one_of(st.integers(0, 3), st.tuples(a, tree, tree), st.tuples(b, tree))
    )

    class Growing(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.trees: list[Any] = []

        @rule(pushed=tree)
        def push(self, pushed: Any) -> None:
            self.trees.append(pushed)

        @rule()
        def pop(self) -> None:
            if self.trees:
                self.trees.pop()

        @invariant()
        def small_or_light(self) -> None:
            tried.append(repr(self.trees))
            total = sum(size(t) for t in self.trees)
            assert not (total >= 7 and sum(sum(leaves(t)) for t in self.trees) >= 5)

    return Growing


def machine_runs(order: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`run_machine` (what every `verify` campaign runs) with `order` as its shrink order,
    seeded, once per pair of label values: what each run printed and tried."""
    monkeypatch.setattr(verify_module, "stable_shrink_order", order)
    outcomes = []
    for a, b in LABEL_VALUES:
        tried: list[str] = []
        with forced_seed(11):
            err, printed = run_machine(
                counting_machine(a, b, tried), verify_settings(100, seed_derandomize=False)
            )
        assert isinstance(err, AssertionError), err
        outcomes.append(printed + "\n".join(tried))
    return outcomes


@contextlib.contextmanager
def hypothesis_order() -> Iterator[None]:
    yield


def test_a_seeded_machine_shrinks_alike_whatever_its_label_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert len(set(machine_runs(stable_shrink_order, monkeypatch))) == 1


def test_without_the_stable_order_the_same_seeded_machine_shrinks_differently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The teeth of the test above: `run_machine` without the module, same seed, label values
    alone differing."""
    assert len(set(machine_runs(hypothesis_order, monkeypatch))) > 1


def run_test_case(test_case: type[unittest.TestCase]) -> unittest.TestResult:
    test_case.settings = settings(  # type: ignore[attr-defined]
        max_examples=3, database=None, derandomize=True, deadline=None
    )
    result = unittest.TestResult()
    test_case().run(result)
    return result


@pytest.mark.parametrize("family", ["dllm", "ar"])
def test_a_conformance_machines_test_case_runs_in_the_stable_order(family: str) -> None:
    """What pytest runs (`Machine.TestCase`) shrinks alike in CI and on a developer's
    machine: every example, built inside the run, sees the stable order; after it, the
    shrinker's own is back. One class per machine, so settings assigned to it stick."""
    own = hypothesis_shrinker.Shrinker.__dict__["distinct_labels"]
    stable_during_run: list[bool] = []

    def dllm(config: DllmConfig, sink: EventSink) -> Any:
        stable_during_run.append(
            hypothesis_shrinker.Shrinker.__dict__["distinct_labels"] is not own
        )
        return REFERENCE_DLLM.factory(config, sink)

    def ar(config: ArConfig, sink: ArEventSink) -> Any:
        stable_during_run.append(
            hypothesis_shrinker.Shrinker.__dict__["distinct_labels"] is not own
        )
        return VLLM_V1.factory(config, sink)

    machine = conformance_machine(dllm) if family == "dllm" else ar_conformance_machine(ar)
    assert machine.TestCase is machine.TestCase
    result = run_test_case(machine.TestCase)
    assert result.wasSuccessful() and result.testsRun == 1, result.failures + result.errors
    assert stable_during_run and all(stable_during_run)
    assert hypothesis_shrinker.Shrinker.__dict__["distinct_labels"] is own
