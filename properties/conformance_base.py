"""`ConformanceBase`: the Hypothesis state machine both conformance machines share.

A conformance machine drives one implementation through a harness (`properties.replay.
ReplayHarness`: every event replayed into the family's spec machine as it is emitted) with
generated programs. Every family does the same around its own operations:

- **abort rules**: abort a live request (consumed from the `requests` bundle), abort again or
  late (a finished or aborted id must be refused cleanly), abort an unknown id;
- **duplicate ids**: every accepted request is submitted again, as it was, right after it was
  accepted and again when `abort_again_or_late` picks it (live or ended by then): it must be
  refused with `DuplicateRequest` and no event (`unique_submission`). These calls draw
  nothing, so the programs the suites draw are the ones they drew before the check;
- **drain** every third round or step, and at **teardown** (then the family's end-of-run checks,
  e.g. parity), counting steps and examples in a `StepCounter`;
- an **invariant** that every round/step the implementation ran was ended and checked;
- **implementation errors**: every harness operation runs through `ReplayHarness.guarded`, so an
  implementation that gives up with `SchedulerStalled` breaks `progress`, and any other
  unexpected exception (a real engine's `RuntimeError: Prefill out of memory`) is a violation of
  `implementation_error` naming the exception, shown with the program so far;
- **ignored rules** (campaigns and accepted deviations): a violation whose rule is in the class
  attribute `ignored_rules` makes the example invalid (`hypothesis.reject()`) instead of failing
  it, and is counted in the class attribute `ignored_hits` (rule -> count). The rest of that
  example is never run: the spec cannot follow an implementation past a rule it broke;

How a family subclasses it (the dLLM `properties.conformance.conformance_machine` is the worked
example; the AR machine follows the same pattern):

1. subclass `ConformanceBase[MyHarness]` inside a builder function, set `counter` (a
   `StepCounter`), `ignored_rules`, a fresh `ignored_hits = {}` and `order_rule` (the rule an
   unchecked round/step end breaks: "round_order" for dLLM, "step_order" for AR); the harness
   subclasses `properties.replay.ReplayHarness` (its `abort` and `drain` are what the shared
   rules call);
2. write an `@initialize` rule `configure` that sets `self.h` via
   `self.build(lambda: ..., f"configure(config={config!r})")`;
3. write the family's own rules (submit, round/step ...) whose bodies call harness operations
   through `self.run("what", operation, *args)`; new requests go to the `requests` bundle
   (`target=ConformanceBase.requests`, ids from `self.new_id()`): such a rule returns
   `str | MultipleResults[str]`, the id, or `multiple()` when the submit was refused;
4. implement `clock()` (rounds or steps the spec has seen end) and `ended()` (the round/step
   ends counted in the events), and optionally `teardown_checks()`.

A campaign subclasses the built class again with a growing `ignored_rules` (and its own
`ignored_hits`) to find every distinct violated rule.
"""

from __future__ import annotations

import functools
import unittest
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from hypothesis import reject, settings
from hypothesis.errors import HypothesisException
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from properties.deadline import CallDeadlineExceeded, call_deadline
from properties.profiles import hold_no_mined_constants
from properties.raised import describe_raised
from properties.replay import ReplayHarness
from properties.shrink_order import stable_shrink_order
from spec.errors import SchedSpecError, SpecViolation

H = TypeVar("H", bound=ReplayHarness[Any])
CALLS_NOTE = "# the example's calls as made (each request whole):"  # heads `_note_calls`' note
#: Heads the note of the adapter's own transcript (`native_calls`), after `CALLS_NOTE`'s.
NATIVE_NOTE = "# the same example as the engine's own calls (the adapter's transcript):"
T = TypeVar("T")


class StepCounter:
    """Counts rule executions across examples (for progress and the steps/s benchmark)."""

    def __init__(self) -> None:
        self.steps: int = 0
        self.examples: int = 0
        self.on_example: Callable[[int, int], None] | None = None
        # golden mismatches agreed past float ties (`spec.golden.explained_by_ties`), the first
        self.golden_ties: int = 0
        self.first_golden_tie: str = ""

    def golden_tie(self, said: str) -> None:
        """Count a golden mismatch the adapter's branch past float ties explained; keep the
        first's account (`Harness.on_golden_tie`)."""
        self.golden_ties += 1
        self.first_golden_tie = self.first_golden_tie or said


class _StableOrderTestCase:
    """`Machine.TestCase`, what pytest and unittest run: Hypothesis's test case for the machine,
    whose run shrinks in an order that depends on the program only (`properties.shrink_order`),
    so a failure shrinks to the same counterexample in CI and on a developer's machine. One
    class per machine, as Hypothesis's own: `Machine.TestCase.settings = ...` sticks."""

    def __get__(self, obj: object, owner: type[RuleBasedStateMachine] | None = None) -> Any:
        machine = owner if obj is None else type(obj)
        if machine is None or not issubclass(machine, RuleBasedStateMachine):
            raise AttributeError("TestCase is read from a state machine class or instance")
        return _stable_order_test_case(machine)


@functools.cache
def _stable_order_test_case(machine: type[RuleBasedStateMachine]) -> type[unittest.TestCase]:
    hypothesis_own: Any = RuleBasedStateMachine.__dict__["TestCase"].__get__(None, machine)

    class StableOrder(hypothesis_own):  # type: ignore[misc]
        def runTest(self) -> None:
            with stable_shrink_order():
                hypothesis_own.runTest(self)

        # what Hypothesis's own runTest carries, for its pytest plugin
        runTest.is_hypothesis_test = True  # type: ignore[attr-defined]
        runTest._hypothesis_state_machine_class = machine  # type: ignore[attr-defined]

    StableOrder.__name__ = hypothesis_own.__name__
    StableOrder.__qualname__ = hypothesis_own.__qualname__
    return StableOrder


class ConformanceBase(RuleBasedStateMachine, Generic[H]):
    """The shared rules and hooks; see the module docstring for how a family subclasses it."""

    TestCase = _StableOrderTestCase()

    ignored_rules: ClassVar[frozenset[str]] = frozenset()
    ignored_hits: ClassVar[dict[str, int]] = {}
    counter: ClassVar[StepCounter] = StepCounter()
    order_rule: ClassVar[str] = "round_order"  # broken when an ended round/step went unchecked
    note_calls: ClassVar[bool] = False  # add the calls as made to a violation (`_note_calls`)

    requests: Bundle[str] = Bundle("requests")  # ids of the requests submitted

    def __init__(self) -> None:
        super().__init__()
        self.h: H | None = None
        self.next_id: int = 0
        self.calls: list[str] = []  # this example's operations, for a hang's report
        # the requests accepted so far, by id: what `submit_again` submits again
        self.accepted: dict[str, Any] = {}
        self.hung: bool = False  # a call of this example did not return by its deadline
        # Under derandomized settings (the ci profile, however it was chosen: load_profile,
        # profile_settings, pytest's --hypothesis-profile) the example draws no constants mined
        # from loaded modules, so it replays alike whatever the process imported. Held from
        # here, before the example's first draw, to teardown, so other tests keep their draws.
        now = settings.default  # inside a Hypothesis test: the settings it runs under
        derandomized = now is not None and now.derandomize
        self._release_mining: Callable[[], None] | None = (
            hold_no_mined_constants() if derandomized else None
        )

    # ------------------------------------------------------------------ hooks
    def clock(self) -> int:
        """Rounds (dLLM) or steps (AR) the spec has seen end."""
        raise NotImplementedError

    def ended(self) -> int:
        """Round or step ends the implementation emitted (must equal `clock()`)."""
        raise NotImplementedError

    def teardown_checks(self) -> None:
        """Family checks after the final drain (for example output parity)."""

    def failing_example(self) -> object | None:
        """This example in a form its family can run again outside Hypothesis (attached to a
        violation as `SpecViolation.example`); None where the family keeps none."""
        return None

    # ------------------------------------------------------------------ helpers
    @property
    def harness(self) -> H:
        """The harness `configure` built; RuntimeError before it ran."""
        if self.h is None:  # pragma: no cover - configure always runs first
            raise RuntimeError("the machine has no harness before configure")
        return self.h

    def new_id(self) -> str:
        """A fresh request id for this example: `r0`, `r1`, ... in order."""
        rid = f"r{self.next_id}"
        self.next_id += 1
        return rid

    def _counted_ignored(self, violation: SpecViolation) -> bool:
        """Whether `violation`'s rule is ignored; counts the hit when it is."""
        if violation.rule not in self.ignored_rules:
            return False
        hits = type(self).ignored_hits
        hits[violation.rule] = hits.get(violation.rule, 0) + 1
        return True

    def _ignore(self, violation: SpecViolation) -> None:
        """Reject the example if `violation`'s rule is ignored (counting the hit)."""
        if self._counted_ignored(violation):
            reject()

    def program_so_far(self) -> str:
        """The operations this example ran, one per line, the last one unfinished."""
        return "\n".join(self.calls)

    def _note_calls(self, violation: SpecViolation) -> None:
        """With `note_calls`, add this example's calls, as made, to the violation (and, for any
        family, the adapter's own transcript, `_native_calls`): a family
        whose rules draw requests inside the rule (`st.data()`, as the AR machine does, its
        sizes depending on the drawn config) gets a program Hypothesis prints with
        `data=data(...)` and the draws apart; the note has each request whole."""
        if violation.example is None:
            violation.example = self.failing_example()
        if self.note_calls:
            violation.add_note(f"{CALLS_NOTE}\n{self.program_so_far()}")
        native = self._native_calls()  # any family: the engine's own calls, when kept
        if native:
            violation.add_note(f"{NATIVE_NOTE}\n{native}")

    def _native_calls(self) -> str | None:
        """The implementation's own record of this example in its engine's API, when its
        adapter keeps one: an optional method `native_calls() -> str` (the real vLLM adapter's
        lists the `Scheduler` calls it made, so a vLLM developer reads the example as vLLM's
        own tests write one). None without it, or when it fails (it must not hide the
        violation)."""
        native = getattr(getattr(self.h, "impl", None), "native_calls", None)
        if not callable(native):
            return None
        try:
            text = native()
        except Exception:  # a transcript is a courtesy: the violation is what is reported
            return None
        return text if isinstance(text, str) and text.strip() else None

    def _record(self, call: str, hang: CallDeadlineExceeded) -> CallDeadlineExceeded:
        """Attach this example's calls so far (or `call`, the first) to a hang, and remember
        it: the teardown must not call the implementation again (it would hang again, and its
        report would blame the teardown's drain instead of the call that hung)."""
        self.hung = True
        hang.program = self.program_so_far() or call
        hang.add_note(f"the calls of the example that hung:\n{hang.program}")  # for pytest
        return hang

    def construct(self, call: str, make: Callable[[], T]) -> T:
        """Run `make` (building the implementation, outside any harness operation) under the
        call deadline; a hang carries this example's calls (`call` when there are none)."""
        try:
            with call_deadline("building the implementation"):
                return make()
        except CallDeadlineExceeded as hang:
            raise self._record(call, hang) from None
        except (SchedSpecError, HypothesisException):
            raise  # typed refusals (a config outside the profile, not an adapter) and assume()
        except (Exception, SystemExit) as err:  # the factory's own bug, sys.exit() included
            raise SpecViolation(
                "implementation_error",
                f"building the implementation raised {describe_raised(err)}",
            ) from err

    def build(self, make: Callable[[], H], call: str = "configure()") -> None:
        """Build the harness (in `configure`; `call` describes it, e.g. with the config); a
        violation while building counts like any."""
        self.calls.append(call)
        try:
            self.h = self.construct(call, make)
        except SpecViolation as v:
            self._ignore(v)
            raise

    def run(self, what: str, operation: Callable[..., T], *args: Any) -> T:
        """Run one harness operation, counting the step and applying `ignored_rules`."""
        self.counter.steps += 1
        result = self._call(what, operation, args)
        if what == "submit" and result is None:  # accepted (a refusal returns its error)
            self.accepted[args[0].request_id] = args[0]
            self.submit_again(args[0].request_id)
        return result

    def _call(
        self, what: str, operation: Callable[..., T], args: tuple[Any, ...], note: str = ""
    ) -> T:
        """One harness operation, recorded in `calls` (with `note`) and applying
        `ignored_rules`; a hang carries this example's calls."""
        call = f"{what}({', '.join(map(repr, args))}){note}"
        self.calls.append(call)
        try:
            return self.harness.guarded(what, operation, *args)
        except SpecViolation as v:
            self._ignore(v)
            self._note_calls(v)
            raise
        except CallDeadlineExceeded as hang:
            raise self._record(call, hang) from None

    def submit_again(self, request_id: str) -> None:
        """Submit the accepted request `request_id` again, exactly as it was: ids are unique
        for the implementation's lifetime, so it must be refused with `DuplicateRequest` and no
        event (`unique_submission`; the harness's `_checked_submit`). Called inside rules, it
        draws nothing and is no step of the program (`counter.steps` is not moved); the calls
        as made mark it as the suite's own check."""
        request = self.accepted[request_id]
        mark = "  # the same id again: must be refused (DuplicateRequest)"
        self._call("submit", self.harness.submit, (request,), mark)

    # ------------------------------------------------------------------ shared rules
    @rule(request=consumes(requests))
    def abort(self, request: str) -> None:
        """Abort a submitted request (taken out of `requests`) through the harness: an active
        one must end aborted, an ended one must be refused cleanly."""
        self.run("abort", self.harness.abort, request)

    @rule(request=requests)
    def abort_again_or_late(self, request: str) -> None:
        """Aborting a finished or already aborted request must be refused cleanly; submitting
        it again then (ended, or aborted by this call) must be refused (`submit_again`)."""
        self.run("abort", self.harness.abort, request)
        self.submit_again(request)

    @rule()
    def abort_unknown(self) -> None:
        """Abort an id never submitted: it must be refused with `UnknownRequest`
        (`known_request` otherwise)."""
        err = self.run("abort", self.harness.abort, "no-such-request")
        if err is None:
            raise self.harness._violate(
                "known_request", "abort of an unknown id must raise UnknownRequest"
            )

    @precondition(lambda self: self.h is not None and self.clock() % 3 == 2)
    @rule()
    def drain(self) -> None:
        """Drain the implementation through the harness (when `clock() % 3 == 2`)."""
        self.run("drain", self.harness.drain)

    @invariant()
    def ends_are_checked(self) -> None:
        """Every round/step end the implementation emitted was checked by the spec: `ended()`
        equals `clock()`, else `order_rule` is broken."""
        if self.h is not None and self.ended() != self.clock():
            raise self.harness._violate(
                self.order_rule,
                f"the implementation ended {self.ended()} rounds but the spec checked "
                f"{self.clock()}",
            )

    def teardown(self) -> None:
        """Unless configure never ran, a violation was already raised or a call hung: the
        final drain and `teardown_checks()` (an ignored rule's violation is counted, not
        raised), then the example is counted and `counter.on_example` told. Always: the
        example's hold on the mining of constants is released (`__init__`)."""
        try:
            self._teardown()
        finally:
            if self._release_mining is not None:
                self._release_mining()

    def _teardown(self) -> None:
        # Hypothesis runs teardown after a failing step too: do not mask that failure.
        if self.h is None or self.h.violation is not None or self.hung:
            return
        try:  # the final drain is not a generated step: not counted
            self.calls.append("drain()  # teardown")
            self.harness.guarded("drain", self.harness.drain)
            self.calls.append("parity and end-of-run checks  # teardown")
            self.teardown_checks()
        except CallDeadlineExceeded as hang:
            raise self._record("teardown", hang) from None
        except SpecViolation as v:
            # Counted, not rejected: teardown may run once Hypothesis has frozen the
            # example's data, and rejecting then is an internal error ("Frozen").
            if self._counted_ignored(v):
                return
            self._note_calls(v)
            raise
        self.counter.examples += 1
        if self.counter.on_example is not None:
            self.counter.on_example(self.counter.examples, self.counter.steps)


__all__ = ["CALLS_NOTE", "NATIVE_NOTE", "ConformanceBase", "StepCounter"]
