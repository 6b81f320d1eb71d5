"""`cache_hit_longest` on vLLM's real scheduler: `real-vllm-prefix` declares
`ArPolicy.longest_cache_hit` (its requests carry no cache salt, LoRA adapter or multimodal
input, so vLLM's blocks hash by their tokens alone and its lookup takes the longest cached
prefix). The AR suite then catches a prefix cache that misses, which `cache_hit_cached` and
`cache_hit_bounded` alone let pass: a hit shorter than what the cache holds is still cached
content. (The live log's opt-in is in tests/test_real_vllm_event_log_multi_turn.py.)

Needs vLLM installed (`schedspec install-engines vllm`); skipped with SCHEDSPEC_SKIP_ENGINES=1.
"""

from __future__ import annotations

import dataclasses

import pytest

from integrations.vllm import MANIFEST, REAL_VLLM_PREFIX, REAL_VLLM_PREFIX_PROFILE
from integrations.vllm.adapter import SPACE_PREFIX, RealVllmScheduler
from properties.ar.conformance import ar_conformance_machine
from properties.ar.harness import ArHarness
from properties.verify import failure_from, run_machine
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRequest
from spec.ar.profile import ArProfile
from spec.errors import SpecViolation
from tests.engine_gate import require_engine
from tests.test_ar_mutants import HUNT
from tests.test_real_vllm_cache_reads import CONFIG, A, C  # c shares a's first 3 blocks
from tests.vllm_seeded_bugs import hit_bound_a_block_short


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_engine(MANIFEST, "vllm", "vLLM")


def short_of_a_block(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    """`real-vllm-prefix` with `hit_bound_a_block_short` planted in its scheduler."""
    impl = RealVllmScheduler(config, sink, SPACE_PREFIX)
    hit_bound_a_block_short(impl.sched)
    return impl


def test_the_prefix_built_in_declares_the_longest_hit() -> None:
    assert REAL_VLLM_PREFIX_PROFILE.policy.longest_cache_hit


def test_vllm_takes_the_longest_cached_prefix() -> None:
    """a runs to its end; c, sharing a's first 3 blocks, takes all 3 on vLLM as declared; with
    the lookup bounded a block short it takes 2, and the spec names the missed block."""
    for factory, rule in ((REAL_VLLM_PREFIX.factory, None), (short_of_a_block, "longest")):
        h = ArHarness(factory, CONFIG, policy=REAL_VLLM_PREFIX_PROFILE.policy)
        assert h.submit(ArRequest("a", 7, 1, prompt=A)) is None
        h.drain()
        assert h.violation is None, h.violation
        assert h.submit(ArRequest("c", 7, 1, prompt=C)) is None
        if rule is None:
            h.drain()
            assert h.violation is None, h.violation
            continue
        with pytest.raises(SpecViolation) as err:
            h.step()
        assert err.value.rule == "cache_hit_longest", err.value
        assert "'c' was admitted with a hit of 2 block(s), but the cache held its first 3" in (
            str(err.value)
        )


def test_the_suite_fails_a_prefix_cache_that_misses_only_where_declared() -> None:
    """The AR suite finds the planted bug by `cache_hit_longest` and prints a replayable
    program; under the same policy without the declaration it finds nothing (every hit vLLM
    takes is cached content)."""
    err, printed = run_machine(
        ar_conformance_machine(short_of_a_block, profile=REAL_VLLM_PREFIX_PROFILE), HUNT
    )
    assert isinstance(err, SpecViolation), err
    assert err.rule == "cache_hit_longest", err
    assert "an admission takes the longest cached prefix" in str(err), err
    assert "state.configure(config=" in failure_from(err, printed).program
    policy = dataclasses.replace(REAL_VLLM_PREFIX_PROFILE.policy, longest_cache_hit=False)
    undeclared = ArProfile(space=REAL_VLLM_PREFIX_PROFILE.space, policy=policy)
    quick = HUNT.__class__(HUNT, max_examples=150)
    err, _ = run_machine(ar_conformance_machine(short_of_a_block, profile=undeclared), quick)
    assert err is None, err
