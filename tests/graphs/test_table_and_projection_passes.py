"""gathernd_to_gather and fuse_projections on small hand-built graphs: the rewritten graph computes what the original
did on ONNX Runtime CPU (and numpy), refuses what it cannot express, and keeps an out-of-range index an error."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from posenc.graphs.gather import gathernd_to_gather
from posenc.graphs.projections import fuse_projections
from tests.graphs.helpers import hand_built, op_counts, ort_run

ROWS, HEADS, B, S = 31, 4, 2, 6


def _table() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((ROWS, HEADS)).astype(np.float32)


def _lookup(index_shape: list, unsqueezed: bool, batch_dims: int = 0, depth: int = 1) -> ir.Model:
    """``GatherND(table, indices)``: indices from ``Unsqueeze(index, -1)`` or given whole."""
    index_name = "index" if unsqueezed else "indices"
    graph_nodes = [helper.make_node("GatherND", ["table", "indices"], ["y"], batch_dims=batch_dims)]
    if unsqueezed:
        graph_nodes.insert(0, helper.make_node("Unsqueeze", ["index", "axis"], ["indices"]))
    return hand_built(
        graph_nodes,
        [helper.make_tensor_value_info(index_name, TensorProto.INT64, index_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(_table(), "table"), numpy_helper.from_array(np.array([-1], np.int64), "axis")],
    )


def test_a_distance_lookup_becomes_a_gather_and_reads_the_same_rows() -> None:
    distance = np.subtract.outer(np.arange(S), np.arange(S))[None].repeat(B, 0) + ROWS // 2  # [B, S, S]
    distance[1, 0, 0] = -3  # a negative index counts from the end, in both ops
    model = _lookup([B, S, S], unsqueezed=True)
    before = ort_run(model, {"index": distance})[0]
    assert gathernd_to_gather(model) == 1
    counts = op_counts(model)
    assert counts["Gather"] == 1
    assert "GatherND" not in counts
    gather = next(node for node in model.graph if node.op_type == "Gather")
    assert gather.inputs[1] is model.graph.inputs[0], "the index feeds the Gather without its tuple axis"
    after = ort_run(model, {"index": distance})[0]
    np.testing.assert_array_equal(after, before)
    np.testing.assert_array_equal(after, _table()[distance])


def test_index_tuples_given_whole_are_squeezed() -> None:
    indices = np.random.default_rng(1).integers(0, ROWS, size=(B, S, 1))
    model = _lookup([B, S, 1], unsqueezed=False)
    before = ort_run(model, {"indices": indices})[0]
    assert gathernd_to_gather(model) == 1
    assert op_counts(model)["Squeeze"] == 1
    np.testing.assert_array_equal(ort_run(model, {"indices": indices})[0], before)


def test_an_index_past_the_table_still_raises() -> None:
    model = _lookup([1, 2], unsqueezed=True)
    assert gathernd_to_gather(model) == 1
    with pytest.raises(Exception, match=r"(?i)out of bounds|invalid|indices"):
        ort_run(model, {"index": np.array([[0, ROWS]], np.int64)})


@pytest.mark.parametrize(
    ("shape", "batch_dims", "why"),
    [([B, S, 2], 0, "tuples of length 2 index two axes"), ([B, 1], 1, "a per-batch lookup")],
)
def test_lookups_gather_cannot_express_are_kept(shape: list, batch_dims: int, why: str) -> None:
    table = np.random.default_rng(2).standard_normal((B, ROWS, HEADS)).astype(np.float32)
    data = table if batch_dims else table[0]
    model = hand_built(
        [helper.make_node("GatherND", ["table", "indices"], ["y"], batch_dims=batch_dims)],
        [helper.make_tensor_value_info("indices", TensorProto.INT64, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(data, "table")],
    )
    assert gathernd_to_gather(model) == 0, why
    assert op_counts(model)["GatherND"] == 1


# --------------------------------------------------------------------------------------------------
# fuse_projections
# --------------------------------------------------------------------------------------------------

E = 12


def _projections(widths: dict[str, int], other_dtype: str | None = None, output_product: str | None = None):
    """``x [B, S, E]`` times one constant weight per output (``x2`` for the product named ``other``)."""
    rng = np.random.default_rng(3)
    weights, graph_nodes, outputs = [], [], []
    for name, width in widths.items():
        dtype = np.float16 if name == other_dtype else np.float32
        weights.append(numpy_helper.from_array((rng.standard_normal((E, width)) * 0.3).astype(dtype), f"w_{name}"))
        source = "x16" if name == other_dtype else ("x2" if name == "other" else "x")
        product = name if name == output_product else f"{name}_raw"
        graph_nodes.append(helper.make_node("MatMul", [source, f"w_{name}"], [product]))
        if name != output_product:
            graph_nodes.append(helper.make_node("Relu", [product], [name]))  # a consumer that must be rewired
        outputs.append(
            helper.make_tensor_value_info(name, TensorProto.FLOAT16 if name == other_dtype else TensorProto.FLOAT, None)
        )
    graph_nodes.append(helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, S, E]) for n in ("x", "x2")]
    return hand_built(graph_nodes, inputs, outputs, weights)


def _feed() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    return {n: rng.standard_normal((B, S, E)).astype(np.float32) for n in ("x", "x2")}


def test_query_key_value_products_become_one_matmul_and_a_split() -> None:
    model = _projections({"q": 8, "k": 4, "v": 4, "other": 4})
    before = ort_run(model, _feed())
    assert fuse_projections(model) == 2
    counts = op_counts(model)
    assert (counts["MatMul"], counts["Split"]) == (2, 1), "q, k, v in one product; x2's product untouched"
    split = next(node for node in model.graph if node.op_type == "Split")
    assert [o.name for o in split.outputs] == ["q_raw", "k_raw", "v_raw"]
    packed = split.inputs[0].producer()
    assert packed is not None
    concat = packed.inputs[1].producer()  # the stored weights packed at load time, not stored a second time
    assert concat is not None
    assert concat.op_type == "Concat"
    assert [value.name for value in concat.inputs] == ["w_q", "w_k", "w_v"]
    after = ort_run(model, _feed())
    for name, got, want in zip(["q", "k", "v", "other"], after, before, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_products_of_other_dtypes_or_graph_outputs_keep_their_nodes() -> None:
    model = _projections({"q": 8, "k": 4, "v": 4}, output_product="v")
    assert fuse_projections(model) == 1, "q and k merge; v is a graph output and keeps its name and node"
    model = _projections({"q": 8, "k": 4, "other": 4}, other_dtype="k")
    assert fuse_projections(model) == 0, "one float32 product of x is left: nothing to merge"


def test_a_weight_that_is_not_constant_is_not_merged() -> None:
    model = hand_built(
        [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, E]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [E, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b")],
        [numpy_helper.from_array(np.ones((E, 4), np.float32), "w2")],
    )  # fmt: skip
    assert fuse_projections(model) == 0
