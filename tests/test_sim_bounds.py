"""The simulator's library refuses times and rates that would sum to inf or make a throughput
of inf (`reference.sim.bounds`), so a caller that bypasses the CLI gets a typed error naming the
field, not a ratio of nan or a ZeroDivisionError."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from reference.sim import workload as wl
from reference.sim.bounds import MAX_SECONDS, MIN_BATCH_SECONDS
from reference.sim.dllm import DllmParams, StepDist, simulate_dllm
from reference.sim.errors import SimConfigError
from reference.sim.exec_model import Constant, Linear, Table, parse_model
from reference.sim.queueing import simulate_gated

ONE = wl.Lengths(1, 1)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: DllmParams(round_overhead=1e308), "round_overhead"),
        (lambda: DllmParams(alloc_cost=MAX_SECONDS * 2), "alloc_cost"),
        (lambda: DllmParams(row_round_cost=float("nan")), "row_round_cost"),
        (lambda: DllmParams(arrival_interval=float("inf")), "arrival_interval"),
        (lambda: Linear(1e-320), "base"),
        (lambda: Linear(0.02, per_kv_token=1e308), "per_kv_token"),
        (lambda: Constant(1e308), "seconds"),
        (lambda: Table(((1.0, 1e-320),)), "seconds"),
        (lambda: simulate_gated(4, 1e308, "immediate", requests=4), "batch_time"),
        (lambda: simulate_gated(4, 0.1, "immediate", requests=4, qps=1e-320), "qps"),
        (lambda: simulate_gated(4, 0.1, "immediate", requests=0), "requests"),
        (lambda: wl.poisson(4, 1e-320, ONE, ONE), "qps"),
        (lambda: wl.poisson(4, 1e308, ONE, ONE), "qps"),
    ],
)
def test_a_time_rate_or_count_out_of_bounds_is_a_typed_error(
    build: Callable[[], object], field: str
) -> None:
    with pytest.raises(SimConfigError, match=f"invalid {field}="):
        build()


def test_the_bounds_themselves_give_finite_results() -> None:
    """The extremes allowed still simulate to finite, positive throughputs."""
    for forward, overhead in (
        (Constant(MIN_BATCH_SECONDS), 0.0),
        (Constant(MAX_SECONDS), MAX_SECONDS),
    ):
        params = DllmParams(
            num_requests=2,
            gen_blocks=2,
            forward=forward,
            round_overhead=overhead,
            alloc_cost=overhead,
            alloc_round_cost=overhead,
        )
        result = simulate_dllm(params, StepDist.parse("uniform:2-3"))
        assert 0 < result.throughput < float("inf"), (forward, overhead, result.throughput)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\xff{}", "a readable JSON file ('utf-8' codec"),
        (b'{"points": [[1, 0.01]', "a readable JSON file ("),
        (b'{"x": 1}', 'a table: {"points": [[tokens, seconds], ...]}'),
        (b"[[1]]", "a table: "),
        (b"[]", "at least one"),
        (None, "a readable JSON file (No such file or directory)"),
    ],
)
def test_a_bad_time_table_names_the_file_and_the_shape(
    tmp_path: Path, content: bytes | None, says: str
) -> None:
    path = tmp_path / "times.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SimConfigError) as err:
        parse_model(f"table:{path}")
    assert err.value.field == "exec_model" and str(path) in str(err.value)
    assert says in str(err.value) and "models:" not in str(err.value)
    good = tmp_path / "good.json"
    good.write_text('{"points": [[1, 0.01], [100, 0.02]]}')
    assert parse_model(f"table:{good}").batch_time(50, 0) == pytest.approx(0.01 + 0.01 * 49 / 99)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("warp:1", "'const:SECONDS' or 'linear:"),
        ("const:", "'const:SECONDS'"),
        ("const:1,2", "'const:SECONDS'"),
        ("linear:a", "'linear:BASE,PER_PREFILL,PER_DECODE[,PER_KV]'"),
        ("linear:0.1,0,0,0,0", "'linear:BASE,PER_PREFILL,PER_DECODE[,PER_KV]'"),
        ("roofline:foo@h100", "a model of ['deepseek-v3', 'llama2-7b', 'llama3-8b']"),
        ("roofline:llama3-8b@tpu", "a device of ['a100', 'h100', 'h200', 'h800']"),
        ("roofline:llama3-8b@h100x0", "PARALLEL an integer >= 1"),
        ("roofline:llama3-8b@h100xq", "PARALLEL an integer >= 1"),
        ("roofline:llama3-8b@h100x²", "PARALLEL an integer >= 1"),
    ],
)
def test_a_bad_time_model_says_what_its_kind_takes(text: str, says: str) -> None:
    with pytest.raises(SimConfigError) as err:
        parse_model(text)
    assert err.value.field == "exec_model" and says in str(err.value), str(err.value)


def test_each_kind_of_time_model_parses() -> None:
    assert parse_model("const:0.02").batch_time(5, 5) == pytest.approx(0.02)
    assert parse_model("linear:0.01,0.001,0.002").batch_time(2, 3) == pytest.approx(0.018)
    one = parse_model("roofline:llama3-8b@h100").batch_time(512, 0)
    two = parse_model("roofline:llama3-8b@h100x2").batch_time(512, 0)
    assert 0 < two < one
