"""The ONNX form of the plugin nodes and their ONNX Runtime twin (model-local functions).

A plugin node is ``<op_type = plugin name, domain "posenc">`` with the plugin's inputs, outputs
``(q_out, k_out)``, the plugin fields as attributes (see :meth:`RopeKernelSpec.plugin_attributes`) and the
parser's own attributes ``plugin_namespace = "posenc"`` and ``aot = 1`` (strict ahead-of-time implementation).

The twin is an ONNX ``FunctionProto`` per plugin (domain ``posenc``, same name) whose body computes what the
kernel computes with standard ops, driven by the node's attributes (``ref_attr_name``), so ONNX Runtime inlines
it and runs graphs that contain plugin nodes on CPU. The twin computes angles in float64 and rotates in float32
with a gather-based formula, independent of the kernel's code.

How TensorRT treats a node that also has a local function (onnx-tensorrt ``ModelImporter.cpp::parseNode``):
TensorRT 9.0-10.6 import the local function (inline the body; the plugin is never used); TensorRT >= 10.7 use
the registered plugin first and fall back to the function when no plugin of that name is registered; TensorRT
>= 10.15 with ``plugin_namespace`` set check the plugin registry before anything else. So with TensorRT >= 10.7 a
graph with the functions uses the plugin when ``register_rope_plugins()`` ran and the (slower) decomposed body
otherwise; for TensorRT < 10.7 emit the graph without functions (``with_functions=False`` in the graph pass).
"""

from __future__ import annotations

from typing import Any

import onnx
import onnx.parser

from posenc import rope_types
from posenc.errors import ExportError
from posenc.plugins.rope.spec import PLUGIN_NAMESPACE, AngleSource, QKFormat, RopeKernelSpec

__all__ = ["MIN_OPSET", "make_plugin_node", "rope_function", "rope_functions_for"]

MIN_OPSET = 15
"""Smallest ai.onnx opset the twin supports (it uses CastLike and Shape with start/end)."""

_SLICE = "rotary_offset: int = 0"
_SECTIONS = (
    "mrope_axes: int = 0, mrope_section_t: int = 0, mrope_section_h: int = 0, mrope_section_w: int = 0, "
    "mrope_interleaved: int = 0"
)
_ATTRIBUTES = {
    AngleSource.TABLE: f"interleaved, rotary_dim, qk_format, position_mode, {_SLICE}, {_SECTIONS}",
    AngleSource.CACHE: f"interleaved, rotary_dim, qk_format, {_SLICE}",
    AngleSource.FREQ: f"interleaved, rotary_dim, qk_format, position_mode, attention_factor, longrope_original, "
    f"{_SLICE}, {_SECTIONS}",
    AngleSource.NTK: f"interleaved, rotary_dim, qk_format, position_mode, rope_theta, factor, "
    f"max_position_embeddings, {_SLICE}",
}
"""Each plugin's attributes; the slice and section attributes default to 0 (IR >= 9 function defaults), so nodes
of one-axis, whole-head rotations need not carry them."""


def make_plugin_node(
    spec: RopeKernelSpec,
    inputs: list[str],
    outputs: list[str],
    *,
    qk_format: QKFormat | str = QKFormat.BHSD,
    name: str | None = None,
    aot: bool = True,
) -> onnx.NodeProto:
    """The plugin node in the form TensorRT's ONNX parser maps to the registered plugin.

    Args:
        spec: kernel configuration (decides the plugin and its attributes).
        inputs: tensor names in the plugin's input order (``spec.angles.inputs``).
        outputs: ``[q_out, k_out]``.
        qk_format: axis order of q and k.
        name: node name.
        aot: add ``aot = 1`` (TensorRT picks the ahead-of-time implementation; no Python at run time).
    """
    if len(inputs) != len(spec.angles.inputs) or len(outputs) != 2:
        raise ExportError(
            f"{spec.plugin_name} takes inputs {list(spec.angles.inputs)} and outputs [q_out, k_out]; "
            f"got {inputs} -> {outputs}."
        )
    attrs: dict[str, Any] = dict(spec.plugin_attributes(qk_format))
    attrs["plugin_namespace"] = PLUGIN_NAMESPACE
    if aot:
        attrs["aot"] = 1
    return onnx.helper.make_node(spec.plugin_name, inputs, outputs, name=name, domain=PLUGIN_NAMESPACE, **attrs)


# --------------------------------------------------------------------------------------------------
# function bodies (ONNX text format)
# --------------------------------------------------------------------------------------------------

_SHAPES = """
    zero = Constant <value_int: int = 0> ()
    one = Constant <value_int: int = 1> ()
    two = Constant <value_int: int = 2> ()
    ax0 = Constant <value_ints: ints = [0]> ()
    ax1 = Constant <value_ints: ints = [1]> ()
    ax2 = Constant <value_ints: ints = [2]> ()
    minus1 = Constant <value_ints: ints = [-1]> ()
    fmt = Constant <value_int: int = @qk_format> ()
    shape_q = Shape (q)
    seq_axis = Sub (two, fmt)
    seq = Gather <axis = 0> (shape_q, seq_axis)
    batch = Gather <axis = 0> (shape_q, zero)
    seq1 = Unsqueeze (seq, ax0)
    batch1 = Unsqueeze (batch, ax0)
    bs = Concat <axis = 0> (batch1, seq1)
"""

_POSITIONS = """
    pos64 = Cast <to = 7> (positions)
    pos_rows = Shape <start = 0, end = 1> (pos64)
    pos_rows_shape = Concat <axis = 0> (pos_rows, minus1)
    pos2 = Reshape (pos64, pos_rows_shape)
    mode = Constant <value_int: int = @position_mode> ()
    steps = Range (zero, seq, one)
    offsets = Mul (steps, mode)
    pos3 = Add (pos2, offsets)
    pos = Expand (pos3, bs)
"""


def _row_length(opset: int) -> str:
    reduce = "ReduceMax <keepdims = 0> (pos, ax1)" if opset >= 18 else "ReduceMax <axes = [1], keepdims = 0> (pos)"
    return f"""
    max_pos = {reduce}
    length = Add (max_pos, one)
"""


def _table_rows(out: str) -> str:
    """The rows of ``cos_table`` / ``sin_table`` at ``pos``, in float32, as ``cos_{out}`` / ``sin_{out}``."""
    return f"""
    cos_rows = Gather <axis = 0> (cos_table, pos)
    sin_rows = Gather <axis = 0> (sin_table, pos)
    cos_{out} = Cast <to = 1> (cos_rows)
    sin_{out} = Cast <to = 1> (sin_rows)
"""


_TABLE = _table_rows("f")

_CACHE = """
    bs_1 = Concat <axis = 0> (batch1, seq1, ax1)
    cos_b = Expand (cos, bs_1)
    sin_b = Expand (sin, bs_1)
    cos_f = Cast <to = 1> (cos_b)
    sin_f = Cast <to = 1> (sin_b)
"""

# The FREQ plugins' ``turns [..., 2, r/2]`` summed over the pair axis (float64) into rows of turns ``sets [N, r/2]``.
_TURN_SETS = """
    turns_d = Cast <to = 11> (turns)
    axm2 = Constant <value_ints: ints = [-2]> ()
    turns_sum = ReduceSum <keepdims = 0> (turns_d, axm2)
    width = Shape <start = -1> (turns_sum)
    sets_shape = Concat <axis = 0> (minus1, width)
    sets = Reshape (turns_sum, sets_shape)
"""

_FREQ = (
    _TURN_SETS
    + """    original = Constant <value_int: int = @longrope_original> ()
    long_row = Greater (length, original)
    switching = Greater (original, zero)
    use_long = And (long_row, switching)
    set_index = Cast <to = 7> (use_long)
    row_turns = Gather <axis = 0> (sets, set_index)
    factor_f = Constant <value_float: float = @attention_factor> ()
"""
)


class _Symbol:
    """A float64 value of an ONNX function body under construction: arithmetic on it appends ONNX nodes.

    It has the operators and ``clamp(min=...)`` that :func:`posenc.rope_types.dynamic_ntk_base` uses, so the twin
    writes that formula's nodes by evaluating the one Python definition instead of restating it.
    """

    def __init__(self, lines: list[str], name: str) -> None:
        self.lines = lines
        self.name = name

    def _node(self, op: str, *operands: _Symbol | float) -> _Symbol:
        names = [self._lift(x).name for x in operands]
        out = _Symbol(self.lines, f"ntk_{len(self.lines)}")
        self.lines.append(f"    {out.name} = {op} ({', '.join(names)})")
        return out

    def _lift(self, value: _Symbol | float) -> _Symbol:
        if isinstance(value, _Symbol):
            return value
        const = _Symbol(self.lines, f"ntk_{len(self.lines)}")
        self.lines.append(f"    {const.name} = Constant <value = double[1] {{{float(value)!r}}}> ()")
        return const

    def __add__(self, other: _Symbol | float) -> _Symbol:
        return self._node("Add", self, other)

    def __sub__(self, other: _Symbol | float) -> _Symbol:
        return self._node("Sub", self, other)

    def __rsub__(self, other: float) -> _Symbol:
        return self._node("Sub", other, self)

    def __mul__(self, other: _Symbol | float) -> _Symbol:
        return self._node("Mul", self, other)

    def __rmul__(self, other: float) -> _Symbol:
        return self._node("Mul", other, self)

    def __truediv__(self, other: _Symbol | float) -> _Symbol:
        return self._node("Div", self, other)

    def __rtruediv__(self, other: float) -> _Symbol:
        return self._node("Div", other, self)

    def __pow__(self, other: _Symbol | float) -> _Symbol:
        return self._node("Pow", self, other)

    def clamp(self, min: _Symbol | float) -> _Symbol:
        return self._node("Max", self, min)


def _ntk_base_lines() -> str:
    """ONNX text for ``base = dynamic_ntk_base(θ, factor, length, M, r)`` over the node's attributes, all float64."""
    lines: list[str] = []
    theta, factor, length, trained, rot = (
        _Symbol(lines, name) for name in ("theta_d", "factor_d", "length_d", "trained_d", "rot_d")
    )
    base = rope_types.dynamic_ntk_base(theta, factor, length, trained, rot)
    return "\n".join(lines) + f"\n    base = Identity ({base.name})\n"


_NTK = (
    """
    rot_n = Constant <value_int: int = @rotary_dim> ()
    trained = Constant <value_int: int = @max_position_embeddings> ()
    length_d = Cast <to = 11> (length)
    trained_d = Cast <to = 11> (trained)
    factor_c = Constant <value_float: float = @factor> ()
    factor_d = Cast <to = 11> (factor_c)
    theta_c = Constant <value_float: float = @rope_theta> ()
    theta_d = Cast <to = 11> (theta_c)
    rot_d = Cast <to = 11> (rot_n)
"""
    + _ntk_base_lines()
    + """    one_d = Constant <value = double[1] {1.0}> ()
    even = Range (zero, rot_n, two)
    even_d = Cast <to = 11> (even)
    exponents = Div (even_d, rot_d)
    base_col = Unsqueeze (base, ax1)
    base_pow = Pow (base_col, exponents)
    inv_freq = Div (one_d, base_pow)
    two_pi_d = Constant <value = double[1] {6.283185307179586}> ()
    row_turns = Div (inv_freq, two_pi_d)
    factor_f = Constant <value_float: float = 1.0> ()
"""
)


def _angles(turns: str, out: str) -> str:
    """``cos_{out}`` / ``sin_{out}`` (float32, times ``factor_f``) of ``pos_col · turns``: the angle in turns
    (float64) keeps its fraction only, so float32 radians stay exact at large positions."""
    return f"""
    angle_turns = Mul (pos_col, {turns})
    whole = Floor (angle_turns)
    frac_d = Sub (angle_turns, whole)
    frac_f = Cast <to = 1> (frac_d)
    two_pi = Constant <value_float: float = 6.2831853071795862> ()
    radians = Mul (frac_f, two_pi)
    cos_raw = Cos (radians)
    sin_raw = Sin (radians)
    cos_{out} = Mul (cos_raw, factor_f)
    sin_{out} = Mul (sin_raw, factor_f)
"""


_ANGLES_FROM_TURNS = """
    pos_d = Cast <to = 11> (pos)
    pos_col = Unsqueeze (pos_d, ax2)
    turns_row = Unsqueeze (row_turns, ax1)
""" + _angles("turns_row", "f")

# Gather-based rotation, the same for both layouts: y = x * cos[Q] + x[P] * sin[Q] * sign, where for half
# Q = j mod r/2, P = (j + r/2) mod r, sign = -1 for j < r/2; for interleaved Q = j // 2, P = j xor 1,
# sign = -1 for even j. The tail x[r:] is concatenated unchanged.
_ROTATION_INDICES = """
    rot = Constant <value_int: int = @rotary_dim> ()
    rot1 = Unsqueeze (rot, ax0)
    big1 = Constant <value_ints: ints = [9223372036854775807]> ()
    inter = Constant <value_int: int = @interleaved> ()
    not_inter = Sub (one, inter)
    j = Range (zero, rot, one)
    halfw = Div (rot, two)
    j_mod2 = Mod (j, two)
    j_div2 = Div (j, two)
    j_modh = Mod (j, halfw)
    q_inter = Mul (inter, j_div2)
    q_half = Mul (not_inter, j_modh)
    pair_index = Add (q_inter, q_half)
    j_plus1 = Add (j, one)
    twice_mod2 = Mul (two, j_mod2)
    p_inter_raw = Sub (j_plus1, twice_mod2)
    j_plus_h = Add (j, halfw)
    p_half_raw = Mod (j_plus_h, rot)
    p_inter = Mul (inter, p_inter_raw)
    p_half = Mul (not_inter, p_half_raw)
    partner = Add (p_inter, p_half)
    upper_b = GreaterOrEqual (j, halfw)
    upper = Cast <to = 7> (upper_b)
    twice_upper = Mul (two, upper)
    sign_half_raw = Sub (twice_upper, one)
    sign_inter_raw = Sub (twice_mod2, one)
    sign_half = Mul (not_inter, sign_half_raw)
    sign_inter = Mul (inter, sign_inter_raw)
    sign_i = Add (sign_half, sign_inter)
    sign = Cast <to = 1> (sign_i)
    cos_full = Gather <axis = -1> (cos_f, pair_index)
    sin_gathered = Gather <axis = -1> (sin_f, pair_index)
    sin_full = Mul (sin_gathered, sign)
    head_axis = Add (one, fmt)
    head_axis1 = Unsqueeze (head_axis, ax0)
    cos_u = Unsqueeze (cos_full, head_axis1)
    sin_u = Unsqueeze (sin_full, head_axis1)
"""


def _rotate(x: str, out: str, offset: str) -> str:
    """Rotate features ``[offset, offset + r)`` of ``x`` (``offset``: a 1-D int64 value), keeping the others."""
    return f"""
    {x}_f = Cast <to = 1> ({x})
    {x}_end = Add ({offset}, rot1)
    {x}_lead = Slice ({x}_f, ax0_zero, {offset}, minus1)
    {x}_rot = Slice ({x}_f, {offset}, {x}_end, minus1)
    {x}_tail = Slice ({x}_f, {x}_end, big1, minus1)
    {x}_partner = Gather <axis = -1> ({x}_rot, partner)
    {x}_a = Mul ({x}_rot, cos_u)
    {x}_b = Mul ({x}_partner, sin_u)
    {x}_y = Add ({x}_a, {x}_b)
    {x}_cat = Concat <axis = -1> ({x}_lead, {x}_y, {x}_tail)
    {out} = CastLike ({x}_cat, {x})
"""


_OFFSET = """
    q_offset_n = Constant <value_int: int = @rotary_offset> ()
    q_offset = Unsqueeze (q_offset_n, ax0)
"""

# Multi-axis ids [A, B|1, S] (ids only): per-axis cos/sin [A, B, S, r/2], then each slot keeps its axis (a one-hot
# over A, from the section attributes: chunks, or Qwen3-VL's t,h,w interleaving) and the axes are summed away.
_MULTI_POSITIONS = """
    pos64 = Cast <to = 7> (positions)
    axes_n = Constant <value_int: int = @mrope_axes> ()
    axes1 = Unsqueeze (axes_n, ax0)
    abs_ = Concat <axis = 0> (axes1, batch1, seq1)
    pos = Expand (pos64, abs_)
"""

_MULTI_FREQ = (
    _TURN_SETS
    + """    row_turns = Gather <axis = 0> (sets, zero)
    pos_d = Cast <to = 11> (pos)
    pos_col = Unsqueeze (pos_d, minus1)
    factor_f = Constant <value_float: float = @attention_factor> ()
"""
    + _angles("row_turns", "axes")
)

_MULTI_TABLE = _table_rows("axes")

_SELECT_AXES = """
    three = Constant <value_int: int = 3> ()
    rot_s = Constant <value_int: int = @rotary_dim> ()
    half_s = Div (rot_s, two)
    slots = Range (zero, half_s, one)
    sec_t = Constant <value_int: int = @mrope_section_t> ()
    sec_h = Constant <value_int: int = @mrope_section_h> ()
    sec_w = Constant <value_int: int = @mrope_section_w> ()
    inter_s = Constant <value_int: int = @mrope_interleaved> ()
    sec_th = Add (sec_t, sec_h)
    ge_t = GreaterOrEqual (slots, sec_t)
    ge_th = GreaterOrEqual (slots, sec_th)
    past_t = Cast <to = 7> (ge_t)
    past_th = Cast <to = 7> (ge_th)
    chunked = Add (past_t, past_th)
    slot_mod = Mod (slots, three)
    h3 = Mul (sec_h, three)
    w3 = Mul (sec_w, three)
    mod_1 = Equal (slot_mod, one)
    mod_2 = Equal (slot_mod, two)
    in_h = Less (slots, h3)
    in_w = Less (slots, w3)
    is_h = And (mod_1, in_h)
    is_w = And (mod_2, in_w)
    h_axis = Cast <to = 7> (is_h)
    w_axis_b = Cast <to = 7> (is_w)
    w_axis = Mul (w_axis_b, two)
    interleaved_axes = Add (h_axis, w_axis)
    not_inter_s = Sub (one, inter_s)
    pick_i = Mul (interleaved_axes, inter_s)
    pick_c = Mul (chunked, not_inter_s)
    slot_axis = Add (pick_i, pick_c)
    axis_ids = Range (zero, axes_n, one)
    axis_col = Unsqueeze (axis_ids, ax1)
    slot_row = Unsqueeze (slot_axis, ax0)
    onehot_b = Equal (axis_col, slot_row)
    onehot = Cast <to = 1> (onehot_b)
    ax12 = Constant <value_ints: ints = [1, 2]> ()
    onehot4 = Unsqueeze (onehot, ax12)
    cos_pick = Mul (cos_axes, onehot4)
    sin_pick = Mul (sin_axes, onehot4)
    cos_f = ReduceSum <keepdims = 0> (cos_pick, ax0)
    sin_f = ReduceSum <keepdims = 0> (sin_pick, ax0)
"""


def rope_function(source: AngleSource | str, opset: int, *, multi_axis: bool = False) -> onnx.FunctionProto:
    """The twin of one plugin as a model-local function for a model importing ai.onnx ``opset`` (>= 15).

    ``multi_axis``: the twin of nodes with multi-axis position ids ``[A, B|1, S]`` (``mrope_axes`` > 0: M-RoPE,
    axial; TABLE or FREQ). q's rotated features start at the ``rotary_offset`` attribute (MLA) in every twin.

    Raises:
        ExportError: ``opset`` < 15, or ``multi_axis`` for a plugin without position ids or with in-graph lengths.
    """
    source = AngleSource(source)
    if opset < MIN_OPSET:
        raise ExportError(
            f"the posenc RoPE plugin's ONNX Runtime twin needs ai.onnx opset >= {MIN_OPSET}, the model imports "
            f"{opset}; export with a newer opset or emit the graph without functions (with_functions=False)."
        )
    if multi_axis and source not in (AngleSource.TABLE, AngleSource.FREQ):
        raise ExportError(f"{source.plugin_name} has no multi-axis form; M-RoPE and axial RoPE use TABLE or FREQ.")
    body = _SHAPES + "    ax0_zero = Constant <value_ints: ints = [0]> ()\n"
    if multi_axis:
        body += _MULTI_POSITIONS + (_MULTI_TABLE if source is AngleSource.TABLE else _MULTI_FREQ) + _SELECT_AXES
    elif source is AngleSource.TABLE:
        body += _POSITIONS + _TABLE
    elif source is AngleSource.CACHE:
        body += _CACHE
    else:
        freq = _FREQ if source is AngleSource.FREQ else _NTK
        body += _POSITIONS + _row_length(opset) + freq + _ANGLES_FROM_TURNS
    body += _ROTATION_INDICES + _OFFSET + _rotate("q", "q_out", "q_offset") + _rotate("k", "k_out", "ax0_zero")
    text = (
        f'<domain: "{PLUGIN_NAMESPACE}", opset_import: ["" : {opset}]>\n'
        f"{source.plugin_name} <{_ATTRIBUTES[source]}> ({', '.join(source.inputs)}) => (q_out, k_out)\n"
        f"{{{body}}}\n"
    )
    return onnx.parser.parse_function(text)


def rope_functions_for(model: onnx.ModelProto) -> list[onnx.FunctionProto]:
    """Twin functions for the plugin ops ``model`` uses that it does not define yet (the multi-axis twin where the
    op's nodes carry ``mrope_axes``; one op type cannot mix one-axis and multi-axis nodes in a model).

    Raises:
        ExportError: nodes of one plugin op disagree on multi-axis positions.
    """
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    defined = {(f.domain, f.name) for f in model.functions}
    kinds: dict[str, set[bool]] = {}
    for node in model.graph.node:
        if node.domain == PLUGIN_NAMESPACE:
            axes = next((a.i for a in node.attribute if a.name == "mrope_axes"), 0)
            kinds.setdefault(node.op_type, set()).add(axes > 0)
    mixed = sorted(op for op, multi in kinds.items() if len(multi) > 1)
    if mixed:
        raise ExportError(f"{mixed} nodes mix one-axis and multi-axis positions; one twin function serves an op type.")
    return [
        rope_function(source, opset, multi_axis=kinds[source.plugin_name] == {True})
        for source in AngleSource
        if source.plugin_name in kinds and (PLUGIN_NAMESPACE, source.plugin_name) not in defined
    ]
