"""`gpu.device_timer.DeviceTimer`: the forwards' device time from timing events.

CUDA is not needed: a fake event stands in for `torch.cuda.Event(enable_timing=True)`, with
CUDA's contract that an event's elapsed time may be read only once the event has completed
(`elapsed_time` on an unfinished event raises `cudaErrorNotReady`), and a fake device clock
that the test advances as kernels would run. The one CUDA test runs where CUDA is present
(the device unit tests of a release, `-k device`).
"""

from __future__ import annotations

import pytest
import torch

from gpu.bench import Serving, serving
from gpu.device_timer import DeviceTimer
from gpu.engine import tiny_model
from spec.errors import ConfigError


class FakeDevice:
    """A device clock in milliseconds, and the events recorded on it."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.synchronized = 0  # events waited for

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.at_ms: float | None = None
        self.done = False

    def record(self) -> None:
        self.at_ms = self.device.now_ms

    def synchronize(self) -> None:
        self.device.synchronized += 1
        self.done = True

    def elapsed_time(self, end_event: object) -> float:
        assert isinstance(end_event, FakeEvent)
        if not end_event.done:
            raise RuntimeError("CUDA error: device not ready")
        assert self.at_ms is not None and end_event.at_ms is not None
        return end_event.at_ms - self.at_ms


def test_the_timer_sums_each_forward_between_its_events() -> None:
    device = FakeDevice()
    timer = DeviceTimer(device.event)
    for ms in (2.0, 0.5, 3.25):
        mark = timer.start()
        device.now_ms += ms  # the forward's kernels
        timer.stop(mark)
        device.now_ms += 10.0  # time between forwards is not counted
    assert timer.timed == 3 and timer.pending == 3
    assert device.synchronized == 0  # nothing waits while forwards run
    assert timer.seconds == pytest.approx(5.75e-3)
    assert timer.pending == 0 and device.synchronized == 3
    assert timer.seconds == pytest.approx(5.75e-3)  # read again: nothing more to wait for


def test_pending_pairs_are_bounded_and_nothing_is_lost() -> None:
    device = FakeDevice()
    timer = DeviceTimer(device.event, max_pending=4)
    for _ in range(11):
        mark = timer.start()
        device.now_ms += 1.0
        timer.stop(mark)
        assert timer.pending <= 4
    assert device.synchronized > 0  # the oldest were summed on the way
    assert timer.timed == 11
    assert timer.seconds == pytest.approx(11e-3)


@pytest.mark.parametrize("bad", [1, 0, -3, True, 2.5, "8"])
def test_a_bad_pending_bound_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"max_pending.*an integer >= 2"):
        DeviceTimer(FakeDevice().event, max_pending=bad)  # type: ignore[arg-type]


def _serving(device: str) -> Serving:
    """The benchmark's workload, small: 3 requests of 8 tokens on the tiny model."""
    return serving(
        tiny_model(device),
        requests=3,
        max_new_tokens=8,
        block_size=4,
        page_size=4,
        algorithm="LowConfidence",
        device=torch.device(device),
    )


def test_the_runner_times_each_forward_on_the_attached_timer() -> None:
    """Attached, the runner brackets every forward's model call with a pair of events and
    reports their sum as `device_forward_seconds`; without one (a CPU device) that is the
    host's wall time in forwards."""
    from gpu.bench import MODES, run_once

    shipped = _serving("cpu")
    (mode,) = [m for m in MODES if m.name == "fdfo"]
    plain = run_once(shipped, mode, 2)
    assert plain.device_forward_seconds == plain.forward_seconds > 0
    assert plain.profile_ms()["device_forward"] == pytest.approx(
        plain.profile_ms()["model"] + plain.profile_ms()["attention"]
    )

    device = FakeDevice()
    engine = shipped.engine(mode, 2)
    timer = DeviceTimer(device.event)
    engine.runner.device_timer = timer
    real_forward = engine.model.forward_blocks

    def forward_taking_a_millisecond(*args: object, **kwargs: object) -> torch.Tensor:
        device.now_ms += 1.0
        return real_forward(*args, **kwargs)  # type: ignore[arg-type]

    engine.model.forward_blocks = forward_taking_a_millisecond  # type: ignore[method-assign]
    engine.drain()
    assert timer.timed == engine.runner.forwards > 0
    assert engine.runner.device_forward_seconds == pytest.approx(engine.runner.forwards * 1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_device_benchmark_times_forwards_with_cuda_events() -> None:
    """On CUDA the benchmark attaches a timer to every engine: each forward is timed, and the
    device time is positive and within the run's wall time."""
    from gpu.bench import MODES, run_once

    shipped = _serving("cuda")
    for mode in MODES:
        run = run_once(shipped, mode, 2)
        assert 0 < run.device_forward_seconds <= run.seconds, mode.name
        assert shipped.engine(mode, 2).runner.device_timer is not None
