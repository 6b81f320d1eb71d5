"""`schedspec verify` with no arguments: the main job.

Steps, each timed and reported (a failing step never stops the others):
1. the Z3 proofs (`properties.proofs`);
2. the conformance suite on every built-in implementation of the project's own (the real
   engines, `real-*`, need an install and have findings open upstream: `--impl real-...`); a
   built-in that declares `checked_against` runs with that decision twin (the torch engine
   must decide as the FCFS reference: `verify --impl engine --twin reference-dllm`);
3. parity (every mode at batch sizes 1 and 4 vs sync at 1, golden agreement) and leak check on
   the shipped model (CUDA when present, else CPU);
4. a short FDFO-vs-sync comparison on the reference (the head-of-line gap, in forwards);
5. a short engine benchmark (tokens/s of sync, FDFO, FDFO + reuse, + re-loop at max-running 4);
then a summary table, and a report directory with report.md, report.json and PNG plots.
Exit status is non-zero if any step failed, and the failing steps are named.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from properties.deadline import DEFAULT_CALL_TIMEOUT_S
from properties.harness import Harness
from properties.verify import verify_implementation
from reference import dllm as ref
from reference import oracle as oracle_mod
from schedspec_cli import meta
from schedspec_cli.engine_stdout import implementation_stdout_to_stderr
from schedspec_cli.impls import profile_summary, resolve_builtin
from schedspec_cli.output import write_json
from schedspec_cli.progress import Progress, log
from schedspec_cli.registry import BUILTINS, Builtin, engine_status
from schedspec_cli.timeline import Timeline, timeline
from schedspec_cli.torch_threads import DEFAULT_CHECK_THREADS, torch_threads_while
from schedspec_cli.twins import resolve_twin
from schedspec_cli.verify import failures_markdown
from spec.config import DllmConfig, Mode, RequestSpec
from spec.implementation import Family


@dataclass
class StepOutcome:
    """One step's verdict, wall seconds, one-line summary and data for report.json."""

    name: str
    passed: bool
    seconds: float
    summary: str
    data: dict[str, Any] = field(default_factory=dict)


def _timed(name: str, fn: Callable[[], tuple[bool, str, dict[str, Any]]]) -> StepOutcome:
    start = time.perf_counter()
    try:
        ok, summary, data = fn()
    except Exception as err:
        ok, summary, data = (
            False,
            f"{type(err).__name__}: {err}",
            {"traceback": traceback.format_exc()},
        )
    return StepOutcome(name, ok, time.perf_counter() - start, summary, data)


def _log(msg: str) -> None:
    log(f"verify: {msg}")


def all_builtins() -> dict[str, Builtin]:
    """The built-ins the main job checks (the project's own; real engines need an install)."""
    return {name: b for name, b in BUILTINS.items() if b.default_verify}


# --------------------------------------------------------------------------- steps
def step_proofs() -> tuple[bool, str, dict[str, Any]]:
    """Every Z3 proof at the default bound: passes when all are proved; data `proofs`."""
    proofs = importlib.import_module("properties.proofs")
    results = proofs.run_all_proofs(progress=None)
    bad = [r.name for r in results if r.status != "proved"]
    summary = f"{len(results) - len(bad)}/{len(results)} proved"
    if bad:
        summary += f"; not proved: {', '.join(bad)}"
    return not bad, summary, {"proofs": [r.to_json() for r in results]}


def step_conformance(
    examples: int, call_timeout: float | None = DEFAULT_CALL_TIMEOUT_S
) -> tuple[bool, str, dict[str, Any]]:
    """The conformance suite on every built-in of `all_builtins` (the torch engine's with a
    quarter of `examples`, at least 10), with its `checked_against` twin when it declares one:
    passes when all conform. Data: `results` per built-in, and `not_run` (the real engines'
    status)."""
    rows = []
    for name, builtin in all_builtins().items():
        if not builtin.default_verify:
            continue
        target = resolve_builtin(builtin)
        n = max(10, examples // 4) if builtin.is_torch_engine else examples
        twin = None
        if builtin.checked_against:
            twin = resolve_twin(builtin.checked_against, builtin.family)
        bar = Progress(f"conformance {name}")
        # one torch thread while checking, as `verify --impl` (schedspec_cli.torch_threads)
        with torch_threads_while(DEFAULT_CHECK_THREADS), implementation_stdout_to_stderr():
            res = verify_implementation(
                name,
                target.implementation,
                n,
                parity="never" if builtin.family is Family.AR else builtin.parity,
                progress=bar.examples(n),
                profile=profile_summary(target.implementation),
                call_timeout=call_timeout,
                twin=twin,
            )
        bar.done()
        _log(
            f"conformance {name}: {'PASS' if res.passed else 'FAIL'} "
            f"({res.examples} examples, {res.steps} steps, {res.seconds:.1f}s)"
        )
        rows.append(res.to_json())
    failed = [r["impl"] for r in rows if not r["passed"]]
    summary = f"{len(rows) - len(failed)}/{len(rows)} implementations conform"
    if failed:
        summary += f"; failing: {', '.join(failed)}"
    twinned = [f"{r['impl']} as {r['twin']}" for r in rows if r["twin"]]
    if twinned:
        summary += f"; decisions checked against a twin: {', '.join(twinned)}"
    # say what the step leaves out, so "n/n conform" is not read as every built-in
    not_run = {name: engine_status(b) for name, b in BUILTINS.items() if not b.default_verify}
    if not_run:
        summary += f"; not run here: {len(not_run)} real engines (`verify --impl real-...`)"
    return not failed, summary, {"results": rows, "not_run": not_run}


def step_parity(prompts: int, max_new_tokens: int) -> tuple[bool, str, dict[str, Any]]:
    """`gpu.parity.run_parity` of both algorithms (CUDA when available, else CPU): passes when
    every case is identical, golden agrees and nothing leaked; data: the parity report."""
    parity = importlib.import_module("gpu.parity")
    device = "cuda" if _cuda_available() else "cpu"
    report = parity.run_parity(device, ["LowConfidence", "JointThreshold"], prompts, max_new_tokens)
    data = report.to_json()
    ok = (
        bool(data["identical"])
        and data.get("golden") is True
        and data["leaked_slots"] == 0
        and data.get("leaked_rows") == 0
    )
    summary = (
        f"device={data['device']}: {len(data['cases'])} cases, identical={data['identical']} "
        f"at batch sizes {data.get('batch_sizes')}, golden={data.get('golden')}, "
        f"leaked_slots={data['leaked_slots']}"
    )
    return ok, summary, data


def _cuda_available() -> bool:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def head_of_line_workload() -> tuple[DllmConfig, list[RequestSpec], dict[str, int]]:
    """Eight requests whose output blocks need 1..8 steps to unmask, four at a time."""
    steps = {f"q{i}": s for i, s in enumerate((3, 8, 2, 5, 1, 7, 4, 6))}
    cfg = DllmConfig(
        block_size=8,
        page_size=8,
        kv_pages=16,
        req_pool_rows=4,
        max_running_requests=4,
        max_context=32,
        mode=Mode.SYNC,
        in_place_reuse=False,
        reloop=False,
    )
    reqs = [RequestSpec(rid, (1,) * 8, 16) for rid in steps]
    return cfg, reqs, steps


def run_head_of_line(mode: Mode) -> tuple[Timeline, DllmConfig]:
    """`head_of_line_workload` drained by the reference scheduler with its scripted step
    counts in `mode` (FDFO with in-place reuse): the timeline and the config it ran."""
    cfg, reqs, steps = head_of_line_workload()
    cfg = cfg.replace(mode=mode, in_place_reuse=mode is Mode.FDFO)

    def factory(config: DllmConfig, sink: Any) -> Any:
        oracle = oracle_mod.ScriptedOracle(lambda rid, k: steps[rid], config.mask_token_id)
        return ref.ReferenceDllmScheduler(config, sink, oracle)

    h = Harness(factory, cfg)
    for r in reqs:
        h.submit(r)
    h.drain()
    return timeline(h.events), cfg


def step_fdfo_vs_sync() -> tuple[bool, str, dict[str, Any]]:
    """The head-of-line workload in sync and FDFO: passes when FDFO runs no more forwards and
    its mean finish (in forwards) is no later; data: both modes' counts and the ratio."""
    sync, _ = run_head_of_line(Mode.SYNC)
    fdfo, _ = run_head_of_line(Mode.FDFO)

    # per-request completion time in forwards (constant forward cost)
    def mean_finish(tl: Timeline) -> float:
        done = [s.finished_forward for s in tl.spans if s.finished_forward is not None]
        return sum(done) / len(done)

    data: dict[str, Any] = {
        "sync": {
            "forwards": sync.forwards,
            "wasted_row_steps": sync.wasted_row_steps,
            "mean_finish_forward": mean_finish(sync),
        },
        "fdfo": {
            "forwards": fdfo.forwards,
            "wasted_row_steps": fdfo.wasted_row_steps,
            "mean_finish_forward": mean_finish(fdfo),
        },
    }
    ratio = sync.forwards / fdfo.forwards if fdfo.forwards else 0.0
    data["sync_over_fdfo_forwards"] = ratio
    ok = fdfo.forwards <= sync.forwards and mean_finish(fdfo) <= mean_finish(sync)
    summary = (
        f"8 requests (1 prompt + 2 output blocks), 4 at a time: sync {sync.forwards} forwards "
        f"({sync.wasted_row_steps} wasted row-steps), FDFO {fdfo.forwards} forwards; "
        f"mean finish {mean_finish(sync):.1f} vs {mean_finish(fdfo):.1f} forwards"
    )
    return ok, summary, data


def step_engine_bench(requests: int = 32) -> tuple[bool, str, dict[str, Any]]:
    """A short engine benchmark at max-running 4 (a measurement: it passes when it runs; the
    full benchmark is `schedspec bench engine`, recorded in docs/engine-benchmarks.md)."""
    bench = importlib.import_module("gpu.bench")
    device = "cuda" if _cuda_available() else "cpu"
    report = bench.run_bench([4], requests=requests, repeats=1, device=device)
    data = report.to_json()
    ratios = data["ratios"]
    summary = (
        f"{device}, {requests} requests at max-running 4: FDFO/sync "
        f"{ratios['fdfo/sync']['4']:.2f}x, FDFO+reuse/sync {ratios['fdfo+reuse/sync']['4']:.2f}x "
        f"(tokens/s, one run)"
    )
    return True, summary, data


# --------------------------------------------------------------------------- report
def write_plots(out: Path) -> list[str]:
    """Write into `out` the head-of-line Gantt chart and KV occupancy (sync vs FDFO) and, when
    `gpu/assets/rounds_report.json` exists, the rounds-per-block histogram; returns the file
    names."""
    plots = importlib.import_module("schedspec_cli.plots")
    sync, cfg = run_head_of_line(Mode.SYNC)
    fdfo, _ = run_head_of_line(Mode.FDFO)
    files = [
        plots.gantt(
            {"sync": sync, "FDFO + in-place reuse": fdfo},
            out / "gantt_sync_vs_fdfo.png",
            "Same workload under sync and FDFO: head-of-line blocking",
        ),
        plots.kv_occupancy({"sync": sync, "FDFO": fdfo}, cfg.kv_slots, out / "kv_occupancy.png"),
    ]
    hists = _rounds_histograms()
    if hists:
        files.append(
            plots.rounds_histogram(
                hists,
                out / "rounds_per_block.png",
                "Rounds per block, shipped model (block size 8)",
            )
        )
    return [str(Path(f).name) for f in files]


def _rounds_histograms() -> dict[str, dict[int, int]]:
    """The shipped model's rounds-per-block histograms (gpu/assets/rounds_report.json)."""
    spec = importlib.util.find_spec("gpu")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / "assets" / "rounds_report.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    algos = data.get("algorithm", {})
    return {name: {int(k): int(v) for k, v in h["histogram"].items()} for name, h in algos.items()}


def render_markdown(steps: list[StepOutcome], plots: list[str], run: dict[str, Any]) -> str:
    """report.md: the steps table, the plots, the conformance failures and the run metadata."""
    lines = [
        "# schedspec verify report",
        "",
        "| step | result | seconds | summary |",
        "|---|---|---|---|",
    ]
    for s in steps:
        lines.append(
            f"| {s.name} | {'PASS' if s.passed else 'FAIL'} | {s.seconds:.1f} | {s.summary} |"
        )
    lines += ["", "## Plots", ""]
    lines += [f"![{p}]({p})" for p in plots]
    results = [r for s in steps for r in s.data.get("results", []) if isinstance(r, dict)]
    lines.append(failures_markdown(results))
    lines.append(meta.markdown(run))
    return "\n".join(lines) + "\n"


def main_job(
    report_dir: str,
    examples: int,
    parity_prompts: int,
    parity_tokens: int,
    call_timeout: float | None = DEFAULT_CALL_TIMEOUT_S,
) -> int:
    """The main job: run the five steps (a failing step never stops the others) and the plots,
    print the summary table, and write report.json, report.md and the PNGs to `report_dir`
    (created if missing). Returns 0 when every step passed, else 1 (naming the failed ones)."""
    out = Path(report_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps: list[StepOutcome] = []
    plan: list[tuple[str, Callable[[], tuple[bool, str, dict[str, Any]]]]] = [
        ("z3 proofs", step_proofs),
        ("conformance", lambda: step_conformance(examples, call_timeout)),
        ("bs=1 parity + leaks", lambda: step_parity(parity_prompts, parity_tokens)),
        ("fdfo vs sync", step_fdfo_vs_sync),
        ("engine bench", step_engine_bench),
    ]
    for name, fn in plan:
        _log(f"{name} ...")
        outcome = _timed(name, fn)
        _log(
            f"{name}: {'PASS' if outcome.passed else 'FAIL'} in {outcome.seconds:.1f}s: "
            f"{outcome.summary}"
        )
        steps.append(outcome)
    plot_files: list[str] = []
    plot_step = _timed("plots", lambda: (True, "", {"files": write_plots(out)}))
    if plot_step.passed:
        plot_files = plot_step.data["files"]
        plot_step.summary = ", ".join(plot_files)
    steps.append(plot_step)
    width = max(len(s.name) for s in steps)
    print(f"{'step'.ljust(width)}  result  seconds  summary")
    for s in steps:
        print(
            f"{s.name.ljust(width)}  {'PASS' if s.passed else 'FAIL':<6}  {s.seconds:7.1f}  "
            f"{s.summary}"
        )
    run = meta.run_metadata()
    payload = {
        "passed": all(s.passed for s in steps),
        "run": run,
        "steps": [
            {
                "name": s.name,
                "passed": s.passed,
                "seconds": round(s.seconds, 3),
                "summary": s.summary,
                "data": s.data,
            }
            for s in steps
        ],
        "plots": plot_files,
    }
    write_json(out / "report.json", payload)
    (out / "report.md").write_text(render_markdown(steps, plot_files, run), encoding="utf-8")
    failed = [s.name for s in steps if not s.passed]
    print(f"report: {out / 'report.md'}")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    return 0
