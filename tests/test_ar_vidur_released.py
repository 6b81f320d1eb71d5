"""The project's re-implementations of Vidur's vLLM and Sarathi replica schedulers as Vidur's
releases decide (`reference.ar.vidur_released`): the decisions that set them apart from
`reference.ar.vidur`'s deliberate deviations. Their conformance under their declared profiles
is tests/test_ar_vidur.py's (with every Vidur built-in); their decision identity with Vidur's
real classes is checked in tests/test_real_vidur.py (0.0.25) and
tests/test_real_vidur_newest.py (0.0.26)."""

from __future__ import annotations

import pytest

from reference.ar.vidur import VIDUR_SARATHI, VIDUR_VLLM
from reference.ar.vidur_released import VIDUR_SARATHI_RELEASED, VIDUR_VLLM_RELEASED
from spec.ar.config import ArRequest
from spec.ar.decisions import first_difference
from spec.ar.events import ArBlocksAllocated, ArPreempted, ArScheduled
from spec.errors import SpecViolation
from spec.implementation import ArImplementation
from tests.test_ar_mnemosyne import config, decisions, run

RELEASED = [VIDUR_VLLM_RELEASED, VIDUR_SARATHI_RELEASED]


def test_vllm_released_sums_a_prefill_batchs_tokens() -> None:
    """Budget 5: r0 (3 tokens) and r1 (1) sum to 4 and share step 0, as Vidur's releases
    admit them; padded to the longest prompt (microsoft/vidur's main branch, `vidur-vllm`)
    they would be 2 * 3 = 6, so r1 waits for step 1."""
    cfg = config(
        num_blocks=10,
        max_num_batched_tokens=5,
        max_num_seqs=2,
        max_model_len=5,
        enable_chunked_prefill=False,
    )
    requests = (ArRequest("r0", 3, 1), ArRequest("r1", 1, 1))
    released = decisions(VIDUR_VLLM_RELEASED, cfg, requests)
    padded = decisions(VIDUR_VLLM, cfg, requests)
    assert released[0].scheduled == (("r0", 3), ("r1", 1))
    assert padded[0].scheduled == (("r0", 3),)
    assert padded[1].scheduled == (("r1", 1),)


# Pool 4, chunk 2, two seats. Step 1 admits r2 (1 block) and r3 (3 blocks, 1 of its 3 prompt
# tokens): the pool is full. In step 2 r2's decode needs a block: r3, last in the decode queue,
# is restarted, having processed 1 token.
RESTART = config(num_blocks=4, max_num_batched_tokens=2, max_num_seqs=2, max_model_len=4)
RESTART_REQUESTS = (
    ArRequest("r0", 1, 1),
    ArRequest("r1", 1, 1),
    ArRequest("r2", 1, 2),
    ArRequest("r3", 3, 1),
)


def test_sarathi_released_decodes_the_rest_of_a_restarted_prompt() -> None:
    """Vidur's `Request.restart` makes the prefill what was processed (1 token of r3's 3): r3
    is re-admitted in step 2 with 1 block beside r2's decode, then computes the other two
    prompt tokens one a step as decodes, though the chunk has room for both. `vidur-sarathi`
    recomputes all 3 as a prefill: re-admitted only when its 3 blocks are free, it takes 2 in
    step 3."""
    h = run(VIDUR_SARATHI_RELEASED, RESTART, *RESTART_REQUESTS)
    released = [d.scheduled for d in decisions(VIDUR_SARATHI_RELEASED, RESTART, RESTART_REQUESTS)]
    reference = [d.scheduled for d in decisions(VIDUR_SARATHI, RESTART, RESTART_REQUESTS)]
    assert [e for e in h.events if isinstance(e, ArPreempted)] == [ArPreempted("r3", (3, 0, 1))]
    assert released[2:] == [(("r2", 1), ("r3", 1)), (("r3", 1),), (("r3", 1),)]
    assert reference[2:] == [(("r2", 1),), (("r3", 2),), (("r3", 1),)]
    assert h.outputs() == {"r0": 1, "r1": 1, "r2": 2, "r3": 1}


def test_sarathi_released_restarts_a_decode_needing_no_block_when_none_is_free() -> None:
    """Vidur's Sarathi wants one free block for every decode. r1 (one prompt token, six
    outputs) holds the whole pool (3 blocks of 2) after its fourth output; its next decode fits
    its blocks, but with none free it restarts itself and is re-admitted in the same batch.
    `vidur-sarathi` restarts only for a block it needs: never here."""
    cfg = config(
        block_size=2, num_blocks=3, max_num_batched_tokens=1, max_num_seqs=1, max_model_len=7
    )
    requests = (ArRequest("r0", 1, 1), ArRequest("r1", 1, 6))
    released = run(VIDUR_SARATHI_RELEASED, cfg, *requests)
    reference = run(VIDUR_SARATHI, cfg, *requests)
    restarts = [i for i, e in enumerate(released.events) if isinstance(e, ArPreempted)]
    assert len(restarts) == 1, released.events
    after = released.events[restarts[0] : restarts[0] + 3]
    assert after == [
        ArPreempted("r1", (1, 2, 0)),
        ArBlocksAllocated("r1", (1, 2, 0)),  # blocks for its known tokens: the whole pool
        ArScheduled("r1", 1),
    ], after
    assert not any(isinstance(e, ArPreempted) for e in reference.events)
    assert released.outputs() == reference.outputs() == {"r0": 1, "r1": 6}


@pytest.mark.parametrize("impl", RELEASED, ids=["vllm", "sarathi"])
def test_released_schedulers_keep_vidurs_watermark(impl: ArImplementation) -> None:
    """Pool 100, watermark 1: a request needing 99 blocks is served; one needing all 100 is
    accepted and never admitted (rule `progress`), as Vidur's real classes do (an open
    finding: tests/test_real_vidur.py). The deviating references admit it."""
    chunked = impl is VIDUR_SARATHI_RELEASED
    cfg = config(
        num_blocks=100,
        max_num_batched_tokens=128,
        max_num_seqs=2,
        max_model_len=128,
        enable_chunked_prefill=chunked,
    )
    assert run(impl, cfg, ArRequest("a", 99, 1)).outputs() == {"a": 1}
    with pytest.raises(SpecViolation) as found:
        run(impl, cfg, ArRequest("a", 100, 1))
    assert found.value.rule == "progress", found.value
    deviating = VIDUR_SARATHI if chunked else VIDUR_VLLM
    assert run(deviating, cfg, ArRequest("a", 100, 1)).outputs() == {"a": 1}


def test_released_and_deviating_references_agree_where_no_deviation_applies() -> None:
    """On a program with room for everything (no restart, no watermark in reach; no two
    prompts share a prefill batch either way: 5 + 7 and 7 + 4 exceed 10) each released
    scheduler decides as its deviating reference."""
    pairs = (
        (False, VIDUR_VLLM_RELEASED, VIDUR_VLLM),
        (True, VIDUR_SARATHI_RELEASED, VIDUR_SARATHI),
    )
    for chunked, released, deviating in pairs:
        cfg = config(
            num_blocks=40,
            max_num_batched_tokens=10,
            max_num_seqs=3,
            max_model_len=10,
            enable_chunked_prefill=chunked,
        )
        requests = (ArRequest("r0", 5, 3), ArRequest("r1", 7, 2), ArRequest("r2", 4, 4))
        runs = [decisions(impl, cfg, requests) for impl in (released, deviating)]
        assert first_difference(runs[0], runs[1]) is None, runs
        assert len(runs[0]) >= 5  # several steps compared


def test_sarathi_released_with_the_reference_restart_recomputes_the_whole_prompt() -> None:
    """`restart_keeps_processed = False` (an ablation knob of scripts/repro_vidur_rules.py):
    the restarted r3 prefills all 3 prompt tokens again, as `vidur-sarathi` does, so its
    step 2 is the reference's; the one-free-block demand stays."""
    from reference.ar.vidur_released import VidurSarathiReleased
    from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
    from spec.ar.config import ArConfig

    class ReferenceRestart(VidurSarathiReleased):
        restart_keeps_processed = False

    def make(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
        return ReferenceRestart(config, sink)

    impl = ArImplementation(make, VIDUR_SARATHI_RELEASED.profile, "ablation")
    steps = [d.scheduled for d in decisions(impl, RESTART, RESTART_REQUESTS)]
    assert steps[2:] == [(("r2", 1),), (("r3", 2),), (("r3", 1),)]
