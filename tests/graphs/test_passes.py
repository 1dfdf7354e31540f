"""Passes on small hand-built graphs: contrib RoPE conversion, causal folding, the folding size limit."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from posenc import functional
from posenc.graphs import (
    convert_contrib_rope,
    fold_causal_into_mask,
    fold_constants,
    fuse_partial_rope,
    fuse_rope,
    optimize_model,
    rope_for_tensorrt,
)
from posenc.graphs import fold as graph_ops
from tests.graphs.helpers import half_rotation_nodes, nodes, op_counts, ort_run

B, H, S, D = 2, 3, 5, 8


def _model(graph_nodes, inputs, outputs, initializers=(), opset=23, extra_opsets=()) -> ir.Model:
    graph = helper.make_graph(graph_nodes, "g", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return ir.serde.deserialize_model(model)


def _tables(rows: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    inv_freq, _ = functional.rope_inv_freq(2 * half)
    cos, sin = functional.rope_cos_sin(torch.arange(rows), inv_freq)
    return cos.numpy(), sin.numpy()


@pytest.mark.parametrize(
    ("rank", "interleaved", "positions"),
    [(4, 0, "full"), (4, 1, "full"), (3, 0, "full"), (4, 0, "offset"), (3, 1, "offset")],
)
def test_contrib_rotary_becomes_the_standard_op(rank: int, interleaved: int, positions: str) -> None:
    cos, sin = _tables(32, D // 2)
    shape = [B, H, S, D] if rank == 4 else [B, S, H * D]
    attrs = {"interleaved": interleaved, **({"num_heads": H} if rank == 3 else {})}
    pos_shape = [B, S] if positions == "full" else [1]
    model = _model(
        [helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft", **attrs)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("pos", TensorProto.INT64, pos_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")],
        extra_opsets=[("com.microsoft", 1)],
    )  # fmt: skip
    rng = np.random.default_rng(0)
    feed = {
        "x": rng.standard_normal(shape).astype(np.float32),
        "pos": (np.tile(np.arange(S) + 4, (B, 1)) if positions == "full" else np.array([7])).astype(np.int64),
    }
    before = ort_run(model, feed)[0]
    assert convert_contrib_rope(model) == 1
    assert [n.domain for n in nodes(model, "RotaryEmbedding")] == [""]
    assert "com.microsoft" not in model.opset_imports
    np.testing.assert_allclose(ort_run(model, feed)[0], before, atol=1e-6, rtol=1e-6)


def test_contrib_rotary_with_packed_batching_is_left_alone() -> None:
    cos, sin = _tables(32, D // 2)
    model = _model(
        [helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft",
                          is_packed_batching=1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, H, S, D]),
         helper.make_tensor_value_info("pos", TensorProto.INT64, [B, S])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, H, S, D])],
        [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")],
        extra_opsets=[("com.microsoft", 1)],
    )  # fmt: skip
    assert convert_contrib_rope(model) == 0


@pytest.mark.parametrize("mask_type", [TensorProto.FLOAT, TensorProto.BOOL])
def test_causal_attention_with_mask_gets_the_causal_mask_folded_in(mask_type: int) -> None:
    model = _model(
        [helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], is_causal=1)],
        [*(helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, H, S, D]) for n in "qkv"),
         helper.make_tensor_value_info("m", mask_type, [1, H, S, S])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, H, S, D])],
    )  # fmt: skip
    rng = np.random.default_rng(1)
    feed = {n: rng.standard_normal((B, H, S, D)).astype(np.float32) for n in "qkv"}
    mask = rng.standard_normal((1, H, S, S))
    feed["m"] = (mask > -1.0) if mask_type == TensorProto.BOOL else mask.astype(np.float32)
    before = ort_run(model, feed)[0]
    assert fold_causal_into_mask(model) == 1
    (attention,) = nodes(model, "Attention")
    assert attention.attributes.get_int("is_causal", 0) == 0
    np.testing.assert_allclose(ort_run(model, feed)[0], before, atol=1e-6, rtol=1e-6)
    assert fold_causal_into_mask(model) == 0


def test_constant_folding_respects_the_size_limit() -> None:
    table = np.arange(4096 * 8, dtype=np.float32).reshape(4096, 8)
    small = np.arange(6, dtype=np.float32)
    model = _model(
        [helper.make_node("Mul", ["small", "two"], ["small2"]),             # foldable, tiny
         helper.make_node("Tile", ["table", "reps"], ["tiled"]),            # foldable, would store 4x the table
         helper.make_node("ReduceSum", ["tiled"], ["total"], keepdims=0),
         helper.make_node("Add", ["x", "small2"], ["y"]),
         helper.make_node("Add", ["y", "total"], ["z"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [6])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(small, "small"),
         numpy_helper.from_array(np.array(2.0, np.float32), "two"),
         numpy_helper.from_array(np.array([4, 1], np.int64), "reps")],
    )  # fmt: skip
    feed = {"x": np.ones(6, np.float32)}
    before = ort_run(model, feed)[0]
    table_bytes = table.nbytes
    assert fold_constants(model, size_limit=1 << 16) >= 1
    assert "Mul" not in op_counts(model), "the small constant subgraph should be folded"
    assert "Tile" in op_counts(model), "the table must not be expanded into a 4x larger initializer"
    stored = sum(v.const_value.nbytes for v in model.graph.initializers.values())
    assert stored <= table_bytes + 1024
    np.testing.assert_allclose(ort_run(model, feed)[0], before)


@pytest.mark.parametrize(("split", "fused"), [(D // 2, 1), (D // 2 - 1, 0)])
def test_only_a_split_into_halves_is_fused(split: int, fused: int) -> None:
    half = D // 2
    cos, sin = _tables(32, half)
    ints = {name: numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
            {"zero": [0], "h": [split], "end": [D], "ax": [-1], "one": [1]}.items()}  # fmt: skip
    model = _model(
        half_rotation_nodes(),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, H, S, D]),
         helper.make_tensor_value_info("pos", TensorProto.INT64, [B, S])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin"), *ints.values()],
    )  # fmt: skip
    graph_ops.infer_shapes(model)
    assert fuse_rope(model) == fused
    assert fuse_partial_rope(model) == 0


@pytest.mark.parametrize(("tail_end", "fused"), [(2**63 - 1, 1), (D, 1), (D - 2, 0)])
def test_partial_rotation_is_fused_only_when_the_tail_reaches_the_last_feature(tail_end: int, fused: int) -> None:
    """``Concat(RoPE(x[..., :r]), x[..., r:e])`` equals a partial RotaryEmbedding only for e >= D."""
    rotary = D // 2
    cos, sin = _tables(16, rotary // 2)
    ints = {name: numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
            {"zero": [0], "r": [rotary], "e": [tail_end], "ax": [-1], "one": [1]}.items()}  # fmt: skip
    model = _model(
        [helper.make_node("Slice", ["x", "zero", "r", "ax", "one"], ["head"]),
         helper.make_node("RotaryEmbedding", ["head", "cos", "sin", "pos"], ["rope"]),
         helper.make_node("Slice", ["x", "r", "e", "ax", "one"], ["tail"]),
         helper.make_node("Concat", ["rope", "tail"], ["y"], axis=-1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, H, S, D]),
         helper.make_tensor_value_info("pos", TensorProto.INT64, [B, S])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin"), *ints.values()],
    )  # fmt: skip
    feed = {"x": np.random.default_rng(0).standard_normal((B, H, S, D)).astype(np.float32),
            "pos": np.arange(B * S, dtype=np.int64).reshape(B, S) % 16}  # fmt: skip
    before = ort_run(model, feed)[0]
    graph_ops.infer_shapes(model)
    assert fuse_partial_rope(model) == fused
    np.testing.assert_allclose(ort_run(model, feed)[0], before, atol=1e-6)


def test_fusions_are_skipped_below_opset_23() -> None:
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        opset=18,
    )
    result = optimize_model(model, "trt")
    skipped = {p.name: p.skipped for p in result.passes}
    assert "opset 18 < 23" in skipped["fuse_rope"]
    assert "opset 18 < 23" in skipped["fuse_attention"]
    assert onnx.checker.check_model(ir.serde.serialize_model(model)) is None


def test_tensorrt_gets_int64_position_ids_of_full_batch() -> None:
    cos, sin = _tables(32, D // 2)
    tables = [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")]

    def rotary(pos_type: int, pos_shape: list[int]) -> ir.Model:
        return _model(
            [helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"])],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, H, S, D]),
             helper.make_tensor_value_info("pos", pos_type, pos_shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, H, S, D])],
            tables,
        )  # fmt: skip

    model = rotary(TensorProto.INT32, [1, S])
    graph_ops.infer_shapes(model)
    assert rope_for_tensorrt(model) == 1
    (node,) = nodes(model, "RotaryEmbedding")
    assert node.inputs[3].dtype == ir.DataType.INT64
    assert node.inputs[3].producer().op_type == "Expand"
    x = np.random.default_rng(2).standard_normal((B, H, S, D)).astype(np.float32)
    row = np.arange(S) + 3
    got = ort_run(model, {"x": x, "pos": row[None].astype(np.int32)})[0]
    want = ort_run(rotary(TensorProto.INT64, [B, S]), {"x": x, "pos": np.tile(row, (B, 1)).astype(np.int64)})[0]
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert rope_for_tensorrt(model) == 0, "already in TensorRT's form"
