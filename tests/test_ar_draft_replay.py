"""A drafter's proposals in an AR log (`ArDraftsProposed`, rule `speculative_drafts`) and the
decision twins that replay speculative decoding (`spec.ar.ArDraftingAdapter`, the harness's
`ArPropose`).

vLLM's drafter proposes up to k drafts for each request of a step's batch after the step
(`update_draft_token_ids`); the next step that schedules the request schedules as many as
its tokens allow, and a preemption or that schedule drops them. A log that names the
proposals is held to them (a draft nobody proposed breaks the rule), and the reference
`vllm-v1` twins replay them: each proposal with the acceptance the log verified after it.
vLLM also pads a waiting request with one token left to compute to 1 + k tokens with k
placeholder drafts (a uniform decode for CUDA graphs), which no drafter proposed and the
reference decides as vLLM does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from properties.ar.decisions import operations, twin_difference
from properties.ar.harness import ArHarness, ArPropose, ArStep
from reference.ar.prefix_cache import make_vllm_v1_prefix
from reference.ar.vllm_v1 import make_vllm_v1_033
from schedspec_cli.main import main
from spec.ar.adapter import ArDraftingAdapter
from spec.ar.config import ArConfig, ArRequest, Policy
from spec.ar.events import (
    ArBlocksAllocated,
    ArBlocksFreed,
    ArDraftsProposed,
    ArDraftsVerified,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.trace import ar_event_to_dict
from spec.errors import CannotDrive, ConfigError, UnknownRequest
from tests.test_ar_free_keeps_computed import log_of, verdict
from tests.test_ar_speculative import A_PREFILLED, A_RUN, CFG

# a (4 prompt tokens, 6 outputs): prefilled in step 0 (output 1); 2 drafts proposed, both
# scheduled in step 1 and 1 accepted (outputs 2-3, 6 computed); 1 proposed and accepted in
# step 2 (outputs 4-5, 8 computed, its 2 blocks full); step 3 decodes its last output alone
PROPOSED_RUN: list[ArEvent] = [
    *A_PREFILLED,
    ArDraftsProposed("a", 2),
    ArScheduled("a", 3, drafts=2),
    ArStepEnd(1),
    ArDraftsVerified("a", 1),
    ArDraftsProposed("a", 1),
    ArScheduled("a", 2, drafts=1),
    ArStepEnd(2),
    ArDraftsVerified("a", 1),
    ArBlocksAllocated("a", (3,)),
    ArScheduled("a", 1),
    ArStepEnd(3),
    ArBlocksFreed("a", (1, 2, 3)),
    ArFinished("a", ArFinishReason.LENGTH),
]


def test_a_log_naming_its_proposals_conforms() -> None:
    assert verdict(PROPOSED_RUN, CFG) == ("", "")
    assert verdict(PROPOSED_RUN, CFG.replace(enable_prefix_caching=True)) == ("", "")


@pytest.mark.parametrize(
    ("events", "said"),
    [
        (  # more drafts scheduled than proposed
            [*A_PREFILLED, ArDraftsProposed("a", 1), ArScheduled("a", 3, drafts=2)],
            "'a' scheduled 2 draft token(s); the drafter proposed 1 for this step",
        ),
        (  # the proposal was spent by step 1's schedule
            [*PROPOSED_RUN[:8], ArScheduled("a", 3, drafts=2)],
            "the drafter proposed 0 for this step",
        ),
        (  # proposed inside the schedule phase
            [*A_PREFILLED, ArScheduled("a", 1), ArDraftsProposed("a", 1)],
            "drafts proposed for 'a' inside step 1's schedule phase",
        ),
        (  # for a request that waits
            [ArSubmitted("a", 4, 6), ArDraftsProposed("a", 1)],
            "drafts proposed for 'a', which is not running",
        ),
        (  # for a request in its prefill
            [
                ArSubmitted("a", 4, 6),
                ArBlocksAllocated("a", (1,)),
                ArScheduled("a", 2),
                ArStepEnd(0),
                ArDraftsProposed("a", 1),
            ],
            "drafts proposed for 'a', which is in its prefill",
        ),
        (  # more than num_speculative_tokens
            [*A_PREFILLED, ArDraftsProposed("a", 3)],
            "'a' proposed drafts=3: an integer in [1, num_speculative_tokens=2]",
        ),
        (  # before the last step's drafts were verified
            [*PROPOSED_RUN[:7], ArDraftsProposed("a", 1)],
            "were never verified",
        ),
    ],
    ids=["beyond", "spent", "in-schedule", "waiting", "prefill", "over-k", "unverified"],
)
def test_a_proposal_the_log_breaks_is_named(events: list[ArEvent], said: str) -> None:
    rule, message = verdict(events, CFG)
    assert rule == "speculative_drafts", message
    assert said in message, message


def test_a_proposal_of_none_is_written_and_refused() -> None:
    """`drafts` of a proposal is always written (a schedule's only when some), so a proposal
    of 0 reads back as one, and breaks the rule rather than the format."""
    assert ar_event_to_dict(ArDraftsProposed("a", 0)) == {
        "kind": "ar_drafts_proposed",
        "request_id": "a",
        "drafts": 0,
    }
    rule, message = verdict([*A_PREFILLED, ArDraftsProposed("a", 0)], CFG)
    assert rule == "speculative_drafts", message


def harness(config: ArConfig = CFG) -> ArHarness:
    """The reference with vLLM 0.33.0's options, checked against the spec as it runs."""
    return ArHarness(make_vllm_v1_033, config)


def scheduled(h: ArHarness, step: int) -> list[tuple[str, int, int]]:
    """(request, tokens, drafts) the reference scheduled in step `step`."""
    out, current = [], 0
    for e in h.events:
        if isinstance(e, ArStepEnd):
            current += 1
        elif isinstance(e, ArScheduled) and current == step:
            out.append((e.request_id, e.num_tokens, e.drafts))
    return out


def verified(h: ArHarness) -> list[tuple[str, int]]:
    return [(e.request_id, e.accepted) for e in h.events if isinstance(e, ArDraftsVerified)]


def test_the_reference_schedules_verifies_and_rolls_back_the_proposals() -> None:
    """Step 1 schedules a's last token and its 2 proposed drafts; the model accepts 1, so a
    has 3 outputs and 6 computed tokens; step 2 schedules the 1 draft proposed then; the
    decode after it, with nothing proposed, schedules one token. Every event is checked as it
    is emitted, and the snapshot after every step."""
    h = harness()
    assert isinstance(h.impl, ArDraftingAdapter)
    h.submit(ArRequest("a", 4, 6))
    h.step()
    h.propose_drafts("a", 2, 1)
    h.step()
    h.propose_drafts("a", 1, 1)
    h.step()
    h.step()
    assert [scheduled(h, s) for s in range(4)] == [
        [("a", 4, 0)],
        [("a", 3, 2)],
        [("a", 2, 1)],
        [("a", 1, 0)],
    ]
    assert verified(h) == [("a", 1), ("a", 1)]
    assert h.outputs() == {"a": 6}


def test_the_acceptance_stops_at_the_requests_end() -> None:
    """A 3-output request with 2 drafts proposed that the model would accept samples its
    second output and accepts 1 draft, its end, and finishes in that step."""
    h = harness()
    h.submit(ArRequest("a", 4, 3))
    h.step()  # output 1
    h.propose_drafts("a", 2, 2)
    h.step()  # output 2 sampled, then 1 accepted: its end at 3
    assert verified(h) == [("a", 1)]
    assert h.outputs() == {"a": 3}


def test_the_budget_cuts_the_drafts_and_a_schedule_spends_the_proposal() -> None:
    """A budget of 4 with b's chunk first leaves a 2 of its 1 + 2 tokens: 1 draft; in the
    next step a's unscheduled draft is gone (vLLM clears the proposal at the schedule)."""
    config = CFG.replace(max_num_batched_tokens=4)
    h = harness(config)
    h.submit(ArRequest("a", 4, 6))
    h.step()
    h.submit(ArRequest("b", 2, 6))
    h.step()  # a decodes (1 token), b's prompt of 2: both running, a first
    h.propose_drafts("a", 2, 2)
    h.propose_drafts("b", 2, 0)
    h.step()
    assert scheduled(h, 2) == [("a", 3, 2), ("b", 1, 0)]
    h.propose_drafts("b", 2, 0)
    h.step()
    # a: 1 + 2 proposed? none: its proposal was spent; b: 1 + 2 of the 3 left after a's 1
    assert scheduled(h, 3) == [("a", 1, 0), ("b", 3, 2)]


def test_a_waiting_request_with_one_token_to_compute_is_padded_to_the_drafts() -> None:
    """vLLM pads a new decode (one token to compute) to 1 + k tokens with k placeholder
    drafts, which the model rejects, where a running request was scheduled in the step; with
    the budget too short for the padding it admits nothing more (rather than unpadded)."""
    h = harness()
    h.submit(ArRequest("a", 4, 6))
    h.step()
    h.submit(ArRequest("b", 1, 3))
    h.step()
    assert scheduled(h, 1) == [("a", 1, 0), ("b", 3, 2)]
    assert verified(h) == [("b", 0)]
    short = harness(CFG.replace(max_num_batched_tokens=5))
    short.submit(ArRequest("a", 4, 6))
    short.step()
    short.propose_drafts("a", 2, 0)
    short.submit(ArRequest("b", 1, 3))
    short.step()  # a takes 3 of the 5: b's padded 3 do not fit, and b waits
    assert scheduled(short, 1) == [("a", 3, 2)]
    alone = harness()  # nothing running: no padding
    alone.submit(ArRequest("b", 1, 3))
    alone.step()
    assert scheduled(alone, 0) == [("b", 1, 0)]


def test_a_preempted_request_padded_later_accepts_none_of_the_padding() -> None:
    """r0's proposal (all to be accepted) is dropped when r2, of higher priority, preempts it
    unscheduled; readmitted with a cache hit of all but its last token, r0 is padded to 1 + k
    tokens, and its placeholder drafts are all rejected: the acceptance scripted for the
    dropped proposal does not carry over (with it, r0 accepted one and finished a step early).
    Found by a random search against a reference that kept the old acceptance."""
    config = ArConfig(
        block_size=2,
        num_blocks=10,
        max_num_batched_tokens=16,
        max_num_seqs=3,
        max_model_len=12,
        enable_prefix_caching=True,
        policy=Policy.PRIORITY,
        num_speculative_tokens=2,
    )
    h = ArHarness(make_vllm_v1_prefix, config)
    h.step()
    for rid, prompt, outputs, priority in [
        ("r0", (1, 2, 1, 2, 2), 4, 1),
        ("r1", (2, 1, 2, 2), 2, 2),
        ("r2", (2, 2, 1, 2, 2), 5, 0),
    ]:
        h.submit(ArRequest(rid, len(prompt), outputs, priority=priority, prompt=prompt))
    h.step()
    h.propose_drafts("r2", 2, 2)
    h.step()  # r2 accepts both; r1 is preempted
    h.propose_drafts("r0", 2, 2)
    h.propose_drafts("r2", 2, 2)
    h.step()  # r2 takes the blocks: r0 is preempted before its schedule, its proposal gone
    assert scheduled(h, 3) == [("r2", 3, 2)]
    h.step()  # r0 again: a hit of 6 tokens, 1 to compute, padded
    assert ("r0", 3, 2) in scheduled(h, 4)
    assert verified(h)[-1] == ("r0", 0)


def test_a_bad_proposal_is_refused_and_changes_nothing() -> None:
    h = harness()
    h.submit(ArRequest("a", 4, 6))
    h.submit(ArRequest("w", 4, 6))
    h.step()
    with pytest.raises(ConfigError, match=r"num_speculative_tokens=2"):
        h.propose_drafts("a", 3, 0)
    with pytest.raises(ConfigError, match=r"accepted"):
        h.propose_drafts("a", 1, 2)
    with pytest.raises(UnknownRequest):
        h.propose_drafts("nobody", 1, 0)
    h.step()
    assert scheduled(h, 1) == [("a", 1, 0), ("w", 1, 0)]


def drafted_run(config: ArConfig = CFG) -> ArHarness:
    """a decodes with 2 drafts proposed three times (1, 0, then 2 to be accepted: 1 is, its
    end), b (one prompt token) is padded beside it; then the run drains."""
    h = harness(config)
    h.submit(ArRequest("a", 4, 6))
    h.step()
    h.submit(ArRequest("b", 1, 4))
    for accept in (1, 0, 2):
        h.propose_drafts("a", 2, accept)
        h.step()
    h.drain()
    return h


def test_the_reference_decides_alike_on_its_own_run_replayed() -> None:
    """The operations read back from the run's events (the proposals with the acceptances
    verified after them) drive a second reference to the same decisions."""
    h = drafted_run()
    ops = operations(h.events, replay_drafts=True)
    assert [op for op in ops if isinstance(op, ArPropose)] == [
        ArPropose("a", 2, 1),
        ArPropose("a", 2, 0),
        ArPropose("a", 2, 1),  # 2 would be accepted: 1 is, a's last output
    ]
    assert twin_difference(ops, h.events, CFG, make_vllm_v1_033) is None
    # a twin that accepted one draft fewer would decide otherwise
    fewer = [ArPropose(o.request_id, 2, 0) if isinstance(o, ArPropose) else o for o in ops]
    assert twin_difference(fewer, h.events, CFG, make_vllm_v1_033) is not None


def test_a_log_naming_no_proposal_gets_one_per_drafted_schedule() -> None:
    """Without `ar_drafts_proposed` the drafts each running request carried are its proposal,
    just before its step, with the acceptance verified after it."""
    with pytest.raises(CannotDrive, match="does not replay a drafter"):
        operations(A_RUN)
    ops = operations(A_RUN, replay_drafts=True)
    assert ops[1:] == [ArStep(), ArPropose("a", 2, 1), ArStep(), ArPropose("a", 2, 2), ArStep()]


def test_check_trace_replays_the_drafts_with_vllm_v1_and_refuses_a_twin_without_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reference's log decides alike with `--twin vllm-v1`, with its proposals named or
    not; a Vidur twin, which has no drafter, is refused in one line before any verdict."""
    lines = log_of(drafted_run().events, CFG)
    unnamed = [line for line in lines if '"ar_drafts_proposed"' not in line]
    assert len(unnamed) == len(lines) - 3
    log = tmp_path / "drafts.jsonl"
    for text in (lines, unnamed):
        log.write_text("".join(text))
        assert main(["check-trace", str(log), "--twin", "vllm-v1"]) == 0
        out, _ = capsys.readouterr()
        assert "decides alike" in out, out
    # a Vidur twin's space: whole prefills
    whole = CFG.replace(enable_chunked_prefill=False, max_num_batched_tokens=32)
    log.write_text("".join(log_of(drafted_run(whole).events, whole)))
    assert main(["check-trace", str(log), "--twin", "vidur-vllm"]) == 2
    out, err = capsys.readouterr()
    assert "OK" not in out, out
    assert "does not replay a drafter" in err, err
    assert len(err.strip().splitlines()) == 1, err
