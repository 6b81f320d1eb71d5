"""The conformance harness: drive one implementation and hold it to the spec.

Every event the implementation emits is replayed into a `SpecMachine` as it happens (so a
violation is raised at the faulty event, with the implementation's stack still live), the named
state invariants are checked after each event, the implementation's own snapshot is compared
with the abstract state after every round, abort and drain, and so are the outputs and finish
reasons it reports (`collect_outputs`, when the adapter has it), and every finished request's
output and finish reason against the request decoded alone (`golden_output`, when the adapter
has it: `spec.golden.GoldenDecoder`).

The harness records every operation it was asked for (`ops`, `properties.operations`), the
failing one included, so a failing example can be run again (`properties.example`).

The harness holds the implementation to its profile: the configuration must lie inside the
declared space (`ConfigOutsideProfile` otherwise) and the spec machine takes the declared policy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from properties.adapter_check import require_adapter
from properties.operations import Abort, Drain, Op, Round, Submit
from properties.replay import ReplayHarness
from spec.adapter import ImplementationFactory, SchedulerAdapter
from spec.batch_numerics import batch_numerics_note
from spec.config import DllmConfig, RequestSpec, validate_request
from spec.errors import (
    ConfigError,
    RequestError,
    SpecViolation,
    UnknownRequest,
)
from spec.events import ControlReturned, Event, Finished, FinishReason, Submitted
from spec.golden import (
    GoldenDecoder,
    explained_by_ties,
    golden_mismatch,
    golden_tie_note,
    sampled_stop_mismatch,
    tie_agreement_note,
)
from spec.lifecycles import RequestPhase
from spec.machine import SpecMachine, finished_output, stop_output_lengths
from spec.parity import compare_outputs
from spec.profile import DllmProfile
from spec.snapshot import FinishedOutput, wrong_output
from spec.state import RequestState

_DEFAULT_PROFILE = DllmProfile()


def _request_spec(r: RequestState) -> RequestSpec:
    """The request as it was submitted, flags included."""
    return RequestSpec(
        r.request_id,
        r.prompt,
        r.max_new_tokens,
        stop_sampled=r.stop_sampled,
        ignore_eos=r.ignore_eos,
        stop_token_ids=r.stop_token_ids,
    )


def load_factory(target: str) -> ImplementationFactory:
    """Resolve 'package.module:callable' to an implementation factory."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError("impl", target, "a built-in name or 'package.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            "impl", target, f"module {module_name!r} cannot be imported: {err}"
        ) from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError("impl", target, f"{module_name} has no callable {attr!r}")
    return factory  # type: ignore[no-any-return]


@dataclass
class Harness(ReplayHarness[SpecMachine]):
    """One implementation under test, built by `factory` for `config`."""

    factory: ImplementationFactory
    config: DllmConfig
    check_invariants: bool = True
    events: list[Event] = field(default_factory=list)
    profile: DllmProfile = _DEFAULT_PROFILE
    check_golden: bool = True  # off: skip `golden_output` even when the adapter has it
    ops: list[Op] = field(default_factory=list)  # every operation asked for, in order
    # told of each golden mismatch agreed past float ties, in one line (verify counts them)
    on_golden_tie: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self.profile.space.check(self.config)
        self.spec: SpecMachine = SpecMachine(self.config, self.profile.policy)
        self.rounds: int = 0
        self.violation: SpecViolation | None = None  # the first one raised, if any
        impl: Any = self.factory(self.config, self._sink)
        require_adapter(impl, SchedulerAdapter, self.factory)
        self.impl: SchedulerAdapter = impl
        self.golden: GoldenDecoder | None = (
            impl if self.check_golden and isinstance(impl, GoldenDecoder) else None
        )
        self._golden_cursor = 0  # events before this index were checked against golden

    def _validate(self, request: RequestSpec) -> None:
        validate_request(self.config, request)

    # ------------------------------------------------------------------ operations
    def submit(self, request: RequestSpec) -> RequestError | None:
        """Submit; return the typed error if the implementation rejected the request.

        A rejection must leave no event and change nothing; a valid request must be accepted,
        and its `Submitted` event must carry it as given (`_require_submitted_as_given`).
        """
        self.ops.append(Submit(request))
        before = len(self.events)
        err = self._checked_submit(request, self.impl.submit)
        if err is None:
            self._require_submitted_as_given(request, self.events[before:])
        return err

    def _require_submitted_as_given(self, request: RequestSpec, events: list[Event]) -> None:
        """The `Submitted` event of an accepted request holds its prompt, max_new_tokens,
        `ignore_eos`, `priority` and `stop_token_ids` (in any order) as given, and claims
        `stop_sampled` only for a request that has it (an implementation cannot stop on what it
        was never given)."""
        submitted = [e for e in events if isinstance(e, Submitted)]
        if len(submitted) != 1:
            raise self._violate(
                "valid_request",
                f"accepted {request.request_id!r} with {len(submitted)} Submitted events "
                f"(one per accepted request)",
            )
        # stop token ids are a set: an engine may log them in its own order
        as_given = replace(request, stop_token_ids=tuple(sorted(request.stop_token_ids)))
        got = submitted[0]
        event = replace(
            got, prompt=tuple(got.prompt), stop_token_ids=tuple(sorted(got.stop_token_ids))
        )
        # stop_sampled may be dropped: the request then never stops on what the spec cannot see
        if event not in (
            as_given.submitted(),
            replace(as_given, stop_sampled=False).submitted(),
        ):
            raise self._violate(
                "valid_request",
                f"{request.request_id!r} was submitted as {request!r}; its Submitted event "
                f"must carry it as given",
                event,
                self.spec.render(),
            )

    def abort(self, request_id: str) -> UnknownRequest | None:
        """Abort `request_id`; return the `UnknownRequest` if the implementation refused it.

        A queued, admitted or running request must end aborted (`known_request` otherwise); any
        other id must be refused with no event. The snapshot is checked after a successful abort.
        """
        self.ops.append(Abort(request_id))
        phase = self.spec.request_phase(request_id)
        return self._checked_abort(
            request_id,
            self.impl.abort,
            active=phase in (RequestPhase.QUEUED, RequestPhase.ADMITTED, RequestPhase.RUNNING),
            aborted=lambda: self.spec.request_phase(request_id) is RequestPhase.ABORTED,
        )

    def round(self) -> None:
        """Run one round; it must end (`ControlReturned`, else `round_order`), then the snapshot,
        the reported outputs and the golden outputs of the requests it finished are checked."""
        self.ops.append(Round())
        expected = self.spec.round_index
        self.impl.run_round()
        self._require_round_ended(expected)
        self.rounds += 1
        self._check_snapshot()
        self._check_outputs()
        self._check_golden()

    def _require_round_ended(self, index: int) -> None:
        if self.spec.round_index <= index:
            raise self._violate(
                "round_order",
                f"run_round returned without ending round {index} (no ControlReturned)",
            )

    def drain(self, max_rounds: int = 10_000) -> None:
        """Drain the implementation (`max_rounds` passed on); then the spec must be idle
        (`progress`), snapshot, outputs and golden outputs must match, and no KV slot or row may
        still be held (`no_leak`)."""
        self.ops.append(Drain())
        before = self.spec.round_index
        self.impl.drain(max_rounds)
        self.rounds += self.spec.round_index - before
        if not self.spec.is_idle():
            raise self._violate(
                "progress", "drain returned while requests are still queued or running"
            )
        self._check_snapshot()
        self._check_outputs()
        self._check_golden()
        snap = self.impl.snapshot()
        if snap.leaked_slots() or snap.held_rows():
            raise self._violate(
                "no_leak",
                f"after drain {snap.leaked_slots()} KV slots and {snap.held_rows()} rows are "
                f"still in use",
            )

    def _check_outputs(self) -> None:
        """Compare the outputs the implementation reports (if it reports any) with the spec."""
        collect = getattr(self.impl, "collect_outputs", None)
        if collect is None:
            return
        try:
            self.spec.check_outputs(collect())
        except SpecViolation as v:
            self.violation = self.violation or v
            raise

    def _check_golden(self) -> None:
        """Every request finished since the previous check against its golden output."""
        start, self._golden_cursor = self._golden_cursor, len(self.events)
        if self.golden is None:
            return
        finished = [e for e in self.events[start:] if isinstance(e, Finished)]
        if not finished:
            return
        requests = self.spec.state().requests
        for event in finished:
            r = requests[event.request_id]
            request = _request_spec(r)
            actual = FinishedOutput(finished_output(self.config, r, event.reason), event.reason)
            golden = self.golden.golden_output(request)
            wrong = wrong_output(golden, f"golden_output(request {request.request_id!r}) returned")
            if wrong is not None:  # not reported as our own AttributeError in golden_mismatch
                raise self._violate("golden_output", wrong)
            if event.reason is FinishReason.STOP and r.stop_sampled:  # cut somewhere in its block
                lengths = stop_output_lengths(self.config, r)
                problem = sampled_stop_mismatch(request, actual, lengths, golden)
                followed = False  # its cut is the engine's: no tie is followed past it
            else:
                problem = golden_mismatch(request, actual, golden)
                followed = problem is not None
                if followed and self._past_ties(request, actual):
                    problem = None  # a correct decoding: a near-tie broken the other way
            if problem is not None:
                problem += golden_tie_note(self.golden, request, actual, golden, followed)
                problem += batch_numerics_note(self.impl, self.config)
                raise self._violate(
                    "golden_output",
                    f"{problem} (mode={self.config.mode.value}, batch up to "
                    f"{self.config.max_running_requests}, block_size={self.config.block_size}; "
                    "golden: the request decoded alone, unbatched and unpaged)",
                )

    def _past_ties(self, request: RequestSpec, actual: FinishedOutput) -> bool:
        """`actual` is the output of the golden decoding with near-ties taken the other way
        (`spec.golden.explained_by_ties`; an ill-formed answer breaks `golden_output`)."""
        try:
            branch = explained_by_ties(self.golden, request, actual)
        except SpecViolation as wrong:
            raise self._violate("golden_output", wrong.detail) from None
        if branch is not None and self.on_golden_tie is not None:
            self.on_golden_tie(f"{request.request_id!r} {tie_agreement_note(branch)}")
        return branch is not None

    def outputs(self) -> dict[str, tuple[int, ...]]:
        """The spec's output of every finished request, by id (`SpecMachine.outputs`)."""
        return self.spec.outputs()

    def requests(self) -> dict[str, RequestSpec]:
        """Every request the spec has seen submitted, by id, as its `Submitted` event gave it."""
        st = self.spec.state()
        return {rid: _request_spec(r) for rid, r in st.requests.items()}

    def ended_rounds(self) -> int:
        """Rounds the implementation ended: the `ControlReturned` events it emitted."""
        return sum(1 for e in self.events if isinstance(e, ControlReturned))


SoloCache = dict[tuple[object, ...], tuple[int, ...]]


def solo_output(
    factory: ImplementationFactory,
    config: DllmConfig,
    request: RequestSpec,
    cache: SoloCache | None = None,
) -> tuple[int, ...]:
    """The request's output when run alone under sync at batch size 1 (checked by the spec).
    `cache` is keyed by the implementation, the configuration and the whole request: its id
    (an engine's tokens may follow it) and everything that decides where it ends (`ignore_eos`,
    `stop_token_ids`, `stop_sampled`)."""
    solo = config.solo_sync()
    key = (id(factory), solo, request)
    if cache is not None and key in cache:
        return cache[key]
    # solo sync lies in every space; golden is checked on the run under test, not here
    h = Harness(factory, solo, check_invariants=False, check_golden=False)
    h.submit(request)
    h.drain()
    out = h.outputs()[request.request_id]
    if cache is not None:
        cache[key] = out
    return out


def check_parity(
    harness: Harness, cache: SoloCache | None = None, only: Callable[[str], bool] | None = None
) -> None:
    """Raise SpecViolation('fdfo_sync_parity') unless every finished request's output equals its
    solo sync output."""
    finished = harness.outputs()
    specs = harness.requests()
    expected = {
        rid: solo_output(harness.factory, harness.config, specs[rid], cache)
        for rid in finished
        if only is None or only(rid)
    }
    actual = {rid: out for rid, out in finished.items() if rid in expected}
    mismatches = compare_outputs(expected, actual)
    if mismatches:
        raise harness._violate(
            "fdfo_sync_parity",
            "; ".join(m.describe() for m in mismatches)
            + f" (mode={harness.config.mode.value}, batch up to "
            f"{harness.config.max_running_requests}, reference: solo sync at batch size 1)"
            + batch_numerics_note(harness.impl, harness.config),
        )
