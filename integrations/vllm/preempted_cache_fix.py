"""A candidate fix for a finding in vLLM 0.33.0's prefix caching under priority scheduling,
applied to one built scheduler so that the AR checks can validate it.

The finding (docs/engines/vllm.md, "A request preempted in the step that scheduled it stays
cached"): `KVCacheManager.allocate_slots` registers the blocks of the tokens it schedules in the
prefix cache at once, before the forward pass writes their KV. Under the priority policy
`Scheduler.schedule` may then preempt a request it already scheduled in the same call (the
lowest-priority running request, when a later one cannot get a block). The victim's tokens are
taken out of the step, so their KV is never written, but the blocks keep their hashes when
they are freed. A later request with that prefix (the victim itself, when it resumes) gets
them as a cache hit and attends to whatever KV the blocks held before.

The fix: where `schedule()` takes an already scheduled victim out of the step, it first evicts
from the prefix cache the victim's blocks from its first uncomputed token on (the ones this
step's `allocate_slots` registered; `BlockPool.evict_blocks`, vLLM's own public method, which
leaves the blocks themselves to `_preempt_request` to free). The blocks below
`num_computed_tokens` hold KV computed in earlier steps and stay cached. Each KV cache group
is cut at its own block size (`KVCacheCoordinator.group_block_sizes`): the scheduler's block
size is a multiple of every group's, so an index over it would evict a smaller-block group's
written blocks too. Checked on three hybrid caches
(tests/test_real_vllm_preempted_cache_hybrid.py): full-attention groups of two block sizes, a
full-attention group beside a sliding-window one, and one beside a Mamba group in "align"
mode, whose never-computed checkpoint it evicts while the state of the computed tokens stays
cached.

As elsewhere (`integrations.vllm.whole_canvas_fix`), the fix is an edit of vLLM's own
`vllm/v1/core/sched/scheduler.py` (`PREEMPTED_CACHE_FIXES`): `fix_as_diff()` prints it as a
patch, and `apply_preempted_cache_fix(sched)` gives one built scheduler the edited
`Scheduler.schedule` through a subclass of its class. `FixDoesNotApply` if vLLM's file no
longer has the statement the fix edits. `REAL_VLLM_PREFIX_FIXED` is `real-vllm-prefix` with the
fix, for `schedspec verify --impl integrations.vllm.preempted_cache_fix:REAL_VLLM_PREFIX_FIXED`.
"""

from __future__ import annotations

from typing import Any

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm import REAL_VLLM_PREFIX_PROFILE
from integrations.vllm.adapter import RealVllmScheduler, make_real_vllm_prefix
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ScheduleFix
from spec.ar.adapter import ArEventSink
from spec.ar.config import ArConfig
from spec.implementation import ArImplementation

PREEMPTED_CACHE = "uncache-preempted"

#: Where the priority branch takes a victim scheduled earlier in this call out of the step.
_UNSCHEDULE = (
    "                        if preempted_req in scheduled_running_reqs:\n"
    "                            preempted_req_id = preempted_req.request_id\n"
    "                            scheduled_running_reqs.remove(preempted_req)\n"
)
_EVICT_UNWRITTEN = (
    "                            # Its KV for this step's tokens is never written: drop the\n"
    "                            # prefix-cache entries allocate_slots made for them, in\n"
    "                            # each KV cache group from its first uncomputed block on.\n"
    "                            computed = preempted_req.num_computed_tokens\n"
    "                            kv_blocks = self.kv_cache_manager.get_blocks(\n"
    "                                preempted_req_id\n"
    "                            ).blocks\n"
    "                            block_sizes = (\n"
    "                                self.kv_cache_manager.coordinator.group_block_sizes\n"
    "                            )\n"
    "                            self.kv_cache_manager.block_pool.evict_blocks(\n"
    "                                {\n"
    "                                    block.block_id\n"
    "                                    for group, size in zip(kv_blocks, block_sizes)\n"
    "                                    for block in group[computed // size :]\n"
    "                                }\n"
    "                            )\n"
)

PREEMPTED_CACHE_FIX = EngineFix(
    PREEMPTED_CACHE,
    ((MODULE, _UNSCHEDULE, _UNSCHEDULE + _EVICT_UNWRITTEN),),
    ((MODULE, "Scheduler.schedule"),),
    "a request preempted in the step that scheduled it leaves its unwritten blocks in the "
    "prefix cache: evict them before it is freed",
)
PREEMPTED_CACHE_SCHEDULE = ScheduleFix(PREEMPTED_CACHE_FIX)
PREEMPTED_CACHE_FIXES = PREEMPTED_CACHE_SCHEDULE.fix_set


def fixed_schedule() -> Any:
    """vLLM's `Scheduler.schedule` with the fix made (compiled once per process)."""
    return PREEMPTED_CACHE_SCHEDULE.schedule()


def fix_as_diff() -> str:
    """The fix as a unified diff of the installed vLLM's `vllm/v1/core/sched/scheduler.py`
    (paths relative to the package's parent, as `git apply -p1` in a vLLM checkout wants),
    made from that file when called: nothing of vLLM's is stored here."""
    return PREEMPTED_CACHE_SCHEDULE.as_diff()


def apply_preempted_cache_fix(sched: Any) -> None:
    """Give `sched` (a built vLLM `Scheduler`) the fixed `Scheduler.schedule`, through a
    subclass of its class: no other scheduler changes."""
    PREEMPTED_CACHE_SCHEDULE.apply(sched)


def make_real_vllm_prefix_fixed(config: ArConfig, sink: ArEventSink) -> RealVllmScheduler:
    """Factory: `real-vllm-prefix` (vLLM 0.33.0's v1 Scheduler, prefix caching on) with the
    fix applied to its scheduler."""
    adapter = make_real_vllm_prefix(config, sink)
    apply_preempted_cache_fix(adapter.sched)
    return adapter


REAL_VLLM_PREFIX_FIXED = ArImplementation(
    make_real_vllm_prefix_fixed,
    REAL_VLLM_PREFIX_PROFILE,
    "vLLM 0.33.0's real v1 Scheduler with prefix caching on and the candidate fix "
    f"{PREEMPTED_CACHE!r} applied to it",
)


__all__ = [
    "PREEMPTED_CACHE",
    "PREEMPTED_CACHE_FIX",
    "PREEMPTED_CACHE_FIXES",
    "PREEMPTED_CACHE_SCHEDULE",
    "REAL_VLLM_PREFIX_FIXED",
    "FixDoesNotApply",
    "apply_preempted_cache_fix",
    "fix_as_diff",
    "fixed_schedule",
    "make_real_vllm_prefix_fixed",
]
