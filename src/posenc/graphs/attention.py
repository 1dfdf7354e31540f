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
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Iterator

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
    ) -> None:
        flags = (("scaled", scaled), ("f32", wide), ("bias", biased), ("cap", capped), ("mask", masked))
        super().__init__(name="attention" + "".join(f"_{p}" for p, on in flags if on))
        self.scaled, self.wide, self.biased, self.masked, self.capped = scaled, wide, biased, masked, capped
        self.softmax_precision = softmax_precision
        self.equal_head_dims = equal_head_dims

    def pattern(self, op, q, k, v, scale, bias, cap, cap_again, allowed, fill):
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
        probs = op.Softmax(scores, axis=-1)
        if self.wide:
            probs = op.Cast(probs, _outputs=["narrow"])
        return op.MatMul(probs, v)

    def check(self, context, q, k, v, scale=None, bias=None, allowed=None, fill=None, wide=None, narrow=None, **kw):
        result = pattern.MatchResult()
        if not all(mu.rank(t) == 4 for t in (q, k, v)):
            return result.fail("q, k, v are not [B, H, S, D]", q)
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
                f"attention: q/k head dim {qk_dim} differs from v's {v_dim} (multi-head latent attention), and "
                f"TensorRT's Attention needs one head dim for q, k and v"
            )
            _decline(reason)
            return result.fail(reason, v)
        parts = [value for value, on in ((bias, self.biased), (allowed, self.masked)) if on and value is not None]
        refused = limits.attention_mask(parts, q, k) if parts else None
        if refused is not None:
            _decline(f"attention: {refused}")
            return result.fail(refused, parts[0])
        return result

    def rewrite(self, op, q, k, v, scale=None, bias=None, allowed=None, cap=None, **_):
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
        factor = mu.const_scalar(scale) if self.scaled else 1.0  # e.g. T5 does not scale its scores
        attributes: dict[str, float | int] = {"scale": factor}
        if self.wide and self.softmax_precision:
            attributes["softmax_precision"] = int(ir.DataType.FLOAT)
        if self.capped:
            attributes["softcap"] = mu.const_scalar(cap)
        keys, values = _unrepeated(k), _unrepeated(v)
        if (keys is k) != (values is v):  # one repeat not recognized: the fused op takes both repeated
            keys, values = k, v
        inputs = [q, keys, values] + ([mask] if mask is not None else [])
        return op.Attention(*inputs, **attributes)


def _rules(softmax_precision: bool, softcap: bool, equal_head_dims: bool) -> pattern.RewriteRuleSet:
    variants = itertools.product((True, False), repeat=5)
    # Attention caps the scores before adding its mask: a capped score bias has no fused form.
    allowed = [(s, w, b, m, c) for s, w, b, m, c in variants if not c or (softcap and not b)]
    rules = [_SoftmaxAttention.rule(*variant, softmax_precision, equal_head_dims) for variant in allowed]
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
            multi-head latent attention's v is narrower), leaving the others decomposed.
        declined: if given, receives why an attention was left decomposed (one line per reason).

    Returns:
        The number of attention computations fused.
    """
    with _collecting(declined):
        return _ATTENTION_RULES[softmax_precision, softcap, equal_head_dims].apply_to_model(model)


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
