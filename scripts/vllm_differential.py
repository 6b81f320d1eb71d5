"""How many generated programs the `vllm-v1` reference decides differently from vLLM 0.33.0.

    .venv/bin/python scripts/vllm_differential.py --programs 300 [--watermark] [--json FILE]

Prints, for the `VLLM_V1` reference (vLLM 0.33.0's three options on), the idealised reference
(every option off) and the reference with each option off alone, how many of the programs
(`integrations.vllm.differential.program(seed)`, seeds 0..N-1) differ from the real scheduler
in their per-step decisions. With `--watermark` the real scheduler runs with vLLM's
`watermark=0.25` (`real-vllm-watermark`), every variant keeps it, and one more leaves it out.
Needs `schedspec install-engines vllm`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.vllm import REAL_VLLM, REAL_VLLM_WATERMARK
from integrations.vllm.custom_scheduler import check_for_loops
from integrations.vllm.differential import count_differences
from integrations.vllm.program_tally import refuse_scheduler_cls
from reference.ar.vllm_settings import VLLM_033_WATERMARK, VLLM_WATERMARK
from reference.ar.vllm_v1 import VLLM_033, VllmOptions, VllmV1Scheduler
from schedspec_cli.output import output_file, write_json
from spec.ar.adapter import ArEventSink, ArSchedulerAdapter
from spec.ar.config import ArConfig
from spec.errors import ConfigError


def _reference(options: VllmOptions, config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter:
    return VllmV1Scheduler(config, sink, options)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/vllm_differential.py")
    parser.add_argument("--programs", type=int, default=300, help="generated programs (seeds)")
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the counts to this file"
    )
    parser.add_argument(
        "--watermark",
        action="store_true",
        help=f"vLLM with watermark={VLLM_WATERMARK} (real-vllm-watermark); every variant keeps "
        "it, and one more leaves it out",
    )
    args = parser.parse_args(argv)
    if args.programs < 1:
        parser.error("--programs: must be >= 1")
    try:  # real-vllm runs vLLM's synchronous Scheduler: a class of the user's must be one
        check_for_loops(("sync",))
    except ConfigError as err:
        return refuse_scheduler_cls(parser.prog, err)
    base = VLLM_033_WATERMARK if args.watermark else VLLM_033
    mark = f" (watermark {VLLM_WATERMARK})" if args.watermark else ""
    variants = {
        f"VLLM_V1 (all three options){mark}": base,
        f"idealised (no option){mark}": VllmOptions(watermark=base.watermark),
        "without full_sequence_admission": dataclasses.replace(base, full_sequence_admission=False),
        "without lone_request_threshold_exempt": dataclasses.replace(
            base, lone_request_threshold_exempt=False
        ),
        "without victim_among_all": dataclasses.replace(base, victim_among_all=False),
    }
    if args.watermark:
        variants["without the watermark"] = VLLM_033
    real = REAL_VLLM_WATERMARK if args.watermark else REAL_VLLM
    start = time.perf_counter()
    counts: dict[str, int] = {}
    print(
        f"{'reference variant':45} programs differing from vLLM 0.33.0{mark} (of {args.programs})"
    )
    for name, options in variants.items():
        seeds = count_differences(real.factory, partial(_reference, options), args.programs)
        counts[name] = len(seeds)
        print(f"{name:45} {len(seeds):4d}  first seeds {seeds[:5]}")
    elapsed = time.perf_counter() - start
    print(f"({elapsed:.1f} s)")
    if args.json:
        write_json(
            args.json,
            {
                "programs": args.programs,
                "watermark": base.watermark,
                "differing": counts,
                "seconds": elapsed,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
