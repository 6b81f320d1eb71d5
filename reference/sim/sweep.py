"""Capacity sweeps: a grid of replica-level simulations (qps x scheduler x replicas x KV pool),
run in parallel on Ray or in one process, with identical numbers either way.

A point is a frozen `SweepPoint`; `run_point` is a pure function of it (the workload is generated
from the point's seed inside the worker), so where a point runs changes nothing. `run_grid`
validates every point (scheduler name, configuration) before any work starts, then runs them on
Ray (`backend="ray"`: a local Ray started with `num_cpus`, or an existing cluster by `address`)
or serially (`backend="local"`), reporting progress as points finish. Results come back in grid
order; a point that fails with a typed error (a request that can never run, say) fails the
sweep with the same one-line message on either backend (`PointFailed` on Ray). Ray is
optional (`pip install 'schedspec[sweep]'`); without it `RayMissing` says so.
"""

from __future__ import annotations

import csv
import itertools
import json
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from reference.sim import workload as wl
from reference.sim.bounds import check_rate
from reference.sim.catalog import VIDUR_MAX_WAITING_ITERS, ReplicaSpec
from reference.sim.errors import SimConfigError, SimError, reason_of
from reference.sim.exec_model import parse_model
from spec.errors import SchedSpecError

BACKENDS = ("ray", "local")


class RayMissing(SimError, ImportError):
    """`--backend ray` without Ray installed."""

    def __init__(self) -> None:
        super().__init__(
            "ray is not installed: install the sweep extra (pip install 'schedspec[sweep]', "
            "or .venv/bin/pip install 'ray[default]==2.60.0'), or run with --backend local"
        )


ADDRESS_FORMS = "'auto', HOST:PORT or ray://HOST:PORT of a running Ray cluster"
CONNECT_TIMEOUT_S = 5.0


def check_ray_address(address: str) -> None:
    """Refuse an address Ray would hang on or crash over, before `ray.init` sees it.

    'auto' is left to Ray (it fails fast when no cluster runs). HOST:PORT and ray://HOST:PORT
    must accept a TCP connection within `CONNECT_TIMEOUT_S`: Ray itself retries an unreachable
    GCS address for minutes. Raises `SimConfigError` naming the address and the valid forms.
    """
    if address == "auto":
        return
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "", address
    host, colon, port_text = rest.rpartition(":")
    port_ok = port_text.isdigit() and 1 <= int(port_text) <= 65535
    if scheme not in ("", "ray") or not colon or not host or not port_ok:
        raise SimConfigError("--address", address, ADDRESS_FORMS)
    try:
        with socket.create_connection((host.strip("[]"), int(port_text)), CONNECT_TIMEOUT_S):
            pass
    except OSError as err:  # the port is range-checked above, so only connecting can fail
        raise SimConfigError(
            "--address", address, f"{ADDRESS_FORMS} (cannot connect: {reason_of(err)})"
        ) from None


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One simulation of the grid (everything it depends on)."""

    qps: float
    scheduler: str
    replicas: int
    kv_tokens: int
    requests: int = 2000
    prefill: str = "64-1024"
    decode: str = "16-256"
    max_batch: int = 32
    budget: int = 2048
    max_model_len: int = 1280
    exec_model: str = "roofline:llama3-8b@h100"
    global_scheduler: str = "round_robin"
    seed: int = 0
    max_waiting_iters: int = VIDUR_MAX_WAITING_ITERS

    def replica_spec(self) -> ReplicaSpec:
        """The point's `ReplicaSpec` (`SimConfigError` for a bad scheduler or size)."""
        return ReplicaSpec(
            self.scheduler,
            self.kv_tokens,
            self.max_batch,
            self.budget,
            self.max_model_len,
            self.max_waiting_iters,
        )

    def label(self) -> str:
        """The point by the grid's four axes, for messages."""
        return (
            f"sweep point scheduler={self.scheduler} replicas={self.replicas} "
            f"kv_tokens={self.kv_tokens} qps={self.qps:g}"
        )

    def validate(self) -> None:
        """Raise a typed error naming the bad field; builds one replica and the time model."""
        check_rate("qps", self.qps)
        if self.replicas < 1:
            raise SimConfigError("replicas", self.replicas, "an integer >= 1")
        if self.requests < 1:
            raise SimConfigError("requests", self.requests, "an integer >= 1")
        wl.Lengths.parse(self.prefill, "prefill")
        wl.Lengths.parse(self.decode, "decode")
        parse_model(self.exec_model)
        self.replica_spec().factory()


@dataclass(frozen=True, slots=True)
class PointResult:
    """A point's figures (latencies in seconds; wall time is where it ran, not compared)."""

    point: SweepPoint
    completed: int
    makespan: float
    throughput_rps: float
    throughput_tok_s: float
    e2e_p50: float
    e2e_p90: float
    ttft_p50: float
    ttft_p90: float
    tpot_p50: float
    restarts: int
    batches: int
    wall_s: float

    def figures(self) -> dict[str, Any]:
        """Everything but the wall time: what must match between backends."""
        d = self.row()
        d.pop("wall_s")
        return d

    def row(self) -> dict[str, Any]:
        """The point's fields and figures in one flat dict: a row of the JSON and CSV outputs."""
        d: dict[str, Any] = asdict(self.point)
        d.update({k: v for k, v in asdict(self).items() if k != "point"})
        return d


def run_point(p: SweepPoint) -> PointResult:
    """Simulate one point (deterministic: same point, same figures). A typed error while it
    runs (a request that can never be admitted, say) names the point (`SweepPoint.label`)
    before its own message, and keeps its type."""
    try:
        return _run_point(p)
    except SchedSpecError as err:
        err.args = (f"{p.label()}: {err}",)
        raise


def _run_point(p: SweepPoint) -> PointResult:
    from reference.sim.cluster import simulate_cluster

    t0 = time.perf_counter()
    w = wl.poisson(
        p.requests, p.qps, wl.Lengths.parse(p.prefill), wl.Lengths.parse(p.decode), p.seed
    )
    make = p.replica_spec().factory()
    res = simulate_cluster(
        w,
        [make() for _ in range(p.replicas)],
        parse_model(p.exec_model),
        p.global_scheduler,
        p.seed,
    )
    s = res.summary
    st = s.stats
    return PointResult(
        p,
        s.completed,
        s.makespan,
        s.throughput_rps,
        s.throughput_tokens,
        st["request_e2e_time"].p50,
        st["request_e2e_time"].p90,
        st["prefill_e2e_time"].p50,
        st["prefill_e2e_time"].p90,
        st["time_per_output_token"].p50,
        int(res.metrics.restarts.sum()),
        res.num_batches,
        time.perf_counter() - t0,
    )


class PointFailed(SimError):
    """A point's typed error, raised in the driver for a point that failed on a Ray worker.

    Ray sends a worker's exception back pickled, and an error whose `__init__` takes other
    arguments than its message (`Unschedulable`, `SimConfigError`, ...) cannot be rebuilt from
    the pickle: `ray.get` raised `UnserializableException` with the whole remote traceback. So
    the worker returns the error as data (`_FailedPoint`) and the driver raises this, with the
    same one-line message the one-process backend gives."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind  # the class name of the worker's error
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class _FailedPoint:
    kind: str
    message: str


def _run_point_on_worker(p: SweepPoint) -> PointResult | _FailedPoint:
    """`run_point` as a Ray task: a typed error comes back as data (see `PointFailed`)."""
    try:
        return run_point(p)
    except SchedSpecError as err:
        return _FailedPoint(type(err).__name__, str(err))


def grid(
    qps: Sequence[float],
    schedulers: Sequence[str],
    replicas: Sequence[int],
    kv_tokens: Sequence[int],
    **common: Any,
) -> list[SweepPoint]:
    """The cross product, in a fixed order (scheduler, replicas, pool, then qps)."""
    return [
        SweepPoint(q, s, r, k, **common)
        for s, r, k, q in itertools.product(schedulers, replicas, kv_tokens, qps)
    ]


Progress = Callable[[int, int, PointResult], None]


def run_grid(
    points: Sequence[SweepPoint],
    backend: str = "ray",
    address: str | None = None,
    num_cpus: int | None = None,
    progress: Progress | None = None,
) -> list[PointResult]:
    """Validate every point, then run them (see the module doc); results in grid order."""
    if backend not in BACKENDS:
        raise SimConfigError("backend", backend, f"one of {', '.join(BACKENDS)}")
    if num_cpus is not None and num_cpus < 1:
        raise SimConfigError("num_cpus", num_cpus, "an integer >= 1")
    if not points:
        raise SimConfigError("grid", 0, "at least one point")
    for p in points:
        p.validate()
    if backend == "local":
        out = []
        for i, p in enumerate(points):
            out.append(run_point(p))
            if progress is not None:
                progress(i + 1, len(points), out[-1])
        return out
    return _run_ray(points, address, num_cpus, progress)


def _run_ray(
    points: Sequence[SweepPoint],
    address: str | None,
    num_cpus: int | None,
    progress: Progress | None,
) -> list[PointResult]:
    if address:
        check_ray_address(address)
    try:
        import ray
    except ImportError:
        raise RayMissing() from None
    if getattr(ray, "__file__", None) is None and hasattr(ray, "__path__"):
        raise RayMissing()  # a namespace package: a `ray/` folder on the path (/tmp/ray)
    started = False
    if not ray.is_initialized():
        if address:
            try:
                ray.init(address=address, log_to_driver=False)
            except (ConnectionError, RuntimeError, TimeoutError, ValueError) as err:
                reason = " ".join(reason_of(err).split())
                raise SimConfigError("--address", address, f"{ADDRESS_FORMS} ({reason})") from None
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1)(_run_point_on_worker)
        refs = [remote.remote(p) for p in points]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[PointResult | None] = [None] * len(points)
        left = list(refs)
        while left:
            ready, left = ray.wait(left, num_returns=1)
            for ref in ready:
                r = ray.get(ref)
                if isinstance(r, _FailedPoint):
                    raise PointFailed(r.kind, r.message)
                results[index[ref]] = r
                if progress is not None:
                    progress(len(points) - len(left), len(points), r)
        return [r for r in results if r is not None]
    finally:
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------- outputs
def table(results: Sequence[PointResult]) -> str:
    """The results as a fixed-width text table, one line per point (latencies in seconds)."""
    head = (
        f"{'scheduler':>15} {'rep':>3} {'kv tokens':>9} {'qps':>7} {'done':>6} {'req/s':>7} "
        f"{'tok/s':>8} {'e2e p50':>8} {'p90':>8} {'TTFT p50':>8} {'p90':>8} {'TPOT p50':>8} "
        f"{'restarts':>8} {'wall s':>6}"
    )
    lines = [head]
    for r in results:
        p = r.point
        lines.append(
            f"{p.scheduler:>15} {p.replicas:>3} {p.kv_tokens:>9} {p.qps:>7.2f} {r.completed:>6} "
            f"{r.throughput_rps:>7.2f} {r.throughput_tok_s:>8.0f} {r.e2e_p50:>8.3f} "
            f"{r.e2e_p90:>8.3f} {r.ttft_p50:>8.3f} {r.ttft_p90:>8.3f} {r.tpot_p50:>8.4f} "
            f"{r.restarts:>8} {r.wall_s:>6.2f}"
        )
    return "\n".join(lines)


def write_json(results: Sequence[PointResult], path: Path) -> None:
    """Write every result's `row()` to `path` as a JSON list, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.row() for r in results], indent=2))


def write_csv(results: Sequence[PointResult], path: Path) -> None:
    """Write every result's `row()` to `path` as CSV with a header, creating its directory;
    `results` must not be empty (the header is the first row's keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r.row() for r in results]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot_throughput_latency(results: Sequence[PointResult], directory: Path) -> list[Path]:
    """One figure per latency (e2e p90, TTFT p90): achieved throughput on x, one line per
    (scheduler, replicas, pool) across the qps values."""
    from reference.sim.export import _pyplot

    plt = _pyplot()
    series: dict[str, list[PointResult]] = {}
    for r in results:
        p = r.point
        series.setdefault(f"{p.scheduler} x{p.replicas} kv={p.kv_tokens}", []).append(r)
    out = []
    for attr, label in (("e2e_p90", "request e2e p90 (s)"), ("ttft_p90", "TTFT p90 (s)")):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name, rs in series.items():
            rs = sorted(rs, key=lambda r: r.point.qps)
            ax.plot(
                [r.throughput_rps for r in rs], [getattr(r, attr) for r in rs], "o-", label=name
            )
        ax.set_xlabel("achieved throughput (requests/s)")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        path = directory / f"sweep_{attr}.png"
        directory.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    return out
