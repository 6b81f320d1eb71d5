"""Vidur's REAL replica schedulers with several pipeline stages (and replicas), in Vidur's own
event loop (`integrations.vidur.pipeline`): generated programs, every tick of every replica
checked against `spec.ar.pipeline`, every routing round against `spec.ar.routing`, and every
decision of each replica compared with the project's stage scheduler (`reference.ar.stages`)
over the scheduler's decision twin (`TWIN_OF`), given the requests Vidur routed to that replica.

    .venv/bin/python scripts/vidur_pipeline_check.py [--kinds vllm,sarathi,orca,ft,mnemosyne] \
        [--stages 2,4] [--replicas 1] [--routing round_robin|lor] [--sequence-parallel] \
        [--kv-parallel G] [--programs 300] [--seed N] [--as-released] [--json out.json]

By default each scheduler runs with the fixes of its findings (`PIPELINE_FIXES_OF`);
`--as-released` runs Vidur as it ships. `--sequence-parallel` turns on Vidur's sequence pipeline
parallelism (Sarathi and Mnemosyne; the default kinds become those two), declared to the rules,
and in the twins too. `--kv-parallel G` runs Mnemosyne with G KV-parallel groups (each a pool of
the program's blocks, a request's KV spread over as many as its prompt needs at
max_model_len / G to twice that tokens a group, drawn per program), checked against the rules
alone (the twins have one group). A program: a pool of 1.5-3x one max_model_len request's
blocks (Orca and FasterTransformer: plus their reservations), 1-8 seats (so some have fewer
seats than stages), a token budget of 32-64 (Sarathi and Mnemosyne, which chunk prefills: 8-64,
so prompts split over batches), blocks of 1, 2 or 4 tokens, and 2-10 requests of
1-20 prompt and 1-10 output tokens arriving at ticks 0-6 (up to 10 per replica with several).
Prints a table (programs, passed, violations by rule, twin differences, seconds) and the first
failure's message per scheduler and stage count, with the command that runs that program alone
(`--seed N`); exit 0 when every program passes, 1 otherwise, 2 for bad arguments.

With `SCHEDSPEC_VIDUR_SCHEDULER_CLS=pkg.module.Class` (`integrations.vidur.custom_scheduler`;
a module in the current directory imports, as with `schedspec verify`) every replica is built
as that class: `--kinds` must name only kinds it subclasses (a usage error, exit 2, names
them), the header line and the JSON's `scheduler_cls` name it, and each rerun command printed
starts with the variable (and `SCHEDSPEC_VIDUR_VERSION` when it selects another release).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import shlex
import sys
import time
from collections import Counter
from collections.abc import Sequence

from integrations.vidur.custom_scheduler import (
    SCHEDULER_VARIABLE,
    selected_kinds,
    selected_scheduler_cls,
)
from integrations.vidur.fixes import PIPELINE_FIXES_OF, vidur_fixed
from integrations.vidur.manifest import DEFAULT_VERSION, VERSION_VARIABLE, VIDUR_VERSION
from integrations.vidur.pipeline import (
    PIPELINE_KINDS,
    SEQUENCE_PARALLEL_KINDS,
    KvParallelism,
    PipelineRun,
    PipelineTick,
    VidurPipeline,
)
from reference.ar.stages import StageScheduler
from schedspec_cli.args import Parser, run_script
from schedspec_cli.loader import cwd_importable
from schedspec_cli.output import output_file, table, write_json
from spec.ar.config import ArConfig, ArRequest
from spec.ar.events import ArEvent, ArFinished, ArPreempted, ArScheduled
from spec.ar.routing import ROUTINGS
from spec.errors import SchedSpecError, SpecViolation

#: The project's stage scheduler runs each real class's decision twin (tests/test_real_vidur.py);
#: Mnemosyne's depends on the release (0.0.25 keeps partial prefills in its request queue)
TWIN_OF = {
    "vllm": "vidur-vllm-released",
    "sarathi": "vidur-sarathi-released",
    "orca": "vidur-orca",
    "ft": "vidur-ft",
    "mnemosyne": "vidur-mnemosyne-one-queue" if VIDUR_VERSION == "0.0.25" else "vidur-mnemosyne",
}
MAX_MODEL_LEN = 32
CHUNKED_KINDS = ("sarathi", "mnemosyne")
#: the least token budget for the schedulers that chunk prefills: a budget below one prompt
#: splits it over batches, so admitted requests wait between chunks beside new ones
CHUNK_FLOOR = 8

Program = tuple[ArConfig, list[tuple[int, ArRequest]]]


def program(kind: str, stages: int, seed: int, replicas: int = 1) -> Program:
    """The generated program `seed` for `kind` at `stages` stages and `replicas` replicas
    (module docstring)."""
    rng = random.Random(f"{kind}/{stages}/{seed}" + (f"/{replicas}" if replicas > 1 else ""))
    chunked = kind in CHUNKED_KINDS
    block = rng.choice([1, 2, 4])
    per_request = MAX_MODEL_LEN // block
    blocks = rng.randint(per_request * 3 // 2, 3 * per_request)
    if kind in ("orca", "ft"):  # they reserve max_model_len per request
        blocks += 2 * per_request
    config = ArConfig(
        block_size=block,
        num_blocks=blocks + 1,  # the null block: Vidur gets the usable ones
        max_num_seqs=rng.randint(1, 8),
        max_num_batched_tokens=rng.randint(
            CHUNK_FLOOR if chunked else MAX_MODEL_LEN, 2 * MAX_MODEL_LEN
        ),
        max_model_len=MAX_MODEL_LEN,
        num_stages=stages,
        num_replicas=replicas,
        enable_chunked_prefill=chunked,
    )
    requests = [
        (rng.randint(0, 6), ArRequest(f"r{i}", rng.randint(1, 20), rng.randint(1, 10)))
        for i in range(rng.randint(2, 10 * replicas))
    ]
    return config, sorted(requests, key=lambda arrival: arrival[0])


def kv_parallelism(config: ArConfig, seed: int, groups: int) -> KvParallelism:
    """Program `seed`'s KV parallelism: `groups` groups, each a share of max_model_len / groups
    to twice that (at least 2 blocks, less than a group's pool), drawn apart from the program,
    which stays the one without it."""
    rng = random.Random(f"kvp/{groups}/{seed}")
    block = config.block_size
    least = max(2, -(-config.max_model_len // (groups * block)))
    most = max(least, min(2 * least, config.usable_blocks - 1))
    return KvParallelism(groups, block * rng.randint(least, most))


def twin_run(
    kind: str,
    config: ArConfig,
    requests: list[tuple[int, ArRequest]],
    sequence_parallel: bool = False,
) -> PipelineRun:
    """The program through one `StageScheduler` over `TWIN_OF[kind]` (one replica), as a
    `PipelineRun`: each request submitted before the tick it arrives at; a finish at the end of
    tick t is Vidur's `BatchEndEvent` at time t + 1."""
    decided: dict[int, tuple[list[tuple[str, int]], list[str]]] = {}
    finished: list[tuple[int, str]] = []
    ticks = [0]  # the tick the twin runs now

    def sink(event: ArEvent) -> None:
        tick = ticks[0]
        if isinstance(event, ArScheduled):
            decided.setdefault(tick, ([], []))[0].append((event.request_id, event.num_tokens))
        elif isinstance(event, ArPreempted):
            decided.setdefault(tick, ([], []))[1].append(event.request_id)
        elif isinstance(event, ArFinished):
            finished.append((tick + 1, event.request_id))

    stages = StageScheduler(
        config.replace(num_replicas=1), sink, TWIN_OF[kind], sequence_parallel=sequence_parallel
    )
    waiting = list(requests)
    checked = peak = 0
    while waiting or not stages.is_idle():
        while waiting and waiting[0][0] <= stages.tick:
            stages.submit(waiting.pop(0)[1])
        ticks[0] = stages.tick
        stages.step()
        stages.check_pipeline()
        checked += 1
        peak = max(peak, stages.peak_in_flight)
    decisions = tuple(
        PipelineTick(t, 0, tuple(s), tuple(r)) for t, (s, r) in sorted(decided.items())
    )
    routes = tuple((request.request_id, 0) for _, request in requests)
    return PipelineRun(decisions, routes, tuple(finished), stages.tick, peak, checked)


def first_difference(real: PipelineRun, replica: int, twin: PipelineRun) -> str | None:
    """Where `replica` of the real run and its twin first decide differently, in words; None
    when alike."""
    mine = [dataclasses.replace(d, replica=0) for d in real.of_replica(replica)]
    where = f"replica {replica}: " if len({r for _, r in real.routes}) > 1 else ""
    for ours, theirs in zip(mine, twin.decisions, strict=False):
        if ours != theirs:
            return f"{where}Vidur {ours} / twin {theirs}"
    if len(mine) != len(twin.decisions):
        return f"{where}Vidur decides {len(mine)} ticks, the twin {len(twin.decisions)}"
    routed = {rid for rid, r in real.routes if r == replica}
    finished = tuple((t, rid) for t, rid in real.finished if rid in routed)
    if finished != twin.finished:
        return f"{where}finishes: Vidur {finished}, twin {twin.finished}"
    return None


def check_one(
    kind: str,
    stages: int,
    seed: int,
    replicas: int = 1,
    routing: str = "round_robin",
    sequence_parallel: bool = False,
    kv_groups: int = 1,
) -> str | None:
    """Program `seed` on the real class (fixes as the caller applied them): None when every
    tick keeps the pipeline rules, every round the routing, and every replica decides as its
    twin given the requests Vidur routed to it (with several KV-parallel groups: the rules
    alone); else the rule (or `twin_decisions`) and its message."""
    config, requests = program(kind, stages, seed, replicas)
    kv_parallel = kv_parallelism(config, seed, kv_groups) if kv_groups > 1 else None
    pipeline = VidurPipeline(
        kind,
        config,
        routing=routing,
        sequence_parallel=sequence_parallel,
        kv_parallel=kv_parallel,
    )
    try:
        real = pipeline.run(requests)
    except SpecViolation as err:
        return f"{err.rule}: {err}"
    if kv_parallel is not None:
        return None
    replica_of = dict(real.routes)
    for replica in range(replicas):
        mine = [(t, r) for t, r in requests if replica_of[r.request_id] == replica]
        twin = twin_run(kind, config, mine, sequence_parallel)
        difference = first_difference(real, replica, twin)
        if difference is not None:
            return f"twin_decisions: {difference}"
    return None


def selector() -> str:
    """What a printed command starts with to run on the release and replica scheduler class
    this run checked: empty for the default release and Vidur's own classes, else the
    variables that select them ("SCHEDSPEC_VIDUR_SCHEDULER_CLS=my_sched.Mine "), so the
    command pasted in a fresh shell checks what the run checked."""
    words = [] if VIDUR_VERSION == DEFAULT_VERSION else [f"{VERSION_VARIABLE}={VIDUR_VERSION}"]
    chosen = selected_scheduler_cls()
    if chosen is not None:
        words.append(f"{SCHEDULER_VARIABLE}={shlex.quote(chosen)}")
    return "".join(f"{word} " for word in words)


def rerun(args: argparse.Namespace, kind: str, stages: int, seed: int) -> str:
    """The command that runs program `seed` of `kind` at `stages` stages alone (after the
    variables that select the release and class checked, `selector`)."""
    parts = [f"{selector()}scripts/vidur_pipeline_check.py", f"--kinds {kind}"]
    parts.append(f"--stages {stages}")
    if args.replicas > 1:
        parts.append(f"--replicas {args.replicas} --routing {args.routing}")
    if args.sequence_parallel:
        parts.append("--sequence-parallel")
    if args.kv_parallel > 1:
        parts.append(f"--kv-parallel {args.kv_parallel}")
    parts.append(f"--seed {seed}")
    if args.as_released:
        parts.append("--as-released")
    return " ".join(parts)


def _csv(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def check_kinds(
    parser: argparse.ArgumentParser,
    chosen: str,
    kinds: list[str],
    run: list[str],
    asked: bool,
    allowed: Sequence[str],
    with_it: str,
) -> None:
    """A usage error (exit 2, one line) when the kinds to `run` (`--kinds`, or every kind
    when not `asked`) include one the class `chosen` does not subclass (it subclasses
    `kinds`): it says which `--kinds` to pass, or that none of `allowed` runs it."""
    wrong = [kind for kind in run if kind not in kinds]
    if not wrong:
        return
    what = f"{SCHEDULER_VARIABLE}={chosen} is a {' and '.join(kinds)} replica scheduler"
    runnable = [kind for kind in allowed if kind in kinds]
    if not runnable:
        parser.error(f"--kinds: {what}, and this script runs {','.join(allowed)}{with_it}")
    given = (
        f"not a {' or '.join(wrong)} one"
        if asked
        else f"and without --kinds every kind runs ({','.join(run)})"
    )
    parser.error(f"--kinds: {what}, {given}: pass --kinds {','.join(runnable)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (a usage error: one line on stderr, exit 2) and run the check (`_run`)."""
    parser = Parser(prog="scripts/vidur_pipeline_check.py")
    parser.add_argument("--kinds", type=_csv, default=None, help="default: every kind")
    parser.add_argument("--stages", type=_csv, default=["2", "4"])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--routing", choices=ROUTINGS, default="round_robin")
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument(
        "--seed", type=int, default=None, help="run program SEED alone (as a failure names it)"
    )
    parser.add_argument("--as-released", action="store_true", help="no fixes")
    parser.add_argument(
        "--kv-parallel", type=int, default=1, help="Mnemosyne's KV-parallel groups (default 1)"
    )
    parser.add_argument(
        "--sequence-parallel",
        action="store_true",
        help=f"Vidur's sequence pipeline parallelism ({','.join(SEQUENCE_PARALLEL_KINDS)})",
    )
    parser.add_argument("--json", type=output_file, default=None)
    return run_script(parser, lambda args: _run(parser, args), argv)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The check `args` asks for: exit 0 when every program passes, 1 otherwise; a usage
    error through `parser.error`."""
    try:
        stage_counts = [int(s) for s in args.stages]
    except ValueError:
        parser.error(f"--stages: comma-separated integers, not {','.join(args.stages)!r}")
    if args.seed is not None and args.seed < 0:
        parser.error(f"--seed: a program's number, >= 0 (as a failure names it), not {args.seed}")
    allowed = SEQUENCE_PARALLEL_KINDS if args.sequence_parallel else PIPELINE_KINDS
    if args.kv_parallel > 1:
        allowed = ("mnemosyne",)
    asked = args.kinds is not None
    if args.kinds is None:
        args.kinds = list(allowed)
    with_it = (
        " with --kv-parallel"
        if args.kv_parallel > 1
        else " with --sequence-parallel"
        if args.sequence_parallel
        else ""
    )
    unknown = sorted(set(args.kinds) - set(allowed))
    if unknown:
        parser.error(f"--kinds: {unknown} unknown{with_it}; choose from {','.join(allowed)}")
    if min(args.programs, args.replicas, args.kv_parallel, min(stage_counts, default=0)) < 1:
        parser.error("--programs, --replicas, --kv-parallel and --stages must be positive")
    cwd_importable()
    try:
        chosen = selected_scheduler_cls()
        if chosen is not None:
            check_kinds(parser, chosen, selected_kinds(), args.kinds, asked, allowed, with_it)
    except SchedSpecError as err:  # the class does not import, or Vidur is not installed
        parser.error(" ".join(str(err).split()))
    seeds = range(args.programs) if args.seed is None else [args.seed]
    rows: list[list[object]] = []
    figures: list[dict[str, object]] = []
    messages: list[str] = []
    for kind in args.kinds:
        fixes = () if args.as_released else PIPELINE_FIXES_OF[kind]
        for stages in stage_counts:
            start = time.perf_counter()
            outcomes: Counter[str] = Counter()
            first: str | None = None
            try:
                with vidur_fixed(fixes):
                    for seed in seeds:
                        failure = check_one(
                            kind,
                            stages,
                            seed,
                            args.replicas,
                            args.routing,
                            args.sequence_parallel,
                            args.kv_parallel,
                        )
                        outcomes[failure.split(":")[0] if failure else "passed"] += 1
                        if failure and first is None:
                            first = (
                                f"{kind}, {stages} stages, seed {seed}: {failure}\n  again: "
                                f"{rerun(args, kind, stages, seed)}"
                            )
            except SchedSpecError as err:  # a configuration Vidur refuses
                print(f"error: {err}", file=sys.stderr)
                return 2
            seconds = time.perf_counter() - start
            failed = {rule: n for rule, n in sorted(outcomes.items()) if rule != "passed"}
            rows.append(
                [
                    kind,
                    stages,
                    len(seeds),
                    outcomes["passed"],
                    ", ".join(f"{rule} {n}" for rule, n in failed.items()) or "-",
                    f"{seconds:.1f}",
                ]
            )
            figures.append(
                {
                    "kind": kind,
                    "stages": stages,
                    "replicas": args.replicas,
                    "routing": args.routing,
                    "sequence_parallel": args.sequence_parallel,
                    "kv_parallel": args.kv_parallel,
                    "programs": len(seeds),
                    "passed": outcomes["passed"],
                    "failed": failed,
                    "first_failure": first,
                    "fixes": list(fixes),
                    "seconds": seconds,
                }
            )
            if first:
                messages.append(first)
    label = "as released" if args.as_released else "with its fixes"
    cluster = f", {args.replicas} replicas ({args.routing})" if args.replicas > 1 else ""
    parallel = ", sequence pipeline parallelism" if args.sequence_parallel else ""
    if args.kv_parallel > 1:
        parallel += f", {args.kv_parallel} KV-parallel groups"
    own = f", scheduler_cls {chosen}" if chosen is not None else ""
    print(f"Vidur {VIDUR_VERSION}, {label}{own}{cluster}{parallel}")
    print(table(["scheduler", "stages", "programs", "passed", "failed", "s"], rows))
    for message in messages:
        print(message)
    if args.json:
        write_json(
            args.json,
            {
                "vidur": VIDUR_VERSION,
                "scheduler_cls": chosen,
                "as_released": args.as_released,
                "runs": figures,
            },
        )
    return 1 if messages else 0


if __name__ == "__main__":
    sys.exit(main())
