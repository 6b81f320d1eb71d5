"""The golden oracle (`gpu.golden`): every engine output, at batch sizes 1, 4 and 16, in every
mode (sync, fdfo, fdfo+reuse, fdfo+reuse+reloop) and with both algorithms, equals the request's
dense, unpaged, unbatched decoding byte for byte, finish reason included (on CPU)."""

from __future__ import annotations

import random
from functools import lru_cache

import pytest
import torch

from gpu.algorithms import make_algorithm
from gpu.engine import DllmEngine, tiny_model
from gpu.golden import GoldenDecode, golden_decode
from gpu.model import BlockDiffusionLM
from gpu.parity import VARIANTS, Variant, engine_config
from gpu.tokenizer import EOS_ID, MASK_ID
from spec.config import DllmConfig, RequestSpec
from spec.errors import PromptTooLong
from spec.events import Event, Finished, FinishReason
from spec.machine import SpecMachine
from spec.parity import encode_tokens

torch.set_num_threads(1)

ALGORITHMS = {"LowConfidence": {}, "JointThreshold": {"max_post_edit_steps": 4}}
BLOCK = 4
CONTEXT = 64  # tiny_model's context


def _requests(n: int, seed: int) -> list[RequestSpec]:
    """Prompts of 1..13 characters (full and partial prompt blocks), 1..24 new tokens."""
    rng = random.Random(seed)
    return [
        RequestSpec(
            f"r{i:02d}",
            tuple(rng.randrange(3, 49) for _ in range(rng.randint(1, 13))),
            rng.randint(1, 24),
        )
        for i in range(n)
    ]


def _config(batch: int, variant: Variant) -> DllmConfig:
    return engine_config(BLOCK, 8, CONTEXT, variant, batch)


def _run_engine(
    model: BlockDiffusionLM, algorithm: str, config: DllmConfig, requests: list[RequestSpec]
) -> tuple[dict[str, tuple[int, ...]], dict[str, FinishReason], int]:
    """Outputs, finish reasons and the largest batch a forward ran (events spec-checked)."""
    machine = SpecMachine(config)
    reasons: dict[str, FinishReason] = {}
    widest = 0

    def sink(event: Event) -> None:
        nonlocal widest
        machine.apply(event)
        if isinstance(event, Finished):
            reasons[event.request_id] = event.reason
        rows = getattr(event, "rows", None)
        if isinstance(rows, tuple):
            widest = max(widest, len(rows))

    engine = DllmEngine(
        config, sink, model=model, algorithm=make_algorithm(algorithm, ALGORITHMS[algorithm])
    )
    for r in requests:
        engine.submit(r)
    engine.drain()
    return engine.take_outputs(), reasons, widest


@lru_cache(maxsize=4)
def _golden(algorithm: str, seed: int) -> dict[str, GoldenDecode]:
    model = tiny_model("cpu")
    algo = make_algorithm(algorithm, ALGORITHMS[algorithm])
    cfg = _config(1, VARIANTS[0])
    return {r.request_id: golden_decode(model, algo, cfg, r) for r in _requests(16, seed)}


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_engine_equals_golden(algorithm: str, batch: int, variant: Variant) -> None:
    seed = 12
    requests = _requests(16, seed)
    golden = _golden(algorithm, seed)
    outputs, reasons, widest = _run_engine(
        tiny_model("cpu"), algorithm, _config(batch, variant), requests
    )
    assert widest == batch, "the engine ran the batch size under test"
    for r in requests:
        rid = r.request_id
        want = golden[rid]
        assert encode_tokens(outputs[rid]) == encode_tokens(want.tokens), (
            f"{rid}: engine {list(outputs[rid])} != golden {list(want.tokens)}"
        )
        assert reasons[rid] is want.finish_reason, rid


def test_golden_is_not_vacuous() -> None:
    """Both finish reasons occur, outputs vary, and prompt-only blocks take one forward."""
    golden = _golden("LowConfidence", 12)
    assert {g.finish_reason for g in golden.values()} == {FinishReason.EOS, FinishReason.LENGTH}
    assert len({g.tokens for g in golden.values()}) > 8
    for r in _requests(16, 12):
        g = golden[r.request_id]
        full = len(r.prompt) // BLOCK
        assert g.forwards_per_block[:full] == (1,) * full
        assert all(f >= 2 for f in g.forwards_per_block[full:])


def test_golden_sees_another_model() -> None:
    """Control: a differently seeded model decodes differently."""
    cfg = _config(1, VARIANTS[0])
    algo = make_algorithm("LowConfidence")
    reqs = _requests(8, 3)
    one = [golden_decode(tiny_model("cpu", 1), algo, cfg, r).tokens for r in reqs]
    two = [golden_decode(tiny_model("cpu", 2), algo, cfg, r).tokens for r in reqs]
    assert one != two


def test_golden_refuses_what_the_engine_refuses() -> None:
    cfg = _config(1, VARIANTS[0])
    with pytest.raises(PromptTooLong):
        golden_decode(
            tiny_model("cpu"), make_algorithm("LowConfidence"), cfg, RequestSpec("x", (5,) * 60, 8)
        )


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_shipped_model_equals_golden_at_batch_4(algorithm: str) -> None:
    """The trained model, blocks of 8, shipped prompts, FDFO with reuse and re-loop."""
    from gpu.engine import _shipped_model
    from gpu.prompts import load_prompts
    from gpu.tokenizer import TOKENIZER

    model = _shipped_model("cpu")
    requests = [
        RequestSpec(f"p{i}", tuple(TOKENIZER.encode(text)), 24)
        for i, text in enumerate(load_prompts()[:6])
    ]
    variant = VARIANTS[-1]
    cfg = DllmConfig(
        block_size=8,
        page_size=16,
        kv_pages=4 * 8,
        req_pool_rows=4,
        max_running_requests=4,
        max_context=128,
        mode=variant.mode,
        in_place_reuse=True,
        reloop=True,
        mask_token_id=MASK_ID,
        eos_token_id=EOS_ID,
    )
    outputs, reasons, widest = _run_engine(model, algorithm, cfg, requests)
    assert widest == 4
    algo = make_algorithm(algorithm, ALGORITHMS[algorithm])
    for r in requests:
        want = golden_decode(model, algo, cfg, r)
        assert outputs[r.request_id] == want.tokens, r.request_id
        assert reasons[r.request_id] is want.finish_reason, r.request_id


def test_engine_is_a_golden_decoder() -> None:
    """`DllmEngine.golden_output` delegates to gpu.golden, in the config's ids; it changes
    nothing in the engine."""
    from spec.golden import GoldenDecoder

    cfg = _config(2, VARIANTS[1]).replace(mask_token_id=-1, eos_token_id=15)
    algo = make_algorithm("LowConfidence")
    engine = DllmEngine(cfg, lambda e: None, model=tiny_model("cpu"), algorithm=algo)
    assert isinstance(engine, GoldenDecoder)
    req = RequestSpec("g", (1, 2, 3, 4, 5), 9)
    got = engine.golden_output(req)
    want = golden_decode(tiny_model("cpu"), algo, cfg, req)
    assert (got.tokens, got.reason) == (want.tokens, want.finish_reason)
    assert engine.is_idle() and engine.snapshot().leaked_slots() == 0
    engine.submit(req)
    engine.drain()
    assert engine.take_output("g") == got.tokens


def test_golden_needs_a_dllm_algorithm() -> None:
    from gpu.golden import GoldenUnavailable

    class Bare:
        def init_step_state(self, block_tokens: torch.Tensor) -> object:
            return None

        def step(
            self, tokens: torch.Tensor, logits: torch.Tensor, states: list[object]
        ) -> list[bool]:
            return [True] * tokens.shape[0]

    engine = DllmEngine(
        _config(1, VARIANTS[0]),
        lambda e: None,
        model=tiny_model("cpu"),
        algorithm=Bare(),  # type: ignore[arg-type]
    )
    with pytest.raises(GoldenUnavailable) as info:
        engine.golden_output(RequestSpec("g", (5,), 2))
    assert "DllmAlgorithm" in str(info.value)
