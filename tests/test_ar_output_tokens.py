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

from properties.ar.decisions import Continuations, operations
from properties.ar.trace_check import check_ar_trace
from schedspec_cli.main import main
from spec.ar.config import ArConfig
from spec.ar.events import (
    ArBlocksAllocated,
    ArBlocksFreed,
    ArCacheHit,
    ArEvent,
    ArFinished,
    ArFinishReason,
    ArOutputTokens,
    ArScheduled,
    ArStepEnd,
    ArSubmitted,
)
from spec.ar.machine import ArSpecMachine
from spec.ar.profile import ArPolicy
from spec.errors import CannotDrive, SpecViolation
from spec.trace import TraceFormatError
from tests.test_ar_free_keeps_computed import log_of, verdict

CONFIG = ArConfig(
    block_size=4, num_blocks=9, max_num_batched_tokens=16, max_num_seqs=2, max_model_len=32
).replace(enable_prefix_caching=True)
AHEAD = ArPolicy(hash_lookahead_tokens=1)
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


def test_ids_named_after_their_block_was_cached_key_it_afresh() -> None:
    """All five named at once after step 4, where block 2 was cached in step 4's schedule while
    its outputs were private: it is keyed by them now, and b hits it."""
    names = {4: OUTPUTS}
    talk = PROMPT + OUTPUTS[:4]
    assert verdict([*a_converses(names), *b_continues(talk, (1, 2))], CONFIG) == ("", "")
    machine = ArSpecMachine(CONFIG)
    for e in a_converses(names)[:-2]:
        machine.apply(e)
    machine.check_invariants_full()
    cached = machine.state().cached
    assert set(cached) == {1, 2}, cached
    before = ArSpecMachine(CONFIG)
    for e in a_converses({})[:-2]:
        before.apply(e)
    # block 2's key changed with the names, block 1's (the prompt's) did not
    assert before.state().cached[1] == cached[1] and before.state().cached[2] != cached[2]


def test_lookahead_keys_of_the_block_before_the_outputs_take_the_named_id() -> None:
    """With `hash_lookahead_tokens` = 1, block 1's key covers a's first output (published when
    step 0 sampled it, still private): named later, it is keyed by its id, and a next turn
    whose prompt ends one token into the outputs hits block 1."""
    talk = PROMPT + OUTPUTS[:1]
    late = {2: OUTPUTS[:3], 3: OUTPUTS[3:4], 4: OUTPUTS[4:]}
    for names in (EACH_STEP, late):
        events = [*a_converses(names), *b_continues(talk, (1,))]
        assert verdict(events, CONFIG, AHEAD) == ("", ""), names
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
            "names the ids of outputs 1..2 but has produced 1",
        ),
        (  # named again past what it produced
            [*a_converses(EACH_STEP)[:9], ArOutputTokens("a", (102,))],
            "output_tokens",
            "names the ids of outputs 3..3 but has produced 2",
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


def test_continuations_finds_a_prompt_that_continues_named_outputs() -> None:
    """The twin's guard: a prompt continuing a's prompt into its first named output."""
    seen = Continuations()
    seen.submitted(ArSubmitted("a", 4, 5, prompt=PROMPT))
    seen.submitted(ArSubmitted("u", 4, 5))  # no prompt ids: shares nothing
    seen.named(ArOutputTokens("u", (101,)))
    assert seen.continued_by(ArSubmitted("b", 6, 1, prompt=(*PROMPT, 101, 7))) is None
    seen.named(ArOutputTokens("a", OUTPUTS[:2]))
    seen.named(ArOutputTokens("a", OUTPUTS[2:]))  # only the first output counts
    for prompt, continued in [
        ((*PROMPT, 101), "a"),
        ((*PROMPT, 101, 102, 7), "a"),
        ((*PROMPT, 7), None),  # the prompt only: no output continued
        ((*PROMPT,), None),
        ((9, 2, 3, 4, 101), None),
        ((101,), None),
    ]:
        assert seen.continued_by(ArSubmitted("b", len(prompt), 1, prompt=prompt)) == continued


def test_no_twin_replays_a_next_turn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A twin samples outputs of its own, which no prompt continues: `--twin` exits 2 with one
    line on a log whose prompt continues named outputs, and replays a log that only names
    them."""
    talk = PROMPT + OUTPUTS[:4]
    events = [*a_converses(EACH_STEP), *b_continues(talk, (1, 2))]
    with pytest.raises(CannotDrive, match="'b''s prompt continues 'a''s prompt and outputs"):
        operations(events)
    log = tmp_path / "next_turn.jsonl"
    log.write_text("".join(log_of(events, CONFIG)))
    assert main(["check-trace", str(log)]) == 0
    capsys.readouterr()
    assert main(["check-trace", str(log), "--twin", "vllm-v1-prefix"]) == 2
    out, err = capsys.readouterr()
    assert "OK" not in out, out
    assert "continues 'a''s prompt and outputs" in err, err
    assert len(err.strip().splitlines()) == 1, err
    alone = tmp_path / "named.jsonl"
    alone.write_text("".join(log_of(a_converses(EACH_STEP), CONFIG)))
    assert main(["check-trace", str(alone), "--twin", "vllm-v1-prefix"]) == 0
