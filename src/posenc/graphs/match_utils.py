"""Small helpers the rewrite rules use to read constants, shapes and dtypes of IR values."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

INT64_MAX = 2**63 - 1
MS_DOMAIN = "com.microsoft"
"""ONNX Runtime's contrib operator domain (``GroupQueryAttention``)."""
FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
"""The activation dtypes the attention rewrites take."""


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The constant behind ``value`` (initializer or Constant node) as a numpy array, else ``None``."""
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    try:
        return tensor.numpy()
    except Exception:  # external data that cannot be read: not a usable constant for matching
        return None


def const_ints(value: ir.Value | None) -> list[int] | None:
    """A constant integer tensor as a flat list, else ``None``."""
    array = const_array(value)
    if array is None or array.dtype.kind not in "iu":
        return None
    return [int(v) for v in array.reshape(-1)]


def const_scalar(value: ir.Value | None) -> float | None:
    """A constant with exactly one element as a float, else ``None``."""
    array = const_array(value)
    if array is None or array.size != 1:
        return None
    return float(array.reshape(-1)[0])


def is_ints(value: ir.Value | None, expected: Sequence[int]) -> bool:
    return const_ints(value) == list(expected)


def is_last_axis(value: ir.Value | None, rank: int) -> bool:
    """``value`` is the constant axis list ``[-1]`` or ``[rank - 1]``."""
    axes = const_ints(value)
    return axes is not None and len(axes) == 1 and axes[0] in (-1, rank - 1)


def is_neg_inf(value: ir.Value | None) -> bool:
    scalar = const_scalar(value)
    return scalar is not None and math.isinf(scalar) and scalar < 0


def is_nan(value: ir.Value | None) -> bool:
    scalar = const_scalar(value)
    return scalar is not None and math.isnan(scalar)


def rank(value: ir.Value | None) -> int | None:
    if value is None or value.shape is None:
        return None
    return value.shape.rank()


def static_dim(value: ir.Value | None, axis: int) -> int | None:
    """Dimension ``axis`` of ``value`` when it is a known integer, else ``None``."""
    if value is None or value.shape is None:
        return None
    dims = value.shape.dims
    if not -len(dims) <= axis < len(dims):
        return None
    dim = dims[axis]
    return dim if isinstance(dim, int) else None


def same_dim(a: ir.Value, axis_a: int, b: ir.Value, axis_b: int) -> bool:
    """Both dimensions are known and equal (the same integer or the same symbolic name)."""
    if a.shape is None or b.shape is None:
        return False
    try:
        da, db = a.shape.dims[axis_a], b.shape.dims[axis_b]
    except IndexError:
        return False
    if isinstance(da, int) or isinstance(db, int):
        return da == db
    return da.value is not None and da.value == db.value


def dtype(value: ir.Value | None) -> ir.DataType | None:
    if value is None or value.type is None:
        return None
    return value.dtype


def producer_of(value: ir.Value | None, op_type: str, domain: str = "") -> ir.Node | None:
    """The node producing ``value`` when it is ``op_type`` in ``domain``, else ``None``."""
    if value is None:
        return None
    node = value.producer()
    if node is None or node.op_type != op_type or node.domain not in (domain, "ai.onnx" if domain == "" else domain):
        return None
    return node


def operand(node: ir.Node, index: int) -> ir.Value:
    """Input ``index`` of ``node``, which a matched pattern guarantees; ValueError when it is absent."""
    value = node.inputs[index] if index < len(node.inputs) else None
    if value is None:
        raise ValueError(f"{node.op_type} node {node.name!r} has no input {index}")
    return value


def producer(value: ir.Value) -> ir.Node:
    """The node producing ``value`` (an output of a matched node); ValueError for a graph input or initializer."""
    node = value.producer()
    if node is None:
        raise ValueError(f"value {value.name!r} has no producer")
    return node


def int_attr(node: ir.Node, name: str, default: int = 0) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.value)


def split_heads_source(x4: ir.Value) -> ir.Value | None:
    """``x [B, S, h·D]`` when ``x4 [B, h, S, D]`` is ``Transpose(Reshape(x, [B, S, h, D]), perm=[0, 2, 1, 3])``, the
    head split of a projection; else ``None``."""
    transpose = producer_of(x4, "Transpose")
    if transpose is None or list(transpose.attributes.get_ints("perm", [])) != [0, 2, 1, 3]:
        return None
    reshape = producer_of(transpose.inputs[0], "Reshape")
    if reshape is None or rank(reshape.inputs[0]) != 3:
        return None
    source, heads, head_dim = reshape.inputs[0], static_dim(x4, 1), static_dim(x4, 3)
    width = static_dim(source, 2)
    if heads is not None and head_dim is not None and width is not None and width != heads * head_dim:
        return None  # e.g. [B, S·h, D] -> [B, S, h, D]: not a projection's heads
    return source


def shaped_like(value: ir.Value, like: ir.Value) -> ir.Value:
    """``value`` given ``like``'s dtype (when known) and shape, e.g. a subgraph output standing for ``like``."""
    if like.dtype is not None:
        value.dtype = like.dtype
    value.shape = like.shape
    return value


def take_over(old: ir.Value, new: ir.Value) -> None:
    """A rewrite's ``new`` value replaces ``old``: its name, dtype and shape, every use, and its place among the graph
    outputs (``old`` is left nameless and unread)."""
    new.name, old.name = old.name, None
    if old.type is not None:
        shaped_like(new, old)
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)


def constant(tape: ir.tape.Tape, value: np.ndarray) -> ir.Value:
    """A ``Constant`` node of ``value`` recorded on ``tape``; its output."""
    return tape.op("Constant", [], attributes={"value": ir.tensor(value)})


def int_constant(tape: ir.tape.Tape, *values: int) -> ir.Value:
    """A 1-D int64 ``Constant`` of ``values`` recorded on ``tape``; its output."""
    return constant(tape, np.array(values, dtype=np.int64))


def is_slot_prefix_slice(node: ir.Node) -> bool:
    """A ``Slice(x, [0], ends, [2], [1])`` of a 4-D ``x`` ``[B, H, C, D]`` along its slot axis (a filled prefix)."""
    steps = node.inputs[4] if len(node.inputs) > 4 else None
    axes = node.inputs[3] if len(node.inputs) > 3 else None
    return (
        len(node.inputs) >= 4
        and rank(node.inputs[0]) == 4
        and is_ints(node.inputs[1], [0])
        and (is_ints(axes, [2]) or is_ints(axes, [-2]))
        and (steps is None or is_ints(steps, [1]))
    )


def same_ints(a: ir.Value, b: ir.Value) -> bool:
    """``a`` and ``b`` are one value, or constants of the same integers."""
    if a is b:
        return True
    ints_a, ints_b = const_ints(a), const_ints(b)
    return ints_a is not None and ints_a == ints_b
