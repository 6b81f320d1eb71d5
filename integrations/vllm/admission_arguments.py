"""The command-line flags of vLLM's admission settings (`integrations.vllm.admission_knobs`),
shared by the engine-core loop's scripts (`integrations.vllm.loop_arguments`) and the
diffusion path's (`integrations.vllm.dllm_arguments`): `add_admission_arguments` adds them,
`admission_of` reads them back, a bad value being a usage error (exit 2, one line)."""

from __future__ import annotations

import argparse

from integrations.vllm.admission_knobs import AdmissionKnobs
from spec.errors import ConfigError

#: Each flag and the `AdmissionKnobs` field it sets.
ADMISSION_FLAGS = (
    ("--watermark", "watermark"),
    ("--max-active-seqs", "max_active_seqs"),
    ("--prefill-interval", "prefill_interval"),
    ("--adaptive-threshold", "adaptive_threshold"),
    ("--no-reserve-full-isl", "reserve_full_isl"),
)


def add_admission_arguments(parser: argparse.ArgumentParser) -> None:
    """`--watermark F`, `--max-active-seqs M`, `--prefill-interval N`, `--adaptive-threshold`,
    `--no-reserve-full-isl`."""
    parser.add_argument(
        "--watermark",
        type=float,
        default=0.0,
        metavar="F",
        help="vLLM's watermark: while a request runs, admit a waiting one only if F of the "
        "pool's blocks stay free (default 0: off; rule watermark)",
    )
    parser.add_argument(
        "--max-active-seqs",
        type=int,
        default=None,
        metavar="M",
        help="vLLM's max_num_active_seqs: at most M requests admitted into RUNNING, sessions "
        "waiting for input counted (capped at each program's max_num_seqs; rule active_cap)",
    )
    parser.add_argument(
        "--prefill-interval",
        type=int,
        default=1,
        metavar="N",
        help="vLLM's prefill_schedule_interval: while a request decodes, prefill rides one "
        "executed step in N (default 1: every step; rule prefill_cadence)",
    )
    parser.add_argument(
        "--adaptive-threshold",
        action="store_true",
        help="vLLM's long_prefill_token_threshold_adaptive: floor a long prefill's cap at a "
        "fair share of the budget",
    )
    parser.add_argument(
        "--no-reserve-full-isl",
        dest="reserve_full_isl",
        action="store_false",
        help="vLLM's scheduler_reserve_full_isl off: admit a request when its next step's "
        "blocks are free, not its whole sequence's",
    )


def admission_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> AdmissionKnobs:
    """The settings the flags ask for; `parser.error` (exit 2) for a bad value, naming the
    flag and what would be valid."""
    try:
        return AdmissionKnobs.of(args)
    except ConfigError as err:
        flag = next(flag for flag, field in ADMISSION_FLAGS if field == err.field)
        parser.error(f"{flag}: {err.valid}")


__all__ = ["ADMISSION_FLAGS", "add_admission_arguments", "admission_of"]
