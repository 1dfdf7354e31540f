"""project_tables: ``MatMul([Cast](Gather(T, index)), W)`` -> ``Gather(T @ W, index)``.

Hand-built graphs are checked against the original graph on ONNX Runtime CPU and against numpy in float64; the
Transformer-XL and TUPE blocks against their float64 eager block over a prompt and decode steps
(:func:`posenc.validate.decode.validate_decode`), with the manifest's table check still passing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from posenc.config import AttentionConfig
from posenc.export import FeedShape, export_scheme, load_manifest
from posenc.export.eager import check_graph_tables
from posenc.graphs import optimize_file
from posenc.graphs.fold import cleanup
from posenc.graphs.projected_tables import project_tables
from posenc.validate.decode import validate_decode
from tests.graphs.helpers import hand_built, op_counts, ort_run

ROWS, WIDTH = 37, 8
RNG = np.random.default_rng(0)
TABLE = RNG.standard_normal((ROWS, WIDTH)).astype(np.float32)
SQUARE = RNG.standard_normal((WIDTH, WIDTH)).astype(np.float32)


def _model(weight: np.ndarray, *, cast: bool = False, axis: int = 0, twice: bool = False, const: bool = True):
    """``y = [Cast](Gather(table, index, axis)) @ w`` (``twice``: the rows are also an output)."""
    rows = "rows16" if cast else "rows"
    graph_nodes = [helper.make_node("Gather", ["table", "index"], ["rows"], axis=axis)]
    if cast:
        graph_nodes.append(helper.make_node("Cast", ["rows"], ["rows16"], to=TensorProto.FLOAT16))
    graph_nodes.append(helper.make_node("MatMul", [rows, "w"], ["y"]))
    dtype = TensorProto.FLOAT16 if cast else TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("index", TensorProto.INT64, [2, "n"])]
    initializers = [numpy_helper.from_array(TABLE, "table")]
    if const:
        initializers.append(numpy_helper.from_array(weight, "w"))
    else:
        inputs.append(helper.make_tensor_value_info("w", dtype, list(weight.shape)))
    outputs = [helper.make_tensor_value_info("y", dtype, None)]
    if twice:
        outputs.append(helper.make_tensor_value_info("rows", TensorProto.FLOAT, None))
    return hand_built(graph_nodes, inputs, outputs, initializers)


INDEX = np.array([[0, 5, -1, 36, 12], [3, -37, 7, 7, 20]], dtype=np.int64)  # negative indices count from the end


def test_the_lookup_reads_rows_of_the_projected_table() -> None:
    model = _model(SQUARE)
    before = ort_run(model, {"index": INDEX})[0]
    assert project_tables(model) == 1
    cleanup(model)
    assert op_counts(model) == {"Gather": 1}, "the product is gone, and so is the raw table's lookup"
    (table,) = [v for v in model.graph.initializers.values() if v.const_value is not None]
    assert table.shape == TABLE.shape, "the projected table has the table's shape"
    after = ort_run(model, {"index": INDEX})[0]
    want = TABLE.astype(np.float64)[INDEX] @ SQUARE.astype(np.float64)
    np.testing.assert_allclose(after, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_a_cast_between_lookup_and_product_is_folded_in() -> None:
    weight = SQUARE.astype(np.float16)
    model = _model(weight, cast=True)
    assert project_tables(model) == 1
    cleanup(model)
    after = ort_run(model, {"index": INDEX})[0]
    assert after.dtype == np.float16
    want = TABLE.astype(np.float64)[INDEX] @ weight.astype(np.float64)
    np.testing.assert_allclose(after.astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_an_index_past_the_table_still_raises() -> None:
    model = _model(SQUARE)
    assert project_tables(model) == 1
    with pytest.raises(Exception, match=r"out of bounds|indices"):
        ort_run(model, {"index": np.array([[0, ROWS]], dtype=np.int64)})


@pytest.mark.parametrize(
    ("kwargs", "weight", "why"),
    [
        ({}, RNG.standard_normal((WIDTH, 3)).astype(np.float32), "a projection that changes the table's shape"),
        ({"twice": True}, SQUARE, "the looked-up rows are read elsewhere too"),
        ({"const": False}, SQUARE, "a weight that is an input"),
    ],
    ids=["not-square", "rows-read-twice", "input-weight"],
)
def test_products_it_cannot_fold_are_kept(kwargs: dict, weight: np.ndarray, why: str) -> None:
    model = _model(weight, **kwargs)
    assert project_tables(model) == 0, why
    assert op_counts(model)["MatMul"] == 1


def test_a_gather_along_another_axis_is_kept() -> None:
    model = _model(SQUARE, axis=1)  # rows of the table's transpose: not a lookup of table rows
    assert project_tables(model) == 0


@pytest.mark.parametrize("scheme", ["transformer_xl", "tupe"])
def test_blocks_that_project_their_tables_keep_parity_over_decode_steps(tmp_path: Path, scheme: str) -> None:
    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=48)
    source = export_scheme(scheme, tmp_path / f"{scheme}.onnx", config=config).path
    target = tmp_path / f"{scheme}.ort-cpu.onnx"
    assert optimize_file(source, target, "ort-cpu").counts["project_tables"] >= 1
    check_graph_tables(load_manifest(target, verify=False), target)  # the promised table is still held
    steps = [FeedShape(2, 9, 0)] + [FeedShape(2, 1, 9 + i) for i in range(6)]  # (XL's shift needs no jumps)
    report = validate_decode([source, target], steps)
    assert report.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]
