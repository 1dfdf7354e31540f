"""The traced graph's positional region: values computed from the position ids, its Cos/Sin and its frontier.

:func:`positional_region` finds the values computed from the position ids (with constants and shapes), the ``Cos`` /
``Sin`` among them and the frontier the rest of the graph reads; :func:`position_tables` finds lookups of learned
position tables and :func:`_other_positional` any other position-dependent value. Used by
:mod:`posenc.graphs.trace_rewrite`.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from posenc.errors import ExportError
from posenc.graphs import match_utils as mu

_SHAPE_OPS = ("Shape", "Size")


@dataclasses.dataclass
class Region:
    """Values computed from the position ids (with constants and shapes), the Cos/Sin among their producers, and
    the frontier: angle-derived values read outside the region."""

    values: set[int]
    cos_sin: list[ir.Node]
    frontier: list[ir.Value]


def _is_const(value: ir.Value, consts: set[int]) -> bool:
    return value.is_initializer() or id(value) in consts or value.const_value is not None


def positional_region(graph: ir.Graph, ids: ir.Value) -> Region:
    """The :class:`Region` of ``ids`` in ``graph`` (nodes in topological order)."""
    consts: set[int] = set()
    positional: set[int] = {id(ids)}
    angled: set[int] = set()
    cos_sin: list[ir.Node] = []
    members: list[ir.Node] = []
    for node in graph:
        inputs = [v for v in node.inputs if v is not None]
        if node.op_type in _SHAPE_OPS or node.op_type == "Constant":
            consts.update(id(v) for v in node.outputs)
            continue
        if all(_is_const(v, consts) for v in inputs):
            consts.update(id(v) for v in node.outputs)
            continue
        if not all(_is_const(v, consts) or id(v) in positional for v in inputs):
            continue
        positional.update(id(v) for v in node.outputs)
        members.append(node)
        if node.op_type in ("Cos", "Sin") or any(id(v) in angled for v in inputs):
            angled.update(id(v) for v in node.outputs)
            if node.op_type in ("Cos", "Sin"):
                cos_sin.append(node)
    frontier = []
    outputs = {id(v) for v in graph.outputs}
    for node in members:
        for value in node.outputs:
            if id(value) not in angled:
                continue
            read_outside = any(id(user.outputs[0]) not in positional for user, _ in value.uses() if user.outputs)
            if read_outside or id(value) in outputs:
                frontier.append(value)
    return Region(positional, cos_sin, frontier)


def _guarded_ids(graph: ir.Graph) -> ir.Value:
    """The position ids the model reads: the guard's safe ids (``Where(valid, p, 0)``) where the graph guards."""
    from posenc.graphs.guard import _guard_of

    ids = next((v for v in graph.inputs if v.name == "position_ids"), None)
    if ids is None:
        raise ExportError("the traced graph has no position_ids input; it cannot be rewritten.")
    for node, _ in ids.uses():
        found = _guard_of(node)
        if found is not None and found[0] is ids:
            return node.outputs[0]
    return ids


TABLE_PART = "position table"


def position_tables(graph: ir.Graph, region: Region) -> list[ir.Node]:
    """Lookups of a constant table (of more than one row) by position-derived indices: a model's learned (or stored
    sinusoidal) position embeddings. The guard's one-row tripwire is not one."""
    found = []
    for node in graph:
        if node.op_type != "Gather" or len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
            continue
        table, index = node.inputs[0], node.inputs[1]
        rows = mu.static_dim(table, 0)
        positional = table.is_initializer() and id(index) in region.values and not _looked_up(index, region)
        if positional and rows is not None and rows > 1:
            found.append(node)
    return found


_RESHAPES = ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Expand", "Identity")


def _looked_up(index: ir.Value, region: Region) -> bool:
    """An index read from a buffer that does not hold positions (BERT's token type ids, gathered at the positions):
    its table is not looked up by position."""
    producer = index.producer()
    while producer is not None and producer.op_type in _RESHAPES and producer.inputs and producer.inputs[0]:
        producer = producer.inputs[0].producer()
    if producer is None or producer.op_type not in ("Gather", "GatherElements") or not producer.inputs:
        return False
    if producer.inputs[0] is None:
        return False
    return id(producer.inputs[0]) not in region.values


def _other_positional(graph: ir.Graph, region: Region) -> list[str]:
    """Position-dependent values besides the angles, the mask, the guard and position tables (e.g. a
    position-dependent q scale), as ``"name [shape] read by Op"``: they stay as traced."""
    frontier = {id(v) for v in region.frontier}
    frontier |= {id(node.outputs[0]) for node in position_tables(graph, region)}
    found = []
    for node in graph:
        for value in node.outputs:
            if id(value) not in region.values or id(value) in frontier or node.op_type in _SHAPE_OPS:
                continue
            readers = [user for user, _ in value.uses() if user.op_type not in _SHAPE_OPS  # shapes read no values
                       and not any(id(o) in region.values for o in user.outputs)]  # fmt: skip
            if not readers or _is_mask(value) or any(_adds_to_hidden(user) for user in readers):
                continue
            shape = "[" + ", ".join(str(d) for d in value.shape.dims) + "]" if value.shape is not None else "[?]"
            found.append(f"{value.name} {shape} read by {', '.join(sorted({u.op_type for u in readers}))}")
    return found


def _is_mask(value: ir.Value) -> bool:
    """A per-key mask ``[B, 1, S, P + S]`` (its last axis runs over the keys, cache included)."""
    if value.shape is None or value.shape.rank() < 3:
        return False
    last = value.shape.dims[-1]
    return not isinstance(last, int) and "past" in str(last.value)


def _adds_to_hidden(node: ir.Node) -> bool:
    """The position guard's ``hidden + poison``."""
    return node.op_type == "Add" and any(v is not None and v.name == "hidden" and v.producer() is None
                                         for v in node.inputs)  # fmt: skip


__all__ = ["TABLE_PART", "Region", "position_tables", "positional_region"]
