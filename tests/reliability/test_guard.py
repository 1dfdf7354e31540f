"""Exported graphs guard their position tables (posenc.functional.position_guard): a negative position or one
past the table makes ONNX Runtime raise, and a runtime that cannot raise on an out-of-range gather (TensorRT,
emulated here by giving the guard's one-row tripwire a second row) returns NaN for it, never a plausible number.
Without the guard (``position_guard=False``) a plain session wraps a negative id to the table's end: finite
garbage, which is what the guard closes."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from posenc.artifacts.files import manifest_path_for
from posenc.errors import ModelFileError, PositionError
from posenc.export import export_scheme
from posenc.export.feeds import make_feed
from posenc.export.runtime import run_onnx
from posenc.export.shapes import FeedShape
from posenc.validate import validate_onnx
from tests.conftest import SMALL, copy_export

ROWS = 16
SCHEMES = ("rope", "learned", "alibi", "t5")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory, rope_op16) -> dict[tuple[str, bool], object]:
    folder = tmp_path_factory.mktemp("guard")
    return {("rope", True): rope_op16} | {  # the session's guarded RoPE op of ROWS rows
        (scheme, guard): export_scheme(
            scheme,
            folder / f"{scheme}-{guard}.onnx",
            unit="op",
            config=SMALL,
            max_positions=ROWS,
            position_guard=guard,
        )
        for scheme in SCHEMES
        for guard in (True, False)
        if (scheme, guard) != ("rope", True)
    }


def feed_with(result, bad: int) -> dict[str, np.ndarray]:
    """A valid feed of the graph with its last query position replaced by ``bad``."""
    feed = make_feed(result.manifest, FeedShape(batch=1, seq=3, past=0))
    name = next(i.name for i in result.manifest.inputs if i.role == "positions")
    feed[name] = feed[name].copy()
    feed[name][0, -1] = bad
    return feed


def plain_session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def without_raising(path) -> onnx.ModelProto:
    """The graph as a runtime that reads an out-of-range gather instead of raising sees it: the guard's one-row
    tripwire gets a second row (of zeros), so only the guard's own NaN marks an invalid position."""
    model = onnx.load(str(path))
    tripwires = [init for init in model.graph.initializer if list(init.dims) == [1, 1]]
    assert tripwires, "the guarded graph should hold the one-row tripwire table"
    for init in tripwires:
        init.CopyFrom(numpy_helper.from_array(np.zeros((2, 1), np.float32), init.name))
    return model


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("bad", [-1, ROWS, 10 * ROWS])
def test_a_guarded_graph_raises_in_a_plain_onnxruntime_session(graphs, scheme, bad) -> None:
    result = graphs[(scheme, True)]
    assert result.manifest.position_guard
    session = plain_session(str(result.path))
    outputs = session.run(None, feed_with(result, 2))
    assert all(np.isfinite(o).all() for o in outputs)  # valid positions: unchanged
    with pytest.raises(Exception, match=r"out of (data )?bounds|out of range|indices"):
        session.run(None, feed_with(result, bad))


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("bad", [-1, ROWS])
def test_a_runtime_that_cannot_raise_gets_nan_never_a_plausible_number(graphs, scheme, bad) -> None:
    result = graphs[(scheme, True)]
    session = plain_session(without_raising(result.path))
    good = session.run(None, feed_with(result, 2))
    assert all(np.isfinite(o).all() for o in good)
    reference = plain_session(str(result.path)).run(None, feed_with(result, 2))
    for got, want in zip(good, reference, strict=True):
        np.testing.assert_array_equal(got, want)  # the guard changes nothing for valid positions
    poisoned = session.run(None, feed_with(result, bad))
    assert all(np.isnan(o).any() for o in poisoned)


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_without_the_guard_a_negative_position_gives_finite_garbage(graphs, scheme) -> None:
    result = graphs[(scheme, False)]
    assert not result.manifest.position_guard
    assert not [i for i in onnx.load(str(result.path)).graph.initializer if list(i.dims) == [1, 1]]
    outputs = plain_session(str(result.path)).run(None, feed_with(result, -1))
    assert all(np.isfinite(o).all() for o in outputs)  # the hazard the guard exists for


def test_posenc_runner_names_the_position(graphs) -> None:
    result = graphs[("rope", True)]
    with pytest.raises(PositionError):
        run_onnx(result.path, feed_with(result, -1), manifest=result.manifest)


def test_validate_derives_table_sizes_from_the_graph_not_the_manifest(graphs, tmp_path) -> None:
    result = graphs[("alibi", True)]
    model = copy_export(result, tmp_path)
    manifest = manifest_path_for(model)
    data = json.loads(manifest.read_text())
    data["max_positions"] = data["build_max_positions"] = 4 * ROWS  # promise a longer table than the graph holds
    manifest.write_text(json.dumps(data))
    with pytest.raises(ModelFileError, match="does not describe this graph"):
        validate_onnx(model)
    data["build_max_positions"] = ROWS  # only max_positions edited
    manifest.write_text(json.dumps(data))
    with pytest.raises(ModelFileError, match="manifest was edited"):
        validate_onnx(model)


def test_a_manifest_naming_other_inputs_or_a_longer_table_is_refused_by_validate_and_optimize(graphs, tmp_path) -> None:
    from posenc.graphs import optimize_file

    result = graphs[("rope", True)]
    model = copy_export(result, tmp_path)
    manifest = manifest_path_for(model)
    original = manifest.read_text()
    data = json.loads(original)
    data["inputs"][0]["name"] = "x"
    manifest.write_text(json.dumps(data))
    with pytest.raises(ModelFileError, match="does not describe this graph"):
        validate_onnx(model)
    data = json.loads(original)
    data["max_positions"] = data["build_max_positions"] = 4 * ROWS
    manifest.write_text(json.dumps(data))
    with pytest.raises(ModelFileError, match="does not describe this graph"):
        optimize_file(model, tmp_path / "o.onnx", "trt")
    assert not (tmp_path / "o.onnx").exists()
