"""The vLLM adapters' token ids fit vLLM 0.34.0's int32 token buffers, and ids of different
roles, requests, turns or positions never meet (`integrations.vllm.token_ids`); a number
outside its field is a `ConfigError`, not a collision. No engine needed."""

from __future__ import annotations

import itertools

import pytest

from integrations.vllm import token_ids as t
from spec.errors import ConfigError

INT32_MAX = (1 << 31) - 1


def _every_id(arrivals: range, indices: range, turns: range) -> list[tuple[str, int]]:
    """(role, id) over a grid of each region, its extreme fields included."""
    ids: list[tuple[str, int]] = []
    for a in arrivals:
        ids.append((f"stop {a}", t.stop_token_id(a)))
        ids.append((f"unshared {a}", t.unshared_prompt_token(a)))
        for turn, i in itertools.product(turns, indices):
            ids.append((f"output {a} {turn} {i}", t.output_token_id(a, i, turn)))
            ids.append((f"input {a} {turn} {i}", t.session_input_token(a, turn, i)))
            ids.append((f"branch {a} {i}", t.branch_token(a, i)))
    ids += [("end", t.REASONING_END), ("start", t.REASONING_START)]
    ids += [(f"wrong {n}", t.wrong_draft(n)) for n in (0, 1, (1 << 29) - 1)]
    return ids


def test_ids_of_different_roles_requests_turns_and_positions_never_meet() -> None:
    ids = _every_id(range(0, 40, 7), range(0, 1024, 255), range(1, 16, 5))
    ids += _every_id(range(1000, 1024), range(1020, 1024), range(14, 16))
    # a branch token is named by (number, position) alone: the grid repeats it per turn
    unique = dict(ids)
    assert len(set(unique.values())) == len(unique), "two roles share an id"


def test_every_id_fits_an_int32_at_the_edges_of_its_fields() -> None:
    edges = [
        t.output_token_id((1 << 14) - 1, (1 << 12) - 1, 16),
        t.stop_token_id((1 << 27) - 1),
        t.unshared_prompt_token((1 << 19) - 1),
        t.session_input_token(1023, 63, 1023),
        t.branch_token(4095, 4095),
        t.wrong_draft((1 << 29) - 1),
        t.REASONING_START,
    ]
    assert all(0 < i <= INT32_MAX for i in edges), edges
    # each region ends below the next one starts
    assert t.branch_token(4095, 4095) < t.SESSION_INPUT_BASE
    assert t.session_input_token(1023, 63, 1023) < t.STOP_BASE
    assert t.stop_token_id((1 << 27) - 1) < t.REASONING_END
    assert t.REASONING_START < t.WRONG_DRAFT
    assert t.wrong_draft((1 << 29) - 1) < t.OUTPUT_BASE


@pytest.mark.parametrize(
    ("make", "field", "bound"),
    [
        (lambda: t.output_token_id(1 << 14, 1), "arrival", "0..16383"),
        (lambda: t.output_token_id(0, 1 << 12), "output index", "0..4095"),
        (lambda: t.output_token_id(0, 1, 17), "turn=17", "1..16"),
        (lambda: t.session_input_token(1024, 1, 0), "arrival", "0..1023"),
        (lambda: t.session_input_token(0, 1, 1024), "input position", "0..1023"),
        (lambda: t.branch_token(0, 4096), "branch position", "0..4095"),
        (lambda: t.stop_token_id(-1), "arrival", "0..134217727"),
    ],
)
def test_a_number_outside_its_field_is_a_config_error_naming_the_bound(
    make: object, field: str, bound: str
) -> None:
    with pytest.raises(ConfigError) as info:
        make()  # type: ignore[operator]
    message = str(info.value)
    assert field in message and bound in message and "int32" in message, message
