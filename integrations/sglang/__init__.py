"""SGLang 0.5.23's dLLM scheduler path under the spec (`real-sglang-dllm`).

Importing this package never imports SGLang: the factory activates `MANIFEST` (raising
`EngineNotInstalled`, which names `schedspec install-engines sglang`, when it is missing) and
imports SGLang's scheduler path with `integrations.sglang.stubs` in place, on first use.
Candidate fixes for its findings, as edits of SGLang's own files that the tests run and a
script prints as a patch: `integrations.sglang.fixes`. See docs/engines/sglang.md, "SGLang 0.5.23".
"""

from __future__ import annotations

from integrations.sglang.adapter import (
    make_sglang_dllm,
    make_sglang_dllm_lof,
    make_sglang_dllm_lpm,
    make_sglang_dllm_priority,
    make_sglang_dllm_priority_lof,
)
from integrations.sglang.manifest import MANIFEST
from integrations.sglang.profile import (
    SGLANG_DLLM_FREE_ORDER_PROFILE,
    SGLANG_DLLM_LOF_PROFILE,
    SGLANG_DLLM_LPM_PROFILE,
    SGLANG_DLLM_PRIORITY_LOF_PROFILE,
    SGLANG_DLLM_PRIORITY_PROFILE,
    SGLANG_DLLM_PROFILE,
    SGLANG_DLLM_RADIX_PROFILE,
    SGLANG_DLLM_UNDER_PRESSURE_PROFILE,
)
from spec.implementation import DllmImplementation

REAL_SGLANG_DLLM = DllmImplementation(
    make_sglang_dllm,
    SGLANG_DLLM_PROFILE,
    "SGLang 0.5.23's real dLLM scheduler path (Scheduler, PrefillAdder, alloc_for_extend, pools, "
    "DllmAlgorithm.run with a scripted step, process_batch_result_dllm, abort_request) on CPU",
)

REAL_SGLANG_DLLM_RADIX = DllmImplementation(
    make_sglang_dllm,
    SGLANG_DLLM_RADIX_PROFILE,
    "SGLang 0.5.23's real dLLM scheduler path with its radix cache on, its dLLM default "
    "(committed blocks cached, read by later prompts that share them, evicted on demand)",
)

REAL_SGLANG_DLLM_UNDER_PRESSURE = DllmImplementation(
    make_sglang_dllm,
    SGLANG_DLLM_UNDER_PRESSURE_PROFILE,
    "SGLang's real dLLM scheduler path on pools without headroom and rows below the seats, where "
    "its KV admission check decides: for an SGLang with the candidate fixes "
    "(integrations.sglang.fixes); 0.5.23 as released fails it (its estimate findings)",
)

REAL_SGLANG_DLLM_PRIORITY = DllmImplementation(
    make_sglang_dllm_priority,
    SGLANG_DLLM_PRIORITY_PROFILE,
    "SGLang 0.5.23's real dLLM scheduler path under priority scheduling "
    "(--enable-priority-scheduling, lower values first), on CPU",
)

REAL_SGLANG_DLLM_LOF = DllmImplementation(
    make_sglang_dllm_lof,
    SGLANG_DLLM_LOF_PROFILE,
    "SGLang 0.5.23's real dLLM scheduler path under --schedule-policy lof (the longest "
    "max_new_tokens first), on CPU",
)

REAL_SGLANG_DLLM_PRIORITY_LOF = DllmImplementation(
    make_sglang_dllm_priority_lof,
    SGLANG_DLLM_PRIORITY_LOF_PROFILE,
    "SGLang 0.5.23's real dLLM scheduler path under --schedule-policy lof with priority "
    "scheduling (by priority, lower values first, then the longest max_new_tokens), on CPU",
)

REAL_SGLANG_DLLM_LPM = DllmImplementation(
    make_sglang_dllm_lpm,
    SGLANG_DLLM_LPM_PROFILE,
    "SGLang 0.5.23's real dLLM scheduler path under --schedule-policy lpm (with the radix cache "
    "on, the longest cached prefix first: an order the profile declares free), on CPU",
)

__all__ = [
    "MANIFEST",
    "REAL_SGLANG_DLLM",
    "REAL_SGLANG_DLLM_LOF",
    "REAL_SGLANG_DLLM_LPM",
    "REAL_SGLANG_DLLM_PRIORITY",
    "REAL_SGLANG_DLLM_PRIORITY_LOF",
    "REAL_SGLANG_DLLM_RADIX",
    "REAL_SGLANG_DLLM_UNDER_PRESSURE",
    "SGLANG_DLLM_FREE_ORDER_PROFILE",
    "SGLANG_DLLM_LOF_PROFILE",
    "SGLANG_DLLM_PRIORITY_LOF_PROFILE",
    "SGLANG_DLLM_PRIORITY_PROFILE",
    "SGLANG_DLLM_PROFILE",
    "SGLANG_DLLM_RADIX_PROFILE",
    "SGLANG_DLLM_UNDER_PRESSURE_PROFILE",
    "make_sglang_dllm",
    "make_sglang_dllm_lof",
    "make_sglang_dllm_lpm",
    "make_sglang_dllm_priority",
    "make_sglang_dllm_priority_lof",
]
