"""SGLang 0.5.23's dLLM scheduling against a plain-Python scheduler, decision by decision.

    .venv/bin/python scripts/sglang_vs_reference.py --programs 200 [--against NAME] \
        [--sglang fixed|released] [--json FILE]

Each generated program (a configuration inside SGLang's space with the fixes: page = block, any
pool, rows <= seats, in about half of them an EOS token; submissions with rounds between them
and in about half of them aborts, then a drain) runs through SGLang with the five fixes
(`integrations.sglang.fixes`), then through the scheduler `--against` names, driven by a
`RecordedOracle` that replays SGLang's own step outcomes: both denoise alike, so only the
scheduling decisions can differ. With `--sglang released` SGLang runs unpatched and each
program's pool and rows are grown into the space its profile declares (rows = seats, a pool with
its headroom). `sglang-order` (the default) is SGLang's admission order re-implemented on the
reference (`reference.sglang_dllm`); `prefill-first` is the reference under PREFILL_FIRST
(`reference-dllm-prefill-first`). Per program it compares the admission order and the rows of
every forward, round by round. A program whose decisions diverge so far that the reference
steps a block SGLang never stepped as often is counted as diverged. Prints a table; `--json`
writes the counts and the differing programs. Exit 2 with one line if SGLang is not installed
(`schedspec install-engines sglang`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.sglang import REAL_SGLANG_DLLM
from integrations.sglang.engine import scripted_token
from properties.decisions import Rounds, admissions, forward_rounds
from properties.harness import Harness
from properties.workload import Abort, Op, Round, Submit, apply_ops
from reference.dllm import PREFILL_FIRST_POLICY, ReferenceDllmScheduler, replaying_twin
from reference.oracle import RecordExhausted
from reference.sglang_dllm import SGLANG_ORDER_POLICY, SglangOrderScheduler
from schedspec_cli.output import output_file, write_json
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SchedSpecError
from spec.profile import DllmPolicy, DllmProfile

#: --against: the scheduler class and the policy it follows (and is checked under)
#: the space SGLang 0.5.23 as released declares (rows = seats, a pool with headroom)
RELEASED_SPACE = REAL_SGLANG_DLLM.profile.space
AGAINST: dict[str, tuple[type[ReferenceDllmScheduler], DllmPolicy]] = {
    "sglang-order": (SglangOrderScheduler, SGLANG_ORDER_POLICY),
    "prefill-first": (ReferenceDllmScheduler, PREFILL_FIRST_POLICY),
}


def program(seed: int, released: bool = False) -> tuple[DllmConfig, list[Op]]:
    """A configuration inside SGLang's space with the fixes (with `released`: inside the space
    SGLang 0.5.23 as released declares, as many rows as seats and a pool with its headroom),
    and the submissions, rounds and aborts.

    The configuration, submissions and rounds come from one stream of `seed`. A second stream
    adds, each in about half the programs, an EOS token (one that the scripted step writes into
    one request's output, so that request can end early) and one or two aborts of a submitted
    request at a random later point (queued, running or already ended: `Harness.abort` takes
    each)."""
    rng = random.Random(seed)
    block = rng.choice([2, 3, 4])
    mode = rng.choice([Mode.SYNC, Mode.FDFO])
    rows = rng.randint(1, 4)
    config = DllmConfig(
        block_size=block,
        page_size=block,
        kv_pages=rng.randint(4, 16),
        req_pool_rows=rows,
        max_running_requests=rng.randint(rows, 4),
        max_context=block * rng.randint(2, 4),
        mode=mode,
        in_place_reuse=mode is Mode.FDFO,
    )
    ops: list[Op] = []
    requests: list[RequestSpec] = []
    for i in range(rng.randint(1, 6)):
        prompt_len = rng.randint(1, config.max_context - 1)
        max_new = rng.randint(1, config.max_context - prompt_len)
        prompt = tuple(rng.randrange(15) for _ in range(prompt_len))
        requests.append(RequestSpec(f"r{i}", prompt, max_new))
        ops.append(Submit(requests[-1]))
        ops += [Round()] * rng.randint(0, 2)
    extra = random.Random(f"extras-{seed}")
    if released:
        config = config.replace(req_pool_rows=config.max_running_requests)
        pages = RELEASED_SPACE.min_kv_pages(config) + extra.randint(0, 4)
        config = config.replace(kv_pages=pages)
    if extra.random() < 0.5:
        target = extra.choice(requests)
        position = len(target.prompt) + extra.randrange(target.max_new_tokens)
        eos = scripted_token(target.request_id, position, config.mask_token_id)
        config = dataclasses.replace(config, eos_token_id=eos)
    if extra.random() < 0.5:
        for _ in range(extra.randint(1, 2)):
            request = extra.choice(requests)
            first = ops.index(Submit(request))
            ops.insert(extra.randint(first + 1, len(ops)), Abort(request.request_id))
    return config, ops


@dataclasses.dataclass(frozen=True)
class Comparison:
    seed: int
    same_admissions: bool
    same_forwards: bool
    diverged: bool  # the reference needed a step SGLang's record does not have
    sglang: Rounds
    reference: Rounds | None


def compare(seed: int, against: str = "sglang-order", released: bool = False) -> Comparison:
    """Program `seed` through SGLang and through the replaying scheduler `against` names. Call
    inside `sglang_fixed(FIX_NAMES)` unless `released` (then SGLang runs as released, on a
    program inside its declared space)."""
    space = RELEASED_SPACE
    if not released:
        space = dataclasses.replace(space, rows_equal_max_running=False, kv_headroom_pages=None)
    config, ops = program(seed, released)
    sglang = Harness(
        REAL_SGLANG_DLLM.factory,
        config,
        profile=dataclasses.replace(REAL_SGLANG_DLLM.profile, space=space),
    )
    apply_ops(sglang, ops)
    sglang.drain()
    ours = sglang.events
    cls, policy = AGAINST[against]
    twin = replaying_twin(cls, policy)(ours, config)
    other = Harness(twin, config, profile=DllmProfile(policy=policy))
    try:
        apply_ops(other, ops)
        other.drain()
    except RecordExhausted:
        return Comparison(seed, False, False, True, forward_rounds(ours), None)
    theirs = other.events
    same_forwards = forward_rounds(ours) == forward_rounds(theirs)
    return Comparison(
        seed,
        admissions(ours) == admissions(theirs),
        same_forwards,
        False,
        forward_rounds(ours),
        forward_rounds(theirs),
    )


def compare_programs(
    programs: int, against: str = "sglang-order", released: bool = False
) -> list[Comparison]:
    from integrations.sglang.fixes import FIX_NAMES, sglang_fixed

    with contextlib.nullcontext() if released else sglang_fixed(FIX_NAMES):
        return [compare(seed, against, released) for seed in range(programs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/sglang_vs_reference.py")
    parser.add_argument("--programs", type=int, default=200, help="programs (seeds 0..N-1)")
    parser.add_argument(
        "--against", choices=list(AGAINST), default="sglang-order", help="the scheduler compared"
    )
    parser.add_argument(
        "--sglang",
        choices=["fixed", "released"],
        default="fixed",
        help="SGLang with its five fixes on any pool (default), or as released inside the "
        "space its profile declares",
    )
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the counts to this file"
    )
    args = parser.parse_args(argv)
    if args.programs < 1:
        parser.error("argument --programs: must be >= 1")
    start = time.perf_counter()
    try:
        results = compare_programs(args.programs, args.against, args.sglang == "released")
    except SchedSpecError as err:  # SGLang not installed
        print(f"error: {err}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    counts = {
        "programs": len(results),
        "same admissions and forwards": sum(r.same_admissions and r.same_forwards for r in results),
        "other admissions, same forwards": sum(
            not r.same_admissions and r.same_forwards and not r.diverged for r in results
        ),
        "other admissions, other forwards": sum(
            not r.same_admissions and not r.same_forwards and not r.diverged for r in results
        ),
        "same admissions, other forwards": sum(
            r.same_admissions and not r.same_forwards for r in results
        ),
        "diverged (the record ran out)": sum(r.diverged for r in results),
    }
    which = "with the five fixes" if args.sglang == "fixed" else "as released, in its space,"
    print(f"SGLang 0.5.23 {which} against {args.against}:")
    width = max(len(k) for k in counts)
    for key, value in counts.items():
        print(f"{key:<{width}}  {value:>5}")
    print(f"({seconds:.1f} s)")
    if args.json:
        differing = [dataclasses.asdict(r) for r in results if not r.same_forwards][:20]
        payload = {
            "sglang": args.sglang,
            "against": args.against,
            "counts": counts,
            "seconds": seconds,
        }
        write_json(args.json, {**payload, "differing": differing})
    return 0


if __name__ == "__main__":
    sys.exit(main())
