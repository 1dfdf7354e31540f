"""Attention passes: the exported softmax attention -> ONNX ``Attention`` (opset 23), and TensorRT's mask rule.

posenc's :class:`~posenc.AttentionBlock` exports attention as

``MatMul(Softmax(Where(Not(allowed), -inf, Cast_f32(MatMul(q, Transpose(k)) * scale) + bias)), v)``

where ``* scale`` is absent for schemes that do not scale scores (T5), the ``Cast`` pair appears for
fp16/bf16 graphs (softmax in float32), ``bias`` for score-placement schemes (ALiBi, T5, the relative
schemes), ``allowed`` for causal or sliding-window blocks (a boolean mask computed from the position ids),
and ``k``/``v`` may be grouped-query heads repeated with ``Unsqueeze/Expand/Reshape``. A block with
``logit_softcap`` has ``Mul(Tanh(Div(scores, cap)), cap)`` after the ``Cast`` (and after the bias).
The fused op receives the un-repeated ``k``/``v`` (it handles grouped heads itself), the bias as additive
``attn_mask`` with the causal mask folded in as ``-inf``, the scale (``attn_scale`` or the scheme's) as
``scale``, and ``softmax_precision=FLOAT`` when the graph computed the softmax in float32 (ONNX Runtime
target only). A soft-cap becomes the ``softcap`` attribute only when ``softcap=True`` (ONNX Runtime; TensorRT's
parser rejects it) and no score bias is present (``Attention`` caps before adding its mask, posenc after the
bias), otherwise the attention stays decomposed. So does an attention whose mask ONNX Runtime's ``Attention`` would
refuse (:func:`posenc.graphs.op_limits.attention_mask`: a mask broadcast along the queries or keys, e.g. a padding
mask ``[B, 1, 1, T]``), the reason recorded.

Attention sinks (a learned logit per head in every softmax: gpt-oss) export as one more softmax column,
``Slice(Softmax(Concat(scores, sink_column)), 0, Sk) @ v``. ``Attention`` has no sink input, so the sink becomes
one more key: a zero key and a zero value appended to ``k`` and ``v`` (:func:`zero_slot`), and the sink logit as
that key's column of an additive ``attn_mask`` ``[B, H, Sq, Sk + 1]``. The zero key scores 0 (softcapped: still
0), the mask adds ``sink_h``, and its zero value adds nothing to the output: exactly the sink's softmax. A sink
attention the rules cannot take keeps its decomposed form, and the reason is recorded.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from posenc.graphs import match_utils as mu
from posenc.graphs import op_limits as limits

_NEG_INF = float("-inf")

_DECLINED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("attention_declined", default=None)
"""Where the running :func:`fuse_attention` collects why it left an attention decomposed (None: not collecting)."""


def _decline(reason: str) -> None:
    collected = _DECLINED.get()
    if collected is not None and reason not in collected:
        collected.append(reason)


@contextlib.contextmanager
def _collecting(declined: list[str] | None) -> Iterator[None]:
    token = _DECLINED.set(declined)
    try:
        yield
    finally:
        _DECLINED.reset(token)


def _unrepeated(value: ir.Value) -> ir.Value:
    """``k`` when ``value`` is ``repeat_kv(k)`` (``Reshape(Expand(Unsqueeze(k, [2])))``), else ``value``."""
    reshape = mu.producer_of(value, "Reshape")
    expand = mu.producer_of(reshape.inputs[0] if reshape else None, "Expand")
    unsqueeze = mu.producer_of(expand.inputs[0] if expand else None, "Unsqueeze")
    if expand is None or unsqueeze is None or not mu.is_ints(unsqueeze.inputs[1], [2]):
        return value
    source, expanded = unsqueeze.inputs[0], expand.outputs[0]
    if source is None or mu.rank(source) != 4 or mu.rank(expanded) != 5:
        return value
    kv_heads, groups, heads = mu.static_dim(source, 1), mu.static_dim(expanded, 2), mu.static_dim(value, 1)
    if kv_heads is None or groups is None or heads is None:
        return value
    if kv_heads * groups != heads or mu.static_dim(expanded, 1) != kv_heads:
        return value
    if not all(mu.same_dim(source, i, value, i) for i in (0, 2, 3)):
        return value
    return source


class _SoftmaxAttention(pattern.RewriteRuleClassBase):
    """One variant of the exported attention (with or without float32 softmax, bias, boolean mask)."""

    def __init__(
        self,
        scaled: bool,
        wide: bool,
        biased: bool,
        masked: bool,
        capped: bool,
        softmax_precision: bool,
        equal_head_dims: bool = False,
        sink: bool = False,
    ) -> None:
        flags = (("scaled", scaled), ("f32", wide), ("bias", biased), ("cap", capped), ("mask", masked), ("sink", sink))
        super().__init__(name="attention" + "".join(f"_{p}" for p, on in flags if on))
        self.scaled, self.wide, self.biased, self.masked, self.capped = scaled, wide, biased, masked, capped
        self.softmax_precision = softmax_precision
        self.equal_head_dims = equal_head_dims
        self.sink = sink

    def pattern(self, op, q, k, v, scale, bias, cap, cap_again, allowed, fill, column):
        scores = op.MatMul(q, op.Transpose(k, perm=[0, 1, 3, 2]))
        if self.scaled:
            scores = op.Mul(scores, scale)
        if self.wide:
            scores = op.Cast(scores, _outputs=["wide"])
        if self.biased:
            scores = op.Add(scores, bias)
        if self.capped:
            scores = op.Mul(op.Tanh(op.Div(scores, cap)), cap_again)
        if self.masked:
            scores = op.Where(op.Not(allowed), fill, scores)
        if self.sink:
            scores = op.Concat(scores, column, _outputs=["joined"])
        probs = op.Softmax(scores, axis=-1)
        if self.sink:
            probs = op.Slice(probs, _allow_other_inputs=True, _outputs=["kept"])
        if self.wide:
            probs = op.Cast(probs, _outputs=["narrow"])
        return op.MatMul(probs, v)

    def check(self, context, q, k, v, scale=None, bias=None, allowed=None, fill=None, wide=None, narrow=None, **kw):
        result = pattern.MatchResult()
        if not all(mu.rank(t) == 4 for t in (q, k, v)):
            return result.fail("q, k, v are not [B, H, S, D]", q)
        if self.sink and not _sink_column_ok(kw.get("joined"), kw.get("column"), kw.get("kept")):
            return result.fail("not a sink column: Concat(scores, [B, H, Sq, 1]) on the last axis, sliced back", q)
        if self.scaled and mu.const_scalar(scale) is None:
            return result.fail("the score scale is not a constant scalar", scale)
        if self.capped:
            cap, again = mu.const_scalar(kw.get("cap")), mu.const_scalar(kw.get("cap_again"))
            if cap is None or again is None or cap != again or not cap > 0:
                return result.fail("the soft-cap is not cap·tanh(scores / cap) with one constant cap > 0", q)
        if self.masked and (not mu.is_neg_inf(fill) or mu.dtype(allowed) != ir.DataType.BOOL):
            return result.fail("the mask is not a boolean filled with -inf", allowed)
        if self.wide and (mu.dtype(wide) != ir.DataType.FLOAT or mu.dtype(narrow) != mu.dtype(v)):
            return result.fail("the softmax casts are not float32 and back", wide)
        if self.biased and mu.rank(bias) not in (2, 3, 4):
            return result.fail("the score bias is not broadcastable to [B, H, Sq, Sk]", bias)
        heads, kv_heads = mu.static_dim(q, 1), mu.static_dim(_unrepeated(k), 1)
        if heads is None or kv_heads is None or heads % kv_heads:
            return result.fail("head counts are unknown or do not group", q)
        if mu.dtype(q) not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
            return result.fail("Attention takes float32, float16 or bfloat16", q)
        qk_dim, v_dim = mu.static_dim(q, 3), mu.static_dim(v, 3)
        if self.equal_head_dims and (qk_dim is None or qk_dim != v_dim):
            reason = (
                f"attention: q/k head dim {qk_dim} differs from v's {v_dim}, and TensorRT's Attention needs one head "
                f"dim for q, k and v"
            )
            _decline(reason)
            return result.fail(reason, v)
        parts = [value for value, on in ((bias, self.biased), (allowed, self.masked)) if on and value is not None]
        refused = limits.attention_mask(parts, q, k) if parts else None
        if refused is not None:
            _decline(f"attention: {refused}")
            return result.fail(refused, parts[0])
        return result

    def rewrite(self, op, q, k, v, scale=None, bias=None, allowed=None, cap=None, column=None, **_):
        if self.sink:
            return self._rewrite_sink(op, q, k, v, scale, bias, allowed, cap, column)
        mask = None
        if self.biased and self.masked:
            # bias + (0 where allowed, -inf where not): the select runs at the mask's shape ([B|1, 1, Sq, Sk]) and
            # one broadcast Add makes the [B, H, Sq, Sk] mask (ONNX Runtime's Add broadcasts several times faster
            # than its Where); exact, as bias + 0 == bias
            zero = op.Constant(value=ir.tensor([0.0], dtype=mu.dtype(bias)))
            fill = op.Constant(value=ir.tensor([_NEG_INF], dtype=mu.dtype(bias)))
            mask = op.Add(bias, op.Where(allowed, zero, fill))
        elif self.biased:
            mask = bias
        elif self.masked:
            mask = allowed
        if mask is not None and self.biased and mu.dtype(bias) != mu.dtype(q):
            mask = op.Cast(mask, to=mu.dtype(q))
        attributes = self._attributes(scale, cap)
        keys, values = _unrepeated(k), _unrepeated(v)
        if (keys is k) != (values is v):  # one repeat not recognized: the fused op takes both repeated
            keys, values = k, v
        inputs = [q, keys, values] + ([mask] if mask is not None else [])
        return op.Attention(*inputs, **attributes)

    def _attributes(self, scale: ir.Value | None, cap: ir.Value | None) -> dict[str, float | int]:
        # e.g. T5 does not scale its scores: scale 1
        attributes: dict[str, float | int] = {"scale": mu.const_scalar(scale) if self.scaled else 1.0}  # type: ignore[dict-item]  # check() made sure
        if self.wide and self.softmax_precision:
            attributes["softmax_precision"] = int(ir.DataType.FLOAT)
        if self.capped:
            attributes["softcap"] = mu.const_scalar(cap)  # type: ignore[assignment]  # check() made sure
        return attributes

    def _rewrite_sink(self, op, q, k, v, scale, bias, allowed, cap, column):
        """The sink as one more key (see the module docstring): ``Attention(q, [k; 0], [v; 0], [mask, sink])``."""
        keys, values = _unrepeated(k), _unrepeated(v)
        if (keys is k) != (values is v):
            keys, values = k, v
        wide = mu.dtype(column)
        zero = op.Constant(value=ir.tensor([0.0], dtype=wide))
        fill = op.Constant(value=ir.tensor([_NEG_INF], dtype=wide))
        body = zero  # [B|1, 1|H, Sq, Sk] in the column's dtype: the score bias, -inf where the mask forbids
        if self.masked:
            body = op.Where(allowed, zero, fill)
        if self.biased:
            body = op.Add(op.Cast(bias, to=wide) if mu.dtype(bias) != wide else bias, body)
        # [B, H, Sq, Sk]: Sk from the mask or bias where there is one (not from the keys: a later pass may move them)
        width = op.Shape(body if self.masked or self.biased else keys, start=3 if self.masked or self.biased else 2,
                         end=4 if self.masked or self.biased else 3)  # fmt: skip
        grid = op.Concat(op.Shape(column, start=0, end=3), width, axis=0)
        mask = op.Concat(op.Expand(body, grid), column, axis=-1)
        if wide != mu.dtype(q):
            mask = op.Cast(mask, to=mu.dtype(q))
        sink_keys = op.Concat(keys, zero_slot(op, q, keys), axis=2)
        sink_values = op.Concat(values, zero_slot(op, q, values), axis=2)
        return op.Attention(q, sink_keys, sink_values, mask, **self._attributes(scale, cap))


def zero_slot(op: Any, q: ir.Value, x: ir.Value) -> ir.Value:
    """One slot of zeros ``[B, h, 1, D]`` for keys or values ``x [B, h, S, D]`` (the sink's key or value). Its shape
    is read from ``q`` (the batch) and ``x``'s static head count and width where they are known, so it does not
    depend on ``x`` and a later pass may move ``x`` into a branch (:mod:`posenc.graphs.prefill`)."""
    heads, width, dtype = mu.static_dim(x, 1), mu.static_dim(x, 3), mu.dtype(x)
    assert dtype is not None  # check() made sure q, k, v are typed floats
    if heads is not None and width is not None:
        shape = op.Concat(op.Shape(q, start=0, end=1), op.Constant(value_ints=[heads, 1, width]), axis=0)
    else:
        shape = op.Concat(op.Shape(x, start=0, end=2), op.Constant(value_ints=[1]), op.Shape(x, start=3, end=4), axis=0)
    return op.ConstantOfShape(shape, value=ir.tensor([0.0], dtype=dtype))


def _sink_column_ok(joined: ir.Value | None, column: ir.Value | None, kept: ir.Value | None) -> bool:
    """``joined = Concat(scores, column)`` on the last axis with ``column [B, H, Sq, 1]``, and ``kept`` its softmax
    with the last column sliced off (``Slice(p, [0], [-1] or [Sk], [-1] or [3])``)."""
    concat = joined.producer() if joined is not None else None
    node = kept.producer() if kept is not None else None
    if concat is None or node is None or column is None or len(concat.inputs) != 2:
        return False
    if mu.int_attr(concat, "axis") not in (-1, 3) or mu.rank(column) != 4 or mu.static_dim(column, 3) != 1:
        return False
    starts, ends = node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else None
    axes = node.inputs[3] if len(node.inputs) > 3 else None
    steps = node.inputs[4] if len(node.inputs) > 4 else None
    if not mu.is_ints(starts, [0]) or not (mu.is_ints(axes, [-1]) or mu.is_ints(axes, [3])):
        return False
    if steps is not None and not mu.is_ints(steps, [1]):
        return False
    scores = concat.inputs[0]
    width = mu.static_dim(scores, 3) if scores is not None else None
    return mu.is_ints(ends, [-1]) or (width is not None and mu.is_ints(ends, [width]))


@dataclasses.dataclass(frozen=True)
class SinkMask:
    """A sink attention's mask taken apart, ``[Cast](Concat(Expand(Where(allowed, 0, -inf), grid), column))`` with
    ``column = Expand(sinks, [B, H, Sq, 1])``: the boolean ``allowed`` and the constant ``sinks [H]``."""

    allowed: ir.Value
    sinks: np.ndarray

    @classmethod
    def of(cls, mask: ir.Value, heads: int | None) -> SinkMask | None:
        """The parts of ``mask``, or ``None`` when it is not that form (a score bias, no mask, sinks computed at
        run time) or its sinks are not ``heads`` constants."""
        cast = mu.producer_of(mask, "Cast")
        concat = mu.producer_of(cast.inputs[0] if cast is not None else mask, "Concat")
        if concat is None or len(concat.inputs) != 2 or mu.int_attr(concat, "axis") not in (-1, 3):
            return None
        body = mu.producer_of(concat.inputs[0], "Expand")
        where = mu.producer_of(body.inputs[0] if body is not None else None, "Where")
        if (
            where is None
            or mu.dtype(where.inputs[0]) != ir.DataType.BOOL
            or mu.const_scalar(where.inputs[1]) != 0.0
            or not mu.is_neg_inf(where.inputs[2])
        ):
            return None
        column = mu.producer_of(concat.inputs[1], "Expand")
        source = column.inputs[0] if column is not None else None
        while source is not None and mu.const_array(source) is None:  # Reshape / Cast of the constant sinks
            step = source.producer()
            if step is None or step.op_type not in ("Reshape", "Cast", "Unsqueeze") or not step.inputs:
                return None
            source = step.inputs[0]
        sinks = mu.const_array(source)
        if sinks is None or sinks.size != heads:
            return None
        return cls(mu.operand(where, 0), sinks.reshape(heads))


def is_zero_slot(value: ir.Value | None) -> bool:
    """``value`` is a ``ConstantOfShape`` of zeros (the sink fusion's zero key or value, :func:`zero_slot`)."""
    fill = mu.producer_of(value, "ConstantOfShape")
    if fill is None:
        return False
    attribute = fill.attributes.get("value")
    return attribute is not None and not np.asarray(attribute.value.numpy()).any()


def head_sink_refusal(node: ir.Node, mask: ir.Value, heads: int | None) -> str | None:
    """Why ``GroupQueryAttention``'s ``head_sink`` cannot take a fused sink ``Attention`` (``None``: it can)."""
    if "softcap" in node.attributes:
        return "attention sinks with a soft-cap: GroupQueryAttention's order of cap and sink is not verified here"
    if SinkMask.of(mask, heads) is None:
        return (
            "attention sinks: the mask is not the causal mask beside constant sinks (a score bias, no mask, or sinks "
            "computed at run time); GroupQueryAttention's head_sink takes constants beside its causal mask"
        )
    return None


def _rules(softmax_precision: bool, softcap: bool, equal_head_dims: bool) -> pattern.RewriteRuleSet:
    variants = itertools.product((True, False), repeat=6)
    # Attention caps the scores before adding its mask: a capped score bias has no fused form.
    allowed = [(s, w, b, m, c, k) for s, w, b, m, c, k in variants if not c or (softcap and not b)]
    rules = [
        _SoftmaxAttention.rule(s, w, b, m, c, softmax_precision, equal_head_dims, k) for s, w, b, m, c, k in allowed
    ]
    return pattern.RewriteRuleSet(rules, commute=True)


_ATTENTION_RULES = {(p, c, e): _rules(p, c, e) for p in (True, False) for c in (True, False) for e in (True, False)}


def fuse_attention(
    model: ir.Model,
    softmax_precision: bool = True,
    softcap: bool = True,
    equal_head_dims: bool = False,
    declined: list[str] | None = None,
) -> int:
    """Replace exported softmax attention by ONNX ``Attention`` ops with the bias as additive mask.

    Args:
        model: rewritten in place.
        softmax_precision: mark float32 softmax of fp16/bf16 graphs with ``softmax_precision=FLOAT``
            (ONNX Runtime honours it; TensorRT's parser rejects the attribute, its kernels accumulate in
            float32 anyway).
        softcap: fuse a logit soft-cap into the ``softcap`` attribute (ONNX Runtime); ``False`` leaves
            soft-capped attention decomposed (TensorRT's parser rejects ``softcap``).
        equal_head_dims: fuse only attention whose v has the head dim of q and k (TensorRT's layer needs one;
            multi-head latent attention's and MiMo-V2-Flash's v are narrower), leaving the others decomposed.
        declined: if given, receives why an attention was left decomposed (one line per reason).

    Returns:
        The number of attention computations fused.
    """
    with _collecting(declined):
        count = _ATTENTION_RULES[softmax_precision, softcap, equal_head_dims].apply_to_model(model)
    if declined is not None:
        for node in model.graph:
            if node.op_type == "Softmax" and mu.producer_of(node.inputs[0], "Concat") is not None:
                reason = (
                    "attention sinks: an attention whose softmax has the sink column stayed decomposed (no fused "
                    "form for its mask, cap or casts on this target); the sink is kept exactly"
                )
                if reason not in declined:
                    declined.append(reason)
    return count


class _CausalIntoMask(pattern.RewriteRuleClassBase):
    """``Attention(is_causal=1, attn_mask=m)`` -> ``Attention(attn_mask=m ∧ causal)`` (TensorRT forbids both)."""

    def __init__(self) -> None:
        super().__init__(name="causal_into_mask")

    def pattern(self, op, q, k, v, mask):
        return op.Attention(q, k, v, mask, _outputs=["out"])

    def check(self, context, q, k, v, mask, out, **_):
        node = out.producer()
        if not mu.int_attr(node, "is_causal"):
            return pattern.MatchResult().fail("not causal")
        if len(node.outputs) > 1 and any(o.uses() for o in node.outputs[1:]):
            return pattern.MatchResult().fail("present/qk outputs are used")
        if mu.rank(q) != 4 or mu.dtype(mask) is None:
            return pattern.MatchResult().fail("only 4-D attention with a typed mask is rewritten", q)
        return True

    def rewrite(self, op, q, k, v, mask, out, **_):
        node = out.producer()
        zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
        rows = op.Range(zero, op.Squeeze(op.Shape(q, start=2, end=3)), one)
        cols = op.Range(zero, op.Squeeze(op.Shape(k, start=2, end=3)), one)
        allowed = op.LessOrEqual(op.Unsqueeze(cols, op.Constant(value_ints=[0])), op.Unsqueeze(rows, one))
        if mu.dtype(mask) == ir.DataType.BOOL:
            combined = op.And(mask, allowed)
        else:
            combined = op.Where(allowed, mask, op.Constant(value=ir.tensor([_NEG_INF], dtype=mu.dtype(mask))))
        attributes = {name: attr.value for name, attr in node.attributes.items() if name != "is_causal"}
        return op.Attention(q, k, v, combined, **attributes)


_CAUSAL_RULES = pattern.RewriteRuleSet([_CausalIntoMask.rule()])


def fold_causal_into_mask(model: ir.Model) -> int:
    """TensorRT: an Attention with both ``is_causal=1`` and a mask gets the causal mask folded into it.

    With no past key/value the causal rule is ``key <= query`` (ONNX Attention-23); boolean masks are
    and-ed with it, additive masks get ``-inf`` where it forbids.
    """
    return _CAUSAL_RULES.apply_to_model(model)
