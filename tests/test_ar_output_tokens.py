"""`ArOutputTokens`: a log names the ids of the outputs its requests produced (rule
`output_tokens`), so the prefix cache keys the blocks holding them by content.

vLLM hashes output tokens into its block hashes as it hashes prompt tokens: a conversation's
next turn, whose prompt is the earlier turn's prompt and outputs, hits the blocks holding those
outputs. Until the event existed the spec kept every output private to its request, and the
check reported such a hit as `cache_hit_cached` (a false violation on every multi-turn log).
An output no event names stays private; a block registered while its outputs were private is
keyed afresh when they are named. The live vLLM logs are `test_real_vllm_event_log_multi_turn`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from properties.ar.decisions import NamedOutputHits, operations
from properties.ar.harness import ArHarness, ArSubmit
from properties.ar.trace_check import check_ar_trace
from reference.ar.prefix_cache import VLLM_V1_PREFIX, PrefixCachingVllmV1, make_vllm_v1_prefix
from reference.ar.vllm_v1 import VLLM_033
from schedspec_cli.main import main
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig, ArRequest, validate_ar_request
from spec.ar.events import (
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheHit,
    ArDraftsVerified,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArOutputTokens,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.machine import ArSpecMachine
from spec.errors import CannotDrive, InvalidRequest, SpecViolation
from spec.implementation import ArImplementation
from spec.trace import TraceFormatError
from tests.test_ar_free_keeps_computed import log_of, verdict
from tests.test_ar_hash_lookahead import AHEAD, CONFIG  # blocks of 4, prefix caching

PROMPT = (1, 2, 3, 4)  # a's prompt: block 1
OUTPUTS = (101, 102, 103, 104, 105)  # a's outputs; block 2 holds the first four


def a_converses(names: Mapping[int, tuple[int, ...]]) -> list[ArEvent]:
    """a (prompt PROMPT, 5 outputs) computes its prompt in step 0 and one token a step in steps
    1 to 4, then finishes: block 2, holding its outputs 1 to 4, is full and cached when step 4
    schedules it. After step i the log names the output ids `names[i]`, if any."""
    steps: list[list[ArEvent]] = [
        [ArBlocksAllocated("a", (1,)), ArScheduled("a", 4)],
        [ArBlocksAllocated("a", (2,)), ArScheduled("a", 1)],
        [ArScheduled("a", 1)],
        [ArScheduled("a", 1)],
        [ArScheduled("a", 1)],
    ]
    events: list[ArEvent] = [ArSubmitted("a", 4, 5, prompt=PROMPT)]
    for i, step in enumerate(steps):
        events += [*step, ArStepEnd(i)]
        if i in names:
            events.append(ArOutputTokens("a", names[i]))
    return [*events, ArBlocksFreed("a", (1, 2)), ArFinished("a", ArFinishReason.LENGTH)]


EACH_STEP: dict[int, tuple[int, ...]] = {
    i: (t,) for i, t in enumerate(OUTPUTS)
}  # each output named after its step


def b_continues(talk: tuple[int, ...], hit: tuple[int, ...]) -> list[ArEvent]:
    """b, the next turn (prompt `talk` then its own token 200), hits `hit` in step 5."""
    return [
        ArSubmitted("b", len(talk) + 1, 1, prompt=(*talk, 200)),
        ArCacheHit("b", hit),
        ArBlocksAllocated("b", (3,)),
        ArScheduled("b", len(talk) + 1 - 4 * len(hit)),
        ArStepEnd(5),
    ]


def test_a_next_turn_hits_the_blocks_holding_named_outputs() -> None:
    """Named, a's outputs key block 2 by their ids: b's prompt continues them and hits it."""
    talk = PROMPT + OUTPUTS[:4]
    assert verdict([*a_converses(EACH_STEP), *b_continues(talk, (1, 2))], CONFIG) == ("", "")


def test_outputs_never_named_stay_private() -> None:
    """Without the event, block 2 holds a's private outputs: b's hit on it is not its prefix
    (the verdict every multi-turn log got before the event)."""
    rule, message = verdict([*a_converses({}), *b_continues(PROMPT + OUTPUTS[:4], (1, 2))], CONFIG)
    assert rule == "cache_hit_cached", message
    assert "claims block 2 as its prefix block 1" in message, message
    # its prompt's block is hit all the same
    assert verdict([*a_converses({}), *b_continues(PROMPT, (1,))], CONFIG) == ("", "")


def test_a_wrong_id_is_not_the_content() -> None:
    """The ids count: a's fourth output named 999 is not the 104 b's prompt continues with."""
    names = {**EACH_STEP, 3: (999,)}
    rule, message = verdict([*a_converses(names), *b_continues(PROMPT + OUTPUTS[:4], (1, 2))])
    assert rule == "cache_hit_cached", message


def test_blocks_cached_before_their_outputs_are_named_are_keyed_afresh() -> None:
    """With drafts, the verification caches block 2 (a's output 1 and its three accepted
    drafts, outputs 2 to 4) before the update phase names outputs 2 to 5: named, block 2 is
    keyed by them and b hits it; the cache's key of block 2 is not the one it had before."""
    drafting = CONFIG.replace(num_speculative_tokens=3)
    events: list[ArEvent] = [
        ArSubmitted("a", 4, 5, prompt=PROMPT),
        ArBlocksAllocated("a", (1,)),
        ArScheduled("a", 4),
        ArStepEnd(0),
        ArOutputTokens("a", OUTPUTS[:1]),
        ArBlocksAllocated("a", (2,)),
        ArScheduled("a", 4, drafts=3),  # output 1, then three drafts
        ArStepEnd(1),
        ArDraftsVerified("a", 3),  # 8 computed: block 2 full and cached, 5 outputs
    ]
    names: list[ArEvent] = [ArOutputTokens("a", OUTPUTS[1:])]
    done: list[ArEvent] = [ArBlocksFreed("a", (1, 2)), ArFinished("a", ArFinishReason.LENGTH)]
    b: list[ArEvent] = [
        ArSubmitted("b", 9, 1, prompt=(*PROMPT, *OUTPUTS[:4], 200)),
        ArCacheHit("b", (1, 2)),
        ArBlocksAllocated("b", (3,)),
        ArScheduled("b", 1),
        ArStepEnd(2),
    ]
    assert verdict([*events, *names, *done, *b], drafting) == ("", "")
    rule, message = verdict([*events, *done, *b], drafting)
    assert rule == "cache_hit_cached", message
    machine = ArSpecMachine(drafting)
    for e in events:
        machine.apply(e)
    private = machine.state().cached[2]
    machine.apply(names[0])
    machine.check_invariants_full()
    assert machine.state().cached[2] != private


def test_blocks_freed_before_the_names_are_keyed_afresh_too() -> None:
    """a, finishing, frees its blocks before the log names its last output (the update phase
    allows either order): with lookahead keys block 2's covers that output, and the freed
    block, still cached, is keyed by it all the same."""
    names = dict(EACH_STEP)
    del names[4]
    events = a_converses(names)
    events.insert(-1, ArOutputTokens("a", OUTPUTS[4:]))  # after the frees, before the finish
    whole = [*events, *b_continues(PROMPT + OUTPUTS, (1, 2))]
    assert verdict(whole, CONFIG, AHEAD) == ("", "")
    unnamed = [*a_converses(names), *b_continues(PROMPT + OUTPUTS, (1, 2))]
    rule, message = verdict(unnamed, CONFIG, AHEAD)
    assert rule == "cache_hit_cached", message


def test_lookahead_keys_of_the_block_before_the_outputs_take_the_named_id() -> None:
    """With `hash_lookahead_tokens` = 1, block 1's key covers a's first output (published when
    step 0 sampled it, still private): named later, it is keyed by its id, and a next turn
    whose prompt ends one token into the outputs hits block 1."""
    talk = PROMPT + OUTPUTS[:1]
    events = [*a_converses(EACH_STEP), *b_continues(talk, (1,))]
    assert verdict(events, CONFIG, AHEAD) == ("", "")
    rule, message = verdict([*a_converses({}), *b_continues(talk, (1,))], CONFIG, AHEAD)
    assert rule == "cache_hit_cached", message
    # block 2's key covers output 5 too: named, the next turn that continues all of them hits
    # both blocks
    whole = [*a_converses(EACH_STEP), *b_continues(PROMPT + OUTPUTS, (1, 2))]
    assert verdict(whole, CONFIG, AHEAD) == ("", "")


@pytest.mark.parametrize(
    ("events", "rule", "says"),
    [
        (  # step 0 produced one output; the log names two
            [*a_converses({})[:4], ArOutputTokens("a", (101, 102))],
            "output_tokens",
            "names the id of its output 1..2 but has produced 1",
        ),
        (  # named again past what it produced
            [*a_converses(EACH_STEP)[:9], ArOutputTokens("a", (102,))],
            "output_tokens",
            "names the id of its output 3 but has produced 2",
        ),
        (  # named a step late
            [*a_converses({})[:7], ArOutputTokens("a", OUTPUTS[:2])],
            "output_tokens",
            "names the id of its output 1..2, produced in an earlier step (2 outputs, 0 named)",
        ),
        (  # output 2 named after step 2, which produced output 3
            [*a_converses({0: OUTPUTS[:1]})[:10], ArOutputTokens("a", OUTPUTS[1:2])],
            "output_tokens",
            "produced in an earlier step (3 outputs, 1 named)",
        ),
        (  # inside step 1's schedule phase
            [*a_converses({})[:5], ArOutputTokens("a", (101,))],
            "output_tokens",
            "inside step 1's schedule phase",
        ),
        (  # after it finished
            [*a_converses({}), ArOutputTokens("a", OUTPUTS)],
            "known_request",
            "request 'a' is finished",
        ),
        (  # of a request never submitted
            [*a_converses({})[:4], ArOutputTokens("z", (1,))],
            "known_request",
            "was never submitted",
        ),
    ],
)
def test_a_misplaced_naming_breaks_its_rule(events: list[ArEvent], rule: str, says: str) -> None:
    got, message = verdict(events, CONFIG)
    assert got == rule, message
    assert says in message, message


def test_ids_are_integers() -> None:
    """Through the Python API a non-integer id breaks `output_tokens`; in a log it is a format
    error (exit 2), as a non-integer prompt id is."""
    machine = ArSpecMachine(CONFIG)
    for e in a_converses({})[:4]:
        machine.apply(e)
    with pytest.raises(SpecViolation, match=r"output ids \['x'\] are not integers") as caught:
        machine.apply(ArOutputTokens("a", ("x",)))  # type: ignore[arg-type]
    assert caught.value.rule == "output_tokens"
    lines = log_of(a_converses({})[:4], CONFIG)
    bad = '{"kind": "ar_output_tokens", "request_id": "a", "tokens": [101, "x"]}\n'
    with pytest.raises(TraceFormatError, match=r"ar_output_tokens\.tokens"):
        check_ar_trace([*lines, bad])


def test_without_prefix_caching_names_are_checked_and_change_nothing() -> None:
    plain = CONFIG.replace(enable_prefix_caching=False)
    assert verdict(a_converses(EACH_STEP), plain) == ("", "")
    rule, message = verdict([*a_converses({})[:4], ArOutputTokens("a", (1, 2))], plain)
    assert rule == "output_tokens", message


def test_named_output_hits_finds_a_hit_on_another_requests_outputs() -> None:
    """The twin's guard: a hit reaching past a's prompt into its first named output, by a
    request whose tokens (prompt, then its own named outputs) continue them."""
    seen = NamedOutputHits(block_size=4)
    seen.submitted(ArSubmitted("a", 4, 5, prompt=PROMPT))
    seen.submitted(ArSubmitted("u", 4, 5))  # no prompt ids: shares nothing
    seen.named(ArOutputTokens("u", (101,)))
    seen.named(ArOutputTokens("a", OUTPUTS[:2]))
    seen.named(ArOutputTokens("a", OUTPUTS[2:]))  # only the first output counts
    for n, (prompt, hit, covered) in enumerate(
        [
            ((*PROMPT, *OUTPUTS[:4], 7), (1, 2), "a"),
            ((*PROMPT, *OUTPUTS[:4], 7), (1,), None),  # the prompt's block only
            ((*PROMPT, 101, 7, 7, 7, 7), (1, 2), "a"),
            ((*PROMPT, 7, 7, 7, 7, 7), (1, 2), None),  # the prompt, then its own tokens
            ((9, 2, 3, 4, 101, 102, 103, 104, 7), (1, 2), None),
        ]
    ):
        rid = f"b{n}"
        seen.submitted(ArSubmitted(rid, len(prompt), 1, prompt=prompt))
        assert seen.covered_by(ArCacheHit(rid, hit)) == covered, (prompt, hit)
    # a's own hit (a preempted request taking back its blocks) is no other's
    assert seen.covered_by(ArCacheHit("a", (1, 2))) is None
    # with lookahead keys the block before the outputs covers the first of them
    ahead = NamedOutputHits(block_size=4, hash_lookahead_tokens=1)
    ahead.submitted(ArSubmitted("a", 4, 5, prompt=PROMPT))
    ahead.named(ArOutputTokens("a", OUTPUTS[:1]))
    ahead.submitted(ArSubmitted("b", 6, 1, prompt=(*PROMPT, 101, 7)))
    assert ahead.covered_by(ArCacheHit("b", (1,))) == "a"
    # a request whose own named output equals a's, taking a's block after a preemption
    same = NamedOutputHits(block_size=4)
    for rid in ("a", "c"):
        same.submitted(ArSubmitted(rid, 4, 5, prompt=PROMPT))
        same.named(ArOutputTokens(rid, OUTPUTS[:4]))
    assert same.covered_by(ArCacheHit("c", (1, 2))) == "a"


class KeepsOutputsPrivate(PrefixCachingVllmV1):
    """A twin of the user's own that samples outputs of its own: it sets no
    `names_outputs`."""

    names_outputs = False


def _keeps_outputs_private(config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    return KeepsOutputsPrivate(config, sink, VLLM_033)


#: `--twin tests.test_ar_output_tokens:OUTPUTS_PRIVATE`: vllm-v1-prefix keeping outputs private.
OUTPUTS_PRIVATE = ArImplementation(_keeps_outputs_private, VLLM_V1_PREFIX.profile)


def next_turn(submitted: str) -> list[ArEvent]:
    """a's run naming each output, then b, whose prompt continues a's prompt and first four
    outputs, hitting their blocks and finishing; b submitted after a's names or before them
    (it waits for the only seat)."""
    a_run = a_converses(EACH_STEP)
    b = [
        *b_continues(PROMPT + OUTPUTS[:4], (1, 2)),
        ArBlocksFreed("b", (1, 2, 3)),
        ArFinished("b", ArFinishReason.LENGTH),
    ]
    if submitted == "after a's names":
        return [*a_run, *b]
    return [a_run[0], b[0], *a_run[1:], *b[1:]]


@pytest.mark.parametrize("submitted", ["after a's names", "before a's names"])
def test_a_reference_twin_replays_a_hit_on_named_outputs(
    submitted: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reference twins sample the outputs the log names (`ArRequest.outputs`, from
    `operations(..., replay_outputs=True)`) and name them: vllm-v1-prefix takes b's hit on
    a's output blocks and decides alike, however early b was submitted. A twin that sets no
    `names_outputs` samples outputs of its own, which no prompt continues: `--twin` exits 2
    with one line, and the operations without `replay_outputs` refuse the hit."""
    one_seat = CONFIG.replace(max_num_seqs=1)
    events = next_turn(submitted)
    assert verdict(events, one_seat) == ("", "")
    ops = operations(events, None, one_seat, replay_outputs=True)
    scripted = {op.request.request_id: op.request.outputs for op in ops if isinstance(op, ArSubmit)}
    assert scripted == {"a": OUTPUTS, "b": None}
    log = tmp_path / "next_turn.jsonl"
    log.write_text("".join(log_of(events, one_seat)))
    assert main(["check-trace", str(log), "--twin", "vllm-v1-prefix"]) == 0
    out, _ = capsys.readouterr()
    assert "its twin vllm-v1-prefix decides alike in all 6 steps" in out, out
    says = "the cache hit of 'b' takes blocks holding outputs of 'a'"
    with pytest.raises(CannotDrive, match=says):
        operations(events, None, one_seat)
    assert (
        main(["check-trace", str(log), "--twin", "tests.test_ar_output_tokens:OUTPUTS_PRIVATE"])
        == 2
    )
    out, err = capsys.readouterr()
    assert says in err and "names_outputs" in err, err
    assert len(err.strip().splitlines()) == 1, err
    alone = tmp_path / "named.jsonl"
    alone.write_text("".join(log_of(a_converses(EACH_STEP), one_seat)))
    assert (
        main(["check-trace", str(alone), "--twin", "tests.test_ar_output_tokens:OUTPUTS_PRIVATE"])
        == 0
    )


def test_a_scripted_output_is_named_with_prefix_caching_only() -> None:
    """The reference samples a request's scripted outputs (`ArRequest.outputs`) and, with
    prefix caching, names each in its step's update phase (`ArOutputTokens`); the spec checks
    the names. Without prefix caching it names none. A bad `outputs` is refused."""
    for caching in (True, False):
        config = CONFIG.replace(enable_prefix_caching=caching)
        harness = ArHarness(make_vllm_v1_prefix, config)
        harness.submit(ArRequest("a", 4, 3, prompt=PROMPT, outputs=(101, 102)))
        harness.drain()
        assert harness.violation is None, harness.violation
        named = [e.tokens for e in harness.events if isinstance(e, ArOutputTokens)]
        assert named == ([(101,), (102,)] if caching else []), named
    for bad in ((101, 102, 103, 104), (101, "x"), [101]):
        with pytest.raises(InvalidRequest, match="outputs"):
            validate_ar_request(CONFIG, ArRequest("a", 4, 3, outputs=bad))  # type: ignore[arg-type]
