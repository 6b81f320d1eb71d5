"""The Z3 proof suite: every proof holds, and every seeded symbolic mutant yields a
counterexample that replays through SpecMachine and through the matching reference mutant."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from properties.proofs import DEFAULT_BOUND, FAMILIES, ProofResult, failed, run_proofs
from properties.symbolic.bmc import MutantCounterexample, find_mutant_counterexample
from properties.symbolic.mutants import SYMBOLIC_MUTANTS
from properties.symbolic.result import IsolatedSolver, check
from properties.symbolic.workloads import replay
from properties.workload import run_workload
from reference.dllm import ReferenceDllmScheduler
from reference.prefix_cache import CACHED_PROFILE, CachingReferenceScheduler
from schedspec_cli.prove import FAMILY_NAMES
from spec.adapter import ImplementationFactory
from spec.errors import SpecViolation
from spec.invariants import INVARIANTS
from spec.profile import DllmProfile
from tests.mutants import MUTANTS
from tests.proof_run import Z3_PROOFS_GROUP, default_proof_run

pytestmark = pytest.mark.xdist_group(Z3_PROOFS_GROUP)


@pytest.fixture
def suite() -> list[ProofResult]:
    return list(default_proof_run().results)


@pytest.fixture
def counterexamples() -> dict[str, MutantCounterexample]:
    return default_proof_run().counterexamples


def test_the_module_runs_in_its_xdist_group(request: pytest.FixtureRequest) -> None:
    """Under `--dist loadgroup` (run-tests) pytest-xdist names the group in each grouped
    test's node id and sends the group to one worker; where pytest ignores that name (pytest
    9.2 with pytest-xdist 3.8) the group splits and each worker solves the proofs again."""
    if not request.config.getoption("loadgroup", default=False):
        pytest.skip("not run by a pytest-xdist worker under --dist loadgroup")
    assert request.node.nodeid.endswith(f"@{Z3_PROOFS_GROUP}"), request.node.nodeid


def test_every_proof_holds(suite: list[ProofResult]) -> None:
    results = suite
    bad = failed(results)
    assert not bad, "\n\n".join(f"{r.name}: {r.status}\n{r.detail}" for r in bad)


def test_every_named_invariant_is_proved_by_name(suite: list[ProofResult]) -> None:
    results = suite
    by_name = {r.name: r for r in results}
    for name in INVARIANTS:
        assert by_name[f"inductive/{name}"].status == "proved"
        assert by_name[f"bmc/{name}"].status == "proved"


def test_non_inductive_invariants_show_an_unreachable_cti(
    suite: list[ProofResult],
) -> None:
    results = suite
    strengthened = [
        r for r in results if r.name.startswith("inductive/") and "not inductive alone" in r.detail
    ]
    assert strengthened, "expected invariants that are not inductive on their own"
    for r in strengthened:
        assert "the CTI violates:" in r.detail and "unreachable" in r.detail, r.detail
        assert "REACHABLE" not in r.detail, r.detail
    needing_lemmas = [r for r in strengthened if "excluded by the strengthening lemmas" in r.detail]
    assert needing_lemmas, "expected at least one invariant that needs a strengthening lemma"


def test_results_serialise(suite: list[ProofResult]) -> None:
    results = suite
    for r in results:
        js = r.to_json()
        assert set(js) == {"name", "status", "seconds", "detail"}
        assert js["status"] in ("proved", "counterexample", "unknown")


def test_default_bound() -> None:
    assert DEFAULT_BOUND >= 4


#: Each family's results, by the prefix of their names.
FAMILY_PREFIXES = {
    "inductive": ("inductive/", "lemma/"),
    "bmc": ("bmc/",),
    "mutants": ("mutant/",),
    "theorems": ("theorem/",),
    "boundary": ("boundary/",),
}


def test_the_families_split_the_suite_and_one_runs_alone(suite: list[ProofResult]) -> None:
    """Every proof belongs to one family; `families` runs the chosen ones alone, the same
    proofs in the same order as in the whole run; the command line knows the same names; an
    unknown family is a `ValueError` naming the valid ones."""
    assert tuple(FAMILIES) == tuple(FAMILY_PREFIXES) == FAMILY_NAMES
    for result in suite:
        owners = [f for f, prefixes in FAMILY_PREFIXES.items() if result.name.startswith(prefixes)]
        assert len(owners) == 1, (result.name, owners)
    alone = run_proofs(bound=2, families=["boundary", "bmc"]).results
    expected = [r.name for r in suite if r.name.startswith(("bmc/", "boundary/"))]
    assert [r.name for r in alone] == expected and not failed(list(alone))
    with pytest.raises(ValueError, match="unknown proof family 'proofs' \\(valid: inductive"):
        run_proofs(families=["proofs"])


def test_every_symbolic_mutant_is_caught(suite: list[ProofResult]) -> None:
    results = suite
    by_name = {r.name: r for r in results}
    for m in SYMBOLIC_MUTANTS:
        r = by_name[f"mutant/{m.name}"]
        assert r.status == "proved" and f"[{m.rule}]" in r.detail, r.detail


def test_the_required_mutants_are_encoded() -> None:
    names = {m.name for m in SYMBOLIC_MUTANTS}
    for required in (
        "no_free_on_finish",
        "abort_leaks_retained_block",
        "double_free",
        "admits_beyond_max_running",
        "admits_out_of_order",
        "commits_before_final_forward",
        "misaligned_page",
        "idles_with_the_head_fitting",
        "mixes_prefill_and_decode",
        "decodes_while_a_prompt_waits",
        "prefill_passes_prefill",
        "releases_row_under_reuse",
        "runs_past_stop_token",
        "stops_before_its_stop_token",
        "eos_ends_ignore_eos_request",
        "stop_token_ends_ignore_eos_request",
        "aborts_mid_round_without_commit",
    ):
        assert required in names


@pytest.mark.parametrize("mutant", SYMBOLIC_MUTANTS, ids=lambda m: m.name)
def test_mutant_counterexample_replays(
    mutant: object, counterexamples: dict[str, MutantCounterexample]
) -> None:
    name = mutant.name  # type: ignore[attr-defined]
    assert name in counterexamples, f"Z3 found no counterexample for {name}"
    cex = counterexamples[name]
    print(cex.render())
    # the concrete event sequence: every event but the last is accepted by the spec, the last
    # is rejected with the mutant's rule
    _, violation = replay(cex.mutant.config, cex.events, cex.mutant.policy)
    assert violation is not None and violation.rule == cex.mutant.rule, violation
    # the workload is legal: the correct reference (the caching one with a prefix cache),
    # under the mutant's policy, runs it cleanly
    policy = cex.mutant.policy
    profile = DllmProfile(policy=policy)
    correct: ImplementationFactory = functools.partial(ReferenceDllmScheduler, policy=policy)
    if cex.mutant.config.prefix_cache:
        assert policy == CACHED_PROFILE.policy, "the caching reference runs the default policy"
        profile, correct = CACHED_PROFILE, CachingReferenceScheduler
    run_workload(correct, cex.workload, parity=False, profile=profile)
    # and the matching reference mutant fails it with the same rule
    for ref in cex.mutant.reference:
        assert ref in MUTANTS, f"tests/mutants.py has no mutant {ref!r}"
        assert MUTANTS[ref].profile.policy == policy, ref
        with pytest.raises(SpecViolation) as info:
            run_workload(MUTANTS[ref].factory, cex.workload, parity=False, profile=profile)
        assert info.value.rule == MUTANTS[ref].rule == cex.mutant.rule, info.value


def test_a_counterexample_does_not_depend_on_what_was_solved_before(
    counterexamples: dict[str, MutantCounterexample],
) -> None:
    """The same query gives the same model whatever the process solved before (each query is
    solved in a z3 context of its own): a mutant's trace found again after another mutant's
    search is the first one, and the one the module's search found after other tests' queries.
    In z3's shared context the second search found another trace."""
    by_name = {m.name: m for m in SYMBOLIC_MUTANTS}
    first = find_mutant_counterexample(by_name["double_free"])
    find_mutant_counterexample(by_name["admits_beyond_max_running"])
    again = find_mutant_counterexample(by_name["double_free"])
    assert first is not None and again is not None
    assert again.events == first.events
    assert counterexamples["double_free"].events == first.events


def test_the_isolated_solver_reads_main_context_terms() -> None:
    """`IsolatedSolver` takes main-context terms and Python booleans, checks under
    assumptions, and evaluates main-context terms in its model; a model before a check is a
    clear error."""
    import z3

    x, y = z3.Ints("iso.x iso.y")
    sol = IsolatedSolver(1_000)
    with pytest.raises(RuntimeError, match="before check"):
        sol.model()
    sol.add(x + y == 5, x > 3, True)
    assert not check(sol, y > 1)
    assert check(sol)
    model = sol.model()
    assert model.eval(x).as_long() == 5 - model.eval(y).as_long()
    assert model.eval(x * 2, model_completion=True).eq(z3.IntVal(2 * model.eval(x).as_long()))
    sol.add(False)
    assert not check(sol)


def test_induction_and_bmc_use_the_same_relation() -> None:
    """The per-event-kind relations the inductive step checks are exactly the one transition
    relation that BMC unrolls (T ⇔ ∨_kind T_kind), on a small geometry."""
    import z3

    from properties.symbolic.encoding import Encoding
    from properties.symbolic.geometry import Geometry, SymConfig
    from properties.symbolic.induction import kind_steps
    from properties.symbolic.result import check, solver

    enc = Encoding(Geometry(2, 4, 2, requests=2, rows=2, running=2), SymConfig.symbolic("c"))
    s, p, s2 = enc.state("s"), enc.params("p"), enc.state("t")
    split = z3.Or([k.relation for k in kind_steps(enc, s, p, s2).values()])
    sol = solver()
    sol.add(z3.Xor(enc.transition(s, p, s2), split))
    assert not check(sol)


def test_docs_list_every_symbolic_mutant() -> None:
    """docs/proofs.md's table names each symbolic mutant with the rule it breaks and the
    reference mutants that fail its workload."""
    text = (Path(__file__).parent.parent / "docs" / "proofs.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    for m in SYMBOLIC_MUTANTS:
        row = [line for line in rows if line.startswith(f"| `{m.name}`")]
        assert row and f"| {m.rule} |" in row[0], m.name
        replayed = row[0].rstrip(" |").rsplit("|", 1)[1]
        for ref in m.reference:
            assert ref in replayed, (m.name, ref, row[0])
