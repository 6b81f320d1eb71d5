"""Batch-size-1 parity of the torch engine: FDFO output bytes and per-forward logits digests
equal sync's, as a property over generated prompts and configurations, and on the shipped
model with the shipped prompt set (`run_parity`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu.engine import tiny_model
from gpu.parity import VARIANTS, Variant, bs1_config, run_bs1, run_parity
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import ConfigError
from spec.parity import encode_tokens

torch.set_num_threads(1)

CPU = torch.device("cpu")
FDFO_VARIANTS = [v for v in VARIANTS if v.mode is Mode.FDFO]


@st.composite
def _cases(draw: st.DrawFn) -> tuple[str, DllmConfig, DllmConfig, list[RequestSpec]]:
    algorithm = draw(st.sampled_from(["LowConfidence", "JointThreshold"]))
    block = draw(st.sampled_from([4, 8]))
    page = block * draw(st.integers(1, 2))
    variant: Variant = draw(st.sampled_from(FDFO_VARIANTS))
    foreign = draw(st.booleans())  # the suite's ids (mask -1, EOS 15) or the tokenizer's
    n = draw(st.integers(1, 3))
    vocab = 16 if foreign else 49
    low = 0 if foreign else 3  # native prompts: characters only
    requests = [
        RequestSpec(
            f"r{i}",
            tuple(draw(st.lists(st.integers(low, vocab - 1), min_size=1, max_size=20))),
            draw(st.integers(1, 24)),
        )
        for i in range(n)
    ]
    longest = max(len(r.prompt) + r.max_new_tokens for r in requests)
    context = -(-longest // page) * page
    sync = bs1_config(block, page, context, VARIANTS[0])
    fdfo = bs1_config(block, page, context, variant)
    if foreign:
        sync, fdfo = (c.replace(mask_token_id=-1, eos_token_id=15) for c in (sync, fdfo))
    return algorithm, sync, fdfo, requests


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(_cases())
def test_fdfo_equals_sync_at_batch_size_1(
    case: tuple[str, DllmConfig, DllmConfig, list[RequestSpec]],
) -> None:
    algorithm, sync_cfg, fdfo_cfg, requests = case
    params = {"max_post_edit_steps": 4} if algorithm == "JointThreshold" else {}
    model = tiny_model("cpu")
    sync = run_bs1(model, algorithm, sync_cfg, requests, CPU, "sync", params)
    fdfo = run_bs1(model, algorithm, fdfo_cfg, requests, CPU, "fdfo", params)
    for r in requests:
        rid = r.request_id
        assert encode_tokens(fdfo.outputs[rid]) == encode_tokens(sync.outputs[rid]), rid
        assert fdfo.digests[rid] == sync.digests[rid], f"{rid}: logits differ"
        assert sync.digests[rid], "every request runs at least one forward"
    assert sync.leaked_slots == fdfo.leaked_slots == 0
    assert sync.leaked_rows == fdfo.leaked_rows == 0


def test_digests_see_a_different_model() -> None:
    """Control: the digest comparison is not vacuous (another model, other digests)."""
    cfg = bs1_config(4, 4, 32, VARIANTS[0])
    req = [RequestSpec("a", (5, 6, 7), 8)]
    one = run_bs1(tiny_model("cpu", 1), "LowConfidence", cfg, req, CPU)
    two = run_bs1(tiny_model("cpu", 2), "LowConfidence", cfg, req, CPU)
    assert one.digests["a"] != two.digests["a"]


@pytest.mark.slow
def test_run_parity_on_the_shipped_model() -> None:
    report = run_parity("cpu", ["LowConfidence", "JointThreshold"], 4, 32)
    assert report.identical, [c.to_json() for c in report.cases if not c.identical]
    assert report.leaked_slots == 0 and report.leaked_rows == 0
    assert len(report.cases) == 8
    data = report.to_json()
    assert data["device"] == "cpu" and data["identical"] is True and data["leaked_slots"] == 0
    assert all(c["forwards"] > 0 for c in data["cases"])


def test_parity_main_exit_codes(
    tmp_path: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI entry: a table, JSON, exit 0; a typed error for CUDA without CUDA."""
    import json
    from pathlib import Path

    import gpu.parity as parity
    from gpu.engine import DeviceUnavailable

    monkeypatch.setattr(
        parity,
        "run_parity",
        lambda *a, **k: run_parity(*a, **{**k, "model": tiny_model("cpu")}),
    )
    out = Path(str(tmp_path)) / "p.json"
    args = ["--algorithm", "LowConfidence", "--prompts", "2", "--max-new-tokens", "8"]
    code = parity.parity_main([*args, "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert set(data) >= {"device", "identical", "leaked_slots", "cases"}
    assert "IDENTICAL" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailable):
        parity.parity_main(["--device", "cuda", "--prompts", "1"])


def test_batch_invariant_numerics_are_set_and_restored() -> None:
    from gpu.parity import batch_invariant_numerics

    matmul = torch.backends.cuda.matmul
    before = (torch.are_deterministic_algorithms_enabled(), matmul.allow_tf32)
    with batch_invariant_numerics() as numerics:
        assert torch.are_deterministic_algorithms_enabled()
        assert not matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "highest"
        assert numerics["sdpa_backend"] == "math"
    assert (torch.are_deterministic_algorithms_enabled(), matmul.allow_tf32) == before


def test_run_parity_reports_batch_and_golden() -> None:
    """Every mode at batch 1 and 3, golden agreement per case (tiny model, 3 prompts)."""
    report = run_parity("cpu", ["JointThreshold"], 3, 8, 4, 8, model=tiny_model("cpu"), batch=3)
    data = report.to_json()
    assert data["impl"] == "engine" and data["batch_sizes"] == [1, 3]
    assert data["golden"] is True and all(c["golden"] is True for c in data["cases"])
    assert len(report.seconds) == 8  # 4 modes x 2 batch sizes
    with pytest.raises(ConfigError):
        run_parity("cpu", ["JointThreshold"], 3, 8, 4, 8, model=tiny_model("cpu"), batch=1)


def test_the_default_case_list_is_every_distinct_shipped_prompt_once() -> None:
    """`parity` with no --prompts runs each distinct text of the shipped set once, so its report
    passes the release gate's distinct-case rule. The set has a repeated entry; before the
    case list was de-duplicated, the default run (32 cases) was refused for it on CUDA."""
    from gpu.prompts import load_prompts, parity_texts
    from schedspec_cli.release import release_problems

    texts = parity_texts()
    assert len(texts) == len(set(texts)) and set(texts) == set(load_prompts())
    assert texts == sorted(texts, key=load_prompts().index)  # the set's order
    report = run_parity(
        "cpu", ["LowConfidence", "JointThreshold"], None, 4, 4, 8, model=tiny_model("cpu")
    )
    data = report.to_json()
    for algorithm in ("LowConfidence", "JointThreshold"):
        cases = [c["prompt"] for c in data["cases"] if c["algorithm"] == algorithm]
        assert cases == texts
    assert not [p for p in release_problems(data) if "repeated" in p], release_problems(data)
    with pytest.raises(ConfigError, match=f"between 1 and {len(texts)} "):
        run_parity("cpu", ["JointThreshold"], len(texts) + 1, 4, model=tiny_model("cpu"))


def test_a_mismatched_run_is_named_by_the_batch_size_it_ran_at(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FDFO runs a different model (a planted batch-parity bug): two prompts under `batch=4`
    ran at batch size 2, so `mismatched` names `fdfo@2`, as `seconds` does (it said `fdfo@4`)."""
    import gpu.parity as parity
    from gpu.algorithms import make_algorithm
    from gpu.engine import DllmEngine
    from gpu.model import BlockDiffusionLM
    from spec.adapter import EventSink

    other = tiny_model("cpu", 2)

    def factory(
        model: BlockDiffusionLM, algorithm: str, device: torch.device
    ) -> Callable[[DllmConfig, EventSink], DllmEngine]:
        def make(config: DllmConfig, sink: EventSink) -> DllmEngine:
            use = other if config.mode is Mode.FDFO else model
            return DllmEngine(
                config, sink, model=use, algorithm=make_algorithm(algorithm), device=device
            )

        return make

    monkeypatch.setattr(parity, "_engine_factory", factory)
    report = run_parity("cpu", ["LowConfidence"], 2, 8, 4, 8, model=tiny_model("cpu"), batch=4)
    data = report.to_json()
    assert data["batch_sizes"] == [1, 2] and data["identical"] is False
    named = {name for case in data["cases"] for name in case["mismatched"]}
    assert "fdfo@2" in named and not any(name.endswith("@4") for name in named), named
    assert {f"LowConfidence/{name}" for name in named} <= set(data["seconds"]), data["seconds"]


def test_the_summary_batch_size_is_one_every_algorithm_reached() -> None:
    """With several algorithms, each one's runs set the report's batch size: before, the last
    algorithm's widest forward stood for all of them. Two algorithms' runs into one report,
    the second at batch 4 after the first at 2: the summary says 2 (both reached it; it said
    4), the probe covers the widest forward of any (4), and each run is named by its own
    width."""
    from gpu.parity import REFERENCE, ParityReport, run_algorithm
    from gpu.prompts import parity_cases
    from gpu.tokenizer import TOKENIZER
    from gpu.weights import load_model

    model = load_model()[0]
    texts = parity_cases(4)
    requests = [
        RequestSpec(f"p{i:03d}", tuple(TOKENIZER.encode(t)), 8) for i, t in enumerate(texts)
    ]
    base = bs1_config(4, 16, 96, REFERENCE)
    report = ParityReport(device="cpu", identical=True, leaked_slots=0)
    run_algorithm(model, "LowConfidence", base, texts, requests, CPU, 2, report)
    assert report.batch_sizes == (1, 2) and report.widest_forward == 2
    run_algorithm(model, "JointThreshold", base, texts, requests, CPU, 4, report)
    assert report.batch_sizes == (1, 2) and report.widest_forward == 4
    assert "LowConfidence/sync@2" in report.seconds and "JointThreshold/sync@4" in report.seconds
