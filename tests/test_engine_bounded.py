"""Bounded state in the torch engine: a server-like run of N requests with aborts leaves the
engine's per-request and per-forward containers no larger than a run of N / 3 does.

Sizes are read from `DllmEngine.retained_sizes()`; nothing here measures time or RSS (the soak
benchmark, scripts/soak_engine.py, reports RSS).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from gpu.algorithms import make_algorithm
from gpu.allocator import PagedKvAllocator
from gpu.engine import DllmEngine, NoRetainedOutput, tiny_model
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError, DuplicateRequest
from tests.script_module import load_script

torch.set_num_threads(1)

CONFIG = DllmConfig(
    block_size=4,
    page_size=4,
    kv_pages=32,
    req_pool_rows=4,
    max_running_requests=4,
    max_context=32,
    mode=Mode.FDFO,
    eos_token_id=15,
)
CAPS = {"forward_log_cap": 6, "max_retained_outputs": 5, "retired_id_window": 7}


def _engine(**kwargs: object) -> DllmEngine:
    return DllmEngine(
        CONFIG,
        lambda e: None,
        model=tiny_model("cpu"),
        algorithm=make_algorithm("LowConfidence", {}),
        **kwargs,  # type: ignore[arg-type]
    )


def _serve(engine: DllmEngine, n: int, seed: int = 3) -> tuple[dict[str, int], int, int]:
    """n requests in waves of 6, about one in five aborted (queued or running); never takes
    outputs. Returns the peak of every container size, and the finished and aborted counts."""
    rng = random.Random(seed)
    peak: dict[str, int] = {}

    def observe() -> None:
        for key, size in engine.retained_sizes().items():
            peak[key] = max(peak.get(key, 0), size)

    aborted = 0
    for wave in range(0, n, 6):
        ids = [f"r{i}" for i in range(wave, min(n, wave + 6))]
        for rid in ids:
            prompt = tuple(rng.randrange(15) for _ in range(rng.randint(1, 5)))
            engine.submit(RequestSpec(rid, prompt, rng.randint(2, 8)))
        doomed = [rid for rid in ids if rng.random() < 0.2]
        observe()
        engine.run_round()
        live = {r.rid for r in (*engine.waiting, *engine.running)}
        for rid in doomed:
            if rid in live:  # queued, or running and not finished in that round
                engine.abort(rid)
                aborted += 1
        while not engine.is_idle():
            engine.run_round()
            observe()
    return peak, n - aborted, aborted


def test_container_sizes_do_not_grow_with_the_number_of_requests() -> None:
    small, large = _engine(record=True, **CAPS), _engine(record=True, **CAPS)
    peak_n, fin_n, ab_n = _serve(small, 24)
    peak_3n, fin_3n, ab_3n = _serve(large, 72)
    assert ab_n > 0 and ab_3n > ab_n and fin_3n > fin_n  # the runs did what they should
    end_n, end_3n = small.retained_sizes(), large.retained_sizes()
    grown = {k: (end_n[k], end_3n[k]) for k in end_n if end_n[k] != end_3n[k]}
    assert not grown, f"containers (N, 3N requests) differ: {grown}"
    # the caps are reached and held: the retained containers are full, the live ones empty
    assert end_3n["outputs"] == CAPS["max_retained_outputs"]
    assert end_3n["forward_log"] == CAPS["forward_log_cap"]
    assert end_3n["retired_ids"] == CAPS["retired_id_window"]
    for key in ("waiting", "running", "live_ids", "allocator_handles", "held_rows"):
        assert end_3n[key] == 0, key
    # at no point does the larger run hold more than the bound the config and caps set
    bound = {
        "waiting": 6,
        "running": CONFIG.max_running_requests,
        "live_ids": 6,
        "retired_ids": CAPS["retired_id_window"],
        "outputs": CAPS["max_retained_outputs"],
        "forward_log": CAPS["forward_log_cap"],
        "allocator_handles": 6,
        "held_rows": CONFIG.req_pool_rows,
        "cached_blocks": 0,  # no prefix cache here
        "cache_readers": 0,
    }
    for key, limit in bound.items():
        assert peak_3n[key] <= limit and peak_n[key] <= limit, (key, peak_n, peak_3n)
    # what was let go is counted
    assert large.outputs_dropped == fin_3n - CAPS["max_retained_outputs"]
    assert large.forward_log_dropped == large.runner.forwards - CAPS["forward_log_cap"]
    assert large.forward_log_dropped > small.forward_log_dropped


def test_a_prefix_cache_stays_within_the_pool_and_is_read_only_by_running_requests() -> None:
    """With the prefix cache on, the cached blocks never outnumber the pool's pages, only
    running requests read them, and the cache's containers end no larger after 3N requests
    than the pool allows; every other container behaves as without the cache."""
    cached = CONFIG.replace(prefix_cache=True)

    def engine() -> DllmEngine:
        return DllmEngine(
            cached,
            lambda e: None,
            model=tiny_model("cpu"),
            algorithm=make_algorithm("LowConfidence", {}),
            forward_log_cap=CAPS["forward_log_cap"],
            max_retained_outputs=CAPS["max_retained_outputs"],
            retired_id_window=CAPS["retired_id_window"],
        )

    small, large = engine(), engine()
    peak_n, _, _ = _serve(small, 24)
    peak_3n, _, _ = _serve(large, 72)
    for peak in (peak_n, peak_3n):
        assert 0 < peak["cached_blocks"] <= cached.kv_pages, peak
        assert peak["cache_readers"] <= cached.max_running_requests, peak
    for end in (small.retained_sizes(), large.retained_sizes()):
        assert end["cache_readers"] == 0 and end["running"] == 0, end
    assert large.prefix_cache is not None and large.prefix_cache.reads == {}
    large.allocator.check_consistency()


def test_forward_log_is_opt_in() -> None:
    engine = _engine()
    _serve(engine, 6)
    assert engine.runner.forwards > 0
    assert len(engine.forward_log) == 0 and engine.runner.last_digest is None


def test_outputs_are_taken_and_forgotten() -> None:
    engine = _engine()
    _serve(engine, 12)
    outputs = dict(engine.outputs)
    assert outputs
    rid = next(iter(outputs))
    assert engine.take_output(rid) == outputs[rid]
    with pytest.raises(NoRetainedOutput, match=rf"{rid!r}: .*already taken"):
        engine.take_output(rid)  # taken
    with pytest.raises(NoRetainedOutput):
        engine.output_text(rid)
    rest = engine.take_outputs()
    assert rest == {k: v for k, v in outputs.items() if k != rid}
    assert engine.outputs == {} and engine.retained_sizes()["outputs"] == 0


def test_duplicate_ids_refused_within_the_window_accepted_beyond() -> None:
    engine = _engine(retired_id_window=2)
    for rid in ("a", "b", "c"):
        engine.submit(RequestSpec(rid, (1, 2), 2))
    engine.abort("a")
    with pytest.raises(DuplicateRequest):
        engine.submit(RequestSpec("b", (1,), 2))  # queued
    engine.drain()
    for rid in ("b", "c"):  # the last two retired
        with pytest.raises(DuplicateRequest):
            engine.submit(RequestSpec(rid, (1,), 2))
    engine.submit(RequestSpec("a", (1,), 2))  # retired before the window: accepted
    engine.drain()
    assert "a" in engine.outputs


@pytest.mark.parametrize("field", sorted(CAPS))
@pytest.mark.parametrize("value", [-1, 1.5, True, "8"])
def test_caps_are_validated(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        _engine(**{field: value})


def test_the_soak_ends_with_nothing_held_and_exits_1_on_a_leak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The soak's own verdict: after every request ends no KV slot, row or handle is held
    (exit 0); an engine that keeps its slots when a request ends is reported (exit 1)."""
    soak = load_script("soak_engine")
    out = tmp_path / "soak.json"
    assert soak.main(["--requests", "40", "--every", "20", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    last = report["checkpoints"][-1]
    assert report["leaked"] is False and report["device"].startswith("cpu")
    assert last["requests_done"] == 40 and last["used_slots"] == 0
    assert last["sizes"]["held_rows"] == 0 and last["device_allocated_kib"] is None
    assert any(c["used_slots"] > 0 for c in report["checkpoints"][1:-1])  # the column is live
    capsys.readouterr()

    monkeypatch.setattr(PagedKvAllocator, "free_all", lambda self, handle: None)
    assert soak.main(["--requests", "6", "--abort-rate", "0"]) == 1
    assert "LEAK at the end:" in capsys.readouterr().out


def test_the_soak_with_the_prefix_cache_ends_with_no_reader_and_exits_1_on_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--prefix-cache --stems 2`: prompts start with one of two blocks, so requests read what
    earlier ones cached; the cache fills with committed blocks (never beyond the pool) and no
    request reads one at the end (exit 0); an engine whose requests never stop reading is
    reported (exit 1)."""
    from gpu.prefix_cache import BlockCache

    soak = load_script("soak_engine")
    out = tmp_path / "soak.json"
    argv = ["--requests", "40", "--every", "20", "--prefix-cache", "--stems", "2"]
    assert soak.main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["prefix_cache"] is True and report["leaked"] is False
    assert report["stems"] == 2 and report["totals"]["cache_hits"] > 10, report["totals"]
    sizes = [c["sizes"] for c in report["checkpoints"]]
    assert max(s["cached_blocks"] for s in sizes) > 0 and sizes[-1]["cache_readers"] == 0
    capsys.readouterr()

    monkeypatch.setattr(BlockCache, "release", lambda self, rid: None)
    assert soak.main(["--requests", "6", "--abort-rate", "0", "--prefix-cache"]) == 1
    assert "requests reading the cache" in capsys.readouterr().out


def test_the_soak_refuses_an_unusable_device_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    soak = load_script("soak_engine")
    assert soak.main(["--requests", "1", "--device", "tpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("soak_engine: error: --device:") and err.count("\n") == 1
