"""Soak: a server-like run of the torch engine, RSS at the start, every 1,000 requests and the end.

.venv/bin/python scripts/soak_engine.py [--requests 10000] [--model tiny|shipped]
    [--abort-rate 0.1] [--seed 1] [--record] [--forward-log-cap N] [--device cpu|cuda[:N]]
    [--prefix-cache] [--stems K] [--json PATH]

The loop keeps 16 requests queued or running, runs one round at a time, takes the finished
outputs after every round (as a server streams them out) and aborts about `--abort-rate` of the
requests a few rounds after submission (seeded). Events go to a sink that only counts them, so
what is measured is the engine's own state. A flat RSS column, with the engine's container sizes
(`DllmEngine.retained_sizes`) staying at their caps or below, is the pass condition the issue
sets ("the soak shows flat memory"); the script prints a table and writes JSON, it asserts
nothing about time.

On CUDA each row also reports the memory torch holds allocated on the device
(`torch.cuda.memory_allocated`, after the round's work is done), so a device-side leak shows as
a growing column. At every row the KV slots in use and the rows held are read from the engine;
once every request has finished or been aborted both must be 0. Exit 1 when they are not (a
leak), 2 on a bad flag or an unusable device, 0 otherwise.

With `--prefix-cache` the engine keeps committed blocks (`gpu.prefix_cache`): the table adds the
cached blocks, which must stay within the pool, and at the end no request may still read one.
With `--stems K` every prompt starts with one of K fixed whole blocks (seeded), so later
requests read what earlier ones cached; the totals count the blocks read.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import asdict, dataclass

import torch

from gpu.algorithms import make_algorithm
from gpu.device_name import device_name
from gpu.engine import (
    FORWARD_LOG_CAP,
    DllmEngine,
    _shipped_model,
    resolve_device,
    tiny_model,
    wait_for_device,
)
from schedspec_cli.output import output_file, write_json
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import SchedSpecError
from spec.events import Event

IN_FLIGHT = 16  # requests kept queued or running
CONFIG = DllmConfig(
    block_size=4,
    page_size=4,
    kv_pages=64,
    req_pool_rows=8,
    max_running_requests=8,
    max_context=64,
    mode=Mode.FDFO,
    in_place_reuse=True,
    eos_token_id=15,
)


def rss_kib() -> int:
    """VmRSS of this process in KiB, from /proc/self/status (0 where there is none)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass(frozen=True, slots=True)
class Checkpoint:
    requests_done: int  # finished + aborted
    finished: int
    aborted: int
    rounds: int
    rss_kib: int
    seconds: float
    sizes: dict[str, int]
    used_slots: int  # KV slots the allocator has handed out and not had back
    device_allocated_kib: int | None  # torch's allocated memory on a CUDA device; None on CPU


class CountingSink:
    """Counts the events and keeps none of them."""

    def __init__(self) -> None:
        self.events = 0

    def __call__(self, event: Event) -> None:
        self.events += 1


def device_allocated_kib(device: torch.device) -> int | None:
    """torch's allocated memory on a CUDA device in KiB, once its queued work is done."""
    if device.type != "cuda":
        return None
    wait_for_device(device)
    return torch.cuda.memory_allocated(device) // 1024


def soak(
    requests: int,
    model_name: str,
    abort_rate: float,
    seed: int,
    record: bool,
    forward_log_cap: int,
    every: int,
    device: torch.device,
    config: DllmConfig = CONFIG,
    stems: int = 0,
) -> tuple[list[Checkpoint], dict[str, int]]:
    torch.set_num_threads(1)
    model = tiny_model(str(device)) if model_name == "tiny" else _shipped_model(str(device))
    sink = CountingSink()
    engine = DllmEngine(
        config,
        sink,
        model=model,
        algorithm=make_algorithm("LowConfidence", {}),
        device=device,
        record=record,
        forward_log_cap=forward_log_cap,
    )

    def checkpoint(done: int, seconds: float) -> Checkpoint:
        return Checkpoint(
            done,
            finished,
            aborted,
            engine.round_index,
            rss_kib(),
            seconds,
            engine.retained_sizes(),
            engine.allocator.used_slots(),
            device_allocated_kib(device),
        )

    rng = random.Random(seed)
    # whole-block stems a prompt may start with (drawn first, so the rest of the run is seeded)
    stem_blocks = [tuple(rng.randrange(15) for _ in range(config.block_size)) for _ in range(stems)]
    abort_at: dict[str, int] = {}  # request id -> round at which to abort it (if still live)
    live: set[str] = set()
    submitted = finished = aborted = tokens = 0
    start = time.perf_counter()
    checkpoints = [checkpoint(0, 0.0)]
    next_mark = every
    while submitted < requests or live:
        while submitted < requests and len(live) < IN_FLIGHT:
            rid = f"req-{submitted}"
            tail = tuple(rng.randrange(15) for _ in range(rng.randint(1, 6)))
            prompt = (*rng.choice(stem_blocks), *tail) if stem_blocks else tail
            engine.submit(RequestSpec(rid, prompt, rng.randint(2, 8)))
            live.add(rid)
            if rng.random() < abort_rate:
                abort_at[rid] = engine.round_index + rng.randint(0, 3)
            submitted += 1
        for rid, due in list(abort_at.items()):
            if due <= engine.round_index:
                del abort_at[rid]
                engine.abort(rid)
                live.discard(rid)
                aborted += 1
        engine.run_round()
        for rid, output in engine.take_outputs().items():
            live.discard(rid)
            abort_at.pop(rid, None)
            finished += 1
            tokens += len(output)
        done = finished + aborted
        if done >= next_mark or (submitted == requests and not live):
            checkpoints.append(checkpoint(done, time.perf_counter() - start))
            while next_mark <= done:
                next_mark += every
    totals = {
        "events": sink.events,
        "tokens": tokens,
        "forwards": engine.runner.forwards,
        "outputs_dropped": engine.outputs_dropped,
        "forward_log_dropped": engine.forward_log_dropped,
        "cache_hits": 0 if engine.prefix_cache is None else engine.prefix_cache.hits,
    }
    return checkpoints, totals


def _positive(flag: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise SystemExit(_usage(f"{flag}: {text!r} is not an integer >= {minimum}"))
    return value


def _usage(message: str) -> int:
    print(f"soak_engine: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", default="10000", help="requests to serve (>= 1)")
    p.add_argument("--model", choices=["tiny", "shipped"], default="tiny")
    p.add_argument("--abort-rate", default="0.1", help="fraction of requests aborted, 0..1")
    p.add_argument("--seed", default="1")
    p.add_argument("--every", default="1000", help="a table row every N requests done")
    p.add_argument("--record", action="store_true", help="keep the (capped) forward log")
    p.add_argument("--forward-log-cap", default=str(FORWARD_LOG_CAP))
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument(
        "--prefix-cache", action="store_true", help="keep committed blocks (gpu.prefix_cache)"
    )
    p.add_argument(
        "--stems", default="0", help="prompts start with one of this many fixed blocks (>= 0)"
    )
    p.add_argument("--json", type=output_file, default=None, help="write the checkpoints here")
    ns = p.parse_args(argv)
    requests = _positive("--requests", ns.requests, 1)
    every = _positive("--every", ns.every, 1)
    seed = _positive("--seed", ns.seed, 0)
    cap = _positive("--forward-log-cap", ns.forward_log_cap, 0)
    stems = _positive("--stems", ns.stems, 0)
    try:
        abort_rate = float(ns.abort_rate)
    except ValueError:
        abort_rate = -1.0
    if not 0.0 <= abort_rate <= 1.0:
        return _usage(f"--abort-rate: {ns.abort_rate!r} is not a number in [0, 1]")
    try:
        device = resolve_device(ns.device)
    except SchedSpecError as exc:
        return _usage(f"--device: {exc}")

    config = CONFIG.replace(prefix_cache=ns.prefix_cache)
    checkpoints, totals = soak(
        requests, ns.model, abort_rate, seed, ns.record, cap, every, device, config, stems
    )
    print(
        f"soak: {requests} requests, model {ns.model}, abort rate {abort_rate}, seed {seed}, "
        f"record {ns.record}; {IN_FLIGHT} in flight, max_running "
        f"{CONFIG.max_running_requests}, block {CONFIG.block_size}, FDFO + reuse"
        f"{', prefix cache' if ns.prefix_cache else ''}; device {device_name(device)}"
    )
    print(
        f"{'done':>6} {'finished':>8} {'aborted':>7} {'rounds':>7} {'RSS MiB':>8} {'dev MiB':>8} "
        f"{'s':>7} {'outputs':>7} {'fwd log':>7} {'retired':>7} {'live':>5} {'handles':>7} "
        f"{'slots':>5} {'rows':>4} {'cached':>6}"
    )
    for c in checkpoints:
        s = c.sizes
        dev = "-" if c.device_allocated_kib is None else f"{c.device_allocated_kib / 1024:.1f}"
        print(
            f"{c.requests_done:>6} {c.finished:>8} {c.aborted:>7} {c.rounds:>7} "
            f"{c.rss_kib / 1024:>8.1f} {dev:>8} {c.seconds:>7.1f} {s['outputs']:>7} "
            f"{s['forward_log']:>7} {s['retired_ids']:>7} {s['live_ids']:>5} "
            f"{s['allocator_handles']:>7} {c.used_slots:>5} {s['held_rows']:>4} "
            f"{s['cached_blocks']:>6}"
        )
    first = checkpoints[1] if len(checkpoints) > 1 else checkpoints[0]
    last = checkpoints[-1]
    print(
        f"RSS start {checkpoints[0].rss_kib / 1024:.1f} MiB, after {first.requests_done} "
        f"requests {first.rss_kib / 1024:.1f} MiB, end {last.rss_kib / 1024:.1f} MiB "
        f"(end - after first row: {(last.rss_kib - first.rss_kib) / 1024:+.1f} MiB); "
        + ", ".join(f"{k} {v}" for k, v in totals.items())
    )
    last_sizes = last.sizes
    leaked = (
        last.used_slots
        or last_sizes["held_rows"]
        or last_sizes["allocator_handles"]
        or last_sizes["cache_readers"]
        or any(c.sizes["cached_blocks"] > config.kv_pages for c in checkpoints)
    )
    print(
        f"LEAK at the end: {last.used_slots} KV slots in use, {last_sizes['held_rows']} rows "
        f"held, {last_sizes['allocator_handles']} allocator handles live, "
        f"{last_sizes['cache_readers']} requests reading the cache"
        if leaked
        else "every request ended: no KV slot in use, no row held, no allocator handle live"
    )
    if ns.json is not None:
        payload = {
            "command": "scripts/soak_engine.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "requests": requests,
            "model": ns.model,
            "abort_rate": abort_rate,
            "seed": seed,
            "record": ns.record,
            "forward_log_cap": cap,
            "device": device_name(device),
            "leaked": bool(leaked),
            "in_flight": IN_FLIGHT,
            "prefix_cache": ns.prefix_cache,
            "stems": stems,
            "config": {k: str(v) for k, v in asdict(config).items()},
            "totals": totals,
            "checkpoints": [asdict(c) for c in checkpoints],
        }
        write_json(ns.json, payload)
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main())
