"""The matrices' same-graph claims hold: each graph of ``tests.matrix.SAME_GRAPH`` is its representative's graph up
to the values of floating-point constants (which is why ``make test`` leaves it to ``make test-slow``).

Two graphs have the same structure when their nodes (domain, op type, attributes), wiring, graph inputs and outputs,
initializer dtypes and shapes and integer constant values agree; only the values of floating-point tensors and
attributes may differ. The claims are checked by exporting both sides (slow); the comparison itself is checked on
hand-built graphs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import SMALL
from tests.matrix import SAME_GRAPH, MatrixCase, exported


def _tensor(tensor: onnx.TensorProto) -> list[object]:
    array = numpy_helper.to_array(tensor)
    values = array.ravel().tolist() if array.dtype.kind in "iub" else None  # float values may differ
    return [str(array.dtype), list(array.shape), values]


def _graph(graph: onnx.GraphProto) -> list[object]:
    names: dict[str, str] = {"": ""}

    def name(value: str) -> str:  # value names by first appearance: exporters number them differently
        return names.setdefault(value, f"v{len(names)}")

    rows: list[object] = [["input", name(v.name), v.type.tensor_type.elem_type] for v in graph.input]
    # initializers in the order the nodes read them, so that their own names do not matter
    initializers = {t.name: t for t in graph.initializer}
    for node in graph.node:
        for value in node.input:
            if value in initializers and value not in names:
                rows.append(["initializer", name(value), _tensor(initializers[value])])
    for node in graph.node:
        attributes: list[object] = []
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                value: object = _tensor(attribute.t)
            elif attribute.type == onnx.AttributeProto.GRAPH:
                value = _graph(attribute.g)
            elif attribute.type in (onnx.AttributeProto.FLOAT, onnx.AttributeProto.FLOATS):
                value = "float"
            else:
                value = str(helper.get_attribute_value(attribute))
            attributes.append([attribute.name, value])
        inputs = [name(v) for v in node.input]
        rows.append([node.domain, node.op_type, inputs, [name(v) for v in node.output], attributes])
    rows += [["output", name(v.name)] for v in graph.output]
    return rows


def structure(model: onnx.ModelProto | Path) -> str:
    """The graph with the values of its floating-point constants left out, as one comparable string."""
    loaded = onnx.load(str(model)) if isinstance(model, Path) else model
    return json.dumps(_graph(loaded.graph))


def _model(scale: float, index: int, op: str = "Mul") -> onnx.ModelProto:
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        helper.make_node(op, ["rows", "scale"], ["scaled"]),
        helper.make_node("Slice", ["scaled", "start", "end"], ["out"]),
    ]
    initializers = [
        numpy_helper.from_array(np.full((8, 4), scale, np.float32), "table"),
        numpy_helper.from_array(np.array(scale, np.float32), "scale"),
        numpy_helper.from_array(np.array([0], np.int64), "start"),
        numpy_helper.from_array(np.array([index], np.int64), "end"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializers,
    )
    return helper.make_model(graph)


def test_structure_ignores_float_values_only() -> None:
    assert structure(_model(0.5, 2)) == structure(_model(2.0, 2))
    assert structure(_model(0.5, 2)) != structure(_model(0.5, 3)), "an integer constant (a slice end) differs"
    assert structure(_model(0.5, 2)) != structure(_model(0.5, 2, op="Add")), "an op differs"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("key", "representative"), sorted(SAME_GRAPH.items()), ids=lambda v: "-".join(v) if isinstance(v, tuple) else v
)
def test_graph_repeats_its_representative_up_to_constant_values(
    export_cache, key: tuple[str, str, str, str], representative: str
) -> None:
    scheme, mode, dtype, unit = key
    graph = exported(MatrixCase(scheme, mode, dtype, unit), export_cache, SMALL)
    same = exported(MatrixCase(representative, mode, dtype, unit), export_cache, SMALL)
    assert structure(graph) == structure(same), (
        f"{graph.name} is no longer {same.name}'s graph: drop it from SAME_GRAPH"
    )
