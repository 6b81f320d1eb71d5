"""Run the conformance suite on one implementation and summarise the outcome.

Used by `schedspec verify` and by other projects' CI (see docs/implementers.md). A failure keeps
the violated rule, the message (with the state) and the shrunk program Hypothesis printed.
`verify_implementation` takes a typed `spec.implementation.Implementation` of either family,
builds that family's conformance machine under the implementation's profile and runs it as a
campaign (`properties.campaign`): accepted deviations are reported, not failed, and with
`keep_going` every distinct violated rule is reported with its own counterexample.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

import hypothesis.core
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Flaky
from hypothesis.reporting import with_reporter
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test
from hypothesis.strategies import SearchStrategy

from properties.conformance import ParityPolicy, StepCounter, conformance_machine
from properties.conformance_base import CALLS_NOTE, NATIVE_NOTE
from properties.deadline import DEFAULT_CALL_TIMEOUT_S, CallDeadlineExceeded, call_timeout_set
from properties.decisions import DecisionTwin
from properties.shrink_order import stable_shrink_order
from spec.adapter import ImplementationFactory
from spec.ar.adapter import ArImplementationFactory
from spec.ar.profile import ArConfigSpace, ArPolicy
from spec.errors import SpecViolation
from spec.implementation import Family, Implementation
from spec.profile import AcceptedDeviation, DllmProfile

MachineBuilder = Callable[..., type[RuleBasedStateMachine]]


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed run: the rule it broke (or the exception's type name), the message and the
    program that shows it; `example`, the failing example as its harness can run it again
    (`SpecViolation.example`; None when the family keeps none), and `known_fixes`, what
    trying an engine's known fixes on it found (`schedspec verify`; None: not tried)."""

    rule: str
    message: str
    program: str  # the shrunk, copy-pasteable program
    example: object | None = field(default=None, compare=False, repr=False)
    known_fixes: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """`rule`, `message` and `program`, and `known_fixes` when they were tried."""
        out: dict[str, Any] = {"rule": self.rule, "message": self.message}
        out["program"] = self.program
        if self.known_fixes is not None:
            out["known_fixes"] = dict(self.known_fixes)
        return out


@dataclass(slots=True)
class VerifyResult:
    """The outcome of verifying one implementation: the examples and steps run, the wall-clock
    `seconds` they took, the failures, and the accepted deviations hit."""

    impl: str
    examples: int
    steps: int
    seconds: float
    failures: list[Failure] = field(default_factory=list)
    family: str = "dllm"
    profile: str = ""
    accepted: list[dict[str, Any]] = field(default_factory=list)
    stopped: str = ""
    twin: str = ""  # the decision twin every example was checked against ("" for none)
    # the settings it ran with, taken from the implementation's (`ArTwin.took`)
    twin_settings: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None  # the seed the programs were drawn from (None: derandomized)
    # golden mismatches agreed once float ties were taken the other way, and the first's account
    golden_ties: int = 0
    first_golden_tie: str = ""

    @property
    def passed(self) -> bool:
        """No failure (hits of accepted deviations do not count)."""
        return not self.failures

    @property
    def rules(self) -> list[str]:
        """The distinct rules violated, in the order found."""
        return [f.rule for f in self.failures]

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON object: every field, plus `passed` and `rules`; `seconds`
        rounded to milliseconds."""
        return {
            "passed": self.passed,
            "impl": self.impl,
            "family": self.family,
            "profile": self.profile,
            "examples": self.examples,
            "steps": self.steps,
            "seconds": round(self.seconds, 3),
            "rules": self.rules,
            "failures": [f.to_json() for f in self.failures],
            "accepted": self.accepted,
            "stopped": self.stopped,
            "twin": self.twin,
            "twin_settings": self.twin_settings,
            "seed": self.seed,
            "golden_ties": self.golden_ties,
            "first_golden_tie": self.first_golden_tie,
        }


@dataclass(frozen=True, slots=True)
class DllmTwin:
    """A dLLM decision twin: `replay` builds, from one run, a scheduler that denoises as that
    run did (`properties.decisions.DecisionTwin`); it is checked against the spec under
    `profile` (None: the implementation's own)."""

    name: str
    replay: DecisionTwin
    profile: DllmProfile | None = None
    family: ClassVar[Family] = Family.DLLM


@dataclass(frozen=True, slots=True)
class ArTwin:
    """An AR decision twin: another AR implementation (deterministic given the operations),
    checked against the spec under `policy` (None: the implementation's own policy, for a twin
    that declares none); `space`: the configurations it declares it runs; `took`: the
    scheduler settings it was rebuilt with, taken from what it is compared with (name, value;
    `schedspec_cli.twin_settings`)."""

    name: str
    factory: ArImplementationFactory
    policy: ArPolicy | None = None
    space: ArConfigSpace | None = None  # the configurations it declares (None: none declared)
    took: tuple[tuple[str, object], ...] = ()

    def described(self) -> str:
        """Its name, and the settings it took: `vllm-v1 (with cache_aware_window=3)`."""
        if not self.took:
            return self.name
        return f"{self.name} (with {', '.join(f'{n}={v!r}' for n, v in self.took)})"

    family: ClassVar[Family] = Family.AR


Twin: TypeAlias = DllmTwin | ArTwin


def verify_settings(examples: int, seed_derandomize: bool = True) -> settings:
    """`examples` programs, derandomized by default, no database, shrunk on failure. No explain
    phase: it re-runs the shrunk program under coverage to name the lines only failing runs
    reach, which are the checker's own (the rule that fired), not the implementation's, and it
    took three quarters of the time to a counterexample (15 of 21 s for a decision-twin failure).
    """
    return settings(
        max_examples=examples,
        phases=[p for p in Phase if p is not Phase.explain],
        deadline=None,
        derandomize=seed_derandomize,
        database=None,
        stateful_step_count=30,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )


@contextlib.contextmanager
def forced_seed(seed: int | None) -> Iterator[None]:
    """Inside, Hypothesis draws from a random generator seeded with `seed`, in a test whose
    settings are not derandomized (what pytest's `--hypothesis-seed` does; `global_force_seed`
    is the hook it sets). None changes nothing."""
    if seed is None:
        yield
        return
    core: Any = hypothesis.core  # `global_force_seed` is typed as always None
    saved = core.global_force_seed
    core.global_force_seed = seed
    try:
        yield
    finally:
        core.global_force_seed = saved


def run_machine(
    machine: type[RuleBasedStateMachine], run_settings: settings
) -> tuple[BaseException | None, str]:
    """Run a state machine test; return (exception or None, what Hypothesis reported). What
    the implementation prints goes where it would anyway, not into the report. It shrinks in
    an order that depends on the program only (`properties.shrink_order`), so a seed shrinks
    to the same counterexample in every process."""
    buf = io.StringIO()

    def reported(text: object) -> None:
        buf.write(f"{text}\n")

    try:
        with with_reporter(reported), stable_shrink_order():
            run_state_machine_as_test(machine, settings=run_settings)
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):
            raise
        return err, buf.getvalue()
    return None, buf.getvalue()


NONDETERMINISTIC = "nondeterministic"


def _first_violation(err: BaseException) -> SpecViolation | None:
    """The first `SpecViolation` inside `err` (itself, its group's members, its causes)."""
    seen: set[int] = set()
    pending: list[BaseException] = [err]
    while pending:
        e = pending.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, SpecViolation):
            return e
        if isinstance(e, BaseExceptionGroup):
            pending.extend(e.exceptions)
        pending.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return None


def _nondeterministic(err: Flaky) -> str:
    """What a Hypothesis `Flaky` says of the implementation, with the violation first seen."""
    first = _first_violation(err)
    seen = f"\nfirst seen as: {first}" if first is not None else ""
    return (
        "the implementation is not deterministic: Hypothesis replayed the same program and it "
        f"behaved differently ({type(err).__name__}: {str(err).splitlines()[0]}). Its decisions "
        "depend on something besides the calls it was given, such as object addresses, time "
        f"or a global random state, so no counterexample can be replayed.{seen}"
    )


def _note_rank(note: str) -> int:
    """Where a violation's note goes: Hypothesis's own first, the calls as made, the
    adapter's transcript last."""
    return 2 if note.startswith(NATIVE_NOTE) else 1 if note.startswith(CALLS_NOTE) else 0


def failure_from(err: BaseException, printed: str) -> Failure:
    """The failure `err` reports: the rule a `SpecViolation` names; `nondeterministic` when
    Hypothesis found the same program behaving differently on replay (a `Flaky`); a hang's
    rule; else the exception's type name."""
    if isinstance(err, Flaky):
        notes = "\n".join(getattr(err, "__notes__", []))
        program = "\n".join(line for line in (printed + "\n" + notes).splitlines() if line.strip())
        return Failure(rule=NONDETERMINISTIC, message=_nondeterministic(err), program=program)
    if isinstance(err, CallDeadlineExceeded):
        # Hypothesis did not shrink or print it: the program is the machine's own record
        program = f"# the calls of the example that hung (not shrunk)\n{err.program}"
        return Failure(rule=err.rule, message=str(err), program=program)
    # Hypothesis's program first, the machine's calls as made (`CALLS_NOTE`) after it, then
    # the adapter's transcript in its engine's own calls (`NATIVE_NOTE`)
    notes = "\n".join(sorted(getattr(err, "__notes__", []), key=_note_rank))
    program = "\n".join(
        line
        for line in (printed + "\n" + notes).splitlines()
        if line.strip() and not line.startswith("Traceback")
    )
    rule = getattr(err, "rule", None)
    if rule is None or not isinstance(err, SpecViolation):
        rule = type(err).__name__
    example = err.example if isinstance(err, SpecViolation) else None
    return Failure(rule=str(rule), message=str(err), program=program, example=example)


def verify_impl(
    name: str,
    factory: ImplementationFactory,
    examples: int,
    *,
    parity: ParityPolicy = "always",
    builder: MachineBuilder | None = None,
    progress: Callable[[int, int], None] | None = None,
    configs: SearchStrategy[Any] | None = None,
) -> VerifyResult:
    """Run `examples` generated programs of the conformance machine against `factory` (a dLLM
    factory unless `builder` says otherwise); stops at the first failure."""
    counter = StepCounter()
    counter.on_example = progress
    build = builder or conformance_machine
    kwargs: dict[str, Any] = {"counter": counter, "name": "Conformance"}
    if builder is None:
        kwargs["parity"] = parity
    if configs is not None:
        kwargs["configs"] = configs
    machine = build(factory, **_accepted_kwargs(build, kwargs))
    start = time.perf_counter()
    err, printed = run_machine(machine, verify_settings(examples))
    result = VerifyResult(name, counter.examples, counter.steps, time.perf_counter() - start)
    result.golden_ties, result.first_golden_tie = counter.golden_ties, counter.first_golden_tie
    if err is not None:
        result.failures.append(failure_from(err, printed))
    return result


def _accepted_kwargs(build: MachineBuilder, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments `build` takes (machines of either family, old or new signature)."""
    try:
        params = inspect.signature(build).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def machine_for(
    implementation: Implementation,
    *,
    parity: ParityPolicy = "always",
    configs: SearchStrategy[Any] | None = None,
    counter: StepCounter | None = None,
    name: str = "",
    twin: Twin | None = None,
    loras: bool = False,
    drafts: bool = False,
) -> type[RuleBasedStateMachine]:
    """The conformance machine of the implementation's family, under its profile; with `twin`
    (of the same family) every example ends with that decision twin (rule `twin_decisions`);
    with `loras` (AR) LoRA adapter slots and adapters are drawn too, where its space serves
    them; with `drafts` (AR) speculative decoding too (its adapter must replay a drafter)."""
    if twin is not None and twin.family is not implementation.family:
        raise ValueError(
            f"a {twin.family.value} twin ({twin.name}) for a {implementation.family.value} "
            "implementation"
        )
    kwargs: dict[str, Any] = {"profile": implementation.profile, "counter": counter}
    if configs is not None:
        kwargs["configs"] = configs
    build: MachineBuilder
    if implementation.family is Family.DLLM:
        build = conformance_machine
        kwargs["parity"] = parity
        kwargs["name"] = name or "Conformance"
        if isinstance(twin, DllmTwin):
            kwargs["twin"], kwargs["twin_profile"] = twin.replay, twin.profile
    else:
        from properties.ar.conformance import ar_conformance_machine

        build = ar_conformance_machine
        kwargs["name"] = name or "ArConformance"
        kwargs["loras"] = loras
        kwargs["drafts"] = drafts
        if isinstance(twin, ArTwin):
            policy = twin.policy if twin.policy is not None else implementation.profile.policy
            kwargs["twin"], kwargs["twin_policy"] = twin.factory, policy
    factory: Any = implementation.factory
    return build(factory, **_accepted_kwargs(build, kwargs))


def verify_implementation(
    name: str,
    implementation: Implementation,
    examples: int,
    *,
    parity: ParityPolicy = "always",
    configs: SearchStrategy[Any] | None = None,
    keep_going: bool = False,
    accepted: Iterable[tuple[AcceptedDeviation, str]] = (),
    progress: Callable[[int, int], None] | None = None,
    fatal: tuple[type[BaseException], ...] = (),
    profile: str = "",
    call_timeout: float | None = DEFAULT_CALL_TIMEOUT_S,
    twin: Twin | None = None,
    seed: int | None = None,
    loras: bool = False,
    drafts: bool = False,
) -> VerifyResult:
    """Check `implementation` (either family) with `examples` generated programs per run.

    The profile's accepted deviations are accepted from the start, with `accepted` (deviation,
    source) pairs added. `keep_going` runs on after a failure to report every distinct rule.
    An error of a type in `fatal` (e.g. a factory that returns no adapter) is re-raised.
    `call_timeout`: seconds each call into the implementation may take (None or 0: no limit);
    a call that takes longer is a `progress` failure and ends the run (`properties.deadline`).
    `twin` (of the implementation's family): every example ends by running its operations
    through this decision twin, which must decide exactly alike (rule `twin_decisions`).
    `seed`: draw the programs from this seed instead of the derandomized run's fixed one (the
    same seed draws the same programs). `loras` (AR): draw LoRA adapter slots and adapters
    too, where the implementation's space serves them. `drafts` (AR): draw speculative
    decoding too (the adapter must be a `spec.ar.ArDraftingAdapter`, else `CannotDrive`).
    """
    from properties.campaign import run_campaign

    counter = StepCounter()
    counter.on_example = progress
    machine = machine_for(
        implementation,
        parity=parity,
        configs=configs,
        counter=counter,
        twin=twin,
        loras=loras,
        drafts=drafts,
    )
    pairs = [(d, "profile") for d in implementation.profile.deviations] + list(accepted)
    start = time.perf_counter()
    run_settings = verify_settings(examples, seed_derandomize=seed is None)
    with call_timeout_set(call_timeout), forced_seed(seed):
        campaign = run_campaign(
            machine, run_settings, accepted=pairs, keep_going=keep_going, fatal=fatal
        )
    result = VerifyResult(
        name,
        counter.examples,
        counter.steps,
        time.perf_counter() - start,
        failures=campaign.failures,
        family=implementation.family.value,
        profile=profile,
        accepted=[a.to_json() for a in campaign.accepted],
        stopped=campaign.stopped,
        twin=twin.name if twin is not None else "",
        twin_settings=dict(twin.took) if isinstance(twin, ArTwin) else {},
        seed=seed,
        golden_ties=counter.golden_ties,
        first_golden_tie=counter.first_golden_tie,
    )
    return result


__all__ = [
    "NONDETERMINISTIC",
    "ArTwin",
    "DllmTwin",
    "Failure",
    "Twin",
    "VerifyResult",
    "failure_from",
    "forced_seed",
    "machine_for",
    "run_machine",
    "verify_impl",
    "verify_implementation",
    "verify_settings",
]
