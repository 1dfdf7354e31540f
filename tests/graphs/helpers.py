"""Running graphs on ONNX Runtime CPU for the graph tests, and hand-built graphs they share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from posenc.export.runtime import ort_session
from posenc.graphs.fold import infer_shapes
from posenc.graphs.model_io import model_to_proto


def ort_run(model: ir.Model | Path | bytes, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``model`` (IR, file or serialized) on ONNX Runtime CPU, in graph output order."""
    if isinstance(model, ir.Model):
        model = model_to_proto(model).SerializeToString()
    return ort_session(model, ["CPUExecutionProvider"], check=False).run(None, feed)


def hand_built(graph_nodes: list, inputs: list, outputs: list, initializers: Sequence = ()) -> ir.Model:
    """An opset-23 IR model of ``onnx.helper`` parts, shapes inferred as ``posenc optimize`` does before its passes."""
    graph = helper.make_graph(graph_nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    loaded = ir.serde.deserialize_model(model)
    infer_shapes(loaded)
    return loaded


GUARD_OPS = frozenset(
    {
        "GreaterOrEqual",
        "Less",
        "And",
        "Not",
        "Where",
        "Cast",
        "Gather",
        "Squeeze",
        "Unsqueeze",
        "Expand",
        "Shape",
        "Add",
    }
)
"""Ops of the position guard (posenc.functional.position_guard): checks and a tripwire on the [B, S] position ids,
and the Add of its poison to what the positions produced."""


def past_guard(value: ir.Value) -> ir.Value:
    """What ``value`` becomes after the position guard adds its poison (``value`` when no guard Add reads it)."""
    users = [use.node for use in value.uses()]
    if len(users) == 1 and users[0].op_type == "Add":
        return users[0].outputs[0]
    return value


def op_counts(model: ir.Model) -> Counter:
    return Counter(node.op_type for node in model.graph.all_nodes())


def nodes(model: ir.Model, op_type: str) -> list[ir.Node]:
    return [node for node in model.graph.all_nodes() if node.op_type == op_type]


def assert_close(got: np.ndarray, want: np.ndarray, atol: float, rtol: float, what: str) -> None:
    got64, want64 = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got64.shape == want64.shape, f"{what}: shape {got64.shape} != {want64.shape}"
    excess = np.abs(got64 - want64) - (atol + rtol * np.abs(want64))
    assert excess.max() <= 0, f"{what}: max |diff| {np.abs(got64 - want64).max():.3g} over atol={atol} rtol={rtol}"


def concat_cache_block(heads: int = 4, kv_heads: int = 2, head_dim: int = 16) -> onnx.ModelProto:
    """A concat-cache attention on q/k/v inputs ``[B, S, h·D]`` with the boolean mask a graph input ``[B, 1, S, T]``
    (as a model from elsewhere might pass its padding mask)."""
    h, f = onnx.helper, onnx.TensorProto.FLOAT

    def split(name: str) -> list[onnx.NodeProto]:
        return [
            h.make_node("Reshape", [name, f"{name}_shape"], [f"{name}_heads"]),
            h.make_node("Transpose", [f"{name}_heads"], [f"{name}4"], perm=[0, 2, 1, 3]),
        ]

    nodes = [*split("q"), *split("k"), *split("v")]
    nodes += [
        h.make_node("Concat", ["past_key", "k4"], ["present_key"], axis=2),
        h.make_node("Concat", ["past_value", "v4"], ["present_value"], axis=2),
        h.make_node("Attention", ["q4", "present_key", "present_value", "mask"], ["att"], scale=0.25),
        h.make_node("Transpose", ["att"], ["att_t"], perm=[0, 2, 1, 3]),
        h.make_node("Reshape", ["att_t", "merged_shape"], ["out"]),
    ]
    shapes = {"q_shape": [0, 0, heads, head_dim], "k_shape": [0, 0, kv_heads, head_dim]}
    shapes |= {"v_shape": shapes["k_shape"], "merged_shape": [0, 0, heads * head_dim]}
    inits = [onnx.numpy_helper.from_array(np.array(v, dtype=np.int64), k) for k, v in shapes.items()]
    inputs = [
        h.make_tensor_value_info("q", f, ["B", "S", heads * head_dim]),
        h.make_tensor_value_info("k", f, ["B", "S", kv_heads * head_dim]),
        h.make_tensor_value_info("v", f, ["B", "S", kv_heads * head_dim]),
        h.make_tensor_value_info("past_key", f, ["B", kv_heads, "P", head_dim]),
        h.make_tensor_value_info("past_value", f, ["B", kv_heads, "P", head_dim]),
        h.make_tensor_value_info("mask", onnx.TensorProto.BOOL, ["B", 1, "S", "T"]),
    ]
    outputs = [h.make_tensor_value_info(n, f, None) for n in ("out", "present_key", "present_value")]
    model = h.make_model(h.make_graph(nodes, "block", inputs, outputs, inits), opset_imports=[h.make_opsetid("", 23)])
    model.ir_version = 10
    return model


def half_rotation_nodes() -> list[onnx.NodeProto]:
    """posenc's exported half rotation (:func:`posenc.functional.apply_rope`) of ``x`` into ``y``: rows of the
    tables ``cos`` / ``sin`` gathered at ``pos``, ``x`` split at ``h`` (constants ``zero``, ``h``, ``end``, ``ax``,
    ``one`` for the slices and unsqueezes)."""
    return [
        helper.make_node("Gather", ["cos", "pos"], ["c3"]),
        helper.make_node("Gather", ["sin", "pos"], ["s3"]),
        helper.make_node("Unsqueeze", ["c3", "one"], ["c"]),
        helper.make_node("Unsqueeze", ["s3", "one"], ["s"]),
        helper.make_node("Slice", ["x", "zero", "h", "ax", "one"], ["x1"]),
        helper.make_node("Slice", ["x", "h", "end", "ax", "one"], ["x2"]),
        helper.make_node("Mul", ["x1", "c"], ["a"]),
        helper.make_node("Mul", ["x2", "s"], ["b"]),
        helper.make_node("Sub", ["a", "b"], ["first"]),
        helper.make_node("Mul", ["x2", "c"], ["e"]),
        helper.make_node("Mul", ["x1", "s"], ["f"]),
        helper.make_node("Add", ["e", "f"], ["second"]),
        helper.make_node("Concat", ["first", "second"], ["y"], axis=-1),
    ]
