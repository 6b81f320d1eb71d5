"""vLLM's newest release, 0.34.0, selected with SCHEDSPEC_VLLM_VERSION: the same adapters drive
it, and the release-independent checks pass on it as on 0.33.0.

One process imports one release (both are the package `vllm`), and the rest of the suite runs
0.33.0 in its workers, so the checks run in one pytest subprocess with the variable set. They
are tests of the suite's own modules, chosen as those that say nothing of a particular
release's code (no candidate fix or seeded bug written as an edit of 0.33.0's source alone):

- the loaded vLLM is 0.34.0, from its own install;
- the AR suite passes `real-vllm` and `real-vllm-prefix`, and the `vllm-v1` reference decides
  as 0.34.0 does (`test_reference_is_decision_identical_to_real_vllm`);
- the three admission settings' built-ins pass and decide as their twins, the suite fails a
  profile that keeps the watermark beside nothing, the cadence finding (a held step whose only
  decode preempts itself schedules nothing) reproduces, and its fix applies and holds;
- the live event log checks, and shows a seeded bug planted in the live scheduler;
- 0.34.0's cache-aware admission (`cache_aware_admission_window`) conforms to the profile that
  declares it and decides as its twin (with the candidate fix of its finding,
  `bounded-cache-probe`: a prompt-scoring request ranked by cached tokens it may not read,
  which reproduces), fails the profile without it, and a live log declares it; in the
  engine-core loop the window's order holds (rule `cache_aware_order`), the finding reproduces
  there as its shrunk program, the fix lifts it, and seeded bugs in the window fail the rule;
- the live event log marks a request waiting for its structured-output grammar and the pass
  that finds it compiled (`ArAwaiting`, `ArReady`), and with the cache-aware window a request
  not yet promoted keeps its place through the reorder; seeded grammar bugs fail the log;
- a request's cache read limit bounds its hit at its first scored prompt row (0.34.0's
  `prompt_logprob_start`), a live log carries it, and `check-trace` holds a hit to it;
- 0.34.0's cap on in-flight KV loads (`max_num_inflight_kv_loads`) holds in the engine-core loop
  with a KV connector, and its rule catches the cap ignored; the admission order holds across
  its two waiting queues, and seeded bugs that take from one first fail it; with failing loads
  it holds with
  the KV load fixes as written for 0.34.0, and not with the requeue fix as written for 0.33.0,
  nor beside a "keep" pause with a `reset-loaded-holders` that leaves a request's fetch stage;
- the six findings of 0.33.0's KV connector path under `kv_load_failure_policy="recompute"`
  reproduce on 0.34.0, and their fixes, three of them written anew for 0.34.0
  (`EngineFix.releases`), apply and hold;
- the engine-core loop (synchronous and asynchronous) passes generated programs, and its checks
  catch each seeded bug;
- vLLM's diffusion path prefills, denoises and commits a request canvas by canvas, and its
  checks catch each seeded bug;
- a new decode's padding drafts are never accepted (speculative decoding);
- vLLM's offloading connector moves both groups of a hybrid cache, and of 0.33.0's finding
  about window chunks stored in part, the hit that reads the part left out remains while the
  blocks landing a slot early are gone (0.34.0 stores the null block as a placeholder);
- 0.33.0's finding that a streaming-input session drops a later input's grammar reproduces,
  and its fix `own-grammar-per-input`, written anew for 0.34.0, holds;
- 0.33.0's finding that the offloading connector stores a session's unwritten block when
  its next input's grammar fails is fixed upstream in 0.34.0, and its program passes;
- 0.33.0's finding about self-describing KV events (a CPU chunk evicted and stored again is
  announced without its blocks) does not reproduce: 0.34.0 rebuilt the event tracker, and the
  fix `count-recorded-stores` has no place there;
- schedspec's KV connector on a hybrid cache: its three findings (a whole-request load over a
  null window block, a capped reservation stranding the requests holding KV, a failed
  synchronous load unheard) reproduce as on 0.33.0, and both fixes apply and hold;
- the three multimodal findings of 0.33.0 (a same-step priority victim's items left booked, a
  long-prefill cap below an item with chunked mm input disabled, a failed load's rollback
  behind a referenced item) reproduce, and their fixes apply unchanged and hold; the two
  0.34.0 fixed (an item split after a hit inside it, a prompt split by encoder pressure with
  chunked prefill off) pass as released;
- the CPU encoder-cache offload's two findings (a save evicts the entry a load of the same
  request is about to pin; a same-step priority victim's saves never land) reproduce, with
  their consequences, and their fixes apply unchanged and hold;
- the finding of 0.34.0 (a guided token sampled under a bitmask row that allows every token)
  reproduces, and its candidate fix `no-placeholder-drafts` applies as a patch and holds (the
  same test checks, on 0.33.0, that both programs pass there).

docs/engines/vllm-0.34.md ("vLLM 0.34.0") says what else was run on 0.34.0; the rest of the vLLM
tests pass there too (run by hand: about three minutes more than CI has room for).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from integrations.vllm.manifest import NEWEST_VERSION, VERSION_VARIABLE, manifest_of
from tests.engine_gate import require_engine
from tests.tier import full_tier

ROOT = Path(__file__).resolve().parents[1]

#: The release-independent tests run on the newest release (module docstring).
RELEASE_INDEPENDENT = (
    "tests/test_real_vllm.py::test_the_loaded_vllm_is_the_selected_release",
    "tests/test_real_vllm.py::test_real_vllm_conforms",
    "tests/test_real_vllm.py::test_real_vllm_prefix_conforms",
    "tests/test_real_vllm.py::test_reference_is_decision_identical_to_real_vllm",
    "tests/test_real_vllm.py::test_async_loop_passes_generated_programs_and_takes_every_async_path",
    "tests/test_real_vllm.py::test_async_checks_catch_each_seeded_bug",
    "tests/test_real_vllm.py::test_a_live_vllm_scheduler_logs_what_it_decides",
    "tests/test_real_vllm.py::test_a_live_log_shows_a_seeded_bug_in_vllms_scheduler",
    "tests/test_real_vllm_ar_settings.py",
    "tests/test_real_vllm_cache_aware.py",
    "tests/test_real_vllm_cache_aware_loop.py",
    "tests/test_real_vllm_cache_reads.py",
    "tests/test_real_vllm_event_log_grammar.py",
    "tests/test_real_vllm_event_log_lora.py",
    "tests/test_real_vllm_inflight_loads.py",
    *(
        f"tests/test_real_vllm_kv_connector.py::{name}"
        for name in (
            "test_finding_a_retried_load_counts_its_own_reservation",
            "test_the_drop_stale_reservation_fix_lets_the_retry_in",
            "test_finding_a_failed_load_heads_the_loads_and_strands_them",
            "test_finding_blocks_computed_over_a_failed_block_stay_cached",
            "test_finding_a_failed_block_whose_loader_is_gone_stays_cached",
            "test_finding_blocks_computed_over_a_failed_block_outlive_their_loader",
            "test_the_ended_loader_fix_covers_its_later_steps_in_flight",
            "test_finding_a_second_holder_of_a_failed_block_reads_it",
            "test_known_upstream_a_failed_synchronous_load_under_async_scheduling",
            "test_the_fixes_are_edits_of_vllms_scheduler",
            "test_connector_programs_pass_with_the_fixes",
        )
    ),
    "tests/test_real_vllm_dllm.py::"
    "test_a_request_is_prefilled_then_denoised_and_committed_canvas_by_canvas",
    "tests/test_real_vllm_dllm.py::test_checks_catch_each_seeded_bug",
    "tests/test_real_vllm_speculative.py::test_a_new_decodes_padding_is_never_accepted",
    "tests/test_real_vllm_hybrid_connector.py",
    "tests/test_real_vllm_hybrid_loop.py::test_vllms_offloading_moves_both_groups_and_passes",
    "tests/test_real_vllm_hybrid_loop.py::test_finding_a_window_chunk_stored_in_part_is_hit_whole",
    "tests/test_real_vllm_kv_events.py::"
    "test_finding_a_chunk_evicted_and_stored_again_is_announced_without_its_blocks",
    "tests/test_real_vllm_sessions.py::"
    "test_finding_a_guided_sessions_later_turn_keeps_its_first_inputs_grammar",
    "tests/test_real_vllm_sessions.py::"
    "test_finding_a_session_ended_by_its_next_grammar_has_uncomputed_blocks_offloaded",
    "tests/test_real_vllm_structured.py::"
    "test_finding_on_0_34_a_guided_token_is_sampled_under_a_row_that_allows_every_token",
    "tests/test_real_vllm_structured.py::test_the_guided_drafts_fix_is_one_patch_of_vllms_scheduler",
    *(
        f"tests/test_real_vllm_encoder.py::{name}"
        for name in (
            "test_a_victim_of_the_step_that_scheduled_it_leaves_its_item_booked",
            "test_the_booked_item_is_a_runner_miss_once_read",
            "test_a_cap_shorter_than_an_item_stalls_it_with_chunked_mm_input_disabled",
            "test_a_request_truncated_by_a_failed_load_waits_for_its_own_item",
            "test_finding_of_0_33_fixed_in_0_34",
            "test_the_fixes_are_edits_of_vllms_scheduler",
        )
    ),
    *(
        f"tests/test_real_vllm_encoder_offload.py::{name}"
        for name in (
            "test_a_save_evicts_the_entry_its_own_request_loads",
            "test_the_save_that_never_lands_keeps_the_engine_stepping",
            "test_the_load_never_sent_is_a_runner_miss",
            "test_a_same_step_victims_saves_never_land",
            "test_the_victims_save_keeps_the_engine_stepping",
            "test_the_fix_is_an_edit_of_vllms_scheduler",
        )
    ),
)


@pytest.fixture(scope="module")
def newest_env() -> dict[str, str]:
    """The environment that selects the newest release; skips (SCHEDSPEC_SKIP_ENGINES=1) or
    fails naming the install command when it is not installed."""
    command = f"{VERSION_VARIABLE}={NEWEST_VERSION} schedspec install-engines vllm"
    require_engine(manifest_of(NEWEST_VERSION), "vllm", "vLLM", command=command)
    # the AR verify runs at 20 examples (40 in the main run): the release, not the depth
    return {**os.environ, VERSION_VARIABLE: NEWEST_VERSION, "SCHEDSPEC_VLLM_EXAMPLES": "20"}


@full_tier
def test_the_release_independent_checks_pass_on_the_newest_release(
    newest_env: dict[str, str], tmp_path: Path
) -> None:
    """Every test of `RELEASE_INDEPENDENT` runs, in one process, on 0.34.0, and passes."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            f"--basetemp={tmp_path / 'tmp'}",
            *RELEASE_INDEPENDENT,
        ],
        cwd=ROOT,
        env=newest_env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = res.stdout[-4000:] + res.stderr[-2000:]
    assert res.returncode == 0, tail
    summary = res.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "skipped" not in summary, tail


def test_an_unknown_release_is_a_usage_error_naming_the_releases() -> None:
    """SCHEDSPEC_VLLM_VERSION set to a release the project does not drive: exit 2 and one line
    naming those it does, for `verify`, `install-engines` and `list-impls` alike."""
    schedspec = str(Path(sys.executable).parent / "schedspec")
    env = {**os.environ, VERSION_VARIABLE: "0.32.0"}
    for argv in (
        ["verify", "--impl", "real-vllm", "--examples", "1"],
        ["install-engines", "vllm"],
        ["list-impls"],  # it used to list real-vllm as "adapter not in this build", exit 0
    ):
        res = subprocess.run(
            [schedspec, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert res.returncode == 2, (argv, res.stdout, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "0.33.0, 0.34.0" in lines[0], res.stderr
        assert f"invalid {VERSION_VARIABLE}='0.32.0'" in lines[0], res.stderr
