"""A candidate fix for a finding in vLLM 0.33.0's and 0.34.0's CPU encoder-cache offload
(`ECCPUConnector`, role `ec_both`) under the priority policy (docs/engines/vllm-features.md, "CPU
encoder-cache offload").

The finding: `_allocate_encoder_inputs` tells the EC connector of each input it books at once
(`update_state_after_alloc`), and the CPU connector queues a save of every input it does not
hold. Under the priority policy a request can be preempted later in the very step that
scheduled it: its encoder inputs are never computed, yet their saves reach the worker in the
step's `ec_connector_metadata`. The worker saves only what the step computed, so each such save
never lands: the entry holds its blocks, never ready, and `has_pending_push_work` stays true,
for good (vLLM's engine keeps stepping with nothing to do). Shrunk: four requests, one of them
preempted by a higher-priority one in the step that booked its item, at vLLM's own encoder
cache size. The same-step victim's GPU-side booking is another finding
(`unbook-victim-encoder-inputs`); fixing that one does not reach the connector.

The fix: `_allocate_encoder_inputs` records what it books; once the step's scheduling is final,
`schedule` tells the connector of the inputs of requests still scheduled, the loads first (so
each pins its entry before any save of the step can evict it, which also lifts the finding
`pin-loads-before-saves` fixes). Four edits of vLLM's own `vllm/v1/core/sched/scheduler.py`
(`ENCODER_CONNECTOR_FIXES`, `fix_as_diff()`), given to one built scheduler by
`apply_encoder_connector_fix`.
"""

from __future__ import annotations

from integrations.patches import EngineFix, FixDoesNotApply
from integrations.vllm.patches import SCHEDULER_MODULE as MODULE
from integrations.vllm.patches import ApplyFix, FixDiff, ScheduleFix

TELL_EC_CONNECTOR_ONCE_SCHEDULED = "tell-ec-connector-once-scheduled"

#: Where `__init__` sets up the EC connector.
_INIT = "        self.ec_connector = None\n"
_INIT_AND_BOOKED = (
    "        # (request, input id) booked this step; the EC connector is told once the\n"
    "        # step's scheduling is final (`_tell_ec_connector`).\n"
    "        self._ec_booked: list[tuple[Request, int]] = []\n"
) + _INIT

#: Where `_allocate_encoder_inputs` tells the connector at once.
_TOLD = (
    "            if self.ec_connector is not None:\n"
    "                self.ec_connector.update_state_after_alloc(request, input_id)\n"
)
_RECORDED = (
    "            if self.ec_connector is not None:\n"
    "                self._ec_booked.append((request, input_id))\n"
)

#: Where `schedule` builds the EC connector's metadata.
_META = (
    "        # Build the connector meta for ECConnector\n"
    "        if self.ec_connector is not None:\n"
)
_TOLD_THEN_META = _META + "            self._tell_ec_connector(scheduler_output)\n"

_ALLOCATE_DEF = "    def _allocate_encoder_inputs(\n"
_TELL_DEF = (
    "    def _tell_ec_connector(self, scheduler_output: SchedulerOutput) -> None:\n"
    "        # An input of a request the step took back (a same-step preemption) is\n"
    "        # never computed nor loaded: the connector must not save it. Loads go\n"
    "        # first, so each pins its entry before a save of the step can evict it.\n"
    "        assert self.ec_connector is not None\n"
    "        connector = self.ec_connector\n"
    "        booked = [\n"
    "            (request, input_id)\n"
    "            for request, input_id in self._ec_booked\n"
    "            if request.request_id in scheduler_output.num_scheduled_tokens\n"
    "        ]\n"
    "        self._ec_booked = []\n"
    "        booked.sort(\n"
    "            key=lambda b: not connector.has_cache_item(\n"
    "                b[0].mm_features[b[1]].identifier\n"
    "            )\n"
    "        )\n"
    "        for request, input_id in booked:\n"
    "            connector.update_state_after_alloc(request, input_id)\n"
    "\n"
) + _ALLOCATE_DEF

ENCODER_CONNECTOR_FIX = EngineFix(
    TELL_EC_CONNECTOR_ONCE_SCHEDULED,
    (
        (MODULE, _INIT, _INIT_AND_BOOKED),
        (MODULE, _TOLD, _RECORDED),
        (MODULE, _META, _TOLD_THEN_META),
        (MODULE, _ALLOCATE_DEF, _TELL_DEF),
    ),
    (
        (MODULE, "Scheduler.schedule"),
        (MODULE, "Scheduler._allocate_encoder_inputs"),
        (MODULE, "Scheduler._tell_ec_connector"),
    ),
    "with an EC connector, a request preempted in the step that booked its encoder inputs "
    "leaves their saves queued, never to land: tell the connector once the step's scheduling "
    "is final, of the requests still scheduled, loads first",
    state=(("_ec_booked", list),),
)
ENCODER_CONNECTOR_SCHEDULE = ScheduleFix(ENCODER_CONNECTOR_FIX)
ENCODER_CONNECTOR_FIXES = ENCODER_CONNECTOR_SCHEDULE.fix_set

#: Give one built `Scheduler` or `AsyncScheduler` the fixed methods (`ScheduleFix.apply`).
apply_encoder_connector_fix: ApplyFix = ENCODER_CONNECTOR_SCHEDULE.apply
#: The fix as a unified diff of the installed vLLM's `scheduler.py` (`ScheduleFix.as_diff`).
fix_as_diff: FixDiff = ENCODER_CONNECTOR_SCHEDULE.as_diff

__all__ = [
    "ENCODER_CONNECTOR_FIX",
    "ENCODER_CONNECTOR_FIXES",
    "ENCODER_CONNECTOR_SCHEDULE",
    "TELL_EC_CONNECTOR_ONCE_SCHEDULED",
    "FixDoesNotApply",
    "apply_encoder_connector_fix",
    "fix_as_diff",
]
