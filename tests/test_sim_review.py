"""A review of `schedspec simulate`: inputs it ran on with nonsense or silently changed, errors
that did not say what was wrong, and metrics and settings that were not Vidur's.

1. arrivals so late the float64 clock loses the batch times (1e16 + 0.5 == 1e16) are refused,
   naming the trace's file and line;
2. an empty `--trace-csv` (an unset shell variable) is refused, not read as "no trace";
3. a request Vidur's watermark never admits names itself, its trace line, the watermark and
   what would fit; in `sweep` the failing point is named too;
4. `--steps` past the block, `--burst` without bursts and a `table:` model extrapolating past
   an hour are refused rather than clipped or ignored;
5. token counts past any pool (a CSV cell or `--prefill`) and a pool smaller than one block
   name the file:line or the flag and the valid range;
6. `decode_time_execution_plus_preemption_normalized` is Vidur's formula, and the TPOT the
   simulator reported under that name keeps an honest name of its own;
7. `vidur-lightllm` takes Vidur's `max_waiting_iters` default, `simulate replicas` takes
   `--max-model-len`, and the help says what `--trace-csv` and `--seed` are.

Every refusal is exit 2 with one line on stderr and nothing on stdout.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from reference.sim import workload as wl
from reference.sim.bounds import CLOCK_RESOLUTION_BITS, latest_arrival
from reference.sim.catalog import ReplicaSpec
from reference.sim.cluster import simulate_cluster
from reference.sim.errors import NeverAdmitted, TraceError
from reference.sim.exec_model import Constant, Table, min_batch_seconds, parse_model
from reference.sim.replica import SimpleReplica
from schedspec_cli.main import main
from schedspec_cli.simulate import build_parser
from tests.test_simulate_inputs import refused

HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _trace(tmp_path: Path, body: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + body)
    return path


# 1. the clock


def test_the_latest_arrival_keeps_every_batch_end_within_a_millionth_of_a_step() -> None:
    for step in (1e-9, 6e-3, 0.5, 3600.0):
        t = latest_arrival(step)
        assert math.ulp(t) <= step * 2.0**-CLOCK_RESOLUTION_BITS
        assert t + step > t  # the step still moves the clock
    # the reviewer's case: a 0.5 s batch at 1e16 s does not move the clock at all
    assert 1e16 + 0.5 == 1e16 and latest_arrival(0.5) < 1e16


@pytest.mark.parametrize("what", ["replicas", "sbs"])
def test_arrivals_past_the_clocks_resolution_are_refused_naming_the_line(
    what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: exit 0, makespan 0.00 s and 2e12 requests/s (every batch end rounded back to
    its start)."""
    trace = _trace(tmp_path, "0,10,4\n\n1e16,10,4\n1e16,10,4\n")  # a blank line: line 4
    argv = ["simulate", what, "--trace-csv", str(trace)]
    if what == "replicas":
        argv += ["--replicas", "1", "--scheduler", "vidur-vllm", "--exec-model", "const:0.5"]
    line = refused(argv, capsys)
    assert f"{trace}:4: arrived_at=1e+16 s is past " in line, line
    assert "valid: arrival times up to " in line and "seconds from the trace's start" in line


def test_arrivals_within_the_bound_run(tmp_path: Path) -> None:
    latest = latest_arrival(0.5)
    trace = _trace(tmp_path, f"0,10,4\n{latest!r},10,4\n")
    out = tmp_path / "r.json"
    argv = ["simulate", "replicas", "--replicas", "1", "--exec-model", "const:0.5"]
    assert main([*argv, "--trace-csv", str(trace), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["completed"] == 2
    assert data["request_e2e_time"]["p50"] == pytest.approx(2.0)  # 4 batches of 0.5 s each


def test_a_generated_workload_past_the_bound_names_the_generator_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["simulate", "replicas", "--qps", "1e-6", "--requests", "3"]
    line = refused([*argv, "--exec-model", "const:1e-9"], capsys)
    assert "invalid arrived_at=" in line and "a higher --qps or fewer --requests" in line


def test_the_shortest_batch_of_each_time_model() -> None:
    assert min_batch_seconds(parse_model("const:0.25")) == 0.25
    assert min_batch_seconds(parse_model("linear:0.01,1e-4,2e-4")) == pytest.approx(0.0101)
    assert min_batch_seconds(Table(((1.0, 0.3), (10.0, 0.2), (20.0, 0.4)))) == 0.2
    roofline = parse_model("roofline:llama3-8b@h100")
    assert min_batch_seconds(roofline) == roofline.batch_time(0, 1) == pytest.approx(6e-3, 0.01)


# 2. an empty --trace-csv


@pytest.mark.parametrize("what", ["replicas", "sbs"])
def test_an_empty_trace_path_is_refused(what: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: '' (an unset shell variable) was read as no trace; the generated workload ran."""
    line = refused(["simulate", what, "--trace-csv", "", "--requests", "5"], capsys)
    assert line.startswith("schedspec: error: invalid --trace-csv='': the path of a trace CSV")


# 3. a request the watermark never admits


@pytest.mark.parametrize(
    ("scheduler", "who"),
    [
        ("vidur-vllm-released", "vidur-vllm-released"),
        ("vidur-sarathi-released", "vidur-sarathi-released"),
        ("vidur-vllm-released-ref", "VidurVllmReleased"),
        ("vidur-sarathi-released-ref", "VidurSarathiReleased"),
    ],
)
def test_a_request_above_the_watermark_is_named_with_the_reason(
    scheduler: str, who: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: 'request #-1 needs 0 resources: ... made no progress ... could never be
    scheduled'. 1600 KV tokens are 100 usable blocks of 16; the watermark int(0.01 x 100) = 1
    leaves 99 (1,584 tokens) for a prefill; 101 usable blocks (1,616 tokens) would leave 100."""
    trace = _trace(tmp_path, "0,100,2\n\n0,1600,1\n")

    def argv(kv_tokens: str, trace: Path) -> list[str]:
        return [
            *["simulate", "replicas", "--replicas", "1", "--scheduler", scheduler],
            *["--kv-tokens", kv_tokens, "--max-prefill-tokens", "2000"],
            *["--exec-model", "const:1", "--trace-csv", str(trace)],
        ]

    line = refused(argv("1600", trace), capsys)
    assert line == (
        f"schedspec: error: request #1 ({trace}:4) can never be admitted by {who}: its prefill "
        "of 1600 tokens needs 100 KV blocks of 16 tokens, and Vidur's admission needs the whole "
        "prefill to fit the free blocks above the watermark, int(0.01 x 100 blocks) = 1 "
        "block(s), so even with nothing running at most 99 blocks (1584 tokens); valid: a "
        "prefill of at most 1584 tokens, or a KV pool of at least 1616 tokens (--kv-tokens)"
    )
    assert main(argv("1616", trace)) == 0  # the pool it names fits
    assert main(argv("1600", _trace(tmp_path, "0,1584,1\n", "ok.csv"))) == 0  # so does the prefill


def test_a_stall_of_a_generated_workload_names_the_request_and_is_typed() -> None:
    w = wl.fixed(1, 1.0, wl.Lengths(1600, 1600), wl.Lengths(1, 1))
    make = ReplicaSpec("vidur-vllm-released", 1600, 8, 2000, 1601).factory()
    with pytest.raises(NeverAdmitted) as err:
        simulate_cluster(w, [make()], Constant(1.0))
    assert err.value.request == 0 and str(err.value).startswith("request #0 can never be ")


def test_a_sweep_point_that_stalls_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the one-line error of the failing point did not say which point it was."""
    argv = ["simulate", "sweep", "--backend", "local", "--qps", "2,4"]
    argv += ["--scheduler", "vidur-vllm-released", "--replicas", "1", "--kv-tokens", "1600"]
    argv += ["--prefill", "1600", "--decode", "1", "--requests", "3", "--budget", "2000"]
    argv += ["--max-model-len", "1601"]
    capsys.readouterr()
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert not out
    assert err.splitlines()[-1].startswith(
        "schedspec: error: sweep point scheduler=vidur-vllm-released replicas=1 kv_tokens=1600 "
        "qps=2: request #0 can never be admitted by vidur-vllm-released: its prefill of 1600"
    ), err


# 4. inputs that were clipped or ignored


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--block-size", "8", "--steps", "200:1"],
            "invalid --steps='200:1': forwards per block from 2 to 9 for --block-size 8 (a "
            "block of B tokens takes at most B + 1 forwards); this has 200",
        ),
        (["--steps", "uniform:2-10"], "from 2 to 9 for --block-size 8"),
        (["--block-size", "4", "--steps", "3:1,6:2"], "from 2 to 5 for --block-size 4"),
    ],
)
def test_forwards_per_block_past_the_block_are_refused(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `--block-size 8 --steps 200:1` ran as 9:1 (every draw capped at B + 1)."""
    line = refused(["simulate", "dllm", *argv, "--seats", "1", "--requests", "2"], capsys)
    assert says in line, line


def test_forwards_per_block_in_a_report_past_the_block_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    report.write_text('{"block_size": 8, "algorithm": {"LowConfidence": {"histogram": {"9": 1}}}}')
    argv = ["simulate", "dllm", "--steps-report", str(report), "--block-size", "4"]
    line = refused([*argv, "--seats", "1", "--requests", "2"], capsys)
    assert f"invalid --steps-report='{report}': forwards per block from 2 to 5" in line


@pytest.mark.parametrize("arrivals", [None, "poisson", "fixed"])
def test_a_burst_size_without_bursts_is_refused(
    arrivals: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "replicas", "--burst", "3", "--requests", "5"]
    if arrivals:
        argv += ["--arrivals", arrivals]
    line = refused(argv, capsys)
    assert "invalid --burst=3: only with --arrivals bursts" in line
    assert main([*argv[:-2], "--arrivals", "bursts"]) == 0  # with bursts it runs


def test_a_table_that_extrapolates_past_an_hour_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a batch of a 4,000-token prompt ran for 4,000 s, past the documented bound of
    an hour on a batch time."""
    table = tmp_path / "table.json"
    table.write_text('{"points": [[1, 1.0], [2, 2.0]]}')
    argv = ["simulate", "replicas", "--exec-model", f"table:{table}", "--requests", "2"]
    argv += ["--prefill", "4000"]
    line = refused(argv, capsys)
    assert f"invalid exec_model='table:{table}': a table whose batch times stay seconds in " in line
    assert "extrapolates a batch of " in line and "add measured points that cover " in line
    assert Table(((1.0, 1.0), (2.0, 2.0))).batch_time(3000, 0) == 3000.0  # within the hour


# 5. counts past any pool, and a pool smaller than one block


@pytest.mark.parametrize(
    ("row", "shown"),
    [
        ("0,99999999999999999999,4", "num_prefill_tokens=1e+20"),
        ("0,4611686018427387904,4611686018427387904", "num_prefill_tokens=4.61169e+18"),
        ("0,10,10000000001", "num_decode_tokens=10000000001"),
    ],
)
def test_a_token_count_past_any_pool_names_the_file_and_line(
    row: str, shown: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: 'invalid input (OverflowError: ...)', or max_model_len wrapped round to
    -9223372036854775808 (2**62 + 2**62 in int64)."""
    trace = _trace(tmp_path, f"0,5,5\n{row}\n")
    line = refused(
        ["simulate", "replicas", "--scheduler", "vidur-vllm", "--trace-csv", str(trace)], capsys
    )
    assert line == (
        f"schedspec: error: {trace}:3: {shown} is more tokens than any KV pool the simulator "
        "takes holds; valid: 1 to 10000000000 tokens"
    )


@pytest.mark.parametrize("flag", ["--prefill", "--decode"])
def test_a_token_count_flag_past_any_pool_is_named(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(["simulate", "replicas", flag, "99999999999999999999"], capsys)
    assert line == (
        f"schedspec: error: invalid {flag}='99999999999999999999': 'N' or 'LOW-HIGH' with "
        "1 <= LOW <= HIGH <= 10000000000"
    )


@pytest.mark.parametrize("what", ["replicas", "sweep"])
def test_a_pool_smaller_than_a_block_names_kv_tokens(
    what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: 'invalid num_blocks=1: must be an integer in [2, 10000000]'."""
    argv = ["simulate", what, "--kv-tokens", "10", "--scheduler", "vidur-vllm", "--requests", "3"]
    if what == "sweep":
        argv += ["--backend", "local"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "schedspec: error: invalid --kv-tokens=10: 16 to 159999999 tokens for vidur-vllm "
        "(1 to 9999999 KV blocks of 16 tokens)"
    ), err


# 6. Vidur's metric, and our TPOT


def test_vidurs_decode_time_metric_is_vidurs_formula_and_tpot_has_its_own_name() -> None:
    """Vidur 0.0.25 (metrics_store.py, `_on_request_end`): (completed_at -
    prefill_completed_at) / num_decode_tokens for every completed request, a one-token one
    included (0). Before, that name held (completed - first token) / (decode - 1), NaN and
    left out for one-token requests."""
    w = wl.Workload(
        np.array([0.0, 100.0]), np.array([10, 10], dtype=np.int64), np.array([5, 1], np.int64)
    )
    res = simulate_cluster(w, [SimpleReplica()], Constant(0.5))
    cols = res.metrics.columns()
    # request 0: first token at 0.5 s, done after 4 more batches at 2.5 s; request 1: one batch
    assert cols["decode_time_execution_plus_preemption_normalized"].tolist() == [2.0 / 5, 0.0]
    assert cols["time_per_output_token"][0] == 2.0 / 4 and math.isnan(
        cols["time_per_output_token"][1]
    )
    stats = res.summary.stats
    assert stats["decode_time_execution_plus_preemption_normalized"].count == 2
    assert stats["time_per_output_token"].count == 1


# 7. Vidur's settings, and what the help says


def test_vidur_lightllm_waits_vidurs_ten_decode_batches_by_default() -> None:
    assert ReplicaSpec("vidur-lightllm").ar_config().max_waiting_iters == 10
    assert ReplicaSpec("vidur-lightllm", max_waiting_iters=4).ar_config().max_waiting_iters == 4


def test_max_waiting_iters_changes_lightllm_and_is_refused_elsewhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["simulate", "replicas", "--scheduler", "vidur-lightllm", "--replicas", "1"]
    base += ["--exec-model", "const:0.05", "--kv-tokens", "65536", "--max-batch", "32"]
    base += ["--max-prefill-tokens", "2048", "--requests", "2000"]
    batches = []
    for iters in ("4", "10"):
        out = tmp_path / f"{iters}.json"
        assert main([*base, "--max-waiting-iters", iters, "--json", str(out)]) == 0
        batches.append(json.loads(out.read_text())["batches"])
    out = tmp_path / "default.json"
    assert main([*base, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["batches"] == batches[1] != batches[0]
    line = refused(
        ["simulate", "replicas", "--scheduler", "vidur-vllm", "--max-waiting-iters", "4"], capsys
    )
    assert "invalid --max-waiting-iters=4: only with --scheduler vidur-lightllm" in line
    line = refused(["simulate", "sweep", "--backend", "local", "--max-waiting-iters", "4"], capsys)
    assert "invalid --max-waiting-iters=4: only with a --scheduler list that has" in line


def test_replicas_takes_max_model_len_for_orcas_reservation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Orca reserves max_model_len per request: a larger one admits fewer at a time."""
    base = ["simulate", "replicas", "--scheduler", "vidur-orca", "--replicas", "1"]
    base += ["--kv-tokens", "16384", "--requests", "200", "--qps", "1000"]
    base += ["--prefill", "100", "--decode", "20"]
    figures = []
    for extra in ([], ["--max-model-len", "4096"]):
        out = tmp_path / "o.json"
        assert main([*base, *extra, "--json", str(out)]) == 0
        figures.append(json.loads(out.read_text())["makespan"])
    assert figures[1] > figures[0]
    line = refused([*base, "--max-model-len", "119"], capsys)
    assert "invalid --max-model-len=119: at least 120, the workload's longest request" in line
    line = refused(["simulate", "replicas", "--max-model-len", "4096"], capsys)
    assert "invalid --max-model-len=4096: not with --scheduler simple" in line


def _help(sub: str, flag: str) -> str:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "what")
    child = action.choices[sub]  # type: ignore[index]
    return str(next(a.help for a in child._actions if flag in a.option_strings))


def test_the_help_says_what_seed_and_trace_csv_are() -> None:
    for sub in ("sbs", "replicas", "sweep"):
        assert "forwards per block" not in _help(sub, "--seed"), sub
    assert "forwards per block" in _help("dllm", "--seed")
    for sub in ("sbs", "replicas"):
        text = _help(sub, "--trace-csv")
        assert "Date,Time,PromptTokenCount,CompletionTokenCount" in text
        assert "max_tokens" in text
    for sub in ("replicas", "sweep"):
        assert "Orca and FasterTransformer reserve" in _help(sub, "--max-model-len")


def test_a_workload_names_the_trace_line_of_a_request(tmp_path: Path) -> None:
    trace = _trace(tmp_path, "0,1,1\n\n \n0.5,2,2\n")
    w = wl.read_trace(trace)
    assert [w.where(i) for i in range(2)] == [f"{trace}:2", f"{trace}:5"]
    assert wl.fixed(2, 1.0, wl.Lengths(1, 1), wl.Lengths(1, 1)).where(0) is None
    with pytest.raises(TraceError) as err:
        w.check_clock(1e-12, "a step")
    assert err.value.line == 5
