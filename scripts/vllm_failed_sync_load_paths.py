"""Count how often each path of the candidate fix `hear-failed-sync-load` runs: failed
synchronous loads heard, running holders besides the loader failed or preempted, holders with an
asynchronous load in flight marked failed. Both loops over the first N random and N
shared-prompt programs, a sliding window of 4 tokens, under either failure policy (under
`recompute` with vLLM's six failed-load fixes), the two window fixes made too.

    .venv/bin/python scripts/vllm_failed_sync_load_paths.py [--programs N]

Prints one row per policy; `SCHEDSPEC_VLLM_VERSION` picks the vLLM release as for the other
scripts. Exit 0, or 1 if a program breaks a rule (the check's one-line message), 2 on bad
arguments or without vLLM installed (one line).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from integrations.hash_seed import pin_hash_seed
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.custom_scheduler import check_for_loops
from integrations.vllm.engine_core import LoopOptions, core_program, run_loop
from integrations.vllm.hybrid_sync_load_fix import HYBRID_SYNC_LOAD
from integrations.vllm.kv_load_fixes import KV_LOAD_FIXES
from integrations.vllm.loop_arguments import make_fixes
from integrations.vllm.program_tally import refuse_scheduler_cls
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from integrations.vllm.window_cap_fix import WINDOW_CAP
from integrations.vllm.window_hit_fix import WINDOW_HIT
from spec.errors import ConfigError

#: The counts, in the order printed.
COLUMNS = ("heard", "other running holders", "loading holders")


def count_paths(policy: str, programs: int) -> dict[str, int]:
    """The paths' counts under `policy` over the first `programs` programs of each kind."""
    counts = dict.fromkeys(COLUMNS, 0)
    fixes = [WINDOW_HIT, WINDOW_CAP, HYBRID_SYNC_LOAD]
    fix = make_fixes([*KV_LOAD_FIXES.names, *fixes] if policy == "recompute" else fixes)
    assert fix is not None

    def counted(sched: Any) -> None:
        fix(sched)
        handle = sched._handle_failed_sync_loads

        def handle_counted(failed_loads: Any) -> set[str]:
            loading = {r.request_id for r in sched.kv_holding_waiting}
            marked = set(sched.failed_recving_kv_req_ids)
            skipped: set[str] = handle(failed_loads)
            # "fail" skips (ends) every holder; "recompute" skips the running ones it
            # preempts and marks the loading ones failed
            counts["heard"] += len(failed_loads)
            counts["other running holders"] += len(skipped - set(failed_loads) - loading)
            newly_marked = set(sched.failed_recving_kv_req_ids) - marked
            counts["loading holders"] += len((skipped & loading) | newly_marked)
            return skipped

        sched._handle_failed_sync_loads = handle_counted

    options = LoopOptions(kv_connector=policy, sliding_window=4, fix=counted)
    for make in (core_program, shared_prompt_program):
        for seed in range(programs):
            for async_scheduling in (False, True):
                run_loop(make(seed), async_scheduling=async_scheduling, options=options)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=1500, help="of each kind (default 1500)")
    args = parser.parse_args(argv)
    if args.programs < 1:
        parser.error("--programs: at least 1")
    try:  # both loops run: a class of the user's must be one vLLM builds in each
        check_for_loops(("sync", "async"))
    except ConfigError as err:
        return refuse_scheduler_cls(parser.prog, err)
    print(f"{'policy':<10}" + "".join(f"{c:>24}" for c in COLUMNS))
    for policy in ("recompute", "fail"):
        try:
            counts = count_paths(policy, args.programs)
        except EngineCoreViolation as err:
            print(f"{sys.argv[0]}: {policy}: [{err.rule}] {err.detail}", file=sys.stderr)
            return 1
        except ConfigError as err:  # vLLM not installed
            print(f"{sys.argv[0]}: {err}", file=sys.stderr)
            return 2
        print(f"{policy:<10}" + "".join(f"{counts[c]:>24}" for c in COLUMNS))
    return 0


if __name__ == "__main__":
    pin_hash_seed()  # the same figures on every run (integrations.hash_seed)
    sys.exit(main())
