"""Engine throughput: sync vs FDFO vs FDFO + in-place reuse vs + re-loop (`schedspec bench engine`).

    schedspec bench engine --max-running 1 4 16 [--requests 128] [--max-new-tokens 32]
        [--block-size 8] [--page-size 16] [--algorithm LowConfidence] [--repeats 5]
        [--device cpu|cuda] [--threads N] [--turn-ms 50] [--sequential] [--rows-released]
        [--json PATH]
    schedspec bench engine --forward-costs [--json PATH]  (model cost by rows x context; round cost)
    schedspec bench engine --forward-bound [--max-running 4 16] [--repeats 5] [--json PATH]
        (FDFO/sync of forward time alone, step and scheduler left out, --repeats passes;
        gpu/forward_bound.py)

For every max-running value and every mode the shipped model serves the shipped prompt set
(cycled to `--requests` requests, all submitted at once: the default 128 is four passes over the
32 prompts, enough that at max-running 16 the drain at the end is a small part of the run) until
drained; output tokens per second counts the generated tokens of every finished request (cut at
max_new_tokens and EOS) over the wall time of its rounds.

Measurement (this runs on shared machines): by default the four modes of one max-running value
run at once, one engine each, taking turns, and each mode is charged the time of its own rounds
— a change in the machine's load hits every mode alike, so the ratios are paired
(`--sequential` runs the modes one after another instead). A turn is a time slice: an engine
runs whole rounds until `--turn-ms` (default 50) of its time have passed. Each switch to another
engine costs the next rounds a refill of the CPU caches (each engine has its own KV pool and
activations); with one round per turn (`--turn-ms 0`) FDFO, whose rounds are one forward each,
paid that refill on every forward while sync paid it once per several forwards — a cost a
server running one engine never pays. With time slices every mode switches equally often per
second of its own time, so the refill is the same small share for all. The whole measurement
is repeated `--repeats` times; the table shows the median run, and the ratios are the median
over repeats of the per-repeat (paired) ratios. With more than one repeat each timed ratio is
printed with the lowest and highest of its per-repeat ratios (`ratio_ranges` in the JSON), so a
goal read on the median shows how firmly it is met or missed.
"cpu" ratios use the thread's CPU time (meaningful with `--threads 1`); "work" ratios compare
the model work (row-forwards per generated token) and involve no timing at all; they count
every row alike, though a row costs more the longer its context (`--forward-bound` times the
forwards themselves).

`--rows-released` adds a fifth mode, `fdfo+rows-released`: FDFO without in-place reuse whose
carried blocks also give back their request-pool rows between rounds, as SGLang's FDFO did
before in-place reuse (#27877), whose reported gain is over that baseline; the report then adds
its ratio over sync and in-place reuse's gain over it.

Per mode the time is also split into model forwards, the algorithm's steps and the rest
(scheduler: admission, allocation, events, commits), so a missed target can be explained.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from gpu.algorithms import ALGORITHMS, make_algorithm
from gpu.device_name import device_name
from gpu.device_timer import device_timer_for
from gpu.engine import FORWARD_LOG_CAP, DllmEngine, resolve_device, wait_for_device
from gpu.model import BlockDiffusionLM
from gpu.parity import engine_config
from gpu.prompts import ASSETS, block_context, load_prompts
from gpu.tokenizer import TOKENIZER
from spec.batch_parity import MODE_VARIANTS, ModeVariant
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError
from spec.events import Event


@dataclass(frozen=True, slots=True)
class BenchMode(ModeVariant):
    """A mode the benchmark serves: a parity variant, or with `rows_released` FDFO without
    in-place reuse whose carried blocks also give back their request-pool rows between rounds
    (`DllmEngine(rows_released_between_rounds=True)`)."""

    rows_released: bool = False


# The benchmark runs the parity run's four modes (one definition for both) ...
MODES: tuple[BenchMode, ...] = tuple(
    BenchMode(v.name, v.mode, v.in_place_reuse, v.reloop) for v in MODE_VARIANTS
)
# ... and, with `--rows-released`, SGLang's FDFO before in-place reuse (#27877): each round
# freed an unfinished block's KV slots and its request-pool row, and allocated both again.
ROWS_RELEASED = BenchMode("fdfo+rows-released", Mode.FDFO, False, False, rows_released=True)

RATIOS: tuple[tuple[str, str], ...] = (
    ("fdfo", "sync"),
    ("fdfo+reuse", "sync"),
    ("fdfo+reuse+reloop", "sync"),
    ("fdfo+reuse", "fdfo"),
    ("fdfo+reuse+reloop", "fdfo+reuse"),
)
# With ROWS_RELEASED: its ratio over sync, and in-place reuse's gain over it (the gain SGLang
# reported for #27877 is over that baseline).
ROWS_RELEASED_RATIOS: tuple[tuple[str, str], ...] = (
    ("fdfo+rows-released", "sync"),
    ("fdfo+reuse", "fdfo+rows-released"),
)


@dataclass(frozen=True, slots=True)
class BenchRun:
    """One mode served to drain at one max-running value in one repeat: counts and seconds."""

    max_running: int
    mode: str
    tokens: int
    seconds: float
    forwards: int
    rounds: int
    forward_seconds: float  # host wall time in forwards (on CUDA: queuing their kernels)
    step_seconds: float
    # CPU time of the drain: the process's (`run_once`), the calling thread's in its turns
    # (`run_interleaved`); with one torch thread, time actually computing
    cpu_seconds: float
    kv_seconds: float  # allocating / freeing block KV slots and writing the table
    row_forwards: int  # blocks run through the model, summed over forwards (the work done)
    attention_seconds: float = 0.0  # the part of forward_seconds spent in attention
    row_rounds: int = 0  # rows (running requests) summed over rounds: per-row round work
    block_allocations: int = 0  # block KV allocations (new blocks, re-allocated carries)
    # per forward its distinct context lengths (one attention call per layer each), summed
    attention_groups: int = 0
    repeat: int = 0
    # the forwards' device time (`ModelRunner.device_forward_seconds`): their span on the
    # stream from CUDA events on CUDA, `forward_seconds` on a CPU device; what the "forward"
    # clock's ratios and the shares of the forward-time ratio read
    device_forward_seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per wall-clock second, `seconds` (0.0 when `seconds` is 0)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_cpu_s(self) -> float:
        """Generated tokens per CPU second, `cpu_seconds` (0.0 when `cpu_seconds` is 0)."""
        return self.tokens / self.cpu_seconds if self.cpu_seconds > 0 else 0.0

    @property
    def attention_calls_per_forward(self) -> float:
        """Attention calls per layer in a forward (its distinct context lengths), averaged."""
        return self.attention_groups / self.forwards if self.forwards else 0.0

    def profile_ms(self) -> dict[str, float]:
        """Wall ms per forward: model (forward minus attention), attention, step, scheduler
        (the rest of the rounds: admission, allocation, batching, events, commits), their
        total; and, not a part of that total, the forward's device time (on a CPU device,
        model + attention; on CUDA its span on the stream from events, while the wall parts
        count the wait for the device in the step, whose read-back of the done flags
        waits)."""
        n = max(self.forwards, 1)
        return {
            "model": 1000 * (self.forward_seconds - self.attention_seconds) / n,
            "attention": 1000 * self.attention_seconds / n,
            "step": 1000 * self.step_seconds / n,
            "scheduler": 1000 * (self.seconds - self.forward_seconds - self.step_seconds) / n,
            "total": 1000 * self.seconds / n,
            "device_forward": 1000 * self.device_forward_seconds / n,
        }


def bench_config(
    mode: ModeVariant, max_running: int, block_size: int, page_size: int, max_context: int
) -> DllmConfig:
    """Room for every running request's worst case (admission is bounded by max_running)."""
    return engine_config(block_size, page_size, max_context, mode, max_running)


def _noop(event: Event) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Serving:
    """What every run of the benchmark serves, and on what: the model and algorithm, the
    requests (all submitted at once), the block and page sizes, and the context that holds the
    longest request (see `serving`)."""

    model: BlockDiffusionLM
    algorithm: str
    requests: tuple[RequestSpec, ...]
    block_size: int
    page_size: int
    max_context: int
    device: torch.device

    def engine(
        self,
        mode: ModeVariant,
        max_running: int,
        *,
        record: bool = False,
        forward_log_cap: int = FORWARD_LOG_CAP,
    ) -> DllmEngine:
        """An engine of `mode` (a `BenchMode`'s `rows_released` included) with `max_running`
        seats, events dropped, every request submitted and no round run yet."""
        config = bench_config(mode, max_running, self.block_size, self.page_size, self.max_context)
        engine = DllmEngine(
            config,
            _noop,
            model=self.model,
            algorithm=make_algorithm(self.algorithm),
            device=self.device,
            record=record,
            forward_log_cap=forward_log_cap,
            rows_released_between_rounds=isinstance(mode, BenchMode) and mode.rows_released,
        )
        # on CUDA the forwards' span on the device's stream, not the time to queue them
        engine.runner.device_timer = device_timer_for(self.device)
        for req in self.requests:
            engine.submit(req)
        return engine


def run_once(serving: Serving, mode: ModeVariant, max_running: int) -> BenchRun:
    """One mode served alone, start to drain."""
    device = serving.device
    engine = serving.engine(mode, max_running)
    wait_for_device(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    engine.drain()
    wait_for_device(device)
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    snap = engine.snapshot()
    if snap.leaked_slots() or snap.held_rows():
        raise RuntimeError(f"bench run leaked {snap.leaked_slots()} slots")
    return BenchRun(
        max_running=max_running,
        mode=mode.name,
        tokens=sum(len(o) for o in engine.outputs.values()),
        seconds=seconds,
        forwards=engine.runner.forwards,
        rounds=engine.round_index,
        forward_seconds=engine.runner.forward_seconds,
        step_seconds=engine.step_seconds,
        cpu_seconds=cpu_seconds,
        kv_seconds=engine.kv_seconds,
        row_forwards=engine.rows_forwarded,
        attention_seconds=engine.runner.attention_seconds,
        row_rounds=engine.row_rounds,
        block_allocations=engine.blocks_allocated,
        device_forward_seconds=engine.runner.device_forward_seconds,
        attention_groups=engine.runner.attention_groups,
    )


def check_same_outputs(modes: tuple[BenchMode, ...], engines: list[DllmEngine]) -> None:
    """`RuntimeError` unless every mode decoded every request it still holds alike: ratios of
    modes that served different tokens would compare different work (the engine's rows are
    batch-invariant, so they must agree; `schedspec parity` says where they do not)."""
    first = engines[0].outputs
    for mode, engine in zip(modes[1:], engines[1:], strict=True):
        common = first.keys() & engine.outputs.keys()
        differ = sorted(rid for rid in common if first[rid] != engine.outputs[rid])
        if differ or (not common and (first or engine.outputs)):
            raise RuntimeError(
                f"bench: {mode.name} decoded {len(differ)} of {len(common)} requests otherwise "
                f"than {modes[0].name} (first {differ[:3]}): the modes must serve the same "
                "tokens for their ratios to compare like with like; check the device's batch "
                "invariance with `schedspec parity`"
            )


def run_interleaved(
    serving: Serving,
    max_running: int,
    turn_seconds: float = 0.05,
    modes: tuple[BenchMode, ...] = MODES,
) -> list[BenchRun]:
    """All `modes` at once, one engine each, taking turns; each mode is charged the time of
    its own rounds, so a change in the machine's load hits every mode alike (paired ratios).
    A turn runs whole rounds until `turn_seconds` of the engine's wall time have passed (at
    least one round; 0: one round per turn), so every mode switches engines, and pays the
    cache refill that follows, about equally often per second of its own time (a turn ends
    only after a whole round, and sync's rounds are longer, so its turns run longer). What an
    engine still has to do once the others are idle it runs alone, unpaired: sync's last
    rounds, mostly. `run_bench` rotates which mode takes the first turn of each cycle from
    repeat to repeat. Every mode must decode the same tokens (`check_same_outputs`)."""
    device = serving.device
    engines = [serving.engine(mode, max_running) for mode in modes]
    wall = [0.0] * len(engines)
    cpu = [0.0] * len(engines)
    while not all(e.is_idle() for e in engines):
        for i, engine in enumerate(engines):
            t0, c0 = time.perf_counter(), time.thread_time()
            while not engine.is_idle():
                engine.run_round()
                wait_for_device(device)
                if time.perf_counter() - t0 >= turn_seconds:
                    break
            wall[i] += time.perf_counter() - t0
            cpu[i] += time.thread_time() - c0
    check_same_outputs(modes, engines)
    runs = []
    for i, (mode, engine) in enumerate(zip(modes, engines, strict=True)):
        snap = engine.snapshot()
        if snap.leaked_slots() or snap.held_rows():
            raise RuntimeError(f"bench run {mode.name} leaked {snap.leaked_slots()} slots")
        runs.append(
            BenchRun(
                max_running=max_running,
                mode=mode.name,
                tokens=sum(len(o) for o in engine.outputs.values()),
                seconds=wall[i],
                forwards=engine.runner.forwards,
                rounds=engine.round_index,
                forward_seconds=engine.runner.forward_seconds,
                step_seconds=engine.step_seconds,
                cpu_seconds=cpu[i],
                kv_seconds=engine.kv_seconds,
                row_forwards=engine.rows_forwarded,
                attention_seconds=engine.runner.attention_seconds,
                row_rounds=engine.row_rounds,
                block_allocations=engine.blocks_allocated,
                attention_groups=engine.runner.attention_groups,
                device_forward_seconds=engine.runner.device_forward_seconds,
            )
        )
    return runs


@dataclass(slots=True)
class BenchReport:
    """Every `BenchRun` of a benchmark with its device and settings; medians and ratios."""

    device: str
    settings: dict[str, Any]
    runs: list[BenchRun]
    device_label: str = ""
    modes: tuple[BenchMode, ...] = MODES

    @property
    def ratio_pairs(self) -> tuple[tuple[str, str], ...]:
        """The (numerator, denominator) modes of every ratio: `RATIOS`, and with
        `ROWS_RELEASED` among the modes `ROWS_RELEASED_RATIOS` too."""
        return RATIOS + (ROWS_RELEASED_RATIOS if ROWS_RELEASED in self.modes else ())

    def of(self, max_running: int, mode: str) -> list[BenchRun]:
        """The runs of `mode` at `max_running`, one per repeat, in the order they ran."""
        return [r for r in self.runs if r.max_running == max_running and r.mode == mode]

    def best(self, max_running: int, mode: str) -> BenchRun:
        """The run of `mode` at `max_running` with the highest wall-clock throughput."""
        return max(self.of(max_running, mode), key=lambda r: r.tokens_per_s)

    def median_run(self, max_running: int, mode: str) -> BenchRun:
        """The run with the median wall-clock throughput (the lower middle for even counts)."""
        runs = sorted(self.of(max_running, mode), key=lambda r: r.tokens_per_s)
        return runs[(len(runs) - 1) // 2]

    def median_cpu(self, max_running: int, mode: str) -> float:
        """The median over repeats of `tokens_per_cpu_s` of `mode` at `max_running`."""
        return statistics.median(r.tokens_per_cpu_s for r in self.of(max_running, mode))

    def max_running_values(self) -> list[int]:
        """The distinct max-running values measured, ascending."""
        return sorted({r.max_running for r in self.runs})

    def ratios(self, clock: str = "wall") -> dict[str, dict[str, float]]:
        """num/den throughput per max-running value.

        "wall" / "cpu" / "forward" (tokens per second of forward time alone): the median over
        repeats of the paired ratio (both modes measured back to back in the same repeat, so
        slow drifts of the machine's load cancel); "work": the inverse ratio of row-forwards per
        token, the model work each mode needed (no timing)."""
        rate = _RATES[clock]
        out: dict[str, dict[str, float]] = {}
        for num, den in self.ratio_pairs:
            by_m: dict[str, float] = {}
            for m in self.max_running_values():
                if clock == "work":
                    x = rate(self.of(m, num)[0]) / rate(self.of(m, den)[0])
                else:
                    x = statistics.median(self._paired(m, num, den, _rate_ratio(rate)))
                by_m[str(m)] = round(x, 3)
            out[f"{num}/{den}"] = by_m
        return out

    def ratio_ranges(self, clock: str = "wall") -> dict[str, dict[str, tuple[float, float]]]:
        """The lowest and highest paired ratio over the repeats, per ratio and max-running
        value, for a timed clock ("wall", "cpu" or "forward"): how far a single repeat strays
        from the median `ratios(clock)` reports, i.e. how firmly a goal is met or missed."""
        if clock == "work":
            raise ValueError("the work ratio is counted, not timed: it has no spread")
        rate = _RATES[clock]
        out: dict[str, dict[str, tuple[float, float]]] = {}
        for num, den in self.ratio_pairs:
            by_m: dict[str, tuple[float, float]] = {}
            for m in self.max_running_values():
                xs = self._paired(m, num, den, _rate_ratio(rate))
                by_m[str(m)] = (round(min(xs), 3), round(max(xs), 3))
            out[f"{num}/{den}"] = by_m
        return out

    def _paired(
        self, max_running: int, num: str, den: str, pair: Callable[[BenchRun, BenchRun], float]
    ) -> list[float]:
        """`pair(num's run, den's run of the same repeat)` for every repeat both ran."""
        dens = {r.repeat: r for r in self.of(max_running, den)}
        return [pair(r, dens[r.repeat]) for r in self.of(max_running, num) if r.repeat in dens]

    def shares_of_bounds(self) -> dict[str, dict[str, dict[str, float]]]:
        """How close each FDFO variant comes to what its work allows, per max-running value.

        "of_work": the wall-clock ratio over sync (`ratios()`) as a share of the work ratio
        (row-forwards per token, which counts every row alike). "of_forward_time": the share
        of the forward-time ratio, i.e. FDFO's fraction of its wall time spent in forwards
        over sync's fraction, median over repeats of the pair measured back to back. It is
        what the step and the scheduler leave of the forwards' own ratio; a slow drift of
        the machine changes both modes' fractions alike, so it moves far less than the
        ratios themselves."""
        wall, work = self.ratios("wall"), self.ratios("work")
        out: dict[str, dict[str, dict[str, float]]] = {}
        for num, den in self.ratio_pairs:
            if den != "sync":
                continue  # a bound is a bound on FDFO over sync
            name = f"{num}/{den}"
            by_m: dict[str, dict[str, float]] = {}
            for m in self.max_running_values():
                in_forward = statistics.median(
                    self._paired(
                        m, num, den, lambda a, b: _forward_fraction(a) / _forward_fraction(b)
                    )
                )
                by_m[str(m)] = {
                    "of_work": round(wall[name][str(m)] / work[name][str(m)], 3),
                    "of_forward_time": round(in_forward, 3),
                }
            out[name] = by_m
        return out

    def to_json(self) -> dict[str, Any]:
        """The report as `--json` writes it (without `command` and `runs`, which `bench_main`
        adds): per max-running value and mode the median run's figures, rounded, then the
        ratios of every clock and `shares_of_bounds()`."""
        results = []
        for m in self.max_running_values():
            for mode in self.modes:
                r = self.median_run(m, mode.name)
                results.append(
                    {
                        "max_running": m,
                        "mode": mode.name,
                        "tokens_per_s": round(r.tokens_per_s, 1),
                        "best_tokens_per_s": round(self.best(m, mode.name).tokens_per_s, 1),
                        "tokens_per_cpu_s": round(self.median_cpu(m, mode.name), 1),
                        "tokens": r.tokens,
                        "seconds": round(r.seconds, 4),
                        "forwards": r.forwards,
                        "row_forwards": r.row_forwards,
                        "rounds": r.rounds,
                        "forward_seconds": round(r.forward_seconds, 4),
                        "device_forward_seconds": round(r.device_forward_seconds, 4),
                        "step_seconds": round(r.step_seconds, 4),
                        "kv_seconds": round(r.kv_seconds, 4),
                        "attention_seconds": round(r.attention_seconds, 4),
                        "row_rounds": r.row_rounds,
                        "block_allocations": r.block_allocations,
                        "attention_groups": r.attention_groups,
                        "profile_ms_per_forward": {
                            k: round(v, 3) for k, v in r.profile_ms().items()
                        },
                        "all_tokens_per_s": [
                            round(x.tokens_per_s, 1) for x in self.of(m, mode.name)
                        ],
                    }
                )
        return {
            "device": self.device,
            "device_name": self.device_label or self.device,
            "settings": self.settings,
            "results": results,
            "ratios": self.ratios(),
            "ratios_cpu": self.ratios("cpu"),
            "ratios_work": self.ratios("work"),
            "ratios_forward": self.ratios("forward"),
            "ratio_ranges": {clock: self.ratio_ranges(clock) for clock in _RANGED_CLOCKS},
            "shares_of_bounds": self.shares_of_bounds(),
        }


# tokens per second by each clock's reading of a run; "work" counts row-forwards, no timing
_RATES: dict[str, Callable[[BenchRun], float]] = {
    "wall": lambda r: r.tokens_per_s,
    "cpu": lambda r: r.tokens_per_cpu_s,
    "forward": lambda r: r.tokens / r.device_forward_seconds,
    "work": lambda r: r.tokens / r.row_forwards,
}
_RANGED_CLOCKS = ("wall", "cpu", "forward")


def _rate_ratio(rate: Callable[[BenchRun], float]) -> Callable[[BenchRun, BenchRun], float]:
    """The ratio of two runs' rates by one clock."""
    return lambda a, b: rate(a) / rate(b)


def _forward_fraction(run: BenchRun) -> float:
    """The share of the run's wall time spent in forwards (model and attention): their device
    time, as the "forward" clock's ratios read it (on a CPU device, their host wall time)."""
    return run.device_forward_seconds / run.seconds


def serving(
    model: BlockDiffusionLM,
    *,
    requests: int,
    max_new_tokens: int,
    block_size: int,
    page_size: int,
    algorithm: str,
    device: torch.device,
) -> Serving:
    """The benchmark's workload: the shipped prompts cycled to `requests` requests of
    `max_new_tokens`, on a context that holds the longest of them, rounded up to whole blocks;
    `ConfigError` when that is beyond the model's context."""
    texts = load_prompts()
    reqs = tuple(
        RequestSpec(f"q{i:04d}", tuple(TOKENIZER.encode(texts[i % len(texts)])), max_new_tokens)
        for i in range(requests)
    )
    max_context = block_context(
        [len(r.prompt) for r in reqs], max_new_tokens, block_size, model.config.max_context
    )
    return Serving(model, algorithm, reqs, block_size, page_size, max_context, device)


def _check_counts(requests: int, repeats: int, max_running: list[int]) -> None:
    if requests < 1 or repeats < 1 or not max_running or min(max_running) < 1:
        raise ConfigError("bench", (requests, repeats, max_running), "positive values")


def run_bench(
    max_running: list[int],
    *,
    requests: int = 128,
    max_new_tokens: int = 32,
    block_size: int = 8,
    page_size: int = 16,
    algorithm: str = "LowConfidence",
    repeats: int = 5,
    device: str = "cpu",
    model: BlockDiffusionLM | None = None,
    progress: bool = False,
    interleave: bool = True,
    turn_ms: float = 50.0,
    rows_released: bool = False,
) -> BenchReport:
    """Serve the `serving` workload in every mode (`MODES`, and `ROWS_RELEASED` with
    `rows_released`) at each of `max_running`, `repeats` times, after a warm-up run;
    interleaved in turns of `turn_ms` ms (`run_interleaved`) or, with `interleave=False`, one
    mode after another in a rotating order (`run_once`). `model` None loads the shipped one
    onto `device`; `progress` prints a line per run.

    Raises `ConfigError` for a non-positive count, `turn_ms` outside [0, 60000] or an unknown
    `algorithm`, `DeviceUnavailable` for an unusable `device`."""
    dev = resolve_device(device)
    if algorithm not in ALGORITHMS:
        make_algorithm(algorithm)  # UnknownAlgorithm, listing the valid names
    _check_counts(requests, repeats, max_running)
    if not 0 <= turn_ms <= 60_000:
        raise ConfigError("turn_ms", turn_ms, "milliseconds per turn in [0, 60000]")
    if model is None:
        from gpu.weights import load_model

        model, _ = load_model(ASSETS, dev)
    setup = serving(
        model, requests=requests, max_new_tokens=max_new_tokens, block_size=block_size,
        page_size=page_size, algorithm=algorithm, device=dev,
    )  # fmt: skip
    modes = MODES + ((ROWS_RELEASED,) if rows_released else ())
    # warm-up (allocator paths, kernels)
    run_once(replace(setup, requests=setup.requests[:4]), MODES[2], max(max_running))
    runs: list[BenchRun] = []
    for rep in range(repeats):
        # each repeat starts with another mode: the engine that takes the first turn of every
        # cycle rotates, rather than always being sync's
        order = tuple(modes[(k + rep) % len(modes)] for k in range(len(modes)))
        for m in max_running:
            if interleave:
                batch = run_interleaved(setup, m, turn_ms / 1000, order)
            else:
                # the modes of one max-running value run back to back, in a rotating order
                batch = [run_once(setup, mode, m) for mode in order]
            for run in batch:
                runs.append(replace(run, repeat=rep))
                if progress:
                    print(
                        f"  [{rep + 1}/{repeats}] max_running={m:<3} {run.mode:<19} "
                        f"{run.tokens_per_s:9.1f} tok/s ({run.seconds:.2f}s)",
                        flush=True,
                    )
    settings = {
        "requests": requests,
        "max_new_tokens": max_new_tokens,
        "block_size": block_size,
        "page_size": page_size,
        "algorithm": algorithm,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "method": f"interleaved, turns of {turn_ms:g} ms" if interleave else "sequential runs",
        "turn_ms": turn_ms if interleave else None,
        "rows_released": rows_released,
        "product_rows": model.product_rows(),  # small products' padding (gpu.gemm_rows)
    }
    return BenchReport(str(dev), settings, runs, device_name(dev), modes)


def _print(report: BenchReport) -> None:
    print(f"device: {report.device_label or report.device}  (tok/s: generated tokens per second)")
    print(
        f"{'max_running':>11}  {'mode':<19}{'tok/s':>8}{'best':>8}{'tok/cpu-s':>10}{'tokens':>7}"
        f"{'seconds':>8}{'fwd':>5}{'row-fwd':>8}{'model%':>7}{'step%':>6}{'kv%':>5}{'other%':>7}"
    )
    for m in report.max_running_values():
        for mode in report.modes:
            r = report.median_run(m, mode.name)
            fwd = 100 * r.forward_seconds / r.seconds
            step = 100 * r.step_seconds / r.seconds
            kv = 100 * r.kv_seconds / r.seconds
            print(
                f"{m:>11}  {mode.name:<19}{r.tokens_per_s:>8.1f}"
                f"{report.best(m, mode.name).tokens_per_s:>8.1f}"
                f"{report.median_cpu(m, mode.name):>10.1f}{r.tokens:>7}{r.seconds:>8.3f}"
                f"{r.forwards:>5}{r.row_forwards:>8}{fwd:>6.0f}%{step:>5.0f}%{kv:>4.1f}%"
                f"{100 - fwd - step - kv:>6.0f}%"
            )
    print(
        "\nprofile, wall ms per forward (median run): model | attention | step | scheduler;"
        " then the forward's device ms (on CUDA its span on the stream; not a part of the"
        " total); attention calls per layer per forward"
    )
    for m in report.max_running_values():
        for mode in report.modes:
            run = report.median_run(m, mode.name)
            prof = run.profile_ms()
            print(
                f"{m:>11}  {mode.name:<19}{prof['model']:>8.3f}{prof['attention']:>8.3f}"
                f"{prof['step']:>8.3f}{prof['scheduler']:>8.3f}   total {prof['total']:.3f}"
                f"   device {prof['device_forward']:.3f}"
                f"   attention calls {run.attention_calls_per_forward:.1f}"
            )
    labels = {
        "wall": "median paired, wall clock",
        "cpu": "median paired, CPU time",
        "forward": "median paired, forward time alone",
        "work": "model work: row-forwards per token",
    }
    repeats = len(report.of(report.runs[0].max_running, report.runs[0].mode))
    for clock, label in labels.items():
        ranged = clock in _RANGED_CLOCKS and repeats > 1
        print(f"\nratios ({label}{'; [lowest-highest repeat]' if ranged else ''})")
        ranges = report.ratio_ranges(clock) if ranged else {}
        for name, by_m in report.ratios(clock).items():
            cells = []
            for seats, v in by_m.items():
                lo, hi = ranges[name][seats] if ranged else (0.0, 0.0)
                spread = f" [{lo:.2f}-{hi:.2f}]" if ranged else ""
                cells.append(f"@{seats}: {v:.2f}x{spread}")
            print(f"  {name:<37}" + "  ".join(cells))
    print("\nshare of the bounds (wall-clock ratio / work ratio, / forward-time ratio)")
    for name, shares in report.shares_of_bounds().items():
        print(
            f"  {name:<37}"
            + "  ".join(
                f"@{m}: {100 * share['of_work']:.1f}% / {100 * share['of_forward_time']:.1f}%"
                for m, share in shares.items()
            )
        )


# --forward-costs' timing: the best of COST_SAMPLES samples, each the mean of that many calls
COST_SAMPLES = 5
FORWARD_CALLS = 20
ATTENTION_CALLS = 50
ROUND_CALLS = 30


def forward_costs(
    model: BlockDiffusionLM, block_size: int, rows: tuple[int, ...], starts: tuple[int, ...]
) -> dict[tuple[int, int], float]:
    """CPU ms per `forward_blocks` for `rows` blocks all starting at `starts` (best of
    COST_SAMPLES means of FORWARD_CALLS calls)."""
    from gpu.kv_cache import PagedKvCache

    cfg = model.config
    width = max(starts) + block_size
    n_rows = max(rows)
    kv = PagedKvCache(cfg.n_layers, cfg.n_heads, cfg.head_dim, n_rows * width)
    table = torch.arange(n_rows * width, dtype=torch.int32).view(n_rows, width)
    gen = torch.Generator().manual_seed(0)
    out: dict[tuple[int, int], float] = {}
    for b in rows:
        tokens = torch.randint(3, cfg.vocab_size, (b, block_size), generator=gen)
        row_idx = torch.arange(b)
        for start in starts:
            pos = torch.full((b,), start)
            best = float("inf")
            with torch.inference_mode():
                for _ in range(COST_SAMPLES):
                    t0 = time.process_time()
                    for _ in range(FORWARD_CALLS):
                        model.forward_blocks(tokens, pos, row_idx, kv, table)
                    best = min(best, (time.process_time() - t0) / FORWARD_CALLS)
            out[(b, start)] = 1000 * best
    return out


def attention_costs(model: BlockDiffusionLM, block_size: int = 8) -> dict[str, float]:
    """CPU us per layer of attention (KV gather + attention) for 16 rows of contexts 8..64 in 8
    distinct lengths, three ways: `padded` (every row padded to the longest context and masked,
    the engine before ragged attention), `grouped` (the plan's packed keys, one attention per
    distinct length: `ragged_attention`) and `per_row` (one attention per row). Best of
    COST_SAMPLES means of ATTENTION_CALLS calls."""
    from gpu.kv_cache import PagedKvCache
    from gpu.model import ragged_attention

    cfg = model.config
    heads, head_dim = cfg.n_heads, cfg.head_dim
    lengths = [8 * (1 + i // 2) for i in range(16)]  # 8, 8, 16, 16, ..., 64, 64
    b, longest = len(lengths), max(lengths)
    gen = torch.Generator().manual_seed(0)
    kv = PagedKvCache(1, heads, head_dim, b * longest)
    kv.k[0].normal_(generator=gen)
    kv.v[0].normal_(generator=gen)
    table = torch.randperm(b * longest, generator=gen).to(torch.int32).view(b, longest)
    q = torch.randn(b, block_size, heads, head_dim, generator=gen)
    starts = [n - block_size for n in lengths]
    plan = model.plan_blocks(starts, list(range(b)), block_size, table)
    ctx_len = torch.tensor(lengths)
    valid = torch.arange(longest)[None, :] < ctx_len[:, None]
    padded_slots = torch.where(valid, table.long(), torch.zeros_like(table, dtype=torch.long))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def padded() -> None:
        k, v = kv.read(0, padded_slots)
        v = torch.where(valid[:, :, None, None], v, torch.zeros_like(v))
        allowed = valid[:, None, None, :].expand(b, 1, block_size, longest)
        sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed)

    def grouped() -> None:
        k, v = kv.read(0, plan.ctx_slots)
        ragged_attention(q, k, v, plan)

    def per_row() -> None:
        for i, n in enumerate(lengths):
            k, v = kv.read(0, table[i, :n].long())
            sdpa(q[i : i + 1].transpose(1, 2), k[None].transpose(1, 2), v[None].transpose(1, 2))

    out: dict[str, float] = {}
    with torch.inference_mode():
        for name, fn in (("padded", padded), ("grouped", grouped), ("per_row", per_row)):
            fn()
            best = float("inf")
            for _ in range(COST_SAMPLES):
                t0 = time.process_time()
                for _ in range(ATTENTION_CALLS):
                    fn()
                best = min(best, (time.process_time() - t0) / ATTENTION_CALLS)
            out[name] = 1e6 * best
    return out


def round_cost(model: BlockDiffusionLM) -> float:
    """CPU ms per FDFO round of 4 rows of block 4 (LowConfidence): the conformance suite's
    typical round, used to choose the model of `make_small_engine` (bound: 5 ms). Best of 3
    means of ROUND_CALLS rounds."""
    config = DllmConfig(block_size=4, page_size=4, kv_pages=64, max_context=64)
    best = float("inf")
    for _ in range(3):
        engine = DllmEngine(
            config, _noop, model=model, algorithm=make_algorithm("LowConfidence"), record=False
        )
        for i in range(4):
            engine.submit(RequestSpec(f"r{i}", tuple(range(3, 11)), 40))
        engine.run_round()
        t0 = time.process_time()
        for _ in range(ROUND_CALLS):
            engine.run_round()
        best = min(best, (time.process_time() - t0) / ROUND_CALLS)
    return 1000 * best


FORWARD_COST_ROWS = (1, 4, 16)
FORWARD_COST_STARTS = (0, 24, 48)


def forward_cost_report(block_size: int) -> dict[str, Any]:
    """`--forward-costs`: the shipped model's CPU forward cost by rows x context start, its
    attention variants per layer and the conformance round cost (shipped and tiny model)."""
    from gpu.engine import _shipped_model, tiny_model

    shipped = _shipped_model("cpu")
    costs = forward_costs(shipped, block_size, FORWARD_COST_ROWS, FORWARD_COST_STARTS)
    return {
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "block_size": block_size,
        "timing": {
            "samples": COST_SAMPLES,
            "forward_calls": FORWARD_CALLS,
            "attention_calls": ATTENTION_CALLS,
            "round_calls": ROUND_CALLS,
        },
        "forward_ms": [
            {"rows": b, "start": start, "ms": costs[(b, start)]}
            for b in FORWARD_COST_ROWS
            for start in FORWARD_COST_STARTS
        ],
        "attention_us_per_layer": attention_costs(shipped, block_size),
        "round_ms": {"shipped": round_cost(shipped), "tiny": round_cost(tiny_model())},
    }


def _print_costs(report: dict[str, Any]) -> None:
    timing = report["timing"]
    ms = {(c["rows"], c["start"]): c["ms"] for c in report["forward_ms"]}
    print(
        f"shipped model, CPU ms per forward (block {report['block_size']}), best of "
        f"{timing['samples']} x {timing['forward_calls']}:"
    )
    print("  rows  " + "".join(f"start={s:<6}" for s in FORWARD_COST_STARTS))
    for b in FORWARD_COST_ROWS:
        print(f"  {b:>4}  " + "".join(f"{ms[(b, s)]:<12.2f}" for s in FORWARD_COST_STARTS))
    print(
        "attention per layer, CPU us (16 rows, contexts 8..64 in 8 lengths, best of "
        f"{timing['samples']} x {timing['attention_calls']}): "
        + "  ".join(f"{k} {v:.0f}" for k, v in report["attention_us_per_layer"].items())
    )
    print(
        f"CPU ms per FDFO round, 4 rows of block 4 (LowConfidence), best of 3 x "
        f"{timing['round_calls']}:"
    )
    rounds = report["round_ms"]
    print(f"  shipped model {rounds['shipped']:.2f}   tiny_model {rounds['tiny']:.2f}")


def bench_main(args: list[str]) -> int:
    """`schedspec bench engine` (`args`: the flags after `engine`): the throughput benchmark,
    or with `--forward-costs` / `--forward-bound` the model-only probes; prints the tables and
    writes the report to `--json` when given. Returns 0; bad values raise `ConfigError`
    (`schedspec_cli.engine_cmds.bench_engine` checks the flags before calling this)."""
    p = argparse.ArgumentParser(prog="schedspec bench engine", description=__doc__.split("\n")[0])
    p.add_argument("--max-running", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--algorithm", default="LowConfidence", choices=tuple(ALGORITHMS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--json")
    p.add_argument("--turn-ms", type=int, default=50)
    p.add_argument(
        "--sequential",
        action="store_true",
        help="run the modes one after another instead of interleaving their rounds",
    )
    p.add_argument(
        "--rows-released",
        action="store_true",
        help="also serve FDFO whose carried blocks give back their KV and request-pool rows "
        "every round (SGLang's FDFO before in-place reuse), and print reuse's gain over it",
    )
    p.add_argument(
        "--forward-bound",
        action="store_true",
        help="replay sync's and FDFO's forwards without their schedulers and print the "
        "FDFO/sync ratio of forward time alone (step and scheduler left out)",
    )
    p.add_argument(
        "--forward-costs",
        action="store_true",
        help="only the model's forward cost by rows x context, its attention variants and the "
        "conformance round cost (printed; written with --json)",
    )
    ns = p.parse_args(args)
    if ns.threads:
        torch.set_num_threads(ns.threads)
    if ns.forward_costs:
        costs = forward_cost_report(ns.block_size)
        _print_costs(costs)
        if ns.json:
            write_json(ns.json, {"command": "schedspec bench engine " + " ".join(args), **costs})
        return 0
    if ns.forward_bound:
        return _forward_bound_main(ns, args)
    report = run_bench(
        ns.max_running,
        requests=ns.requests,
        max_new_tokens=ns.max_new_tokens,
        block_size=ns.block_size,
        page_size=ns.page_size,
        algorithm=ns.algorithm,
        repeats=ns.repeats,
        device=ns.device,
        progress=True,
        interleave=not ns.sequential,
        turn_ms=ns.turn_ms,
        rows_released=ns.rows_released,
    )
    _print(report)
    if ns.json:
        payload = report.to_json()
        payload["command"] = "schedspec bench engine " + " ".join(args)
        payload["runs"] = [asdict(r) for r in report.runs]
        write_json(ns.json, payload)
    return 0


def _forward_bound_main(ns: argparse.Namespace, args: list[str]) -> int:
    """`--forward-bound`: per max-running value, the counts and the paired forward-time ratio
    of `gpu.forward_bound`, printed and (with --json) written."""
    from gpu.forward_bound import forward_bound
    from gpu.weights import load_model

    dev = resolve_device(ns.device)
    _check_counts(ns.requests, ns.repeats, ns.max_running)
    model, _ = load_model(ASSETS, dev)
    setup = serving(
        model, requests=ns.requests, max_new_tokens=ns.max_new_tokens,
        block_size=ns.block_size, page_size=ns.page_size, algorithm=ns.algorithm, device=dev,
    )  # fmt: skip
    results = []
    print(f"device: {device_name(dev)}  (forwards replayed without step or scheduler)")
    print(
        f"{'max_running':>11}  {'forwards s/f':>13}{'row-fwd s/f':>14}{'keys s/f':>16}"
        f"{'rows':>7}{'keys':>7}{'forward time':>14}{'vs sync dropping done':>23}"
    )
    for m in ns.max_running:
        r = forward_bound(setup, m, passes=ns.repeats)
        results.append(r.to_json())
        print(
            f"{m:>11}  {r.sync.forwards:>6}/{r.fdfo.forwards:<6}"
            f"{r.sync.row_forwards:>7}/{r.fdfo.row_forwards:<6}"
            f"{r.sync.keys:>8}/{r.fdfo.keys:<7}{r.rows_ratio():>6.2f}x{r.keys_ratio():>6.2f}x"
            f"{r.ratio():>13.2f}x{r.busy_ratio():>22.2f}x"
        )
    print(
        "ratios are FDFO/sync per generated token: rows = row-forwards (the benchmark's work "
        "ratio), keys = attended context positions, forward time = the replay (each forward "
        "at its best time over --repeats passes); vs sync dropping done = the replay against "
        "sync's forwards without the rows done earlier in their round (sync forwards them, as "
        "SGLang's does)"
    )
    if ns.json:
        payload = {
            "command": "schedspec bench engine " + " ".join(args),
            "device": str(dev),
            "device_name": device_name(dev),
            "settings": {
                "requests": ns.requests,
                "max_new_tokens": ns.max_new_tokens,
                "block_size": ns.block_size,
                "page_size": ns.page_size,
                "algorithm": ns.algorithm,
                "passes": ns.repeats,
                "threads": torch.get_num_threads(),
            },
            "results": results,
        }
        write_json(ns.json, payload)
    return 0


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """`payload` as indented JSON at `path`, its folder created if missing."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def write_script_report(
    path: str | Path,
    script: str,
    argv: list[str] | None,
    threads: int,
    fields: dict[str, Any],
    device: str = "cpu",
) -> None:
    """A measurement script's JSON: the command as run (`script` and its arguments,
    `sys.argv[1:]` when `argv` is None), the device, torch's version and the torch threads,
    then `fields`."""
    args = sys.argv[1:] if argv is None else argv
    header = {
        "command": " ".join([script, *args]),
        "device": device,
        "torch": torch.__version__,
        "threads": threads,
    }
    write_json(path, {**header, **fields})
