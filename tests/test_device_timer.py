"""`gpu.device_timer.DeviceTimer`: the forwards' span on the device's stream from timing events.

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
from gpu.device_timer import DeviceTimer, device_timer_for
from gpu.engine import tiny_model
from spec.errors import ConfigError


class FakeDevice:
    """A device clock in milliseconds, and the events recorded on it."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.synchronized = 0  # events waited for
        self.streams: list[object] = []  # the stream each event was recorded on

    def stream_of(self, device: torch.device | None) -> object:
        return ("stream of", device)

    def timer(self, max_pending: int = 4096) -> DeviceTimer:
        return DeviceTimer(
            torch.device("cuda:1"), self.event, max_pending=max_pending, stream_of=self.stream_of
        )

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.at_ms: float | None = None
        self.done = False

    def record(self, stream: object = None) -> None:
        self.at_ms = self.device.now_ms
        self.device.streams.append(stream)

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
    timer = device.timer()
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
    # every event on the timer's device's stream, not the current device's
    assert device.streams == [("stream of", torch.device("cuda:1"))] * 6


def test_pending_pairs_are_bounded_and_nothing_is_lost() -> None:
    device = FakeDevice()
    timer = device.timer(max_pending=4)
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
        FakeDevice().timer(max_pending=bad)  # type: ignore[arg-type]


def test_a_timer_is_made_for_cuda_devices_only_and_touches_no_cuda_state() -> None:
    """The benchmark attaches `device_timer_for(its device)` to every engine: None on a CPU
    device (the host's time is the device's), one bound to the very CUDA device otherwise;
    making it calls nothing of CUDA (this runs where CUDA is absent)."""
    assert device_timer_for(torch.device("cpu")) is None
    timer = device_timer_for(torch.device("cuda:1"))
    assert isinstance(timer, DeviceTimer) and timer.device == torch.device("cuda:1")
    assert timer.pending == 0 and timer.timed == 0
    with pytest.raises(ConfigError, match="a CUDA device"):
        DeviceTimer(torch.device("cpu"))


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


def test_the_runner_times_each_forward_on_the_attached_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
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

    assert shipped.engine(mode, 2).runner.device_timer is None  # a CPU device
    device = FakeDevice()
    timer = device.timer()
    # the benchmark attaches what `device_timer_for` gives for its device (on CUDA, a timer)
    monkeypatch.setattr("gpu.bench.device_timer_for", lambda _device: timer)
    engine = shipped.engine(mode, 2)
    assert engine.runner.device_timer is timer
    real_forward = engine.model.forward_blocks

    def forward_taking_a_millisecond(*args: object, **kwargs: object) -> torch.Tensor:
        device.now_ms += 1.0
        return real_forward(*args, **kwargs)  # type: ignore[arg-type]

    engine.model.forward_blocks = forward_taking_a_millisecond  # type: ignore[method-assign]
    engine.drain()
    assert timer.timed == engine.runner.forwards > 0
    assert engine.runner.device_forward_seconds == pytest.approx(engine.runner.forwards * 1e-3)


def test_the_forward_clock_and_the_shares_read_the_device_time() -> None:
    """The "forward" clock's ratios and the shares of the forward-time ratio read each run's
    device time, not its host time in forwards (on CUDA, the time to queue the kernels):
    runs whose device times differ from their host times by a factor give ratios and shares
    that move by that factor."""
    from gpu.bench import BenchReport, BenchRun

    def run(mode: str, host: float, device: float) -> BenchRun:
        return BenchRun(
            max_running=2,
            mode=mode,
            tokens=100,
            seconds=1.0,
            forwards=10,
            rounds=10,
            forward_seconds=host,
            step_seconds=0.1,
            cpu_seconds=1.0,
            kv_seconds=0.0,
            row_forwards=20,
            device_forward_seconds=device,
        )

    modes = ("sync", "fdfo", "fdfo+reuse", "fdfo+reuse+reloop")
    # the host times alike; on the device FDFO's forwards take a quarter of sync's
    runs = [run(m, 0.5, 0.8 if m == "sync" else 0.2) for m in modes]
    report = BenchReport("cuda:0", {}, runs)
    assert report.ratios("forward")["fdfo/sync"]["2"] == pytest.approx(4.0)
    # the wall ratio is 1: FDFO kept a quarter of what its forwards allow
    shares = report.shares_of_bounds()["fdfo/sync"]["2"]
    assert shares["of_forward_time"] == pytest.approx(0.25)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_device_benchmark_times_forwards_with_cuda_events() -> None:
    """On CUDA the benchmark attaches a timer to every engine and every forward is timed
    between a pair of CUDA events, which read back after the run (no wall-clock bound is
    asserted: timings belong to the benchmark)."""
    from gpu.bench import MODES

    shipped = _serving("cuda")
    for mode in MODES:
        engine = shipped.engine(mode, 2)
        timer = engine.runner.device_timer
        assert isinstance(timer, DeviceTimer) and timer.device == shipped.device, mode.name
        engine.drain()
        assert timer.timed == engine.runner.forwards > 0, mode.name
        assert engine.runner.device_forward_seconds > 0, mode.name
        assert timer.pending == 0, mode.name
