"""dLLM serving in simulated time: sync vs FDFO (with and without in-place reuse).

The reference dLLM scheduler (`reference.dllm.ReferenceDllmScheduler`, or any
`spec.adapter` implementation) runs unchanged; a `ScriptedOracle` makes output block k of
request r take F(r, k) forwards. F comes either from i.i.d. draws of a `StepDist` (a user
histogram or the shipped model's measured one; every request has a one-block prompt and
gen_blocks output blocks) or, when `DllmParams.profiles` is set, from measured request profiles
(`reference.sim.dllm_profile`: each request's prompt length, per-block forwards and block count
as the engine served it, replayed in the benchmark's order or drawn whole per request). The
simulator reads the scheduler's events and charges time:

- each `Forward`: exec_model.batch_time(rows * block_size, 0, KV slots owned),
- each `KvAllocated`: alloc_cost (allocating a block: KV slots, request-pool row bookkeeping,
  req_to_token writes; FDFO without in-place reuse pays it again every round for every
  unfinished block),
- each round with at least one allocation: alloc_round_cost (the batched allocation path's
  fixed cost: kernel launches, building the round's req_to_token writes),
- each `ControlReturned`: round_overhead (the scheduler's own work per round) plus
  row_round_cost for every row (running request) the round's forwards held (the scheduler's
  per-request work: batching, events, commits).

The result counts what a calibrated time model charges (`reference.sim.calibration`): forwards,
row-forwards, rounds, row-rounds and allocations (one per `KvAllocated`: a new block, or a carried
block allocated again).

Ideal bound (derived in docs/results.md): with k seats always full and a forward cost that does
not depend on which rows are done, sync completes k blocks per E[max of k draws] forwards and
FDFO completes one block per E[F] forwards per seat, so

    throughput(FDFO) / throughput(sync) <= E[max(F_1..F_k)] / E[F].
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from reference.algorithms import ALGORITHMS
from reference.dllm import ReferenceDllmScheduler
from reference.oracle import ScriptedOracle
from reference.sim.bounds import check_seconds
from reference.sim.dllm_profile import ProfileWorkload, SimRequest
from reference.sim.errors import SimConfigError, reason_of
from reference.sim.exec_model import ExecModel, Linear
from reference.sim.workload import FloatArray
from spec.adapter import EventSink, ImplementationFactory, SchedulerAdapter
from spec.config import DllmConfig, Mode, RequestSpec
from spec.events import (
    ControlReturned,
    Event,
    Finished,
    Forward,
    KvAllocated,
    KvFreed,
    Submitted,
)
from spec.input_file import read_input_text
from spec.json_text import parse_json
from spec.machine import SpecMachine

ROUNDS_REPORT = Path(__file__).resolve().parents[2] / "gpu" / "assets" / "rounds_report.json"

# Forwards per block at most, as `StepDist.parse` takes them: a block of B tokens unmasks at
# least one token per forward, so it takes at most B + 1 forwards (the final-KV one included;
# `StepDist.clipped` caps every draw there), and `schedspec simulate dllm` runs blocks of at
# most 256 tokens (its MAX_SIM_BLOCK_SIZE). A larger F could never be drawn, and a bound keeps
# 'uniform:LO-HI' to at most 256 values (uniform:2-1000000000 was an allocation of ~70 GB).
MAX_FORWARDS_PER_BLOCK = 257
# what a step histogram's counts must be (nan, inf or a sum that overflows makes the
# probabilities nan)
COUNTS_TEXT = "counts that are finite numbers >= 0, with a positive and finite sum"


@dataclass(frozen=True)
class StepDist:
    """Forwards per output block (the final-KV forward included), as a discrete distribution."""

    values: tuple[int, ...]
    weights: tuple[float, ...]
    source: str = "user"

    def __post_init__(self) -> None:
        if not self.values or len(self.values) != len(self.weights):
            raise SimConfigError("steps", self.values, "at least one forward count")
        if any(v < 2 for v in self.values):
            raise SimConfigError(
                "steps",
                self.values,
                "forwards per block >= 2 (at least one unmasking forward plus the final-KV one)",
            )
        # nan and inf are refused too (nan < 0 is false), and so is a sum that overflows to inf
        # (1e308 + 1e308)
        if any(not (math.isfinite(w) and w >= 0) for w in self.weights):
            raise SimConfigError("steps", self.weights, COUNTS_TEXT)
        if not 0 < sum(self.weights) < math.inf:
            raise SimConfigError("steps", self.weights, COUNTS_TEXT)

    @classmethod
    def from_histogram(
        cls, hist: Mapping[int, float] | Mapping[str, float], source: str = "user"
    ) -> StepDist:
        """From {forwards: count}; keys may be strings (as JSON has them). A key or count that
        does not convert raises `ValueError` or `TypeError`, an invalid histogram
        `SimConfigError`."""
        items = sorted((int(k), float(v)) for k, v in hist.items())
        return cls(tuple(k for k, _ in items), tuple(v for _, v in items), source)

    @classmethod
    def parse(cls, text: str, max_forwards: int = MAX_FORWARDS_PER_BLOCK) -> StepDist:
        """'3:12,4:5,9:1' (forwards:count) or 'uniform:LO-HI' (`--steps`), every F in
        2..`max_forwards`. Anything else (another syntax, an F out of that range or given
        twice, a count that is negative or not finite, counts whose sum is 0 or overflows)
        raises `SimConfigError` naming the text, what is wrong with it and the valid forms."""
        forms = (
            f"--steps 'F:COUNT,F:COUNT,...' with each F from 2 to {max_forwards} (a block of B <= "
            f"{max_forwards - 1} tokens takes at most B + 1 forwards) and each COUNT a finite "
            f"number >= 0, their sum positive and finite; or 'uniform:LO-HI' with 2 <= LO <= HI "
            f"<= {max_forwards}"
        )
        try:
            if text.startswith("uniform:"):
                lo_text, _, hi_text = text[8:].partition("-")
                lo, hi = int(lo_text), int(hi_text)
                if not 2 <= lo <= hi <= max_forwards:
                    raise SimConfigError("steps", text, f"{forms} (this has LO {lo}, HI {hi})")
                return cls.uniform(lo, hi)
            pairs = [(int(f), float(c)) for f, c in (p.split(":") for p in text.split(","))]
        except SimConfigError:
            raise
        except ValueError:  # not integers and numbers in that syntax
            raise SimConfigError("steps", text, forms) from None
        hist: dict[int, float] = {}
        wrong = None
        for f, c in pairs:
            if f in hist:
                wrong = wrong or f"F {f} twice"
            hist[f] = c
        wrong = wrong or next((f"F {f}" for f in hist if not 2 <= f <= max_forwards), None)
        wrong = wrong or next(
            (f"COUNT {c}" for c in hist.values() if not (math.isfinite(c) and c >= 0)), None
        )
        total = sum(hist.values())
        if wrong is None and not 0 < total < math.inf:
            wrong = "counts summing to 0" if total == 0 else "counts whose sum overflows"
        if wrong is not None:
            raise SimConfigError("steps", text, f"{forms} (this has {wrong})")
        return cls.from_histogram(hist)

    @classmethod
    def uniform(cls, lo: int, hi: int) -> StepDist:
        """Equal weight on every forward count from `lo` to `hi` (both included); `SimConfigError`
        when `lo` < 2 or `hi` < `lo`."""
        return cls(
            tuple(range(lo, hi + 1)), tuple(1.0 for _ in range(lo, hi + 1)), f"uniform {lo}..{hi}"
        )

    @classmethod
    def from_report(cls, path: Path = ROUNDS_REPORT, algorithm: str = "LowConfidence") -> StepDist:
        """`algorithm`'s histogram in a rounds report (the schema of the shipped
        `gpu/assets/rounds_report.json`: {"block_size": B, "algorithm": {NAME: {"histogram":
        {F: COUNT}}}}). An unreadable file, another shape or an algorithm the report lacks
        raises `SimConfigError` naming what would be valid."""
        shape = '{"block_size": B, "algorithm": {NAME: {"histogram": {F: COUNT, ...}}}}'
        try:
            data = parse_json(read_input_text(path))
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise SimConfigError(
                "steps_report", str(path), f"a readable rounds report JSON ({reason_of(err)})"
            ) from None
        per_algorithm = data.get("algorithm") if isinstance(data, dict) else None
        block_size = data.get("block_size") if isinstance(data, dict) else None
        if not isinstance(per_algorithm, dict) or not isinstance(block_size, int):
            raise SimConfigError("steps_report", str(path), f"a rounds report: {shape}")
        if algorithm not in per_algorithm:
            raise SimConfigError(
                "algorithm", algorithm, f"one of the report's {sorted(per_algorithm)} ({path})"
            )
        entry = per_algorithm[algorithm]
        hist = entry.get("histogram") if isinstance(entry, dict) else None
        if not isinstance(hist, dict):
            raise SimConfigError("steps_report", str(path), f"a rounds report: {shape}")
        try:
            return cls.from_histogram(hist, f"{path.name}:{algorithm} (block {block_size})")
        except SimConfigError as err:
            raise SimConfigError(
                "steps_report",
                str(path),
                f"a histogram for {algorithm} with {err.valid}: {shape}",
            ) from None
        except (TypeError, ValueError):
            raise SimConfigError(
                "steps_report", str(path), f"a histogram of integer forwards to counts: {shape}"
            ) from None

    @classmethod
    def default(cls, block_size: int, algorithm: str = "LowConfidence") -> StepDist:
        """`algorithm`'s histogram in the shipped model's rounds report if the report is
        present and for this block size, else uniform over 2..block_size+1 forwards."""
        if algorithm not in ALGORITHMS:
            raise SimConfigError("algorithm", algorithm, f"one of {list(ALGORITHMS)}")
        if ROUNDS_REPORT.exists():
            try:
                data = json.loads(ROUNDS_REPORT.read_text())
                if int(data.get("block_size", -1)) == block_size:
                    return cls.from_report(ROUNDS_REPORT, algorithm)
            except (ValueError, KeyError, OSError):
                pass
        return cls.uniform(2, block_size + 1)

    @property
    def probs(self) -> FloatArray:
        """The weights normalised to sum to 1, in `values` order."""
        w: FloatArray = np.array(self.weights, dtype=np.float64)
        out: FloatArray = w / w.sum()
        return out

    def mean(self) -> float:
        """E[F]: the mean forwards per block."""
        return float(np.dot(self.values, self.probs))

    def expected_max(self, k: int) -> float:
        """E[max of k independent draws] = sum over x of P(max >= x)."""
        cdf = np.cumsum(self.probs)
        vals = self.values
        total = float(vals[0])  # max >= vals[0] always
        for i in range(1, len(vals)):
            total += (vals[i] - vals[i - 1]) * (1.0 - float(cdf[i - 1]) ** k)
        return total

    def ideal_ratio(self, k: int) -> float:
        """The bound on FDFO / sync throughput at `k` seats: E[max of k draws] / E[F]."""
        return self.expected_max(k) / self.mean()

    def draw(self, rng: np.random.Generator, n: int) -> list[int]:
        """`n` independent draws of forwards per block from `rng`."""
        return [int(v) for v in rng.choice(self.values, size=n, p=self.probs)]

    def clipped(self, block_size: int) -> StepDist:
        """Forwards per block are at most block_size + 1 (one mask per forward at worst)."""
        acc: dict[int, float] = {}
        for v, w in zip(self.values, self.weights, strict=True):
            acc[min(v, block_size + 1)] = acc.get(min(v, block_size + 1), 0.0) + w
        return StepDist.from_histogram(acc, self.source)


class DllmDriver(Protocol):
    """What the simulator drives: `properties.harness.Harness` fits, as does `DirectDriver`."""

    events: list[Event]

    def submit(self, request: RequestSpec) -> object:
        """Submit `request`; the simulator does not read the return value."""
        ...

    def round(self) -> None:
        """Run one scheduler round, appending its events to `events`."""
        ...


class DirectDriver:
    """Runs an implementation directly, optionally replaying its events through the spec."""

    def __init__(
        self, factory: ImplementationFactory, config: DllmConfig, check_spec: bool = False
    ) -> None:
        self.events: list[Event] = []
        self.spec: SpecMachine | None = SpecMachine(config) if check_spec else None
        self.impl: SchedulerAdapter = factory(config, self._sink)

    def _sink(self, e: Event) -> None:
        self.events.append(e)
        if self.spec is not None:
            self.spec.apply(e)

    def submit(self, request: RequestSpec) -> object:
        """Submit `request` to the implementation (a rejection's `RequestError` propagates); returns
        None."""
        self.impl.submit(request)
        return None

    def round(self) -> None:
        """Run one round of the implementation; its events land in `events` (applied to the spec too
        when `check_spec`)."""
        self.impl.run_round()


DriverFactory = Callable[[ImplementationFactory, DllmConfig], DllmDriver]


@dataclass(frozen=True)
class DllmParams:
    """One `simulate_dllm` run's settings: scheduler, workload, time model, costs (seconds)."""

    block_size: int = 8
    max_running: int = 4
    mode: Mode = Mode.FDFO
    in_place_reuse: bool = True
    reloop: bool = False
    num_requests: int = 64
    gen_blocks: int = 8
    forward: ExecModel = field(default_factory=lambda: Linear(0.020, 2e-5))
    round_overhead: float = 0.002
    row_round_cost: float = 0.0  # per row (running request) per round
    alloc_cost: float = 0.0001
    alloc_round_cost: float = 0.0015
    seed: int = 0
    arrival_interval: float = 0.0  # 0: all requests at t=0 (offline throughput, as GSM8K runs)
    # measured request profiles (replace the StepDist draws, the prompts and gen_blocks)
    profiles: ProfileWorkload | None = None
    profile_order: str = "cycle"  # "cycle": the benchmark's order; "sample": one draw each

    def __post_init__(self) -> None:
        # a cost beyond the bounds would sum to inf and make the ratios nan
        for name in ("round_overhead", "row_round_cost", "alloc_cost", "alloc_round_cost"):
            check_seconds(name, getattr(self, name), positive=False)
        if not (math.isfinite(self.arrival_interval) and self.arrival_interval >= 0):
            raise SimConfigError(
                "arrival_interval", self.arrival_interval, "a finite number of seconds >= 0"
            )

    def max_blocks(self) -> int:
        """Blocks per request at most (prompt blocks included)."""
        if self.profiles is not None:
            return self.profiles.max_blocks(self.block_size)
        return 1 + self.gen_blocks

    def requests(self, dist: StepDist, rng: np.random.Generator) -> list[SimRequest]:
        """The simulated requests: measured profiles, or i.i.d. draws behind a one-block
        prompt."""
        b, n = self.block_size, self.num_requests
        if self.profiles is not None:
            self.profiles.check(b)
            return self.profiles.requests(n, b, self.profile_order, rng)
        g = self.gen_blocks
        flat = dist.clipped(b).draw(rng, n * g)
        return [
            SimRequest(f"r{i}", b, g * b, tuple(flat[i * g : (i + 1) * g]), g * b) for i in range(n)
        ]

    def config(self) -> DllmConfig:
        """The scheduler's `DllmConfig`: one KV page per block, `max_running` seats and pool rows,
        KV pages for `max_running` requests of `max_blocks()` blocks; reuse and reloop only under
        FDFO."""
        b = self.block_size
        ctx = self.max_blocks() * b
        pages = self.max_running * self.max_blocks()
        return DllmConfig(
            block_size=b,
            page_size=b,
            kv_pages=pages,
            req_pool_rows=self.max_running,
            max_running_requests=self.max_running,
            max_context=ctx,
            mode=self.mode,
            in_place_reuse=self.in_place_reuse and self.mode is Mode.FDFO,
            reloop=self.reloop and self.mode is Mode.FDFO,
        )

    def label(self) -> str:
        """The run's mode name, as calibration tables name modes: 'sync', or 'fdfo' with '+reuse'
        and '+reloop' as set."""
        if self.mode is Mode.SYNC:
            return "sync"
        return (
            "fdfo" + ("+reuse" if self.in_place_reuse else "") + ("+reloop" if self.reloop else "")
        )


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """One scheduler round: index, [start, end] in simulated seconds, forwards, row ids."""

    index: int
    start: float
    end: float
    forwards: int
    rows: tuple[str, ...]


@dataclass
class DllmResult:
    """What `simulate_dllm` measured: simulated seconds, the priced counts, logs."""

    params: DllmParams
    makespan: float
    output_tokens: int
    forwards: int
    rounds: int
    allocations: int
    row_forwards: int
    row_rounds: int
    completion: dict[str, float]
    arrival: dict[str, float]
    rounds_log: list[RoundRecord]
    kv_samples: list[tuple[float, int]]
    kv_slots: int
    event_times: list[float]

    @property
    def throughput(self) -> float:
        """Output tokens per simulated second over the makespan (NaN for a makespan of 0)."""
        return self.output_tokens / self.makespan if self.makespan > 0 else math.nan

    def as_dict(self) -> dict[str, object]:
        """The run's figures by name, JSON-ready; `mean_latency_s` is the mean completion - arrival
        of the finished requests (None when none finished)."""
        lat = [self.completion[r] - self.arrival[r] for r in self.completion]
        return {
            "label": self.params.label(),
            "max_running_requests": self.params.max_running,
            "makespan_s": self.makespan,
            "output_tokens": self.output_tokens,
            "throughput_tokens_per_s": self.throughput,
            "forwards": self.forwards,
            "rounds": self.rounds,
            "kv_allocations": self.allocations,
            "row_forwards": self.row_forwards,
            "row_rounds": self.row_rounds,
            "mean_latency_s": float(np.mean(lat)) if lat else None,
        }


def scripted_factory(draws: Mapping[tuple[str, int], int]) -> ImplementationFactory:
    """The reference scheduler whose output block k of request r unmasks in draws[r, k] - 1
    forwards (plus the final-KV forward)."""

    def pattern(rid: str, k: int) -> int:
        return max(1, draws.get((rid, k), 2) - 1)

    def factory(config: DllmConfig, sink: EventSink) -> SchedulerAdapter:
        return ReferenceDllmScheduler(config, sink, ScriptedOracle(pattern, config.mask_token_id))

    return factory


class _DllmRun:
    """One run of `simulate_dllm`: the driver's events charged in simulated time."""

    def __init__(
        self,
        params: DllmParams,
        dist: StepDist,
        driver: DriverFactory | None,
        check_spec: bool,
    ) -> None:
        self.params = params
        self.config = config = params.config()
        b = config.block_size
        self.reqs = params.requests(dist, np.random.default_rng(params.seed))
        self.rids = [r.request_id for r in self.reqs]
        self.tokens = {r.request_id: r.tokens for r in self.reqs}
        draws = {
            (r.request_id, r.prompt_len // b + j): f
            for r in self.reqs
            for j, f in enumerate(r.forwards)
        }
        factory = scripted_factory(draws)
        self.drv: DllmDriver = (
            driver(factory, config)
            if driver is not None
            else DirectDriver(factory, config, check_spec)
        )
        self.arrivals = [i * params.arrival_interval for i in range(params.num_requests)]
        self.now = 0.0
        self.next = 0  # the next request to submit
        self.active = 0
        self.seen = 0  # driver events already charged
        self.owned = 0  # KV slots owned
        self.forwards = self.rounds = self.allocations = self.output_tokens = 0
        self.round_allocs = 0
        self.row_forwards = self.row_rounds = 0
        self.round_rows = 0  # rows the current round's forwards held
        self.completion: dict[str, float] = {}
        self.arrival: dict[str, float] = {}
        self.rounds_log: list[RoundRecord] = []
        self.kv_samples: list[tuple[float, int]] = [(0.0, 0)]
        self.times: list[float] = []

    def run(self, max_rounds: int) -> DllmResult:
        for _ in range(max_rounds):
            self._submit_arrivals()
            if (
                self.active == 0
                and self.seen == len(self.drv.events)
                and self.next == len(self.rids)
            ):
                break
            self._round()
            if self.active == 0 and self.next < len(self.rids):
                self.now = max(self.now, self.arrivals[self.next])  # idle until the next one
        else:
            raise SimConfigError("max_rounds", max_rounds, "more rounds (the run did not finish)")
        return DllmResult(
            self.params,
            self.now,
            self.output_tokens,
            self.forwards,
            self.rounds,
            self.allocations,
            self.row_forwards,
            self.row_rounds,
            self.completion,
            self.arrival,
            self.rounds_log,
            self.kv_samples,
            self.config.kv_slots,
            self.times,
        )

    def _submit_arrivals(self) -> None:
        while self.next < len(self.rids) and self.arrivals[self.next] <= self.now:
            req = self.reqs[self.next]
            rid = req.request_id
            prompt = tuple(1 + (i % 7) for i in range(req.prompt_len))
            self.drv.submit(RequestSpec(rid, prompt, req.max_new_tokens))
            self.arrival[rid] = self.arrivals[self.next]
            self.next += 1

    def _round(self) -> None:
        """One scheduler round; every event it reports is charged in order."""
        start, first = self.now, self.seen
        self.drv.round()
        forwards_before = self.forwards
        events = self.drv.events[first:]
        rows = {r.request_id for e in events if isinstance(e, Forward) for r in e.rows}
        self.round_allocs = 0
        self.round_rows = len(rows)
        for e in events:
            self._charge(e)
            self.times.append(self.now)
        self.seen = len(self.drv.events)
        self.rounds_log.append(
            RoundRecord(
                self.rounds - 1,
                start,
                self.now,
                self.forwards - forwards_before,
                tuple(sorted(rows)),
            )
        )

    def _charge(self, e: Event) -> None:
        p = self.params
        if isinstance(e, Submitted):
            self.active += 1
        elif isinstance(e, Forward):
            self.now += p.forward.batch_time(len(e.rows) * self.config.block_size, 0, self.owned, 0)
            self.forwards += 1
            self.row_forwards += len(e.rows)
            self.kv_samples.append((self.now, self.owned))
        elif isinstance(e, KvAllocated):
            self.owned += len(e.slots)
            self.allocations += 1
            self.now += p.alloc_cost
            if self.round_allocs == 0:
                self.now += p.alloc_round_cost
            self.round_allocs += 1
        elif isinstance(e, KvFreed):
            self.owned -= len(e.slots)
        elif isinstance(e, Finished):
            self.completion[e.request_id] = self.now
            self.output_tokens += self.tokens[e.request_id]
            self.active -= 1
        elif isinstance(e, ControlReturned):
            self.now += p.round_overhead + p.row_round_cost * self.round_rows
            self.rounds += 1
            self.row_rounds += self.round_rows


def simulate_dllm(
    params: DllmParams,
    dist: StepDist,
    driver: DriverFactory | None = None,
    check_spec: bool = False,
    max_rounds: int = 10_000_000,
) -> DllmResult:
    """Run `params.num_requests` requests through the driven scheduler (see the module doc)."""
    return _DllmRun(params, dist, driver, check_spec).run(max_rounds)


Overrides = Callable[[str, int], Mapping[str, object]]


def sweep(
    dist: StepDist,
    seats: tuple[int, ...] = (1, 2, 4, 8, 16),
    base: DllmParams | None = None,
    progress: Callable[[str], None] | None = None,
    overrides: Overrides | None = None,
) -> list[dict[str, float]]:
    """Throughput of sync, FDFO without reuse and FDFO with reuse at each seat count.
    `overrides(label, seats)` may replace parameters per mode (a calibrated time model)."""
    base = base or DllmParams()
    rows: list[dict[str, float]] = []
    for k in seats:
        res: dict[str, DllmResult] = {}
        for mode, reuse in ((Mode.SYNC, False), (Mode.FDFO, False), (Mode.FDFO, True)):
            p = DllmParams(
                **{**base.__dict__, "max_running": k, "mode": mode, "in_place_reuse": reuse}
            )
            if overrides is not None:
                p = dataclasses.replace(p, **overrides(p.label(), k))  # type: ignore[arg-type]
            r = simulate_dllm(p, dist)
            res[p.label()] = r
            if progress is not None:
                progress(f"max_running={k} {p.label()}: {r.throughput:.1f} tok/s")
        sync = res["sync"].throughput
        rows.append(
            {
                "max_running_requests": k,
                "sync_tok_s": sync,
                "fdfo_tok_s": res["fdfo"].throughput,
                "fdfo_reuse_tok_s": res["fdfo+reuse"].throughput,
                "fdfo_over_sync": res["fdfo"].throughput / sync,
                "fdfo_reuse_over_sync": res["fdfo+reuse"].throughput / sync,
                "reuse_gain": res["fdfo+reuse"].throughput / res["fdfo"].throughput - 1.0,
                "ideal_bound": dist.clipped(base.block_size).ideal_ratio(k),
                "sync_forwards": float(res["sync"].forwards),
                "fdfo_forwards": float(res["fdfo"].forwards),
                "fdfo_reuse_forwards": float(res["fdfo+reuse"].forwards),
                **{
                    f"{key}_{count}": float(getattr(res[label], count))
                    for label, key in (
                        ("sync", "sync"),
                        ("fdfo", "fdfo"),
                        ("fdfo+reuse", "fdfo_reuse"),
                    )
                    for count in ("row_rounds", "allocations")
                },
            }
        )
    return rows
