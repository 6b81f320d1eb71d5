"""The rules vLLM's admission settings add to the engine-core loop (`active_cap`,
`watermark`, `prefill_cadence`), each stated in `integrations.vllm.admission_knobs`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from integrations.vllm.adapter import waiting_requests
from integrations.vllm.admission_knobs import AdmissionKnobs
from integrations.vllm.cache_writes import batch_starts
from integrations.vllm.core_loop import EngineCoreViolation
from integrations.vllm.release_api import resumed_req_ids
from integrations.vllm.trace import counted

#: The rules `AdmissionCheck` adds to the engine-core loop's.
ADMISSION_RULES = ("active_cap", "watermark", "prefill_cadence")
#: The counts the check scripts print, in words (`AdmissionCounts`).
ADMISSION_MEANING = {
    "watermark_admissions": "calls admitting a request while one ran (watermark checked)",
    "capped_admissions": "calls admitting a request under max_num_active_seqs",
    "held_steps": "calls the prefill cadence held",
    "backed_up_releases": "release steps that left requests waiting (cadence lifted)",
    "emptied_holds": "held calls whose every decode preempted (hold may lift)",
}


@dataclass(slots=True)
class AdmissionCounts:
    """How often each rule's case came up."""

    watermark_admissions: int = 0  # calls that admitted a request while one ran (watermark on)
    capped_admissions: int = 0  # calls that admitted a request under max_num_active_seqs
    capped_beside_sessions: int = 0  # of those, with a session waiting for input counted
    held_steps: int = 0  # calls the prefill cadence held (no prefill allowed)
    backed_up_releases: int = 0  # release steps that left the engine backed up
    emptied_holds: int = 0  # held calls that preempted every request decoding before them


class AdmissionCheck:
    """Checks `ADMISSION_RULES` over each `schedule()` call of scheduler `sched` built with
    `knobs` (`before_schedule`, then `after_schedule`); tracks the prefill cadence from the
    calls themselves (executed steps and the last one that carried prefill)."""

    def __init__(self, knobs: AdmissionKnobs, sched: Any) -> None:
        self.knobs: AdmissionKnobs = knobs
        self.sched: Any = sched
        self.active_seats: int | None = knobs.active_seats(sched.max_num_running_reqs)
        #: vLLM's `int(watermark * num_blocks)` over the whole pool.
        self.watermark_blocks: int = int(knobs.watermark * sched.kv_cache_config.num_blocks)
        self.counts: AdmissionCounts = AdmissionCounts()
        #: Calls that scheduled a token so far, and the last of them that carried prefill (a
        #: full interval back at first: the first step is never held).
        self.executed: int = 0
        self.last_prefill: int = -knobs.prefill_interval
        #: Whether the last release step left requests waiting that vLLM could consider.
        self.backed_up: bool = False
        #: Whether the cadence holds the call in progress.
        self.held: bool = False
        self._running: dict[str, bool] = {}  # running request id -> a prefill chunk next
        self._tokens: dict[str, int] = {}  # waiting request id -> its tokens

    def before_schedule(self) -> None:
        """Note the running requests (and which continue a prefill), the waiting requests'
        tokens, and whether the cadence holds this call."""
        sched = self.sched
        self._running = {r.request_id: bool(r.is_prefill_chunk) for r in sched.running}
        self._tokens = {r.request_id: r.num_tokens for r in waiting_requests(sched)}
        decoding = any(not chunk for chunk in self._running.values())
        interval = self.knobs.prefill_interval
        self.held = (
            interval > 1
            and decoding
            and not self.backed_up
            and self.executed + 1 - self.last_prefill < interval
        )
        self.counts.held_steps += self.held

    def after_schedule(self, out: Any, where: str) -> None:
        """Check the call that produced `out` against the three rules, then advance the
        cadence."""
        resumed = resumed_req_ids(out)
        admitted = [d.req_id for d in out.scheduled_new_reqs] + sorted(resumed)
        if admitted:
            self._check_active_cap(admitted, where)
            self._check_watermark(admitted, where)
        starts = batch_starts(out)
        chunks = [rid for rid in out.num_scheduled_tokens if self._running.get(rid, False)]
        prompts = [rid for rid in admitted if starts[rid] < self._tokens.get(rid, 0) - 1]
        carried = chunks + prompts
        if self.held and self._hold_emptied(out):
            # every decode the hold was for is gone: nothing else may run, so the hold may
            # lift (`lift-empty-hold`; released vLLM schedules nothing, rule `idle_step`)
            self.counts.emptied_holds += 1
        elif self.held and carried:
            what = ", ".join(
                [f"{rid!r} a prefill chunk" for rid in chunks]
                + [f"{rid!r} admitted at token {starts[rid]}" for rid in prompts]
            )
            raise EngineCoreViolation(
                "prefill_cadence",
                f"{where} carried prefill ({what}) while a request decodes, "
                f"{counted(self.executed + 1 - self.last_prefill, 'executed step')} after the "
                f"last one that did; prefill_schedule_interval={self.knobs.prefill_interval}, "
                "and the last release left no request waiting that vLLM could consider",
            )
        if not self.held and self.knobs.prefill_interval > 1:
            set_aside = {r.request_id for r in self.sched.deferred_waiting}
            waiting = waiting_requests(self.sched)
            self.backed_up = any(r.request_id not in set_aside for r in waiting)
            self.counts.backed_up_releases += self.backed_up
        if out.total_num_scheduled_tokens > 0:
            self.executed += 1
        if carried:
            self.last_prefill = self.executed

    def _hold_emptied(self, out: Any) -> bool:
        """Whether the call preempted every request that was decoding before it: the AR spec's
        empty hold, seen over the whole call."""
        preempted = set(out.preempted_req_ids or ())
        decoding = [rid for rid, chunk in self._running.items() if not chunk]
        return bool(preempted) and all(rid in preempted for rid in decoding)

    def _check_active_cap(self, admitted: list[str], where: str) -> None:
        cap = self.active_seats
        if cap is None:
            return
        self.counts.capped_admissions += 1
        sched = self.sched
        waiting_for_input = [
            rid for rid, r in sched.requests.items() if r.status.name == "WAITING_FOR_STREAMING_REQ"
        ]
        active = len(sched.running) + len(waiting_for_input)
        self.counts.capped_beside_sessions += bool(waiting_for_input)
        if active > cap:
            sessions = f" and {counted(len(waiting_for_input), 'session')} waiting for input"
            raise EngineCoreViolation(
                "active_cap",
                f"{where} admitted {admitted} and left {len(sched.running)} running"
                f"{sessions if waiting_for_input else ''}: {active} active; "
                f"max_num_active_seqs={cap}",
            )

    def _check_watermark(self, admitted: list[str], where: str) -> None:
        if not self.watermark_blocks or not self._running:
            return
        self.counts.watermark_admissions += 1
        free = self.sched.kv_cache_manager.block_pool.get_num_free_blocks()
        if free < self.watermark_blocks:
            raise EngineCoreViolation(
                "watermark",
                f"{where} admitted {admitted} while {sorted(self._running)} ran and left "
                f"{free} blocks free; the watermark keeps {self.watermark_blocks} free "
                f"(watermark={self.knobs.watermark:g} of {self.sched.kv_cache_config.num_blocks})",
            )


__all__ = ["ADMISSION_MEANING", "ADMISSION_RULES", "AdmissionCheck", "AdmissionCounts"]
