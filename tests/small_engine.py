"""The small engine serving the seeded prompts `parity --impl gpu.engine:SMALL_ENGINE` serves
(for the golden-tie tests: the first prompt's golden decoding takes a near-tie)."""

from __future__ import annotations

from gpu.engine import DllmEngine, make_small_engine
from schedspec_cli.parity_impl import EOS, MASK, parity_prompts
from spec.batch_parity import MODE_VARIANTS, context_for, variant_config
from spec.config import DllmConfig, RequestSpec


def seeded_small_engine() -> tuple[DllmEngine, list[RequestSpec]]:
    """The small engine (block 8, page 16, sync at batch size 1) and the 8 seeded token prompts
    of 32 new tokens `parity --impl gpu.engine:SMALL_ENGINE --prompts 8` serves; the first's
    golden decoding takes a near-tie by output token 3."""
    requests = parity_prompts(8, 32)
    base = DllmConfig(
        block_size=8,
        page_size=16,
        max_context=context_for(requests, 8, 16),
        mask_token_id=MASK,
        eos_token_id=EOS,
    )
    engine = make_small_engine(variant_config(base, MODE_VARIANTS[0], 1), lambda e: None)
    assert isinstance(engine, DllmEngine)
    return engine, list(requests)
