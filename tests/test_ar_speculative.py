"""Speculative decoding in an AR log: draft tokens (`ArScheduled.drafts`) and their
verification (`ArDraftsVerified`), rule `speculative_drafts`.

With `num_speculative_tokens` = k, vLLM schedules a decoding request its last token and up to
k drafts after it, counts them all computed when the step ends, and in `update_from_output`
rolls its computed tokens back by the drafts the model rejected, the accepted ones becoming
outputs after the token the step sampled. Before these events an AR log could not describe
that (a step computing more tokens than the request knows broke `no_compute_past_known`), so
the live vLLM log refused speculative decoding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from properties.ar.trace_check import check_ar_trace
from schedspec_cli.main import main
from spec.ar.config import AdmissionOrder, ArConfig, ArRules, Policy, VictimOrder
from spec.ar.events import (
    ArAborted,
    ArBlocksAllocated,
    ArBlocksFreed,
    ArDraftsVerified,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArPauseSet,
    ArPreempted,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.profile import ArPolicy
from spec.ar.trace import ar_config_from_dict, ar_config_to_dict, ar_event_to_dict
from spec.errors import ConfigError
from spec.trace import TraceFormatError
from tests.test_ar_free_keeps_computed import log_of, verdict

CFG = ArConfig(
    block_size=4, num_blocks=9, max_num_batched_tokens=16, max_num_seqs=2, num_speculative_tokens=2
)
CACHING = CFG.replace(enable_prefix_caching=True)

# a: 4 prompt tokens, 6 outputs. Step 0 computes the prompt (output 1, 5 known).
A_PREFILLED: list[ArEvent] = [
    ArSubmitted("a", 4, 6),
    ArBlocksAllocated("a", (1, 2)),
    ArScheduled("a", 4),
    ArStepEnd(0),
]
# step 1: its last token and 2 drafts (7 computed at the step end, output 2); 1 accepted:
# 6 computed, 3 outputs, 7 known
A_ONE_ACCEPTED: list[ArEvent] = [
    *A_PREFILLED,
    ArScheduled("a", 3, drafts=2),
    ArStepEnd(1),
    ArDraftsVerified("a", 1),
]
# step 2: 6 + 3 tokens need a third block; both drafts accepted: 9 computed, 6 outputs, done
A_RUN: list[ArEvent] = [
    *A_ONE_ACCEPTED,
    ArBlocksAllocated("a", (3,)),
    ArScheduled("a", 3, drafts=2),
    ArStepEnd(2),
    ArDraftsVerified("a", 2),
    ArBlocksFreed("a", (1, 2, 3)),
    ArFinished("a", ArFinishReason.LENGTH),
]


def test_a_speculative_run_conforms_with_and_without_prefix_caching() -> None:
    assert verdict(A_RUN, CFG) == ("", "")
    assert verdict(A_RUN, CACHING) == ("", "")


def test_rejected_drafts_are_no_longer_computed() -> None:
    """After a step whose 2 drafts were both rejected the request has computed its known tokens
    less one again: it may schedule its last token and drafts, not drafts after drafts."""
    rejected: list[ArEvent] = [
        *A_PREFILLED,
        ArScheduled("a", 3, drafts=2),
        ArStepEnd(1),
        ArDraftsVerified("a", 0),  # 5 computed, 2 outputs, 6 known
    ]
    # were the rejected drafts still computed (7 of 6 known), neither could be scheduled
    assert verdict([*rejected, ArScheduled("a", 3, drafts=2), ArStepEnd(2)], CFG) == ("", "")
    assert verdict([*rejected, ArScheduled("a", 1), ArStepEnd(2)], CFG) == ("", "")


def test_accepted_drafts_are_outputs_the_finish_counts() -> None:
    """6 outputs after step 2 (1 + 1 + 1 accepted + 1 + 2 accepted): the request must finish
    in that update phase; with no drafts accepted it has 4 and must not."""
    short = [*A_ONE_ACCEPTED, ArBlocksAllocated("a", (3,)), ArScheduled("a", 3, drafts=2)]
    rule, message = verdict(
        [
            *short,
            ArStepEnd(2),
            ArDraftsVerified("a", 0),
            ArBlocksFreed("a", (1, 2, 3)),
            ArFinished("a", ArFinishReason.LENGTH),
        ],
        CFG,
    )
    assert rule == "finish_condition", message
    assert "finished with 4/6 outputs" in message, message
    rule, message = verdict([*short, ArStepEnd(2), ArDraftsVerified("a", 2), ArStepEnd(3)], CFG)
    assert rule == "finish_released", message


#: One event sequence per way to break `speculative_drafts` (or a neighbouring rule the drafts
#: now reach), with the rule and a phrase of the message.
EDGES: dict[str, tuple[list[ArEvent], ArConfig, str, str]] = {
    "drafts with speculative decoding off": (
        [*A_PREFILLED, ArScheduled("a", 2, drafts=1)],
        CFG.replace(num_speculative_tokens=0),
        "speculative_drafts",
        "scheduled 1 draft token(s); num_speculative_tokens=0 (speculative decoding is off)",
    ),
    "more drafts than num_speculative_tokens": (
        [*A_PREFILLED, ArBlocksAllocated("a", (3,)), ArScheduled("a", 4, drafts=3)],
        CFG,
        "speculative_drafts",
        "scheduled 3 draft token(s); num_speculative_tokens=2",
    ),
    "drafts in a prefill chunk": (
        [ArSubmitted("a", 4, 6), ArBlocksAllocated("a", (1, 2)), ArScheduled("a", 4, drafts=1)],
        CFG,
        "speculative_drafts",
        "drafts follow every known token",
    ),
    "drafts with no known token before them": (
        [*A_PREFILLED, ArScheduled("a", 2, drafts=2)],
        CFG,
        "speculative_drafts",
        "drafts follow every known token, the last included",
    ),
    "drafts never verified before the next step": (
        [*A_PREFILLED, ArScheduled("a", 3, drafts=2), ArStepEnd(1), ArScheduled("a", 1)],
        CFG,
        "speculative_drafts",
        "the drafts of ['a'] computed in step 1 were never verified",
    ),
    "drafts never verified before an empty step": (
        [*A_PREFILLED, ArScheduled("a", 3, drafts=2), ArStepEnd(1), ArStepEnd(2)],
        CFG,
        "speculative_drafts",
        "the drafts of ['a'] computed in step 1 were never verified",
    ),
    "a free before the verification": (
        [
            *A_PREFILLED,
            ArScheduled("a", 3, drafts=2),
            ArStepEnd(1),
            ArBlocksFreed("a", (1, 2)),
            ArAborted("a"),
        ],
        CFG,
        "speculative_drafts",
        "'a' freed blocks [1, 2] before its 2 draft(s) of step 1 were verified",
    ),
    "drafts past max_model_len": (
        # 7 positions: after 5 computed only the last known token (position 5) fits, position
        # 6 being the one its step samples: vLLM trims the drafts away
        [
            ArSubmitted("a", 3, 4),
            ArBlocksAllocated("a", (1,)),
            ArScheduled("a", 3),
            ArStepEnd(0),
            ArScheduled("a", 1),
            ArStepEnd(1),
            ArBlocksAllocated("a", (2,)),
            ArScheduled("a", 1),
            ArStepEnd(2),
            ArScheduled("a", 2, drafts=1),
        ],
        CFG.replace(max_model_len=7),
        "speculative_drafts",
        "positions up to 6, past max_model_len=7 less the one the step samples",
    ),
    "a reset's preemption before the verification": (
        [
            *A_PREFILLED,
            ArScheduled("a", 3, drafts=2),
            ArStepEnd(1),
            ArPreempted("a", (1, 2), reset=True),
        ],
        CFG,
        "speculative_drafts",
        "were never verified",
    ),
    "a pause before the verification": (
        [*A_PREFILLED, ArScheduled("a", 3, drafts=2), ArStepEnd(1), ArPauseSet("paused_all")],
        CFG,
        "speculative_drafts",
        "were never verified",
    ),
    "a finish before the verification": (
        [
            *A_ONE_ACCEPTED,
            ArBlocksAllocated("a", (3,)),
            ArScheduled("a", 3, drafts=2),
            ArStepEnd(2),
            ArFinished("a", ArFinishReason.LENGTH),
        ],
        CFG,
        "speculative_drafts",
        "finished before its 2 draft(s) of step 2 were verified",
    ),
    "a verification without drafts": (
        [*A_PREFILLED, ArScheduled("a", 1), ArStepEnd(1), ArDraftsVerified("a", 0)],
        CFG,
        "speculative_drafts",
        "after step 1, which scheduled none of its drafts",
    ),
    "a second verification": (
        [*A_ONE_ACCEPTED, ArDraftsVerified("a", 0)],
        CFG,
        "speculative_drafts",
        "which scheduled none of its drafts",
    ),
    "more accepted than scheduled": (
        [*A_PREFILLED, ArScheduled("a", 2, drafts=1), ArStepEnd(1), ArDraftsVerified("a", 2)],
        CFG,
        "speculative_drafts",
        "accepted 2 of the 1 draft(s) step 1 verified",
    ),
    "accepted past max_tokens": (
        [
            ArSubmitted("a", 4, 3),
            *A_PREFILLED[1:],
            ArScheduled("a", 3, drafts=2),
            ArStepEnd(1),
            ArDraftsVerified("a", 2),
        ],
        CFG,
        "speculative_drafts",
        "accepted 2 draft(s) after 2 outputs: past its end at 3",
    ),
    "accepted past the scripted end token": (
        [
            ArSubmitted("a", 4, 6, stop_after=2),
            *A_PREFILLED[1:],
            ArScheduled("a", 3, drafts=2),
            ArStepEnd(1),
            ArDraftsVerified("a", 1),
        ],
        CFG,
        "speculative_drafts",
        "past its end at 2 (max_tokens=6, stop_after=2)",
    ),
    "drafts past the blocks held": (
        [*A_ONE_ACCEPTED, ArScheduled("a", 3, drafts=2)],
        CFG,
        "kv_covers_scheduled",
        "'a' computes 6 + 3 tokens but holds 2 blocks",
    ),
    "drafts past the token budget": (
        [
            ArSubmitted("a", 3, 6),
            ArBlocksAllocated("a", (1,)),
            ArScheduled("a", 3),
            ArStepEnd(0),
            ArSubmitted("b", 1, 3),
            ArScheduled("a", 1),
            ArBlocksAllocated("b", (2,)),
            ArScheduled("b", 1),
            ArStepEnd(1),
            ArScheduled("b", 1),
            ArBlocksAllocated("a", (3,)),
            ArScheduled("a", 3, drafts=2),  # 1 + 3 tokens: the drafts are what pass the budget
        ],
        CFG.replace(max_num_batched_tokens=3),
        "token_budget",
        "step 2 would schedule 4 tokens; max_num_batched_tokens=3",
    ),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_an_edge_of_the_draft_checks(name: str) -> None:
    events, config, rule, phrase = EDGES[name]
    found, message = verdict(events, config)
    assert found == rule, message
    assert phrase in message, message


def test_drafts_and_the_draft_limit_in_the_log_format() -> None:
    """`drafts` is written only when some, `num_speculative_tokens` only when not 0: a log
    without speculative decoding reads and writes as before; a bad value is a format error."""
    assert ar_event_to_dict(ArScheduled("a", 1)) == {
        "kind": "ar_scheduled",
        "request_id": "a",
        "num_tokens": 1,
    }
    assert ar_event_to_dict(ArScheduled("a", 3, drafts=2))["drafts"] == 2
    assert ar_event_to_dict(ArDraftsVerified("a", 1)) == {
        "kind": "ar_drafts_verified",
        "request_id": "a",
        "accepted": 1,
    }
    plain = ar_config_to_dict(CFG.replace(num_speculative_tokens=0))
    assert "num_speculative_tokens" not in plain
    assert ar_config_from_dict(plain)[0].num_speculative_tokens == 0
    header = ar_config_to_dict(CFG)
    assert header["num_speculative_tokens"] == 2
    assert ar_config_from_dict(header)[0] == CFG
    lines = log_of(A_RUN, CFG)
    assert json.loads(lines[0])["num_speculative_tokens"] == 2
    for bad, why in [
        ('{"kind": "ar_scheduled", "request_id": "a", "num_tokens": 3, "drafts": -1}', "drafts"),
        ('{"kind": "ar_drafts_verified", "request_id": "a", "accepted": true}', "accepted"),
        ('{"kind": "ar_drafts_verified", "request_id": "a"}', "accepted"),
    ]:
        with pytest.raises(TraceFormatError, match=why):
            check_ar_trace([lines[0], bad + "\n"])


def test_a_victim_readmitted_in_its_step_keeps_no_stale_drafts() -> None:
    """Under vLLM 0.33's priority victim order (any running request, a scheduled one included)
    with same-step readmission declared, a victim scheduled with drafts, preempted and
    readmitted without them in the same step computes no draft. Its drafts used to stay on the
    step and be counted at its end: `speculative_drafts` said they were never verified."""
    config = ArConfig(
        block_size=4,
        num_blocks=4,
        max_num_batched_tokens=16,
        max_num_seqs=2,
        num_speculative_tokens=2,
        policy=Policy.PRIORITY,
    )
    policy = ArPolicy(
        rules=ArRules(
            admission=AdmissionOrder.PRIORITY,
            victim=VictimOrder.LOWEST_PRIORITY_ANY,
            admit_after_preemption=True,
        )
    )
    events: list[ArEvent] = [
        ArSubmitted("v", 4, 6, None, 5),
        ArBlocksAllocated("v", (1,)),
        ArScheduled("v", 4),
        ArStepEnd(0),
        ArSubmitted("h", 5, 2, None, 0),  # more urgent, and needs v's blocks
        ArBlocksAllocated("v", (3,)),
        ArScheduled("v", 3, drafts=2),
        ArPreempted("v", (1, 3)),
        ArBlocksAllocated("h", (1, 2)),
        ArScheduled("h", 5),
        ArBlocksAllocated("v", (3,)),
        ArScheduled("v", 4),  # readmitted: a prefill chunk, no drafts
        ArStepEnd(1),
        ArScheduled("h", 1),
    ]
    assert verdict(events, config, policy) == ("", "")


# --- a drafter's lookahead slots and input rows (EAGLE, a draft model)

LOOKAHEAD = CFG.replace(num_lookahead_tokens=2)


def test_lookahead_slots_are_blocks_past_the_step_within_max_model_len() -> None:
    """With `num_lookahead_tokens` = 2 a scheduled request holds blocks for 2 tokens past
    its step: a's step 1 (4 computed + 3) needs 9 tokens, a third block; without it the check
    says `kv_covers_scheduled`, naming the lookahead."""
    short = [*A_PREFILLED, ArScheduled("a", 3, drafts=2)]
    assert verdict(short, CFG) == ("", "")
    found, message = verdict(short, LOOKAHEAD)
    assert found == "kv_covers_scheduled", message
    assert "2 lookahead slot(s)" in message and "9 tokens" in message, message
    ahead = [*A_PREFILLED, ArBlocksAllocated("a", (3,)), ArScheduled("a", 3, drafts=2)]
    assert verdict([*ahead, ArStepEnd(1), ArDraftsVerified("a", 1)], LOOKAHEAD) == ("", "")


def test_a_step_allocates_no_more_than_the_lookahead_slots() -> None:
    """With lookahead slots a step that allocates to a request gives it blocks up to its
    tokens and slots and no further: a's step 0 (4 tokens and 2 slots) needs 2 blocks; a
    third allocated then is `kv_bounded`. Blocks a request keeps from rejected drafts are
    not the step's allocation and may exceed it."""
    over: list[ArEvent] = [
        ArSubmitted("a", 4, 6),
        ArBlocksAllocated("a", (1, 2, 3)),
        ArScheduled("a", 4),
    ]
    assert verdict(over, CFG) == ("", "")
    found, message = verdict(over, LOOKAHEAD)
    assert found == "kv_bounded", message
    assert "up to 3 for 0 computed + 4 scheduled tokens and 2 lookahead slot(s)" in message
    kept = [
        *A_PREFILLED,
        ArBlocksAllocated("a", (3,)),
        ArScheduled("a", 3, drafts=2),
        ArStepEnd(1),
        ArDraftsVerified("a", 0),  # 5 computed in 3 blocks, more than 5 + 1 + 2 need
        ArScheduled("a", 1),
        ArStepEnd(2),
    ]
    assert verdict(kept, LOOKAHEAD) == ("", "")


def test_lookahead_slots_stop_at_max_model_len() -> None:
    """vLLM caps the slots at `max_model_len`: a's 8 computed + 1 + 4 lookahead is 13 tokens,
    capped at 12, which its three blocks hold; a fourth would exceed `kv_bounded`."""
    config = ArConfig(
        block_size=4, num_blocks=9, max_num_batched_tokens=16, max_num_seqs=2, max_model_len=12
    ).replace(num_speculative_tokens=2, num_lookahead_tokens=4)
    events: list[ArEvent] = [
        ArSubmitted("a", 8, 4),
        ArBlocksAllocated("a", (1, 2, 3)),
        ArScheduled("a", 8),
        ArStepEnd(0),
        ArScheduled("a", 1),
        ArStepEnd(1),
    ]
    assert verdict(events, config) == ("", "")
    found, message = verdict(events, config.replace(max_model_len=13))
    assert found == "kv_covers_scheduled" and "13 tokens" in message, message


def test_drafting_rows_count_against_the_token_budget() -> None:
    """With `num_drafting_slots` = 1 (a draft model's input row) a step's tokens plus one row
    per scheduled request stay within `max_num_batched_tokens`: 8 + 7 tokens fit 16 alone,
    not with their 2 rows."""
    events: list[ArEvent] = [
        ArSubmitted("a", 8, 2),
        ArSubmitted("b", 7, 2),
        ArBlocksAllocated("a", (1, 2)),
        ArScheduled("a", 8),
        ArBlocksAllocated("b", (3, 4)),
        ArScheduled("b", 7),
        ArStepEnd(0),
    ]
    assert verdict(events, CFG) == ("", "")
    found, message = verdict(events, CFG.replace(num_drafting_slots=1))
    assert found == "token_budget", message
    assert "take 17 input rows (15 tokens and 1 drafting slot(s) per scheduled request)" in (
        message
    )
    fits = [*events[:4], ArBlocksAllocated("b", (3, 4)), ArScheduled("b", 6), ArStepEnd(0)]
    assert verdict(fits, CFG.replace(num_drafting_slots=1)) == ("", "")


def test_the_drafter_fields_in_the_header_and_their_bounds() -> None:
    """Both are written only when not 0 (a log without a drafter reads and writes as
    before); a negative value, or drafting rows that leave no room for a token, is refused."""
    plain = ar_config_to_dict(CFG)
    assert "num_lookahead_tokens" not in plain and "num_drafting_slots" not in plain
    drafted = CFG.replace(num_lookahead_tokens=2, num_drafting_slots=1)
    header = ar_config_to_dict(drafted)
    assert header["num_lookahead_tokens"] == 2 and header["num_drafting_slots"] == 1
    assert ar_config_from_dict(header)[0] == drafted
    with pytest.raises(ConfigError, match="num_lookahead_tokens"):
        CFG.replace(num_lookahead_tokens=-1)
    with pytest.raises(ConfigError, match=r"num_drafting_slots=16.*below max_num_batched_tokens"):
        CFG.replace(num_drafting_slots=16)


def test_the_twin_replays_a_drafters_slots_and_eagles_cache_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log whose scheduler reserves lookahead slots is replayed: the `vllm-v1` twin
    allocates them too (2 blocks for 4 tokens and 2 slots), and without them it would
    allocate 1. A log whose header keys cached blocks with the token after them
    (`hash_lookahead_tokens`, EAGLE's with prefix caching) gets a twin rebuilt to key them
    so, and says it took the setting."""
    log = tmp_path / "lookahead.jsonl"
    lookahead = LOOKAHEAD.replace(num_speculative_tokens=0)
    log.write_text("".join(log_of(A_PREFILLED, lookahead)))
    assert main(["check-trace", str(log), "--twin", "vllm-v1"]) == 0
    capsys.readouterr()
    log.write_text("".join(log_of(A_PREFILLED, lookahead.replace(num_lookahead_tokens=0))))
    assert main(["check-trace", str(log), "--twin", "vllm-v1"]) == 1  # 2 blocks, not 1
    capsys.readouterr()
    caching = lookahead.replace(enable_prefix_caching=True)
    log.write_text("".join(log_of(A_PREFILLED, caching, ArPolicy(hash_lookahead_tokens=1))))
    assert main(["check-trace", str(log)]) == 0
    capsys.readouterr()
    assert main(["check-trace", str(log), "--twin", "vllm-v1-prefix"]) == 0
    out, _ = capsys.readouterr()
    assert "(with hash_lookahead_tokens=1) decides alike" in out, out
