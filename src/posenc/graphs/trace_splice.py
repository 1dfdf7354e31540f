"""Building nodes: posenc's cos/sin spliced into the traced graph, in the model's layout.

:func:`splice_scheme` adds posenc's ``cos``, ``sin [B, S, r/2]`` of the guarded position ids (a Gather of the
float64-exact tables, or the scheme's module exported and moved in); :func:`_arranged` lays them out as the model
does; :class:`Replacement` records what a frontier tensor now holds. Used by :mod:`posenc.graphs.trace_rewrite`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx_ir as ir
import torch

from posenc.export.torch_onnx import to_onnx_model
from posenc.graphs.trace_probe import Axes
from posenc.schemes.base import PositionalScheme, TableMode
from posenc.trace.module import scheme_cos_sin


class _Builder:
    """Appends nodes (and constant initializers) to a graph; the caller sorts the graph afterwards."""

    def __init__(self, graph: ir.Graph, prefix: str) -> None:
        self.graph = graph
        self.prefix = prefix
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}{hint}_{self.count}"

    def const(self, array: np.ndarray, hint: str = "const") -> ir.Value:
        name = self.name(hint)
        value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
        value.shape, value.dtype = ir.Shape(array.shape), ir.DataType.from_numpy(array.dtype)
        self.graph.register_initializer(value)
        return value

    def ints(self, values: list[int]) -> ir.Value:
        return self.const(np.array(values, dtype=np.int64), "ints")

    def op(self, op_type: str, inputs: list[ir.Value], **attributes: Any) -> ir.Value:
        node = ir.node(op_type, inputs, attributes=attributes, name=self.name(op_type.lower()))
        node.outputs[0].name = self.name(op_type.lower() + "_out")
        self.graph.append(node)
        return node.outputs[0]


def _table_lookup(graph: ir.Graph, ids: ir.Value, exact: PositionalScheme) -> tuple[ir.Value, ir.Value] | None:
    """``Gather(cos_table, ids)``, ``Gather(sin_table, ids)`` for a scheme whose cos/sin are one precomputed table
    pair (what its exported module computes), else None."""
    from posenc.schemes.rope import RotaryAngles

    angles = getattr(exact, "angles", None)
    if not isinstance(angles, RotaryAngles) or exact.table_mode is not TableMode.PRECOMPUTED:
        return None
    if getattr(exact, "key_angles", None) is not None or getattr(exact, "position_axes", 1) != 1:
        return None
    build = _Builder(graph, "posenc_angles/")
    tables = []
    for name in ("cos_table", "sin_table"):
        array = getattr(angles, name).detach().numpy()
        value = ir.Value(name=f"posenc_angles/scheme.angles.{name}", const_value=ir.tensor(array))
        value.shape, value.dtype = ir.Shape(array.shape), ir.DataType.from_numpy(array.dtype)
        graph.register_initializer(value)
        tables.append(build.op("Gather", [value, ids], axis=0))
    return tables[0], tables[1]


def splice_scheme(graph: ir.Graph, ids: ir.Value, exact: PositionalScheme) -> tuple[ir.Value, ir.Value]:
    """posenc's ``cos``, ``sin [B, S, r/2]`` of ``ids [B, S]`` as a subgraph of ``graph``: a Gather of the
    float64-exact tables where the scheme's cos/sin are one precomputed table pair, else the scheme's module
    exported (switching table sets, float32-exact dynamic angles) and moved in."""
    direct = _table_lookup(graph, ids, exact)
    if direct is not None:
        return direct

    class CosSin(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scheme = exact

        def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return scheme_cos_sin(self.scheme, position_ids)

    sample = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int64)
    dims = torch.export.Dim("batch", min=1), torch.export.Dim("seq", min=1)
    proto, _ = to_onnx_model(
        CosSin().eval(),
        (sample,),
        input_names=["position_ids"],
        output_names=["posenc_cos", "posenc_sin"],
        dynamic_shapes=({0: dims[0], 1: dims[1]},),
        dim_names=({0: "batch", 1: "seq"},),
    )
    sub = ir.serde.deserialize_model(proto).graph
    source = sub.inputs[0]
    prefix = "posenc_angles/"
    for name, init in list(sub.initializers.items()):
        sub.initializers.pop(name)
        init.name = prefix + name
        graph.register_initializer(init)
    for node in list(sub):
        for value in node.outputs:
            value.name = prefix + (value.name or "v")
        node.name = prefix + (node.name or node.op_type)
    outputs = list(sub.outputs)
    sub.outputs.clear()
    for node in list(sub):
        sub.remove(node)
        graph.append(node)
    ir.convenience.replace_all_uses_with(source, ids)
    return outputs[0], outputs[1]


def _arranged(build: _Builder, base: ir.Value, layout: str, half: int) -> ir.Value:
    """posenc's ``[B, S, r/2]`` cos or sin in the model's ``layout`` (:mod:`posenc.trace.layouts`)."""
    if layout == "narrow":
        return base
    if layout == "half":
        return build.op("Concat", [base, base], axis=-1)
    pairs = build.op("Concat", [build.op("Unsqueeze", [base, build.ints([-1])])] * 2, axis=-1)
    shape = build.op("Concat", [build.op("Shape", [base], start=0, end=2), build.ints([2 * half])], axis=0)
    return build.op("Reshape", [pairs, shape])


@dataclasses.dataclass(frozen=True)
class Replacement:
    """A frontier tensor's new value: posenc's cos or sin (``base [B, S, r/2]``) in the model's layout."""

    source: str
    layout: str
    base: ir.Value
    axes: Axes


__all__ = ["Replacement", "splice_scheme"]
