"""Print candidate fixes for an engine's findings as one unified diff of the installed engine's
files: SGLang 0.5.23's dLLM path (`integrations.sglang.fixes`), Vidur 0.0.25's replica
schedulers (`integrations.vidur.fixes`), vLLM 0.33.0's diffusion schedulers
(`integrations.vllm.fixes`) or vLLM 0.33.0's prefix caching under priority scheduling
(`vllm-prefix`: `integrations.vllm.preempted_cache_fix`), vLLM 0.33.0's speculative decoding
(`vllm-spec`: `integrations.vllm.spec_pad_fix`), vLLM 0.33.0's KV connector path
(`vllm-kv`: `integrations.vllm.kv_load_fixes`; with `SCHEDSPEC_VLLM_VERSION=0.34.0`, as written
for 0.34.0), its draft margin with speculative decoding
(`vllm-draft-margin`: `integrations.vllm.draft_margin_fix`) or its own offloading connector
(`vllm-offloading`: `integrations.vllm.offload_hit_fix`, on hybrid KV caches
`integrations.vllm.offload_window_fixes`, with KV cache events
`integrations.vllm.offload_events_fix`, and beside sessions with structured output
`integrations.vllm.offload_error_store_fix`), its Mamba prefix caching
(`vllm-mamba`: `integrations.vllm.mamba_split_fix`) or its cache reset after a pause
(`vllm-pause`: `integrations.vllm.reset_holders_fix`), a whole-request connector hit on a
hybrid cache (`vllm-window-hit`: `integrations.vllm.window_hit_fix`) and a sliding window's
admission cap (`vllm-window-cap`: `integrations.vllm.window_cap_fix`), a failed synchronous
load on a hybrid cache (`vllm-hybrid-sync-load`: `integrations.vllm.hybrid_sync_load_fix`),
multimodal encoder inputs booked for a same-step priority victim (`vllm-encoder-victim`:
`integrations.vllm.encoder_victim_fix`) and a long-prefill cap below an item with chunked mm
input disabled (`vllm-mm-threshold`: `integrations.vllm.mm_threshold_fix`), encoder cache
references kept past a failed load's rollback (`vllm-encoder-rollback`:
`integrations.vllm.encoder_rollback_fix`), a load's CPU encoder-cache entry evicted by a save
of the same request (`vllm-encoder-load-order`: `integrations.vllm.encoder_load_order_fix`)
and saves queued for a same-step priority victim (`vllm-encoder-connector`:
`integrations.vllm.encoder_connector_fix`), 0.34.0's two multimodal changes backported to 0.33.0
(`vllm-mm-upstream`: `integrations.vllm.mm_upstream_fixes`), and vLLM 0.34.0's
cache-aware admission
(`vllm-cache-probe`: `integrations.vllm.cache_probe_fix`, with `SCHEDSPEC_VLLM_VERSION=0.34.0`).

    .venv/bin/python scripts/engine_fixes_diff.py sglang > sglang-dllm-fixes.patch
    .venv/bin/python scripts/engine_fixes_diff.py sglang --fix decode-fallback
    .venv/bin/python scripts/engine_fixes_diff.py vidur > vidur-fixes.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm --fix whole-canvas > whole-canvas.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-prefix > uncache-preempted.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-spec > pad-what-fits.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-kv > kv-load-fixes.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-draft-margin > cap-draft-margin.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-offloading > offloading-fixes.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-mamba > stop-mid-block-chunks.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-pause > reset-loaded-holders.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-cadence > lift-empty-hold.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-window-hit > hit-leaves-last-token.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-window-cap > cap-blocks-held.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-hybrid-sync-load > failed-sync-load.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-encoder-victim > unbook-victim.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-mm-threshold > whole-item.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-encoder-rollback > release-items.patch
    .venv/bin/python scripts/engine_fixes_diff.py vllm-mm-upstream > mm-upstream.patch
    SCHEDSPEC_VLLM_VERSION=0.34.0 .venv/bin/python scripts/engine_fixes_diff.py vllm-cache-probe
    .venv/bin/python scripts/engine_fixes_diff.py sglang --list
    .venv/bin/python scripts/engine_fixes_diff.py --list

Without `--fix`, the engine's default set (SGLang: the five that together let the dLLM suite
run with no pool headroom; Vidur: every fix but the alternative `ft-free-on-finish`, which
edits what FasterTransformer's finding's fix edits; vLLM: every finding's fix); `--fix NAME`
(repeatable) picks fixes by name, and `--list` lists them, one line each (`--list` with no
engine: every engine's, each under an `ENGINE:` heading). The diff is made from the
installed files when run; `git apply -p1` applies it in the engine's checkout of the same
version (SGLang: its `python/` directory). The tests that run these very edits are in
`tests/test_real_sglang.py`, `tests/test_real_vidur.py`, `tests/test_real_vllm_dllm.py` and
`tests/test_real_vllm_preempted_cache.py`, `tests/test_real_vllm_speculative.py`,
`tests/test_real_vllm_kv_connector.py`, `tests/test_real_vllm_draft_margin.py`,
`tests/test_real_vllm_offloading.py`, `tests/test_real_vllm_mamba_loop.py`,
`tests/test_real_vllm_pauses.py`, `tests/test_real_vllm_ar_settings.py`,
`tests/test_real_vllm_cache_aware.py`
(and `scripts/vllm_dllm_check.py` with its fix flags). Exit 2 with one line for an unknown
fix, for no engine without `--list`, if the engine is not installed, or if its files no longer
have the places the fixes edit.
Needs `schedspec install-engines sglang` (or `vidur`, `vllm`; `vllm-prefix`, `vllm-spec`,
`vllm-kv`, `vllm-draft-margin`, `vllm-offloading`, `vllm-mamba` and `vllm-pause` need
`vllm`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integrations.patches import FixSet, print_patch
from integrations.sglang.fixes import FIX_NAMES as SGLANG_DEFAULT
from integrations.sglang.fixes import SGLANG_FIXES
from integrations.vidur.fixes import DEFAULT_FIXES as VIDUR_DEFAULT
from integrations.vidur.fixes import VIDUR_FIXES
from integrations.vllm.cache_probe_fix import CACHE_PROBE_FIXES
from integrations.vllm.cadence_fix import CADENCE_FIXES
from integrations.vllm.draft_margin_fix import DRAFT_MARGIN_FIXES
from integrations.vllm.encoder_connector_fix import ENCODER_CONNECTOR_FIXES
from integrations.vllm.encoder_load_order_fix import ENCODER_LOAD_ORDER_FIXES
from integrations.vllm.encoder_rollback_fix import ENCODER_ROLLBACK_FIXES
from integrations.vllm.encoder_victim_fix import ENCODER_VICTIM_FIXES
from integrations.vllm.fixes import VLLM_DLLM_FIXES
from integrations.vllm.guided_drafts_fix import GUIDED_DRAFTS_FIXES
from integrations.vllm.hybrid_sync_load_fix import HYBRID_SYNC_LOAD_FIXES
from integrations.vllm.kv_load_fixes import KV_LOAD_FIXES
from integrations.vllm.load_reservation_fix import LOAD_RESERVATION_FIXES
from integrations.vllm.mamba_split_fix import MAMBA_SPLIT_FIXES
from integrations.vllm.mm_threshold_fix import MM_THRESHOLD_FIXES
from integrations.vllm.mm_upstream_fixes import MM_UPSTREAM_FIXES
from integrations.vllm.offload_window_fixes import OFFLOADING_FIXES
from integrations.vllm.preempted_cache_fix import PREEMPTED_CACHE_FIXES
from integrations.vllm.reset_holders_fix import RESET_HOLDERS_FIXES
from integrations.vllm.session_grammar_fix import SESSION_GRAMMAR_FIXES
from integrations.vllm.session_length_fix import SESSION_LENGTH_FIXES
from integrations.vllm.session_stall_fix import SESSION_STALL_FIXES
from integrations.vllm.session_state_fix import SESSION_STATE_FIXES
from integrations.vllm.spec_pad_fix import SPEC_PAD_FIXES
from integrations.vllm.window_cap_fix import WINDOW_CAP_FIXES
from integrations.vllm.window_hit_fix import WINDOW_HIT_FIXES
from schedspec_cli.args import Parser, run_script

#: engine -> (its fixes, the fixes printed without --fix)
ENGINES: dict[str, tuple[FixSet, tuple[str, ...]]] = {
    "sglang": (SGLANG_FIXES, SGLANG_DEFAULT),
    "vidur": (VIDUR_FIXES, VIDUR_DEFAULT),
    "vllm": (VLLM_DLLM_FIXES, VLLM_DLLM_FIXES.names),
    "vllm-prefix": (PREEMPTED_CACHE_FIXES, PREEMPTED_CACHE_FIXES.names),
    "vllm-spec": (SPEC_PAD_FIXES, SPEC_PAD_FIXES.names),
    "vllm-kv": (KV_LOAD_FIXES, KV_LOAD_FIXES.names),
    "vllm-draft-margin": (DRAFT_MARGIN_FIXES, DRAFT_MARGIN_FIXES.names),
    "vllm-offloading": (OFFLOADING_FIXES, OFFLOADING_FIXES.names),
    "vllm-mamba": (MAMBA_SPLIT_FIXES, MAMBA_SPLIT_FIXES.names),
    "vllm-pause": (RESET_HOLDERS_FIXES, RESET_HOLDERS_FIXES.names),
    "vllm-session": (SESSION_STALL_FIXES, SESSION_STALL_FIXES.names),
    "vllm-session-length": (SESSION_LENGTH_FIXES, SESSION_LENGTH_FIXES.names),
    "vllm-session-grammar": (SESSION_GRAMMAR_FIXES, SESSION_GRAMMAR_FIXES.names),
    "vllm-session-state": (SESSION_STATE_FIXES, SESSION_STATE_FIXES.names),
    "vllm-load-reservation": (LOAD_RESERVATION_FIXES, LOAD_RESERVATION_FIXES.names),
    "vllm-cadence": (CADENCE_FIXES, CADENCE_FIXES.names),
    "vllm-guided-drafts": (GUIDED_DRAFTS_FIXES, GUIDED_DRAFTS_FIXES.names),
    "vllm-cache-probe": (CACHE_PROBE_FIXES, CACHE_PROBE_FIXES.names),
    "vllm-window-hit": (WINDOW_HIT_FIXES, WINDOW_HIT_FIXES.names),
    "vllm-window-cap": (WINDOW_CAP_FIXES, WINDOW_CAP_FIXES.names),
    "vllm-hybrid-sync-load": (HYBRID_SYNC_LOAD_FIXES, HYBRID_SYNC_LOAD_FIXES.names),
    "vllm-encoder-victim": (ENCODER_VICTIM_FIXES, ENCODER_VICTIM_FIXES.names),
    "vllm-mm-threshold": (MM_THRESHOLD_FIXES, MM_THRESHOLD_FIXES.names),
    "vllm-encoder-rollback": (ENCODER_ROLLBACK_FIXES, ENCODER_ROLLBACK_FIXES.names),
    "vllm-mm-upstream": (MM_UPSTREAM_FIXES, MM_UPSTREAM_FIXES.names),
    "vllm-encoder-load-order": (ENCODER_LOAD_ORDER_FIXES, ENCODER_LOAD_ORDER_FIXES.names),
    "vllm-encoder-connector": (ENCODER_CONNECTOR_FIXES, ENCODER_CONNECTOR_FIXES.names),
}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="scripts/engine_fixes_diff.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", nargs="?", choices=list(ENGINES))
    parser.add_argument(
        "--fix",
        action="append",
        metavar="NAME",
        help="a fix to include (repeatable; default the engine's default set)",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="list the engine's fixes (* = default set) and exit; with no engine, every "
        "engine's, each under an 'ENGINE:' heading",
    )
    return run_script(parser, lambda args: _run(parser, args), argv)


def _list(engine: str) -> list[str]:
    """`engine`'s fixes, one line each: the default set starred, then name and summary."""
    fixes, default = ENGINES[engine]
    width = max(len(name) for name in fixes.names)
    return [
        f"{'*' if fix.name in default else ' '} {fix.name:<{width}}  {fix.summary}"
        for fix in fixes.fixes
    ]


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.engine is None:
        if not args.list or args.fix:
            parser.error(
                "an engine is needed (one of " + ", ".join(ENGINES) + "); --list alone lists "
                "every engine's fixes"
            )
        for engine in ENGINES:
            print(f"{engine}:")
            print("\n".join(f"  {line}" for line in _list(engine)))
        return 0
    fixes, default = ENGINES[args.engine]
    if args.list:
        print("\n".join(_list(args.engine)))
        return 0
    names = args.fix or list(default)
    try:
        fixes.resolve(names)
    except ValueError as err:  # an unknown fix, or two that edit the same lines
        print(f"error: {err}", file=sys.stderr)
        return 2
    return print_patch(lambda: fixes.as_diff(names))


if __name__ == "__main__":
    sys.exit(main())
