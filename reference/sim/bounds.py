"""The ranges of the simulator's times and rates, in one place.

Simulated times are summed over up to billions of batches, and a result is a ratio of two
sums: a time of 1e308 s overflows to inf (and the ratio to nan or a division by zero), a time
of 1e-320 s makes a throughput of inf. The bounds below are far beyond any real engine (a
nanosecond to an hour per batch; one request in about twelve days to a billion a second), so
they refuse only input that would turn the results into inf or nan.
"""

from __future__ import annotations

import math

from reference.sim.errors import SimConfigError

MIN_BATCH_SECONDS = 1e-9
MAX_SECONDS = 3600.0
MIN_RATE = 1e-6
MAX_RATE = 1e9
# A request's prompt or output tokens at most: no KV pool the simulator takes holds more
# (`--kv-tokens` is at most 10**10), and sums over ten million such requests stay far inside
# int64 (a count past 2**63 wrapped round to a negative max_model_len).
MAX_REQUEST_TOKENS = 10**10

# The simulated clock is float64 seconds: at time t it resolves steps of ulp(t) <= t * 2**-52,
# and a batch that starts at t ends at the float nearest t + dt, off by up to ulp(t) / 2 (at
# t = 1e16 s a 0.5 s batch is lost entirely: 1e16 + 0.5 == 1e16). An arrival is therefore held
# to t <= smallest step * 2**(52 - CLOCK_RESOLUTION_BITS): up to there, every batch end is
# rounded by at most 2**-21 (about half a millionth) of the run's smallest time step, so a
# million batches in a row drift by at most half of one. For a 6 ms batch (a one-token decode
# of Llama-3-8B on an H100, the default time model) that is 2.6e7 s, about ten months.
CLOCK_RESOLUTION_BITS = 20


def latest_arrival(min_step: float) -> float:
    """The latest arrival time (seconds) of a run whose smallest time step is `min_step`
    seconds (`CLOCK_RESOLUTION_BITS`)."""
    return min_step * 2.0 ** (52 - CLOCK_RESOLUTION_BITS)


def seconds_text(positive: bool) -> str:
    """What a valid time is, for messages."""
    low = f"{MIN_BATCH_SECONDS:g}" if positive else "0"
    return f"seconds in [{low}, {MAX_SECONDS:g}]"


def rate_text() -> str:
    """What a valid rate is, for messages."""
    return f"a rate in [{MIN_RATE:g}, {MAX_RATE:g}] per second"


def in_seconds(value: float, positive: bool) -> bool:
    """Whether `value` is a modelled time: a batch or forward time (`positive`) is at least a
    nanosecond; an added cost (an overhead, a per-token coefficient) may be 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    low = MIN_BATCH_SECONDS if positive else 0.0
    return math.isfinite(value) and low <= value <= MAX_SECONDS


def check_seconds(field: str, value: float, positive: bool) -> None:
    """Raise `SimConfigError` naming `field` unless `value` is a modelled time (`in_seconds`)."""
    if not in_seconds(value, positive):
        raise SimConfigError(field, value, seconds_text(positive))


def in_rate(value: float) -> bool:
    """Whether `value` is a modelled rate (per second): a finite number, not a bool, from `MIN_RATE`
    to `MAX_RATE`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and MIN_RATE <= value <= MAX_RATE


def check_rate(field: str, value: float) -> None:
    """Raise `SimConfigError` naming `field` unless `value` is a modelled rate (`in_rate`)."""
    if not in_rate(value):
        raise SimConfigError(field, value, rate_text())
