"""RoPE passes: decomposed rotation -> ONNX ``RotaryEmbedding`` (opset 23), then target layouts.

posenc's exported rotation (:func:`posenc.functional.apply_rope`) is, per rotated tensor ``x [B, H, S, r]``
with ``cos``/``sin`` ``[B, 1, S, r/2]``:

- ``half``: ``Concat(x1*c - x2*s, x2*c + x1*s)`` with ``x1, x2 = x[..., :r/2], x[..., r/2:]``;
- ``interleaved``: the same products on ``x[..., 0::2], x[..., 1::2]``, stacked on a new last axis and
  flattened (``Unsqueeze, Unsqueeze, Concat, Reshape``);
- partial rotary: the above on ``x[..., :r]`` and ``Concat(rotated, x[..., r:])``;
- fp16/bf16: ``x`` is cast to float32 before and the result cast back after.

``cos``/``sin`` are ``Unsqueeze(Gather(table, position_ids), 1)`` for precomputed tables (the fused op then
takes the 2-D table and the position ids) or any ``[B, S, r/2]`` tensor computed in the graph (dynamic
tables; the fused op takes them as 3-D caches without position ids). A rotation whose position ids (or computed
cos/sin) are shared by the batch stays decomposed, the reason recorded: ONNX Runtime's ``RotaryEmbedding`` takes them
only at the input's batch and length (:func:`posenc.graphs.op_limits.rotary_inputs`).

Each public function is a pass: it rewrites the IR model in place and returns how many matches it rewrote.

The target layouts of the fused op (:func:`~posenc.graphs.rope_layouts.rope_to_3d` for ONNX Runtime CPU,
:func:`~posenc.graphs.rope_layouts.rope_for_tensorrt`) are in :mod:`posenc.graphs.rope_layouts`; the contrib op's
conversion (:func:`convert_contrib_rope`, re-exported here) in :mod:`posenc.graphs.rope_contrib`.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from posenc.graphs import match_utils as mu
from posenc.graphs import op_limits as limits
from posenc.graphs.rope_contrib import convert_contrib_rope

ROTARY = "RotaryEmbedding"


_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def _cos_sin_ok(x: ir.Value, cos3: ir.Value, sin3: ir.Value, ax_c: ir.Value, ax_s: ir.Value, half: int) -> bool:
    return (
        mu.is_ints(ax_c, [1])
        and mu.is_ints(ax_s, [1])
        and mu.rank(cos3) == 3
        and mu.rank(sin3) == 3
        and mu.static_dim(cos3, -1) == half
        and mu.static_dim(sin3, -1) == half
        and mu.dtype(x) in _FLOATS
        and mu.dtype(cos3) == mu.dtype(x)
        and mu.dtype(sin3) == mu.dtype(x)
    )


def _table_lookup(cos3: ir.Value, sin3: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value] | None:
    """``(cos table, sin table, position ids)`` when cos/sin are rows of two constant 2-D tables gathered at the same
    ``[B, S]`` ids, else ``None`` (cos/sin computed in the graph)."""
    gather_c, gather_s = mu.producer_of(cos3, "Gather"), mu.producer_of(sin3, "Gather")
    if gather_c is None or gather_s is None:
        return None
    table_c, pos_c = mu.operand(gather_c, 0), mu.operand(gather_c, 1)
    table_s, pos_s = mu.operand(gather_s, 0), mu.operand(gather_s, 1)
    if (
        pos_c is pos_s
        and mu.int_attr(gather_c, "axis") == 0
        and mu.int_attr(gather_s, "axis") == 0
        and mu.const_array(table_c) is not None
        and mu.const_array(table_s) is not None
        and mu.rank(table_c) == 2
        and mu.rank(pos_c) == 2
    ):
        return table_c, table_s, pos_c
    return None


def _caches(op, cos3: ir.Value, sin3: ir.Value) -> list[ir.Value]:
    """Inputs 1.. of the fused op: 2-D tables + position ids when cos/sin are gathered, else 3-D caches."""
    lookup = _table_lookup(cos3, sin3)
    if lookup is None:
        return [cos3, sin3]
    table_c, table_s, pos = lookup
    if mu.dtype(pos) != ir.DataType.INT64:
        pos = op.Cast(pos, to=ir.DataType.INT64)
    return [table_c, table_s, pos]


def _refused(x: ir.Value, cos3: ir.Value, sin3: ir.Value, declined: list[str] | None) -> str | None:
    """Why ONNX Runtime's ``RotaryEmbedding`` would refuse the fused op's inputs (recorded in ``declined``)."""
    lookup = _table_lookup(cos3, sin3)
    reason = limits.rotary_inputs(x, cos3, lookup[2] if lookup is not None else None)
    if reason is not None and declined is not None and f"fuse_rope: {reason}" not in declined:
        declined.append(f"fuse_rope: {reason}")
    return reason


class _HalfRotation(pattern.RewriteRuleClassBase):
    """``Concat(x1*c - x2*s, x2*c + x1*s)`` on the two halves of ``x [B, H, S, r]`` -> RotaryEmbedding."""

    def __init__(self, declined: list[str] | None = None) -> None:
        super().__init__(name="rope_half", remove_nodes=False)
        self.declined = declined

    def pattern(self, op, x, s1, e1, a1, st1, s2, e2, a2, st2, cos3, sin3, ax_c, ax_s):
        x1 = op.Slice(x, s1, e1, a1, st1)
        x2 = op.Slice(x, s2, e2, a2, st2)
        c = op.Unsqueeze(cos3, ax_c)
        s = op.Unsqueeze(sin3, ax_s)
        return op.Concat(op.Sub(op.Mul(x1, c), op.Mul(x2, s)), op.Add(op.Mul(x2, c), op.Mul(x1, s)), axis=-1)

    def check(self, context, x, s1, e1, a1, st1, s2, e2, a2, st2, cos3, sin3, ax_c, ax_s, **_):
        result = pattern.MatchResult()
        width = _rotated_width(x)
        if width is None:
            return result.fail(_NOT_ROTATED, x)
        half = width // 2
        first = _last_axis_slice(a1, s1, e1, st1, begin=0, stride=1, reaches=half, exact=True)
        if not (first and _last_axis_slice(a2, s2, e2, st2, begin=half, stride=1, reaches=width)):
            return result.fail("slices are not the two halves of the last axis")
        if not _cos_sin_ok(x, cos3, sin3, ax_c, ax_s, half):
            return result.fail("cos/sin are not [B, 1, S, r/2] of the input's dtype", cos3)
        refused = _refused(x, cos3, sin3, self.declined)
        return result.fail(refused, cos3) if refused is not None else result

    def rewrite(self, op, x, cos3, sin3, **_):
        return op.RotaryEmbedding(x, *_caches(op, cos3, sin3), interleaved=0)


class _InterleavedRotation(pattern.RewriteRuleClassBase):
    """Pairs ``(x[..., 0::2], x[..., 1::2])`` rotated, stacked and flattened -> RotaryEmbedding(interleaved=1).

    With a ``refusal`` every match is left decomposed and the reason appended to ``declined``."""

    def __init__(self, refusal: str | None = None, declined: list[str] | None = None) -> None:
        super().__init__(name="rope_interleaved", remove_nodes=False)
        self.refusal, self.declined = refusal, declined

    def pattern(self, op, x, s1, e1, a1, st1, s2, e2, a2, st2, cos3, sin3, ax_c, ax_s, u1, u2, shape):
        x1 = op.Slice(x, s1, e1, a1, st1)
        x2 = op.Slice(x, s2, e2, a2, st2)
        c = op.Unsqueeze(cos3, ax_c)
        s = op.Unsqueeze(sin3, ax_s)
        first = op.Unsqueeze(op.Sub(op.Mul(x1, c), op.Mul(x2, s)), u1)
        second = op.Unsqueeze(op.Add(op.Mul(x2, c), op.Mul(x1, s)), u2)
        return op.Reshape(op.Concat(first, second, axis=-1), shape, _outputs=["out"])

    def check(self, context, x, s1, e1, a1, st1, s2, e2, a2, st2, cos3, sin3, ax_c, ax_s, u1, u2, out, **_):
        result = pattern.MatchResult()
        width = _rotated_width(x)
        if width is None:
            return result.fail(_NOT_ROTATED, x)
        even = _last_axis_slice(a1, s1, e1, st1, begin=0, stride=2, reaches=width - 1)
        if not (even and _last_axis_slice(a2, s2, e2, st2, begin=1, stride=2, reaches=width)):
            return result.fail("slices are not the even/odd features of the last axis")
        if not (mu.is_last_axis(u1, 5) and mu.is_last_axis(u2, 5)):
            return result.fail("rotated pairs are not stacked on a new last axis")
        if mu.rank(out) != 4 or not all(mu.same_dim(out, i, x, i) for i in range(4)):
            return result.fail("the flatten does not restore the input's shape", out)
        if not _cos_sin_ok(x, cos3, sin3, ax_c, ax_s, width // 2):
            return result.fail("cos/sin are not [B, 1, S, r/2] of the input's dtype", cos3)
        refused = _refused(x, cos3, sin3, self.declined)
        if refused is not None:
            return result.fail(refused, cos3)
        if self.refusal is not None:
            if self.declined is not None and self.refusal not in self.declined:
                self.declined.append(self.refusal)
            return result.fail(self.refusal, x)
        return result

    def rewrite(self, op, x, cos3, sin3, **_):
        return op.RotaryEmbedding(x, *_caches(op, cos3, sin3), interleaved=1)


_NOT_ROTATED = "rotated input is not [B, H, S, r] with a known even r"


def _rotated_width(x: ir.Value) -> int | None:
    """The rotated width ``r`` of a ``[B, H, S, r]`` input with a known even ``r``; ``None`` otherwise."""
    width = mu.static_dim(x, -1)
    return width if mu.rank(x) == 4 and width is not None and width % 2 == 0 else None


def _last_axis_slice(
    axes: ir.Value,
    start: ir.Value,
    end: ir.Value,
    step: ir.Value,
    *,
    begin: int,
    stride: int,
    reaches: int,
    exact: bool = False,
) -> bool:
    """A ``Slice`` of a 4-D input's last axis from ``begin`` with step ``stride`` whose end is ``reaches`` (``exact``)
    or at or past it (an end past the axis is clamped to it)."""
    if not (mu.is_last_axis(axes, 4) and mu.is_ints(step, [stride]) and mu.is_ints(start, [begin])):
        return False
    return mu.is_ints(end, [reaches]) if exact else (mu.const_ints(end) or [0])[0] >= reaches


def _copy_rotary(op, rope: ir.Value, x: ir.Value, **overrides: int):
    """A RotaryEmbedding like the one producing ``rope`` but on input ``x`` and with attribute overrides."""
    node = mu.producer(rope)
    attributes = {name: attr.value for name, attr in node.attributes.items()}
    attributes.update(overrides)
    return op.RotaryEmbedding(x, *node.inputs[1:], **attributes)


def _partial_ok(x: ir.Value, rope: ir.Value, r1, a1, st1, r2, e2, a2, st2, s0) -> bool:
    node = mu.producer(rope)
    rotary = mu.const_ints(r1)
    tail_end = mu.const_ints(e2)
    return (
        mu.int_attr(node, "rotary_embedding_dim") == 0
        and mu.int_attr(node, "num_heads") == 0
        and mu.rank(x) == 4
        and rotary is not None
        and mu.is_ints(s0, [0])
        and mu.const_ints(r2) == rotary
        and mu.is_last_axis(a1, 4)
        and mu.is_last_axis(a2, 4)
        and mu.is_ints(st1, [1])
        and mu.is_ints(st2, [1])
        and mu.static_dim(x, -1) is not None
        and 0 < rotary[0] < mu.static_dim(x, -1)  # type: ignore[operator]  # None compares False via the rank check above
        and tail_end is not None
        and tail_end[0] >= mu.static_dim(x, -1)  # type: ignore[operator]  # the tail runs to the last feature
    )


class _PartialRotation(pattern.RewriteRuleClassBase):
    """``Concat(RotaryEmbedding(x[..., :r]), x[..., r:])`` -> ``RotaryEmbedding(x, rotary_embedding_dim=r)``."""

    def __init__(self) -> None:
        super().__init__(name="rope_partial")

    def pattern(self, op, x, s0, r1, a1, st1, r2, e2, a2, st2):
        head = op.Slice(x, s0, r1, a1, st1)
        rope = op.RotaryEmbedding(head, _allow_other_inputs=True, _outputs=["rope"])
        return op.Concat(rope, op.Slice(x, r2, e2, a2, st2), axis=-1)

    def check(self, context, x, rope, s0, r1, a1, st1, r2, e2, a2, st2, **_):
        if not _partial_ok(x, rope, r1, a1, st1, r2, e2, a2, st2, s0):
            return pattern.MatchResult().fail("not a rotation of the leading r features plus the untouched rest")
        return True

    def rewrite(self, op, x, rope, r1, **_):
        return _copy_rotary(op, rope, x, rotary_embedding_dim=mu.const_ints(r1)[0])


class _PartialRotationInFloat(pattern.RewriteRuleClassBase):
    """As :class:`_PartialRotation` when the rotated head is computed in float32 between two Casts."""

    def __init__(self) -> None:
        super().__init__(name="rope_partial_cast")

    def pattern(self, op, x, s0, r1, a1, st1, r2, e2, a2, st2):
        head = op.Cast(op.Slice(x, s0, r1, a1, st1), _outputs=["head"])
        rope = op.RotaryEmbedding(head, _allow_other_inputs=True, _outputs=["rope"])
        return op.Concat(op.Cast(rope, _outputs=["back"]), op.Slice(x, r2, e2, a2, st2), axis=-1)

    def check(self, context, x, head, rope, back, s0, r1, a1, st1, r2, e2, a2, st2, **_):
        if mu.dtype(back) != mu.dtype(x) or not _partial_ok(x, rope, r1, a1, st1, r2, e2, a2, st2, s0):
            return pattern.MatchResult().fail("not a float32 rotation of the leading r features plus the rest")
        return True

    def rewrite(self, op, x, head, rope, r1, **_):
        wide = op.Cast(x, to=mu.dtype(head))
        rotated = _copy_rotary(op, rope, wide, rotary_embedding_dim=mu.const_ints(r1)[0])
        return op.Cast(rotated, to=mu.dtype(x))


_PARTIAL_RULES = pattern.RewriteRuleSet([_PartialRotation.rule(), _PartialRotationInFloat.rule()])


def fuse_rope(model: ir.Model, *, interleaved_refusal: str | None = None, declined: list[str] | None = None) -> int:
    """Replace decomposed half and interleaved rotations by 4-D ``RotaryEmbedding`` nodes (opset 23).

    Args:
        model: rewritten in place.
        interleaved_refusal: if given, interleaved rotations stay decomposed for this reason (a runtime that cannot
            build the fused form), appended once to ``declined``.
        declined: receives the reasons for rotations left decomposed (the refusal above, and inputs ONNX Runtime's
            ``RotaryEmbedding`` would refuse: :func:`posenc.graphs.op_limits.rotary_inputs`).

    Returns:
        The number of rotations fused (each rotated tensor counts once).
    """
    rules = [_HalfRotation.rule(declined), _InterleavedRotation.rule(interleaved_refusal, declined)]
    return pattern.RewriteRuleSet(rules, commute=True).apply_to_model(model)


def fuse_partial_rope(model: ir.Model) -> int:
    """Merge ``Concat(RotaryEmbedding(x[..., :r]), x[..., r:])`` into one op with ``rotary_embedding_dim=r``."""
    return _PARTIAL_RULES.apply_to_model(model)


__all__ = ["convert_contrib_rope", "fuse_partial_rope", "fuse_rope"]
