"""Configuration and request validation: typed errors that name the field and what is valid."""

from __future__ import annotations

import pytest

from spec import (
    ConfigError,
    DllmConfig,
    EmptyPrompt,
    InvalidRequest,
    Mode,
    PromptTooLong,
    RequestSpec,
    RequestTooLarge,
    validate_request,
)


@pytest.mark.parametrize(
    ("changes", "field", "hint"),
    [
        ({"block_size": 0}, "block_size", ">= 1"),
        ({"page_size": 6, "block_size": 4}, "page_size", "multiple of block_size=4"),
        ({"page_size": 0}, "page_size", ">= 1"),
        ({"kv_pages": 0}, "kv_pages", ">= 1"),
        ({"req_pool_rows": 0}, "req_pool_rows", ">= 1"),
        ({"max_running_requests": 0}, "max_running_requests", ">= 1"),
        ({"max_context": 30, "block_size": 4}, "max_context", "multiple of block_size=4"),
        ({"mode": "eager"}, "mode", "'sync', 'fdfo'"),
        ({"mode": Mode.SYNC, "in_place_reuse": True}, "in_place_reuse", "only meaningful under"),
        ({"mode": Mode.SYNC, "in_place_reuse": False, "reloop": True}, "reloop", "fdfo"),
        ({"block_size": True}, "block_size", ">= 1"),
    ],
)
def test_invalid_config_names_field_and_valid_values(
    changes: dict[str, object], field: str, hint: str
) -> None:
    with pytest.raises(ConfigError) as info:
        DllmConfig(**changes)  # type: ignore[arg-type]
    assert info.value.field == field
    assert field in str(info.value) and hint in str(info.value)


def test_valid_config_and_derived_sizes() -> None:
    c = DllmConfig(block_size=4, page_size=8, kv_pages=3, mode="sync", in_place_reuse=False)  # type: ignore[arg-type]
    assert c.mode is Mode.SYNC
    assert c.kv_slots == 24 and c.blocks_per_page == 2
    solo = DllmConfig().solo_sync()
    assert solo.mode is Mode.SYNC and solo.max_running_requests == 1 and not solo.in_place_reuse


def test_request_validation_errors() -> None:
    c = DllmConfig(block_size=4, page_size=4, kv_pages=2, max_context=16)
    with pytest.raises(EmptyPrompt):
        validate_request(c, RequestSpec("a", (), 4))
    with pytest.raises(InvalidRequest, match="max_new_tokens"):
        validate_request(c, RequestSpec("a", (1,), 0))
    with pytest.raises(InvalidRequest, match=">= 0"):
        validate_request(c, RequestSpec("a", (3, -1), 1))
    for not_a_sequence in (None, 7, "12"):
        with pytest.raises(InvalidRequest, match="a sequence of token ids"):
            validate_request(c, RequestSpec("a", not_a_sequence, 1))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="mask token"):
        validate_request(c.replace(mask_token_id=1), RequestSpec("a", (3, 1), 1))
    with pytest.raises(PromptTooLong, match="max_context is 16"):
        validate_request(c, RequestSpec("a", tuple(range(15)), 4))
    with pytest.raises(RequestTooLarge, match="whole pool has 8"):
        validate_request(c, RequestSpec("a", (1, 2, 3), 8))
    shape = validate_request(c, RequestSpec("a", (1, 2, 3, 4, 5), 2))
    assert (shape.prompt_blocks, shape.total_blocks, shape.pages) == (1, 2, 2)


# ---------------------------------------------------------------- types and bounds (issue 13)
@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"eos_token_id": "2"}, "eos_token_id"),
        ({"eos_token_id": 2.0}, "eos_token_id"),
        ({"mask_token_id": True}, "mask_token_id"),
        ({"mask_token_id": None}, "mask_token_id"),
        ({"eos_token_id": -1}, "eos_token_id"),  # equal to the mask id
        ({"block_size": 2**40, "page_size": 2**40, "max_context": 2**40}, "block_size"),
        ({"kv_pages": 10**12}, "kv_pages"),
        ({"kv_pages": "16"}, "kv_pages"),
        ({"mode": 0}, "mode"),
        ({"mode": None}, "mode"),
    ],
)
def test_every_field_is_typed_and_bounded(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        DllmConfig(**changes)  # type: ignore[arg-type]
    assert exc.value.field == field, str(exc.value)


def test_absurd_pool_is_refused_with_the_memory_figure() -> None:
    with pytest.raises(ConfigError) as exc:
        DllmConfig(kv_pages=10**12)
    assert "GiB" in str(exc.value) and "this machine has" in str(exc.value)


@pytest.mark.parametrize(
    "request_spec",
    [
        RequestSpec("a", (1, 2), 3),
        RequestSpec("b", (4,), 5, stop_sampled=True, ignore_eos=True, stop_token_ids=(7, 2)),
    ],
)
def test_a_request_and_its_submitted_event_carry_the_same_fields(
    request_spec: RequestSpec,
) -> None:
    """`RequestSpec.submitted` and `RequestSpec.of` are inverses, every field kept."""
    event = request_spec.submitted()
    assert (event.stop_sampled, event.ignore_eos) == (
        request_spec.stop_sampled,
        request_spec.ignore_eos,
    )
    assert event.stop_token_ids == request_spec.stop_token_ids
    assert RequestSpec.of(event) == request_spec
