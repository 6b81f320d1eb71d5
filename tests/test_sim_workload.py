"""Vidur trace reading, generators and execution-time models of the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reference.sim import exec_model as em
from reference.sim import workload as wl
from reference.sim.errors import SimConfigError, TraceError
from spec.errors import SchedSpecError

HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "trace.csv"
    p.write_text(text)
    return p


def test_trace_round_trip(tmp_path: Path) -> None:
    w = wl.poisson(50, 4.0, wl.Lengths(10, 100), wl.Lengths(1, 30), seed=3)
    p = tmp_path / "t.csv"
    w.to_csv(p)
    r = wl.read_trace(p)
    assert np.array_equal(r.arrived_at, w.arrived_at)
    assert np.array_equal(r.prefill, w.prefill) and np.array_equal(r.decode, w.decode)


def test_trace_extra_columns_and_float_integers(tmp_path: Path) -> None:
    p = _write(
        tmp_path, "x,arrived_at,num_prefill_tokens,num_decode_tokens\na,0.5,12.0,3\nb,0.5,7,1\n"
    )
    r = wl.read_trace(p)
    assert r.prefill.tolist() == [12, 7] and r.decode.tolist() == [3, 1]


@pytest.mark.parametrize(
    ("body", "line", "word"),
    [
        ("0.1,10\n", 2, "missing"),
        ("0.1,10,5\n0.2,,3\n", 3, "missing"),
        ("0.1,-10,5\n", 2, "negative"),
        ("-0.1,10,5\n", 2, "negative"),
        ("0.1,ten,5\n", 2, "not a number"),
        ("0.1,10,nan\n", 2, "not finite"),
        ("0.1,10,2.5\n", 2, "whole number"),
        ("0.1,10,0\n", 2, "at least 1"),
        ("0.2,10,5\n0.1,10,5\n", 3, "sorted"),
    ],
)
def test_malformed_rows_name_the_line(tmp_path: Path, body: str, line: int, word: str) -> None:
    p = _write(tmp_path, HEADER + body)
    with pytest.raises(TraceError) as err:
        wl.read_trace(p)
    assert err.value.line == line
    assert word in str(err.value)
    assert f":{line}:" in str(err.value)
    assert isinstance(err.value, SchedSpecError)


def test_bad_header_and_empty(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="num_decode_tokens"):
        wl.read_trace(_write(tmp_path, "arrived_at,num_prefill_tokens\n0,1\n"))
    with pytest.raises(TraceError, match="empty"):
        wl.read_trace(_write(tmp_path, ""))


def test_generators_deterministic_and_shaped() -> None:
    a = wl.poisson(100, 5.0, wl.Lengths.parse("8-64"), wl.Lengths.parse("4"), seed=1)
    b = wl.poisson(100, 5.0, wl.Lengths.parse("8-64"), wl.Lengths.parse("4"), seed=1)
    assert np.array_equal(a.arrived_at, b.arrived_at) and np.array_equal(a.prefill, b.prefill)
    assert a.prefill.min() >= 8 and a.prefill.max() <= 64 and set(a.decode.tolist()) == {4}
    bu = wl.bursts(10, 4, 2.0, wl.Lengths(1, 1), wl.Lengths(1, 1))
    assert bu.arrived_at.tolist() == [0, 0, 0, 0, 2, 2, 2, 2, 4, 4]
    fx = wl.fixed(3, 0.5, wl.Lengths(1, 1), wl.Lengths(1, 1))
    assert fx.arrived_at.tolist() == [0.0, 0.5, 1.0]
    with pytest.raises(SimConfigError):
        wl.poisson(10, 0.0, wl.Lengths(1, 1), wl.Lengths(1, 1))
    with pytest.raises(SimConfigError):
        wl.Lengths.parse("9-3")


def test_exec_models() -> None:
    assert em.Constant(0.02).batch_time(100, 3) == 0.02
    lin = em.Linear(0.01, 1e-4, 2e-4, 1e-6)
    assert lin.batch_time(100, 10, 1000) == pytest.approx(0.01 + 0.01 + 0.002 + 0.001)
    ends = lin.decode_ends(1.0, 4, 100, 3)
    t = 1.0
    kv = 100
    for e in ends:
        t += lin.batch_time(0, 4, kv, kv + 4)
        kv += 4
        assert e == t  # bit-identical to one-by-one
    tab = em.Table.from_measurements([(1, 0.01), (100, 0.02), (100, 0.04), (200, 0.05)])
    assert tab.batch_time(50, 0) == pytest.approx(0.01 + 0.02 * 49 / 99)
    assert tab.batch_time(300, 0) == pytest.approx(0.07)
    # roofline: decode of one token on Llama-3-8B / H100 is memory bound: ~16 GB / 3.35 TB/s
    rf = em.Roofline(em.MODELS["llama3-8b"], em.DEVICES["h100"], mfu=1.0, mbu=1.0)
    assert rf.batch_time(0, 1) == pytest.approx(8.03e9 * 2 / 3.35e12, rel=0.01)
    # a big prefill is compute bound: 2 * 8.03e9 * 8192 FLOPs at 989 TFLOP/s, plus attention
    assert rf.batch_time(8192, 0) > 2 * 8.03e9 * 8192 / 989e12
    assert em.DEVICES["h200"].mem_bandwidth > em.DEVICES["h100"].mem_bandwidth
    assert isinstance(em.parse_model("roofline:deepseek-v3@h800x16"), em.Roofline)
    with pytest.raises(SimConfigError):
        em.parse_model("roofline:gpt9@h100")
    with pytest.raises(SimConfigError):
        em.Roofline(em.MODELS["llama2-7b"], em.DEVICES["a100"], fp8=True)


def test_the_cli_serves_a_trace_and_generates_with_each_commands_defaults(
    tmp_path: Path,
) -> None:
    """`--trace-csv` serves exactly the trace's requests; without it each command generates
    its own default workload, and a generator flag overrides only its own default."""
    from schedspec_cli.main import main

    trace = _write(tmp_path, HEADER + "0.0,100,20\n0.5,60,8\n")
    out = tmp_path / "replicas.json"
    assert main(["simulate", "replicas", "--trace-csv", str(trace), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["num_requests"] == 2
    assert main(["simulate", "replicas", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["num_requests"] == 2000  # replicas' default --requests
    assert main(["simulate", "replicas", "--requests", "37", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["num_requests"] == 37
