"""`spec.json_text.parse_json`: every malformed JSON text is one exception type."""

from __future__ import annotations

import json
import sys

import pytest

from spec.json_text import NESTED_TOO_DEEPLY, parse_json


def test_valid_text_parses_as_json_loads_does() -> None:
    text = '{"a": [1, 2.5, "x", null, true], "b": {"c": -3}}'
    assert parse_json(text) == json.loads(text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "Expecting property name"),
        ("[" * 100_000 + "]" * 100_000, NESTED_TOO_DEEPLY),
        ('{"x": [' * 50_000, NESTED_TOO_DEEPLY),
        ('{"n": 1' + "0" * 5_000 + "}", f"longer than {sys.get_int_max_str_digits()} digits"),
    ],
    ids=["invalid", "nested-array", "nested-unclosed", "long-integer"],
)
def test_malformed_text_raises_json_decode_error_only(text: str, words: str) -> None:
    with pytest.raises(json.JSONDecodeError) as err:
        parse_json(text)
    assert words in err.value.msg
