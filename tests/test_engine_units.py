"""Unit tests of the engine's parts: the paged KV allocator, the request pool, the token map,
the streaming callback and the bench entry point."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu.algorithms import make_algorithm
from gpu.allocator import AllocatorError, PagedKvAllocator
from gpu.engine import DllmEngine, make_small_engine, tiny_model
from gpu.request import StreamChunk
from gpu.request_pool import ReqToTokenPool, RequestPoolError
from gpu.token_map import TokenMap
from gpu.tokenizer import EOS_ID, MASK_ID, VOCAB_SIZE
from spec.adapter import EventSink
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError
from spec.events import Event, KvAllocated, KvFreed

torch.set_num_threads(1)


def test_allocator_page_rule_and_owner_tensors() -> None:
    events: list[Event] = []
    alloc = PagedKvAllocator(num_pages=3, page_size=8, block_size=4, sink=events.append)
    a, b = alloc.register("a"), alloc.register("b")
    s0 = alloc.allocate_block(a, 0, None)  # starts page 0
    s1 = alloc.allocate_block(a, 1, s0 + 3)  # continues page 0
    t0 = alloc.allocate_block(b, 0, None)  # lowest wholly free page: 1
    assert (s0, s1, t0) == (0, 4, 8)
    assert alloc.owner_req[:12].tolist() == [a] * 8 + [b] * 4
    assert alloc.owner_block[:12].tolist() == [0] * 4 + [1] * 4 + [0] * 4
    assert alloc.slot_owners()[5] == ("a", 1)
    with pytest.raises(AllocatorError):
        alloc.allocate_block(b, 1, s0 + 3)  # continuing someone else's page
    alloc.free_blocks(a, [s1])
    assert alloc.free_pages() == 1  # page 0 still has block 0
    alloc.free_all(a)
    assert alloc.free_pages() == 2
    assert alloc.allocate_block(b, 2, None) == 0  # the lowest wholly free page again
    alloc.check_consistency()
    assert [type(e) for e in events] == [KvAllocated] * 3 + [KvFreed] * 2 + [KvAllocated]
    with pytest.raises(AllocatorError):
        alloc.free_blocks(a, [8])  # not a's slots: refused, nothing changed
    alloc.check_consistency()


def test_allocator_free_block_is_free_blocks_of_one() -> None:
    """The carry path's single-block free changes the tensors, the page heap and the events
    exactly as `free_blocks` of that one block, and refuses what it refuses."""
    logs: list[list[Event]] = [[], []]
    allocs = [PagedKvAllocator(3, 8, 4, sink=log.append) for log in logs]
    for i, alloc in enumerate(allocs):
        a, b = alloc.register("a"), alloc.register("b")
        s0 = alloc.allocate_block(a, 0, None)
        s1 = alloc.allocate_block(a, 1, s0 + 3)
        alloc.allocate_block(b, 0, None)
        free = alloc.free_block if i else (lambda h, s, f=alloc.free_blocks: f(h, [s]))
        free(a, s1)
        assert alloc.free_pages() == 1  # page 0 still holds block 0
        free(a, s0)
        assert alloc.free_pages() == 2  # page 0 wholly free again
        for bad in (s0, 8, 10, 22):  # freed twice, someone else's, misaligned, past the pool
            with pytest.raises(AllocatorError):
                free(a, bad)
        alloc.check_consistency()
    assert logs[0] == logs[1]
    assert [e.slots for e in logs[1] if isinstance(e, KvFreed)] == [(4, 5, 6, 7), (0, 1, 2, 3)]
    assert allocs[0].owner_req.tolist() == allocs[1].owner_req.tolist()


def test_allocator_frees_whole_blocks_only() -> None:
    """A free must name whole blocks: a first slot inside the handle's own blocks (which would
    free half of two of them) is refused and changes nothing."""
    alloc = PagedKvAllocator(num_pages=2, page_size=8, block_size=4, sink=lambda e: None)
    a = alloc.register("a")
    s0 = alloc.allocate_block(a, 0, None)
    alloc.allocate_block(a, 1, s0 + 3)
    for free in (alloc.free_block, lambda h, s: alloc.free_blocks(h, [s])):
        with pytest.raises(AllocatorError, match="block"):
            free(a, 2)  # slots 2..5 are a's, but they straddle blocks 0 and 1
        assert alloc.owner_req[:8].tolist() == [a] * 8
    alloc.check_consistency()


def test_allocator_free_all_counts_pages_and_unregister_forgets() -> None:
    """free_all frees every slot the owner tensor records for the handle, whole blocks or not
    (slots written behind the allocator's back included), keeps the page counts and heap
    consistent, and the handle it emptied is forgotten by `unregister`; a handle that owns
    slots again after free_all keeps its name (so a leak shows under its request id)."""
    events: list[Event] = []
    alloc = PagedKvAllocator(num_pages=4, page_size=8, block_size=4, sink=events.append)
    a, b = alloc.register("a"), alloc.register("b")
    s0 = alloc.allocate_block(a, 0, None)
    alloc.allocate_block(a, 1, s0 + 3)
    alloc.allocate_block(a, 2, None)  # page 1
    alloc.allocate_block(b, 0, None)  # page 2
    # three slots of page 3 taken behind the allocator's back (not a whole block)
    assert alloc._free_pages == [3]
    alloc._free_pages.pop()
    alloc.owner_req[24:27] = a
    alloc.owner_block[24:27] = 7
    alloc._page_used[3] += 3
    alloc.free_all(a)
    assert alloc.owner_req.tolist().count(a) == 0
    assert events[-1] == KvFreed("a", (*range(0, 12), 24, 25, 26))
    assert alloc.free_pages() == 3  # only b's page is in use
    alloc.check_consistency()
    alloc.unregister(a)
    assert alloc.live_handles() == 1 and alloc.name(a).startswith("<released")
    alloc.free_all(b)
    alloc.allocate_block(b, 0, None)  # b owns slots again after its free_all
    alloc.unregister(b)
    assert alloc.name(b) == "b" and alloc.live_handles() == 1
    alloc.check_consistency()


def test_allocator_reservation() -> None:
    alloc = PagedKvAllocator(num_pages=4, page_size=4, block_size=4, sink=lambda e: None)
    alloc.reserve(3)
    assert alloc.can_reserve(1) and not alloc.can_reserve(2)
    with pytest.raises(AllocatorError):
        alloc.reserve(2)
    alloc.unreserve(3)
    assert alloc.reserved_pages == 0


def test_request_pool_rows_lowest_first() -> None:
    pool = ReqToTokenPool(rows=3, max_context=8)
    assert [pool.acquire(h) for h in (10, 11, 12)] == [0, 1, 2]
    assert not pool.has_free()
    with pytest.raises(RequestPoolError):
        pool.acquire(13)
    pool.release(1, 11)
    with pytest.raises(RequestPoolError):
        pool.release(0, 99)  # not its holder
    assert pool.acquire(14) == 1
    assert pool.held_rows() == {0: 10, 1: 14, 2: 12}


def test_batch_plan_is_rebuilt_exactly_when_the_batch_or_the_table_changed() -> None:
    """The runner's incremental plan: the same rows, starts and table give the same plan
    object; a table write that changes an entry, or another batch, gives a fresh plan read
    from the table as it is now; a write of the values already there changes nothing."""
    from gpu.kv_cache import PagedKvCache
    from gpu.model_runner import ModelRunner

    model = tiny_model("cpu")
    cfg = model.config
    pool = ReqToTokenPool(rows=2, max_context=16)
    kv = PagedKvCache(cfg.n_layers, cfg.n_heads, cfg.head_dim, 64)
    runner = ModelRunner(model, kv, pool, MASK_ID, record_digests=False)
    pool.write_blocks([(0, 0, 8), (1, 0, 16), (1, 4, 20)], 4)
    first = runner.plan([0, 4], [0, 1], 4)
    assert runner.plan([0, 4], [0, 1], 4) is first and runner.plans_built == 1
    version = pool.version
    pool.write_blocks([(1, 4, 20)], 4)  # the same slots again: nothing changed
    assert pool.version == version and runner.plan([0, 4], [0, 1], 4) is first
    pool.write_blocks([(1, 4, 40)], 4)  # re-allocated elsewhere
    assert pool.version == version + 1
    moved = runner.plan([0, 4], [0, 1], 4)
    assert moved is not first and runner.plans_built == 2
    assert moved.block_slots.tolist() == [8, 9, 10, 11, 40, 41, 42, 43]
    assert moved.ctx_slots.tolist() == [8, 9, 10, 11, 16, 17, 18, 19, 40, 41, 42, 43]
    assert runner.plan([0], [0], 4) is not moved  # another batch
    assert runner.plans_built == 3


@settings(max_examples=60, deadline=None, database=None)
@given(
    mask=st.sampled_from([-1, MASK_ID, 7, 200]),
    eos=st.sampled_from([None, EOS_ID, 15, 0, 48, 500]),
)
def test_token_map_is_a_bijection(mask: int, eos: int | None) -> None:
    if eos == mask:
        return
    config = DllmConfig(mask_token_id=mask, eos_token_id=eos)
    tm = TokenMap(config, VOCAB_SIZE, MASK_ID, EOS_ID)
    valid = [t for t in range(VOCAB_SIZE) if t != tm.hole and t != mask]
    internal = tm.to_internal(valid)
    assert len(set(internal)) == len(internal) and MASK_ID not in internal
    assert list(tm.to_spec(internal)) == valid
    assert tm.to_spec([MASK_ID]) == (mask,)
    if eos is not None and 0 <= eos < VOCAB_SIZE:
        assert tm.to_internal([eos]) == [EOS_ID]
    if mask == -1 and (eos is None or eos >= 10):  # the suite's small ids: the characters
        assert tm.to_internal(list(range(10))) == list(range(3, 13))


def test_streaming_chunks_concatenate_to_the_output() -> None:
    chunks: list[StreamChunk] = []
    config = DllmConfig(block_size=4, page_size=8, kv_pages=16, max_context=32, eos_token_id=15)
    engine = DllmEngine(
        config,
        lambda e: None,
        model=tiny_model("cpu"),
        algorithm=make_small_engine(config, lambda e: None).algorithm,
        on_block=chunks.append,
    )
    for i in range(4):
        engine.submit(RequestSpec(f"r{i}", tuple(range(i, i + 3 + 2 * i)), 9 + i))
    engine.drain()
    for rid, output in engine.outputs.items():
        mine = [c for c in chunks if c.request_id == rid]
        assert [c.block_index for c in mine] == list(range(len(mine)))
        assert tuple(t for c in mine for t in c.new_tokens) == output
        assert mine[-1].finished is not None and all(c.finished is None for c in mine[:-1])
    assert engine.output_text("r0") is not None


def _three_seat_engine(
    sink: EventSink, mode: Mode, reuse: bool, algorithm: str, device: str = "cpu"
) -> DllmEngine:
    """The tiny model in blocks of 4, pages of 8, three seats: rows mix context lengths."""
    config = DllmConfig(
        block_size=4, page_size=8, kv_pages=32, max_context=32, mode=mode,
        in_place_reuse=reuse, max_running_requests=3,
    )  # fmt: skip
    return DllmEngine(
        config, sink, model=tiny_model(device), algorithm=make_algorithm(algorithm), device=device
    )


def _submit_growing_prompts(engine: DllmEngine, n: int, max_new_tokens: int) -> None:
    for i in range(n):
        engine.submit(RequestSpec(f"r{i}", tuple(range(i, i + 2 + i)), max_new_tokens))


@pytest.mark.parametrize(
    ("mode", "reuse", "algorithm"),
    [
        (Mode.SYNC, False, "LowConfidence"),
        (Mode.FDFO, False, "LowConfidence"),
        (Mode.FDFO, True, "LowConfidence"),
        (Mode.FDFO, True, "JointThreshold"),
    ],
)
def test_reported_masks_are_the_masks_the_forward_sees(
    mode: Mode, reuse: bool, algorithm: str
) -> None:
    """The engine reports each row's masks from host-side counts (the step's, carried with
    the block) instead of reading the tokens back: every `Forward` row's `masked` must still
    equal the masks in the tokens that forward actually receives."""
    from spec.events import Forward

    events: list[Event] = []
    engine = _three_seat_engine(events.append, mode, reuse, algorithm)
    seen: list[list[int]] = []
    real_forward = engine.runner.forward

    def forward(tokens: torch.Tensor, *args: object) -> torch.Tensor:
        seen.append((tokens == MASK_ID).sum(dim=1).tolist())
        return real_forward(tokens, *args)  # type: ignore[arg-type]

    engine.runner.forward = forward  # type: ignore[assignment,method-assign]
    _submit_growing_prompts(engine, 5, 9)
    engine.drain()
    reported = [[row.masked for row in e.rows] for e in events if isinstance(e, Forward)]
    assert len(reported) == len(seen) > 5
    assert reported == seen


def test_snapshot_reads_the_allocator_not_the_events() -> None:
    """Corrupting the owner tensor directly shows in the snapshot (no event involved)."""
    engine = make_small_engine(DllmConfig(mode=Mode.FDFO), lambda e: None)
    engine.submit(RequestSpec("a", (1, 2, 3, 4, 5), 8))
    engine.run_round()
    before = engine.snapshot()
    engine.allocator.owner_req[-1] = engine.running[0].handle
    engine.allocator.owner_block[-1] = 7
    after = engine.snapshot()
    assert after.slot_owners[engine.config.kv_slots - 1] == ("a", 7)
    assert after.free_slots == before.free_slots - {engine.config.kv_slots - 1}


def test_forward_costs_print_and_write_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--forward-costs` writes what it prints (its --json was once ignored); one call per
    sample keeps the test short, the figures' shape is what is checked."""
    import gpu.bench as bench

    for name in ("COST_SAMPLES", "FORWARD_CALLS", "ATTENTION_CALLS"):
        monkeypatch.setattr(bench, name, 1)
    monkeypatch.setattr(bench, "ROUND_CALLS", 2)
    out = tmp_path / "costs.json"
    assert bench.bench_main(["--forward-costs", "--block-size", "4", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["command"] == f"schedspec bench engine --forward-costs --block-size 4 --json {out}"
    assert data["block_size"] == 4 and data["device"] == "cpu"
    assert data["timing"] == {
        "samples": 1,
        "forward_calls": 1,
        "attention_calls": 1,
        "round_calls": 2,
    }
    cells = {(c["rows"], c["start"]): c["ms"] for c in data["forward_ms"]}
    assert set(cells) == {(b, s) for b in (1, 4, 16) for s in (0, 24, 48)}
    assert set(data["attention_us_per_layer"]) == {"padded", "grouped", "per_row"}
    figures = [*cells.values(), *data["attention_us_per_layer"].values()]
    assert all(0 < f < 1e6 for f in [*figures, *data["round_ms"].values()])
    printed = capsys.readouterr().out
    assert "CPU ms per forward (block 4), best of 1 x 1" in printed
    assert f"{cells[(16, 48)]:.2f}" in printed and "tiny_model" in printed


def test_bench_main_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gpu.bench as bench

    real = bench.run_bench
    monkeypatch.setattr(
        bench, "run_bench", lambda *a, **k: real(*a, **{**k, "model": tiny_model("cpu")})
    )
    out = tmp_path / "b.json"
    args = ["--max-running", "1", "2", "--requests", "3", "--max-new-tokens", "8"]
    assert bench.bench_main([*args, "--repeats", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    modes = {r["mode"] for r in data["results"]}
    assert modes == {"sync", "fdfo", "fdfo+reuse", "fdfo+reuse+reloop"}
    assert {r["max_running"] for r in data["results"]} == {1, 2}
    assert all(r["tokens_per_s"] > 0 for r in data["results"])
    assert set(data["ratios"]["fdfo/sync"]) == {"1", "2"}
    assert all(r["forwards"] <= r["attention_groups"] <= r["row_forwards"] for r in data["results"])
    # shares of the bounds: FDFO over sync only, each the wall ratio over that bound's ratio
    shares = data["shares_of_bounds"]
    assert set(shares) == {"fdfo/sync", "fdfo+reuse/sync", "fdfo+reuse+reloop/sync"}
    for name, by_m in shares.items():
        assert set(by_m) == {"1", "2"}
        for m, share in by_m.items():
            wall = data["ratios"][name][m]
            assert share["of_work"] == round(wall / data["ratios_work"][name][m], 3)
            assert share["of_forward_time"] > 0
    # one repeat: every range is that repeat's ratio, and the table prints no range
    for clock in ("wall", "cpu", "forward"):
        for by_m in data["ratio_ranges"][clock].values():
            for lo, hi in by_m.values():
                assert lo == hi
    assert set(data["ratio_ranges"]["wall"]["fdfo/sync"]) == {"1", "2"}
    assert data["ratio_ranges"]["wall"]["fdfo/sync"]["2"][0] == data["ratios"]["fdfo/sync"]["2"]
    printed = capsys.readouterr().out
    assert "forward time alone" in printed and "share of the bounds" in printed
    assert "lowest-highest repeat" not in printed


def test_cpu_model_is_read_from_cpuinfo() -> None:
    from gpu.host import cpu_model

    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC  7B13 64-Core\n"
    assert cpu_model(text + "processor\t: 1\nmodel name\t: other\n") == "AMD EPYC 7B13 64-Core"


def test_a_cpu_device_name_names_the_cpu_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu.device_name as named

    monkeypatch.setattr(named, "cpu_model", lambda: "Test CPU 9000")
    monkeypatch.setattr(named, "cpu_capability", lambda: "AVX512")
    name = named.device_name(torch.device("cpu"))
    assert name.startswith("cpu (Test CPU 9000, AVX512; torch ") and name.endswith(" 1 thread)")
    monkeypatch.setattr(named, "cpu_model", lambda: "")
    assert named.device_name(torch.device("cpu")).startswith("cpu (AVX512; torch ")
    monkeypatch.setattr(named, "cpu_capability", lambda: "")
    assert named.device_name(torch.device("cpu")).startswith("cpu (torch ")


def test_the_cpu_capability_is_torchs_own() -> None:
    import gpu.device_name as named

    assert named.cpu_capability() == torch.backends.cpu.get_cpu_capability() != ""


def test_share_of_the_forward_time_ratio_is_paired_per_repeat() -> None:
    """Per repeat, the wall-clock ratio over the forward-time ratio is FDFO's fraction of its
    time in forwards over sync's (the tokens cancel); the share is the median of that over
    the repeats, each FDFO run paired with the sync run of its own repeat."""
    import statistics

    import gpu.bench as bench

    report = bench.run_bench([2], requests=3, max_new_tokens=8, repeats=3, model=tiny_model("cpu"))
    for num in ("fdfo", "fdfo+reuse", "fdfo+reuse+reloop"):
        per_repeat = []
        for run in report.of(2, num):
            (sync,) = [r for r in report.of(2, "sync") if r.repeat == run.repeat]
            wall = run.tokens_per_s / sync.tokens_per_s
            forward = (run.tokens / run.forward_seconds) / (sync.tokens / sync.forward_seconds)
            per_repeat.append(wall / forward)
        assert len(per_repeat) == 3
        share = report.shares_of_bounds()[f"{num}/sync"]["2"]["of_forward_time"]
        assert share == pytest.approx(statistics.median(per_repeat), abs=6e-4)


def test_ratio_ranges_are_the_lowest_and_highest_paired_repeat(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each range is the lowest and highest ratio of an FDFO run to the sync run of its own
    repeat (not of the other repeats), so it holds the median the ratios report; the table
    prints it beside the median; the counted work ratio has none."""
    import statistics

    import gpu.bench as bench

    report = bench.run_bench([2], requests=3, max_new_tokens=8, repeats=3, model=tiny_model("cpu"))
    rates: dict[str, Callable[[bench.BenchRun], float]] = {
        "wall": lambda r: r.tokens_per_s,
        "cpu": lambda r: r.tokens_per_cpu_s,
        "forward": lambda r: r.tokens / r.forward_seconds,
    }
    for clock, rate in rates.items():
        ranges, medians = report.ratio_ranges(clock), report.ratios(clock)
        for num, den in bench.RATIOS:
            dens = {r.repeat: r for r in report.of(2, den)}
            paired = [rate(r) / rate(dens[r.repeat]) for r in report.of(2, num)]
            assert len(paired) == 3
            lo, hi = ranges[f"{num}/{den}"]["2"]
            assert lo == round(min(paired), 3) and hi == round(max(paired), 3)
            assert lo <= medians[f"{num}/{den}"]["2"] <= hi
            assert medians[f"{num}/{den}"]["2"] == round(statistics.median(paired), 3)
    with pytest.raises(ValueError, match="counted, not timed"):
        report.ratio_ranges("work")
    bench._print(report)
    printed = capsys.readouterr().out
    lo, hi = report.ratio_ranges("wall")["fdfo/sync"]["2"]
    line = next(x for x in printed.splitlines() if x.strip().startswith("fdfo/sync"))
    assert f"[{lo:.2f}-{hi:.2f}]" in line
    assert "ratios (median paired, wall clock; [lowest-highest repeat])" in printed
    assert "ratios (model work: row-forwards per token)" in printed


def test_bench_counts_row_rounds_and_block_allocations() -> None:
    """The calibration's per-row-per-round and per-allocation terms are fitted to these
    counters: sync allocates each block once; FDFO without reuse re-allocates every carried
    block, so every row of every round allocates; with reuse a block is allocated once."""
    import gpu.bench as bench

    report = bench.run_bench([2], requests=3, max_new_tokens=8, repeats=1, model=tiny_model("cpu"))
    runs = {r.mode: r for r in report.runs}
    blocks = runs["sync"].block_allocations
    assert blocks >= 3  # at least one block per request
    assert runs["fdfo+reuse"].block_allocations == blocks
    assert runs["fdfo+reuse+reloop"].block_allocations == blocks
    assert runs["fdfo"].block_allocations == runs["fdfo"].row_rounds > blocks
    for run in runs.values():
        assert run.rounds <= run.row_rounds <= 2 * run.rounds
        assert run.forwards <= run.attention_groups <= run.row_forwards


def test_bench_rows_released_serves_sglangs_baseline_beside_the_four_modes() -> None:
    """`--rows-released` adds FDFO whose carried blocks give back their rows: the same work as
    FDFO without reuse (every carried block re-allocated), reported with its ratio over sync
    and reuse's gain over it; without the flag the report is the four modes'."""
    import gpu.bench as bench

    report = bench.run_bench(
        [2], requests=4, max_new_tokens=8, repeats=2, model=tiny_model("cpu"), rows_released=True
    )
    assert [m.name for m in report.modes] == [*(m.name for m in bench.MODES), "fdfo+rows-released"]
    runs = {r.mode: r for r in report.runs if r.repeat == 0}
    same = ("tokens", "forwards", "row_forwards", "rounds", "row_rounds", "block_allocations")
    work = {mode: tuple(getattr(runs[mode], f) for f in same) for mode in runs}
    assert work["fdfo+rows-released"] == work["fdfo"]
    ratios = report.ratios()
    assert set(ratios) == {f"{n}/{d}" for n, d in bench.RATIOS + bench.ROWS_RELEASED_RATIOS}
    assert "fdfo+rows-released/sync" in report.shares_of_bounds()
    payload = report.to_json()
    assert {r["mode"] for r in payload["results"]} == {m.name for m in report.modes}
    assert payload["settings"]["rows_released"] is True
    # the padding the run's products had, for comparing runs across machines
    assert payload["settings"]["product_rows"] == tiny_model("cpu").product_rows() >= 16
    plain = bench.run_bench([2], requests=4, max_new_tokens=8, repeats=1, model=tiny_model("cpu"))
    assert plain.modes == bench.MODES and set(plain.ratios()) == {
        f"{n}/{d}" for n, d in bench.RATIOS
    }


def test_bench_turns_change_the_timing_only() -> None:
    """Interleaving in time slices or round by round changes when each engine runs, never what
    it does: the work of every mode is the same either way."""
    import gpu.bench as bench

    def work(turn_ms: float) -> dict[str, tuple[int, int, int, int]]:
        report = bench.run_bench(
            [2], requests=4, max_new_tokens=8, repeats=1, model=tiny_model("cpu"), turn_ms=turn_ms
        )
        assert report.settings["turn_ms"] == turn_ms
        return {r.mode: (r.tokens, r.forwards, r.row_forwards, r.rounds) for r in report.runs}

    assert work(0) == work(10_000)
    with pytest.raises(ConfigError):
        bench.run_bench([2], requests=4, repeats=1, model=tiny_model("cpu"), turn_ms=-1)


def test_bench_refuses_modes_that_decoded_differently() -> None:
    """The paired ratios compare like with like only if every mode served the same tokens; a
    mode whose engine decoded a request otherwise (here: its output tampered with after a run)
    makes the benchmark fail, naming the mode and the request."""
    import gpu.bench as bench

    cpu = torch.device("cpu")
    setup = bench.serving(tiny_model("cpu"), requests=3, max_new_tokens=8, block_size=4,
                          page_size=4, algorithm="LowConfidence", device=cpu)  # fmt: skip
    engines = [setup.engine(mode, 2) for mode in bench.MODES]
    for engine in engines:
        engine.drain()
    bench.check_same_outputs(bench.MODES, engines)  # the engine's modes agree
    rid = next(iter(engines[2].outputs))
    engines[2].outputs[rid] = (*engines[2].outputs[rid][:-1], -1)
    with pytest.raises(RuntimeError, match=rf"{re.escape(bench.MODES[2].name)} decoded 1 of 3 "):
        bench.check_same_outputs(bench.MODES, engines)


@pytest.mark.parametrize("mode", [Mode.SYNC, Mode.FDFO])
def test_attention_groups_are_the_distinct_context_lengths_per_forward(mode: Mode) -> None:
    """The profile's attention-call count: per forward, one group per distinct context length
    (a row at block k attends to (k + 1) * B keys), summed; read here from the forward log."""
    config = DllmConfig(
        block_size=4, page_size=4, kv_pages=64, max_context=32, mode=mode,
        in_place_reuse=mode is Mode.FDFO, max_running_requests=4,
    )  # fmt: skip
    engine = DllmEngine(config, lambda e: None, model=tiny_model("cpu"),
                        algorithm=make_algorithm("LowConfidence"), record=True)  # fmt: skip
    for i, prompt in enumerate([(1, 2), (3, 4, 5, 6, 7), (8,), (9, 10, 11, 12, 13, 14, 15)]):
        engine.submit(RequestSpec(f"r{i}", prompt, 8 + 2 * i))
    engine.drain()
    want = sum(len({k for _, k in record.rows}) for record in engine.forward_log)
    assert engine.runner.attention_groups == want
    assert engine.runner.forwards <= want <= engine.rows_forwarded
    if mode is Mode.FDFO:  # rows drift apart: some forward mixes context lengths
        assert want > engine.runner.forwards


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs CUDA: on the CPU every tensor is a host tensor, so there is nothing to catch",
)
@pytest.mark.parametrize("algorithm", ["LowConfidence", "JointThreshold"])
def test_preparing_a_round_reads_nothing_back_from_the_device(
    algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starting blocks and allocating their KV happen on the host: no `tolist` / `item` of a
    device tensor between rounds (JointThreshold's state reads the block's host copy), so on
    CUDA the only reads are the step's flags and the committed tokens."""
    engine = _three_seat_engine(lambda e: None, Mode.FDFO, True, algorithm, device="cuda")
    devices: list[str] = []
    real_tolist, real_item = torch.Tensor.tolist, torch.Tensor.item

    def tolist(self: torch.Tensor) -> object:
        devices.append(self.device.type)
        return real_tolist(self)

    def item(self: torch.Tensor) -> object:
        devices.append(self.device.type)
        return real_item(self)

    real_prepare = engine._prepare_batch

    def prepare() -> object:
        with monkeypatch.context() as patch:
            patch.setattr(torch.Tensor, "tolist", tolist)
            patch.setattr(torch.Tensor, "item", item)
            return real_prepare()

    engine._prepare_batch = prepare  # type: ignore[assignment,method-assign]
    _submit_growing_prompts(engine, 5, 9)
    engine.drain()
    assert engine.is_idle()
    assert "cuda" not in devices


@pytest.mark.parametrize(
    ("mode", "reuse"), [(Mode.SYNC, False), (Mode.FDFO, False), (Mode.FDFO, True)]
)
def test_the_device_paths_serve_what_the_cpu_paths_serve(
    mode: Mode, reuse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA the table is written by one `index_put_` and the plan reads it by a gather;
    on the CPU both go through numpy views instead, so the device paths would first run on a
    GPU. Forced on the CPU here, they must give the same outputs and the same event stream."""
    import gpu.model

    def serve(device_paths: bool) -> tuple[dict[str, tuple[int, ...]], list[Event], int]:
        events: list[Event] = []
        engine = _three_seat_engine(events.append, mode, reuse, "LowConfidence")
        puts = 0
        if device_paths:
            engine.req_pool._table_np = None  # the branch a device table takes
            real_put = engine.req_pool.req_to_token.index_put_

            def index_put_(*args: object) -> torch.Tensor:
                nonlocal puts
                puts += 1
                return real_put(*args)  # type: ignore[arg-type]

            engine.req_pool.req_to_token.index_put_ = index_put_  # type: ignore[assignment,method-assign]
        _submit_growing_prompts(engine, 6, 11)
        with monkeypatch.context() as patch:
            if device_paths:
                patch.setattr(gpu.model, "_slots_by_slicing", gpu.model._slots_by_gather)
            engine.drain()
        assert engine.is_idle() and engine.allocator.free_slot_set() == frozenset(range(256))
        return dict(engine.outputs), events, puts

    outputs, events, _ = serve(device_paths=False)
    device_outputs, device_events, puts = serve(device_paths=True)
    assert puts > 0  # the tensor write really served the table
    assert device_outputs == outputs and len(outputs) == 6
    assert device_events == events


def test_too_many_new_tokens_names_the_most_that_fit() -> None:
    """The benchmark and the parity run size the context the same way: whole blocks for the
    longest prompt plus the new tokens. Past the model's context the error names the most new
    tokens that fit, and that many are accepted."""
    from gpu.bench import serving
    from gpu.prompts import block_context, load_prompts
    from gpu.tokenizer import TOKENIZER

    assert block_context([5, 22], 10, 8, 256) == 32  # 22 + 10 = 32, already whole blocks
    assert block_context([22], 11, 8, 256) == 40
    model = tiny_model("cpu")
    context = model.config.max_context
    prompts = load_prompts()
    longest = max(len(TOKENIZER.encode(p)) for p in prompts)
    most = context // 8 * 8 - longest

    def serve(new_tokens: int) -> int:
        return serving(
            model,
            requests=len(prompts),  # every prompt once, the longest among them
            max_new_tokens=new_tokens,
            block_size=8,
            page_size=16,
            algorithm="LowConfidence",
            device=torch.device("cpu"),
        ).max_context

    assert serve(most) == context // 8 * 8
    with pytest.raises(ConfigError, match=f"use at most {most} new tokens") as err:
        serve(most + 1)
    assert f"the model's context is {context}" in str(err.value)
