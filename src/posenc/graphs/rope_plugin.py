"""Replace RoPE with the posenc RoPE plugin node (``posenc optimize --rope plugin``).

Input: a model whose rotations are standard ``RotaryEmbedding`` nodes (opset 23), e.g. after
:func:`posenc.graphs.rope.fuse_rope` turned posenc's decomposed rotation into them (this pass runs that fusion
first when ``fuse_decomposed=True``).

Rewrite: the two ``RotaryEmbedding`` nodes of an attention block that share cos/sin (and position ids) and
attributes, and do not depend on each other, become one plugin node that rotates both tensors in one launch:

- with position ids and 2-D tables -> ``PosencRope(q, k, cos_table, sin_table, position_ids)``;
- without position ids (3-D caches) -> ``PosencRopeCache(q, k, cos, sin)``;
- 3-D ``[B, S, H*D]`` inputs (``num_heads``) are viewed as ``[B, S, H, D]`` (``qk_format = bshd``) by a
  Reshape before and after (free in TensorRT);
- a float32 rotation wrapped in ``Cast(fp16/bf16 -> fp32)`` ... ``Cast(-> fp16/bf16)`` is rotated directly in
  the low-precision dtype (the kernel computes in float32, so the result is the same).

A RotaryEmbedding without a partner (an odd one out) stays a native op (TensorRT imports it as its rotary layer),
with the reason logged and collected (``declined``): in particular q and k rotated by different cos/sin (xPos
scales q and k per position in opposite directions) are declined, because the plugin applies one cos/sin to both.
The plugin node has domain and ``plugin_namespace`` ``posenc`` and ``aot = 1``; with ``with_functions=True``
(default) the model also carries the plugin's ONNX Runtime twin as a model-local function, so it still runs in
ONNX Runtime (see :mod:`posenc.plugins.rope.ort_twin` for how TensorRT versions treat that function).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, TopologicalSortPass

from posenc.errors import ConfigError
from posenc.graphs import match_utils as mu
from posenc.plugins.rope.ort_twin import rope_function
from posenc.plugins.rope.spec import PLUGIN_NAMESPACE, PLUGIN_VERSION, AngleSource, QKFormat, RopeKernelSpec

__all__ = ["plugin_nodes", "replace_rope_with_plugin", "rope_to_plugin"]

_LOG = logging.getLogger(__name__)
_ROTARY = "RotaryEmbedding"
_LOW_PRECISION = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
_FLOATS = (ir.DataType.FLOAT, *_LOW_PRECISION)


@dataclass
class _Rotation:
    """One RotaryEmbedding node, as the plugin will see it."""

    node: ir.Node
    x: ir.Value  # plugin input (the low-precision source when a float32 Cast is folded)
    out: ir.Value  # value the plugin output replaces (the Cast-back output when folded)
    spec: RopeKernelSpec
    qk_format: QKFormat
    num_heads: int  # for 3-D inputs (reshape to [B, S, H, D]); 0 for 4-D
    folded_cast: ir.Node | None

    def key(self) -> tuple[object, ...]:
        n = self.node
        tables = tuple(id(v) if v is not None else None for v in n.inputs[1:4])
        return (tables, self.spec, self.qk_format, self.x.dtype)


def _int_attr(node: ir.Node, name: str, default: int = 0) -> int:
    attr = node.attributes.get(name)
    return int(attr.value) if attr is not None else default


def _static(value: ir.Value, axis: int) -> int | None:
    shape = value.shape
    if shape is None or len(shape) == 0:
        return None
    dim = shape[axis]
    return dim if isinstance(dim, int) else None


def _fold_casts(node: ir.Node) -> tuple[ir.Value, ir.Value, ir.Node | None]:
    """``(plugin input, value to replace, Cast-back node)``: skip a float32 up-cast/down-cast pair."""
    x, out = mu.operand(node, 0), node.outputs[0]
    up = x.producer()
    source = up.inputs[0] if up is not None and up.inputs else None
    low = mu.dtype(source)
    users = list(out.uses())
    if (
        up is not None
        and source is not None
        and low is not None
        and up.op_type == "Cast"
        and up.domain in ("", "ai.onnx")
        and x.dtype == ir.DataType.FLOAT
        and low in _LOW_PRECISION
        and len(users) == 1
        and not out.is_graph_output()
    ):
        down = users[0].node
        if down.op_type == "Cast" and down.domain in ("", "ai.onnx") and _int_attr(down, "to") == low.value:
            return source, down.outputs[0], down
    return x, out, None


def _describe(node: ir.Node) -> _Rotation | None:
    """The plugin view of a RotaryEmbedding node, or ``None`` (with the reason logged) if unsupported."""
    x, cos = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    has_positions = len(node.inputs) > 3 and node.inputs[3] is not None
    if x is None or cos is None or x.shape is None or cos.shape is None or x.dtype not in _FLOATS:
        _LOG.info("RotaryEmbedding %s: unknown input shape or dtype; left as is.", node.name)
        return None
    rank = len(x.shape)
    num_heads = _int_attr(node, "num_heads")
    if rank == 4:
        head_dim, fmt, num_heads = _static(x, 3), QKFormat.BHSD, 0
    elif rank == 3 and num_heads > 0:
        width = _static(x, 2)
        head_dim = width // num_heads if width is not None and width % num_heads == 0 else None
        fmt = QKFormat.BSHD
    else:
        _LOG.info("RotaryEmbedding %s: input rank %d without num_heads; left as is.", node.name, rank)
        return None
    want_rank = 2 if has_positions else 3
    if head_dim is None or len(cos.shape) != want_rank:
        _LOG.info("RotaryEmbedding %s: needs a static head dim and %d-D caches; left as is.", node.name, want_rank)
        return None
    rotary_dim = _int_attr(node, "rotary_embedding_dim") or head_dim
    try:
        spec = RopeKernelSpec(
            angles=AngleSource.TABLE if has_positions else AngleSource.CACHE,
            rotary_dim=rotary_dim,
            head_dim=head_dim,
            layout="interleaved" if _int_attr(node, "interleaved") else "half",
        )
    except ConfigError as exc:
        _LOG.info("RotaryEmbedding %s: %s; left as is.", node.name, exc)
        return None
    source, out, down = _fold_casts(node)
    return _Rotation(node, source, out, spec, fmt, num_heads, down)


def _ancestors(value: ir.Value) -> set[int]:
    """ids of every node ``value`` depends on."""
    seen: set[int] = set()
    stack = [value.producer()]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(v.producer() for v in node.inputs if v is not None)
    return seen


def _pair(rotations: list[_Rotation]) -> list[tuple[_Rotation, _Rotation]]:
    """Greedy pairs in graph order: same key, neither depends on the other's output."""
    pairs: list[tuple[_Rotation, _Rotation]] = []
    used: set[int] = set()
    for i, first in enumerate(rotations):
        if id(first) in used:
            continue
        for second in rotations[i + 1 :]:
            if id(second) in used or second.key() != first.key():
                continue
            if id(first.node) in _ancestors(second.x) or id(second.node) in _ancestors(first.x):
                continue
            pairs.append((first, second))
            used.update((id(first), id(second)))
            break
    return pairs


def _decline_reasons(rotations: list[_Rotation], pairs: list[tuple[_Rotation, _Rotation]]) -> list[str]:
    """Why each rotation left without a partner stays a RotaryEmbedding."""
    paired = {id(rotation) for pair in pairs for rotation in pair}
    left = [rotation for rotation in rotations if id(rotation) not in paired]
    reasons = []
    for rotation in left:
        positions = rotation.node.inputs[3] if len(rotation.node.inputs) > 3 else None
        partner = next(
            (
                other
                for other in left
                if other is not rotation
                and other.key()[1:] == rotation.key()[1:]
                and (other.node.inputs[3] if len(other.node.inputs) > 3 else None) is positions
            ),
            None,
        )
        if partner is not None:
            reason = (
                f"RotaryEmbedding {rotation.node.name!r} and {partner.node.name!r} rotate by different cos/sin (q and "
                f"k scaled apart per position, as xPos does); the plugin applies one cos/sin to q and k, so they "
                f"stay RotaryEmbedding (TensorRT's native rotary layer)."
            )
        else:
            reason = (
                f"RotaryEmbedding {rotation.node.name!r} has no partner with the same cos/sin, positions and "
                f"attributes; it stays RotaryEmbedding."
            )
        _LOG.info(reason)
        reasons.append(reason)
    return reasons


def _const(name: str, values: list[int]) -> ir.Node:
    return ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.tensor(values, dtype=ir.DataType.INT64))], name=name)


def _replace_pair(graph: ir.Graph, a: _Rotation, b: _Rotation, index: int) -> None:
    prefix = f"posenc_rope_plugin_{index}"
    new_nodes: list[ir.Node] = []
    inputs: list[ir.Value] = []
    for tag, rot in (("q", a), ("k", b)):
        x = rot.x
        if rot.num_heads:
            shape = _const(f"{prefix}_{tag}_split_shape", [0, 0, rot.num_heads, -1])
            split = ir.Node("", "Reshape", [x, shape.outputs[0]], name=f"{prefix}_{tag}_split")
            new_nodes += [shape, split]
            x = split.outputs[0]
        inputs.append(x)
    extra = [v for v in a.node.inputs[1:4] if v is not None]
    attrs = dict(a.spec.plugin_attributes(a.qk_format))
    attributes = [ir.AttrInt64(k, v) if isinstance(v, int) else ir.AttrFloat32(k, v) for k, v in attrs.items()]
    attributes += [ir.AttrString("plugin_namespace", PLUGIN_NAMESPACE), ir.AttrString("plugin_version", PLUGIN_VERSION)]
    attributes.append(ir.AttrInt64("aot", 1))
    plugin = ir.Node(PLUGIN_NAMESPACE, a.spec.plugin_name, [*inputs, *extra], attributes, num_outputs=2, name=prefix)
    new_nodes.append(plugin)
    replacements: list[ir.Value] = []
    for tag, rot, value in (("q", a, plugin.outputs[0]), ("k", b, plugin.outputs[1])):
        value.name = f"{prefix}_{tag}_out"
        value.type = rot.x.type
        if rot.num_heads:
            value.shape = None
            shape = _const(f"{prefix}_{tag}_merge_shape", [0, 0, -1])
            merge = ir.Node("", "Reshape", [value, shape.outputs[0]], name=f"{prefix}_{tag}_merge")
            new_nodes += [shape, merge]
            value = merge.outputs[0]
        value.type = rot.out.type
        value.shape = rot.out.shape
        replacements.append(value)
    old_nodes = [a.node, b.node] + [r.folded_cast for r in (a, b) if r.folded_cast is not None]
    last = max(old_nodes, key=lambda n: _position(graph, n))
    graph.insert_after(last, new_nodes)
    for rot, value in zip((a, b), replacements, strict=True):
        if rot.out.is_graph_output():  # keep the graph output's name
            name = rot.out.name
            rot.out.name = f"{name}_replaced"
            value.name = name
        rot.out.replace_all_uses_with(value, replace_graph_outputs=True)
    graph.remove(old_nodes, safe=True)


def _position(graph: ir.Graph, node: ir.Node) -> int:
    return graph.index(node)


def _rotations(graph: ir.Graph) -> list[_Rotation]:
    found = []
    for node in graph:
        if node.op_type == _ROTARY and node.domain in ("", "ai.onnx"):
            rotation = _describe(node)
            if rotation is not None:
                found.append(rotation)
    return found


def _maybe_fuse_decomposed(model: ir.Model) -> int:
    try:
        from posenc.graphs import rope as rope_passes
    except ImportError:  # the fusion passes are optional for this pass
        return 0
    count = 0
    for name in ("convert_contrib_rope", "fuse_rope", "fuse_partial_rope"):
        fuse = getattr(rope_passes, name, None)
        if fuse is not None:
            count += int(fuse(model))
    return count


def rope_to_plugin(
    model: ir.Model,
    *,
    with_functions: bool = True,
    fuse_decomposed: bool = False,
    declined: list[str] | None = None,
) -> int:
    """In-place pass on the IR model (the form :mod:`posenc.graphs` passes take); see :func:`replace_rope_with_plugin`.

    Args:
        declined: if given, receives one reason per RotaryEmbedding left without a partner (also logged).

    Returns:
        The number of plugin nodes inserted (each replaces two rotations).
    """
    if fuse_decomposed:
        _maybe_fuse_decomposed(model)
    graph = model.graph
    rotations = _rotations(graph)
    pairs = _pair(rotations)
    reasons = _decline_reasons(rotations, pairs)
    if declined is not None:
        declined.extend(reasons)
    for index, (a, b) in enumerate(pairs):
        _replace_pair(graph, a, b, index)
    if not pairs:
        return 0
    model.opset_imports[PLUGIN_NAMESPACE] = 1
    RemoveUnusedNodesPass()(model)
    TopologicalSortPass()(model)
    if with_functions:
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
        used = {n.op_type for n in graph if n.domain == PLUGIN_NAMESPACE}
        for source in AngleSource:
            key = (PLUGIN_NAMESPACE, source.plugin_name, "")
            if source.plugin_name in used and key not in model.functions:
                model.functions[key] = ir.serde.deserialize_function(rope_function(source, opset))
        model.ir_version = max(model.ir_version, 9)  # the twins' attribute defaults need IR 9
    _LOG.info("replaced %d RotaryEmbedding pairs with posenc RoPE plugin nodes", len(pairs))
    return len(pairs)


def replace_rope_with_plugin(
    model: onnx.ModelProto | ir.Model,
    *,
    with_functions: bool = True,
    fuse_decomposed: bool = True,
) -> tuple[onnx.ModelProto, int]:
    """Replace paired RotaryEmbedding nodes (q and k of an attention block) by posenc RoPE plugin nodes.

    Args:
        model: the ONNX model (not modified; a rewritten copy is returned).
        with_functions: add the plugins' ONNX Runtime twins as model-local functions (the model then runs in
            ONNX Runtime, and TensorRT >= 10.7 still maps the nodes to the registered plugin). Use ``False`` for
            TensorRT < 10.7, which would inline the function instead of using the plugin.
        fuse_decomposed: first fuse posenc's decomposed rotations into RotaryEmbedding
            (:mod:`posenc.graphs.rope`), so decomposed exports are covered too.

    Returns:
        ``(rewritten model, number of plugin nodes inserted)``; each plugin node replaces two rotations.

    Raises:
        ExportError: ``with_functions`` and the model imports ai.onnx opset < 15.
    """
    proto = model if isinstance(model, onnx.ModelProto) else ir.serde.serialize_model(model)
    ir_model = ir.serde.deserialize_model(proto)
    count = rope_to_plugin(ir_model, with_functions=with_functions, fuse_decomposed=fuse_decomposed)
    return ir.serde.serialize_model(ir_model), count


def plugin_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The posenc plugin nodes of a model's main graph."""
    names = {source.plugin_name for source in AngleSource}
    return [n for n in model.graph.node if n.domain == PLUGIN_NAMESPACE and n.op_type in names]
