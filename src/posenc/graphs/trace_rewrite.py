"""The traced graph's positional subgraph -> posenc's tables, the rotation and mask in posenc's fusable forms.

A checkpoint's attention traced with its own rotary module (:mod:`posenc.export.trace`) computes its angles as
transformers does, in float32: ``position_ids -> Cast -> Mul/MatMul(inv_freq) -> (Concat) -> Cos / Sin (× attention
scaling) -> Unsqueeze``, about ``position * 2**-23`` rad off at far positions. :func:`replace_positions`:

1. finds the positional region (values computed from the position ids, constants and shapes alone), the ``Cos`` /
   ``Sin`` in it and its **frontier**: the cos/sin tensors the rest of the graph reads;
2. runs the traced graph on probe positions (ONNX Runtime) and matches every frontier tensor with posenc's cos or
   sin of the layer's scheme (built from the model's ``rope_parameters`` through :mod:`posenc.rope_types`) in one of
   the layouts of :mod:`posenc.trace.layouts`; a tensor that matches nothing keeps the whole part as traced, with
   the difference found;
3. splices in posenc's own cos/sin subgraph (the scheme's module exported: a float64-exact precomputed table read by
   the guarded position ids, or float32-exact dynamic angles) and gives every frontier tensor its values in the
   model's layout;
4. rewrites the model's rotation (``x·cos + rotate_half(x)·sin``, the interleaved ``stack(-x2, x1)`` form, the
   ``chunk`` form) into posenc's own decomposed rotation over ``cos``/``sin [B, S, r/2]``, which ``posenc optimize``
   fuses per target (``RotaryEmbedding``), and the additive mask ``scores + where(allowed, 0, min)`` into posenc's
   ``Where(Not(allowed), -inf, scores)``, which the attention passes read;
5. checks that the rewritten graph computes what the traced one did at the probe positions (the angles differ by
   transformers' float32 rounding only); otherwise the traced graph is kept and the difference said.

Every positional part gets a :class:`~posenc.trace.record.TracePart`: replaced, kept (why) or absent.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from onnxscript.rewriter import pattern

from posenc.errors import ExportError
from posenc.export.torch_onnx import to_onnx_model
from posenc.export.trace import RewriteRequest
from posenc.graphs import fold
from posenc.graphs import match_utils as mu
from posenc.schemes.base import PositionalScheme, TableMode
from posenc.trace.layouts import match_layout, probe_positions
from posenc.trace.module import scheme_cos_sin
from posenc.trace.record import ROTARY_PART, TracePart

ROTATION_PART = "rotation"
MASK_PART = "attention mask"
PROBE_BATCH = 2
VERIFY_TOLERANCE = 1e-2
"""Largest change of an output (relative to its magnitude) the rewrite may make at probe positions below 4096, where
the traced float32 angles are within ~5e-4 rad of posenc's; a wrong rewrite moves outputs by O(1)."""
_SHAPE_OPS = ("Shape", "Size")


# --------------------------------------------------------------------------------------------------
# The positional region and its frontier
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Probing the traced graph on ONNX Runtime
# --------------------------------------------------------------------------------------------------


def _probe_seq(frontier: list[ir.Value]) -> int:
    """A probe length no static dim of the frontier has (so the sequence axis is told apart)."""
    taken = {d for v in frontier if v.shape is not None for d in v.shape.dims if isinstance(d, int)}
    return next(n for n in (7, 11, 13, 17, 19, 23) if n not in taken and n != PROBE_BATCH)


def probe_feed(request: RewriteRequest, seq: int) -> dict[str, np.ndarray]:
    """Random hidden states, probe position ids ``[2, seq]`` and an empty cache."""
    config = request.plan.config
    rng = np.random.default_rng(0)
    return {
        "hidden": rng.standard_normal((PROBE_BATCH, seq, config.hidden_size)).astype(np.float32),
        "position_ids": probe_positions(PROBE_BATCH, seq, request.position_limit),
        "past_key": np.zeros((PROBE_BATCH, config.num_kv_heads, 0, config.head_dim), np.float32),
        "past_value": np.zeros((PROBE_BATCH, config.num_kv_heads, 0, config.head_dim), np.float32),
    }


def run_graph(model: ir.Model, feed: dict[str, np.ndarray], names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Run ``model`` on ONNX Runtime CPU; ``names``: values to read besides the graph outputs."""
    import onnx
    import onnxruntime as ort

    proto = ir.serde.serialize_model(model)
    known = {o.name for o in proto.graph.output}
    for name in names or []:
        if name not in known:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    out = session.run(None, {k: v for k, v in feed.items() if k in inputs})
    return {o.name: array for o, array in zip(session.get_outputs(), out, strict=True)}


@dataclasses.dataclass(frozen=True)
class Axes:
    """Where batch, sequence and features sit in a frontier tensor (every other axis has size 1)."""

    batch: int
    seq: int
    rank: int


def _axes(array: np.ndarray, seq: int) -> Axes | None:
    shape = array.shape
    seqs = [i for i, d in enumerate(shape) if d == seq]
    batches = [i for i, d in enumerate(shape) if d == PROBE_BATCH]
    if len(shape) < 3 or len(seqs) != 1 or len(batches) != 1:
        return None
    b, s = batches[0], seqs[0]
    if not b < s < len(shape) - 1 or any(d != 1 for i, d in enumerate(shape[:-1]) if i not in (b, s)):
        return None
    return Axes(b, s, len(shape))


# --------------------------------------------------------------------------------------------------
# Building nodes
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# The model's rotation -> posenc's decomposed rotation
# --------------------------------------------------------------------------------------------------


def _posenc_rotation(op, x: ir.Value, cos3: ir.Value, sin3: ir.Value, interleaved: bool, shape: ir.Value | None):
    """posenc's exported rotation of ``x [B, H, S, W]`` by ``cos3``/``sin3 [B, S, W/2]`` (:mod:`posenc.graphs.rope`'s
    patterns read it): half pairs ``Concat(x1·c - x2·s, x2·c + x1·s)``, or interleaved pairs stacked and flattened."""
    width = mu.static_dim(x, -1)
    half = width // 2  # type: ignore[operator]  # checked by the caller
    c, s = op.Unsqueeze(cos3, op.Constant(value_ints=[1])), op.Unsqueeze(sin3, op.Constant(value_ints=[1]))
    axes = op.Constant(value_ints=[-1])
    if not interleaved:
        x1 = op.Slice(x, op.Constant(value_ints=[0]), op.Constant(value_ints=[half]), axes, op.Constant(value_ints=[1]))
        x2 = op.Slice(x, op.Constant(value_ints=[half]), op.Constant(value_ints=[width]), axes,
                      op.Constant(value_ints=[1]))  # fmt: skip
        return op.Concat(op.Sub(op.Mul(x1, c), op.Mul(x2, s)), op.Add(op.Mul(x2, c), op.Mul(x1, s)), axis=-1)
    step = op.Constant(value_ints=[2])
    x1 = op.Slice(x, op.Constant(value_ints=[0]), op.Constant(value_ints=[width]), axes, step)
    x2 = op.Slice(x, op.Constant(value_ints=[1]), op.Constant(value_ints=[width]), axes, step)
    first = op.Unsqueeze(op.Sub(op.Mul(x1, c), op.Mul(x2, s)), axes)
    second = op.Unsqueeze(op.Add(op.Mul(x2, c), op.Mul(x1, s)), axes)
    return op.Reshape(op.Concat(first, second, axis=-1), shape if shape is not None else op.Shape(x))


class _Rotation(pattern.RewriteRuleClassBase):
    """Base of the rules over the model's rotation of ``x`` by frontier tensors ``C``, ``S`` that now hold posenc's
    cos/sin (:class:`Replacement`); subclasses give the pattern and which layouts it pairs with."""

    layouts: tuple[str, ...] = ()
    interleaved = False

    def __init__(self, name: str, replacements: dict[int, Replacement]) -> None:
        super().__init__(name=name, remove_nodes=False)
        self.replacements = replacements

    def _pair(self, c: ir.Value, s: ir.Value) -> tuple[Replacement, Replacement] | None:
        rc, rs = self.replacements.get(id(c)), self.replacements.get(id(s))
        if rc is None or rs is None or (rc.source, rs.source) != ("cos", "sin") or rc.layout != rs.layout:
            return None
        if (
            rc.layout not in self.layouts
            or rc.axes != rs.axes
            or (rc.axes.batch, rc.axes.seq, rc.axes.rank) != (0, 2, 4)
        ):
            return None
        return rc, rs

    def _checked(self, x: ir.Value, c: ir.Value, s: ir.Value, **slices: ir.Value) -> pattern.MatchResult:
        result = pattern.MatchResult()
        width = mu.static_dim(x, -1)
        if mu.rank(x) != 4 or width is None or width % 2:
            return result.fail("the rotated tensor is not [B, H, S, W] with a known even W", x)
        if self._pair(c, s) is None:
            return result.fail("cos/sin are not a pair posenc replaced in this layout", c)
        if not self.slices_ok(width, **slices):
            return result.fail("the slices are not the rotation's pairs", x)
        return result

    def slices_ok(self, width: int, **slices: ir.Value) -> bool:
        return True

    def rewrite(self, op, x, c, s, shape=None, **_):
        pair = self._pair(c, s)
        if pair is None:
            raise ValueError("rewrite of a rotation check() refused")
        rc, rs = pair
        return _posenc_rotation(op, x, rc.base, rs.base, self.interleaved, shape)


def _slice_ok(start: ir.Value, end: ir.Value, axes: ir.Value, step: ir.Value, lo: int, hi: int, by: int) -> bool:
    ends = mu.const_ints(end)
    return (
        mu.is_ints(start, [lo])
        and ends is not None
        and len(ends) == 1
        and ends[0] >= hi
        and mu.is_last_axis(axes, 4)
        and mu.is_ints(step, [by])
    )


class _RotateHalf(_Rotation):
    """``x·C + Concat(-x[..., h:], x[..., :h])·S`` (Llama's ``rotate_half``), C and S ``cat(c, c)``."""

    layouts = ("half",)

    def pattern(self, op, x, c, s, s1, e1, a1, st1, s2, e2, a2, st2):
        first = op.Slice(x, s1, e1, a1, st1)
        second = op.Slice(x, s2, e2, a2, st2)
        return op.Add(op.Mul(x, c), op.Mul(op.Concat(op.Neg(second), first, axis=-1), s))

    def check(self, context, x, c, s, s1, e1, a1, st1, s2, e2, a2, st2, **_):
        return self._checked(x, c, s, first=(s1, e1, a1, st1), second=(s2, e2, a2, st2))

    def slices_ok(self, width: int, **slices: Any) -> bool:
        half = width // 2
        s1, e1, a1, st1 = slices["first"]
        s2, e2, a2, st2 = slices["second"]
        return (
            mu.is_ints(e1, [half])
            and _slice_ok(s1, e1, a1, st1, 0, half, 1)
            and _slice_ok(s2, e2, a2, st2, half, width, 1)
        )


class _RotateEveryTwo(_Rotation):
    """``x·C + flatten(stack(-x[..., 1::2], x[..., 0::2]))·S`` (GPT-J, Cohere), C and S each value twice in a row."""

    layouts = ("interleaved",)
    interleaved = True

    def pattern(self, op, x, c, s, s1, e1, a1, st1, s2, e2, a2, st2, u1, u2, shape):
        even = op.Slice(x, s1, e1, a1, st1)
        odd = op.Slice(x, s2, e2, a2, st2)
        stacked = op.Concat(op.Unsqueeze(op.Neg(odd), u1), op.Unsqueeze(even, u2), axis=-1)
        return op.Add(op.Mul(x, c), op.Mul(op.Reshape(stacked, shape, _allow_other_attributes=True), s))

    def check(self, context, x, c, s, s1, e1, a1, st1, s2, e2, a2, st2, u1, u2, **_):
        if not (mu.is_last_axis(u1, 5) and mu.is_last_axis(u2, 5)):
            return pattern.MatchResult().fail("the pairs are not stacked on a new last axis")
        return self._checked(x, c, s, even=(s1, e1, a1, st1), odd=(s2, e2, a2, st2))

    def slices_ok(self, width: int, **slices: Any) -> bool:
        s1, e1, a1, st1 = slices["even"]
        s2, e2, a2, st2 = slices["odd"]
        return _slice_ok(s1, e1, a1, st1, 0, width - 1, 2) and _slice_ok(s2, e2, a2, st2, 1, width, 2)


class _ChunkHalves(_Rotation):
    """``Concat(x1·C - x2·S, x2·C + x1·S)`` with ``x1, x2 = Split(x)`` (GPT-OSS's ``chunk``), C and S ``c`` itself."""

    layouts = ("narrow",)

    def pattern(self, op, x, c, s):
        x1, x2 = op.Split(x, axis=-1, num_outputs=2, _outputs=2, _allow_other_attributes=True)
        return op.Concat(op.Sub(op.Mul(x1, c), op.Mul(x2, s)), op.Add(op.Mul(x2, c), op.Mul(x1, s)), axis=-1)

    def check(self, context, x, c, s, **_):
        return self._checked(x, c, s)


class _SplitAxisLast(_ChunkHalves):
    """:class:`_ChunkHalves` with the split written on axis 3 of the 4-D tensor."""

    def pattern(self, op, x, c, s):
        x1, x2 = op.Split(x, axis=3, num_outputs=2, _outputs=2, _allow_other_attributes=True)
        return op.Concat(op.Sub(op.Mul(x1, c), op.Mul(x2, s)), op.Add(op.Mul(x2, c), op.Mul(x1, s)), axis=-1)


def rotation_rules(replacements: dict[int, Replacement]) -> pattern.RewriteRuleSet:
    rules = [
        _RotateHalf.rule("trace_rotate_half", replacements),
        _RotateEveryTwo.rule("trace_rotate_every_two", replacements),
        _ChunkHalves.rule("trace_chunk_halves", replacements),
        _SplitAxisLast.rule("trace_chunk_halves_axis3", replacements),
    ]
    return pattern.RewriteRuleSet(rules, commute=True)


# --------------------------------------------------------------------------------------------------
# The additive mask -> posenc's boolean mask
# --------------------------------------------------------------------------------------------------


class _AdditiveMask(pattern.RewriteRuleClassBase):
    """``scores + Unsqueeze?(Where(Not(allowed), min, 0))`` -> ``Where(Not(allowed'), -inf, scores)``: the same
    softmax wherever a query sees a key (exp(min - max) is 0 in float32), and the mask posenc's attention passes
    read."""

    def __init__(self, unsqueezed: bool) -> None:
        super().__init__(name="trace_additive_mask" + ("_unsqueezed" if unsqueezed else ""), remove_nodes=False)
        self.unsqueezed = unsqueezed

    def pattern(self, op, scores, allowed, low, zeros, axes):
        mask = op.Where(op.Not(allowed), low, zeros)
        if self.unsqueezed:
            mask = op.Unsqueeze(mask, axes)
        return op.Add(scores, mask)

    def check(self, context, scores, allowed, low, zeros, axes=None, **_):
        result = pattern.MatchResult()
        floor = mu.const_scalar(low)
        if mu.dtype(allowed) != ir.DataType.BOOL or floor is None or mu.dtype(scores) != ir.DataType.FLOAT:
            return result.fail("not a boolean mask turned additive in float32", allowed)
        if floor > float(np.finfo(np.float32).min) / 2:
            return result.fail("the masked value is not the dtype's minimum", low)
        zero = mu.const_array(zeros)
        producer = zeros.producer()
        if zero is None and producer is not None and producer.op_type == "Expand":
            zero = mu.const_array(producer.inputs[0])
        if zero is None or np.any(zero != 0):
            return result.fail("the visible value is not 0", zeros)
        if mu.rank(scores) != 4:
            return result.fail("the scores are not [B, H, S, K]", scores)
        return result

    def rewrite(self, op, scores, allowed, axes=None, **_):
        mask = op.Unsqueeze(allowed, axes) if self.unsqueezed else allowed
        return op.Where(op.Not(mask), op.Constant(value_float=float("-inf")), scores)


MASK_RULES = pattern.RewriteRuleSet([_AdditiveMask.rule(True), _AdditiveMask.rule(False)])


# --------------------------------------------------------------------------------------------------
# The pass
# --------------------------------------------------------------------------------------------------


def _reference_tables(request: RewriteRequest, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """posenc's float64 cos, sin ``[N, r/2]`` of the layer's scheme at the probe positions."""
    exact = request.plan.exact_scheme(_float64_mode(request.plan.scheme), None, torch.float64)
    cos, sin = scheme_cos_sin(exact, torch.from_numpy(positions))
    return cos.reshape(-1, cos.shape[-1]).numpy(), sin.reshape(-1, sin.shape[-1]).numpy()


def _float64_mode(scheme: str) -> TableMode:
    from posenc.schemes import get_spec

    return TableMode.DYNAMIC if TableMode.DYNAMIC in get_spec(scheme).table_modes else TableMode.PRECOMPUTED


def _rows(array: np.ndarray, axes: Axes) -> np.ndarray:
    moved = np.moveaxis(array, (axes.batch, axes.seq), (0, 1))
    return moved.reshape(moved.shape[0] * moved.shape[1], -1).astype(np.float64)


def _kept(detail: str) -> tuple[TracePart, ...]:
    return (TracePart(ROTARY_PART, "kept", detail),)


def _match(request: RewriteRequest, model: ir.Model, region: Region) -> tuple[list[tuple[ir.Value, Any]], str]:
    """Each frontier tensor with ``(source, layout, axes)``, or the reason one does not match."""
    seq = _probe_seq(region.frontier)
    feed = probe_feed(request, seq)
    names = [v.name or "" for v in region.frontier]
    values = run_graph(model, feed, names)
    cos, sin = _reference_tables(request, feed["position_ids"])
    matched = []
    for value in region.frontier:
        array = values[value.name or ""]
        axes = _axes(array, seq)
        if axes is None:
            return [], f"{value.name} {list(array.shape)} is not a per-token cos/sin tensor"
        found = match_layout(_rows(array, axes), cos, sin)
        if found is None:
            return [], (
                f"{value.name} {list(array.shape)} is not {request.plan.scheme!r}'s cos or sin in any layout at probe "
                f"positions below {int(feed['position_ids'].max()) + 1}"
            )
        matched.append((value, (found[0], found[1], axes)))
    return matched, ""


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


def _replace_angles(request: RewriteRequest, model: ir.Model, matched: list[tuple[ir.Value, Any]]) -> list[TracePart]:
    """Splice posenc's cos/sin in, give every matched frontier tensor its values, rewrite the rotations."""
    graph = model.graph
    exact = request.exact
    if exact is None:
        raise ExportError("no posenc scheme to replace the traced angles with.")
    cos3, sin3 = splice_scheme(graph, _guarded_ids(graph), exact)
    build = _Builder(graph, "posenc_angles/")
    half = int(scheme_cos_sin(exact, torch.zeros(1, 1, dtype=torch.int64))[0].shape[-1])
    replacements: dict[int, Replacement] = {}
    layouts = set()
    for value, (source, layout, axes) in matched:
        base = cos3 if source == "cos" else sin3
        new = _arranged(build, base, layout, half)
        extra = [i for i in range(axes.rank) if i not in (axes.batch, axes.seq, axes.rank - 1)]
        if extra:
            new = build.op("Unsqueeze", [new, build.ints(extra)])
        ir.convenience.replace_all_uses_with(value, new)
        replacements[id(new)] = Replacement(source, layout, base, axes)
        layouts.add(layout)
    fold.cleanup(model)
    rotations = rotation_rules(replacements).apply_to_model(model)
    fold.cleanup(model)
    traced = sum(1 for node in graph if node.op_type in ("Cos", "Sin") and not (node.name or "").startswith(
        "posenc_angles/"))  # fmt: skip
    angles = (
        f"{len(matched)} cos/sin tensors ({', '.join(sorted(layouts))} layout) now read posenc's {request.plan.scheme} "
        f"{exact.table_mode.value} tables (float64-exact), guarded; {traced} traced Cos/Sin left"
    )
    rotation = (
        f"{rotations} rotations rewritten to posenc's decomposed form (posenc optimize fuses it into RotaryEmbedding)"
        if rotations
        else "the model's rotation is not a form posenc rewrites; it stays decomposed as traced, on posenc's cos/sin"
    )
    return [TracePart(ROTARY_PART, "replaced", angles), TracePart(ROTATION_PART, "replaced" if rotations else "kept",
                                                                  rotation)]  # fmt: skip


def replace_positions(request: RewriteRequest) -> tuple[Any, tuple[TracePart, ...]]:
    """The rewrite of a traced export (see the module docstring): ``(model proto, parts)``."""
    model = ir.serde.deserialize_model(request.model)
    graph = model.graph
    region = positional_region(graph, graph.inputs[[v.name for v in graph.inputs].index("position_ids")])
    others = _other_positional(graph, region)
    feed = probe_feed(request, _probe_seq(region.frontier))
    before = run_graph(model, feed)
    kept: list[TracePart] = []
    if others:
        detail = "; ".join(others) + ": computed as the model computes it (posenc has no table for it)"
        kept.append(TracePart("position-dependent values", "kept", detail))
    parts: list[TracePart] = []
    for node in position_tables(graph, region):
        table = node.inputs[0]
        shape = "[" + ", ".join(str(d) for d in table.shape.dims) + "]" if table and table.shape else "[?]"
        detail = (f"Gather of the model's table {table.name if table else '?'} {shape} by the guarded position ids: "
                  f"its own learned values, read as traced (posenc recomputes no learned table)")  # fmt: skip
        kept.append(TracePart(TABLE_PART, "kept", detail))
    if not region.cos_sin and not any(part.part == TABLE_PART for part in kept):
        absent = "the traced graph computes no cos/sin of the positions: the layer does not rotate q and k"
        parts.append(TracePart(ROTARY_PART, "absent", absent))
    elif not region.cos_sin:
        pass  # the positions enter through a table, not as angles
    elif request.exact is None:
        parts += _kept(request.plan.note or "posenc has no scheme for these angles")
    else:
        matched, why = _match(request, model, region)
        parts += _replace_angles(request, model, matched) if matched else _kept(why)
    masks = MASK_RULES.apply_to_model(model)
    fold.cleanup(model)
    if masks:
        mask = "the additive mask became posenc's boolean Where(-inf) (posenc optimize fuses it into Attention)"
        parts.append(TracePart(MASK_PART, "replaced", mask))
    elif request.plan.captured.mask.kind == "none":
        mask = "the model passes its attention no mask (every key visible, as its model runs it without padding)"
        parts.append(TracePart(MASK_PART, "absent", mask))
    else:
        mask = "the mask stays as traced (not the additive 0/min form posenc rewrites)"
        parts.append(TracePart(MASK_PART, "kept", mask))
    after = run_graph(model, feed)
    moved = max(_relative(after[k], before[k]) for k in before)
    if not moved <= VERIFY_TOLERANCE:
        why = f"posenc's rewrite moved the outputs by {moved:.2e} at probe positions, so the traced graph stays"
        return request.model, (*_kept(why), *kept)
    return ir.serde.serialize_model(model), (*parts, *kept)


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    scale = max(1.0, float(np.abs(b).max()) if b.size else 1.0)
    return float(np.abs(a.astype(np.float64) - b).max()) / scale if a.size else 0.0


__all__ = ["MASK_RULES", "Region", "positional_region", "replace_positions", "rotation_rules", "splice_scheme"]
