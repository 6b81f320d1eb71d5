"""Render docs/upstream-reports.md: one report per vLLM finding, ready to file upstream, from the
shrunk programs of docs/shrunk/vllm-*.json (`scripts/vllm_shrink.py --json --trace` for the
autoregressive engine-core loop's findings, `scripts/vllm_dllm_shrink.py --json --trace` for the
diffusion loop's: their records say `"path": "diffusion"`), then one per open finding in
SGLang's dLLM path, from docs/shrunk/sglang-*.json (`scripts/sglang_findings.py --record`).

    python3 scripts/upstream_reports.py [--check]

Each report gives the finding in a sentence, what its candidate fix changes (the fix's own
summary), the rule its program breaks and the message, the command that reproduces it, the
program, its run (SGLang's: the adapter's calls on SGLang's scheduler), and the command that
prints the fix as a patch. Without `--check` it writes the file; with `--check` it writes
nothing and exits 1 if the file is not what it would write (a program re-recorded, a title
changed), 0 if it is. Exit 2, one line on stderr, for a usage error, a vLLM shrunk program
with no title here (an SGLang record carries its own), or a record that is not one its script
writes (not JSON, not an object, a field missing or of the wrong kind: the line names the file,
what is wrong and what is expected). Needs no engine: the fixes' summaries are read from
`integrations.vllm` and `integrations.sglang.fixes`, which import their engine only when a fix
is applied.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.sglang.fixes import SGLANG_FIXES
from integrations.vllm.dllm_arguments import SPACE_FLAGS, fix_flags, space_flags
from integrations.vllm.encoder_inputs import EncoderOptions
from integrations.vllm.engine_core import LoopOptions
from integrations.vllm.fixes import VLLM_DLLM_FIXES
from integrations.vllm.loop_arguments import FIXES, GENERATORS
from integrations.vllm.trace import counted
from schedspec_cli.args import Parser, UsageError

ROOT = Path(__file__).resolve().parent.parent
SHRUNK = ROOT / "docs" / "shrunk"
REPORTS = ROOT / "docs" / "upstream-reports.md"
PROG = "scripts/upstream_reports.py"

#: Per shrunk program (file stem): the report's title, the `scripts/engine_fixes_diff.py`
#: target that prints its fix, and the issue it belongs to upstream if one is known ("#N" for
#: an issue, else the words to name it by).
TITLES: dict[str, tuple[str, str, str | None]] = {
    "vllm-prefix-preempted": (
        "Prefix caching under the priority policy: a request preempted in the step that "
        "scheduled it leaves that step's blocks cached, their KV never written",
        "vllm-prefix",
        None,
    ),
    "vllm-spec-pad": (
        "Speculative decoding: a new decode padded to 1 + k tokens trips an assert in "
        "schedule() under a long-prefill threshold below 1 + k",
        "vllm-spec",
        None,
    ),
    "vllm-kv-stale-reservation": (
        "KV connector, recompute policy: a request whose load failed keeps the reservation of "
        "blocks it no longer holds, and the engine hangs",
        "vllm-kv",
        None,
    ),
    "vllm-kv-failed-load-heads": (
        "KV connector, recompute policy: a failed load keeps heading the requests holding KV "
        "and strands the finished loads behind it",
        "vllm-kv",
        None,
    ),
    "vllm-kv-failed-blocks-cached": (
        "KV connector: blocks computed over a block whose synchronous load failed stay in the "
        "prefix cache under the recompute policy",
        "vllm-kv",
        None,
    ),
    "vllm-kv-second-holder": (
        "KV connector, recompute policy: a second holder of a failed block reads it before it "
        "is recomputed",
        "vllm-kv",
        None,
    ),
    "vllm-kv-loader-gone": (
        "KV connector: the blocks a step computed over a failed block stay cached once the "
        "request that loaded it is gone",
        "vllm-kv",
        None,
    ),
    "vllm-kv-45138": (
        "KV connector under async scheduling: a failed synchronous load leaves the request's "
        "output placeholders counted",
        "vllm-kv",
        "#45138",
    ),
    "vllm-kv-draft-margin": (
        "KV connector with speculative decoding: an asynchronous load's draft margin is capped "
        "neither at max_model_len nor at what the request needs, so it never loads",
        "vllm-draft-margin",
        None,
    ),
    "vllm-offloading-one-token": (
        "KV offloading connector, blocks of one token: a one-token prompt another request "
        "offloaded is loaded, rolled back to nothing computed, and loaded again, for ever",
        "vllm-offloading",
        None,
    ),
    "vllm-offloading-reset-window": (
        "KV offloading connector, hybrid cache: after a cache reset a running request is "
        "re-offloaded from chunk 0 over sliding-window blocks the window freed and the pool "
        "gave to another group",
        "vllm-offloading",
        None,
    ),
    "vllm-offloading-reset-twice": (
        "KV offloading connector, hybrid cache: after a cache reset a re-offload lists one GPU "
        "block twice (a stale sliding-window id and the same block reallocated to the "
        "request), and update_from_output raises KeyError",
        "vllm-offloading",
        None,
    ),
    "vllm-offloading-reset-events": (
        "KV offloading connector with KV cache events: a connector reset made while the prefix "
        "cache's own reset fails empties the CPU tier without an event, and a router keeps "
        "counting on CPU-tier hits that are gone",
        "vllm-offloading",
        None,
    ),
    "vllm-mamba-mid-block-hit": (
        "Mamba prefix caching, hashes finer than the Mamba block, layers that export prefill "
        "checkpoints: a chunk starting inside a Mamba block runs past its end, and the block, "
        "holding the state short of its end, is cached as the full block",
        "vllm-mamba",
        None,
    ),
    "vllm-offloading-window-part": (
        "KV offloading connector, hybrid cache, chunks of several blocks: a sliding-window chunk "
        "stored in part is keyed as a whole, and a later hit ending at it loads the part left out",
        "vllm-offloading",
        None,
    ),
    "vllm-dllm-whole-canvas": (
        "Diffusion LLMs: a token budget shared by the running requests cuts a request's canvas, "
        "which the runner expects cut only at max_model_len",
        "vllm",
        None,
    ),
    "vllm-dllm-model-len": (
        "Diffusion LLMs under async scheduling: near max_model_len a canvas is cut early, the "
        "cap counting a canvas in flight that its denoise step rolls back",
        "vllm",
        None,
    ),
    "vllm-offloading-restore-events": (
        "KV offloading connector with self-describing KV cache events: a CPU chunk evicted and "
        "stored again before the eviction's events are translated loses its payload, and its "
        "store is announced without its blocks",
        "vllm-offloading",
        None,
    ),
    "vllm-pause-keep-loaded-holder": (
        'Pausing generation in mode "keep" with the KV offloading connector: the caches\' '
        "reset raises while a waiting request holds the blocks a CPU-tier load wrote into",
        "vllm-pause",
        None,
    ),
    "vllm-session-stall": (
        "Streaming-input sessions: resumed sessions holding the KV pool, each with its input "
        "and no room for it, wait for each other for good while no request runs",
        "vllm-session",
        "PR #49439 (open; it too reclaims a waiting session's KV, in victim order, and reports "
        "it to the workers as a preemption)",
    ),
    "vllm-session-length": (
        "Streaming-input sessions: each input is checked against max_model_len on its own, "
        "and a session is resumed with a prompt that leaves no room for an output",
        "vllm-session-length",
        "issue #42489 (closed as stale) and PR #42502 (open; the same edit)",
    ),
    "vllm-pause-session-between-turns": (
        "Pausing generation (any mode) with a streaming-input session between turns: the "
        "caches' reset raises, the session holding the KV of its kept tokens",
        "vllm-pause",
        None,
    ),
    "vllm-session-mamba-state": (
        "Streaming-input sessions on a hybrid (Mamba) model under async scheduling: a turn's "
        "dropped step in flight has already advanced the session's Mamba state, which the "
        "next turn resumes from",
        "vllm-session-state",
        None,
    ),
    "vllm-session-grammar": (
        "Streaming-input sessions with structured output: a later input's grammar is dropped "
        "(StreamingUpdate does not carry it) and the session keeps its first input's, done "
        "after the first turn, so the later turn samples unconstrained",
        "vllm-session-grammar",
        "PR #57685 (open; the same edit)",
    ),
    "vllm-offloading-error-store": (
        "The KV offloading connector beside streaming-input sessions with structured output, "
        "once each input has its own grammar: a session whose next input's grammar fails ends "
        "with an error before the input is computed, and the connector stores the input's "
        "unwritten block under its keys",
        "vllm-offloading",
        None,
    ),
    "vllm-load-reservation": (
        "KV connector with scheduler_reserve_full_isl off: an asynchronous load is admitted "
        "without room for its own next step; once loaded it heads the requests holding KV with "
        "no block to run, and those behind it wait for good",
        "vllm-load-reservation",
        None,
    ),
    "vllm-guided-drafts": (
        "vLLM 0.34.0, structured output with speculative decoding under async scheduling: a "
        "guided request with nothing in flight is verified under bitmask rows made from its "
        "placeholder drafts, and samples a token its grammar forbids",
        "vllm-guided-drafts",
        None,
    ),
    "vllm-cadence-empty-hold": (
        "The local prefill cadence (prefill_schedule_interval > 1): a held step whose only "
        "decode preempts itself schedules nothing while a request in its prefill stays running",
        "vllm-cadence",
        None,
    ),
    "vllm-cache-probe": (
        "vLLM 0.34.0, cache-aware admission (cache_aware_admission_window): a prompt-scoring "
        "request is ranked by cached tokens past its first scored row, which it may not read, "
        "and moved ahead of an earlier request",
        "vllm-cache-probe",
        None,
    ),
    "vllm-window-whole-hit": (
        "KV connector on a hybrid cache (sliding window, a connector with SupportsHMA): a "
        "whole-request asynchronous load recomputes its last token, whose window reads a block "
        "the allocation made null",
        "vllm-window-hit",
        None,
    ),
    "vllm-window-cap": (
        "Hybrid cache: a sliding window's admission cap counts null table slots as held "
        "blocks, a loaded request's reservation falls short of its next step, and the requests "
        "holding KV deadlock",
        "vllm-window-cap",
        None,
    ),
    "vllm-window-sync-load": (
        "KV connector on a hybrid cache: a synchronous load that fails can be reported only in "
        "failed_recving, which is read for asynchronous loads alone; the request finishes on "
        "KV nothing wrote and its blocks are hit by others",
        "vllm-hybrid-sync-load",
        None,
    ),
    "vllm-encoder-victim": (
        "Multimodal inputs under the priority policy: a request preempted in the step that "
        "scheduled it leaves its never-computed encoder inputs booked in the encoder cache, and "
        "a later read of the item is an encoder cache miss",
        "vllm-encoder-victim",
        None,
    ),
    "vllm-mm-threshold": (
        "Multimodal inputs with chunked mm input disabled: a long-prefill threshold shorter "
        "than an item stops the request at the item for good while another request is "
        "eligible, and the engine hangs",
        "vllm-mm-threshold",
        None,
    ),
    "vllm-mm-item-split": (
        "Multimodal inputs with chunked mm input disabled: a chunk that starts inside an item, "
        "after a prefix-cache hit that ends there, is scheduled in part and splits the item",
        "vllm-mm-upstream",
        None,
    ),
    "vllm-mm-prompt-split": (
        "Multimodal inputs with chunked prefill off: encoder cache pressure cuts a prompt that "
        "must be prefilled whole, and part of it is scheduled",
        "vllm-mm-upstream",
        None,
    ),
    "vllm-encoder-rollback": (
        "Multimodal inputs beside a KV connector: a request truncated by a failed KV load keeps "
        "its encoder cache reference to an item past its new frontier, finds no room for an "
        "earlier item it needs first, and waits for itself for good",
        "vllm-encoder-rollback",
        None,
    ),
    "vllm-encoder-load-order": (
        "CPU encoder-cache offload (ECCPUConnector): the save of an item a request encodes "
        "evicts the CPU entry of an item the same request loads in that step; no load is sent, "
        "the runner misses the item, and a save that never lands holds its blocks for good",
        "vllm-encoder-load-order",
        None,
    ),
    "vllm-encoder-victim-save": (
        "CPU encoder-cache offload (ECCPUConnector) under the priority policy: a request "
        "preempted in the step that booked its encoder inputs leaves their saves queued; "
        "nothing computes them, the saves never land, and the connector keeps the engine "
        "stepping for good",
        "vllm-encoder-connector",
        None,
    ),
}
#: Every fix a report may name, with its summary: the autoregressive loop's and the diffusion
#: path's.
SUMMARIES = {
    **{name: fix.summary for name, fix in FIXES.items()},
    **{fix.name: fix.summary for fix in VLLM_DLLM_FIXES.fixes},
}

#: SGLang's fixes (`integrations.sglang.fixes`), with their summaries.
SGLANG_SUMMARIES = {fix.name: fix.summary for fix in SGLANG_FIXES.fixes}

#: `LoopOptions` fields and the `scripts/vllm_shrink.py` flag that sets each (a bool: the flag
#: alone; kv_sync_loads, kv_load_failures and reserve_full_isl: their flags when False;
#: kv_report_mode: its flag when "full").
FLAGS = {
    "pipeline_parallel_size": "--pipeline-parallel",
    "speculative_tokens": "--speculative-tokens",
    "speculative_method": "--speculative-method",
    "structured_output": "--structured-output",
    "keyed_drafts": "--keyed-drafts",
    "late_grammars": "--late-grammars",
    "reasoning": "--reasoning",
    "kv_connector": "--kv-connector",
    "kv_sync_loads": "--kv-async-loads-only",
    "kv_load_failures": "--kv-no-failed-loads",
    "kv_pending_lookups": "--kv-pending-lookups",
    "kv_role": "--kv-role",
    "kv_store": "--kv-store",
    "kv_store_blocks": "--kv-store-blocks",
    "offload_chunks": "--offload-chunks",
    "offload_outputs": "--offload-outputs",
    "offload_sync_loads": "--offload-sync-loads",
    "offload_blocks_per_chunk": "--offload-blocks-per-chunk",
    "offload_self_describing_events": "--offload-self-describing-events",
    "cache_resets": "--cache-resets",
    "sliding_window": "--sliding-window",
    "retention_interval": "--retention-interval",
    "window_block_scale": "--window-block-scale",
    "mamba": "--mamba",
    "mamba_block_scale": "--mamba-block-scale",
    "mamba_checkpoint_alignment": "--mamba-checkpoint-alignment",
    "full_block_scale": "--full-block-scale",
    "kv_events": "--kv-events",
    "kv_report_mode": "--kv-report-full",
    "loras": "--loras",
    "max_loras": "--max-loras",
    "pauses": "--pauses",
    "watermark": "--watermark",
    "max_active_seqs": "--max-active-seqs",
    "prefill_interval": "--prefill-interval",
    "adaptive_threshold": "--adaptive-threshold",
    "reserve_full_isl": "--no-reserve-full-isl",
    "max_inflight_kv_loads": "--max-inflight-kv-loads",
    "cache_aware_window": "--cache-aware-window",
    "cache_aware_threshold": "--cache-aware-threshold",
    "cache_read_limits": "--cache-read-limits",
}
#: Each `LoopOptions` field's default (a record's option at its default needs no flag).
DEFAULTS: dict[str, object] = {
    f.name: f.default for f in fields(LoopOptions) if f.default is not MISSING
}


def shrink_arguments(record: dict[str, Any]) -> list[str]:
    """The `scripts/vllm_shrink.py` arguments that shrink `record`'s program again (for a
    diffusion record, `dllm_shrink_arguments`'s)."""
    if record.get("path") == "diffusion":
        return dllm_shrink_arguments(record)
    args = ["--seed", str(record["seed"]), "--loop", record["loop"]]
    if record["programs_from"] != "random":
        args += ["--programs-from", record["programs_from"]]
    for name, value in record["options"].items():
        if value == DEFAULTS[name]:
            continue
        if name == "encoder":  # the multimodal options, recorded as their fields
            args += encoder_flags(value)
            continue
        flag = FLAGS[name]
        shown = "dense" if name == "retention_interval" and value is None else str(value)
        # a bool, and the one report mode besides the default ("full"), are the flag alone
        alone = isinstance(value, bool) or name == "kv_report_mode"
        args += [flag] if alone else [flag, shown]
    for fix in (record["fix"] or "").split(" + "):
        if fix:
            args += ["--fix", fix]
    for fix in record["lifted_by"].split(" + "):
        args += ["--lifted-by", fix]
    return args


def encoder_flags(encoder: dict[str, Any]) -> list[str]:
    """The flags of `scripts/vllm_shrink.py` that set the multimodal options recorded as
    `encoder` (`EncoderOptions`' fields), each only where it is not the default."""
    args = ["--mm-items", str(encoder["items"])]
    if encoder["item_tokens"] != EncoderOptions().item_tokens:
        args += ["--mm-tokens", str(encoder["item_tokens"])]
    for field, flag in (
        ("budget", "--encoder-budget"),
        ("cache", "--encoder-cache"),
        ("offload_blocks", "--encoder-offload"),
    ):
        if encoder.get(field) is not None:
            args += [flag, str(encoder[field])]
    return args + ([] if encoder["chunked"] else ["--no-chunked-mm-input"])


def dllm_shrink_arguments(record: dict[str, Any]) -> list[str]:
    """The `scripts/vllm_dllm_shrink.py` arguments that shrink a diffusion record's program
    again."""
    args = ["--seed", str(record["seed"]), "--loop", record["loop"]]
    if record["pipeline_parallel_size"] != 1:
        args += ["--pipeline-parallel", str(record["pipeline_parallel_size"])]
    args += space_flags(record["space"])
    args += fix_flags([fix for fix in (record["fix"] or "").split(" + ") if fix])
    for fix in record["lifted_by"].split(" + "):
        args += ["--lifted-by", fix]
    return args


def _how(record: dict[str, Any]) -> tuple[str, str, str, str]:
    """What a report says of its record's kind: the scheduler run, how the program was shrunk,
    the shrink script, and what the program's source names."""
    diffusion = record.get("path") == "diffusion"
    if diffusion:
        loop = (
            "synchronous `DiffusionScheduler`"
            if record["loop"] == "sync"
            else ("asynchronous `DiffusionAsyncScheduler`")
        )
        run = (
            f"- vLLM {record['release']}, its {loop} "
            "(`vllm/v1/core/sched/diffusion_scheduler.py` over `scheduler.py`), driven by the "
            "engine-core loop over a fabricated denoising model."
        )
        draws = "; the fabricated runner draws nothing, so it runs as printed."
        names = (
            "`DllmProgram`, `DllmServing` and `DllmRequest` from `integrations.vllm.diffusion`, "
            "run by `run_dllm`"
        )
        return run, draws, "scripts/vllm_dllm_shrink.py", names
    loop = (
        "synchronous engine-core loop (`EngineCore.step`)"
        if record["loop"] == "sync"
        else "asynchronous engine-core loop (`EngineCore.step_with_batch_queue`)"
    )
    run = (
        f"- vLLM {record['release']}, `vllm/v1/core/sched/scheduler.py`, driven by its {loop} "
        "over a fabricated model."
    )
    if record["options"].get("offload_chunks"):
        run = run.removesuffix(".") + (
            ", serving vLLM's own `OffloadingConnector` (its scheduler side, "
            "`distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`, and CPU "
            f"manager over {record['options']['offload_chunks']} chunks; the worker fabricated)."
        )
    window = record["options"].get("sliding_window")
    if window:
        per = record["options"].get("offload_blocks_per_chunk", 1)
        chunks = f", CPU chunks of {per} blocks" if per > 1 else ""
        scale = record["options"].get("window_block_scale", 1)
        blocks = f" in blocks {scale} times the full-attention group's" if scale > 1 else ""
        full = record["options"].get("full_block_scale", 1)
        blocks += (
            f", the full-attention group's blocks {full} times the window's" if full > 1 else ""
        )
        run = run.removesuffix(".") + (
            f", over a hybrid KV cache: a full-attention group and a sliding-window group of "
            f"{window} tokens{blocks} sharing one pool{chunks}."
        )
    encoder = record["options"].get("encoder")
    if encoder:
        chunked = "" if encoder["chunked"] else ", chunked mm input disabled"
        run = run.removesuffix(".") + (
            f", every prompt carrying up to {encoder['items']} multimodal items of "
            f"{counted(encoder['item_tokens'], 'placeholder token')} (`MultiModalFeatureSpec`s, "
            f"named by their tokens){chunked}; the encoder budget and cache as vLLM's "
            "`compute_mm_encoder_budget` sizes them, the model runner's encoder cache rebuilt "
            "from the scheduler outputs."
        )
        if encoder.get("offload_blocks") is not None:
            run = run.removesuffix(".") + (
                f", vLLM's `ECCPUConnector` (role `ec_both`) offloading it to a CPU region of "
                f"{encoder['offload_blocks']} embeddings, its saves and loads done by the worker "
                "as `SchedulerOutput.ec_connector_metadata` says."
            )
    pauses = record["options"].get("pauses")
    if pauses:
        run = run.removesuffix(".") + (
            f", generation paused in mode {pauses!r} before one engine step in 16 and the "
            "caches cleared before it resumes, as `EngineCore.pause_scheduler` and "
            "`_finish_pause` do."
        )
    draws = f", its draws (the connector's store, the drafts) seeded by {record['draw_seed']}."
    names = (
        "`CoreProgram` from `integrations.vllm.engine_core`, `ArConfig`, `ArRequest` and "
        "`Policy` from `spec.ar.config`"
    )
    if "SessionInput(" in record["program"]:
        names += ", `SessionInput` from `integrations.vllm.sessions`"
    return run, draws, "scripts/vllm_shrink.py", names


#: The shrunk programs that pass on vLLM 0.34.0 as released, and why. Every other one breaks
#: its rule on 0.34.0 too, and its fix (as written for 0.34.0 where that differs) lifts it:
#: `SCHEDSPEC_VLLM_VERSION=0.34.0 .venv/bin/python -m pytest
#: tests/test_real_vllm_shrunk_programs.py` checks both (its `GONE` names these).
GONE_IN_0_34 = {
    "vllm-offloading-restore-events": "the connector's event tracker was rebuilt; the "
    "program passes there as released, and the fix has no place to go",
    "vllm-mm-item-split": "fixed there: 0.34.0 schedules nothing until the rest of an item "
    "a chunk starts inside fits, and the program passes as released (the fix is 0.34.0's change, "
    "backported)",
    "vllm-mm-prompt-split": "fixed there: 0.34.0 requeues a request whose prompt encoder "
    "pressure would split with chunked prefill off, and the program passes as released (the "
    "fix is 0.34.0's change, backported)",
    "vllm-offloading-error-store": "fixed there: 0.34.0's connector stores at most what a "
    "finished request computed, and the program passes as released",
}


#: The shrunk programs recorded on vLLM 0.34.0 (their record's "release"), which pass on
#: 0.33.0 as released, and why; `tests/test_real_vllm_shrunk_programs.py` checks that too.
ONLY_IN_0_34 = {
    "vllm-guided-drafts": "the program passes as released: its scheduler sent "
    "`num_acceptable_drafts` and its model runner invalidated every draft verified under a row "
    "that allows every token (`grammar_invalid_drafts`); 0.34.0 removed both",
    "vllm-cache-probe": "no such program runs there: cache-aware admission "
    "(`cache_aware_admission_window`) and prompt scoring from a row on (`prompt_logprob_start`) "
    "are new in 0.34.0",
}


def _on_the_other_release(stem: str, record: dict[str, Any]) -> str:
    """The report's line on the release its program was not recorded on."""
    if record["release"] == "0.34.0":
        return f"- vLLM 0.33.0: {ONLY_IN_0_34[stem]}."
    if stem in GONE_IN_0_34:
        return f"- vLLM 0.34.0: {GONE_IN_0_34[stem]}."
    return (
        "- vLLM 0.34.0: the same program breaks the same rule, and the fix lifts it "
        "(`SCHEDSPEC_VLLM_VERSION=0.34.0` prints the fix as written for that release)."
    )


def _report(number: int, stem: str, record: dict[str, Any]) -> list[str]:
    title, target, known = TITLES[stem]
    lifted = record["lifted_by"].split(" + ")
    before, after = record["size_before"], record["size_after"]
    run, draws, script, names = _how(record)
    selects = (
        "" if record["release"] == "0.33.0" else f"SCHEDSPEC_VLLM_VERSION={record['release']} "
    )
    lines = [f"## {number}. {title}", ""]
    if known:
        what = f"issue {known}" if known.startswith("#") else known
        lines += [f"Known upstream as vLLM {what}: this is a smaller reproduction.", ""]
    for fix in lifted:
        lines += [f"The candidate fix, `{fix}`: {SUMMARIES[fix]}.", ""]
    lines += [
        run,
        f"- Broken: `{record['rule']}`: {record['shrunk']}",
        f"- Shrunk from program {record['seed']} ({counted(before['requests'], 'request')}, "
        f"{counted(before['aborts'], 'abort')}) to {counted(after['requests'], 'request')} and "
        f"{counted(after['aborts'], 'abort')}, {after['tokens']} prompt and output tokens{draws}",
        _on_the_other_release(stem, record),
        "",
        "Reproduce (schedspec), and print the fix as a patch of vLLM's files:",
        "",
        "```text",
        f"{selects}.venv/bin/python {script} " + " ".join(shrink_arguments(record)),
        f"{selects}.venv/bin/python scripts/engine_fixes_diff.py {target}"
        + "".join(f" --fix {fix}" for fix in lifted),
        "```",
        "",
        f"The program (Python: {names}):",
        "",
        "```text",
        record["program"],
        "```",
        "",
    ]
    if record.get("trace"):
        lines += ["Its run, up to the violation:", "", "```text", *record["trace"], "```", ""]
    return lines


#: Where SGLang's records come from, and what their programs name.
_SGLANG_SCRIPT = "scripts/sglang_findings.py"
_SGLANG_NAMES = (
    "`DllmConfig`, `Mode` and `RequestSpec` from `spec.config`; `Submit`, `Round` and `Drain` "
    "from `properties.operations`, run by `properties.example.DllmExample`"
)


def _sglang_causes(records: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Per SGLang record key, the other keys whose cause starts alike (one root cause)."""
    first = {r["key"]: r["cause"].split(". ")[0] for r in records}
    return {
        key: [other for other, said in first.items() if other != key and said == cause]
        for key, cause in first.items()
    }


def _sglang_report(
    number: int, record: dict[str, Any], numbers: dict[str, int], shared: list[str]
) -> list[str]:
    """One SGLang finding's report (`scripts/sglang_findings.py --record`)."""
    lines = [f"## {number}. SGLang {record['sglang']}, dLLM path: {record['title']}", ""]
    if shared:
        others = " and ".join(str(numbers[key]) for key in shared)
        lines += [f"The same cause as report{'s' if len(shared) > 1 else ''} {others}.", ""]
    lines += [f"The cause: {record['cause']}", ""]
    for fixes in record["lifted_by"]:
        applied = " and ".join(f"`{fix}` ({SGLANG_SUMMARIES[fix]})" for fix in fixes)
        lines += [
            f"It passes with the candidate fix{'es' if len(fixes) > 1 else ''} {applied}.",
            "",
        ]
    message = record["message"].splitlines()
    lines += [
        f"- SGLang {record['sglang']}, its dLLM scheduler path (`Scheduler` with "
        "`SchedulerDllmMixin`, `PrefillAdder`, its request and token pools), driven through "
        f"schedspec's `{record['implementation']}` adapter over a scripted denoising step, on "
        "CPU.",
        f"- Broken: `{record['rule']}`: {message[0]}",
        f"- The test that shows its cause: `{record['test']}`.",
        "",
        "Reproduce (schedspec), and print the fix as a patch of SGLang's files:",
        "",
        "```text",
        f".venv/bin/python {_SGLANG_SCRIPT} --finding {record['key']}",
        *(
            ".venv/bin/python scripts/engine_fixes_diff.py sglang"
            + "".join(f" --fix {fix}" for fix in fixes)
            for fixes in record["lifted_by"]
        ),
        "```",
        "",
        f"The program (Python: {_SGLANG_NAMES}):",
        "",
        "```text",
        record["program"],
        "```",
        "",
        "What the adapter did on SGLang's scheduler, in SGLang's own calls, up to the violation:",
        "",
        "```text",
        *record["transcript"],
        f"violation: [{record['rule']}] " + "\n".join(message),
        "```",
        "",
    ]
    return lines


# ---------------------------------------------------------------------------- the records' shape
class BadRecord(Exception):
    """A record of docs/shrunk/ no report can be written from; the message, one line, names the
    file, what is wrong in it and what is expected."""


#: What writes each kind of record: a record is expected as its script writes it.
_AR_WRITER = "scripts/vllm_shrink.py --json --trace"
_DLLM_WRITER = "scripts/vllm_dllm_shrink.py --json --trace"
_SGLANG_WRITER = "scripts/sglang_findings.py --record"


def _shown(path: Path) -> str:
    """`path` as a message names it: under the checkout, from its root."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def _kind(value: object) -> str:
    """What a JSON value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _said(value: object) -> str:
    """A wrong value as a message shows it: what it is, and itself when short."""
    if value is None:
        return "null"
    shown = json.dumps(value)
    return f"{_kind(value)} ({shown})" if len(shown) <= 40 else _kind(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_text(value: object) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _is_lines(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(line, str) for line in value)


def _is_size(value: object) -> bool:
    return isinstance(value, dict) and all(
        _is_int(value.get(k)) for k in ("requests", "aborts", "tokens")
    )


#: (field, check, what is expected): the fields of every vLLM record, then of an AR one (the
#: engine-core loop's), of a diffusion one and of an SGLang one.
_Field = tuple[str, Any, str]
#: The program spaces of the diffusion path (`scripts/vllm_dllm_shrink.py`'s flags).
_SPACE = [keyword for _, keyword, _ in SPACE_FLAGS]
_VLLM_FIELDS: tuple[_Field, ...] = (
    ("release", _is_text, 'the vLLM release it ran, a non-empty string such as "0.33.0"'),
    ("seed", _is_int, "the seed of the program shrunk, an integer"),
    ("loop", lambda v: v in ("sync", "async"), '"sync" or "async"'),
    ("rule", _is_text, "the rule the program breaks, a non-empty string"),
    ("shrunk", _is_text, "the smaller program's violation, a non-empty string"),
    ("program", _is_text, "the smaller program's source, a non-empty string"),
    ("lifted_by", _is_text, 'the fixes that lift it, a non-empty string of names joined by " + "'),
    ("fix", lambda v: v is None or _is_text(v), 'null or the fixes made, joined by " + "'),
    ("size_before", _is_size, 'an object of integers "requests", "aborts" and "tokens"'),
    ("size_after", _is_size, 'an object of integers "requests", "aborts" and "tokens"'),
)
_AR_FIELDS: tuple[_Field, ...] = (
    ("programs_from", lambda v: v in GENERATORS, f"one of {', '.join(sorted(GENERATORS))}"),
    ("options", lambda v: isinstance(v, dict), "an object of `LoopOptions` fields"),
    ("draw_seed", _is_int, "the draws' seed, an integer"),
)
_DLLM_FIELDS: tuple[_Field, ...] = (
    (
        "space",
        lambda v: (
            isinstance(v, dict) and all(k in _SPACE and isinstance(b, bool) for k, b in v.items())
        ),
        f"an object of booleans, of the keys {', '.join(_SPACE)}",
    ),
    (
        "pipeline_parallel_size",
        lambda v: _is_int(v) and v >= 1,
        "the pipeline stages, an integer >= 1",
    ),
)
_SGLANG_FIELDS: tuple[_Field, ...] = (
    ("key", _is_text, "the finding's key, a non-empty string"),
    ("order", _is_int, "the finding's place among them, an integer"),
    ("title", _is_text, "a non-empty string"),
    ("cause", _is_text, "a non-empty string"),
    ("sglang", _is_text, 'the SGLang release it ran, a non-empty string such as "0.5.23"'),
    ("implementation", _is_text, "the built-in it ran through, a non-empty string"),
    ("program", _is_text, "the program's source, a non-empty string"),
    ("transcript", _is_lines, "SGLang's calls, a list of strings"),
    ("rule", lambda v: v is None or isinstance(v, str), "the rule broken, a string"),
    ("message", lambda v: v is None or isinstance(v, str), "the violation's message, a string"),
    (
        "lifted_by",
        lambda v: isinstance(v, list) and all(_is_lines(fixes) and fixes for fixes in v),
        "the fix sets that lift it, a list of lists of fix names",
    ),
    ("test", _is_text, "the test that shows its cause, a non-empty string"),
)


def _read(path: Path, writer: str) -> dict[str, Any]:
    """The JSON object in `path`; `BadRecord` if it cannot be read or is not one."""
    expected = f"expected a JSON object, a record as {writer} writes it (rerun it, or restore "
    expected += "the file)"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise BadRecord(f"{_shown(path)}: cannot be read ({why}); {expected}") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        where = f"{err.msg.removesuffix(' at')} at line {err.lineno}, column {err.colno}"
        raise BadRecord(f"{_shown(path)}: not valid JSON ({where}); {expected}") from None
    if not isinstance(record, dict):
        raise BadRecord(f"{_shown(path)}: {_kind(record)}, not an object; {expected}")
    return record


def _check_fields(
    path: Path, record: dict[str, Any], wanted: Sequence[_Field], writer: str
) -> None:
    """`BadRecord` naming the fields of `wanted` that `record` lacks, else the first whose
    value fails its check."""
    missing = [name for name, _, _ in wanted if name not in record]
    if missing:
        names = ", ".join(f'"{name}"' for name in missing)
        raise BadRecord(
            f"{_shown(path)}: no {names} field{'s' if len(missing) > 1 else ''}; expected a "
            f"record as {writer} writes it, with every field (rerun it, or restore the file)"
        )
    for name, check, expected in wanted:
        if not check(record[name]):
            raise BadRecord(
                f'{_shown(path)}: "{name}" is {_said(record[name])}; expected {expected} (a '
                f"record as {writer} writes it)"
            )


def _check_names(path: Path, field: str, names: Sequence[str], known: Sequence[str]) -> None:
    """`BadRecord` for the first of `names` (from `field`) that is not one of `known`."""
    for name in names:
        if name not in known:
            raise BadRecord(
                f'{_shown(path)}: "{field}" names {name!r}, no fix of this checkout; expected '
                f"fixes among {', '.join(known)}"
            )


def vllm_record(path: Path) -> dict[str, Any]:
    """The record in `path` (docs/shrunk/vllm-*.json) with every field a report reads, of the
    kind a report reads; `BadRecord` naming the file, what is wrong and what is expected."""
    diffusion = False
    record = _read(path, _AR_WRITER)
    if "path" in record:
        if record["path"] != "diffusion":
            raise BadRecord(
                f'{_shown(path)}: "path" is {_said(record["path"])}; expected "diffusion" (a '
                f'record as {_DLLM_WRITER} writes it), or no "path" ({_AR_WRITER})'
            )
        diffusion = True
    writer = _DLLM_WRITER if diffusion else _AR_WRITER
    _check_fields(path, record, _VLLM_FIELDS + (_DLLM_FIELDS if diffusion else _AR_FIELDS), writer)
    trace = record.get("trace")
    if trace is not None and not _is_lines(trace):
        raise BadRecord(
            f'{_shown(path)}: "trace" is {_said(trace)}; expected null or its run, a list of '
            f"strings (a record as {writer} writes it)"
        )
    known = [fix.name for fix in VLLM_DLLM_FIXES.fixes] if diffusion else sorted(FIXES)
    _check_names(path, "lifted_by", record["lifted_by"].split(" + "), known)
    _check_names(path, "fix", [f for f in (record["fix"] or "").split(" + ") if f], known)
    if record["release"] == "0.34.0" and path.stem not in ONLY_IN_0_34:
        raise BadRecord(
            f'{_shown(path)}: recorded on vLLM 0.34.0 (its "release"), but ONLY_IN_0_34 in '
            f"{PROG} does not say how 0.33.0 fares with {path.stem}; expected it named there, "
            'or a record of "release" "0.33.0"'
        )
    if not diffusion:
        _check_options(path, record["options"])
    return record


def _check_options(path: Path, options: dict[str, Any]) -> None:
    """`BadRecord` for an option of an AR record that no `LoopOptions` field or no flag of
    `scripts/vllm_shrink.py` stands for, or multimodal options of the wrong shape."""
    for name, value in options.items():
        if name not in DEFAULTS:
            raise BadRecord(
                f'{_shown(path)}: "options" holds {name!r}, no `LoopOptions` field; expected '
                f"fields among {', '.join(sorted(DEFAULTS))}"
            )
        if value == DEFAULTS[name]:
            continue
        if name == "encoder":
            fine = isinstance(value, dict) and all(
                _is_int(value.get(k)) for k in ("items", "item_tokens")
            )
            if not fine or not isinstance(value.get("chunked"), bool):
                raise BadRecord(
                    f'{_shown(path)}: "options" "encoder" is {_said(value)}; expected null or '
                    'an object with integers "items" and "item_tokens" and a boolean "chunked" '
                    "(`EncoderOptions`' fields)"
                )
        elif name not in FLAGS:
            raise BadRecord(
                f'{_shown(path)}: "options" sets {name!r} to {_said(value)}, which no flag of '
                f"scripts/vllm_shrink.py sets; expected it at its default, {DEFAULTS[name]!r}"
            )


def sglang_record(path: Path) -> dict[str, Any]:
    """The record in `path` (docs/shrunk/sglang-*.json) with every field a report reads;
    `BadRecord` naming the file, what is wrong and what is expected."""
    record = _read(path, _SGLANG_WRITER)
    _check_fields(path, record, _SGLANG_FIELDS, _SGLANG_WRITER)
    for fixes in record["lifted_by"]:
        _check_names(path, "lifted_by", fixes, sorted(SGLANG_SUMMARIES))
    return record


def _written(path: Path, writer: str, write: Any, *args: Any) -> list[str]:
    """`write(*args)`, a report's lines; a field of a shape the checks above let through (an
    option of the wrong kind) is `BadRecord` naming the file, not a traceback."""
    try:
        lines: list[str] = write(*args)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise BadRecord(
            f"{_shown(path)}: a field of the wrong kind ({type(err).__name__}: {err}); expected "
            f"a record as {writer} writes it"
        ) from None
    return lines


def render() -> str:
    """docs/upstream-reports.md as it should be; `KeyError` naming a shrunk program that has
    no title, or an SGLang record that reproduces nothing; `BadRecord` naming a record that
    is not one its script writes."""
    paths = {path.stem: path for path in sorted(SHRUNK.glob("vllm-*.json"))}
    records = {stem: vllm_record(path) for stem, path in paths.items()}
    sglang_paths = {path: sglang_record(path) for path in sorted(SHRUNK.glob("sglang-*.json"))}
    sglang = sorted(sglang_paths.values(), key=lambda r: int(r["order"]))
    for field in ("key", "order"):  # two records of one finding would give one report twice
        seen: dict[object, Path] = {}
        for path, r in sglang_paths.items():
            if r[field] in seen:
                raise BadRecord(
                    f"{_shown(path)}: its {field} {r[field]!r} is also {_shown(seen[r[field]])}'s; "
                    "expected one record per SGLang finding (remove the stray one, or rerun "
                    "scripts/sglang_findings.py --record)"
                )
            seen[r[field]] = path
    where = {r["key"]: path for path, r in sglang_paths.items()}
    empty = sorted(r["key"] for r in sglang if r.get("rule") is None or not r.get("message"))
    if empty:
        raise KeyError(
            f"the SGLang records {empty} reproduce nothing: run scripts/sglang_findings.py "
            "--record on an SGLang where they do"
        )
    missing = sorted(set(records) - set(TITLES))
    if missing:
        raise KeyError(f"no title for the shrunk programs {missing}")
    lines = [
        "# Reports for upstream",
        "",
        "One report per finding in vLLM's scheduler (and its own KV offloading "
        "connector) that breaks a rule, found in 0.33.0 (each report says how 0.34.0 fares) "
        "or, where a report says so, in 0.34.0, on its autoregressive engine-core paths and its "
        "diffusion path, each with the smallest "
        "program that reproduces it (docs/shrunk/, `scripts/vllm_shrink.py` and "
        "`scripts/vllm_dllm_shrink.py`), ready to file. Not filed "
        "from here: this machine reaches only package registries. Written by "
        "`scripts/upstream_reports.py` from docs/shrunk/; `tests/test_upstream_reports.py` "
        "keeps this file in step with them, and `tests/test_real_vllm_shrunk_programs.py` "
        "keeps every program breaking its rule until its fix is made. Block ids in a message "
        "or a run can differ between processes (Python's string hashing orders some of vLLM's "
        "sets); the rule and the loop do not. The findings, their validation and their cost: "
        "[engines.md](engines.md).",
        "",
        "After them, one report per open finding in SGLang 0.5.23's dLLM scheduler path, each "
        "with the program that reproduces it (a test of tests/test_real_sglang.py, shrunk by "
        "hand or by Hypothesis) and what the adapter did on SGLang's scheduler in SGLang's own "
        "calls: written from docs/shrunk/sglang-*.json, which `scripts/sglang_findings.py "
        "--record` writes and `tests/test_sglang_findings.py` keeps in step with the installed "
        "SGLang (every program breaking its rule as released and passing with its fixes).",
        "",
    ]
    number = 0
    for number, stem in enumerate((s for s in TITLES if s in records), start=1):
        writer = _DLLM_WRITER if records[stem].get("path") == "diffusion" else _AR_WRITER
        lines += _written(paths[stem], writer, _report, number, stem, records[stem])
    if sglang:
        numbers = {r["key"]: number + i for i, r in enumerate(sglang, start=1)}
        causes = _sglang_causes(sglang)
        for r in sglang:
            lines += _written(
                where[r["key"]],
                _SGLANG_WRITER,
                _sglang_report,
                numbers[r["key"]],
                r,
                numbers,
                causes[r["key"]],
            )
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write docs/upstream-reports.md, or with `--check` compare it; 2 with one line on stderr
    for a usage error, a shrunk program without a title or a record that is not one."""
    parser = Parser(prog=PROG)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the file is stale; write nothing"
    )
    try:
        args = parser.parse_args(argv)
    except UsageError as err:  # `scripts/upstream_reports.py: error: ...`, as the errors below
        return _error(str(err).removeprefix(f"{PROG}: error: "))
    try:
        text = render()
    except KeyError as err:
        return _error(str(err.args[0]))
    except BadRecord as err:
        return _error(str(err))
    shown = REPORTS.relative_to(ROOT) if REPORTS.is_relative_to(ROOT) else REPORTS
    try:
        if args.check:
            current = REPORTS.read_text() if REPORTS.exists() else ""
            if current != text:
                print(f"{shown} is stale: run {PROG}")
                return 1
            print(f"{shown} is up to date")
            return 0
        REPORTS.write_text(text)
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        return _error(f"{shown}: {why}")
    print(f"wrote {shown} ({text.count(chr(10) + '## ')} reports)")
    return 0


def _error(message: str) -> int:
    """Say `message` on stderr in one line, as `PROG: error: ...`; the exit status, 2."""
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
