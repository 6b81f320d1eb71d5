"""The command-line flags of vLLM 0.34.0's cache-aware admission window, shared by the
engine-core loop's scripts (`integrations.vllm.loop_arguments`) and the diffusion path's
(`integrations.vllm.dllm_arguments`): `add_cache_aware_arguments` adds `--cache-aware-window N`
and `--cache-aware-threshold T`, `check_cache_aware_setting` refuses a bad value or a release
without the setting with a usage error (exit 2, one line), before any program runs."""

from __future__ import annotations

import argparse

from integrations.vllm.adapter import load_vllm
from integrations.vllm.release_api import check_scheduler_settings
from integrations.vllm.settings_034 import Vllm034Settings
from spec.errors import ConfigError


def add_cache_aware_arguments(parser: argparse.ArgumentParser, where: str) -> None:
    """`--cache-aware-window N` (0: off) and `--cache-aware-threshold T` (0.5); `where` says
    when vLLM applies the window, for the help ("under FCFS with prefix caching")."""
    parser.add_argument(
        "--cache-aware-window",
        type=int,
        default=0,
        metavar="N",
        help=f"vLLM 0.34.0 only, {where}: reorder the first N waiting requests deepest cached "
        "prefix first once the pool is used at least the threshold (vLLM's "
        "cache_aware_admission_window; default 0: off); rule cache_aware_order",
    )
    parser.add_argument(
        "--cache-aware-threshold",
        type=float,
        default=0.5,
        metavar="T",
        help="with --cache-aware-window: the pool usage in [0, 1] it engages at (vLLM's "
        "cache_aware_admission_threshold; default 0.5)",
    )


def check_cache_aware_setting(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """`parser.error` for a window below 0, a threshold outside [0, 1] or given without the
    window, or a window on a release whose `SchedulerConfig` lacks it (0.33.0)."""
    window, threshold = args.cache_aware_window, args.cache_aware_threshold
    if window < 0:
        parser.error("--cache-aware-window: an int >= 1 (0: off)")
    if not 0.0 <= threshold <= 1.0 or (threshold != 0.5 and not window):
        parser.error("--cache-aware-threshold: a number in [0, 1], with --cache-aware-window")
    if not window:
        return
    settings = Vllm034Settings(cache_aware_window=window, cache_aware_threshold=threshold)
    try:
        check_scheduler_settings(load_vllm().config.SchedulerConfig, settings.scheduler_settings())
    except ConfigError as err:
        parser.error(f"--cache-aware-window: {err}")


__all__ = ["add_cache_aware_arguments", "check_cache_aware_setting"]
