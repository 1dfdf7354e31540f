"""posenc.records: typed records to JSON and back, strictly (a renamed key fails loudly, nothing defaults silently)."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest

from posenc.errors import ModelFileError
from posenc.provenance import CheckpointWeights, ModuleWeights, RandomWeights, WeightsSource
from posenc.records import RecordError, field, from_json, to_json


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


@dataclasses.dataclass(frozen=True)
class Inner:
    median: float = field(key="median_s")
    runs: int = field(key="runs")


@dataclasses.dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner | None
    shape: tuple[int, int, int]
    sizes: tuple[int, ...]
    by_name: dict[str, Inner]
    items: list[Inner]
    mode: Mode
    path: Path
    anything: Any
    kind: Literal["outer"] = "outer"
    note: str = field(optional=True, default="")

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("label",)

    @property
    def label(self) -> str:
        return f"{self.name}/{self.mode.value}"


SAMPLE = Outer(
    name="a",
    inner=Inner(0.5, 3),
    shape=(1, 2, 3),
    sizes=(4, 5),
    by_name={"x": Inner(1.0, 1)},
    items=[Inner(2.0, 2)],
    mode=Mode.SLOW,
    path=Path("/tmp/x.onnx"),
    anything={"nested": [1, (2, 3)]},
)


def test_to_json_writes_keys_derived_values_and_json_types() -> None:
    data = to_json(SAMPLE)
    assert data == {
        "name": "a",
        "inner": {"median_s": 0.5, "runs": 3},
        "shape": [1, 2, 3],
        "sizes": [4, 5],
        "by_name": {"x": {"median_s": 1.0, "runs": 1}},
        "items": [{"median_s": 2.0, "runs": 2}],
        "mode": "slow",
        "path": "/tmp/x.onnx",
        "anything": {"nested": [1, [2, 3]]},
        "kind": "outer",
        "label": "a/slow",  # derived: written for readers, skipped when read back
    }
    assert "note" not in data  # optional and at its default
    assert json.loads(json.dumps(data)) == data


def test_a_record_reads_back_equal() -> None:
    data = to_json(SAMPLE)
    back = from_json(Outer, json.loads(json.dumps(data)))
    assert back == dataclasses.replace(SAMPLE, anything={"nested": [1, [2, 3]]})
    assert from_json(Outer, {**data, "note": "n"}).note == "n"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d["inner"].update(median=d["inner"].pop("median_s")),
            r"at inner: Inner has unknown key\(s\) \['median'\] and missing key\(s\) \['median_s'\]",
        ),
        (lambda d: d.pop("mode"), r"missing key\(s\) \['mode'\]"),
        (lambda d: d.update(extra=1), r"unknown key\(s\) \['extra'\]"),
        (lambda d: d["items"][0].update(runs="3"), r"at items\[0\]\.runs: expected int, got str '3'"),
        (lambda d: d["items"][0].update(runs=True), r"at items\[0\]\.runs: expected int, got bool"),
        (lambda d: d.update(shape=[1, 2]), r"at shape: expected 3 items, got 2"),
        (lambda d: d.update(mode="medium"), r"at mode: 'medium' is not one of \['fast', 'slow'\]"),
        (lambda d: d.update(kind="inner"), r"at kind: 'inner' is not one of \['outer'\]"),
        (lambda d: d.update(by_name=[]), r"at by_name: expected an object"),
    ],
)
def test_renamed_missing_unknown_or_mistyped_keys_fail_loudly(change, message) -> None:
    data = to_json(SAMPLE)
    change(data)
    with pytest.raises(RecordError, match=message) as info:
        from_json(Outer, data, "outer.json", "write it again")
    assert str(info.value).startswith("outer.json")
    assert str(info.value).endswith("; write it again")
    assert isinstance(info.value, ModelFileError)


def test_unions_of_records_are_told_apart_by_their_kind() -> None:
    sources: list[WeightsSource] = [
        CheckpointWeights("ckpt", "llama", "llama", 2, None, {"model.layers.2.q_proj.weight": "ab" * 32}),
        RandomWeights(seed=7),
        ModuleWeights("my.Block"),
    ]
    for source in sources:
        data = to_json(source)
        assert from_json(WeightsSource, data) == source
    assert to_json(ModuleWeights("my.Block")) == {"class": "my.Block", "kind": "module"}
    with pytest.raises(RecordError, match="matches none of its types"):
        from_json(WeightsSource, {"kind": "trained", "seed": 1})


def test_a_record_s_own_checks_become_record_errors() -> None:
    from posenc.bench.shapes import Shape

    assert from_json(Shape, {"name": "p", "batch": 1, "seq": 2, "past": 0}) == Shape(1, 2, name="p")
    with pytest.raises(RecordError, match="Shape rejects its values"):
        from_json(Shape, {"name": "p", "batch": 0, "seq": 2, "past": 0})


def test_values_that_are_not_json_are_a_programming_error() -> None:
    with pytest.raises(TypeError, match="not a JSON record value"):
        to_json({"x": object()})
    with pytest.raises(TypeError, match="an optional record field needs a default"):
        field(optional=True)
