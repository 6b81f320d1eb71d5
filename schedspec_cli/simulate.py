"""`schedspec simulate dllm|sbs|replicas|sweep ... [--json PATH] [--plots DIR] [--trace PATH]`.

Progress goes to stderr; results to stdout (a short table) and, with --json, to a file.
Typed errors (`SchedSpecError`) propagate to the caller, which prints them and exits 2.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from properties.raised import describe_raised
from reference.algorithms import ALGORITHMS
from reference.sim import workload as wl
from reference.sim.bounds import in_rate, in_seconds, rate_text, seconds_text
from reference.sim.catalog import LIGHTLLM_SCHEDULERS, VIDUR_MAX_WAITING_ITERS
from reference.sim.errors import SimConfigError
from reference.sim.exec_model import parse_model
from schedspec_cli.args import Parser, flag_of, int_in, positive, refuse_ignored
from schedspec_cli.loader import load_object
from schedspec_cli.output import check_output_path, write_json
from schedspec_cli.plots import require_matplotlib
from schedspec_cli.progress import Progress
from spec.ar.config import MAX_BLOCKS, ArConfig
from spec.errors import ConfigError, SchedSpecError

if TYPE_CHECKING:
    from reference.sim.replica import ArReplica


def _progress(label: str) -> Callable[[int, int], None]:
    """A `(done, total)` callback on the CLI's one progress printer."""
    bar = Progress(label)
    t0 = time.perf_counter()

    def report(done: int, total: int) -> None:
        el = time.perf_counter() - t0
        bar.update(f"{done}/{total} ({100 * done / max(total, 1):.0f}%, {el:.1f}s)")
        if done >= total:
            bar.done()

    return report


def _seat_counts(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated integers >= 1 (max_running_requests values)."""
    try:
        seats = tuple(int(x) for x in text.split(","))
    except ValueError:
        seats = ()
    if not seats or any(not 1 <= k <= MAX_SIM_SEATS for k in seats):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a seat list (valid: comma-separated integers in 1..{MAX_SIM_SEATS})"
        )
    return seats


def _bounded_float(text: str, ok: Callable[[float], bool], valid: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text} is out of range (valid: {valid})")
    return value


def _cost_seconds(text: str) -> float:
    """An added cost in seconds (an overhead): 0 up to an hour."""
    return _bounded_float(text, lambda v: in_seconds(v, positive=False), seconds_text(False))


def _batch_seconds(text: str) -> float:
    """A batch time in seconds: a nanosecond up to an hour."""
    return _bounded_float(text, lambda v: in_seconds(v, positive=True), seconds_text(True))


def _rate(text: str) -> float:
    return _bounded_float(text, in_rate, rate_text())


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _dump(obj: object, path: str | None) -> None:
    if path:
        write_json(path, obj)
        _say(f"wrote {path}")


# the generated workload's flags (each is --NAME); their defaults per command are set by
# `_add_workload` as `generated_defaults`, so a flag given with --trace-csv can be told apart
_GENERATED = ("arrivals", "qps", "burst", "requests", "prefill", "decode")


def _workload(args: argparse.Namespace) -> wl.Workload:
    """The trace (--trace-csv) or the generated workload; a generator flag given together with
    a trace, or --burst without --arrivals bursts, is refused rather than ignored, and so is an
    empty --trace-csv (an unset shell variable), rather than read as no trace."""
    given = {name: getattr(args, name) for name in _GENERATED if getattr(args, name) is not None}
    if args.trace_csv is not None and not args.trace_csv.strip():
        raise SimConfigError(
            "--trace-csv",
            args.trace_csv,
            "the path of a trace CSV (an empty path names no file); leave --trace-csv out for "
            "a generated workload",
        )
    if args.trace_csv is not None:
        if given:
            first = next(iter(given))
            raise SimConfigError(
                f"--{first}",
                given[first],
                "no generated-workload flag with --trace-csv (the trace fixes arrivals and "
                f"lengths); drop {', '.join(f'--{name}' for name in given)}",
            )
        return wl.read_trace(args.trace_csv)
    g = {**args.generated_defaults, **given}
    if "burst" in given and g["arrivals"] != "bursts":
        raise SimConfigError(
            "--burst",
            args.burst,
            f"only with --arrivals bursts (the requests of one burst; --arrivals {g['arrivals']} "
            f"has no bursts)",
        )
    pre = wl.Lengths.parse(g["prefill"], "--prefill")
    dec = wl.Lengths.parse(g["decode"], "--decode")
    if g["arrivals"] == "poisson":
        return wl.poisson(g["requests"], g["qps"], pre, dec, args.seed)
    if g["arrivals"] == "bursts":
        return wl.bursts(
            g["requests"], g["burst"], 1.0 / g["qps"] * g["burst"], pre, dec, args.seed
        )
    return wl.fixed(g["requests"], 1.0 / g["qps"], pre, dec, args.seed)


def _add_workload(
    p: argparse.ArgumentParser, qps: float, requests: int, prefill: str, decode: str, seed: str
) -> None:
    p.add_argument("--trace-csv", help=TRACE_CSV_HELP)
    p.add_argument("--arrivals", choices=("poisson", "bursts", "fixed"), help="default poisson")
    p.add_argument("--qps", type=_rate, help=f"default {qps:g}")
    p.add_argument(
        "--burst", type=positive(), help="requests per burst (--arrivals bursts; default 8)"
    )
    p.add_argument("--requests", type=positive(MAX_SIM_REQUESTS), help=f"default {requests}")
    p.add_argument("--prefill", help=f"prompt tokens: N or LOW-HIGH (default {prefill})")
    p.add_argument("--decode", help=f"output tokens: N or LOW-HIGH (default {decode})")
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0, help=seed)
    p.set_defaults(
        generated_defaults={
            "arrivals": "poisson",
            "qps": qps,
            "burst": 8,
            "requests": requests,
            "prefill": prefill,
            "decode": decode,
        }
    )


def _add_outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--plots", help="write PNG plots into this directory")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace JSON here")


# The dLLM simulation runs the reference scheduler step by step: a block of B tokens costs
# O(B) per forward over up to B + 1 forwards, and its KV events hold B slots each, so time and
# memory grow with B^2 (block 512, 10 requests, one seat: 31 s and 1.1 GiB on the 2-core
# development machine; block 4096 ran out of any sensible budget). dLLM block sizes in use are
# 4-64; this bound keeps the command finite.
MAX_SIM_BLOCK_SIZE = 256
MAX_SIM_REQUESTS = 10_000_000
MAX_SIM_REQUEST_BLOCKS = 100_000  # generated blocks per request; a prompt's blocks likewise
MAX_SIM_SEATS = 4096

DLLM_SEED_HELP = (
    "the seed of every random draw (forwards per block; with --profile-order sample, the "
    "profiles; default 0)"
)
SBS_SEED_HELP = (
    "the seed of every random draw (the generated workload's arrivals and lengths, the "
    "gated-queueing model's arrivals; default 0)"
)
REPLICAS_SEED_HELP = (
    "the seed of every random draw (the generated workload's arrivals and lengths, "
    "--global-scheduler random; default 0)"
)
SWEEP_SEED_HELP = (
    "the seed of every random draw (each point's arrivals and lengths, --global-scheduler "
    "random; default 0)"
)
TRACE_CSV_HELP = (
    "serve this trace CSV instead of a generated workload: columns arrived_at,"
    "num_prefill_tokens,num_decode_tokens (seconds from the trace's start, tokens; "
    "microsoft/vidur GitHub main's trace format). Not the Date,Time,PromptTokenCount,"
    "CompletionTokenCount traces that Vidur 0.0.25 and 0.0.26 replay; and every row is served "
    "as it is, where Vidur's replay trims a prompt so that prompt plus output fits its "
    "max_tokens (4096)"
)
MAX_MODEL_LEN_HELP = (
    "the longest request (prompt plus output) an AR scheduler admits; Orca and "
    "FasterTransformer reserve this many tokens of KV blocks per request, so their figures "
    "depend on it (Vidur reserves its request generator's max_tokens, 4096 by default)"
)
MAX_WAITING_ITERS_HELP = (
    "LightLLM's decode batches between prefill attempts (vidur-lightllm%(own)s only; default "
    "%(default)s, Vidur's LightllmSchedulerConfig default)"
)
EXEC_MODEL_HELP = (
    "forward-time model: 'const:SECONDS', 'linear:BASE,PER_PREFILL,PER_DECODE[,PER_KV]', "
    "'roofline:MODEL@DEVICE[xPARALLEL]' or 'table:PATH.json' (default %(default)s)"
)
GLOBAL_SCHEDULER_HELP = (
    "which replica a request goes to: round_robin, lor (least outstanding requests) or random "
    "(default %(default)s)"
)
DESCRIPTION = """Serving simulations in simulated time: `dllm` (sync vs FDFO on the reference dLLM
scheduler), `sbs` (immediate dispatch vs Staggered Batch Scheduling, P/D separated),
`replicas` (a cluster of AR replica schedulers) and `sweep` (a capacity grid). Progress goes to
stderr, a short table to stdout, and the results, with --json, to a file. Each subcommand
takes --help."""


def build_parser() -> Parser:
    """The simulator's flags; a bad one raises `UsageError` (one line, exit 2), like every
    other command's."""
    ap = Parser(prog="schedspec simulate", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="what", required=True, parser_class=Parser)

    d = sub.add_parser("dllm", help="dLLM sync vs FDFO (with/without in-place reuse) sweep")
    d.add_argument(
        "--block-size",
        type=positive(MAX_SIM_BLOCK_SIZE),
        help=f"diffusion block size, 1..{MAX_SIM_BLOCK_SIZE} (default 8)",
    )
    d.add_argument(
        "--steps",
        help=f"forwards per block: 'F:COUNT,...' or 'uniform:LO-HI', F from 2 to "
        f"{MAX_SIM_BLOCK_SIZE + 1} (a block of B tokens takes at most B + 1 forwards), each "
        "COUNT finite and >= 0 (default: gpu/assets/rounds_report.json if present, else "
        "uniform)",
    )
    d.add_argument(
        "--steps-report",
        help="a rounds_report.json (written by the engine's calibration) to read the "
        "forwards-per-block histogram from, instead of the shipped one",
    )
    d.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default=None,
        help="whose measured histogram to read from the rounds report (the shipped one or "
        "--steps-report; default LowConfidence)",
    )
    d.add_argument(
        "--seats",
        type=_seat_counts,
        help="comma-separated max_running_requests values (default 1,2,4,8,16)",
    )
    d.add_argument(
        "--requests", type=positive(MAX_SIM_REQUESTS), help="requests per run (default 128)"
    )
    d.add_argument(
        "--gen-blocks",
        type=positive(MAX_SIM_REQUEST_BLOCKS),
        help="generated blocks per request (default 16)",
    )
    d.add_argument(
        "--forward",
        help="forward-time model, in the syntax of `simulate replicas --exec-model` (default "
        "linear:0.020,2e-5,0: seconds per forward, per prefill token, per decode token)",
    )
    d.add_argument("--round-overhead", type=_cost_seconds, help="seconds per round (default 0.002)")
    d.add_argument(
        "--alloc-cost", type=_cost_seconds, help="seconds per block allocation (default 0.0001)"
    )
    d.add_argument(
        "--alloc-round-cost",
        type=_cost_seconds,
        help="seconds per round that allocates (default 0.0015)",
    )
    d.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0, help=DLLM_SEED_HELP)
    d.add_argument(
        "--calibration",
        help="a calibration table (scripts/calibrate_dllm.py): per-mode forward and round "
        "times measured on the engine; sets the block size, requests, new tokens, seats and "
        "time model to the measured workload's (those flags are refused with it), replays its "
        "measured request profiles (prompt lengths, forwards per block), and prints the "
        "measured ratios next to the predicted",
    )
    d.add_argument(
        "--time-model",
        choices=("shared", "per-mode"),
        help="with --calibration: 'shared' (default) fits one forward/row/round cost to every "
        "mode (the prediction); 'per-mode' replays each mode's own measured costs (a work check)",
    )
    d.add_argument(
        "--profile-order",
        choices=("cycle", "sample"),
        help="with --calibration: 'cycle' (default) replays the profiles in the benchmark's "
        "order, 'sample' draws one whole profile per request (seeded by --seed)",
    )
    _add_outputs(d)

    s = sub.add_parser("sbs", help="gated-queueing reproduction and SBS vs immediate dispatch")
    s.add_argument(
        "--dp-units",
        type=positive(4096),
        default=16,
        help="data-parallel units per prefill instance, N of the queueing model (default "
        "%(default)s)",
    )
    s.add_argument(
        "--batch-time",
        type=_batch_seconds,
        default=0.1,
        help="T of the queueing model: seconds per batch (default %(default)s)",
    )
    s.add_argument(
        "--prefill-instances",
        type=positive(4096),
        default=2,
        help="prefill instances, each of --dp-units units (default %(default)s)",
    )
    s.add_argument(
        "--decode-units",
        type=positive(4096),
        default=32,
        help="units of the decode instance (default %(default)s)",
    )
    _add_workload(s, 120.0, 6000, "256-4096", "64-512", SBS_SEED_HELP)
    _add_outputs(s)

    r = sub.add_parser("replicas", help="replica-level simulation (Vidur tiers)")
    r.add_argument(
        "--replicas", type=positive(4096), default=4, help="replicas (default %(default)s)"
    )
    r.add_argument(
        "--scheduler",
        default="simple",
        help="'simple', a replica scheduler as `simulate sweep` names them (vidur-vllm, "
        "vidur-sarathi-released, ...: see its --help), or an AR factory 'module:callable' "
        "(e.g. reference.ar.vllm_v1:make_vllm_v1)",
    )
    r.add_argument(
        "--global-scheduler",
        default="round_robin",
        choices=("round_robin", "lor", "random"),
        help=GLOBAL_SCHEDULER_HELP,
    )
    r.add_argument("--exec-model", default="roofline:llama3-8b@h100", help=EXEC_MODEL_HELP)
    r.add_argument(
        "--max-batch",
        type=positive(1_000_000),
        default=128,
        help="seats (running requests) per replica (default %(default)s)",
    )
    r.add_argument(
        "--kv-tokens",
        type=positive(10**10),
        default=200_000,
        help="KV-cache tokens per replica (default %(default)s)",
    )
    r.add_argument(
        "--max-prefill-tokens",
        type=positive(10**9),
        default=4096,
        help="prompt tokens a replica step takes at most (the token budget; default %(default)s)",
    )
    r.add_argument(
        "--max-model-len",
        type=positive(10**8),
        default=None,
        help=f"{MAX_MODEL_LEN_HELP} (default: the workload's longest request; not with "
        "--scheduler simple, which has no such limit)",
    )
    r.add_argument(
        "--max-waiting-iters",
        type=int_in(1, 10**6),
        default=None,
        help=MAX_WAITING_ITERS_HELP
        % {"own": ", or an AR factory's ArConfig,", "default": VIDUR_MAX_WAITING_ITERS},
    )
    _add_workload(r, 10.0, 2000, "64-1024", "16-256", REPLICAS_SEED_HELP)
    _add_outputs(r)
    _add_sweep(sub)
    return ap


def _add_sweep(sub: Any) -> None:
    from reference.sim.catalog import SCHEDULERS

    w = sub.add_parser(
        "sweep",
        help="a capacity grid (qps x scheduler x replicas x KV pool) in parallel on Ray",
    )
    w.add_argument(
        "--qps",
        default="16,32,64,128",
        help="comma-separated arrival rates, requests/s over all replicas (default %(default)s)",
    )
    w.add_argument(
        "--scheduler",
        default="vidur-vllm,vidur-sarathi,vidur-orca",
        help=f"comma-separated replica schedulers: {', '.join(SCHEDULERS)} (default %(default)s)",
    )
    w.add_argument(
        "--replicas", default="2", help="comma-separated replica counts (default %(default)s)"
    )
    w.add_argument(
        "--kv-tokens",
        default="8192,32768",
        help="comma-separated KV pool sizes, tokens per replica (default %(default)s)",
    )
    w.add_argument(
        "--requests",
        type=positive(MAX_SIM_REQUESTS),
        default=1000,
        help="requests per point (default %(default)s)",
    )
    w.add_argument(
        "--prefill", default="64-1024", help="prompt tokens: N or LOW-HIGH (default %(default)s)"
    )
    w.add_argument(
        "--decode", default="16-256", help="output tokens: N or LOW-HIGH (default %(default)s)"
    )
    w.add_argument(
        "--max-batch",
        type=positive(1_000_000),
        default=32,
        help="seats per replica (default %(default)s)",
    )
    w.add_argument(
        "--budget",
        type=positive(10**9),
        default=2048,
        help="tokens per batch (chunk size; default %(default)s)",
    )
    w.add_argument(
        "--max-model-len",
        type=positive(10**8),
        default=None,
        help=f"{MAX_MODEL_LEN_HELP} (default 1280; not with --scheduler simple alone, which "
        "has no such limit)",
    )
    w.add_argument("--exec-model", default="roofline:llama3-8b@h100", help=EXEC_MODEL_HELP)
    w.add_argument(
        "--global-scheduler",
        default="round_robin",
        choices=("round_robin", "lor", "random"),
        help=GLOBAL_SCHEDULER_HELP,
    )
    w.add_argument(
        "--max-waiting-iters",
        type=int_in(1, 10**6),
        default=None,
        help=MAX_WAITING_ITERS_HELP % {"own": "", "default": VIDUR_MAX_WAITING_ITERS},
    )
    w.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0, help=SWEEP_SEED_HELP)
    w.add_argument(
        "--backend",
        default="ray",
        choices=("ray", "local"),
        help="ray (parallel; local Ray unless --address) or local (one process; default "
        "%(default)s)",
    )
    w.add_argument(
        "--address",
        help="an existing Ray cluster, e.g. ray://head:10001 or auto (--backend ray only)",
    )
    w.add_argument(
        "--num-cpus",
        type=positive(4096),
        help="CPUs of the local Ray (--backend ray without --address only; default: all)",
    )
    w.add_argument("--json", help="write the results as JSON here")
    w.add_argument("--csv", help="write the results as CSV here")
    w.add_argument("--plots", help="write throughput-vs-latency PNGs into this directory")


def _floats(flag: str, text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if not vals or any(not v > 0 or v != v or v == float("inf") for v in vals):
        raise SimConfigError(flag, text, "comma-separated finite numbers > 0")
    return vals


def _ints(flag: str, text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if not vals or any(v < 1 for v in vals):
        raise SimConfigError(flag, text, "comma-separated integers >= 1")
    return vals


DEFAULT_MAX_MODEL_LEN = 1280  # `reference.sim.catalog.ReplicaSpec`'s


def cmd_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """`simulate sweep`: run the grid of (qps, scheduler, replicas, KV tokens) points on Ray
    or in one process, a progress line per point; print the table, write `--csv` and `--plots`
    when given, and return the JSON-ready results. A bad value raises `SimConfigError`."""
    from reference.sim import sweep as sw

    schedulers = [s.strip() for s in args.scheduler.split(",")]
    if args.max_model_len is None:
        args.max_model_len = DEFAULT_MAX_MODEL_LEN
    elif set(schedulers) == {"simple"}:  # it would be ignored: refuse it, as other flags are
        raise SimConfigError(
            "--max-model-len",
            args.max_model_len,
            "left out with --scheduler simple (it admits any length that fits its KV tokens)",
        )
    if args.max_waiting_iters is None:
        args.max_waiting_iters = VIDUR_MAX_WAITING_ITERS
    elif not set(schedulers) & set(LIGHTLLM_SCHEDULERS):  # it would be ignored: refuse it
        refuse_ignored(
            args,
            ["max_waiting_iters"],
            f"only with a --scheduler list that has {' or '.join(LIGHTLLM_SCHEDULERS)} "
            "(LightLLM's setting)",
        )
    _sweep_backend_flags(args)
    rates = _floats("--qps", args.qps)
    for rate in rates:
        if not in_rate(rate):  # named by the flag here, as the other commands' --qps is
            raise SimConfigError(
                "--qps",
                args.qps,
                f"comma-separated rates, each {rate_text().removeprefix('a rate ')}",
            )
    points = sw.grid(
        rates,
        schedulers,
        _ints("--replicas", args.replicas),
        _ints("--kv-tokens", args.kv_tokens),
        requests=args.requests,
        prefill=args.prefill,
        decode=args.decode,
        max_batch=args.max_batch,
        budget=args.budget,
        max_model_len=args.max_model_len,
        exec_model=args.exec_model,
        global_scheduler=args.global_scheduler,
        seed=args.seed,
        max_waiting_iters=args.max_waiting_iters,
    )
    if args.num_cpus is not None and args.num_cpus < 1:
        raise SimConfigError("--num-cpus", args.num_cpus, "an integer >= 1")
    if args.backend == "ray" and args.address:
        sw.check_ray_address(args.address)
    where = args.address or "local Ray" if args.backend == "ray" else "one process"
    _say(f"{len(points)} points on {where}")
    t0 = time.perf_counter()

    def report(done: int, total: int, r: Any) -> None:
        p = r.point
        _say(
            f"[{done}/{total}] {p.scheduler} x{p.replicas} kv={p.kv_tokens} qps={p.qps:g}: "
            f"e2e p90 {r.e2e_p90:.3f} s ({time.perf_counter() - t0:.1f} s)"
        )

    try:
        results = sw.run_grid(points, args.backend, args.address, args.num_cpus, report)
    except ConfigError as err:
        if err.field != "kv_tokens":
            raise
        raise ConfigError("--kv-tokens", err.value, err.valid) from None
    print(sw.table(results))
    if args.csv:
        sw.write_csv(results, Path(args.csv))
        _say(f"wrote {args.csv}")
    if args.plots:
        for path in sw.plot_throughput_latency(results, Path(args.plots)):
            _say(f"wrote {path}")
    return {
        "backend": args.backend,
        "points": len(points),
        "wall_s": time.perf_counter() - t0,
        "results": [r.row() for r in results],
    }


def _sweep_backend_flags(args: argparse.Namespace) -> None:
    """Refuse a Ray flag the backend would ignore: --address and --num-cpus with --backend
    local (one process, no Ray), --num-cpus with --address (the cluster has its own CPUs)."""
    if args.backend == "local":
        given = [n for n in ("address", "num_cpus") if getattr(args, n) is not None]
        refuse_ignored(args, given, "only with --backend ray (local runs in this process)")
    elif args.address and args.num_cpus is not None:  # '' is the local Ray
        refuse_ignored(
            args,
            ["num_cpus"],
            "only with a local Ray (--backend ray without --address; a cluster at --address "
            "has its own CPUs)",
        )


def _step_distribution(args: argparse.Namespace, cal: Any) -> Any:
    """Forwards per block: the calibration's profiles, else --steps / --steps-report / default."""
    from reference.sim.dllm import StepDist

    profiled = cal is not None and cal.workload() is not None
    if args.steps is not None and args.steps_report is not None:
        raise SimConfigError(
            "--steps", args.steps, "either --steps or --steps-report, not both (one histogram)"
        )
    if profiled and (args.steps is not None or args.steps_report is not None):
        flag, value = (
            ("--steps", args.steps)
            if args.steps is not None
            else ("--steps-report", args.steps_report)
        )
        raise SimConfigError(
            flag,
            value,
            "not with --calibration: the forwards per block come from its measured profiles",
        )
    if args.algorithm is not None and (profiled or args.steps is not None):
        given = "--calibration's measured profiles" if profiled else "--steps"
        raise SimConfigError(
            "--algorithm",
            args.algorithm,
            f"only with a rounds report; the forwards per block already come from {given}",
        )
    algorithm = args.algorithm or "LowConfidence"
    if profiled:
        return StepDist.from_histogram(cal.workload().histogram(), "the calibration's profiles")
    if args.steps is not None:
        # F can be at most one more than the largest block (one token unmasked per forward,
        # then the final-KV forward): a bound that also keeps 'uniform:LO-HI' small
        dist = StepDist.parse(args.steps, max_forwards=MAX_SIM_BLOCK_SIZE + 1)
        return _within_block(dist, "--steps", args.steps, args.block_size)
    if args.steps_report is not None:
        try:
            dist = StepDist.from_report(Path(args.steps_report), algorithm)
        except SimConfigError as err:
            if err.field != "steps_report":
                raise
            raise SimConfigError("--steps-report", args.steps_report, err.valid) from None
        return _within_block(dist, "--steps-report", args.steps_report, args.block_size)
    return StepDist.default(args.block_size, algorithm)


def _within_block(dist: Any, flag: str, value: str, block_size: int) -> Any:
    """`dist` if a block of `block_size` tokens can take each of its forwards per block (at most
    block_size + 1: one token unmasked per forward, then the final-KV one); else an input error
    naming `flag`, rather than the run capping those draws at block_size + 1."""
    over = [f for f in dist.values if f > block_size + 1]
    if over:
        raise SimConfigError(
            flag,
            value,
            f"forwards per block from 2 to {block_size + 1} for --block-size {block_size} (a "
            f"block of B tokens takes at most B + 1 forwards); this has {max(over)}",
        )
    return dist


# `simulate dllm`'s workload sizes and time model, and the flags that only shape a calibrated
# run; their defaults are applied after parsing, so that a flag the user gave can be told
# apart from one the run would ignore
_DLLM_DEFAULTS: dict[str, object] = {
    "block_size": 8,
    "seats": (1, 2, 4, 8, 16),
    "requests": 128,
    "gen_blocks": 16,
    "forward": "linear:0.020,2e-5,0",
    "round_overhead": 0.002,
    "alloc_cost": 0.0001,
    "alloc_round_cost": 0.0015,
}
_CALIBRATED_DEFAULTS: dict[str, object] = {"time_model": "shared", "profile_order": "cycle"}


def _dllm_flags(args: argparse.Namespace) -> None:
    """Fill in the defaults; refuse a flag that the run would silently ignore: a size or cost
    with --calibration (the table sets them), a calibration option without it."""

    def given(names: dict[str, object]) -> list[str]:
        return [n for n in names if getattr(args, n) is not None]

    if args.calibration is not None:
        refuse_ignored(
            args,
            given(_DLLM_DEFAULTS),
            "not with --calibration (the table sets the block size, requests, new tokens, "
            "seats and time costs)",
        )
    else:
        refuse_ignored(
            args,
            given(_CALIBRATED_DEFAULTS),
            "only with --calibration (it shapes a calibrated run)",
        )
    for name, value in {**_DLLM_DEFAULTS, **_CALIBRATED_DEFAULTS}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def cmd_dllm(args: argparse.Namespace) -> dict[str, Any]:
    """`simulate dllm`: sync vs FDFO (with and without in-place reuse) throughput over the seat
    counts, from a step distribution or a `--calibration` table (then also printed against its
    measurements); print the table, write `--plots` / `--trace` for one seat count (4 when
    swept), and return the JSON-ready results. A flag the run would ignore is refused."""
    from reference.sim.dllm import DllmParams, sweep

    _dllm_flags(args)
    cal = _load_calibration(args) if args.calibration is not None else None
    seats = cal.seats() if cal is not None else args.seats
    dist = _step_distribution(args, cal)
    base = DllmParams(
        block_size=args.block_size,
        num_requests=args.requests,
        gen_blocks=args.gen_blocks,
        forward=parse_model(args.forward),
        round_overhead=args.round_overhead,
        alloc_cost=args.alloc_cost,
        alloc_round_cost=args.alloc_round_cost,
        seed=args.seed,
        profiles=cal.workload() if cal is not None else None,
        profile_order=args.profile_order,
    )
    _say(f"step distribution: {dist.source}, mean {dist.mean():.2f} forwards per block")
    overrides = _calibrated_costs(cal, args.time_model) if cal is not None else None
    rows = sweep(dist, seats, base, progress=_say, overrides=overrides)
    if cal is not None:
        _print_calibrated(rows, cal, args.time_model)
    out: dict[str, Any] = {
        "calibration": cal.to_json() if cal is not None else None,
        "distribution": {
            "source": dist.source,
            "values": dist.values,
            "weights": dist.weights,
            "mean": dist.mean(),
        },
        "sweep": rows,
        "sglang_reported": {
            "fdfo_over_sync": {"4": 1.30, "16": 1.45},
            "reuse_gain": {"4": 0.074, "16": 0.013},
        },
    }
    _print_dllm_sweep(rows)
    if args.plots or args.trace:
        _dllm_outputs(args, base, dist, seats, rows)
    return out


def _print_dllm_sweep(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'seats':>5} {'sync tok/s':>11} {'fdfo':>8} {'fdfo+reuse':>10} {'ratio':>6} "
        f"{'ratio+reuse':>11} {'reuse':>7} {'bound':>6}"
    )
    for row in rows:
        print(
            f"{row['max_running_requests']:>5} {row['sync_tok_s']:>11.1f} "
            f"{row['fdfo_tok_s']:>8.1f} {row['fdfo_reuse_tok_s']:>10.1f} "
            f"{row['fdfo_over_sync']:>6.3f} {row['fdfo_reuse_over_sync']:>11.3f} "
            f"{100 * float(row['reuse_gain']):>6.1f}% {row['ideal_bound']:>6.3f}"
        )


def _calibrated_costs(cal: Any, time_model: str) -> Any:
    """Per (mode label, seats) parameter overrides from the calibration's time model."""
    shared = cal.shared_time()

    def overrides(label: str, k: int) -> dict[str, object]:
        if time_model == "shared":
            return {
                "forward": shared.forward_model(cal.block_size),
                "round_overhead": shared.per_round,
                "row_round_cost": shared.per_row_round,
                "alloc_cost": shared.per_alloc,
                "alloc_round_cost": 0.0,
            }
        return {  # each mode's own measured figures include its allocations and row work
            "forward": cal.forward_model(label),
            "round_overhead": cal.round_overhead(label, k),
            "row_round_cost": 0.0,
            "alloc_cost": 0.0,
            "alloc_round_cost": 0.0,
        }

    return overrides


def _check_calibration_sizes(cal: Any) -> None:
    """A calibration sets the sizes the flags would: hold it to the flags' bounds (a table
    edited past them would run for hours, not fail)."""
    from reference.sim.calibration import CalibrationError

    b = cal.block_size
    bounds = (
        ("block_size", b, MAX_SIM_BLOCK_SIZE, "--block-size"),
        ("requests", cal.requests, MAX_SIM_REQUESTS, "--requests"),
        (
            "max_new_tokens / block_size",
            cal.max_new_tokens // b,
            MAX_SIM_REQUEST_BLOCKS,
            "--gen-blocks",
        ),
        ("rows' max_running", max(cal.seats(), default=0), MAX_SIM_SEATS, "--seats"),
        (
            "profiles' prompt_len / block_size",
            max((p.prompt_len // b for p in cal.profiles), default=0),
            MAX_SIM_REQUEST_BLOCKS,
            "--gen-blocks",
        ),
    )
    for field, value, high, flag in bounds:
        if value > high:
            raise CalibrationError(
                cal.path, f"{field} is {value}, beyond the simulator's bound {high} (as {flag})"
            )


def _load_calibration(args: argparse.Namespace) -> Any:
    """The calibration table; the run takes the measured workload's sizes from it."""
    from reference.sim.calibration import Calibration

    if not args.calibration.strip():  # Path("") is the current directory
        raise SimConfigError("--calibration", args.calibration, "a calibration table's path")
    cal = Calibration.load(Path(args.calibration))
    _check_calibration_sizes(cal)
    args.block_size = cal.block_size
    args.requests = cal.requests
    args.gen_blocks = cal.max_new_tokens // cal.block_size
    return cal


def _dllm_outputs(
    args: argparse.Namespace, base: Any, dist: Any, seats: tuple[int, ...], rows: list[Any]
) -> None:
    """Gantt chart, KV occupancy and ratio plots, and the Chrome trace, of one seat count."""
    from reference.sim import export
    from reference.sim.dllm import DllmParams, simulate_dllm
    from spec.config import Mode

    k = 4 if 4 in seats else seats[0]
    runs = {}
    for mode, reuse in ((Mode.SYNC, False), (Mode.FDFO, False), (Mode.FDFO, True)):
        p = DllmParams(
            **{
                **base.__dict__,
                "max_running": k,
                "mode": mode,
                "in_place_reuse": reuse,
                "num_requests": min(16, args.requests),
            }
        )
        runs[f"{p.label()} k={k}"] = simulate_dllm(p, dist)
    if args.trace:
        export.write_trace(export.trace_dllm(runs), Path(args.trace))
        _say(f"wrote {args.trace}")
    if args.plots:
        d = Path(args.plots)
        export.gantt_rounds(runs, d / "dllm_rounds_gantt.png")
        export.kv_occupancy(
            {lbl: [(t, float(v)) for t, v in r.kv_samples] for lbl, r in runs.items()},
            next(iter(runs.values())).kv_slots,
            d / "dllm_kv.png",
            "dLLM KV slots owned",
        )
        _plot_ratio(rows, d / "dllm_fdfo_vs_sync.png")
        _say(f"wrote plots to {d}")


def _print_calibrated(rows: list[dict[str, Any]], cal: Any, time_model: str) -> None:
    print(f"calibrated on {cal.device} ({cal.source}), time model: {time_model}")
    shared = cal.shared_time()
    print(
        f"shared time model (fitted to every mode): {1000 * shared.per_forward:.4f} ms per "
        f"forward + {1000 * shared.per_row:.4f} ms per row + {1000 * shared.per_round:.4f} ms "
        f"per round + {1000 * shared.per_row_round:.4f} ms per row-round + "
        f"{1000 * shared.per_alloc:.4f} ms per block allocation"
    )
    print("the work per run: simulated vs measured forwards, row-rounds and block allocations")
    print(
        f"{'seats':>5} {'mode':>10} {'forwards':>8} {'measured':>8} {'row-rnds':>8} "
        f"{'measured':>8} {'allocs':>7} {'measured':>8}"
    )
    for row in rows:
        seats = int(row["max_running_requests"])
        for label, key in (("sync", "sync"), ("fdfo", "fdfo"), ("fdfo+reuse", "fdfo_reuse")):
            m = cal.row(label, seats)
            if m is not None:
                n = cal.repeats
                print(
                    f"{seats:>5} {label:>10} {row[key + '_forwards']:>8.0f} {m.forwards / n:>8.1f} "
                    f"{row[key + '_row_rounds']:>8.0f} {m.row_rounds / n:>8.1f} "
                    f"{row[key + '_allocations']:>7.0f} {m.block_allocations / n:>8.1f}"
                )
    print(
        "throughput ratios: predicted; measured = every repeat pooled (tokens / seconds of the "
        "summed runs); median and range of the per-repeat paired ratios (the benchmark's)"
    )
    print(
        f"{'seats':>5} {'mode':>10} {'predicted':>9} {'measured':>8} {'error':>6} "
        f"{'median':>6} {'error':>6} {'paired range':>13}"
    )
    for row in rows:
        k = int(row["max_running_requests"])
        for label, key in (("fdfo", "fdfo_over_sync"), ("fdfo+reuse", "fdfo_reuse_over_sync")):
            pooled = cal.pooled_ratio(label, "sync", k)
            if pooled is None:
                continue
            pred = float(row[key])
            median = cal.measured_ratios.get(f"{label}/sync", {}).get(str(k), math.nan)
            lo, hi = cal.paired_range.get(f"{label}/sync", {}).get(str(k), (math.nan, math.nan))
            err, err_median = 100 * (pred / pooled - 1), 100 * (pred / median - 1)
            print(
                f"{k:>5} {label:>10} {pred:>9.3f} {pooled:>8.3f} {err:+5.1f}% "
                f"{median:>6.3f} {err_median:+5.1f}% {lo:>6.3f}..{hi:<6.3f}"
            )


def _plot_ratio(rows: list[dict[str, Any]], path: Path) -> None:
    from reference.sim.export import _pyplot

    plt = _pyplot()
    ks = [r["max_running_requests"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot(ks, [r["fdfo_over_sync"] for r in rows], "o-", label="FDFO / sync (no reuse)")
    ax.plot(ks, [r["fdfo_reuse_over_sync"] for r in rows], "s-", label="FDFO+reuse / sync")
    ax.plot(ks, [r["ideal_bound"] for r in rows], "k--", label="ideal E[max_k]/E[F]")
    ax.plot([4, 16], [1.30, 1.45], "r*", ms=10, label="SGLang #27551 (H200)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("max_running_requests")
    ax.set_ylabel("throughput ratio")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_sbs(args: argparse.Namespace) -> dict[str, Any]:
    """`simulate sbs`: the gated-queueing mean waits (immediate vs staggered, against T/2 and
    T/(2N)), then the workload under immediate dispatch and under SBS; print a line each,
    write `--trace` / `--plots` when given, and return the JSON-ready results."""
    from reference.sim.queueing import simulate_gated

    workload = _workload(args)  # read first: a bad --trace-csv fails before anything prints
    imm = simulate_gated(args.dp_units, args.batch_time, "immediate", seed=args.seed)
    stg = simulate_gated(args.dp_units, args.batch_time, "staggered", seed=args.seed)
    results = _sbs_deployments(args, workload)  # run before printing: its errors print alone
    print(
        f"gated queueing, N={args.dp_units}, T={args.batch_time}: mean wait immediate "
        f"{imm.mean_wait:.5f} s (T/2 = {imm.formula:.5f}), staggered {stg.mean_wait:.5f} s "
        f"(T/(2N) = {stg.formula:.5f})"
    )
    for pol, r in results.items():
        st = r.summary.stats
        print(
            f"{pol:>9}: TTFT mean {st['prefill_e2e_time'].mean:.3f} s p99 "
            f"{st['prefill_e2e_time'].p99:.3f} s, throughput "
            f"{r.summary.throughput_tokens:.0f} output tok/s, {r.prefill_forwards} prefill "
            f"forwards (mean {r.mean_prefill_forward:.3f} s)"
        )
    out: dict[str, Any] = {
        "dp_units": args.dp_units,
        "batch_time": args.batch_time,
        "mean_wait_immediate": imm.mean_wait,
        "mean_wait_staggered": stg.mean_wait,
        "formula_immediate": imm.formula,
        "formula_staggered": stg.formula,
        "deployment": {pol: r.as_dict() for pol, r in results.items()},
    }
    _sbs_outputs(args, results)
    return out


def _sbs_deployments(args: argparse.Namespace, w: wl.Workload) -> dict[str, Any]:
    """The workload under immediate dispatch and under SBS (`cmd_sbs` prints them)."""
    from reference.sim.sbs import SbsParams, simulate_sbs

    results = {}
    for pol in ("immediate", "sbs"):
        params = SbsParams(
            policy=pol,
            dp_units=args.dp_units,
            prefill_instances=args.prefill_instances,
            decode_units=args.decode_units,
            record=bool(args.trace),
        )
        results[pol] = simulate_sbs(w, params, progress=_progress(pol))
    return results


def _sbs_outputs(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """--trace (the SBS run's spans) and --plots (latency CDFs of both policies)."""
    if args.trace:
        from reference.sim import export

        export.write_trace(
            export.trace_sbs(results["sbs"].spans, args.prefill_instances), Path(args.trace)
        )
        _say(f"wrote {args.trace}")
    if args.plots:
        from reference.sim import export

        export.latency_cdfs(
            {
                pol: {
                    k: v
                    for k, v in r.metrics.columns().items()
                    if k in ("prefill_e2e_time", "request_e2e_time")
                }
                for pol, r in results.items()
            },
            Path(args.plots) / "sbs_latency_cdf.png",
            "SBS vs immediate dispatch",
        )
        _say(f"wrote plots to {args.plots}")


def make_replicas(args: argparse.Namespace, workload: Any) -> list[Any]:
    """The replicas `--scheduler` names: `SimpleReplica`, a scheduler of the simulator's
    catalog (`reference.sim.catalog`, as `simulate sweep` builds them, with max_model_len
    `--max-model-len` or else the workload's longest request, and LightLLM's
    `--max-waiting-iters`), or an AR factory through `ArReplica`. A flag the scheduler would
    not read is refused, and a configuration error names the flag."""
    from reference.sim.catalog import SCHEDULERS, ReplicaSpec
    from reference.sim.replica import SimpleReplica

    totals = workload.prefill + workload.decode
    longest_at = int(totals.argmax()) if len(totals) else -1
    longest = int(totals[longest_at]) if len(totals) else 1
    if args.scheduler == "simple":
        given = [n for n in ("max_model_len", "max_waiting_iters") if getattr(args, n) is not None]
        refuse_ignored(args, given, "not with --scheduler simple (it has no such setting)")
        return [
            SimpleReplica(args.max_batch, args.kv_tokens, args.max_prefill_tokens)
            for _ in range(args.replicas)
        ]
    lightllm_or_own = args.scheduler in LIGHTLLM_SCHEDULERS or args.scheduler not in SCHEDULERS
    if args.max_waiting_iters is not None and not lightllm_or_own:
        refuse_ignored(
            args,
            ["max_waiting_iters"],
            f"only with --scheduler {' or '.join(LIGHTLLM_SCHEDULERS)} (LightLLM's setting) "
            "or an AR factory of your own (its ArConfig.max_waiting_iters)",
        )
    max_model_len = args.max_model_len if args.max_model_len is not None else longest
    if args.max_model_len is not None and args.max_model_len < longest:
        where = workload.where(longest_at)
        raise SimConfigError(
            "--max-model-len",
            args.max_model_len,
            f"at least {longest}, the workload's longest request (prompt plus output: request "
            f"#{longest_at}{f', {where}' if where else ''}), which could never run otherwise",
        )
    if args.scheduler in SCHEDULERS:
        spec = ReplicaSpec(
            args.scheduler,
            args.kv_tokens,
            args.max_batch,
            args.max_prefill_tokens,
            max(max_model_len, 2),
            args.max_waiting_iters or VIDUR_MAX_WAITING_ITERS,
        )
        try:
            make = spec.factory()  # validates the configuration
        except ConfigError as err:
            raise _replica_config_error(err, args, max_model_len) from None
        return [make() for _ in range(args.replicas)]
    try:
        factory = load_object(args.scheduler, "scheduler")
    except ConfigError as err:
        raise SimConfigError(
            "--scheduler",
            args.scheduler,
            f"'simple', one of {', '.join(SCHEDULERS[1:])}, or an importable "
            f"'module:factory'; this is not {err.valid}",
        ) from None
    if not 2 <= args.kv_tokens // 16 + 1 <= MAX_BLOCKS:  # the spec's range of pool blocks
        raise SimConfigError(
            "--kv-tokens",
            args.kv_tokens,
            f"16 to {MAX_BLOCKS * 16 - 1} tokens for an AR factory (1 to {MAX_BLOCKS - 1} KV "
            f"blocks of 16 tokens)",
        )
    try:
        cfg = ArConfig(
            block_size=16,
            num_blocks=args.kv_tokens // 16 + 1,
            max_num_batched_tokens=args.max_prefill_tokens,
            max_num_seqs=args.max_batch,
            max_model_len=args.max_model_len or max(args.kv_tokens // 2, 2),
            max_waiting_iters=args.max_waiting_iters or VIDUR_MAX_WAITING_ITERS,
        )
    except ConfigError as err:
        raise _replica_config_error(err, args, max_model_len) from None
    return [_custom_replica(args.scheduler, factory, cfg) for _ in range(args.replicas)]


def _replica_config_error(err: ConfigError, args: argparse.Namespace, longest: int) -> Exception:
    """A replica configuration error in `simulate replicas`' own terms: the flag it came from
    (or the workload, for max_model_len), with what the flag may be."""
    if err.field == "max_num_batched_tokens" and "max_model_len" in err.valid:
        # chunked prefill off: a whole request must fit one batch
        whose = (
            "--max-model-len"
            if args.max_model_len is not None
            else "the workload's longest request"
        )
        return SimConfigError(
            "--max-prefill-tokens",
            args.max_prefill_tokens,
            f"at least {longest} ({whose}) for {args.scheduler}, which does not chunk "
            f"prefills; or a scheduler that does (vidur-sarathi)",
        )
    flags = {
        "kv_tokens": "--kv-tokens",
        "num_blocks": "--kv-tokens",
        "max_num_batched_tokens": "--max-prefill-tokens",
        "max_num_seqs": "--max-batch",
        "max_model_len": "--max-model-len",
        "max_waiting_iters": "--max-waiting-iters",
    }
    flag = flags.get(err.field)
    if flag is None:
        return err
    value = getattr(args, flag[2:].replace("-", "_"))
    if err.field == "max_model_len" and args.max_model_len is None:
        return SimConfigError(
            "workload",
            f"longest request {longest} tokens",
            f"max_model_len {err.valid} (the workload's longest request sets it; give "
            f"--max-model-len, or shorter requests)",
        )
    return SimConfigError(flag, value, err.valid)


def _custom_replica(target: str, factory: object, config: ArConfig) -> ArReplica:
    """A replica of the user's `--scheduler module:factory`; a factory that is not callable,
    raises while building or returns no AR adapter is an input error naming the flag."""
    from properties.adapter_check import adapter_refusal
    from reference.sim.replica import ArReplica
    from spec.ar.adapter import ArSchedulerAdapter

    valid = "an AR scheduler factory (config, sink) -> ArSchedulerAdapter"
    if not callable(factory):
        raise SimConfigError("--scheduler", target, f"{valid}; this is a {type(factory).__name__}")
    try:
        replica = ArReplica(factory, config)
    except SchedSpecError:
        raise
    except (Exception, SystemExit) as err:  # the factory's own failure, not a traceback of ours
        raise SimConfigError(
            "--scheduler", target, f"{valid}; building it raised {describe_raised(err)}"
        ) from None
    refusal = adapter_refusal(replica.impl, ArSchedulerAdapter)
    if refusal is not None:  # methods, and `config`/`rules` of their types, as verify asks
        raise SimConfigError("--scheduler", target, refusal)
    return replica


def cmd_replicas(args: argparse.Namespace) -> dict[str, Any]:
    """`simulate replicas`: the workload on the replicas of `make_replicas` behind
    `--global-scheduler`; print a summary line, write `--trace` / `--plots` when given, and
    return the JSON-ready summary."""
    from reference.sim.cluster import simulate_cluster

    w = _workload(args)
    reps = make_replicas(args, w)
    t0 = time.perf_counter()
    res = simulate_cluster(
        w,
        reps,
        parse_model(args.exec_model),
        args.global_scheduler,
        args.seed,
        record_batches=bool(args.trace),
        progress=_progress("requests"),
    )
    el = time.perf_counter() - t0
    s = res.summary
    print(
        f"{len(w)} requests on {args.replicas} replicas in {el:.2f} s wall "
        f"({len(w) / el:.0f} requests/s): makespan {s.makespan:.2f} s, "
        f"{s.throughput_rps:.2f} req/s, e2e p50 {s.stats['request_e2e_time'].p50:.3f} s, "
        f"TTFT p50 {s.stats['prefill_e2e_time'].p50:.3f} s"
    )
    out = {
        "scheduler": args.scheduler,
        "replicas": args.replicas,
        "wall_s": el,
        "batches": res.num_batches,
        **s.as_dict(),
    }
    if args.trace:
        from reference.sim import export

        export.write_trace(export.trace_cluster(res.batches), Path(args.trace))
        _say(f"wrote {args.trace}")
    if args.plots:
        _replica_plots(args.scheduler, res, Path(args.plots))
    return out


def _replica_plots(scheduler: str, res: Any, d: Path) -> None:
    """Latency CDFs and the KV occupancy of the first four replicas."""
    from reference.sim import export

    cols = res.metrics.columns()
    export.latency_cdfs(
        {
            scheduler: {
                k: cols[k]
                for k in (
                    "request_e2e_time",
                    "prefill_e2e_time",
                    "time_per_output_token",
                )
            }
        },
        d / "replicas_latency_cdf.png",
        "latency CDFs",
    )
    by: dict[str, list[tuple[float, float]]] = {}
    for t, rep, used in res.kv_samples:
        if rep < 4:
            by.setdefault(f"replica {rep}", []).append((t, float(used)))
    export.kv_occupancy(by, res.kv_capacity, d / "replicas_kv.png")
    _say(f"wrote plots to {d}")


def simulate_main(argv: list[str]) -> int:
    """`schedspec simulate dllm|sbs|replicas|sweep ...`: parse the flags, check the output paths
    (and matplotlib for `--plots`) before anything runs, run the command and write its results
    to `--json` when given. Returns 0; a bad flag raises `UsageError`, a bad value a
    `SchedSpecError` (the caller prints either in one line, exit 2)."""
    args = build_parser().parse_args(argv)
    _check_outputs(args)
    cmd = {"dllm": cmd_dllm, "sbs": cmd_sbs, "replicas": cmd_replicas, "sweep": cmd_sweep}[
        args.what
    ]
    out = cmd(args)
    _dump(out, args.json)
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """Before any simulation runs: each output path can be written (`check_output_path`), and
    matplotlib is installed when plots are asked for (one line naming the extra, not a
    traceback after the run). Read from the parsed flags, so `--plots=DIR` and abbreviations
    count as well."""
    plots = getattr(args, "plots", None)
    if plots is not None:
        require_matplotlib("--plots", plots)
    inputs = _input_files(args)
    for flag in ("json", "trace", "csv", "plots"):  # csv: `simulate sweep` only
        path = getattr(args, flag, None)
        if path is not None:
            check_output_path(f"--{flag}", path, directory=flag == "plots", inputs=inputs)


def _input_files(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, path) of every file the subcommand reads: its trace, rounds report (the shipped
    one by default), calibration table and a 'table:PATH.json' time model. An output written
    over one would destroy it."""
    files = [
        (flag_of(dest), path)
        for dest in ("trace_csv", "steps_report", "calibration")
        if isinstance(path := getattr(args, dest, None), str) and path.strip()
    ]
    if args.what == "dllm" and args.steps is None and args.steps_report is None:
        from reference.sim.dllm import ROUNDS_REPORT

        files.append(("the default --steps-report", str(ROUNDS_REPORT)))
    for dest in ("forward", "exec_model"):  # dllm's time model; replicas' and sweep's
        model = getattr(args, dest, None)
        if isinstance(model, str) and model.startswith("table:") and model[6:].strip():
            files.append((flag_of(dest), model[6:]))
    return files
