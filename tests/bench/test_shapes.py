"""Benchmark shapes: the one shape syntax with a name, presets, and the errors a user would hit."""

from __future__ import annotations

import pytest

from posenc.bench.shapes import MAX_TOKENS, PRESETS, Shape, parse_shape
from posenc.errors import ConfigError
from posenc.export.shapes import FeedShape
from posenc.records import from_json, to_json


def test_presets_are_prefill_and_decode() -> None:
    assert parse_shape("prefill") == PRESETS["prefill"] == Shape(1, 512, 0, name="prefill")
    decode = parse_shape("decode")
    assert (decode.batch, decode.seq, decode.past) == (1, 1, 511)


def test_named_and_unnamed_shapes() -> None:
    assert parse_shape("long:2,1024") == Shape(2, 1024, 0, name="long")
    assert parse_shape(" 4,8,16 ") == Shape(4, 8, 16, name="decode")  # unnamed with a cache: a decode step
    assert parse_shape("1,3") == Shape(1, 3, 0, name="prefill")
    assert parse_shape("1,1,7").total == 8


def test_far_positions_need_longer_tables_than_the_keys() -> None:
    shape = parse_shape("far:1,4,0@32764")
    assert shape.feed == FeedShape(1, 4, 0, start=32764)
    assert (shape.total, shape.positions) == (4, 32768)
    assert shape.label == "far B=1 S=4 @32764"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1", "must be BATCH,SEQ"),
        ("1,0", "seq must be an int >= 1"),
        ("-1,4", "batch must be an int >= 1"),
        ("1,4,-2", "past must be an int >= 0"),
        ("1,four", "must be BATCH,SEQ"),
        ("1,4,0@2,", "must be BATCH,SEQ"),
        ("1,4,5@2", "start must be an int >= past"),
        ("prefil", "preset"),
        ("9x:1,2", "must start with a letter"),
        (f"2,{MAX_TOKENS}", "exceeds"),
        ("b=1,s=4", "must be BATCH,SEQ"),  # the old key=value form is the command line's (posenc.cli_args) alone
    ],
)
def test_bad_shapes_raise_config_error(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_shape(text)


@pytest.mark.parametrize("shape", [Shape(3, 1, 99, name="decode"), Shape(1, 2, 0, 4096, name="far")])
def test_shape_round_trips_through_json(shape: Shape) -> None:
    data = to_json(shape)
    assert from_json(Shape, data) == shape
    assert ("start" in data) == (shape.start is not None)  # old documents keep their form
