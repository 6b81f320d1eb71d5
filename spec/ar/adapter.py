"""The AR adapter protocol: how an autoregressive scheduler plugs into the suites.

Built by a factory `(config, sink) -> ArSchedulerAdapter`; every event goes to `sink` as it
happens. A factory may refuse a configuration it does not support by raising
`spec.errors.ConfigError` naming the field (for example LightLLM with block_size != 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from spec.ar.config import ArConfig, ArRequest, ArRules
from spec.ar.events import ArEvent
from spec.ar.snapshot import ArSnapshot
from spec.errors import ConfigError, SchedulerStalled

ArEventSink = Callable[[ArEvent], None]


@runtime_checkable
class ArSchedulerAdapter(Protocol):
    """An AR scheduler under test.

    Each method's docstring states its part of the contract.
    """

    @property
    def config(self) -> ArConfig:
        """The configuration the factory built this scheduler for (read, never changed)."""
        ...

    @property
    def rules(self) -> ArRules:
        """The ordering it promises (admission order, victim order, ...), checked by the
        spec's ordering rules."""
        ...

    def submit(self, request: ArRequest) -> None:
        """Validate `request` (an invalid one raises a `spec.errors.RequestError` and changes
        nothing), queue it and emit `ArSubmitted`."""
        ...

    def abort(self, request_id: str) -> None:
        """Between steps: free what the request holds (`ArBlocksFreed`) and emit `ArAborted`;
        an unknown or ended id raises `spec.errors.UnknownRequest` and changes nothing."""
        ...

    def step(self) -> None:
        """Run one scheduling step: the scheduling phase, `ArStepEnd`, the update phase. With
        nothing to do the step still ends."""
        ...

    def drain(self, max_steps: int = 100_000) -> None:
        """Step until nothing is waiting or running; after `max_steps` steps with work left
        raise `spec.errors.SchedulerStalled` instead of looping forever (`drain_steps`)."""
        ...

    def snapshot(self) -> ArSnapshot:
        """Its own pools and queues, read from its data structures (not from its events)."""
        ...


def drain_steps(
    step: Callable[[], None],
    is_idle: Callable[[], bool],
    queues: Callable[[], tuple[int, int]],
    max_steps: int,
) -> None:
    """Step until idle; after `max_steps` steps with work left raise `SchedulerStalled` naming
    the (waiting, running) counts `queues()` reports. The `drain` every AR adapter needs."""
    for _ in range(max_steps):
        if is_idle():
            return
        step()
    if not is_idle():
        waiting, running = queues()
        raise SchedulerStalled(max_steps, f"{waiting} waiting and {running} running", "steps")


@runtime_checkable
class ArAwaitingAdapter(Protocol):
    """Optional, beside `ArSchedulerAdapter`: a scheduler that holds back a request whose input
    is not ready yet (vLLM: a structured-output grammar still compiling). A decision twin that
    has these replays a log's `ArAwaiting` / `ArReady` (`check-trace --twin`); one without them
    cannot (`CannotDrive`)."""

    def await_input(self, request_id: str, what: str) -> None:
        """The waiting request, submitted since the last step, may not be admitted until
        `input_ready`; emits `ArAwaiting(request_id, what)`. `UnknownRequest` for an id that is
        not waiting."""
        ...

    def input_ready(self, request_id: str) -> None:
        """Its input is ready from now on (between steps): the scheduler emits `ArReady` and
        may admit the request; where it promotes such a request when its waiting pass reaches
        it (vLLM), it emits `ArReady` with `in_step` then. `UnknownRequest` for an id that
        awaits nothing."""
        ...


@runtime_checkable
class ArPausingAdapter(Protocol):
    """Optional, beside `ArSchedulerAdapter`: a scheduler an operator pauses and whose prefix
    cache it resets between steps, as around a weight update (vLLM's `set_pause_state` and
    `reset_prefix_cache(reset_running_requests=True)`, which `pause_scheduler` calls). A
    decision twin that has it replays a log's `ArPauseSet` and cache resets (`check-trace
    --twin`); one without it cannot (`CannotDrive`)."""

    def set_pause(self, state: str) -> None:
        """Between steps: set the pause state (`spec.ar.events.AR_PAUSE_STATES`: "unpaused";
        "paused_new", no request admitted; "paused_all", nothing scheduled) and emit
        `ArPauseSet(state)`."""
        ...

    def reset_cache(self) -> None:
        """Between steps: preempt every running request, the last first (`ArPreempted` with
        `reset`), then forget every cached block (`ArCacheReset`)."""
        ...


@runtime_checkable
class ArDraftingAdapter(Protocol):
    """Optional, beside `ArSchedulerAdapter`: a scheduler with speculative decoding
    (`ArConfig.num_speculative_tokens` > 0) whose drafter and model the caller scripts, one
    proposal at a time. A decision twin that has it replays a log's drafts (`check-trace
    --twin`); one without it cannot (`CannotDrive`)."""

    def propose_drafts(self, request_id: str, drafts: int, accepted: int) -> None:
        """Between steps: the drafter proposed `drafts` draft tokens (1 to
        `num_speculative_tokens`) for the running request's next step, which replace any it
        proposed before; emits `ArDraftsProposed(request_id, drafts)`. The step that
        schedules the request schedules as many of them as its tokens allow, and the model
        then accepts the first min(`accepted`, scheduled) of them (fewer where the request's
        end comes first). `UnknownRequest` for an id that is not running; `ConfigError` for
        a count outside [1, num_speculative_tokens] or `accepted` outside [0, drafts]."""
        ...


def check_proposal(num_speculative_tokens: int, drafts: int, accepted: int) -> None:
    """`ConfigError` unless `drafts` is an int in [1, `num_speculative_tokens`] and `accepted`
    an int in [0, `drafts`]: the arguments `ArDraftingAdapter.propose_drafts` takes."""
    k = num_speculative_tokens
    if isinstance(drafts, bool) or not isinstance(drafts, int) or not 1 <= drafts <= k:
        raise ConfigError("drafts", drafts, f"an int in [1, num_speculative_tokens={k}]")
    if isinstance(accepted, bool) or not isinstance(accepted, int) or not 0 <= accepted <= drafts:
        raise ConfigError("accepted", accepted, f"an int in [0, drafts={drafts}]")


class ArImplementationFactory(Protocol):
    """Builds a fresh AR scheduler for `config` that reports its events to `sink`; it may
    refuse a configuration it does not support with `spec.errors.ConfigError`."""

    def __call__(self, config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter: ...
