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
from spec.errors import SchedulerStalled

ArEventSink = Callable[[ArEvent], None]


@runtime_checkable
class ArSchedulerAdapter(Protocol):
    """An AR scheduler under test.

    - `submit` validates (raising a `spec.errors.RequestError` and changing nothing if
      invalid), queues the request and emits `ArSubmitted`.
    - `abort` (between steps) frees what the request holds (`ArBlocksFreed`) and emits
      `ArAborted`; an unknown or ended id raises `spec.errors.UnknownRequest`.
    - `step` runs one scheduling step: scheduling phase, `ArStepEnd`, update phase. With nothing
      to do it still ends the step.
    - `drain` steps until nothing is waiting or running, raising
      `spec.errors.SchedulerStalled` instead of looping forever.
    - `snapshot` reads its own pools and queues; `rules` states the ordering it promises.
    """

    @property
    def config(self) -> ArConfig: ...

    @property
    def rules(self) -> ArRules: ...

    def submit(self, request: ArRequest) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def step(self) -> None: ...

    def drain(self, max_steps: int = 100_000) -> None: ...

    def snapshot(self) -> ArSnapshot: ...


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
        raise SchedulerStalled(
            max_steps, f"{waiting} waiting and {running} running after {max_steps} steps"
        )


class ArImplementationFactory(Protocol):
    def __call__(self, config: ArConfig, sink: ArEventSink) -> ArSchedulerAdapter: ...
