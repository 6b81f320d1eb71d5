"""SGLang 0.5.23's dLLM scheduling with its five fixes against a plain-Python scheduler, decision
by decision.

    .venv/bin/python scripts/sglang_vs_reference.py --programs 200 [--against NAME] [--json FILE]

Each generated program (a configuration inside SGLang's space with the fixes: page = block, any
pool, rows <= seats; submissions with rounds between them, then a drain) runs through SGLang
with the five fixes (`integrations.sglang.fixes`), then through the scheduler `--against`
names, driven by a `RecordedOracle` that replays SGLang's own step outcomes: both denoise
alike, so only the scheduling decisions can differ. `sglang-order` (the default) is SGLang's
admission order re-implemented on the reference (`reference.sglang_dllm`); `prefill-first` is
the reference under PREFILL_FIRST (`reference-dllm-prefill-first`). Per program it compares the
admission order and the rows of every forward, round by round. A program whose decisions
diverge so far that the reference steps a block SGLang never stepped as often is counted as
diverged. Prints a table; `--json` writes the counts and the differing programs. Exit 2 with
one line if SGLang is not installed (`schedspec install-engines sglang`).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from properties.harness import Harness
from reference.dllm import PREFILL_FIRST_POLICY, ReferenceDllmScheduler
from reference.oracle import RecordedOracle, RecordExhausted
from reference.sglang_dllm import SGLANG_ORDER_POLICY, SglangOrderScheduler
from schedspec_cli.output import output_file, write_json
from spec.adapter import EventSink
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SchedSpecError
from spec.events import Admitted, BlockCommitted, ControlReturned, Event, Forward, StepResult
from spec.profile import DllmPolicy, DllmProfile

Op = tuple[str, RequestSpec | None]  # ("submit", request) or ("round", None)
#: --against: the scheduler class and the policy it follows (and is checked under)
AGAINST: dict[str, tuple[type[ReferenceDllmScheduler], DllmPolicy]] = {
    "sglang-order": (SglangOrderScheduler, SGLANG_ORDER_POLICY),
    "prefill-first": (ReferenceDllmScheduler, PREFILL_FIRST_POLICY),
}
Rounds = list[list[list[tuple[str, int]]]]  # per round, per forward, its (request, block) rows


def program(seed: int) -> tuple[DllmConfig, list[Op]]:
    """A configuration inside SGLang's space with the fixes, and the submissions and rounds."""
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
    for i in range(rng.randint(1, 6)):
        prompt_len = rng.randint(1, config.max_context - 1)
        max_new = rng.randint(1, config.max_context - prompt_len)
        prompt = tuple(rng.randrange(15) for _ in range(prompt_len))
        ops.append(("submit", RequestSpec(f"r{i}", prompt, max_new)))
        ops += [("round", None)] * rng.randint(0, 2)
    return config, ops


def run(factory: Any, profile: DllmProfile, config: DllmConfig, ops: Sequence[Op]) -> list[Event]:
    """The program's events under the harness (every event checked against the profile)."""
    h = Harness(factory, config, profile=profile)
    for _, request in ops:
        if request is not None:
            h.submit(request)
        else:
            h.round()
    h.drain()
    return h.events


def forward_rounds(events: Sequence[Event]) -> Rounds:
    rounds: Rounds = [[]]
    for e in events:
        if isinstance(e, Forward):
            rounds[-1].append(sorted((r.request_id, r.block_index) for r in e.rows))
        elif isinstance(e, ControlReturned):
            rounds.append([])
    return rounds


def admissions(events: Sequence[Event]) -> list[str]:
    return [e.request_id for e in events if isinstance(e, Admitted)]


def replaying(events: Sequence[Event], config: DllmConfig, against: str) -> Any:
    """A factory for the scheduler `against` names that denoises as `events` record."""
    cls, policy = AGAINST[against]
    steps = [
        ((e.request_id, e.block_index), e.accept_length == config.block_size, e.masks_remaining)
        for e in events
        if isinstance(e, StepResult)
    ]
    finals = {
        (e.request_id, e.block_index): e.tokens for e in events if isinstance(e, BlockCommitted)
    }

    def factory(cfg: DllmConfig, sink: EventSink) -> ReferenceDllmScheduler:
        oracle = RecordedOracle.from_steps(steps, finals, cfg.mask_token_id)
        return cls(cfg, sink, oracle, policy=policy)

    return factory


@dataclasses.dataclass(frozen=True)
class Comparison:
    seed: int
    same_admissions: bool
    same_forwards: bool
    diverged: bool  # the reference needed a step SGLang's record does not have
    sglang: Rounds
    reference: Rounds | None


def compare(seed: int, against: str = "sglang-order") -> Comparison:
    """Program `seed` through SGLang with the fixes and through the replaying scheduler
    `against` names (call inside `sglang_fixed(FIX_NAMES)`)."""
    from integrations.sglang import REAL_SGLANG_DLLM

    space = dataclasses.replace(
        REAL_SGLANG_DLLM.profile.space, rows_equal_max_running=False, kv_headroom_pages=None
    )
    config, ops = program(seed)
    ours = run(
        REAL_SGLANG_DLLM.factory,
        dataclasses.replace(REAL_SGLANG_DLLM.profile, space=space),
        config,
        ops,
    )
    try:
        profile = DllmProfile(policy=AGAINST[against][1])
        theirs = run(replaying(ours, config, against), profile, config, ops)
    except RecordExhausted:
        return Comparison(seed, False, False, True, forward_rounds(ours), None)
    same_forwards = forward_rounds(ours) == forward_rounds(theirs)
    return Comparison(
        seed,
        admissions(ours) == admissions(theirs),
        same_forwards,
        False,
        forward_rounds(ours),
        forward_rounds(theirs),
    )


def compare_programs(programs: int, against: str = "sglang-order") -> list[Comparison]:
    from integrations.sglang.fixes import FIX_NAMES, sglang_fixed

    with sglang_fixed(FIX_NAMES):
        return [compare(seed, against) for seed in range(programs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/sglang_vs_reference.py")
    parser.add_argument("--programs", type=int, default=200, help="programs (seeds 0..N-1)")
    parser.add_argument(
        "--against", choices=list(AGAINST), default="sglang-order", help="the scheduler compared"
    )
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the counts to this file"
    )
    args = parser.parse_args(argv)
    if args.programs < 1:
        parser.error("argument --programs: must be >= 1")
    start = time.perf_counter()
    try:
        results = compare_programs(args.programs, args.against)
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
    print(f"SGLang 0.5.23 with the five fixes against {args.against}:")
    width = max(len(k) for k in counts)
    for key, value in counts.items():
        print(f"{key:<{width}}  {value:>5}")
    print(f"({seconds:.1f} s)")
    if args.json:
        differing = [dataclasses.asdict(r) for r in results if not r.same_forwards][:20]
        payload = {"against": args.against, "counts": counts, "seconds": seconds}
        write_json(args.json, {**payload, "differing": differing})
    return 0


if __name__ == "__main__":
    sys.exit(main())
