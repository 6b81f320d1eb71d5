"""AR traces (`spec.ar.trace`) and their streaming checker (`check_ar_trace`): recorded runs
pass, seeded bugs fail at the right line with their rule, and every bad input is a typed
`TraceFormatError` / `ConfigError` naming the line or field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from properties.ar.harness import ArHarness
from properties.ar.trace_check import check_ar_trace
from reference.ar.prefix_cache import make_vllm_v1_prefix
from reference.ar.vllm_v1 import make_vllm_v1
from spec.ar.adapter import ArImplementationFactory
from spec.ar.config import ArConfig, ArRequest, Policy, VictimOrder
from spec.ar.events import ArEvent
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


@pytest.mark.parametrize(
    "header",
    [
        {"kind": "config", "family": "ar", "block_size": "4"},
        {"kind": "config", "family": "ar", "num_blocks": 10**12},
        {"kind": "config", "family": "dllm"},
        {"kind": "config", "family": "ar", "slots": 3},
        {"kind": "config", "family": "ar", "declared_policy": {"victim": "random"}},
        {"kind": "config", "family": "ar", "declared_policy": {"rules": {"token_cap": "x"}}},
        {"kind": "config", "family": "ar", "declared_policy": {"watermark_fraction": 2}},
    ],
)
def test_bad_headers(tmp_path: Path, header: dict[str, object]) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(header) + "\n", encoding="utf-8")
    with pytest.raises(TraceFormatError) as err:
        check_ar_trace(path)
    assert err.value.line_no == 1


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
