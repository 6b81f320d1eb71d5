"""vLLM 0.33.0's asynchronous scheduling (its default), checked over generated programs.

    .venv/bin/python scripts/vllm_async_check.py --programs 3000 [--pipeline-parallel P]
        [--programs-from {branching-prompts,random,same-step,sessions,sessions-past-context,
                          shared-prompts}]
        [--speculative-tokens K]
        [--speculative-method {ngram,eagle,draft_model}]
        [--structured-output [--keyed-drafts] [--late-grammars] [--reasoning]]
        [--kv-connector {recompute,fail} [--kv-store {draws,offload} [--kv-store-blocks N]]]
        [--offload-chunks N [--offload-outputs] [--offload-sync-loads]
         [--offload-blocks-per-chunk B]] [--cache-resets]
        [--kv-events [--kv-report-full] [--offload-self-describing-events]]
        [--cache-read-limits]
        [--sliding-window W [--retention-interval N|dense]
         [--window-block-scale K | --full-block-scale K]]
        [--mamba [--retention-interval N|dense] [--mamba-block-scale K]
         [--mamba-checkpoint-alignment A]]
        [--fix {uncache-preempted,pad-what-fits,cap-draft-margin,drop-stale-reservation,
                requeue-failed-load,evict-failed-blocks,every-sharer-recomputes,
                stale-after-failed-load,evict-ended-loader-blocks,no-pointless-hit,
                forget-stale-window,whole-window-chunks,announce-cpu-reset,
                count-recorded-stores,stop-mid-block-chunks,reset-loaded-holders,
                drop-stalled-session-kv,end-session-at-model-len,
                recompute-session-state,own-grammar-per-input,
                loads-reserve-their-sequence,no-placeholder-drafts} ...]
        [--json FILE]

Runs each program (seeds 0..N-1) through vLLM's engine-core loop twice, synchronous (the
control) and asynchronous (`AsyncScheduler`, a batch queue of two), each loop on its own, with
the checks of `integrations.vllm.engine_core`; prints the failures (rule, loop and first seeds),
for each the `scripts/vllm_shrink.py` command that shrinks its first program under the same
options, and how often the asynchronous paths were taken. The programs are
`integrations.vllm.engine_core.core_program(seed)` (`random`, the whole of vLLM's space) or
`integrations.vllm.same_step_programs.same_step_program(seed)` (`same-step`, narrowed to where a
request is preempted in the step that scheduled it) or
`integrations.vllm.shared_prompt_programs.shared_prompt_program(seed)` (`shared-prompts`: the
random programs with half the prompts of every program, not only the prefix-caching ones,
prefixes of one shared prompt, so the offload store is hit) or
`integrations.vllm.branching_prompt_programs.branching_prompt_program(seed)`
(`branching-prompts`: the random programs with three prompts in four a start of the shared
prompt or of an earlier request's prompt and outputs, then tokens of their own, so a hit may be
followed by tokens other than those the cached block holds) or
`integrations.vllm.sessions.session_program(seed)` (`sessions`: the random programs with every
other request a streaming-input session given one or two later inputs and closed;
`sessions-past-context` lets a session's prompt grow past `max_model_len`; `--fix
drop-stalled-session-kv`, `end-session-at-model-len`, `recompute-session-state` and
`own-grammar-per-input` are the candidate fixes of their findings). `--fix
uncache-preempted` applies that candidate fix (`integrations.vllm.preempted_cache_fix`) to the
scheduler of both loops. `--fix no-placeholder-drafts` is the candidate fix of a finding of vLLM
0.34.0 (`SCHEDSPEC_VLLM_VERSION=0.34.0`; `integrations.vllm.guided_drafts_fix`): a guided
request's token sampled under a bitmask row that allows every token.
`--speculative-tokens K` serves both loops with speculative decoding, up to K drafts a step
(`integrations.vllm.speculative`), by `--speculative-method` (default `ngram`; `eagle` and
`draft_model` reserve lookahead slots and let the async loop skip drafting; vLLM refuses a
budget no larger than the lookahead, and such programs are reported as refused); `--fix
pad-what-fits` applies the fix of its finding (`integrations.vllm.spec_pad_fix`), and with a KV
connector `--fix cap-draft-margin` that of the draft margin an asynchronous load is admitted
with (`integrations.vllm.draft_margin_fix`). `--fix` may be repeated: the fixes are then made in
one `Scheduler.schedule`. `--structured-output` gives every other request of both loops
structured output (`integrations.vllm.structured`: its grammar admits the request's own tokens;
the model runner checks each bitmask row it samples under, `grammar_mask`, and the drafts vLLM
schedules for such a request, `draft_grammar`); `--keyed-drafts` makes the runner hand back
every request's latest drafts for a deferred batch instead of the last batch's (vLLM PR #56802's
hand-off); `--late-grammars` compiles each grammar 0-3 engine steps after submission, and one in
six not at all (`integrations.vllm.structured.LateGrammars`); `--reasoning` gives each guided
request 1-3 reasoning tokens and a reasoning end before its guided content, with a reasoning
parser that holds the grammar back until then (`integrations.vllm.structured.reasoner_class`).
`--kv-connector POLICY` serves both loops with a KV connector (`integrations.vllm.kv_connector`:
a remote store holding none, half or all of each prompt, loaded between steps or, for one
request in three, in the forward of the step that schedules it, every other request's KV sent
when it finishes, one load in three failing as a whole or in one block) under vLLM's
`kv_load_failure_policy` POLICY; `--kv-async-loads-only` leaves out the synchronous loads,
`--kv-store offload` serves a content-addressed store instead
(`integrations.vllm.offload_store`: what finished requests stored, lookups put off while a hit
block is being stored or loaded; `--kv-store-blocks N` bounds it at N blocks, evicting the least
recently used that no load pins, and refusing a store that still does not fit).
`--kv-pending-lookups` has the store answer one request in four "ask again later" at its first
one or two lookups, and `--fix drop-stale-reservation`, `requeue-failed-load`,
`evict-failed-blocks`, `every-sharer-recomputes`, `stale-after-failed-load` and
`evict-ended-loader-blocks` apply the fixes of its findings (`integrations.vllm.kv_load_fixes`).
`--pipeline-parallel P` runs the asynchronous loop with P pipeline stages (vLLM's V2 model
runner, a batch queue of P + 1). `--offload-chunks N` serves vLLM's own `OffloadingConnector`
instead of a fabricated connector: its scheduler side and CPU manager over N CPU chunks, its
worker fabricated (`integrations.vllm.offloading_worker`: stores deferred a step, flushes waited
for, jobs done 0 to 2 steps later, what each block and chunk holds moved with them);
`--offload-outputs` offloads generated tokens' blocks too and `--offload-sync-loads` lets hits
load synchronously, `--offload-blocks-per-chunk B` makes a CPU chunk hold B GPU blocks.
`--cache-resets` resets the prefix cache and the connector's cache before one engine step in 16
(vLLM's `reset_prefix_cache(reset_connector=True)`). `--sliding-window W` serves both loops a
hybrid KV cache: a sliding-window group of W tokens beside the full-attention one, each with the
pool the program names, every rule reading both groups' tables (with `--offload-chunks` the
connector stores and loads both groups' blocks, with `--kv-connector` schedspec's connector
moves both groups' blocks, `--fix hit-leaves-last-token` and `--fix cap-blocks-held` applying
the fixes of two findings there; `--retention-interval` sets vLLM's
`prefix_cache_retention_interval`; `--window-block-scale K` gives the window group blocks K times
the program's block size, `--full-block-scale K` the full-attention group; `--mamba` serves a
Mamba group beside full attention, and beside the window if one is given (vLLM's align mode
with prefix caching, none without; `--mamba-block-scale K`: every group's blocks K times the
program's, hashed by the program's;
`--mamba-checkpoint-alignment A`: its layers export internal prefill checkpoints, as Mamba2's
do); `--fix forget-stale-window` and `--fix
whole-window-chunks` apply the fixes of its two findings there,
`integrations.vllm.offload_window_fixes`). `--kv-events` turns vLLM's KV cache events on in both
loops and reads them as a KV-aware router does, copies counted (`integrations.vllm.kv_events`):
after every `update_from_output` the keys they leave cached must be the prefix cache's
(`kv_events`), and, with `--offload-chunks`, the CPU-tier keys they leave cached must be the
chunks the connector's CPU manager holds; `--kv-report-full` has every request ask for them in
vLLM's "full" report mode; `--offload-self-describing-events` has the connector announce a
chunk by its blocks' keys (vLLM's `self_describing_kv_events`). `--cache-read-limits` gives
the requests cache read limits in turn (none; skip the prefix cache; score the prompt from its
middle row on, vLLM 0.34.0's `prompt_logprob_start`), and each must be admitted with no more
tokens read from the cache or a connector than its limit (`cache_read_limit`,
`integrations.vllm.cache_reads`).
With `SCHEDSPEC_VLLM_SCHEDULER_CLS=pkg.module.Class` (`integrations.vllm.custom_scheduler`) both
loops build that class: it must subclass `AsyncScheduler` (which the synchronous loop's
`Scheduler` is a base of), checked before any program; the output's first line and the JSON's
`scheduler_cls` name it, and each shrink command printed starts with the variable.
Exit 1 if a program failed; 2, one line on stderr, for a usage error or a scheduler class that
is not one vLLM builds in both loops. Needs `schedspec install-engines vllm`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.hash_seed import hash_seed, pin_hash_seed
from integrations.vllm.admission_check import ADMISSION_MEANING
from integrations.vllm.cache_aware_check import CACHE_AWARE_MEANING
from integrations.vllm.custom_scheduler import check_for_loops
from integrations.vllm.engine_core import (
    ASYNC_BATCH_QUEUE,
    CoreProgram,
    CoreRun,
    LoopOptions,
    run_loop,
)
from integrations.vllm.loop_arguments import (
    GENERATORS,
    add_loop_arguments,
    describe,
    loop_options,
)
from integrations.vllm.program_tally import (
    MODES,
    ProgramTally,
    add_program_arguments,
    engine_words,
    parse_program_arguments,
    refuse_scheduler_cls,
    shrink_commands,
)
from schedspec_cli.output import output_file, write_json
from spec.errors import ConfigError

COUNTS = (
    "engine_steps",
    "schedules",
    "ahead",
    "stale",
    "aborts_in_flight",
    "discarded",
    "cadence_waits",
    "drafts_scheduled",
    "drafts_accepted",
    "guided_drafts_scheduled",
    "guided_drafts_accepted",
    "deferred",
    "guided_rows",
    "reasoning_rows",
    "session_reasoning_rows",
    "grammar_waits",
    "grammar_errors",
    "loads",
    "sync_loads",
    "loads_failed",
    "blocks_invalid",
    "sends",
    "session_loads",
    "session_sends",
    "aborted_loading",
    "inflight_cap_reached",
    "queue_passes",
    "load_errors",
    "lookups_put_off",
    "stores_refused",
    "blocks_evicted",
    "offload_stores",
    "offload_stored_blocks",
    "offload_flushes",
    "offload_loads",
    "offload_sync_loads",
    "offload_loaded_blocks",
    "offload_mid_chunk_loads",
    "offload_window_stored_blocks",
    "offload_window_loaded_blocks",
    "offload_unstored_loads",
    "offload_deferred_reports",
    "cache_resets",
    "cache_resets_done",
    "events_stored",
    "events_removed",
    "events_cleared",
    "events_sparse_stores",
    "events_other_media",
    "events_orphan_stores",
    "events_cpu_orphan_stores",
    "events_keys_described",
    "events_without_extra_keys",
    "adapter_waits",
    "encoder_runs",
    "encoder_reads",
    "encoder_shared",
    "encoder_evictions",
    "encoder_waits",
    "encoder_saves",
    "encoder_loads",
    "pauses",
    "pause_preempted",
    "pause_taken_back",
    "sessions",
    "session_inputs",
    "session_inputs_queued",
    "sessions_closed_waiting",
    "session_turns_on_kept_kv",
    "session_kv_dropped",
    "session_inputs_awaiting_grammar",
    "session_grammar_errors",
    "bounded_admissions",
    "partial_reads",
    *CACHE_AWARE_MEANING,
    *ADMISSION_MEANING,
)
MEANING = {
    "engine_steps": "engine-core steps",
    "schedules": "schedule() calls",
    "ahead": "requests scheduled with an output in flight",
    "stale": "preemptions with a step in flight (stale output)",
    "aborts_in_flight": "aborts with a step in flight",
    "discarded": "steps of a request that had finished",
    "cadence_waits": "requests held back for the pipeline cadence",
    "drafts_scheduled": "draft tokens scheduled (speculative decoding)",
    "drafts_accepted": "draft tokens accepted",
    "guided_drafts_scheduled": "of the drafts scheduled, structured requests'",
    "guided_drafts_accepted": "of the drafts accepted, structured requests'",
    "deferred": "batches sampled after the previous output",
    "guided_rows": "structured requests' tokens sampled under a checked row",
    "reasoning_rows": "of those, reasoning tokens (row unconstrained)",
    "session_reasoning_rows": "of those, in a session's later turn",
    "grammar_waits": "requests left waiting for their grammar, per schedule",
    "grammar_errors": "requests ended with an error (grammar does not compile)",
    "loads": "KV loads from the remote store (KV connector)",
    "sync_loads": "of those, synchronous (in the step's forward)",
    "loads_failed": "of those, failed as a whole",
    "blocks_invalid": "of those, failed in one block",
    "sends": "finished requests whose KV was sent",
    "session_loads": "KV loads into a session's later turn",
    "session_sends": "sessions of more than one turn whose KV was sent",
    "aborted_loading": "aborts of a request whose KV load was in flight",
    "inflight_cap_reached": "calls leaving max_num_inflight_kv_loads loads holding KV blocks",
    "queue_passes": "requests another waiting queue's later one passed (held back; head)",
    "bounded_admissions": "admissions of a request with a cache read limit",
    "partial_reads": "of those, with a hit within the limit (some tokens read)",
    "load_errors": "requests ended with an error after a failed load",
    "lookups_put_off": 'connector lookups answered "ask again later"',
    "stores_refused": "stores the offload store had no room for",
    "blocks_evicted": "blocks the offload store evicted to make room",
    "offload_stores": "store jobs of vLLM's OffloadingConnector",
    "offload_stored_blocks": "GPU blocks those jobs read",
    "offload_flushes": "of those jobs, flushed before a forward",
    "offload_loads": "load jobs of vLLM's OffloadingConnector",
    "offload_sync_loads": "of those, synchronous",
    "offload_loaded_blocks": "GPU blocks those jobs wrote",
    "offload_mid_chunk_loads": "of the loads, those starting inside a chunk",
    "offload_window_stored_blocks": "of the blocks stored, the sliding window's",
    "offload_window_loaded_blocks": "of the blocks loaded, the sliding window's",
    "offload_unstored_loads": "of those, from a part of a chunk its store left out",
    "offload_deferred_reports": "deferred batches whose output carried the worker's report",
    "cache_resets": "prefix-cache and connector resets",
    "cache_resets_done": "of those, done by vLLM (no KV in use)",
    "events_stored": "keys KV cache events announced stored",
    "events_removed": "keys they announced removed",
    "events_cleared": "AllBlocksCleared events",
    "events_sparse_stores": "stores whose tokens are not one block per key",
    "events_other_media": "events of the offloading connector's CPU tier",
    "events_orphan_stores": "stores whose parent key no copy holds (a radix router skips them)",
    "events_cpu_orphan_stores": "the same, in the CPU tier",
    "events_keys_described": "keys of stores checked against their blocks' content",
    "events_without_extra_keys": "stores without extra_keys where their blocks have some",
    "adapter_waits": "requests waiting for room for their LoRA adapter, per schedule",
    "encoder_runs": "multimodal items the encoder ran",
    "encoder_reads": "items a scheduled token range read",
    "encoder_shared": "of those, read by a request that did not compute them",
    "encoder_evictions": "encoder cache entries the runner was told to free",
    "encoder_waits": "requests left no token as their items found no encoder room, per schedule",
    "encoder_saves": "items saved to the CPU encoder cache",
    "encoder_loads": "items loaded from it instead of encoded",
    "pauses": "generation paused",
    "pause_preempted": "running requests a pause's cache reset preempted",
    "pause_taken_back": "waiting requests holding KV (loaded; sessions') it took back",
    "sessions": "streaming-input sessions",
    "session_inputs": "later inputs vLLM made turns of",
    "session_inputs_queued": "of those, sent while the session's turn ran",
    "sessions_closed_waiting": "sessions closed while waiting for input",
    "session_turns_on_kept_kv": "turns resumed on the session's kept KV",
    "session_kv_dropped": "resumed sessions whose kept KV was dropped before they ran",
    "session_inputs_awaiting_grammar": "inputs applied before their grammar compiled",
    "session_grammar_errors": "sessions a later input's failed grammar ended with an error",
    **CACHE_AWARE_MEANING,
    **ADMISSION_MEANING,
}


def _one_loop(program: CoreProgram, options: LoopOptions, async_scheduling: bool) -> CoreRun:
    return run_loop(program, async_scheduling=async_scheduling, options=options)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/vllm_async_check.py")
    add_program_arguments(parser, 3000)
    add_loop_arguments(parser)
    parser.add_argument(
        "--json", type=output_file, default=None, help="also write the figures to this file"
    )
    args = parse_program_arguments(parser, argv)
    options, names = loop_options(args, parser)
    try:
        # both loops run: a class of the user's must be one vLLM builds in each, checked
        # before any program (it is not a configuration vLLM refuses)
        scheduler_cls = check_for_loops(MODES)
    except ConfigError as err:
        return refuse_scheduler_cls(parser.prog, err)
    start = time.perf_counter()
    tally = ProgramTally(COUNTS)
    prefix = 0
    generate = GENERATORS[args.programs_from]
    try:
        for seed in range(args.programs):
            program = generate(seed)
            prefix += program.config.enable_prefix_caching
            tally.check_each(seed, partial(_one_loop, program, options))
    except ConfigError as err:  # the user's class (the tally counts vLLM's refusals)
        return refuse_scheduler_cls(parser.prog, err)
    elapsed = time.perf_counter() - start
    engine = engine_words()
    if engine is not None:
        print(engine)
    p = args.pipeline_parallel
    fixed = f"; fix {' + '.join(names)}" if names else ""
    drafts = describe(args)
    print(
        f"{args.programs} {args.programs_from} programs ({prefix} with prefix caching; async "
        f"with {p} pipeline stage{'s' if p > 1 else ''}{drafts}{fixed}), {tally.passed} pass "
        "both loops"
    )
    print("\n".join(tally.report(MEANING, 50)))
    print("\n".join(shrink_commands("scripts/vllm_shrink.py", tally.failures, argv)))
    print(f"({elapsed:.1f} s)")
    if args.json:
        write_json(
            args.json,
            {
                "programs": args.programs,
                "programs_from": args.programs_from,
                "fix": " + ".join(names) or None,
                "scheduler_cls": scheduler_cls,
                "prefix_caching_programs": prefix,
                **tally.json_fields(),
                "seconds": elapsed,
                "python_hash_seed": hash_seed(),
                "async_batch_queue": ASYNC_BATCH_QUEUE if p == 1 else p + 1,
                "pipeline_parallel_size": p,
                "speculative_tokens": args.speculative_tokens,
                "speculative_method": args.speculative_method,
                "structured_output": args.structured_output,
                "keyed_drafts": args.keyed_drafts,
                "late_grammars": args.late_grammars,
                "reasoning": args.reasoning,
                "kv_connector": args.kv_connector,
                "kv_async_loads_only": args.kv_async_loads_only,
                "kv_pending_lookups": args.kv_pending_lookups,
                "kv_role": args.kv_role,
                "kv_store": args.kv_store,
                "kv_store_blocks": args.kv_store_blocks,
                "offload_chunks": args.offload_chunks,
                "offload_outputs": args.offload_outputs,
                "offload_sync_loads": args.offload_sync_loads,
                "offload_blocks_per_chunk": args.offload_blocks_per_chunk,
                "offload_self_describing_events": args.offload_self_describing_events,
                "cache_resets": args.cache_resets,
                "sliding_window": args.sliding_window,
                "retention_interval": args.retention_interval,
                "window_block_scale": args.window_block_scale,
                "mamba": args.mamba,
                "mamba_block_scale": args.mamba_block_scale,
                "mamba_checkpoint_alignment": args.mamba_checkpoint_alignment,
                "full_block_scale": args.full_block_scale,
                "kv_events": args.kv_events,
                "kv_report_full": args.kv_report_full,
                "cache_read_limits": args.cache_read_limits,
                "mm_items": args.mm_items,
                "mm_tokens": args.mm_tokens if args.mm_items else None,
                "encoder_budget": args.encoder_budget,
                "encoder_cache": args.encoder_cache,
                "chunked_mm_input": not args.no_chunked_mm_input,
            },
        )
    return 1 if tally.failures else 0


if __name__ == "__main__":
    pin_hash_seed()  # the same figures on every run (integrations.hash_seed)
    sys.exit(main())
