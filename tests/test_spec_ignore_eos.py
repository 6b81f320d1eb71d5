"""A request the end-of-sequence token does not end (`Submitted.ignore_eos`).

SGLang's and vLLM's `ignore_eos` sampling parameter keeps a request running past every EOS it
generates (benchmarks set it to get outputs of a fixed length). Such a request finishes only at
max_new_tokens (or, with `stop_sampled`, on a STOP), and its output keeps the EOS tokens. Each
test here breaks one part of that and names the violation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from properties.decisions import operations
from properties.workload import Submit
from schedspec_cli.main import main
from spec import (
    ControlReturned,
    Finished,
    FinishReason,
    KvFreed,
    RequestSpec,
    RowReleased,
    SpecViolation,
    Submitted,
)
from spec.config import validate_request
from spec.errors import InvalidRequest
from spec.events import Event
from spec.snapshot import FinishedOutput
from spec.trace import TraceFormatError, event_from_dict, event_to_dict
from tests.event_runs import SMALL_SYNC, replay, run_to_length, twin_replay, violation_of, write_log

EOS = 9
CFG = SMALL_SYNC.replace(eos_token_id=EOS)


def eos_run(ignore_eos: bool = True) -> list[Event]:
    """`a` (prompt 2 tokens, 4 new) commits its prompt block in round 0, an output block that
    starts with an EOS in round 1, and a last output block in round 2; it finishes with
    LENGTH, its output the four generated tokens, EOS included."""
    return run_to_length(Submitted("a", (3, 4), 4, ignore_eos=ignore_eos), (EOS, 5), (6, EOS))


def test_a_request_that_ignores_eos_runs_to_max_new_tokens_and_keeps_its_eos() -> None:
    m = replay(CFG, eos_run())
    assert m.is_idle()
    assert m.outputs() == {"a": (EOS, 5, 6, EOS)}
    m.check_outputs({"a": FinishedOutput((EOS, 5, 6, EOS), FinishReason.LENGTH)})


def test_an_output_cut_at_an_ignored_eos_breaks_reported_output() -> None:
    m = replay(CFG, eos_run())
    with pytest.raises(SpecViolation) as info:
        m.check_outputs({"a": FinishedOutput((EOS,), FinishReason.LENGTH)})
    assert info.value.rule == "reported_output"
    assert "the spec's output is 4 tokens" in str(info.value)


def test_without_ignore_eos_running_past_the_eos_breaks_fdfo_releases_same_round() -> None:
    v = violation_of(CFG, eos_run(ignore_eos=False))
    assert v.rule == "fdfo_releases_same_round"
    assert v.event == ControlReturned(1)


@pytest.mark.parametrize("after", ["the EOS", "max_new_tokens"])
def test_eos_as_the_reason_breaks_finish_condition_when_it_is_ignored(after: str) -> None:
    """Neither right after the EOS nor at max_new_tokens may the reason be EOS."""
    events = eos_run()
    cut = (
        events.index(ControlReturned(1))
        if after == "the EOS"
        else events.index(KvFreed("a", (0, 1, 2, 3, 4, 5)))
    )
    owned = (0, 1, 2, 3) if after == "the EOS" else (0, 1, 2, 3, 4, 5)
    ending: list[Event] = [
        KvFreed("a", owned),
        RowReleased("a", 0),
        Finished("a", FinishReason.EOS),
    ]
    v = violation_of(CFG, [*events[:cut], *ending])
    assert v.rule == "finish_condition"
    assert "submitted with ignore_eos" in str(v) and "valid: length" in str(v)
    assert v.event == Finished("a", FinishReason.EOS)


def test_ignore_eos_is_written_only_when_set_and_read_back() -> None:
    plain, ignoring = Submitted("a", (1,), 2), Submitted("b", (1,), 2, ignore_eos=True)
    assert "ignore_eos" not in event_to_dict(plain)
    assert event_to_dict(ignoring)["ignore_eos"] is True
    both = Submitted("c", (1,), 2, stop_sampled=True, ignore_eos=True)
    for e in (plain, ignoring, both):
        assert event_from_dict(json.loads(json.dumps(event_to_dict(e)))) == e
    explicit = {"kind": "submitted", "request_id": "a", "prompt": [1], "max_new_tokens": 2}
    assert event_from_dict({**explicit, "ignore_eos": False}) == plain
    with pytest.raises(TraceFormatError, match="'ignore_eos' is 'yes': true or false"):
        event_from_dict({**explicit, "ignore_eos": "yes"}, 3)


def test_a_request_spec_refuses_an_ignore_eos_that_is_not_a_bool() -> None:
    with pytest.raises(InvalidRequest, match="ignore_eos"):
        validate_request(CFG, RequestSpec("a", (1,), 2, ignore_eos=1))  # type: ignore[arg-type]


def test_the_reference_and_its_golden_decoder_run_past_an_ignored_eos() -> None:
    """The reference replaying the run (`RecordedOracle`) keeps the request past its EOS only
    when it ignores EOS; its events conform either way, and the golden decoder agrees."""
    for ignore, want in (
        (True, FinishedOutput((EOS, 5, 6, EOS), FinishReason.LENGTH)),
        (False, FinishedOutput((EOS,), FinishReason.EOS)),
    ):
        request = RequestSpec("a", (3, 4), 4, ignore_eos=ignore)
        events, outputs, golden = twin_replay(CFG, eos_run(), request)
        assert outputs == {"a": want}
        assert golden == want
        assert events[0] == Submitted("a", (3, 4), 4, ignore_eos=ignore)


def test_the_flag_survives_the_round_trip_to_operations() -> None:
    """A twin re-running a log submits the request with the log's flag."""
    (first, *_) = operations(eos_run())
    assert first == Submit(RequestSpec("a", (3, 4), 4, ignore_eos=True))


def test_check_trace_accepts_an_ignored_eos_and_names_the_missing_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`schedspec check-trace` on the run, as a log with its header: it conforms (exit 0),
    alone and against `--twin reference-dllm`; without `ignore_eos` it fails at the end of the
    round that committed the EOS (exit 1)."""

    def log(events: list[Event]) -> Path:
        return write_log(tmp_path, CFG, events)

    good = log(eos_run())
    assert main(["check-trace", str(good)]) == 0
    assert main(["check-trace", str(good), "--twin", "reference-dllm"]) == 0
    capsys.readouterr()
    assert main(["check-trace", str(log(eos_run(ignore_eos=False)))]) == 1
    out = capsys.readouterr().out
    line = 2 + eos_run().index(ControlReturned(1))
    assert f":{line}: [fdfo_releases_same_round]" in out, out
