"""The options of the engine-core check scripts that say how a program runs: where programs
come from, the candidate fixes, speculative decoding, structured output and the KV connector.

`scripts/vllm_async_check.py` (a sweep over generated programs) and `scripts/vllm_shrink.py`
(one failing program, shrunk) take the same options, so a failure a sweep reports is shrunk
under the very options it was found with. `add_loop_arguments` adds them to a parser,
`loop_options` checks them (a usage error, exit 2, for a combination that makes no sense) and
builds the `LoopOptions`, and `describe` says them in words.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import asdict
from functools import partial
from typing import Any

from integrations.vllm.adapter import (
    KV_FAILURE_POLICIES,
    KV_ROLES,
    SPECULATIVE_METHODS,
    load_vllm,
)
from integrations.vllm.admission_arguments import add_admission_arguments, admission_of
from integrations.vllm.admission_knobs import AdmissionKnobs
from integrations.vllm.branching_prompt_programs import branching_prompt_program
from integrations.vllm.cache_aware_arguments import (
    add_cache_aware_arguments,
    check_cache_aware_setting,
)
from integrations.vllm.cache_probe_fix import CACHE_PROBE, CACHE_PROBE_FIX, apply_cache_probe_fix
from integrations.vllm.cadence_fix import CADENCE_FIX
from integrations.vllm.draft_margin_fix import DRAFT_MARGIN_FIX
from integrations.vllm.encoder_arguments import (
    add_encoder_arguments,
    describe_encoder,
    encoder_of,
)
from integrations.vllm.encoder_connector_fix import ENCODER_CONNECTOR_FIX
from integrations.vllm.encoder_load_order_fix import ENCODER_LOAD_ORDER_FIX
from integrations.vllm.encoder_rollback_fix import ENCODER_ROLLBACK_FIX
from integrations.vllm.encoder_victim_fix import ENCODER_VICTIM_FIX
from integrations.vllm.engine_core import KV_STORES, CoreProgram, LoopOptions, core_program
from integrations.vllm.guided_drafts_fix import GUIDED_DRAFTS_FIX
from integrations.vllm.hybrid_sync_load_fix import HYBRID_SYNC_LOAD_FIX
from integrations.vllm.kv_load_fixes import KV_LOAD_SCHEDULE
from integrations.vllm.load_reservation_fix import LOAD_RESERVATION_FIX
from integrations.vllm.mamba_split_fix import MAMBA_SPLIT_FIX
from integrations.vllm.mm_threshold_fix import MM_THRESHOLD_FIX
from integrations.vllm.mm_upstream_fixes import (
    FINISH_ITEM_STARTED_INSIDE_FIX,
    WHOLE_PROMPT_UNDER_ENCODER_PRESSURE_FIX,
)
from integrations.vllm.offload_error_store_fix import (
    STORE_COMPUTED_ON_ERROR,
    STORE_COMPUTED_ON_ERROR_FIX,
)
from integrations.vllm.offload_events_fix import (
    ANNOUNCE_CPU_RESET,
    ANNOUNCE_CPU_RESET_FIX,
    apply_announce_cpu_reset,
)
from integrations.vllm.offload_hit_fix import OFFLOAD_HIT, OFFLOAD_HIT_FIX, apply_offload_hit_fix
from integrations.vllm.offload_restore_fix import (
    COUNT_RECORDED_STORES,
    COUNT_RECORDED_STORES_FIX,
    apply_count_recorded_stores,
)
from integrations.vllm.offload_window_fixes import (
    FORGET_STALE_WINDOW,
    FORGET_STALE_WINDOW_FIX,
    WHOLE_WINDOW_CHUNKS,
    WHOLE_WINDOW_CHUNKS_FIX,
    apply_forget_stale_window,
    apply_offloading_fixes,
    apply_store_computed_on_error,
    apply_whole_window_chunks,
)
from integrations.vllm.patches import ScheduleFix
from integrations.vllm.pauses import PAUSE_MODES
from integrations.vllm.preempted_cache_fix import PREEMPTED_CACHE_FIX
from integrations.vllm.release_api import check_scheduler_settings
from integrations.vllm.reset_holders_fix import RESET_HOLDERS_FIX
from integrations.vllm.same_step_programs import same_step_program
from integrations.vllm.session_grammar_fix import SESSION_GRAMMAR_FIX
from integrations.vllm.session_length_fix import SESSION_LENGTH_FIX
from integrations.vllm.session_stall_fix import SESSION_STALL_FIX
from integrations.vllm.session_state_fix import SESSION_STATE_FIX
from integrations.vllm.sessions import session_program
from integrations.vllm.settings_034 import Vllm034Settings
from integrations.vllm.shared_prompt_programs import shared_prompt_program
from integrations.vllm.spec_pad_fix import SPEC_PAD_FIX
from integrations.vllm.window_cap_fix import WINDOW_CAP, WINDOW_CAP_FIX, apply_window_cap_fix
from integrations.vllm.window_hit_fix import WINDOW_HIT_FIX
from spec.errors import ConfigError

#: Where the programs come from (`--programs-from`).
GENERATORS: dict[str, Callable[[int], CoreProgram]] = {
    "branching-prompts": branching_prompt_program,
    "random": core_program,
    "same-step": same_step_program,
    "sessions": session_program,
    "sessions-past-context": partial(session_program, past_context=True),
    "shared-prompts": shared_prompt_program,
}
#: Candidate fixes `--fix` can apply to the scheduler of both loops: edits of `Scheduler`
#: (made together, `ScheduleFix`) and of vLLM's offloading connector (`CONNECTOR_FIXES`).
FIXES = {
    fix.name: fix
    for fix in (
        PREEMPTED_CACHE_FIX,
        SPEC_PAD_FIX,
        DRAFT_MARGIN_FIX,
        *KV_LOAD_SCHEDULE.fix_set.fixes,
        OFFLOAD_HIT_FIX,
        FORGET_STALE_WINDOW_FIX,
        WHOLE_WINDOW_CHUNKS_FIX,
        ANNOUNCE_CPU_RESET_FIX,
        COUNT_RECORDED_STORES_FIX,
        STORE_COMPUTED_ON_ERROR_FIX,
        MAMBA_SPLIT_FIX,
        RESET_HOLDERS_FIX,
        SESSION_STALL_FIX,
        SESSION_LENGTH_FIX,
        SESSION_STATE_FIX,
        SESSION_GRAMMAR_FIX,
        LOAD_RESERVATION_FIX,
        GUIDED_DRAFTS_FIX,
        CADENCE_FIX,
        CACHE_PROBE_FIX,
        WINDOW_HIT_FIX,
        WINDOW_CAP_FIX,
        HYBRID_SYNC_LOAD_FIX,
        ENCODER_VICTIM_FIX,
        MM_THRESHOLD_FIX,
        ENCODER_ROLLBACK_FIX,
        FINISH_ITEM_STARTED_INSIDE_FIX,
        WHOLE_PROMPT_UNDER_ENCODER_PRESSURE_FIX,
        ENCODER_LOAD_ORDER_FIX,
        ENCODER_CONNECTOR_FIX,
    )
}
#: The fixes of `FIXES` that edit vLLM's offloading connector, not `Scheduler`: how one built
#: scheduler's connector gets each on its own (`make_fixes` makes the chosen ones together,
#: `apply_offloading_fixes`).
CONNECTOR_FIXES: dict[str, Callable[[Any], None]] = {
    OFFLOAD_HIT: apply_offload_hit_fix,
    FORGET_STALE_WINDOW: apply_forget_stale_window,
    WHOLE_WINDOW_CHUNKS: apply_whole_window_chunks,
    ANNOUNCE_CPU_RESET: apply_announce_cpu_reset,
    COUNT_RECORDED_STORES: apply_count_recorded_stores,
    STORE_COMPUTED_ON_ERROR: apply_store_computed_on_error,
}


#: The fixes of `FIXES` that edit vLLM's `KVCacheManager`: how one built scheduler's manager
#: gets each (`make_fixes`).
MANAGER_FIXES: dict[str, Callable[[Any], None]] = {
    CACHE_PROBE: apply_cache_probe_fix,
    WINDOW_CAP: apply_window_cap_fix,
}


def retention_interval(text: str) -> int | None:
    """`--retention-interval`'s value: "dense" (None) or an integer >= 0."""
    if text == "dense":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: 'dense' or an integer >= 0")
    return value


def make_fixes(names: Iterable[str]) -> Callable[[Any], None] | None:
    """What `LoopOptions(fix=...)` takes to make the named fixes of `FIXES` on one built
    scheduler (its `Scheduler` edits in one `ScheduleFix`, then its connector's); None for
    none."""
    chosen = sorted(set(names))
    if not chosen:
        return None
    schedule = [FIXES[n] for n in chosen if n not in CONNECTOR_FIXES and n not in MANAGER_FIXES]
    connector = [n for n in chosen if n in CONNECTOR_FIXES]
    manager = [MANAGER_FIXES[n] for n in chosen if n in MANAGER_FIXES]
    edit = ScheduleFix(*schedule).apply if schedule else None

    def fix(sched: Any) -> None:
        if edit is not None:
            edit(sched)
        for apply in manager:
            apply(sched)
        # made together: two of them may edit one method of the connector
        apply_offloading_fixes(sched, connector)

    return fix


def add_loop_arguments(parser: argparse.ArgumentParser) -> None:
    """`--programs-from`, `--fix` (repeatable), the speculative, structured-output and KV
    connector options."""
    parser.add_argument(
        "--programs-from",
        choices=sorted(GENERATORS),
        default="random",
        help="the program generator (default random: the whole of vLLM's space; shared-prompts: "
        "the same with prompts shared in every program, for --kv-store offload; "
        "branching-prompts: prompts that share a start and then differ)",
    )
    parser.add_argument(
        "--fix",
        choices=sorted(FIXES),
        action="append",
        default=None,
        help="apply this candidate fix to the scheduler of both loops (repeatable)",
    )
    parser.add_argument(
        "--speculative-tokens",
        type=int,
        default=0,
        metavar="K",
        help="serve both loops with speculative decoding, up to K drafts a step (default 0)",
    )
    parser.add_argument(
        "--speculative-method",
        choices=SPECULATIVE_METHODS,
        default="ngram",
        help="how drafts are made (default ngram; eagle and draft_model reserve lookahead slots)",
    )
    parser.add_argument(
        "--structured-output",
        action="store_true",
        help="give every other request structured output (a grammar of its own tokens)",
    )
    parser.add_argument(
        "--keyed-drafts",
        action="store_true",
        help="with --structured-output and drafts: the model runner hands back every "
        "request's latest drafts for a deferred batch, not the last batch's (vLLM PR #56802)",
    )
    parser.add_argument(
        "--late-grammars",
        action="store_true",
        help="with --structured-output: each grammar compiles 0-3 engine steps after "
        "submission, and one in six not at all (the request must end with an error)",
    )
    parser.add_argument(
        "--reasoning",
        action="store_true",
        help="with --structured-output: each guided request reasons 1-3 tokens and ends its "
        "reasoning before its guided content (a reasoning parser holds the grammar back)",
    )
    parser.add_argument(
        "--kv-connector",
        choices=KV_FAILURE_POLICIES,
        default=None,
        metavar="POLICY",
        help="serve both loops with a KV connector (asynchronous loads from a remote store, "
        "sends of finished requests' KV) under this kv_load_failure_policy: recompute or fail",
    )
    parser.add_argument(
        "--kv-async-loads-only",
        action="store_true",
        help="with --kv-connector: every load asynchronous (by default one request in three "
        "loads synchronously, in the forward of the step that schedules it)",
    )
    parser.add_argument(
        "--kv-no-failed-loads",
        action="store_true",
        help="with --kv-connector: no load fails (by default one in three fails, as a whole "
        "or in one block), to tell what loads do from what their failures do",
    )
    parser.add_argument(
        "--kv-role",
        choices=KV_ROLES,
        default="kv_both",
        help="with --kv-connector: the connector's role (default kv_both: it loads and sends; "
        "kv_producer: it only sends, a P/D prefill instance, and vLLM frees a preempted "
        "request's blocks with its steps in flight)",
    )
    parser.add_argument(
        "--kv-pending-lookups",
        action="store_true",
        help='with --kv-connector: one request in four is first answered "ask again later" '
        "(None) at one or two lookups, as vLLM's offloading connector answers while its lookup "
        "job runs",
    )
    parser.add_argument(
        "--kv-store",
        choices=KV_STORES,
        default="draws",
        help="with --kv-connector: the store (default draws: each request's hit and put-off "
        "lookups drawn; offload: what finished requests stored, by block hash, lookups put off "
        "while a hit block is being stored or loaded, as vLLM's offloading connector; prefix-"
        "caching programs only hit, unless --programs-from shared-prompts)",
    )
    parser.add_argument(
        "--cache-read-limits",
        action="store_true",
        help="requests bound their cache reads in turn: none, skip the prefix cache "
        "(skip_reading_prefix_cache), score the prompt from its middle row on (vLLM 0.34.0's "
        "prompt_logprob_start; on 0.33.0 a skip again); rule cache_read_limit",
    )
    parser.add_argument(
        "--max-inflight-kv-loads",
        type=int,
        default=None,
        metavar="N",
        help="with --kv-connector or --offload-chunks, vLLM 0.34.0 only: at most N requests "
        "hold KV blocks for an asynchronous load, and such loads may start while the running "
        "batch is full (vLLM's max_num_inflight_kv_loads; default: no cap)",
    )
    add_cache_aware_arguments(parser, "under FCFS with prefix caching")
    parser.add_argument(
        "--kv-store-blocks",
        type=int,
        default=None,
        metavar="N",
        help="with --kv-store offload: the store holds at most N blocks, evicting the least "
        "recently used that no load pins (default: unbounded)",
    )
    parser.add_argument(
        "--offload-chunks",
        type=int,
        default=None,
        metavar="N",
        help="serve both loops with vLLM's own OffloadingConnector over a CPU store of N chunks "
        "(its scheduler side and CPU manager run; its worker is fabricated, moving what the "
        "blocks hold); not with --kv-connector",
    )
    parser.add_argument(
        "--offload-outputs",
        action="store_true",
        help="with --offload-chunks: offload generated tokens' blocks too (vLLM's "
        "offload_prompt_only False)",
    )
    parser.add_argument(
        "--offload-blocks-per-chunk",
        type=int,
        default=1,
        metavar="B",
        help="with --offload-chunks: GPU blocks a CPU chunk holds (vLLM's blocks_per_chunk; "
        "default 1)",
    )
    parser.add_argument(
        "--cache-resets",
        action="store_true",
        help="reset the prefix cache and the connector's cache before one engine step in 16, "
        "with requests running and transfers in flight, as vLLM's reset_prefix_cache("
        "reset_connector=True) after a weight update; not with --kv-connector",
    )
    parser.add_argument(
        "--kv-events",
        action="store_true",
        help="turn vLLM's KV cache events on and check them as a router reads them: after "
        "each update_from_output the keys they leave cached are the prefix cache's",
    )
    parser.add_argument(
        "--offload-self-describing-events",
        action="store_true",
        help="with --offload-chunks and --kv-events: the connector announces a stored chunk by "
        "its blocks' keys (vLLM's self_describing_kv_events)",
    )
    parser.add_argument(
        "--kv-report-full",
        action="store_true",
        help="with --kv-events: every request asks vLLM to announce the blocks its "
        "prefix-cache hit reuses too (kv_cache_report_mode 'full')",
    )
    parser.add_argument(
        "--pauses",
        choices=PAUSE_MODES,
        default=None,
        metavar="MODE",
        help="pause generation before one engine step in 16, as vLLM's pause_scheduler(MODE) "
        "does around a weight update (keep, wait or abort), clear the caches when idle and "
        "resume; not with --kv-connector",
    )
    parser.add_argument(
        "--loras",
        type=int,
        default=0,
        metavar="N",
        help="serve N LoRA adapters: request i runs adapter i mod (N + 1), 0 being the base "
        "model (default 0: no LoRA)",
    )
    parser.add_argument(
        "--max-loras",
        type=int,
        default=1,
        metavar="M",
        help="with --loras: at most M adapters among the running requests (vLLM's max_loras; "
        "default 1)",
    )
    add_admission_arguments(parser)
    add_encoder_arguments(parser)
    parser.add_argument(
        "--sliding-window",
        type=int,
        default=None,
        metavar="W",
        help="serve both loops a hybrid KV cache: a sliding-window group of W tokens beside the "
        "full-attention one, each with the pool the program names (with --kv-connector the "
        "connector moves both groups' blocks; not with --kv-store offload)",
    )
    parser.add_argument(
        "--retention-interval",
        type=retention_interval,
        default=0,
        metavar="N|dense",
        help="with --sliding-window: vLLM's prefix_cache_retention_interval, which blocks of the "
        "window are kept for hits (default 0, vLLM's: the replay boundary and shared-prefix "
        "junctions only; dense: every block; N: also every N tokens)",
    )
    parser.add_argument(
        "--window-block-scale",
        type=int,
        default=1,
        metavar="K",
        help="with --sliding-window: the window group's blocks hold K times the program's block "
        "size (a window layer with less KV per token gets larger blocks of the same page size; "
        "vLLM then schedules by the larger and hashes by the program's)",
    )
    parser.add_argument(
        "--full-block-scale",
        type=int,
        default=1,
        metavar="K",
        help="with --sliding-window: the full-attention group's blocks hold K times the "
        "program's block size, the window's the program's (full-attention layers with less KV "
        "per token); not with --window-block-scale or --mamba",
    )
    parser.add_argument(
        "--mamba",
        action="store_true",
        help="serve both loops a hybrid KV cache with a Mamba group beside the full-attention "
        "one, and beside the window with --sliding-window (vLLM's align mode with prefix "
        "caching, none without); not with a connector or drafts",
    )
    parser.add_argument(
        "--mamba-block-scale",
        type=int,
        default=1,
        metavar="K",
        help="with --mamba: its blocks hold K times the program's block size with prefix "
        "caching, as do the attention groups' (vLLM's mamba_block_size; a hit may then end "
        "inside a block, unless a --sliding-window group turns such hits off)",
    )
    parser.add_argument(
        "--mamba-checkpoint-alignment",
        type=int,
        default=None,
        metavar="A",
        help="with --mamba: its layers export internal prefill checkpoints on a grid of A "
        "tokens (Mamba2's 1, a gated-delta-net layer's Mamba block size), so a prompt's last "
        "reusable state is cached and hit",
    )
    parser.add_argument(
        "--offload-sync-loads",
        action="store_true",
        help="with --offload-chunks: a hit may load in the forward of the step that schedules "
        "it (a sync_load_budget_bytes for any hit)",
    )


def loop_options(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[LoopOptions, list[str]]:
    """The `LoopOptions` `args` ask for, and the names of the fixes made (sorted; made in one
    `Scheduler.schedule`); `parser.error` (exit 2) for options that do not go together."""
    if args.speculative_tokens < 0:
        parser.error("--speculative-tokens: must be >= 0")
    if args.kv_store == "offload" and (args.kv_pending_lookups or args.kv_role != "kv_both"):
        parser.error(
            "--kv-store offload puts lookups off itself and loads what it stored: not with "
            "--kv-pending-lookups or --kv-role kv_producer"
        )
    if args.kv_store_blocks is not None and (
        args.kv_store_blocks < 1 or args.kv_store != "offload"
    ):
        parser.error("--kv-store-blocks: an int >= 1, with --kv-store offload")
    if args.max_inflight_kv_loads is not None and (
        args.max_inflight_kv_loads < 1 or not (args.kv_connector or args.offload_chunks)
    ):
        parser.error(
            "--max-inflight-kv-loads: an int >= 1, with --kv-connector or --offload-chunks"
        )
    if args.max_inflight_kv_loads is not None:
        settings = Vllm034Settings(max_inflight_kv_loads=args.max_inflight_kv_loads)
        try:  # refused now, not program by program (0.33.0 has no such setting)
            check_scheduler_settings(
                load_vllm().config.SchedulerConfig, settings.scheduler_settings()
            )
        except ConfigError as err:
            parser.error(f"--max-inflight-kv-loads: {err}")
    check_cache_aware_arguments(args, parser)
    if args.offload_chunks is not None and (args.offload_chunks < 1 or args.kv_connector):
        parser.error("--offload-chunks: an int >= 1, not with --kv-connector")
    if args.offload_chunks is None and (
        args.offload_outputs or args.offload_sync_loads or args.offload_blocks_per_chunk != 1
    ):
        parser.error(
            "--offload-outputs, --offload-sync-loads and --offload-blocks-per-chunk need "
            "--offload-chunks"
        )
    if args.kv_report_full and not args.kv_events:
        parser.error("--kv-report-full: only with --kv-events")
    if args.offload_self_describing_events and not (args.kv_events and args.offload_chunks):
        parser.error("--offload-self-describing-events: only with --offload-chunks and --kv-events")
    if args.loras < 0:
        parser.error("--loras: an int >= 0")
    if args.max_loras < 1 or (args.max_loras != 1 and not args.loras):
        parser.error("--max-loras: an int >= 1, with --loras")
    if args.cache_resets and args.kv_connector:
        parser.error("--cache-resets: not with --kv-connector (its store keeps no cache)")
    if args.offload_blocks_per_chunk < 1:
        parser.error("--offload-blocks-per-chunk: an int >= 1")
    if args.sliding_window is not None and (
        args.sliding_window < 1 or (args.kv_connector and args.kv_store == "offload")
    ):
        parser.error("--sliding-window: an int >= 1, not with --kv-store offload")
    if WINDOW_CAP in (args.fix or ()) and args.sliding_window is None:
        parser.error(
            f"--fix {WINDOW_CAP}: edits a sliding window's admission cap, needs --sliding-window"
        )
    if args.retention_interval != 0 and args.sliding_window is None and not args.mamba:
        parser.error("--retention-interval: only with --sliding-window or --mamba")
    if args.mamba and (
        args.kv_connector or args.offload_chunks is not None or args.speculative_tokens
    ):
        parser.error("--mamba: not with --kv-connector, --offload-chunks or --speculative-tokens")
    if args.mamba_block_scale != 1 and args.window_block_scale != 1:
        parser.error("--mamba-block-scale: not with --window-block-scale")
    if args.mamba_block_scale != 1 and (args.mamba_block_scale < 1 or not args.mamba):
        parser.error("--mamba-block-scale: an int >= 1, with --mamba")
    alignment = args.mamba_checkpoint_alignment
    if alignment is not None and (alignment < 1 or not args.mamba):
        parser.error("--mamba-checkpoint-alignment: an int >= 1, with --mamba")
    if args.window_block_scale != 1 and (
        args.window_block_scale < 1 or args.sliding_window is None
    ):
        parser.error("--window-block-scale: an int >= 1, with --sliding-window")
    if args.full_block_scale != 1 and (
        args.full_block_scale < 1
        or args.sliding_window is None
        or args.window_block_scale != 1
        or args.mamba
    ):
        parser.error(
            "--full-block-scale: an int >= 1, with --sliding-window, not with "
            "--window-block-scale or --mamba"
        )
    admission = admission_of(args, parser)
    encoder = encoder_of(args, parser)
    names = sorted(set(args.fix or ()))
    connector_fixes = [n for n in names if n in CONNECTOR_FIXES]
    if connector_fixes and args.offload_chunks is None:
        parser.error(
            f"--fix {' '.join(connector_fixes)}: edits vLLM's offloading connector, needs "
            "--offload-chunks"
        )
    options = LoopOptions(
        fix=make_fixes(names),
        pipeline_parallel_size=args.pipeline_parallel,
        speculative_tokens=args.speculative_tokens,
        speculative_method=args.speculative_method,
        structured_output=args.structured_output,
        keyed_drafts=args.keyed_drafts,
        late_grammars=args.late_grammars,
        reasoning=args.reasoning,
        kv_connector=args.kv_connector,
        kv_sync_loads=not args.kv_async_loads_only,
        kv_load_failures=not args.kv_no_failed_loads,
        kv_pending_lookups=args.kv_pending_lookups,
        kv_role=args.kv_role,
        kv_store=args.kv_store,
        kv_store_blocks=args.kv_store_blocks,
        max_inflight_kv_loads=args.max_inflight_kv_loads,
        cache_aware_window=args.cache_aware_window,
        cache_aware_threshold=args.cache_aware_threshold,
        cache_read_limits=args.cache_read_limits,
        offload_chunks=args.offload_chunks,
        offload_outputs=args.offload_outputs,
        offload_sync_loads=args.offload_sync_loads,
        offload_blocks_per_chunk=args.offload_blocks_per_chunk,
        offload_self_describing_events=args.offload_self_describing_events,
        cache_resets=args.cache_resets,
        sliding_window=args.sliding_window,
        retention_interval=args.retention_interval,
        window_block_scale=args.window_block_scale,
        mamba=args.mamba,
        mamba_block_scale=args.mamba_block_scale,
        mamba_checkpoint_alignment=args.mamba_checkpoint_alignment,
        full_block_scale=args.full_block_scale,
        kv_events=args.kv_events,
        kv_report_mode="full" if args.kv_report_full else "incremental",
        loras=args.loras,
        max_loras=args.max_loras,
        pauses=args.pauses,
        encoder=encoder,
        **asdict(admission),
    )
    return options, names


def check_cache_aware_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """`--cache-aware-window` and `--cache-aware-threshold` (and `--fix bounded-cache-probe`,
    which edits the probe only the window calls): `parser.error` (exit 2) for a bad value or
    a release without the setting."""
    if CACHE_PROBE in (args.fix or ()) and not args.cache_aware_window:
        parser.error(f"--fix {CACHE_PROBE}: edits the probe of --cache-aware-window, needs it")
    check_cache_aware_setting(args, parser)  # the threshold alone, without the window


def describe(args: argparse.Namespace) -> str:
    """The speculative, structured-output and KV connector options of `args` in words, each
    after "; " (empty if none is set)."""
    k = args.speculative_tokens
    method = "" if args.speculative_method == "ngram" else f" by {args.speculative_method}"
    drafts = f"; up to {k} drafts a step{method}" if k else ""
    drafts += "; structured output" if args.structured_output else ""
    drafts += " (drafts handed back by request)" if args.keyed_drafts else ""
    drafts += " (grammars compiled late)" if args.late_grammars else ""
    drafts += " (after reasoning)" if args.reasoning else ""
    cap = args.max_inflight_kv_loads
    capped = f", at most {cap} loads holding blocks" if cap else ""
    if args.kv_connector:
        loads = "asynchronous loads" if args.kv_async_loads_only else "all loads"
        loads += ", none failing" if args.kv_no_failed_loads else ""
        loads = "sends only" if args.kv_role == "kv_producer" else loads
        later = ", lookups put off" if args.kv_pending_lookups else ""
        later += ", an offload store" if args.kv_store == "offload" else ""
        blocks = args.kv_store_blocks
        later += f" of {blocks} block{'s' if blocks > 1 else ''}" if blocks else ""
        later += capped
        drafts += f"; a KV connector ({loads}{later}, failed loads: {args.kv_connector})"
    if args.offload_chunks:
        what = "prompt and output blocks" if args.offload_outputs else "prompt blocks"
        sync = ", synchronous loads" if args.offload_sync_loads else ""
        per = args.offload_blocks_per_chunk
        size = f" of {per} blocks" if per > 1 else ""
        if args.offload_self_describing_events:
            size += ", self-describing events"
        sync += capped
        drafts += (
            f"; vLLM's OffloadingConnector ({args.offload_chunks} CPU chunks{size}, {what}{sync})"
        )
    if args.cache_resets:
        drafts += "; cache resets"
    if args.cache_read_limits:
        drafts += "; cache read limits"
    if args.cache_aware_window:
        drafts += (
            f"; cache-aware admission (window {args.cache_aware_window}, usage >= "
            f"{args.cache_aware_threshold:g})"
        )
    if args.kv_events:
        full = ", hits reported in full" if args.kv_report_full else ""
        drafts += f"; KV cache events checked{full}"
    if args.loras:
        drafts += f"; {args.loras} LoRA adapters, at most {args.max_loras} running"
    drafts += describe_encoder(args)
    if args.pauses:
        drafts += f"; generation paused (mode {args.pauses})"
    drafts += AdmissionKnobs.of(args).describe()
    kept = args.retention_interval
    retention = "" if kept == 0 else ", dense" if kept is None else f", kept every {kept}"
    if args.mamba:
        scale = args.mamba_block_scale
        group = "a Mamba group" + ("" if scale == 1 else f" in blocks {scale} times the block size")
        alignment = args.mamba_checkpoint_alignment
        window = args.sliding_window
        if alignment is not None:
            group += f", with prefill checkpoints on a grid of {alignment}"
        if window is not None:
            wscale = args.window_block_scale
            wblocks = "" if wscale == 1 else f" in blocks {wscale} times the block size"
            group += f", and a sliding window of {_tokens(window)}{wblocks}"
        if alignment is not None or window is not None:
            group += ","
        drafts += f"; a hybrid KV cache ({group} beside full attention{retention})"
    elif args.sliding_window is not None:
        scale = args.window_block_scale
        blocks = "" if scale == 1 else f" in blocks {scale} times the block size"
        full = args.full_block_scale
        if full != 1:
            blocks += f", full attention in blocks {full} times the block size"
        drafts += (
            f"; a hybrid KV cache (a sliding window of {_tokens(args.sliding_window)}{blocks}"
            f"{retention})"
        )
    return drafts


def _tokens(count: int) -> str:
    """`count` tokens, in words ("1 token", "3 tokens")."""
    return f"{count} token{'' if count == 1 else 's'}"


__all__ = [
    "CONNECTOR_FIXES",
    "FIXES",
    "GENERATORS",
    "MANAGER_FIXES",
    "add_loop_arguments",
    "check_cache_aware_arguments",
    "describe",
    "loop_options",
    "make_fixes",
    "retention_interval",
]
