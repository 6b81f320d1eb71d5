"""Bad input to the torch engine: every case raises a typed error from `spec.errors` (or a
subclass) and leaves the engine untouched — no event, nothing allocated, nothing queued."""

from __future__ import annotations

import pytest
import torch

from gpu.algorithms import make_algorithm
from gpu.engine import DeviceUnavailable, DllmEngine, make_small_engine, resolve_device, tiny_model
from gpu.errors import UnknownAlgorithm
from gpu.token_map import TokenOutOfVocabulary
from gpu.tokenizer import MASK_ID, VOCAB_SIZE
from spec.config import DllmConfig, Mode, RequestSpec
from spec.errors import (
    ConfigError,
    DuplicateRequest,
    EmptyPrompt,
    InvalidRequest,
    PromptTooLong,
    RequestError,
    RequestTooLarge,
    UnknownRequest,
)
from spec.events import Event

torch.set_num_threads(1)

CONFIG = DllmConfig(block_size=4, page_size=8, kv_pages=4, max_context=24, eos_token_id=15)
V = VOCAB_SIZE
HOLE = (MASK_ID - 3) % V  # the suite-side id that the foreign token map sends to MASK


def _engine(config: DllmConfig = CONFIG) -> tuple[DllmEngine, list[Event]]:
    events: list[Event] = []
    return make_small_engine(config, events.append), events


def _pristine(engine: DllmEngine) -> None:
    snap = engine.snapshot()
    assert snap.free_slots == frozenset(range(engine.config.kv_slots))
    assert not snap.slot_owners and not snap.rows and not snap.running
    assert engine.allocator.reserved_pages == 0
    engine.allocator.check_consistency()


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (RequestSpec("a", (), 4), EmptyPrompt),
        (RequestSpec("a", (1,) * 21, 4), PromptTooLong),  # 21 + 4 -> 28 > 24
        (RequestSpec("a", (1,) * 4, 21), PromptTooLong),  # prompt fits, output does not
        (RequestSpec("a", (1, 2), 0), InvalidRequest),
        (RequestSpec("a", (1, -1), 4), InvalidRequest),  # the config's mask id
        (RequestSpec("a", (1, -5), 4), InvalidRequest),
        (RequestSpec("a", (1, V), 4), TokenOutOfVocabulary),  # outside the model vocabulary
        (RequestSpec("a", (1, 10**9), 4), TokenOutOfVocabulary),
        (RequestSpec("a", (HOLE,), 4), TokenOutOfVocabulary),  # lands on the model's MASK
        (RequestSpec("", (1,), 4), InvalidRequest),
    ],
)
def test_bad_request_is_rejected_without_effect(request_: RequestSpec, error: type) -> None:
    engine, events = _engine()
    with pytest.raises(error) as info:
        engine.submit(request_)
    assert isinstance(info.value, RequestError)
    assert events == []
    assert not engine.waiting
    _pristine(engine)
    # the id is not burnt: a valid request with it is accepted afterwards
    if request_.request_id:
        engine.submit(RequestSpec(request_.request_id, (3, 4), 4))
        engine.drain()
        _pristine(engine)


def test_request_larger_than_the_pool() -> None:
    engine, events = _engine(CONFIG.replace(kv_pages=1, max_context=24))
    with pytest.raises(RequestTooLarge):
        engine.submit(RequestSpec("a", (1, 2, 3), 9))  # 12 tokens -> 2 pages of 8
    assert events == []
    _pristine(engine)


def test_token_map_error_names_the_token_and_the_valid_range() -> None:
    engine, _ = _engine()
    assert engine.tokens.hole == HOLE
    with pytest.raises(TokenOutOfVocabulary, match=rf"prompt={V}: .*\[0, {V}\)"):
        engine.submit(RequestSpec("a", (1, V), 4))


def test_duplicate_id_queued_running_and_finished() -> None:
    engine, events = _engine()
    engine.submit(RequestSpec("a", (3, 4, 5), 4))
    with pytest.raises(DuplicateRequest):
        engine.submit(RequestSpec("a", (3,), 2))  # still queued
    engine.run_round()
    assert engine.running
    n = len(events)
    with pytest.raises(DuplicateRequest):
        engine.submit(RequestSpec("a", (3,), 2))  # running
    engine.drain()
    with pytest.raises(DuplicateRequest):
        engine.submit(RequestSpec("a", (3,), 2))  # finished
    with pytest.raises(DuplicateRequest):
        engine.submit(RequestSpec("a", (), 2))  # duplicate wins over other problems
    assert all(type(e).__name__ != "Submitted" for e in events[n:])
    _pristine(engine)


def test_abort_unknown_finished_and_twice() -> None:
    engine, events = _engine()
    with pytest.raises(UnknownRequest, match="no-such"):
        engine.abort("no-such")
    engine.submit(RequestSpec("a", (3, 4, 5), 4))
    engine.submit(RequestSpec("b", (3, 4, 5), 4))
    engine.abort("b")
    with pytest.raises(UnknownRequest):
        engine.abort("b")  # already aborted
    engine.drain()
    n = len(events)
    with pytest.raises(UnknownRequest):
        engine.abort("a")  # finished
    assert len(events) == n
    _pristine(engine)


def test_cuda_without_cuda_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailable) as info:
        resolve_device("cuda")
    assert isinstance(info.value, ConfigError)
    assert "cpu" in str(info.value)
    with pytest.raises(DeviceUnavailable):
        DllmEngine(
            CONFIG,
            lambda e: None,
            model=tiny_model("cpu"),
            algorithm=make_small_engine(CONFIG, lambda e: None).algorithm,
            device="cuda",
        )
    assert resolve_device("auto") == torch.device("cpu")


def test_unknown_device_name() -> None:
    with pytest.raises(DeviceUnavailable, match="one of"):
        resolve_device("tpu")


def test_context_beyond_the_model_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="max_context"):
        make_small_engine(DllmConfig(max_context=512, kv_pages=128), lambda e: None)


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.bool, "float32", None])
def test_a_kv_pool_that_cannot_hold_activations_is_a_config_error(kv_dtype: object) -> None:
    with pytest.raises(ConfigError, match=r"kv_dtype.*floating-point torch dtype"):
        DllmEngine(
            CONFIG,
            lambda e: None,
            model=tiny_model("cpu"),
            algorithm=make_algorithm("LowConfidence", {}),
            kv_dtype=kv_dtype,  # type: ignore[arg-type]
        )


def test_bad_page_size_is_rejected_by_the_config() -> None:
    with pytest.raises(ConfigError, match="multiple of block_size"):
        DllmConfig(block_size=4, page_size=6)
    with pytest.raises(ConfigError):
        DllmConfig(mode=Mode.SYNC, in_place_reuse=True)


def test_unknown_algorithm_is_a_config_error() -> None:
    from gpu.algorithms import make_algorithm

    with pytest.raises(UnknownAlgorithm) as info:
        make_algorithm("HighConfidence")
    assert isinstance(info.value, ConfigError)
