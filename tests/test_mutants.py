"""The suite has teeth: every seeded bug in tests/mutants.py makes the conformance suite FAIL,
naming the right rule and printing a readable, shrunk program."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings

from properties.conformance import conformance_machine
from properties.verify import failure_from, run_machine
from spec.invariants import INVARIANTS
from tests.mutants import MUTANTS
from tests.tier import full_tier

# The hunt finds each bug without shrinking (shrinking costs ~20x the search and is what CI time
# would go to); `test_counterexamples_are_shrunk` checks shrinking on representative mutants.
# max_examples is headroom, not cost (a hunt stops at its catch): unseeded hunts for
# `evicts_read_blocks` need 19 to 731 examples, so a cap of 400 could be passed by a change of
# draws (a Hypothesis release).
HUNT = settings(
    max_examples=1_000,
    derandomize=True,
    deadline=None,
    database=None,
    stateful_step_count=30,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
SHRINK = settings(HUNT, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_suite_catches_mutant(name: str) -> None:
    mutant = MUTANTS[name]
    machine = conformance_machine(mutant.factory, profile=mutant.profile, configs=mutant.configs)
    err, printed = run_machine(machine, HUNT)
    assert err is not None, f"the conformance suite did not catch mutant {name!r}"
    failure = failure_from(err, printed)
    assert failure.rule == mutant.rule, f"{name}: expected [{mutant.rule}], got:\n{err}"
    # readable counterexample: the rule, the state, and a replayable program
    assert f"[{mutant.rule}]" in failure.message
    if mutant.rule == "fdfo_sync_parity":  # a cross-run check: both outputs are shown
        assert "expected [" in failure.message and "got [" in failure.message
    elif mutant.rule == "golden_output":  # the output against the request decoded alone
        assert "differs from its golden output [" in failure.message
    elif mutant.rule == "reported_output":  # the reported output against the spec's, and state
        assert " reported " in failure.message and "state:" in failure.message
    elif mutant.rule == "carriers_iff_unfinished":  # found in the snapshot: both sides shown
        assert "implementation [" in failure.message and "spec [" in failure.message
        assert "state:" in failure.message
    else:  # the abstract state at the faulty event
        assert "state:" in failure.message and "event:" in failure.message
    assert "state.configure(config=" in failure.program
    assert "state.submit" in failure.program  # submit( or submit_burst(


# A state invariant that no implementation reaches without breaking an event rule first (the
# machine checks an event's own rules before the state it leads to): the seeded bugs that try,
# and the rule each is caught by. no_leak's two halves: a slot outside the pool (kv_exclusive
# refuses the allocation), a slot of a block that is not live (whole_block_alloc refuses an
# allocation for a block other than the next one; terminal_owns_nothing refuses an end that
# keeps slots).
SHADOWED_INVARIANTS = {
    "no_leak": {
        "one_based_pages": "kv_exclusive",
        "prefetches_next_block": "whole_block_alloc",
        "no_free_on_finish": "terminal_owns_nothing",
    },
}


def test_every_state_invariant_has_a_seeded_bug() -> None:
    """Each invariant of `spec.invariants` is the rule some mutant is caught by, or is shadowed
    by event rules that mutants trying to break it are caught by (each hunt above checks it)."""
    caught = {m.rule for m in MUTANTS.values()}
    for name in INVARIANTS:
        if name in SHADOWED_INVARIANTS:
            for mutant, rule in SHADOWED_INVARIANTS[name].items():
                assert MUTANTS[mutant].rule == rule, mutant
        else:
            assert name in caught, f"no seeded bug is caught by the invariant {name!r}"


def test_without_a_golden_decoder_batch_parity_catches_a_mode_bug() -> None:
    """An implementation without `golden_output` has its outputs checked by batch parity alone:
    the lost algorithm state (an FDFO-only bug) makes an FDFO output differ from the request's
    solo sync output at teardown."""
    mutant = MUTANTS["lost_algorithm_state"]
    machine = conformance_machine(mutant.factory, configs=mutant.configs, golden=False)
    err, printed = run_machine(machine, HUNT)
    assert err is not None, "batch parity did not catch the lost algorithm state"
    failure = failure_from(err, printed)
    assert failure.rule == "fdfo_sync_parity", failure.message
    assert "expected [" in failure.message and "got [" in failure.message
    assert "state.configure(config=" in failure.program


# a control of the hunt's settings (the reference passes the suite per push in
# tests/test_conformance_reference.py): full tier, as tests/tier.py says
@full_tier
def test_reference_itself_passes_the_same_hunt() -> None:
    """Control: the unmutated reference survives the settings the mutant hunt uses, for 200
    examples: more than any hunt in the default space runs before its catch (the slowest,
    `abort_leaks_retained_block`, about 130; `scripts/bench_catch_time.py` measures them)."""
    from reference.dllm import make_scheduler

    err, printed = run_machine(
        conformance_machine(make_scheduler), settings(HUNT, max_examples=200)
    )
    assert err is None, failure_from(err, printed).message


@pytest.mark.parametrize(
    "name", ["double_free", "sync_returns_early", "ragged_row", "caches_before_commit"]
)
def test_counterexamples_are_shrunk(name: str) -> None:
    """With shrinking on, the printed program is short: configure, a submit or two, a round."""
    mutant = MUTANTS[name]
    machine = conformance_machine(mutant.factory, profile=mutant.profile, configs=mutant.configs)
    err, printed = run_machine(machine, SHRINK)
    assert err is not None
    failure = failure_from(err, printed)
    assert failure.rule == mutant.rule
    calls = [
        ln for ln in failure.program.splitlines() if ln.lstrip().startswith(("state.", "requests_"))
    ]
    actions = [c for c in calls if "are_checked" not in c and "teardown" not in c]
    assert 2 <= len(actions) <= 6, failure.program


def test_stale_context_is_caught_only_by_golden() -> None:
    """The golden class: with the golden check off, the same hunt (parity included) passes the
    stale-context mutant, since it corrupts the solo sync run exactly as the batched one."""
    mutant = MUTANTS["stale_context"]
    machine = conformance_machine(mutant.factory, configs=mutant.configs, golden=False)
    # 50 examples: with the golden check on, the hunt catches it within 10
    err, printed = run_machine(machine, settings(HUNT, max_examples=50))
    assert err is None, failure_from(err, printed).message
