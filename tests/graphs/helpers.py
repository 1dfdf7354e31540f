"""Running graphs on ONNX Runtime CPU for the graph tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
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
