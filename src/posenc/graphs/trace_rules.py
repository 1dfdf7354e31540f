"""The rewrite rules of the traced path: the model's rotation and additive mask in posenc's fusable forms.

:func:`rotation_rules` rewrite the model's rotation (``rotate_half``, the interleaved ``stack(-x2, x1)``, the
``chunk`` form) by frontier tensors that now hold posenc's cos/sin into posenc's decomposed rotation;
:data:`MASK_RULES` rewrite the additive mask ``scores + where(allowed, 0, min)`` into posenc's
``Where(Not(allowed), -inf, scores)``. A new rotation form is a rule here. Used by
:mod:`posenc.graphs.trace_rewrite`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from posenc.graphs import match_utils as mu
from posenc.graphs.trace_splice import Replacement


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


__all__ = ["MASK_RULES", "rotation_rules"]
