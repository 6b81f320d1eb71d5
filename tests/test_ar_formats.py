"""Vidur trace CSV in, Vidur-named request metrics out."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from properties.ar.formats import (
    METRIC_COLUMNS,
    TraceRowError,
    parse_vidur_trace,
    replay_trace,
    write_request_metrics,
)
from reference.ar.vidur import VidurVllm, make_vidur_sarathi
from reference.ar.vllm_v1 import make_vllm_v1
from spec.ar.adapter import ArEventSink
from spec.ar.config import ArConfig, ArRequest

TRACE = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,6,3\n0.5,4,2\n10,3,1\n"


def test_parse_and_replay(tmp_path: Path) -> None:
    reqs = parse_vidur_trace(TRACE)
    assert [(r.prompt_len, r.max_tokens, r.arrival_time) for r in reqs] == [
        (6, 3, 0.0),
        (4, 2, 0.5),
        (3, 1, 10.0),
    ]
    cfg = ArConfig(block_size=2, num_blocks=16, max_num_batched_tokens=8, max_model_len=16)
    for factory in (make_vllm_v1, make_vidur_sarathi):
        metrics = replay_trace(factory, cfg, reqs, batch_time=0.25)
        assert [m.request_id for m in metrics] == ["r0", "r1", "r2"]
        assert all(m.num_decode_tokens == r.max_tokens for m, r in zip(metrics, reqs, strict=True))
        r2 = metrics[2]
        assert r2.scheduled_at == 10.0 and r2.completed_at == 10.25  # idle replica jumps ahead
    out = tmp_path / "request_metrics.csv"
    write_request_metrics(out, metrics)
    rows = list(csv.DictReader(out.open()))
    assert tuple(rows[0]) == METRIC_COLUMNS
    assert float(rows[0]["request_e2e_time"]) > 0


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("arrived_at,num_prefill_tokens\n0,1\n", 1),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,2\n1,x,2\n", 3),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,0,2\n", 2),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n5,1,2\n1,1,2\n", 3),
    ],
)
def test_malformed_trace_names_the_line(text: str, line: int) -> None:
    with pytest.raises(TraceRowError) as err:
        parse_vidur_trace(text)
    assert err.value.line_no == line and f"line {line}" in str(err.value)


@pytest.mark.parametrize(
    ("body", "line", "word"),
    [
        ("0,4,2\n1,4\n", 3, "missing"),
        ("0,-4,2\n", 2, "negative"),
        ("0,4,two\n", 2, "not a number"),
        ("0,4,2\n\n2,4,2\n1,4,2\n", 5, "sorted"),
        ("", 2, "no requests"),
        ("\n\n", 4, "no requests"),
        ("0," + "1" * 200_000 + ",2\n", 2, "not CSV"),
    ],
)
def test_one_reader_for_both_call_sites(tmp_path: Path, body: str, line: int, word: str) -> None:
    """spec.ar.vidur_trace is the reader behind properties.ar.formats and reference.sim."""
    from reference.sim.errors import TraceError
    from reference.sim.workload import read_trace
    from spec.ar.vidur_trace import read_vidur_trace_file

    path = tmp_path / "trace.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + body)
    for read in (read_vidur_trace_file, read_trace):
        with pytest.raises(TraceRowError) as err:
            read(path)
        assert err.value.line_no == line and word in str(err.value)
        assert str(err.value).startswith(f"{path}:{line}: ")  # named once, not twice
        assert "trace line" not in str(err.value)
    with pytest.raises(TraceError):
        read_trace(path)
    with pytest.raises(TraceRowError) as err:
        parse_vidur_trace("arrived_at,num_prefill_tokens,num_decode_tokens\n" + body)
    assert err.value.line_no == line and err.value.source is None


def test_long_lived_state_is_bounded() -> None:
    """Finished requests are retired: the scheduler keeps only the latest few, the spec
    machine only their outcome, and the replay no event log."""
    cfg = ArConfig(
        block_size=4,
        num_blocks=33,
        max_num_batched_tokens=64,
        max_model_len=32,
        enable_chunked_prefill=False,
    )
    made: list[VidurVllm] = []

    def factory(config: ArConfig, sink: ArEventSink) -> VidurVllm:
        s = VidurVllm(config, sink)
        s.retain_finished = 5
        made.append(s)
        return s

    reqs = [ArRequest(f"r{i}", 4, 3, arrival_time=float(i)) for i in range(40)]
    metrics = replay_trace(factory, cfg, reqs)
    assert len(metrics) == 40
    (sched,) = made
    assert sched.num_finished == 40 and len(sched.finished) == 5
    assert list(sched.finished) == [f"r{i}" for i in range(35, 40)]
