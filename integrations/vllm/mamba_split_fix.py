"""A candidate fix for a finding in vLLM 0.33.0's Mamba prefix caching: how
`Scheduler._mamba_block_aligned_split` ends a chunk that starts inside a Mamba block when the
layers export internal prefill checkpoints, applied to one built scheduler so that the
engine-core checks can validate it.

The finding (docs/engines/vllm-kv.md, "Mamba groups"): in "align" mode a Mamba block holds the state
after exactly its last token, and the worker writes a step's state into the block of the
step's last token only. So `_mamba_block_aligned_split` stops a chunk that starts inside a
block at that block's end ("a chunk starting mid-block stops at the boundary rather than
running past it"), except where the layers export an internal prefill checkpoint in the chunk
(`use_internal_checkpoint`, Mamba2's and gated-delta-net layers'). A chunk starts inside a
block after a fine-grained hit (hashes finer than the Mamba block, `prefix_match_unit`): the
hit's partial state is copied into a private block (copy-on-write), and `MambaManager` caps
the request's cached blocks below it, so that the private block "is re-cached once full".
With the exemption the chunk runs past that block's end, the state after it lands in a later
block, and the private block, still holding the state after the hit's tokens, is cached as the
full block: a later hit on it starts from a state that has skipped tokens.

The fix drops the exemption: a chunk that starts inside a Mamba block always stops at its end
(one step more for such a request; the checkpoint is exported in its next chunk, which starts
on a block boundary). It is an edit of vLLM's own `vllm/v1/core/sched/scheduler.py`
(`MAMBA_SPLIT_FIXES`): `fix_as_diff()` prints it as a patch, and `apply_mamba_split_fix(sched)`
gives one built scheduler the edited `Scheduler._mamba_block_aligned_split` through a subclass
of its class. `FixDoesNotApply` if vLLM's file no longer has the statement the fix edits.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

MAMBA_SPLIT = "stop-mid-block-chunks"

#: The stop at the next block boundary for a chunk starting inside a block, and its exemption.
_MID_BLOCK_STOP = (
    "            next_block_boundary\n"
    "            if start % block_size != 0 and not use_internal_checkpoint\n"
    "            else 0,\n"
)
_MID_BLOCK_STOP_ALWAYS = (
    "            # Even with an internal checkpoint: the worker leaves this block's\n"
    "            # state short of its end otherwise, and the manager caches it as full.\n"
    "            next_block_boundary\n"
    "            if start % block_size != 0\n"
    "            else 0,\n"
)

MAMBA_SPLIT_FIX = EngineFix(
    MAMBA_SPLIT,
    ((MODULE, _MID_BLOCK_STOP, _MID_BLOCK_STOP_ALWAYS),),
    ((MODULE, "Scheduler._mamba_block_aligned_split"),),
    "with Mamba layers that export prefill checkpoints, a chunk starting inside a Mamba block "
    "(after a fine-grained hit) runs past its end, and the block, its state short of its end, "
    "is cached as full: stop such a chunk at the block's end, as without checkpoints",
)
MAMBA_SPLIT_SCHEDULE = ScheduleFix(MAMBA_SPLIT_FIX)
MAMBA_SPLIT_FIXES = MAMBA_SPLIT_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed `_mamba_block_aligned_split`
#: (`ScheduleFix.apply`).
apply_mamba_split_fix: ApplyFix = MAMBA_SPLIT_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = MAMBA_SPLIT_SCHEDULE.as_diff

__all__ = [
    "MAMBA_SPLIT",
    "MAMBA_SPLIT_FIX",
    "MAMBA_SPLIT_FIXES",
    "MAMBA_SPLIT_SCHEDULE",
    "FixDoesNotApply",
    "apply_mamba_split_fix",
    "fix_as_diff",
]
