"""Pausing generation, as RL trainers do around a weight update, in vLLM's engine-core loop
(`LoopOptions(pauses="keep" | "wait" | "abort")`, `--pauses MODE`).

vLLM's `EngineCore.pause_scheduler(mode, clear_cache=True)` (`vllm/v1/engine/core.py`, behind
`pause_generation` and `sleep`):
- "keep": the scheduler's pause state becomes `PAUSED_ALL` (it schedules nothing, and counts no
  request unfinished); requests keep their KV;
- "wait": `PAUSED_NEW` (only the running requests, and those holding KV, are scheduled; the
  waiting ones stay queued), and the engine steps until those drain;
- "abort": every request is aborted, then `PAUSED_NEW`.
The pause completes when the engine has no work (`_pause_complete`: no request counted
unfinished, no batch in flight): then `_finish_pause` clears the caches,
`reset_prefix_cache(reset_running_requests=True, reset_connector=True)`, which preempts every
running request (its output in flight dropped as stale) so that the reset succeeds, and raises
if it still fails. `resume_scheduler` sets `UNPAUSED`; requests added meanwhile were queued.

`PauseDriver` does that between engine steps: before one engine step in 16 (a hash of the
program's draw seed and the step) with a live request, and an output token produced since the
last resume, it pauses in its mode; once the engine is idle it clears the caches and resumes.
(Without the output since the last resume, a request whose recompute after a "keep" pause takes
longer than the gap to the next one would be preempted for ever; a trainer pauses once per
weight update, far apart.) Both engine-core loops drive it: the autoregressive one and the
diffusion one (`DllmServing(pauses=MODE)`). `check_schedule` is the rule `pause`: under `PAUSED_ALL`
a `schedule()` call schedules nothing; under `PAUSED_NEW` it schedules only requests that were
running, or held KV, before it. With vLLM's offloading connector a "keep" pause can clear the
caches while a waiting request holds the blocks a CPU-tier load wrote into, and vLLM's reset
raises ("not supported yet"): the loop reports that as vLLM raising (docs/engines/vllm-features.md,
"Pausing generation"). The candidate fix `reset-loaded-holders`
(`integrations.vllm.reset_holders_fix`) has the reset take those blocks back; `taken_back` counts
the requests it took them from.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from typing import Any

from integrations.vllm.core_loop import EngineCoreViolation, call_vllm
from spec.errors import ConfigError

#: The pause modes of vLLM's `pause_scheduler` (`PauseMode`).
PAUSE_MODES = ("keep", "wait", "abort")


def check_pause_mode(mode: str | None) -> None:
    """`ConfigError` unless `mode` is None or one of `PAUSE_MODES`."""
    if mode is not None and mode not in PAUSE_MODES:
        raise ConfigError("pauses", mode, f"None or one of {', '.join(PAUSE_MODES)}")


class PauseDriver:
    """Pauses and resumes one loop's scheduler `sched` in `mode`, seeded by `seed`; `note`
    writes a trace line, `abort` aborts a live request through the loop."""

    def __init__(
        self,
        sched: Any,
        mode: str,
        seed: int,
        *,
        note: Callable[[str], None],
        abort: Callable[[str], None],
    ) -> None:
        check_pause_mode(mode)
        self.sched: Any = sched
        self.mode: str = mode
        self.seed: int = seed
        self.note: Callable[[str], None] = note
        self.abort: Callable[[str], None] = abort
        #: vLLM's `PauseState` enum.
        self.states: Any = sched.pause_state.__class__
        #: The pause state this driver set (None: not paused), independent of what the
        #: scheduler says it is in.
        self.paused: Any = None
        #: Pauses made, the running requests the caches' resets preempted, and the waiting
        #: requests holding KV whose blocks they took back (none in released vLLM: the
        #: candidate fix `reset-loaded-holders`).
        self.pauses: int = 0
        self.preempted: int = 0
        self.taken_back: int = 0
        self._may_run: set[str] = set()
        #: Output tokens produced when generation last resumed (-1: never paused).
        self._outputs_at_resume: int = -1

    def step(self, step: int, live: Iterable[str], in_flight: bool, outputs: int) -> set[str]:
        """Before engine step `step`: pause (in one step in 16, with a request of `live` left,
        and an output token produced since the last resume: `outputs` counts them all), or,
        paused and with no work left (nothing counted unfinished, no batch `in_flight`), clear
        the caches and resume. Returns the requests the caches' reset preempted (the next
        `schedule()` call reports them).

        The output since the last resume keeps the program draining: a "keep" pause preempts
        every running request, and one whose recompute takes longer than the gap between two
        pauses would otherwise be preempted for ever (a trainer pauses once per weight update,
        far apart)."""
        if self.paused is None:
            requests = list(live)
            if (
                not requests
                or outputs <= self._outputs_at_resume
                or zlib.crc32(f"{self.seed}/pause/{step}".encode()) % 16
            ):
                return set()
            if self.mode == "abort":
                for rid in requests:
                    self.abort(rid)
            self.paused = self.states.PAUSED_ALL if self.mode == "keep" else self.states.PAUSED_NEW
            self.sched.set_pause_state(self.paused)
            self.pauses += 1
            self.note(f"pause ({self.mode}: {self.paused.name})")
            return set()
        if self.sched.has_requests() or in_flight:
            return set()
        running = {r.request_id for r in self.sched.running}
        holding = {r.request_id for r in self.sched.kv_holding_waiting}
        call_vllm(
            "reset_prefix_cache",
            lambda: self.sched.reset_prefix_cache(
                reset_running_requests=True, reset_connector=True
            ),
        )
        self.preempted += len(running)
        self.taken_back += len(holding - {r.request_id for r in self.sched.kv_holding_waiting})
        self.sched.set_pause_state(self.states.UNPAUSED)
        self.paused = None
        self._outputs_at_resume = outputs
        self.note(f"caches cleared ({sorted(running)} preempted), resume")
        return running

    def before_schedule(self) -> None:
        """Note the requests a `schedule()` call may schedule while paused."""
        held = (*self.sched.running, *self.sched.kv_holding_waiting)
        self._may_run = {r.request_id for r in held}

    def check_schedule(self, out: Any, where: str) -> None:
        """`pause`: what `out`, a `schedule()` call's output, may schedule in the pause."""
        if self.paused is None:
            return
        scheduled = sorted(out.num_scheduled_tokens)
        if self.paused == self.states.PAUSED_ALL and scheduled:
            raise EngineCoreViolation(
                "pause",
                f"{where} scheduled {scheduled} while generation is paused in mode 'keep' "
                "(PAUSED_ALL: nothing is scheduled)",
            )
        fresh = [rid for rid in scheduled if rid not in self._may_run]
        if fresh:
            raise EngineCoreViolation(
                "pause",
                f"{where} scheduled {fresh}, neither running nor holding KV before the call, "
                f"while generation is paused in mode {self.mode!r} (PAUSED_NEW)",
            )


__all__ = ["PAUSE_MODES", "PauseDriver", "check_pause_mode"]
