"""Ends an engine decides right after a commit: a stop the spec cannot see
(`Submitted.stop_sampled`, `FinishReason.STOP`) and an abort inside the round
(`DllmPolicy.aborts_after_commit`).

An engine that also ends requests on stop strings, a regex or a grammar (SGLang's
`FINISH_MATCHED_STR`, say) says so at submission (stop token ids the spec evaluates itself:
tests/test_spec_stop_token_ids.py); such a request may finish with STOP in a
round in which it committed a block holding a generated token, and its output is then cut
inside that block. An engine whose pending aborts take effect after a commit (SGLang's
`to_finish`) declares `aborts_after_commit`, and may then abort there too. Each test here
breaks one part of these rules and names the violation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from properties.decisions import operations
from properties.trace_check import check_trace
from properties.workload import Abort, Round, Submit
from reference.dllm import ReferenceDllmScheduler, replaying_twin
from reference.oracle import RecordedOracle, RecordExhausted
from schedspec_cli.main import main
from spec import (
    Aborted,
    Admitted,
    BlockCommitted,
    ControlReturned,
    Finished,
    FinishReason,
    Forward,
    ForwardRow,
    KvAllocated,
    KvFreed,
    RequestSpec,
    RowReleased,
    SpecMachine,
    SpecViolation,
    StepResult,
    Submitted,
)
from spec.config import validate_request
from spec.errors import InvalidRequest
from spec.events import Event
from spec.profile import DllmPolicy
from spec.snapshot import FinishedOutput
from spec.trace import TraceFormatError, config_to_dict, event_from_dict, event_to_dict
from tests.event_runs import SMALL_SYNC, replay, violation_of, write_log

CFG = SMALL_SYNC


def block(
    rid: str, k: int, tokens: tuple[int, int], slots: tuple[int, int], masked: int = 2
) -> list[Event]:
    """Block k of `rid` (`masked` positions past its prompt) allocated, unmasked by one
    forward, done after the final-KV forward, and committed (sync: all in one round)."""
    return [
        KvAllocated(rid, k, slots),
        Forward((ForwardRow(rid, k, False, 2, masked),)),
        StepResult(rid, k, 0, 0),
        Forward((ForwardRow(rid, k, False, 2, 0),)),
        StepResult(rid, k, 2, 0),
        BlockCommitted(rid, k, tokens),
    ]


def prompt_block(rid: str, tokens: tuple[int, int], slots: tuple[int, int]) -> list[Event]:
    """Block 0 of `rid`, the prompt alone (no mask to fill)."""
    return [
        KvAllocated(rid, 0, slots),
        Forward((ForwardRow(rid, 0, False, 2, 0),)),
        StepResult(rid, 0, 2, 0),
        BlockCommitted(rid, 0, tokens),
    ]


def ending(rid: str, slots: tuple[int, ...], reason: FinishReason) -> list[Event]:
    return [KvFreed(rid, slots), RowReleased(rid, 0), Finished(rid, reason)]


def stopped_run(stop_sampled: bool = True) -> list[Event]:
    """`s` (prompt 2 tokens, up to 6 new) commits its prompt block in round 0 and one output
    block in round 1, then finishes with STOP: two of its six tokens generated, no EOS."""
    return [
        Submitted("s", (3, 4), 6, stop_sampled=stop_sampled),
        Admitted("s", 0),
        *prompt_block("s", (3, 4), (0, 1)),
        ControlReturned(0),
        *block("s", 1, (8, 9), (2, 3)),
        *ending("s", (0, 1, 2, 3), FinishReason.STOP),
        ControlReturned(1),
    ]


def test_a_sampled_stop_finishes_a_request_right_after_its_commit() -> None:
    m = replay(CFG, stopped_run())
    assert m.is_idle()
    assert m.outputs() == {"s": (8, 9)}
    m.check_outputs({"s": FinishedOutput((8,), FinishReason.STOP)})  # cut inside the block


def test_stop_without_stop_sampled_breaks_finish_condition() -> None:
    v = violation_of(CFG, stopped_run(stop_sampled=False))
    assert v.rule == "finish_condition"
    assert "not submitted with stop_sampled" in str(v)
    assert v.event == Finished("s", FinishReason.STOP)


def test_stop_in_a_round_without_a_commit_breaks_finish_condition() -> None:
    """The stop is found in the tokens a round commits: a round later there are none."""
    events = stopped_run()
    late = [
        *events[: events.index(BlockCommitted("s", 1, (8, 9))) + 1],
        ControlReturned(1),
        *ending("s", (0, 1, 2, 3), FinishReason.STOP),
    ]
    v = violation_of(CFG, late)
    assert v.rule == "finish_condition"
    assert "committed no block holding a generated token in round 2" in str(v)
    assert "its latest commit was in round 1" in str(v)


def test_stop_after_a_prompt_only_block_breaks_finish_condition() -> None:
    """A block of prompt tokens generated nothing, so no stop can be found in it."""
    events = [
        Submitted("s", (3, 4), 6, stop_sampled=True),
        Admitted("s", 0),
        *prompt_block("s", (3, 4), (0, 1)),
        *ending("s", (0, 1), FinishReason.STOP),
    ]
    v = violation_of(CFG, events)
    assert v.rule == "finish_condition" and "round 0" in str(v)


@pytest.mark.parametrize(
    ("tokens", "why"),
    [
        ((), "reported 0 tokens"),  # nothing of the block that stopped it
        ((8, 9, 1), "reported 3 tokens"),  # more than it generated
        ((9,), "reported 1 tokens [9]"),  # not a prefix of what it generated
    ],
)
def test_a_stop_output_outside_the_last_block_breaks_reported_output(
    tokens: tuple[int, ...], why: str
) -> None:
    m = replay(CFG, stopped_run())
    with pytest.raises(SpecViolation) as info:
        m.check_outputs({"s": FinishedOutput(tokens, FinishReason.STOP)})
    assert info.value.rule == "reported_output"
    assert why in str(info.value) and "cut after 1 to 2 tokens" in str(info.value)


def test_a_stop_output_may_not_reach_into_an_earlier_block() -> None:
    """Two output blocks, the stop in the second: the output holds at least one of its
    tokens, so the first block's two tokens alone are refused."""
    events = [
        Submitted("s", (3,), 6, stop_sampled=True),
        Admitted("s", 0),
        *block("s", 0, (3, 5), (0, 1), masked=1),
        ControlReturned(0),
        *block("s", 1, (6, 7), (2, 3)),
        *ending("s", (0, 1, 2, 3), FinishReason.STOP),
    ]
    m = replay(CFG, events)
    m.check_outputs({"s": FinishedOutput((5, 6), FinishReason.STOP)})
    m = replay(CFG, events)
    with pytest.raises(SpecViolation, match="cut after 2 to 3 tokens"):
        m.check_outputs({"s": FinishedOutput((5,), FinishReason.STOP)})


def test_length_and_eos_are_unchanged_for_a_request_with_a_sampled_stop() -> None:
    """stop_sampled allows STOP; it does not excuse a request from EOS or LENGTH."""
    events = stopped_run()
    ended = events.index(Finished("s", FinishReason.STOP))
    v = violation_of(CFG, [*events[:ended], Finished("s", FinishReason.EOS)])
    assert v.rule == "finish_condition"


def test_stop_sampled_is_written_only_when_set_and_read_back() -> None:
    plain, sampled = Submitted("a", (1,), 2), Submitted("b", (1,), 2, stop_sampled=True)
    assert "stop_sampled" not in event_to_dict(plain)
    assert event_to_dict(sampled)["stop_sampled"] is True
    for e in (plain, sampled, Finished("b", FinishReason.STOP)):
        assert event_from_dict(json.loads(json.dumps(event_to_dict(e)))) == e
    explicit = {"kind": "submitted", "request_id": "a", "prompt": [1], "max_new_tokens": 2}
    assert event_from_dict({**explicit, "stop_sampled": False}) == plain
    with pytest.raises(TraceFormatError, match="'stop_sampled' is 1: true or false"):
        event_from_dict({**explicit, "stop_sampled": 1}, 3)
    with pytest.raises(TraceFormatError, match=r"unknown fields \['stop'\]"):
        event_from_dict({**explicit, "stop": True}, 3)


def test_a_request_spec_refuses_a_stop_sampled_that_is_not_a_bool() -> None:
    with pytest.raises(InvalidRequest, match="stop_sampled"):
        validate_request(CFG, RequestSpec("a", (1,), 2, stop_sampled=1))  # type: ignore[arg-type]


def test_a_replaying_twin_stops_where_the_record_stopped() -> None:
    """The reference replaying a run (`RecordedOracle`) ends a request with a sampled stop
    where the run did, with the reason STOP, and its own events conform."""
    record = stopped_run()
    assert RecordedOracle.from_events(record, CFG).stops_after("s") == 2
    events: list[Event] = []
    twin = replaying_twin()(record, CFG)(CFG, events.append)
    assert isinstance(twin, ReferenceDllmScheduler)
    twin.submit(RequestSpec("s", (3, 4), 6, stop_sampled=True))
    twin.drain()
    replay(CFG, events)
    assert Finished("s", FinishReason.STOP) in events
    assert twin.collect_outputs() == {"s": FinishedOutput((8, 9), FinishReason.STOP)}
    plain: list[Event] = []
    twin = replaying_twin()(record, CFG)(CFG, plain.append)
    twin.submit(RequestSpec("s", (3, 4), 6))  # no sampled stop: it never stops early
    with pytest.raises(RecordExhausted, match="record has 0 step"):
        twin.drain()


def test_check_trace_accepts_a_sampled_stop_and_names_an_unsampled_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`schedspec check-trace` on the stopped run, as a log with its header: it conforms
    (exit 0); the same log without `stop_sampled` fails at the `finished` line (exit 1), and
    with `--twin reference-dllm` the sampled stop is replayed alike (exit 0)."""

    def log(events: list[Event]) -> Path:
        return write_log(tmp_path, CFG, events)

    good = log(stopped_run())
    assert main(["check-trace", str(good)]) == 0
    assert main(["check-trace", str(good), "--twin", "reference-dllm"]) == 0
    capsys.readouterr()
    assert main(["check-trace", str(log(stopped_run(stop_sampled=False)))]) == 1
    out = capsys.readouterr().out
    finished_line = 2 + stopped_run().index(Finished("s", FinishReason.STOP))
    assert f":{finished_line}: [finish_condition]" in out and "stop_sampled" in out, out


ABORTS_AFTER_COMMIT = DllmPolicy(aborts_after_commit=True)


def aborted_run() -> list[Event]:
    """`stopped_run`, with the engine aborting `s` where it stopped it."""
    events = stopped_run(stop_sampled=False)
    events[events.index(Finished("s", FinishReason.STOP))] = Aborted("s")
    return events


def test_an_abort_right_after_a_commit_is_the_policys() -> None:
    m = SpecMachine(CFG, ABORTS_AFTER_COMMIT)
    for e in aborted_run():
        m.apply(e)
    assert m.is_idle()
    v = violation_of(CFG, aborted_run())  # the idealised spec: aborts happen between rounds
    assert v.rule == "scheduler_phase" and v.event == Aborted("s")
    assert "aborts_after_commit" not in str(v)


def test_under_the_policy_an_abort_still_needs_a_commit_with_a_generated_token() -> None:
    """After a prompt-only block nothing was generated, so no abort is pending there."""
    events = [
        Submitted("s", (3, 4), 6),
        Admitted("s", 0),
        *prompt_block("s", (3, 4), (0, 1)),
        KvFreed("s", (0, 1)),
        RowReleased("s", 0),
        Aborted("s"),
    ]
    m = SpecMachine(CFG, ABORTS_AFTER_COMMIT)
    with pytest.raises(SpecViolation) as info:
        for e in events:
            m.apply(e)
    assert info.value.rule == "scheduler_phase"
    assert "under aborts_after_commit also right after" in str(info.value)


def test_a_replaying_twin_aborts_where_the_engine_did(tmp_path: Path) -> None:
    """The record's in-round abort is no client's operation: a twin under the policy aborts
    the request after the same commit; one without (the reference) is given the abort right
    after that round. Both decide alike (check-trace exit 0); a log that does not declare the
    policy fails at the abort's line."""
    record = aborted_run()
    assert RecordedOracle.from_events(record, CFG).aborts_after("s") == 2
    submit = Submit(RequestSpec("s", (3, 4), 6))
    assert operations(record, aborts_in_round=True) == [submit, Round(), Round()]
    assert operations(record) == [submit, Round(), Round(), Abort("s")]
    events: list[Event] = []
    twin = replaying_twin(policy=ABORTS_AFTER_COMMIT)(record, CFG)(CFG, events.append)
    twin.submit(RequestSpec("s", (3, 4), 6))
    twin.drain()
    assert events == record
    log = tmp_path / "aborted.jsonl"
    header = json.dumps(config_to_dict(CFG, ABORTS_AFTER_COMMIT))
    log.write_text("\n".join([header, *(json.dumps(event_to_dict(e)) for e in record)]) + "\n")
    assert main(["check-trace", str(log), "--twin", "reference-dllm"]) == 0
    plain = check_trace([json.dumps(config_to_dict(CFG)), *log.read_text().splitlines()[1:]])
    assert plain.violation is not None and plain.violation.rule == "scheduler_phase"
    assert plain.line == 2 + record.index(Aborted("s"))
