"""The profile SGLang 0.5.23's dLLM path declares: what it supports and what it chooses.

Every option cites the SGLang behaviour behind it (paths relative to python/sglang/srt/):
- page == block only (`page_multiples={1}`): the dLLM path caps the KV page size at the block
  size (`_dllm_page_size`), so the only overlap with the spec's "page a positive multiple of the
  block" is page == block;
- FDFO reuse is unconditional (`in_place_reuse={True}`): `alloc_for_extend` reuses a retained
  block whenever the request holds its row and has `dllm_incomplete_ids`
  (mem_cache/allocation.py:387); there is no switch;
- no re-loop (`reloop={False}`): `DllmAlgorithm._run_fdfo` runs one forward and one step per
  scheduler round (dllm/algorithm/base.py);
- rows == max_running_requests: the request pool is sized from max_running_requests
  (`ReqToTokenPool(size=max_num_reqs)`), as a rule. Not always: the dLLM manager keeps
  `--max-running-requests` as given (dllm/config.py), while `resolve_max_num_reqs`
  (mem_cache/kv_cache_configurator.py) sizes the pool at min(requested // attention-DP size,
  token capacity // 2), so a small KV pool or attention DP leaves fewer rows than seats; there
  SGLang stalls or takes a row there is not (findings, see docs/engines/sglang.md), so the profile
  does not claim that space (the candidate fixes of `integrations.sglang.fixes` lift this
  restriction and the KV headroom);
- the radix cache on or off (`prefix_cache={False, True}`): SGLang 0.5.23 serves dLLMs with
  its block-level radix cache unless `--disable-radix-cache` (PR #18724); committed blocks are
  checkpointed into the tree after every block (`finish_dllm_forward` ->
  `stash_chunked_request` -> `checkpoint_kv_cache`), a new request's match is bounded to whole
  committed blocks (`Req._compute_max_prefix_len`), and the tree evicts unlocked leaves for an
  allocation;
- reserved KV page 0 and request-pool row 0 (padding for CUDA-graph batches,
  mem_cache/memory_pool.py:400 and the allocators' `clear`);
- admission PREFILL_FIRST: `_process_dllm_batches` tries the prefill batch first and falls back
  to the decode batch only when there is no prefill-phase request
  (dllm/mixin/scheduler.py:262); a batch is prefill-only or decode-only, and a request whose
  prompt fills its first block (`INCOMING_PREFILL`, dllm/mixin/req.py `init_diffusion_llm`)
  gets its row before a shorter-prompt request (`INCOMING_DECODE`) queued ahead of it: the
  spec's PREFILL_FIRST admission order;
- not work-conserving: `PrefillAdder` admits against a budget that charges each staged
  running request its next block, a page and its `max_new_tokens`
  (managers/schedule_policy.py `add_dllm_staging_req`; the dLLM path's running batch is empty)
  and counts a new request as its fill ids (prompt plus a whole mask block) plus
  `max_new_tokens` plus a page (`add_one_req`), so it deliberately leaves free rows and KV
  idle while a queued request would fit. With the candidate fixes the budget counts exactly,
  and it is still not work-conserving: a batch is prefill-only or decode-only, so a
  decode-phase request that fits waits while a prefill batch runs.

The KV headroom (`kv_headroom_pages`) keeps most of 0.5.23's estimate findings out of the
declared space, but not all: requests that run to the end of their context still get a running
block truncated by staging, inside it (tests/test_real_sglang.py,
`test_finding_ragged_row_inside_the_declared_headroom` and
`test_finding_a_ready_block_waits_a_round_inside_the_declared_headroom`; fixed by
`whole-staged-blocks`). The suite's own requests rarely reach that.

No accepted deviation: every SGLang choice the suite meets is a declared option above.

Under priority scheduling (`--enable-priority-scheduling --schedule-low-priority-values-first`,
`real-sglang-dllm-priority`) SGLang sorts its waiting queue by (priority, entry time) before
every round (managers/schedule_policy.py `_sort_by_priority_and_fcfs`): the same profile with
`priority_order` (`SGLANG_DLLM_PRIORITY_PROFILE`).

Under `--schedule-policy lof` (`real-sglang-dllm-lof`) SGLang sorts it by `max_new_tokens`,
longest first, a stable sort before every round (`_sort_by_longest_output`): the same profile
with `longest_output_first` (`SGLANG_DLLM_LOF_PROFILE`); with priority scheduling too
(`real-sglang-dllm-priority-lof`) by (priority, -max_new_tokens), with both options
(`SGLANG_DLLM_PRIORITY_LOF_PROFILE`).

Under `--schedule-policy lpm` (`real-sglang-dllm-lpm`) with the radix cache on, SGLang sorts
the queue by the length of each request's cached prefix, longest first, before every round,
pushing back a request whose short match another queued request shares
(`_sort_by_longest_prefix`, `_compute_prefix_matches`); with the cache off it is FCFS. The
spec does not model that order: the same profile with `free_queue_order`
(`SGLANG_DLLM_FREE_ORDER_PROFILE`), which also fits `dfs-weight`, `hrrn`,
`shortest-prefill-first` and `random`.
"""

from __future__ import annotations

import dataclasses

from spec.profile import (
    DllmAdmission,
    DllmConfigSpace,
    DllmPolicy,
    DllmProfile,
)

SGLANG_DLLM_PROFILE = DllmProfile(
    space=DllmConfigSpace(
        page_multiples=frozenset({1}),
        in_place_reuse=frozenset({True}),
        reloop=frozenset({False}),
        rows_equal_max_running=True,
        kv_headroom_pages=4,  # its admission estimate exceeds the spec's worst case: findings
        prefix_cache=frozenset({False, True}),  # the radix cache, on by default (PR #18724)
    ),
    policy=DllmPolicy(
        admission=DllmAdmission.PREFILL_FIRST,
        reserved_kv_pages=1,
        reserved_rows=1,
        work_conserving=False,
        aborts_after_commit=True,  # `to_finish` ends a request after its commit (observer)
    ),
    ignore_eos=True,  # `SamplingParams.ignore_eos`, passed on by the adapter
    stop_token_ids=True,  # `SamplingParams.stop_token_ids`, likewise
)

SGLANG_DLLM_PRIORITY_PROFILE = dataclasses.replace(
    SGLANG_DLLM_PROFILE,
    policy=dataclasses.replace(SGLANG_DLLM_PROFILE.policy, priority_order=True),
)

SGLANG_DLLM_LOF_PROFILE = dataclasses.replace(
    SGLANG_DLLM_PROFILE,
    policy=dataclasses.replace(SGLANG_DLLM_PROFILE.policy, longest_output_first=True),
)

SGLANG_DLLM_PRIORITY_LOF_PROFILE = dataclasses.replace(
    SGLANG_DLLM_PROFILE,
    policy=dataclasses.replace(
        SGLANG_DLLM_PROFILE.policy, priority_order=True, longest_output_first=True
    ),
)

SGLANG_DLLM_FREE_ORDER_PROFILE = dataclasses.replace(
    SGLANG_DLLM_PROFILE,
    policy=dataclasses.replace(SGLANG_DLLM_PROFILE.policy, free_queue_order=True),
)

__all__ = [
    "SGLANG_DLLM_FREE_ORDER_PROFILE",
    "SGLANG_DLLM_LOF_PROFILE",
    "SGLANG_DLLM_LPM_PROFILE",
    "SGLANG_DLLM_PRIORITY_LOF_PROFILE",
    "SGLANG_DLLM_PRIORITY_PROFILE",
    "SGLANG_DLLM_PROFILE",
]

#: SGLang's dLLM default, the radix cache on, as the only configuration (`real-sglang-dllm-radix`):
#: a space of the cache alone makes the suite draw it, with prompts that share stems so that
#: requests read cached blocks (a space with both leaves the cache off unless a suite asks).
SGLANG_DLLM_RADIX_PROFILE = dataclasses.replace(
    SGLANG_DLLM_PROFILE,
    space=dataclasses.replace(SGLANG_DLLM_PROFILE.space, prefix_cache=frozenset({True})),
)

#: `--schedule-policy lpm` as `real-sglang-dllm-lpm` runs it: with the radix cache on, the only
#: place its order differs from FCFS (with the cache off SGLang makes lpm FCFS, which
#: `real-sglang-dllm` already checks), and the order free.
SGLANG_DLLM_LPM_PROFILE = dataclasses.replace(
    SGLANG_DLLM_RADIX_PROFILE, policy=SGLANG_DLLM_FREE_ORDER_PROFILE.policy
)

#: The space without the KV headroom and with any number of rows, where SGLang's KV admission
#: check and its estimate decide: for an SGLang with the candidate fixes of
#: `integrations.sglang.fixes` (a patched install, or `sglang_fixed`); 0.5.23 as released fails
#: it with the estimate findings of docs/engines/sglang.md.
SGLANG_DLLM_UNDER_PRESSURE_PROFILE = dataclasses.replace(
    SGLANG_DLLM_PROFILE,
    space=dataclasses.replace(
        SGLANG_DLLM_PROFILE.space, kv_headroom_pages=None, rows_equal_max_running=False
    ),
)
