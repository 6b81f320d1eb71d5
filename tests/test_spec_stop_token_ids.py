"""Token ids other than the EOS that end a request (`Submitted.stop_token_ids`).

SGLang's and vLLM's `stop_token_ids` sampling parameter ends a request at the first of them it
generates, as the EOS does, and cuts the output after it; SGLang reports the finish as
`FINISH_MATCHED_TOKEN`, the spec as STOP. The spec evaluates them itself: the request must
finish right after the block that commits the first token that ends it (an EOS or one of them,
within max_new_tokens), with that token's reason, and its output is cut after it. With
`ignore_eos` no token ends a request (SGLang's `_check_token_based_finish` returns before it
looks). Each test here breaks one part of that and names the violation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from properties.decisions import operations
from properties.workload import Submit
from schedspec_cli.main import main
from spec import (
    Admitted,
    ControlReturned,
    Finished,
    FinishReason,
    KvFreed,
    RequestSpec,
    RowReleased,
    SpecViolation,
    Submitted,
    finish_of,
    output_of,
)
from spec.config import validate_request
from spec.errors import InvalidRequest
from spec.events import Event
from spec.snapshot import FinishedOutput
from spec.trace import TraceFormatError, event_from_dict, event_to_dict
from tests.event_runs import (
    SMALL_SYNC,
    block,
    replay,
    run_to_length,
    twin_replay,
    violation_of,
    write_log,
)

EOS, STOP = 9, 7
CFG = SMALL_SYNC.replace(eos_token_id=EOS)


def submitted(**flags: object) -> Submitted:
    return Submitted("a", (3, 4), 4, stop_token_ids=(STOP,), **flags)  # type: ignore[arg-type]


def stop_run(
    first: Submitted | None = None,
    tokens: tuple[int, int] = (STOP, 5),
    reason: FinishReason = FinishReason.STOP,
) -> list[Event]:
    """`a` (prompt 2 tokens, 4 new, stop token id 7) commits its prompt block in round 0 and
    an output block `tokens` in round 1, then finishes with `reason`."""
    return [
        first or submitted(),
        Admitted("a", 0),
        *block("a", 0, (3, 4), (0, 1)),
        ControlReturned(0),
        *block("a", 1, tokens, (2, 3)),
        KvFreed("a", (0, 1, 2, 3)),
        RowReleased("a", 0),
        Finished("a", reason),
        ControlReturned(1),
    ]


def past_stop_run(first: Submitted) -> list[Event]:
    """`a` runs past the stop token id in its first output block to max_new_tokens (LENGTH)."""
    return run_to_length(first, (STOP, 5), (6, STOP))


def test_a_request_stops_at_its_stop_token_id_and_its_output_is_cut_after_it() -> None:
    m = replay(CFG, stop_run())
    assert m.is_idle()
    assert m.outputs() == {"a": (STOP,)}
    m.check_outputs({"a": FinishedOutput((STOP,), FinishReason.STOP)})


def test_an_output_past_the_stop_token_breaks_reported_output() -> None:
    m = replay(CFG, stop_run())
    with pytest.raises(SpecViolation) as info:
        m.check_outputs({"a": FinishedOutput((STOP, 5), FinishReason.STOP)})
    assert info.value.rule == "reported_output"
    assert "the spec's output is 1 tokens [7]" in str(info.value)


def test_a_stop_without_stop_token_ids_breaks_finish_condition() -> None:
    v = violation_of(CFG, stop_run(Submitted("a", (3, 4), 4)))
    assert v.rule == "finish_condition"
    assert "it has no stop_token_ids" in str(v) and "valid: the reason" in str(v)
    assert v.event == Finished("a", FinishReason.STOP)


def test_running_past_the_stop_token_breaks_fdfo_releases_same_round() -> None:
    v = violation_of(CFG, past_stop_run(submitted()))
    assert v.rule == "fdfo_releases_same_round"
    assert v.event == ControlReturned(1)


@pytest.mark.parametrize("reason", [FinishReason.EOS, FinishReason.LENGTH])
def test_another_reason_at_the_stop_token_breaks_finish_condition(reason: FinishReason) -> None:
    v = violation_of(CFG, stop_run(reason=reason))
    assert v.rule == "finish_condition"
    assert f"reason {reason.value}; the condition that holds is stop" in str(v)


@pytest.mark.parametrize(
    ("tokens", "reason", "output"),
    [((STOP, EOS), FinishReason.STOP, (STOP,)), ((EOS, STOP), FinishReason.EOS, (EOS,))],
)
def test_the_first_ending_token_of_a_block_decides(
    tokens: tuple[int, int], reason: FinishReason, output: tuple[int, ...]
) -> None:
    """An EOS and a stop token id in one block: the earlier one gives the reason and the cut;
    the other reason is refused."""
    m = replay(CFG, stop_run(tokens=tokens, reason=reason))
    assert m.outputs() == {"a": output}
    other = FinishReason.EOS if reason is FinishReason.STOP else FinishReason.STOP
    v = violation_of(CFG, stop_run(tokens=tokens, reason=other))
    assert v.rule == "finish_condition"
    if other is FinishReason.STOP:
        assert "none of its stop_token_ids [7] is the first committed token" in str(v)


def test_with_ignore_eos_a_stop_token_id_ends_nothing() -> None:
    """SGLang matches no token of a request that ignores EOS: it runs to max_new_tokens and
    its output keeps the stop tokens; a STOP at one is refused."""
    m = replay(CFG, past_stop_run(submitted(ignore_eos=True)))
    assert m.outputs() == {"a": (STOP, 5, 6, STOP)}
    v = violation_of(CFG, stop_run(submitted(ignore_eos=True)))
    assert v.rule == "finish_condition"
    assert "no stop token id ends it under ignore_eos" in str(v)


def test_a_sampled_stop_may_still_come_first() -> None:
    """With `stop_sampled` as well, a STOP may end the request before its stop token id, and
    the output may be cut anywhere in the last block up to the stop token."""
    m = replay(CFG, stop_run(submitted(stop_sampled=True), tokens=(5, STOP)))
    m.check_outputs({"a": FinishedOutput((5,), FinishReason.STOP)})
    m = replay(CFG, stop_run(submitted(stop_sampled=True), tokens=(5, 6)))
    m.check_outputs({"a": FinishedOutput((5, 6), FinishReason.STOP)})


def test_finish_of_and_output_of() -> None:
    request = RequestSpec("a", (3, 4), 4, stop_token_ids=(STOP,))
    assert finish_of(CFG, request, (5, STOP, EOS)) == (FinishReason.STOP, (5, STOP))
    assert finish_of(CFG, request, (5, 6)) is None
    assert output_of(CFG, request, (5, 6, STOP)) == (5, 6, STOP)
    beyond = RequestSpec("a", (3, 4), 2, stop_token_ids=(STOP,))
    assert finish_of(CFG, beyond, (5, 6, STOP)) == (FinishReason.LENGTH, (5, 6))
    ignoring = RequestSpec("a", (3, 4), 4, ignore_eos=True, stop_token_ids=(STOP,))
    assert finish_of(CFG, ignoring, (STOP, EOS, 1, 2)) == (FinishReason.LENGTH, (STOP, EOS, 1, 2))


@pytest.mark.parametrize(
    ("ids", "says"),
    [
        ((EOS,), "cannot list the EOS, which ends it already"),
        ((CFG.mask_token_id,), "token ids must be integers >= 0"),
        ((STOP, STOP), "is listed twice"),
        ((True,), "token ids must be integers >= 0"),
        ("7", "a sequence of token ids"),
    ],
)
def test_invalid_stop_token_ids_are_refused_saying_what_is_valid(ids: object, says: str) -> None:
    request = RequestSpec("a", (1,), 2, stop_token_ids=ids)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="stop_token_ids") as info:
        validate_request(CFG, request)
    assert says in str(info.value)


def test_a_submitted_event_with_invalid_stop_token_ids_breaks_valid_request() -> None:
    v = violation_of(CFG, [Submitted("a", (1,), 2, stop_token_ids=(EOS,))])
    assert v.rule == "valid_request"
    assert "stop_token_ids=9" in str(v)


def test_stop_token_ids_are_written_only_when_set_and_read_back() -> None:
    plain, stopping = Submitted("a", (1,), 2), Submitted("b", (1,), 2, stop_token_ids=(4, 2))
    assert "stop_token_ids" not in event_to_dict(plain)
    assert event_to_dict(stopping)["stop_token_ids"] == [4, 2]
    for e in (plain, stopping):
        assert event_from_dict(json.loads(json.dumps(event_to_dict(e)))) == e
    explicit = {"kind": "submitted", "request_id": "a", "prompt": [1], "max_new_tokens": 2}
    assert event_from_dict({**explicit, "stop_token_ids": []}) == plain
    with pytest.raises(TraceFormatError, match="'stop_token_ids' is 7: a list of integers"):
        event_from_dict({**explicit, "stop_token_ids": 7}, 3)


def test_the_reference_and_its_golden_decoder_stop_at_a_stop_token_id() -> None:
    """The reference replaying the run (`RecordedOracle`) stops the request at its stop token
    only when it lists it; its events conform either way, and the golden decoder agrees."""
    record = past_stop_run(Submitted("a", (3, 4), 4))
    for ids, want in (
        ((STOP,), FinishedOutput((STOP,), FinishReason.STOP)),
        ((), FinishedOutput((STOP, 5, 6, STOP), FinishReason.LENGTH)),
    ):
        request = RequestSpec("a", (3, 4), 4, stop_token_ids=ids)
        events, outputs, golden = twin_replay(CFG, record, request)
        assert outputs == {"a": want}
        assert golden == want
        assert events[0] == Submitted("a", (3, 4), 4, stop_token_ids=ids)


def test_the_ids_survive_the_round_trip_to_operations() -> None:
    (first, *_) = operations(stop_run())
    assert first == Submit(RequestSpec("a", (3, 4), 4, stop_token_ids=(STOP,)))


def test_check_trace_accepts_a_stop_at_a_stop_token_id_and_names_the_missing_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`schedspec check-trace` on the run, as a log with its header: it conforms (exit 0),
    alone and against `--twin reference-dllm`; without its `stop_token_ids` it fails at the
    `Finished` line (exit 1)."""
    good = write_log(tmp_path, CFG, stop_run())
    assert main(["check-trace", str(good)]) == 0
    assert main(["check-trace", str(good), "--twin", "reference-dllm"]) == 0
    capsys.readouterr()
    bad = write_log(tmp_path, CFG, stop_run(Submitted("a", (3, 4), 4)))
    assert main(["check-trace", str(bad)]) == 1
    out = capsys.readouterr().out
    line = 2 + stop_run().index(Finished("a", FinishReason.STOP))
    assert f":{line}: [finish_condition]" in out, out
