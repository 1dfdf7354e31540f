"""The ``ort-cpu`` pass for the in-place KV cache (``block-inplace`` graphs): attention that reads the cache itself.

An exported in-place block (:mod:`posenc.export.units`) writes its new keys and values with ``TensorScatter`` and
attends over the filled prefix of each cache, ``Slice(cache, 0, T)`` with ``T`` the longest row's
``past_length + S``; after :func:`posenc.graphs.attention.fuse_attention` that is
``Attention(q, Slice(K, 0, T), Slice(V, 0, T), mask)``. On ONNX Runtime each ``Slice`` is a copy of the filled
cache, and the CPU ``Attention`` kernel (like the contrib ``GroupQueryAttention`` kernel) reads the cached keys once
per query head, a grouped-query block's cache ``H / Hkv`` times. Both are what a decode step spends its time on.

:func:`decode_over_cache` (target ``ort-cpu``) rewrites that attention into
``If(S <= 16 and 3·T >= C, grouped, sliced)``:

- ``grouped``: the query heads of each key/value head as one ``[G·S, D]`` block (values of their own width), scores
  and ``P·V`` over the whole cache of ``C`` slots, the mask padded with "hidden" for the slots past ``T``. Every
  cached key is read once from memory, nothing is copied. The attention over ``C`` slots with slots ``T .. C - 1``
  hidden equals the attention over ``T`` slots exactly when those slots hold finite values (the in-place unit's
  contract: a softmax weight of zero times a finite value is zero). The products are laid out for ONNX Runtime's
  MLAS, which packs (copies) a ``B`` operand of a product with more than one row: the scores are ``K · qᵀ`` with the
  keys the ``A`` operand (:func:`_scores`), and a float32 single-token step of 2-4 heads per key/value head takes
  its values per head over chunks of the cache that stay in the core's cache (:func:`_weighted_values`).
- ``sliced``: the original ``Slice`` + ``Attention`` (prefill, and caches filled less than a third: reading the
  whole cache would then move more bytes than copying the filled part).

The condition reads only shapes and ``T``, so one graph serves decode and prefill. A sliding-window block's ring
cache (:mod:`posenc.export.units`: ``W + 15`` slots) has the same attention, so a full ring's step reads its ``C``
slots, the window's; a linear cache reads all ``C`` slots once ``3·T >= C``: ONNX Runtime's CPU kernels have no
view of a prefix without a copy (docs/performance.md measures the alternatives).

``gqa_over_cache`` (:mod:`posenc.graphs.cache`) is the ``ort-cuda`` counterpart.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from posenc.graphs import fold
from posenc.graphs import match_utils as mu
from posenc.graphs.attention import SinkMask, is_zero_slot

DECODE_MAX_QUERIES = 16
"""Largest number of new tokens the grouped decode path takes (more is a prefill: the fused op is faster)."""
FULL_CACHE_FILL = 3
"""The grouped path reads the whole cache when ``FULL_CACHE_FILL · T >= C``: below that a copy of the ``T`` filled
slots (read + write) and a read of them moves fewer bytes than one read of all ``C`` slots."""


class _DecodeOverCache(pattern.RewriteRuleClassBase):
    """``Attention(q, Slice(K, 0, T), Slice(V, 0, T), mask)`` -> ``If(decode, grouped over K, V; sliced)``; with
    ``sink``, the sink fusion's zero slot after the slices and the sinks as one more softmax column."""

    def __init__(self, sink: bool = False) -> None:
        super().__init__(name="decode_over_cache_sink" if sink else "decode_over_cache")
        self.sink = sink

    def pattern(self, op, q, keys, values, mask, zero_k, zero_v):
        k = op.Slice(keys, _allow_other_inputs=True, _outputs=["k_slice"])
        v = op.Slice(values, _allow_other_inputs=True, _outputs=["v_slice"])
        if self.sink:
            k = op.Concat(k, zero_k, _allow_other_attributes=True, _outputs=["sink_k"])
            v = op.Concat(v, zero_v, _allow_other_attributes=True, _outputs=["sink_v"])
        return op.Attention(q, k, v, mask, _outputs=["out"])

    def check(self, context, q, keys, values, mask, k_slice, v_slice, out, **kw):
        result = pattern.MatchResult()
        node = out.producer()
        k_node, v_node = k_slice.producer(), v_slice.producer()
        if node.graph is not context.model.graph:
            return result.fail("inside a subgraph (the sliced branch this rule wrote)", node)
        if len(node.outputs) > 1 and any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return result.fail("present/qk outputs of the Attention are used", node)
        if mu.int_attr(node, "is_causal") or mu.int_attr(node, "qk_matmul_output_mode"):
            return result.fail("causal or qk-output attention is not the in-place cache's", node)
        if not (
            mu.is_slot_prefix_slice(k_node)
            and mu.is_slot_prefix_slice(v_node)
            and mu.same_ints(k_node.inputs[2], v_node.inputs[2])
        ):
            return result.fail("keys and values are not the same leading slots of their caches", k_node)
        heads, kv_heads, head_dim = mu.static_dim(q, 1), mu.static_dim(keys, 1), mu.static_dim(q, 3)
        if mu.rank(q) != 4 or None in (heads, kv_heads, head_dim) or heads % kv_heads:
            return result.fail("head counts or head size are unknown or do not group", q)
        if mu.static_dim(values, 1) != kv_heads or mu.static_dim(values, 3) is None:
            return result.fail("the value cache does not match the key cache's heads, or its width is unknown", values)
        if mu.dtype(q) not in mu.FLOAT_TYPES or mu.rank(mask) != 4:
            return result.fail("a float query and a 4-D mask are needed", q)
        if mu.dtype(mask) != ir.DataType.BOOL and mu.dtype(mask) != mu.dtype(q):
            return result.fail("the additive mask is not in the query's dtype", mask)
        if self.sink:
            for concat in (kw["sink_k"].producer(), kw["sink_v"].producer()):
                if mu.int_attr(concat, "axis") not in (2, -2) or not is_zero_slot(concat.inputs[1]):
                    return result.fail("not the sink fusion's zero slot after the filled slots", concat)
            if SinkMask.of(mask, heads) is None:
                return result.fail("the mask is not the cache's mask beside constant sinks", mask)
        return result

    def rewrite(self, op, q, keys, values, mask, k_slice, v_slice, out, **kw):
        node = out.producer()
        k_node, v_node = k_slice.producer(), v_slice.producer()
        sinks = SinkMask.of(mask, mu.static_dim(q, 1)) if self.sink else None
        zeros = (kw["zero_k"], kw["zero_v"]) if self.sink else None
        ends = k_node.inputs[2]
        queries = op.Shape(q, start=2, end=3)
        slots = op.Shape(keys, start=2, end=3)
        small = op.LessOrEqual(queries, op.Constant(value_ints=[DECODE_MAX_QUERIES]))
        full = op.GreaterOrEqual(op.Mul(ends, op.Constant(value_ints=[FULL_CACHE_FILL])), slots)
        decode = op.And(small, full)
        grouped = _grouped_graph(node, q, keys, values, mask, ends, slots, sinks)
        sliced = _sliced_graph(node, q, keys, values, mask, k_node, v_node, zeros)
        return op.If(decode, then_branch=grouped, else_branch=sliced)


def _attributes(node: ir.Node) -> dict[str, ir.Attr]:
    return dict(node.attributes.items())


def _sliced_graph(
    node: ir.Node,
    q: ir.Value,
    keys: ir.Value,
    values: ir.Value,
    mask: ir.Value,
    k_node: ir.Node,
    v_node: ir.Node,
    zeros: tuple[ir.Value, ir.Value] | None = None,
) -> ir.Graph:
    """The original computation: the filled slots copied out (and the sink's zero slot after them), the fused
    Attention over them."""
    tape = ir.tape.Tape()
    k = tape.op("Slice", [keys, *k_node.inputs[1:]])
    v = tape.op("Slice", [values, *v_node.inputs[1:]])
    if zeros is not None:
        k, v = (tape.op("Concat", [x, zero], {"axis": 2}) for x, zero in zip((k, v), zeros, strict=True))
    attention = ir.Node("", "Attention", [q, k, v, mask], _attributes(node).values(), num_outputs=1)
    out = mu.shaped_like(attention.outputs[0], node.outputs[0])
    return ir.Graph([], [out], nodes=[*tape.nodes, attention], name="sliced_attention")


def _grouped_graph(
    node: ir.Node,
    q: ir.Value,
    keys: ir.Value,
    values: ir.Value,
    mask: ir.Value,
    ends: ir.Value,
    slots: ir.Value,
    sinks: SinkMask | None = None,
) -> ir.Graph:
    """Attention over every slot of the caches, each key/value head's query heads as one matrix (with ``sinks``, the
    sink logits as one more softmax column, dropped after the softmax)."""
    heads, kv_heads, head_dim = mu.static_dim(q, 1), mu.static_dim(keys, 1), mu.static_dim(q, 3)
    dtype = mu.dtype(q)
    np_dtype = dtype.numpy()  # type: ignore[union-attr]
    attrs = _attributes(node)
    scale = float(attrs["scale"].value) if "scale" in attrs else 1.0 / float(np.sqrt(head_dim))  # type: ignore[arg-type]
    softcap = float(attrs["softcap"].value) if "softcap" in attrs else 0.0
    wide = "softmax_precision" in attrs and ir.DataType(int(attrs["softmax_precision"].value)) != dtype
    tape = ir.tape.Tape()
    if sinks is not None:
        mask = sinks.allowed  # the boolean mask beside the sink column
    # mask [B|1, 1|H, S, T] -> [.., C]: the slots past T hidden
    pads = tape.op("Concat", [mu.int_constant(tape, 0, 0, 0, 0, 0, 0, 0), tape.op("Sub", [slots, ends])], {"axis": 0})
    if mu.dtype(mask) == ir.DataType.BOOL:
        hidden = mu.constant(tape, np.array(False))
    else:
        hidden = mu.constant(tape, np.array(-np.inf, dtype=np_dtype))
    full_mask = tape.op("Pad", [mask, pads, hidden])
    # q [B, H, S, D] -> [B, Hkv, G*S, D] (heads h = kv * G + g), scaled before the product
    q_scaled = tape.op("Mul", [q, mu.constant(tape, np.array(scale, dtype=np_dtype))])
    grouped_q = tape.op("Reshape", [q_scaled, mu.int_constant(tape, 0, kv_heads, -1, head_dim)])  # type: ignore[arg-type]
    group = heads // kv_heads  # type: ignore[operator]
    scores = _scores(tape, grouped_q, keys, group)
    per_head = tape.op("Concat", [mu.int_constant(tape, 0, heads, -1), slots], {"axis": 0})  # type: ignore[arg-type]
    scores = tape.op("Reshape", [scores, per_head])  # [B, H, S, C]
    compute = ir.DataType.FLOAT if wide else dtype
    if wide:
        scores = tape.op("Cast", [scores], {"to": compute})
    if softcap > 0:
        cap = mu.constant(tape, np.array(softcap, dtype=compute.numpy()))  # type: ignore[union-attr]
        scores = tape.op("Mul", [tape.op("Tanh", [tape.op("Div", [scores, cap])]), cap])
    if mu.dtype(mask) == ir.DataType.BOOL:
        fill = mu.constant(tape, np.array(-np.inf, dtype=compute.numpy()))  # type: ignore[union-attr]
        scores = tape.op("Where", [full_mask, scores, fill])
    else:
        bias = tape.op("Cast", [full_mask], {"to": compute}) if wide else full_mask
        scores = tape.op("Add", [scores, bias])
    if sinks is not None:  # [B, H, S, C] ++ [B, H, S, 1] of sinks[h], softmax, the column dropped
        column = mu.constant(tape, sinks.sinks.reshape(1, heads, 1, 1).astype(compute.numpy()))  # type: ignore[union-attr,arg-type]
        grid = tape.op(
            "Concat", [tape.op("Shape", [scores], {"start": 0, "end": 3}), mu.int_constant(tape, 1)], {"axis": 0}
        )
        scores = tape.op("Concat", [scores, tape.op("Expand", [column, grid])], {"axis": -1})
    probs = tape.op("Softmax", [scores], {"axis": -1})
    if sinks is not None:
        probs = tape.op("Slice", [probs, mu.int_constant(tape, 0), slots, mu.int_constant(tape, 3)])
    if wide:
        probs = tape.op("Cast", [probs], {"to": dtype})
    value_dim = mu.static_dim(values, 3)  # the values' own width (narrower than the keys' in MiMo-V2-Flash)
    grouped_out = _weighted_values(tape, q, probs, values, slots, kv_heads, group, value_dim)  # type: ignore[arg-type]
    out = tape.op("Reshape", [grouped_out, mu.int_constant(tape, 0, heads, -1, value_dim)])  # type: ignore[arg-type]
    out = mu.shaped_like(out, node.outputs[0])
    return ir.Graph([], [out], nodes=tape.nodes, name="grouped_attention_over_cache")


def _scores(tape: ir.tape.Tape, grouped_q: ir.Value, keys: ir.Value, group: int) -> ir.Value:
    """``grouped_q [B, Hkv, G·S, D]`` times ``keysᵀ``: ``[B, Hkv, G·S, C]``.

    One query row per key/value head (``G·S = 1``) is ``MatMul(q, Kᵀ)``: MLAS's one-row kernel reads each key row in
    place. More rows make MLAS pack the transposed ``[D, C]`` operand first (a transposing copy of every key), so the
    product is taken the other way round, ``K · qᵀ`` ``[B, Hkv, C, G·S]`` with the keys the ``A`` operand, read in
    place, and the small result transposed back (1.2-1.6x faster at ``C = 8192``, docs/performance.md). ``group``
    is static and ``S`` is not: at ``G = 1`` the first form serves ``S = 1``, the decode step."""
    if group == 1:
        return tape.op("MatMul", [grouped_q, tape.op("Transpose", [keys], {"perm": [0, 1, 3, 2]})])
    scores_t = tape.op("MatMul", [keys, tape.op("Transpose", [grouped_q], {"perm": [0, 1, 3, 2]})])
    return tape.op("Transpose", [scores_t], {"perm": [0, 1, 3, 2]})


VALUE_CHUNK_BYTES = 1 << 18
"""Bytes of one value chunk of :func:`_weighted_values`' per-head product: a chunk read from memory by the group's
first head stays in the core's L2 cache (1-2 MiB on today's x86 cores) for the others."""
PER_HEAD_MAX_GROUP = 4
"""Largest number of query heads per key/value head whose single-token step takes the per-head value product: each
head reads the chunk again from L2, which at 8 heads costs more than the grouped product's packing."""


def _value_chunks(slots: int | None, value_dim: int, itemsize: int) -> int | None:
    """The number of equal chunks the ``slots`` of a value cache are cut into (:data:`VALUE_CHUNK_BYTES` or less each),
    or ``None`` where the slots are unknown or only chunks of fewer than 16 slots divide them."""
    if slots is None:
        return None
    rows = max(1, VALUE_CHUNK_BYTES // (value_dim * itemsize))
    chunks = next(n for n in range(-(-slots // rows), slots + 1) if slots % n == 0)
    return chunks if slots // chunks >= min(16, slots) else None


def _weighted_values(
    tape: ir.tape.Tape,
    q: ir.Value,
    probs: ir.Value,
    values: ir.Value,
    slots: ir.Value,
    kv_heads: int,
    group: int,
    value_dim: int,
) -> ir.Value:
    """``probs [B, H, S, C]`` times ``values [B, Hkv, C, Dv]``: ``[B, Hkv, G·S, Dv]``.

    The grouped product ``MatMul(P [B, Hkv, G·S, C], V)`` makes MLAS pack ``V`` (a copy of every value) for
    ``G·S > 1`` rows. A float32 single-token step (``S = 1``) with 2 to :data:`PER_HEAD_MAX_GROUP` heads per
    key/value head instead gives every head its own one-row product over chunks of the cache, ``[B, Hkv, n, G, 1,
    C/n]`` times ``V [B, Hkv, n, 1, C/n, Dv]``, which MLAS's one-row kernel reads in place, and sums the ``n``
    partial results: the heads of a group read a chunk one after another, the first from memory and the rest from the
    core's cache (``If(S = 1, per head, grouped)``; docs/performance.md measures both)."""
    per_group = tape.op("Concat", [mu.int_constant(tape, 0, kv_heads, -1), slots], {"axis": 0})

    def grouped_product(on: ir.tape.Tape) -> ir.Value:  # [B, Hkv, G·S, C] · [B, Hkv, C, Dv]
        return on.op("MatMul", [on.op("Reshape", [probs, per_group]), values])

    chunks = _value_chunks(mu.static_dim(values, 2), value_dim, 4)
    if not 2 <= group <= PER_HEAD_MAX_GROUP or mu.dtype(q) != ir.DataType.FLOAT or chunks is None:
        return grouped_product(tape)
    grouped = ir.tape.Tape()
    out = grouped_product(grouped)
    rows = mu.static_dim(values, 2) // chunks  # type: ignore[operator]
    split = ir.tape.Tape()
    by_chunk = split.op("Reshape", [probs, mu.int_constant(split, 0, kv_heads, group, -1, chunks, rows)])
    by_chunk = split.op("Transpose", [by_chunk], {"perm": [0, 1, 4, 2, 3, 5]})  # [B, Hkv, n, G, S, C/n]
    chunked_values = split.op("Reshape", [values, mu.int_constant(split, 0, kv_heads, chunks, 1, rows, value_dim)])
    partial = split.op("MatMul", [by_chunk, chunked_values])  # [B, Hkv, n, G, S, Dv]
    summed = split.op("ReduceSum", [partial, mu.int_constant(split, 2)], {"keepdims": 0})
    per_head = split.op("Reshape", [summed, mu.int_constant(split, 0, kv_heads, -1, value_dim)])
    for value in (out, per_head):
        value.dtype, value.shape = ir.DataType.FLOAT, ir.Shape([None, kv_heads, None, value_dim])
    single = tape.op("Equal", [tape.op("Shape", [q], {"start": 2, "end": 3}), mu.int_constant(tape, 1)])
    branches = {
        "then_branch": ir.Graph([], [per_head], nodes=split.nodes, name="per_head_values"),
        "else_branch": ir.Graph([], [out], nodes=grouped.nodes, name="grouped_values"),
    }
    chosen = tape.op("If", [single], branches)
    chosen.dtype, chosen.shape = ir.DataType.FLOAT, ir.Shape([None, kv_heads, None, value_dim])
    return chosen


_DECODE_RULES = pattern.RewriteRuleSet([_DecodeOverCache.rule(), _DecodeOverCache.rule(sink=True)])


def decode_over_cache(model: ir.Model) -> int:
    """ONNX Runtime CPU: attention over an in-place cache reads the cache buffers without copies when decoding.

    Returns:
        The number of attentions rewritten (one per in-place block).
    """
    fold.cleanup(model)  # the head repeats the Attention fusion left behind still read the slices
    return _DECODE_RULES.apply_to_model(model)


__all__ = ["DECODE_MAX_QUERIES", "FULL_CACHE_FILL", "decode_over_cache"]
