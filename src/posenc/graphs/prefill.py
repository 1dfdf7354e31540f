"""ONNX Runtime CPU: the fresh prefill of a concatenated-cache block through the contrib ``GroupQueryAttention``.

After :func:`posenc.graphs.attention.fuse_attention`, a block with the concatenated cache attends as::

    present_k = Concat(past_k, Transpose(Reshape(k, [B, S, Hkv, D])), axis=2)          (and v alike)
    out = Reshape(Transpose(Attention(Transpose(Reshape(q, ..)), present_k, present_v, mask)), [B, S, H·D])

ONNX Runtime's CPU ``Attention`` runs a grouped-query block's prefill below the rate of its contrib
``GroupQueryAttention``, which takes ``q``, ``k`` and ``v`` in the projection layout ``[B, S, h·D]`` (no head
transposes) and runs the causal attention of a first prompt in one kernel. Its CPU decode step, though, reads the
cache once per query head and concatenates the cache like ``Concat``. So :func:`prefill_over_gqa` rewrites the
attention into ``If(fresh, gqa, present)``:

- ``fresh``: no cached position (``past`` has 0 slots), at least one query, and the mask the block computed is
  exactly the causal triangle ``tril(ones(S, S))`` (checked on the mask itself, so whatever the block masks —
  positions out of order, padding, a window shorter than the prompt — takes the other branch). Then
  ``Attention`` and ``GroupQueryAttention`` compute the same softmax over the same keys.
- ``gqa``: ``GroupQueryAttention(q, k, v, seqlens_k = S - 1, total_sequence_length = S)``, the score bias of an
  additive mask (ALiBi, T5: ``bias + Where(mask, 0, -inf)``) passed as ``attention_bias``; its ``present_key`` /
  ``present_value`` are the new keys and values, ``[B, Hkv, S, D]``. Values narrower than the keys (MiMo-V2-Flash's
  ``v_head_dim``; the op takes one head size) are zero-padded per head to the keys' width, and the output and
  ``present_value`` cut back to ``Dv`` per head: exact, as the zero features only add zero outputs.
- ``present``: the block's own head split, ``Concat`` and ``Attention``, moved into the branch so that a prefill
  does not run them.

The rotation is not moved: the ``RotaryEmbedding`` before the head split (and its position guard) runs in both
branches. Declined (the block keeps its path, the reason recorded): whatever ONNX Runtime's ``GroupQueryAttention``
refuses (:mod:`posenc.graphs.op_limits`: head sizes not a multiple of 8, head counts that do not group, a score bias
broadcast along the queries or keys), activations other than float32 / float16 (the CPU kernel's types), a soft-cap
together with a score bias (``GroupQueryAttention`` caps after adding the bias), a mask that is neither a boolean
nor ``bias + Where(mask, 0, -inf)``, and a block its manifest says is bidirectional (an encoder's: the If would
never take the causal kernel; :func:`prefill_refusal`).

Attention sinks (gpt-oss): the sink fusion gave the ``Attention`` one more key and value of zeros and the sink logits
as that key's mask column (:mod:`posenc.graphs.attention`). The ``If`` then takes the sinks as
``GroupQueryAttention``'s ``head_sink`` (one logit per head in the softmax's denominator, onnxruntime >= 1.22; checked
against the decomposed block by the tests), and the present branch keeps the zero key. Declined with sinks: a mask
other than the causal mask and the sink column (a score bias), sinks that are not constants, and a soft-cap.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from posenc.graphs import fold
from posenc.graphs import match_utils as mu
from posenc.graphs import op_limits as limits
from posenc.graphs.attention import SinkMask, head_sink_refusal, is_zero_slot
from posenc.graphs.cache import CacheFacts, apply_with_sink, attention_pattern, gqa_attributes


@dataclasses.dataclass(frozen=True)
class _Mask:
    """An ``Attention`` mask taken apart: the boolean ``allowed``; for the fused form of a score bias with a mask,
    ``[Cast](bias + Where(allowed, 0, -inf))``, also the ``bias`` and the ``Where``, ``Add`` and ``Cast`` nodes."""

    allowed: ir.Value
    bias: ir.Value | None = None
    where: ir.Node | None = None
    add: ir.Node | None = None
    cast: ir.Node | None = None

    @classmethod
    def of(cls, mask: ir.Value) -> _Mask | None:
        """The parts of ``mask``, or ``None`` when it is neither a boolean nor the fused bias-with-mask form."""
        if mu.dtype(mask) == ir.DataType.BOOL:
            return cls(mask)
        cast = mu.producer_of(mask, "Cast")
        add = mu.producer_of(cast.inputs[0] if cast is not None else mask, "Add")
        if add is None or len(add.inputs) != 2:
            return None
        for index, operand in enumerate(add.inputs):
            where = mu.producer_of(operand, "Where")
            if (
                where is not None
                and mu.dtype(where.inputs[0]) == ir.DataType.BOOL
                and mu.const_scalar(where.inputs[1]) == 0.0
                and mu.is_neg_inf(where.inputs[2])
            ):
                return cls(mu.operand(where, 0), add.inputs[1 - index], where, add, cast)
        return None

    def movable(self, mask: ir.Value, q: ir.Value) -> bool:
        """The mask is ``bias + Where(..)`` in q's dtype, read only by the attention: the ``If`` can give
        ``GroupQueryAttention`` the bias alone and build the sum in its other branch."""
        return (
            self.add is not None
            and self.cast is None
            and self.bias is not None
            and mu.dtype(self.bias) == mu.dtype(q)
            and mu.rank(self.bias) == 4
            and len(mask.uses()) == 1
            and not mask.is_graph_output()
        )


class _PrefillOverGQA(pattern.RewriteRuleClassBase):
    """Concat caches + ``Attention`` + head merge -> ``If(fresh prefill, GroupQueryAttention, the same nodes)``;
    with ``sink``, the caches' zero slot appended before the ``Attention`` (the sink fusion's form)."""

    def __init__(self, declined: list[str], sink: bool = False) -> None:
        super().__init__(name="prefill_over_gqa_sink" if sink else "prefill_over_gqa")
        self._declined = declined
        self.sink = sink

    def pattern(self, op, q, past_k, k, past_v, v, mask, shape, zero_k, zero_v):
        present_k = op.Concat(past_k, k, _allow_other_attributes=True, _outputs=["present_k"])
        present_v = op.Concat(past_v, v, _allow_other_attributes=True, _outputs=["present_v"])
        merged = attention_pattern(op, q, present_k, present_v, mask, shape, (zero_k, zero_v) if self.sink else None)
        return merged, present_k, present_v

    def _decline(self, result: Any, reason: str, where: Any) -> Any:
        self._declined.append(f"prefill_over_gqa: {reason}")
        return result.fail(reason, where)

    def check(self, context, q, k, v, mask, present_k, present_v, att, merged, **kw):
        result = pattern.MatchResult()
        node = att.producer()
        if node.graph is not context.model.graph:
            return result.fail("inside a subgraph", node)
        if not self.sink and (is_zero_slot(k) or is_zero_slot(v)):
            return result.fail("the keys end in the sink's zero slot: the sink rule's match", k)
        concats = [present_k.producer(), present_v.producer()]
        if self.sink:
            concats += [kw["sink_k"].producer(), kw["sink_v"].producer()]
        for concat in concats:
            if mu.int_attr(concat, "axis") not in (2, -2):
                return result.fail("the caches are not concatenated along the position axis", concat)
        readers = (kw["sink_k"].producer(), kw["sink_v"].producer()) if self.sink else (node, node)
        for present, reader in zip((present_k, present_v), readers, strict=True):
            if any(use.node is not reader for use in present.uses()):
                reason = "the cached keys or values feed more than the attention (e.g. a score bias that reads them)"
                return self._decline(result, reason, present)
        if len(node.outputs) > 1 and any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return result.fail("present/qk outputs of the Attention are used", node)
        if mu.int_attr(node, "is_causal") or mu.int_attr(node, "qk_matmul_output_mode"):
            return result.fail("causal flag or qk output on the Attention", node)
        if mu.rank(q) != 4 or mu.rank(k) != 4 or mu.rank(v) != 4 or mu.rank(merged) != 3:
            return result.fail("q, k, v are not [B, h, S, D] merged back into [B, S, H·D]", q)
        heads = limits.gqa_heads(q, k, k if _narrow_values(q, k, v) else v)
        if heads is not None:
            return self._decline(result, heads, q)
        if mu.dtype(q) not in limits.GQA_CPU_TYPES:
            return self._decline(result, f"{mu.dtype(q)} activations: the CPU kernel takes float32 or float16", q)
        if self.sink:
            return self._check_sink(result, node, q, mask, present_k, present_v, kw["zero_k"], kw["zero_v"])
        parts = _Mask.of(mask)
        if parts is None or mu.rank(mask) != 4:
            return self._decline(
                result, "the mask is neither a boolean nor bias + Where(mask, 0, -inf); its causality is unknown", mask
            )
        if parts.bias is not None and "softcap" in node.attributes:
            return self._decline(result, "a soft-cap with a score bias: GroupQueryAttention caps after the bias", node)
        bias, _ = _gqa_bias(parts, mask, q, present_k)
        refused = limits.gqa_bias(bias, q, present_k) if bias is not None else None
        if refused is not None:
            return self._decline(result, refused, mask)
        return result

    def _check_sink(self, result, node, q, mask, present_k, present_v, zero_k, zero_v):
        for zero, present in ((zero_k, present_k), (zero_v, present_v)):
            if not is_zero_slot(zero):
                return result.fail("the sink slot is not a ConstantOfShape of zeros", zero)
            shape = mu.producer_of(mu.producer(zero).inputs[0], "Concat")
            if shape is None or any(
                mu.producer_of(x, "Shape") and x.producer().inputs[0] is present for x in shape.inputs
            ):
                reason = "attention sinks over keys of unknown head count or width (the sink slot reads the cache)"
                return self._decline(result, reason, zero)
        refusal = head_sink_refusal(node, mask, mu.static_dim(q, 1))
        return self._decline(result, refusal, mask) if refusal else result

    def rewrite(self, op, q, past_k, k, past_v, v, mask, shape, present_k, present_v, att, merged, **kw):
        node = att.producer()
        sink = SinkMask.of(mask, mu.static_dim(q, 1)) if self.sink else None
        parts = _Mask.of(mask) if sink is None else _Mask(sink.allowed)
        assert parts is not None  # check() made sure
        allowed = parts.allowed
        # fresh: nothing cached, something to attend, and the mask is exactly the causal triangle
        fresh = op.Equal(op.Shape(past_k, start=2, end=3), op.Constant(value_ints=[0]))
        something = op.Greater(op.Size(mu.split_heads_source(q) or q), op.Constant(value_int=0))  # B > 0, S > 0
        triangle = op.Trilu(op.ConstantOfShape(op.Shape(allowed), value=ir.tensor([True])), upper=0)
        off = op.ReduceMax(op.Cast(op.Xor(allowed, triangle), to=ir.DataType.UINT8), keepdims=0)
        causal = op.Equal(off, op.Constant(value=ir.tensor(np.array(0, dtype=np.uint8))))
        condition = op.And(op.And(fresh, something), causal)
        bias, moved = _gqa_bias(parts, mask, q, present_k)
        zeros = (kw["zero_k"], kw["zero_v"]) if sink is not None else None
        found = _Attention(node, q, k, v, past_k, past_v, mask, shape, merged, present_k, present_v, zeros)
        head_sink = None
        if sink is not None:
            head_sink = op.Constant(value=ir.tensor(sink.sinks.astype(mu.dtype(q).numpy())))
        gqa, present = _gqa_graph(found, bias, head_sink), _present_graph(found, moved)
        return op.If(condition, then_branch=gqa, else_branch=present, _outputs=3)


def _gqa_bias(parts: _Mask, mask: ir.Value, q: ir.Value, keys: ir.Value) -> tuple[ir.Value | None, _Mask | None]:
    """``(attention_bias, moved)``: what ``GroupQueryAttention`` gets as its ``attention_bias`` over ``keys``, and the
    mask parts whose sum moves into the other branch. The score bias alone when the sum can move and the op takes the
    bias's shape (one broadcast along the queries it refuses); else the whole mask when there is a bias; nothing for a
    boolean mask."""
    if parts.bias is None:
        return None, None
    if parts.movable(mask, q) and limits.gqa_bias(parts.bias, q, keys) is None:
        return parts.bias, parts  # the mask's sum is built in the present branch only
    return mask, None


@dataclasses.dataclass(frozen=True)
class _Attention:
    """A matched attention: the ``Attention`` node, its q / new k / new v ``[B, h, S, D]``, the past caches, mask,
    the head merge's target shape, and the three values the ``If`` replaces (merged output, present k and v)."""

    node: ir.Node
    q: ir.Value
    k: ir.Value
    v: ir.Value
    past_k: ir.Value
    past_v: ir.Value
    mask: ir.Value
    shape: ir.Value
    merged: ir.Value
    present_k: ir.Value
    present_v: ir.Value
    zeros: tuple[ir.Value, ir.Value] | None = None
    """The sink's zero key and value slots the ``Attention`` reads after the caches (None: no sinks)."""


def _merged_heads(tape: ir.tape.Tape, x4: ir.Value) -> ir.Value:
    """``x [B, S, h·D]`` of ``x4 [B, h, S, D]``: its source when ``x4`` is a head split, else a transposed copy."""
    source = mu.split_heads_source(x4)
    if source is not None:
        return source
    heads = tape.op("Transpose", [x4], {"perm": [0, 2, 1, 3]})
    return tape.op("Reshape", [heads, tape.op("Constant", [], {"value": ir.tensor(np.array([0, 0, -1]))})])


def _narrow_values(q: ir.Value, k: ir.Value, v: ir.Value) -> int | None:
    """``Dv`` of values ``v [B, Hkv, S, Dv]`` narrower than the keys ``k [B, Hkv, S, D]`` (as many heads, static
    widths: MiMo-V2-Flash's), else ``None``."""
    width, value_width = mu.static_dim(q, 3), mu.static_dim(v, 3)
    if width is None or value_width is None or mu.static_dim(k, 3) != width or value_width >= width:
        return None
    return value_width if mu.static_dim(v, 1) == mu.static_dim(k, 1) else None


def _ints(tape: ir.tape.Tape, *values: int) -> ir.Value:
    return tape.op("Constant", [], {"value": ir.tensor(np.array(values, dtype=np.int64))})


def _padded_values(tape: ir.tape.Tape, value: ir.Value, heads: int, width: int, value_width: int) -> ir.Value:
    """Values ``[B, S, Hkv·Dv]`` zero-padded per head to ``[B, S, Hkv·D]`` (``GroupQueryAttention`` takes one head
    size; a zero feature of every value adds zero to every output feature, which :func:`_narrowed` drops)."""
    split = tape.op("Reshape", [value, _ints(tape, 0, 0, heads, value_width)])
    padded = tape.op("Pad", [split, _ints(tape, 0, 0, 0, 0, 0, 0, 0, width - value_width)])
    return tape.op("Reshape", [padded, _ints(tape, 0, 0, -1)])


def _narrowed(tape: ir.tape.Tape, x: ir.Value, value_width: int, heads: int | None = None) -> ir.Value:
    """The first ``Dv`` features of each head: of ``[B, S, H·D]`` (with ``heads``) or of ``[B, Hkv, S, D]``."""
    if heads is None:
        return tape.op("Slice", [x, _ints(tape, 0), _ints(tape, value_width), _ints(tape, 3)])
    split = tape.op("Reshape", [x, _ints(tape, 0, 0, heads, -1)])
    kept = tape.op("Slice", [split, _ints(tape, 0), _ints(tape, value_width), _ints(tape, 3)])
    return tape.op("Reshape", [kept, _ints(tape, 0, 0, -1)])


def _gqa_graph(found: _Attention, bias: ir.Value | None, head_sink: ir.Value | None = None) -> ir.Graph:
    """The then branch: ``GroupQueryAttention`` over the new tokens only (a first prompt), with ``head_sink``; values
    narrower than the keys are zero-padded to the keys' width for it and its outputs cut back to theirs."""
    tape = ir.tape.Tape()
    query, key, value = (_merged_heads(tape, x) for x in (found.q, found.k, found.v))
    narrow = _narrow_values(found.q, found.k, found.v)
    width, kv_heads = mu.static_dim(found.k, 3), mu.static_dim(found.k, 1)
    if narrow is not None and width is not None and kv_heads is not None:
        value = _padded_values(tape, value, kv_heads, width, narrow)
    seq = tape.op("Shape", [query], {"start": 1, "end": 2})
    batch = tape.op("Shape", [query], {"start": 0, "end": 1})
    last = tape.op("Sub", [seq, tape.op("Constant", [], {"value_ints": [1]})])
    seqlens = tape.op("Cast", [tape.op("Expand", [last, batch])], {"to": ir.DataType.INT32})  # [B]: S - 1
    total = tape.op("Cast", [tape.op("Squeeze", [seq])], {"to": ir.DataType.INT32})  # scalar S
    attributes = gqa_attributes(found.node, found.q, found.k)
    inputs = [query, key, value, None, None, seqlens, total, None, None, None, bias, head_sink]
    while inputs[-1] is None:
        inputs.pop()
    results = list(tape.op_multi_out("GroupQueryAttention", inputs, attributes, num_outputs=3, domain=mu.MS_DOMAIN))
    if narrow is not None:
        results[0] = _narrowed(tape, results[0], narrow, mu.static_dim(found.q, 1))
        results[2] = _narrowed(tape, results[2], narrow)
    templates = (found.merged, found.present_k, found.present_v)
    outputs = [mu.shaped_like(out, like) for out, like in zip(results, templates, strict=True)]
    return ir.Graph([], outputs, nodes=tape.nodes, name="prefill_group_query_attention")


def _split_heads(tape: ir.tape.Tape, x4: ir.Value) -> ir.Value:
    """``x4`` rebuilt inside the branch from its projection when only the attention reads it (so a prefill does not
    run the head split), else ``x4`` itself."""
    if mu.split_heads_source(x4) is None or len(x4.uses()) != 1 or x4.is_graph_output():
        return x4
    reshape = mu.producer(mu.operand(mu.producer(x4), 0))
    split = tape.op("Reshape", list(reshape.inputs), dict(reshape.attributes.items()))
    return tape.op("Transpose", [split], {"perm": [0, 2, 1, 3]})


def _present_graph(found: _Attention, moved: _Mask | None) -> ir.Graph:
    """The else branch: the block's own head split, cache ``Concat`` and ``Attention`` (and the mask's
    ``bias + Where(allowed, 0, -inf)`` when ``moved``)."""
    tape = ir.tape.Tape()
    mask = found.mask
    if moved is not None and moved.where is not None and moved.add is not None:
        select = tape.op("Where", list(moved.where.inputs))
        mask = tape.op("Add", [select if x is moved.where.outputs[0] else x for x in moved.add.inputs])
    q4, k4, v4 = (_split_heads(tape, x) for x in (found.q, found.k, found.v))
    axis = {"axis": mu.int_attr(mu.producer(found.present_k), "axis")}
    keys = tape.op("Concat", [found.past_k, k4], axis)
    values = tape.op("Concat", [found.past_v, v4], axis)
    attended = [keys, values]
    if found.zeros is not None:  # the sink's zero slot after the caches (not part of the presents)
        attended = [tape.op("Concat", [x, zero], axis) for x, zero in zip(attended, found.zeros, strict=True)]
    attention = tape.op("Attention", [q4, *attended, mask], dict(found.node.attributes.items()))
    heads = tape.op("Transpose", [attention], {"perm": [0, 2, 1, 3]})
    reshape = mu.producer(found.merged)
    out = tape.op("Reshape", [heads, found.shape], dict(reshape.attributes.items()))
    pairs = ((out, found.merged), (keys, found.present_k), (values, found.present_v))
    outputs = [mu.shaped_like(value, like) for value, like in pairs]
    return ir.Graph([], outputs, nodes=tape.nodes, name="present_attention")


def prefill_refusal(facts: CacheFacts | None) -> str | None:
    """Why no prompt of this block can take ``GroupQueryAttention`` (``None``: some may; the ``If`` decides per
    call)."""
    if facts is not None and not facts.causal:
        return (
            "the block is bidirectional (an encoder's; causal false in its manifest): GroupQueryAttention attends "
            "causally, so every prompt keeps ONNX Attention"
        )
    return None


def prefill_over_gqa(model: ir.Model, declined: list[str] | None = None) -> int:
    """ONNX Runtime CPU: a concatenated-cache block's first prompt through ``GroupQueryAttention``.

    Args:
        model: the IR model, after :func:`posenc.graphs.attention.fuse_attention`.
        declined: collects why an attention keeps its path (see the module docstring).

    Returns:
        The number of attentions given the prefill branch.
    """
    count = apply_with_sink(model, _PrefillOverGQA, declined)
    if count:
        fold.cleanup(model)  # the head splits now rebuilt inside the branch
    return count


__all__ = ["prefill_over_gqa", "prefill_refusal"]
