"""AR traces (`spec.ar.trace`) and their streaming checker (`check_ar_trace`): recorded runs
pass, seeded bugs fail at the right line with their rule, and every bad input is a typed
`TraceFormatError` / `ConfigError` naming the line or field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from properties.ar.harness import ArHarness
from properties.ar.trace_check import check_ar_trace
from reference.ar.prefix_cache import make_vllm_v1_prefix
from reference.ar.vllm_v1 import make_vllm_v1
from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import ArConfig, ArRequest, Policy, VictimOrder
from spec.ar.events import ArEvent, ArFinished, ArFinishReason, ArStepEnd, ArSubmitted
from spec.ar.profile import ArPolicy
from spec.ar.trace import (
    ArTraceReader,
    ar_config_from_dict,
    ar_config_to_dict,
    trace_family,
    write_ar_trace,
)
from spec.errors import ConfigError, SchedSpecError
from spec.trace import TraceFormatError
from tests.ar_mutants import AR_MUTANTS

CFG = ArConfig(
    block_size=2,
    num_blocks=7,
    max_num_batched_tokens=6,
    max_num_seqs=3,
    max_model_len=10,
    enable_prefix_caching=True,
)


def _run(factory: ArImplementationFactory, config: ArConfig, drain: bool = True) -> list[ArEvent]:
    h = ArHarness(factory, config, check_invariants=False)
    for i in range(6):
        h.submit(ArRequest(f"r{i}", 3 + i % 4, 2 + i % 3, prompt=(1, 2, 3, 4, 5, 6)[: 3 + i % 4]))
        h.step()
    if drain:
        h.drain()
    return list(h.events)


def _write(path: Path, events: list[ArEvent], config: ArConfig | None = CFG) -> Path:
    with path.open("w", encoding="utf-8") as out:
        write_ar_trace(events, out, config)
    return path


def test_a_recorded_run_passes(tmp_path: Path) -> None:
    events = _run(make_vllm_v1_prefix, CFG)
    assert any(e.kind == "ar_cache_hit" for e in events)
    result = check_ar_trace(_write(tmp_path / "t.jsonl", events))
    assert result.ok and result.idle_at_end and result.events == len(events)
    assert result.steps > 0


def test_a_trace_that_ends_with_work_running_is_reported(tmp_path: Path) -> None:
    events = _run(make_vllm_v1, CFG, drain=False)
    result = check_ar_trace(_write(tmp_path / "t.jsonl", events))
    assert result.ok and not result.idle_at_end
    assert result.waiting_at_end + result.running_at_end > 0


def test_a_seeded_bug_fails_at_its_line(tmp_path: Path) -> None:
    cfg = CFG.replace(max_num_seqs=1, max_num_batched_tokens=10)
    h = ArHarness(AR_MUTANTS["double_free"].factory, cfg, check_invariants=False)
    h.submit(ArRequest("a", 3, 2))
    with pytest.raises(SchedSpecError):
        h.drain()
    path = _write(tmp_path / "t.jsonl", list(h.events), cfg)
    result = check_ar_trace(path)
    assert result.violation is not None and result.violation.rule == "free_owned_only"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert result.line is not None
    assert json.loads(lines[result.line - 1])["kind"] == "ar_blocks_freed"


def test_header_and_config(tmp_path: Path) -> None:
    events = _run(make_vllm_v1, CFG)
    bare = _write(tmp_path / "bare.jsonl", events, config=None)
    with pytest.raises(ConfigError) as err:
        check_ar_trace(bare)
    assert err.value.field == "config"
    assert check_ar_trace(bare, CFG).ok  # --config for a trace without a header
    headed = _write(tmp_path / "h.jsonl", events)
    assert check_ar_trace(headed, CFG).ok  # the same config: fine
    with pytest.raises(ConfigError, match="num_blocks"):
        check_ar_trace(headed, CFG.replace(num_blocks=40))  # never a silent override


def test_the_header_carries_the_policy() -> None:
    policy = ArPolicy(victim=VictimOrder.LOWEST_PRIORITY_ANY, full_sequence_admission=True)
    cfg = CFG.replace(policy=Policy.PRIORITY)
    data = json.loads(json.dumps(ar_config_to_dict(cfg, policy)))
    assert data["family"] == "ar"
    assert ar_config_from_dict(data) == (cfg, policy)


def _line(tmp_path: Path, *lines: str, raw: bytes | None = None) -> Path:
    path = tmp_path / "bad.jsonl"
    if raw is not None:
        path.write_bytes(raw)
    else:
        header = json.dumps(ar_config_to_dict(CFG))
        path.write_text("\n".join([header, *lines]) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("lines", "line_no", "words"),
    [
        (['{"kind": "ar_blocks_allocated", "request_id": "a", "blocks": ["0"]}'], 2, "blocks"),
        (['{"kind": "ar_scheduled", "request_id": 5, "num_tokens": 1}'], 2, "request_id"),
        (['{"kind": "ar_scheduled", "request_id": "a", "num_tokens": "3"}'], 2, "num_tokens"),
        (['{"kind": "ar_scheduled", "request_id": "a", "num_tokens": true}'], 2, "num_tokens"),
        (['{"kind": "ar_finished", "request_id": "a", "reason": "done"}'], 2, "reason"),
        (['{"kind": "ar_teleported"}'], 2, "unknown event kind"),
        (['{"request_id": "a"}'], 2, "the line has no \"kind\" field; valid kinds: ['ar_aborted'"),
        (['{"kind": "ar_step_end", "step_index": 0, "step_index": 1}'], 2, "duplicate key"),
        (['{"kind": "ar_step_end", "step_index": 0, "x": 1}'], 2, "unknown fields"),
        (['{"kind": "ar_step_end"}'], 2, "lacks field"),
        (["[1, 2]"], 2, "JSON object"),
        (["{not json"], 2, "not JSON"),
        (['{"kind": "config", "family": "ar"}'], 2, "first line"),
        (
            ['{"kind": "ar_step_end", "step_index": ' + "[" * 50_000 + "]" * 50_000 + "}"],
            2,
            "deeply",
        ),
        (['{"kind": "ar_step_end", "step_index": 1' + "0" * 5_000 + "}"], 2, "digits"),
    ],
)
def test_bad_lines_name_the_line(
    tmp_path: Path, lines: list[str], line_no: int, words: str
) -> None:
    with pytest.raises(TraceFormatError) as err:
        check_ar_trace(_line(tmp_path, *lines))
    assert err.value.line_no == line_no
    assert words in str(err.value)


FULL = ar_config_to_dict(CFG)  # a header gives every ArConfig field
NO_BLOCKS = {k: v for k, v in FULL.items() if k != "num_blocks"}


@pytest.mark.parametrize(
    ("header", "words"),
    [
        ({**FULL, "block_size": "4"}, "bad header: invalid block_size='4'"),
        ({**FULL, "num_blocks": 10**12}, "bad header: invalid num_blocks=1000000000000"),
        ({"kind": "config", "family": "dllm"}, "family='dllm': an AR trace has family 'ar'"),
        ({**FULL, "slots": 3}, "unknown config fields ['slots']"),
        ({**FULL, "declared_policy": {"victim": "random"}}, "policy.victim='random'"),
        ({**FULL, "declared_policy": {"rules": {"token_cap": "x"}}}, "bad header: "),
        ({**FULL, "declared_policy": {"watermark_fraction": 2}}, "watermark_fraction"),
        # a field left out is named, never filled in with ArConfig's default
        (NO_BLOCKS, "the header lacks fields ['num_blocks']: give every configuration field"),
        ({"kind": "config", "family": "ar"}, "the header lacks fields ['block_size', "),
    ],
)
def test_bad_headers(tmp_path: Path, header: dict[str, object], words: str) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(header) + "\n", encoding="utf-8")
    with pytest.raises(TraceFormatError) as err:
        check_ar_trace(path)
    assert err.value.line_no == 1
    assert words in err.value.detail, err.value.detail


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot read"):
        check_ar_trace(tmp_path / "missing.jsonl")
    with pytest.raises(TraceFormatError, match="cannot read"):
        check_ar_trace(tmp_path)  # a directory
    with pytest.raises(TraceFormatError, match="UTF-8"):
        check_ar_trace(_line(tmp_path, raw=b"\xff\xfe\x00binary\x00\xff"))
    empty = _line(tmp_path, raw=b"")
    with pytest.raises(ConfigError):
        check_ar_trace(empty)  # no header, no --config
    assert check_ar_trace(empty, CFG).ok


def test_a_byte_order_mark_is_skipped(tmp_path: Path) -> None:
    events = _run(make_vllm_v1, CFG)
    path = _write(tmp_path / "t.jsonl", events)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert check_ar_trace(path).ok


def test_family_and_streaming_reader(tmp_path: Path) -> None:
    events = _run(make_vllm_v1, CFG)
    path = _write(tmp_path / "t.jsonl", events)
    assert trace_family(path) == "ar"
    assert trace_family(_write(tmp_path / "b.jsonl", events, config=None)) == "ar"
    assert trace_family(tmp_path / "missing") is None
    with ArTraceReader(path) as reader:
        assert reader.header is not None and reader.header.config == CFG
        assert [e for _, e in reader] == events


# --- stops the engine sampled (a live engine's log cannot know them in advance) ---------------

SAMPLED_CFG = ArConfig(block_size=2, num_blocks=12, max_num_batched_tokens=4, max_num_seqs=2)


def _stopping_run() -> list[ArEvent]:
    """vLLM's rules: `a` (a prompt of 6, prefilled in chunks of 4) stops at its second output,
    `b` at its first, `c` runs to max_tokens."""
    h = ArHarness(make_vllm_v1, SAMPLED_CFG)
    h.submit(ArRequest("a", 6, 5, stop_after=2))
    h.submit(ArRequest("b", 2, 4, stop_after=1))
    h.step()
    h.submit(ArRequest("c", 1, 3))
    h.drain()
    return list(h.events)


def _as_sampled(events: list[ArEvent], declared: bool = True) -> list[ArEvent]:
    """The same log as a live engine writes it: no stop position at submission, the stop
    declared sampled (or, `declared` False, not even that)."""
    return [
        dataclasses.replace(e, stop_after=None, stop_sampled=declared and e.stop_after is not None)
        if isinstance(e, ArSubmitted)
        else e
        for e in events
    ]


def test_a_sampled_stop_is_accepted_after_a_step_that_produced_a_token(tmp_path: Path) -> None:
    scripted = _stopping_run()
    finishes = {e.request_id: e.reason for e in scripted if isinstance(e, ArFinished)}
    assert finishes == {
        "a": ArFinishReason.STOP,
        "b": ArFinishReason.STOP,
        "c": ArFinishReason.LENGTH,
    }
    sampled = _as_sampled(scripted)
    kept: list[ArEvent] = []
    result = check_ar_trace(_write(tmp_path / "s.jsonl", sampled, SAMPLED_CFG), keep=kept)
    assert result.ok, result.violation
    assert result.sampled_stops == {"a": 2, "b": 1}  # outputs at the finish, read off the log
    assert kept == sampled
    text = (tmp_path / "s.jsonl").read_text(encoding="utf-8")
    assert text.count('"stop_sampled":true') == 2 and '"stop_sampled":false' not in text
    # without the declaration the same log breaks the finish condition at the first stop
    undeclared = _as_sampled(scripted, declared=False)
    bad = check_ar_trace(_write(tmp_path / "u.jsonl", undeclared, SAMPLED_CFG))
    assert bad.violation is not None and bad.violation.rule == "finish_condition"


def test_a_sampled_stop_needs_a_token_in_the_step_that_just_ended(tmp_path: Path) -> None:
    """`a` is still prefilling after step 0 (4 of its 6 prompt tokens): a stop then is no
    sampled end token, and the check says so at that line."""
    sampled = _as_sampled(_stopping_run())
    first_end = next(i for i, e in enumerate(sampled) if isinstance(e, ArStepEnd))
    early = [*sampled[: first_end + 1], ArFinished("a", ArFinishReason.STOP)]
    result = check_ar_trace(_write(tmp_path / "e.jsonl", early, SAMPLED_CFG))
    assert result.violation is not None and result.violation.rule == "finish_condition"
    assert "produced no output token in the step that just ended" in str(result.violation)
    assert result.line == len(early) + 1  # the header is line 1


def test_a_stop_is_scripted_or_sampled_not_both(tmp_path: Path) -> None:
    both: list[ArEvent] = [ArSubmitted("a", 2, 3, stop_after=1, stop_sampled=True)]
    result = check_ar_trace(_write(tmp_path / "b.jsonl", both, SAMPLED_CFG))
    assert result.violation is not None and result.violation.rule == "valid_request"


def test_a_sampled_log_replays_through_its_twin_where_it_stopped() -> None:
    """The twin (a scripted scheduler) stops each request where the log's engine sampled its
    end token; without those positions it would run them to max_tokens and decide otherwise."""
    from properties.ar.decisions import operations, twin_difference

    sampled = _as_sampled(_stopping_run())
    stops = {"a": 2, "b": 1}
    assert twin_difference(operations(sampled, stops), sampled, SAMPLED_CFG, make_vllm_v1) is None
    unscripted = twin_difference(operations(sampled), sampled, SAMPLED_CFG, make_vllm_v1)
    assert unscripted is not None and unscripted.startswith("step ")


def test_check_trace_replays_a_sampled_log_through_its_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from schedspec_cli.main import main

    log = _write(tmp_path / "s.jsonl", _as_sampled(_stopping_run()), SAMPLED_CFG)
    assert main(["check-trace", str(log), "--twin", "vllm-v1"]) == 0
    assert "its twin vllm-v1 decides alike in all" in capsys.readouterr().out
