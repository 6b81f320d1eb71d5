"""The AR conformance suite with speculative decoding (`ar_conformance_machine(...,
drafts=True)`): configurations with 0 to 3 drafts a step, and a rule by which a drafter
proposes drafts for a decoding request (`ArDraftingAdapter.propose_drafts`) and the model
accepts some. The reference `vllm-v1` twins conform and decide alike with themselves; each
seeded bug in their drafting (below) makes the suite fail, naming its rule, with a program
that shows the proposal."""

from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import given, settings

from properties.ar.conformance import ar_conformance_machine
from properties.ar.example import ArExample
from properties.ar.harness import ArPropose
from properties.ar.strategies import ar_configs_in
from properties.conformance_base import CALLS_NOTE
from properties.verify import failure_from, run_machine
from reference.ar.base import ArReq
from reference.ar.prefix_cache import VLLM_V1_PREFIX, PrefixCachingVllmV1
from reference.ar.vllm_v1 import VLLM_033, VLLM_V1, VllmV1Scheduler
from schedspec_cli.main import main
from spec.ar.adapter import ArEventSink, ArImplementationFactory, ArSchedulerAdapter
from spec.ar.config import ArConfig
from spec.ar.events import ArDraftsVerified
from spec.ar.profile import ArProfile
from spec.errors import SpecViolation
from spec.implementation import ArImplementation
from tests.test_ar_mutants import HUNT  # derandomized, up to 1,000 examples, no shrinking
from tests.tier import depth

EXAMPLES = int(os.environ.get("SCHEDSPEC_DRAFT_EXAMPLES", depth(60, 300)))


def test_the_suite_draws_drafts_only_where_asked() -> None:
    drawn: set[int] = set()
    space = VLLM_V1.profile.space

    @given(ar_configs_in(space, drafts=True))
    @settings(max_examples=60, derandomize=True, database=None)
    def draw(config: ArConfig) -> None:
        drawn.add(config.num_speculative_tokens)

    draw()
    assert drawn == {0, 1, 2, 3}, drawn

    @given(ar_configs_in(space))
    @settings(max_examples=30, derandomize=True, database=None)
    def unasked(config: ArConfig) -> None:
        assert config.num_speculative_tokens == 0

    unasked()


def _keyed_ahead(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    return PrefixCachingVllmV1(config, sink, dataclasses.replace(VLLM_033, hash_lookahead=1))


#: `vllm-v1-prefix` keying each cached block with the token after it, as vLLM does beside an
#: EAGLE drafter (`hash_lookahead_tokens`), declared so.
KEYED_AHEAD = ArImplementation(
    _keyed_ahead,
    ArProfile(
        space=VLLM_V1_PREFIX.profile.space,
        policy=dataclasses.replace(VLLM_V1_PREFIX.profile.policy, hash_lookahead_tokens=1),
    ),
    "vllm-v1-prefix with EAGLE's cache keys",
)


@pytest.mark.parametrize(
    "implementation",
    [VLLM_V1, VLLM_V1_PREFIX, KEYED_AHEAD],
    ids=["vllm-v1", "prefix", "prefix-keyed-ahead"],
)
def test_the_reference_twins_conform_with_drafts(implementation: ArImplementation) -> None:
    """Every example conforms, and a second reference run on its operations decides alike."""
    machine = ar_conformance_machine(
        implementation.factory,
        profile=implementation.profile,
        twin=implementation.factory,
        twin_policy=implementation.profile.policy,
        drafts=True,
    )
    err, printed = run_machine(machine, settings(HUNT, max_examples=EXAMPLES))
    assert err is None, printed


# ----------------------------------------------------------------------------- seeded bugs
class KeepsTheProposal(VllmV1Scheduler):
    """A schedule does not spend the proposal: the next step schedules the same drafts
    again, which nobody proposed."""

    def _emit_scheduled(self, req: ArReq, num_tokens: int, drafts: int = 0) -> None:
        kept = req.proposed
        super()._emit_scheduled(req, num_tokens, drafts)
        req.proposed = kept


class DraftsPastTheModelLength(VllmV1Scheduler):
    """Drafts are not cut at `max_model_len` less the token the step samples."""

    def _within_model_len(self, req: ArReq, n: int) -> int:
        return n


class AcceptsPastTheEnd(VllmV1Scheduler):
    """The verification takes every draft the model accepts, past the request's end."""

    def _verify(self, req: ArReq, drafts: int) -> int:
        accepted = min(req.accept, drafts)
        req.num_computed -= drafts - accepted
        req.num_output += accepted
        req.attained += accepted
        self.sink(ArDraftsVerified(req.rid, accepted))
        return accepted


class RollsBackEveryDraft(VllmV1Scheduler):
    """The verification rolls back the accepted drafts too (their KV is then computed again
    in the next step), while the log says they were accepted."""

    def _verify(self, req: ArReq, drafts: int) -> int:
        accepted = super()._verify(req, drafts)
        req.num_computed -= accepted
        return accepted


class PadsPastTheBudget(VllmV1Scheduler):
    """A new decode is padded to 1 + k tokens even where the budget cannot take them."""

    def _padded(self, req: ArReq, computed: int, n: int, budget: int) -> tuple[int, int] | None:
        return super()._padded(req, computed, n, 10**6)


class DraftsUncharged(PrefixCachingVllmV1):
    """The budget is charged a running request's tokens less its drafts."""

    def _emit_scheduled(self, req: ArReq, num_tokens: int, drafts: int = 0) -> None:
        super()._emit_scheduled(req, num_tokens, drafts)
        self._uncharged += drafts

    def _schedule_running(self, budget: int) -> int:
        self._uncharged = 0
        left = super()._schedule_running(budget)
        return left + self._uncharged


def _factory(cls: type[VllmV1Scheduler]) -> ArImplementationFactory:
    def make(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        return cls(config, sink, VLLM_033)

    return make


#: A seeded bug as `verify` takes it: `verify --impl tests.test_ar_draft_suite:KEEPS_THE_PROPOSAL
#: --drafts` fails `speculative_drafts`; without `--drafts` it passes.
KEEPS_THE_PROPOSAL = ArImplementation(
    _factory(KeepsTheProposal),
    VLLM_V1.profile,
    "seeded bug: vllm-v1 whose schedule does not spend the drafter's proposal",
)

#: name -> (class, the reference whose profile it runs under, the rules the suite may name:
#: drafts past the model's length need blocks past a request's most, so where the pool holds
#: no more than that, the request preempts itself and the step schedules nothing)
DRAFT_MUTANTS: dict[str, tuple[type[VllmV1Scheduler], ArImplementation, tuple[str, ...]]] = {
    "keeps_the_proposal": (KeepsTheProposal, VLLM_V1, ("speculative_drafts",)),
    "drafts_past_the_model_length": (
        DraftsPastTheModelLength,
        VLLM_V1,
        ("speculative_drafts", "progress"),
    ),
    "accepts_past_the_end": (AcceptsPastTheEnd, VLLM_V1, ("speculative_drafts",)),
    "rolls_back_every_draft": (RollsBackEveryDraft, VLLM_V1, ("snapshot_matches",)),
    "pads_past_the_budget": (PadsPastTheBudget, VLLM_V1, ("token_budget",)),
    "drafts_uncharged": (DraftsUncharged, VLLM_V1_PREFIX, ("token_budget",)),
}


@pytest.mark.parametrize("name", sorted(DRAFT_MUTANTS))
def test_the_suite_catches_a_seeded_drafting_bug(name: str) -> None:
    cls, implementation, rules = DRAFT_MUTANTS[name]
    machine = ar_conformance_machine(_factory(cls), profile=implementation.profile, drafts=True)
    err, printed = run_machine(machine, HUNT)
    assert err is not None, f"the suite with drafts did not catch {name!r}"
    assert isinstance(err, SpecViolation), f"{name}: not a SpecViolation:\n{err!r}"
    assert err.rule in rules, f"{name}: expected one of {rules}, got:\n{err}"
    failure = failure_from(err, printed)
    assert "state:" in failure.message
    assert "num_speculative_tokens=" in failure.program, failure.program
    calls = failure.program.split(CALLS_NOTE, 1)[1]
    if name != "pads_past_the_budget":  # padding needs no proposal
        assert "propose_drafts(" in calls, failure.program


def test_a_failing_example_with_proposals_replays_the_same_way() -> None:
    """The example a failure keeps (`SpecViolation.example`: its operations, proposals
    included) fails again the same way on the mutant, and passes on the reference, as a
    known fix's trial replays it."""
    cls, implementation, _ = DRAFT_MUTANTS["keeps_the_proposal"]
    machine = ar_conformance_machine(_factory(cls), profile=implementation.profile, drafts=True)
    err, _ = run_machine(machine, HUNT)
    assert isinstance(err, SpecViolation)
    example = err.example
    assert isinstance(example, ArExample)
    assert any(isinstance(op, ArPropose) for op in example.ops), example.ops
    again = example.replay(_factory(cls))
    assert again is not None and again.rule == err.rule
    assert example.replay(implementation.factory) is None


def test_verify_draws_drafts_on_request_and_refuses_what_cannot_draft(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`verify --drafts`: the reference passes (beside its twin too); the seeded bug fails
    `speculative_drafts` with it and passes without it; a dLLM target and an AR scheduler
    that replays no drafter are refused in one line (exit 2)."""

    def verify(*args: str) -> tuple[int, str, str]:
        code = main(["verify", *args])
        out, err = capsys.readouterr()
        return code, out, err

    assert verify("--impl", "vllm-v1", "--drafts", "--examples", "30")[0] == 0
    assert (
        verify(
            "--impl", "vllm-v1-prefix", "--drafts", "--twin", "vllm-v1-prefix", "--examples", "20"
        )[0]
        == 0
    )
    bug = "tests.test_ar_draft_suite:KEEPS_THE_PROPOSAL"
    code, out, _ = verify("--impl", bug, "--drafts", "--examples", "300")
    assert code == 1 and "speculative_drafts" in out, out
    assert verify("--impl", bug, "--examples", "30")[0] == 0
    for target in ("vidur-vllm", "engine"):
        code, out, err = verify("--impl", target, "--drafts", "--examples", "5")
        assert code == 2, (target, out, err)
        assert "drafts" in err and len(err.strip().splitlines()) == 1, err
