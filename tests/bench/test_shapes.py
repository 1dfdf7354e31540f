"""Shape parsing: presets, key=value form, and the errors a user would hit."""

from __future__ import annotations

import pytest

from posenc.bench.shapes import MAX_TOKENS, PRESETS, Shape, parse_shape
from posenc.errors import ConfigError


def test_presets_are_prefill_and_decode() -> None:
    assert parse_shape("prefill") == PRESETS["prefill"]
    decode = parse_shape("decode")
    assert decode.seq == 1
    assert decode.past > 0


def test_key_value_form_with_and_without_name() -> None:
    assert parse_shape("long:b=2,s=1024") == Shape("long", 2, 1024, 0)
    assert parse_shape(" B=4, S=8, past=16 ") == Shape("decode", 4, 8, 16)
    assert parse_shape("batch=1,seq=3") == Shape("prefill", 1, 3, 0)
    assert parse_shape("b=1,s=1,p=7").total == 8


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("b=1", "lacks s"),
        ("s=4", "lacks b"),
        ("b=1,s=0", "seq must be an int >= 1"),
        ("b=-1,s=4", "batch must be an int >= 1"),
        ("b=1,s=4,past=-2", "past must be an int >= 0"),
        ("b=1,s=four", "must be an integer"),
        ("b=1,s=4,h=32", "unknown item"),
        ("b=1,b=2,s=4", "given twice"),
        ("prefil", "preset"),
        ("9x:b=1,s=2", "must start with a letter"),
        (f"b=2,s={MAX_TOKENS}", "exceeds"),
    ],
)
def test_bad_shapes_raise_config_error(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_shape(text)


def test_shape_round_trips_through_dict() -> None:
    shape = Shape("decode", 3, 1, 99)
    assert Shape.from_dict(shape.to_dict()) == shape
    assert shape.label == "decode B=3 S=1 P=99"
