"""The ``ort-cuda`` pass for the in-place KV cache (``block-inplace`` graphs): ``GroupQueryAttention`` over the cache.

The in-place block's attention, ``Attention(q, Slice(K, 0, T), Slice(V, 0, T), mask)`` after the attention fusion,
copies the filled cache on every step (:mod:`posenc.graphs.cache_decode` describes the graph and its cost).

:func:`gqa_over_cache` (target ``ort-cuda``; the ``ort-cpu`` rewrite is
:func:`posenc.graphs.cache_decode.decode_over_cache`) replaces the cache writes and the attention by ONNX Runtime's
contrib ``GroupQueryAttention`` with past and present sharing one buffer, as onnxruntime-genai builds its decoders
(``past_key`` = the cache, ``seqlens_k = past_length + S - 1``, ``total_sequence_length = max(past_length) + S``;
bind each present to its cache's buffer). The rotation moves into the op (``do_rotary``, ``cos_cache`` /
``sin_cache``, ``position_ids``, ``rotary_interleaved``) when it is a ``RotaryEmbedding`` on the projections with a
precomputed table of the activation dtype that the op can read (:func:`posenc.graphs.op_limits.gqa_rotary`: head
size a multiple of 16, ``r/2`` a multiple of 8, a table row per cache slot); otherwise the rotated q and k are fed
as they are. A score bias becomes ``attention_bias``. What ``GroupQueryAttention`` cannot express keeps its present
path, with the reason recorded (:func:`gqa_refusal` from the manifest, the pass's own checks from the graph): blocks
that are not causal (it masks by cache slots), sliding windows (it counts slots, posenc counts positions, which
differ after a jump in positions), a soft-cap together with a score bias (it caps after adding the bias), schemes
that compute attention themselves (no ``Attention`` to replace), and what the kernel refuses
(:mod:`posenc.graphs.op_limits`: head sizes not a multiple of 8, a score bias broadcast along queries or keys).
ONNX Runtime runs a step of several tokens after cached ones only with batch 1 ("batch_size must be 1 when
sequence_length > 1 and past context is given"): the graph serves a batched first prompt and batched single-token
steps, as onnxruntime-genai's decoders do; feed a batched chunk after a cache one row at a time. Attention sinks
(the sink fusion's zero key after the filled slots and its mask column) become ``head_sink``, and
``decode_over_cache``'s grouped branch gives them a softmax column of their own.

The graph alone does not say what the attention mask of an in-place block means; :class:`CacheFacts` carries that
from the manifest (``posenc optimize`` reads it), and graphs without one keep their attention.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern

from posenc.export.shape_rules import CHUNK_OVER_CACHE_ONE_ROW
from posenc.graphs import fold
from posenc.graphs import match_utils as mu
from posenc.graphs import op_limits as limits
from posenc.graphs.attention import SinkMask, head_sink_refusal, is_zero_slot

GQA_MAX_HEAD_SIZE = 256
"""posenc gives CUDA's ``GroupQueryAttention`` heads of at most this many features (flash attention's largest)."""


@dataclasses.dataclass(frozen=True)
class CacheFacts:
    """What an exported block's manifest says about its cache and mask (its graph alone does not).

    Attributes:
        in_place: a ``block-inplace`` graph (``TensorScatter`` writes, a filled-slot mask).
        causal: the mask hides later positions.
        sliding_window: local attention window, or ``None``.
        logit_softcap: the soft-cap, or ``None``.
        placement: where the scheme acts (``qk``, ``score``, ``attention``, ...).
        head_dim: the head size.
        attention_sinks: the softmax has a learned sink column per head.
        ring: the caches are a sliding window's ring buffer (``TensorScatter`` in ``circular`` mode).
    """

    in_place: bool
    causal: bool = True
    sliding_window: int | None = None
    logit_softcap: float | None = None
    placement: str = "qk"
    head_dim: int = 64
    attention_sinks: bool = False
    ring: bool = False

    @classmethod
    def of(cls, manifest: Any) -> CacheFacts | None:
        """The facts of a block's export manifest: all of them for an in-place block; for a concatenated-cache block
        only whether it is causal (what ``prefill_over_gqa`` asks; the cache passes leave it alone); ``None`` for
        other graphs."""
        unit = getattr(manifest, "unit", None)
        if manifest is None or unit not in ("block", "block-inplace"):
            return None
        config = manifest.attention_config()
        if unit == "block":
            return cls(in_place=False, causal=bool(config.causal))
        return cls(
            in_place=manifest.unit == "block-inplace",
            causal=config.causal,
            sliding_window=config.sliding_window,
            logit_softcap=config.logit_softcap,
            placement=manifest.placement,
            head_dim=config.head_dim,
            attention_sinks=config.attention_sinks,
            ring=bool(getattr(manifest, "cache_ring", False)),
        )


RING_ON_TENSORRT = (
    "TensorRT's ONNX parser takes TensorScatter in linear mode only (TensorRT-RTX 1.7: \"Only linear mode is "
    "supported for now, got circular\"), and this in-place block's caches are a sliding window's ring; re-export it "
    "with a linear cache: --kv-cache inplace --cache-capacity N with N at least its positions"
)
"""Why a ring cache graph is not optimized for ``trt``."""


def attention_refusal(facts: CacheFacts | None) -> str | None:
    """Why an in-place block has no ``Attention`` for the cache passes to take (``None``: it has)."""
    if facts is not None and facts.placement == "attention":
        return "the scheme computes its attention itself (no Attention op to replace); it keeps its own path"
    return None


def gqa_refusal(facts: CacheFacts | None) -> str | None:
    """Why ``GroupQueryAttention`` cannot take this block's attention (``None``: it can)."""
    if facts is None or not facts.in_place:
        return "GroupQueryAttention shares its past and present buffer: export with --kv-cache inplace"
    if attention_refusal(facts):
        return attention_refusal(facts)
    if limits.gqa_head_size(facts.head_dim):
        return limits.gqa_head_size(facts.head_dim)
    if facts.head_dim > GQA_MAX_HEAD_SIZE:
        return f"head size {facts.head_dim}: posenc gives GroupQueryAttention at most {GQA_MAX_HEAD_SIZE} (flash)"
    if facts.logit_softcap is not None and facts.placement == "score":
        return "a soft-cap with a score bias: GroupQueryAttention caps the scores after adding the bias"
    if not facts.causal:
        return "the block is not causal; GroupQueryAttention masks the cache causally by slot"
    if facts.sliding_window is not None:
        return (
            "sliding window: GroupQueryAttention's local window counts cache slots, posenc's counts positions "
            "(they differ once positions jump)"
        )
    return None


def gqa_attributes(attention: ir.Node, q: ir.Value, k: ir.Value) -> dict[str, Any]:
    """``GroupQueryAttention``'s attributes for an ``Attention`` node over ``q [B, H, S, D]`` and ``k [B, Hkv, T, D]``:
    the head counts, and its ``scale`` and ``softcap`` when it has them."""
    attributes: dict[str, Any] = {"num_heads": mu.static_dim(q, 1), "kv_num_heads": mu.static_dim(k, 1)}
    for name in ("scale", "softcap"):
        if name in attention.attributes:
            attributes[name] = float(attention.attributes[name].value)
    return attributes


def attention_pattern(
    op: Any, q: Any, keys: Any, values: Any, mask: Any, shape: Any, sink: tuple[Any, Any] | None
) -> Any:
    """The pattern's tail both cache fusions match (here and :mod:`posenc.graphs.prefill`): with ``sink``
    (``(zero_k, zero_v)``) the zero slot appended to ``keys`` / ``values`` (the sink fusion's form), ``Attention``,
    then the head merge ``Reshape(Transpose(att, [0, 2, 1, 3]), shape)``; returns the merged ``[B, S, H·D]`` value."""
    if sink is not None:
        keys = op.Concat(keys, sink[0], _allow_other_attributes=True, _outputs=["sink_k"])
        values = op.Concat(values, sink[1], _allow_other_attributes=True, _outputs=["sink_v"])
    attention = op.Attention(q, keys, values, mask, _outputs=["att"])
    heads = op.Transpose(attention, perm=[0, 2, 1, 3])
    return op.Reshape(heads, shape, _allow_other_attributes=True, _outputs=["merged"])


def _rotary(q: ir.Value, k: ir.Value, cache: ir.Value) -> tuple[ir.Node, ir.Node] | None:
    """The two RotaryEmbedding nodes producing q and k when GroupQueryAttention can do their rotation over
    ``cache [B, Hkv, C, D]`` (:func:`posenc.graphs.op_limits.gqa_rotary`)."""
    rq, rk = mu.producer_of(q, "RotaryEmbedding"), mu.producer_of(k, "RotaryEmbedding")
    if rq is None or rk is None:
        return None
    if len(rq.inputs) != 4 or len(rk.inputs) != 4 or list(rq.inputs[1:]) != list(rk.inputs[1:]):
        return None  # 3-D caches (dynamic tables) or different tables / positions
    if any(mu.int_attr(rq, a) != mu.int_attr(rk, a) for a in ("interleaved", "rotary_embedding_dim", "num_heads")):
        return None
    cos, sin = rq.inputs[1], rq.inputs[2]
    if mu.rank(cos) != 2 or mu.dtype(cos) != mu.dtype(q) or mu.dtype(sin) != mu.dtype(q):
        return None
    half, head_dim = mu.static_dim(cos, 1), mu.static_dim(q, 3)
    rotary_dim = mu.int_attr(rq, "rotary_embedding_dim") or head_dim
    if half is None or head_dim is None or 2 * half != rotary_dim:
        return None
    if limits.gqa_rotary(head_dim, half, mu.static_dim(cos, 0), mu.static_dim(cache, 2)) is not None:
        return None  # the rotation stays a RotaryEmbedding before the op
    q_in, k_in = rq.inputs[0], rk.inputs[0]
    if q_in is None or k_in is None or mu.split_heads_source(q_in) is None or mu.split_heads_source(k_in) is None:
        return None
    return rq, rk


class _GroupQueryAttention(pattern.RewriteRuleClassBase):
    """Cache writes + ``Attention`` over the filled slots + head merge -> ``com.microsoft.GroupQueryAttention``; with
    ``sink``, the sink fusion's zero slot after the filled slots and the sinks as ``head_sink``."""

    def __init__(self, declined: list[str], sink: bool = False) -> None:
        super().__init__(name="gqa_over_cache_sink" if sink else "gqa_over_cache")
        self._declined = declined
        self.sink = sink

    def _decline(self, result: Any, reason: str, where: Any) -> Any:
        if f"gqa_over_cache: {reason}" not in self._declined:
            self._declined.append(f"gqa_over_cache: {reason}")
        return result.fail(reason, where)

    def pattern(self, op, q, k, v, key_cache, value_cache, past_length, mask, shape, zero_k, zero_v):
        present_k = op.TensorScatter(key_cache, k, past_length, _allow_other_attributes=True, _outputs=["present_k"])
        present_v = op.TensorScatter(value_cache, v, past_length, _allow_other_attributes=True, _outputs=["present_v"])
        keys = op.Slice(present_k, _allow_other_inputs=True, _outputs=["k_slice"])
        values = op.Slice(present_v, _allow_other_inputs=True, _outputs=["v_slice"])
        merged = attention_pattern(op, q, keys, values, mask, shape, (zero_k, zero_v) if self.sink else None)
        return merged, present_k, present_v

    def check(
        self, context, q, k, v, key_cache, value_cache, mask, present_k, present_v, k_slice, v_slice, att, merged, **kw
    ):
        result = pattern.MatchResult()
        node = att.producer()
        for scatter in (present_k.producer(), present_v.producer()):
            if (
                mu.int_attr(scatter, "axis") not in (2, -2)
                or scatter.attributes.get_string("mode", "linear") != "linear"
            ):
                return result.fail("the cache writes are not linear writes along the slot axis", scatter)
        if not (key_cache.is_graph_input() and value_cache.is_graph_input()):
            return result.fail("the caches are not graph inputs (GroupQueryAttention shares their buffers)", key_cache)
        if not (mu.is_slot_prefix_slice(k_slice.producer()) and mu.is_slot_prefix_slice(v_slice.producer())):
            return result.fail("the attention does not read the leading slots of the caches", k_slice)
        if len(node.outputs) > 1 and any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return result.fail("present/qk outputs of the Attention are used", node)
        if mu.int_attr(node, "is_causal") or mu.int_attr(node, "qk_matmul_output_mode"):
            return result.fail("causal flag or qk output on the Attention", node)
        if mu.rank(q) != 4 or mu.rank(merged) != 3:
            return result.fail("the heads are not [B, H, S, D] merged back into [B, S, H*D]", q)
        refused = limits.gqa_heads(q, k, v)
        if refused is not None:
            return self._decline(result, refused, q)
        if mu.dtype(q) not in mu.FLOAT_TYPES:
            return self._decline(result, f"{mu.dtype(q)} activations: GroupQueryAttention takes float16 or bfloat16 "
                                 "(CUDA), float32 or float16 (CPU)", q)  # fmt: skip
        if self.sink:
            return self._check_sink(result, node, mu.static_dim(q, 1), mask, kw)
        biased = mu.dtype(mask) != ir.DataType.BOOL
        if biased and "softcap" in node.attributes:
            reason = "a soft-cap with a score bias: GroupQueryAttention caps after adding the bias"
            return self._decline(result, reason, node)
        refused = limits.gqa_bias(mask, q, k_slice) if biased else None
        if refused is not None:
            return self._decline(result, refused, mask)
        return result

    def _check_sink(self, result, node, heads, mask, kw):
        for concat in (kw["sink_k"].producer(), kw["sink_v"].producer()):
            if mu.int_attr(concat, "axis") not in (2, -2) or not is_zero_slot(concat.inputs[1]):
                return result.fail("not the sink fusion's zero slot after the filled slots", concat)
        refusal = head_sink_refusal(node, mask, heads)
        if refusal:
            self._declined.append(f"gqa_over_cache: {refusal}")
            return result.fail(refusal, mask)
        return result

    def rewrite(self, op, q, k, v, key_cache, value_cache, past_length, mask, att, **_):
        node = att.producer()
        sinks = SinkMask.of(mask, mu.static_dim(q, 1)) if self.sink else None
        attributes = gqa_attributes(node, q, k)
        rotary = _rotary(q, k, key_cache)
        merged_width = op.Constant(value_ints=[0, 0, -1])
        if rotary is not None:
            rq, rk = rotary
            query, key = mu.split_heads_source(rq.inputs[0]), mu.split_heads_source(rk.inputs[0])
            cos, sin, positions = rq.inputs[1], rq.inputs[2], rq.inputs[3]
            attributes.update(do_rotary=1, rotary_interleaved=mu.int_attr(rq, "interleaved"))
        else:
            query = mu.split_heads_source(q) or op.Reshape(op.Transpose(q, perm=[0, 2, 1, 3]), merged_width)
            key = mu.split_heads_source(k) or op.Reshape(op.Transpose(k, perm=[0, 2, 1, 3]), merged_width)
            cos = sin = positions = None
        value = mu.split_heads_source(v) or op.Reshape(op.Transpose(v, perm=[0, 2, 1, 3]), merged_width)
        seq = op.Shape(query, start=1, end=2)  # [B, S, H*D]: not q, so a fused rotation leaves no node behind
        filled = op.Add(past_length, seq)  # [B]: slots filled after this step
        seqlens = op.Cast(op.Sub(filled, op.Constant(value_ints=[1])), to=ir.DataType.INT32)
        total = op.Cast(op.ReduceMax(filled, keepdims=0), to=ir.DataType.INT32)
        bias = mask if mu.dtype(mask) != ir.DataType.BOOL and sinks is None else None
        head_sink = None
        if sinks is not None:  # GroupQueryAttention masks the slots causally itself; the sinks go in as head_sink
            head_sink = op.Constant(value=ir.tensor(sinks.sinks.astype(mu.dtype(q).numpy())))
        inputs = [query, key, value, key_cache, value_cache, seqlens, total, cos, sin, positions, bias, head_sink]
        while inputs[-1] is None:
            inputs.pop()
        return op.GroupQueryAttention(*inputs, _domain=mu.MS_DOMAIN, _outputs=3, **attributes)


def gqa_over_cache(model: ir.Model, declined: list[str] | None = None) -> int:
    """ONNX Runtime (CUDA): an in-place block's cache writes and attention as one contrib ``GroupQueryAttention``.

    Only for graphs whose :class:`CacheFacts` pass :func:`gqa_refusal` (the caller checks). Attention sinks (the
    sink fusion's zero slot and mask column) become ``head_sink``.

    Args:
        declined: collects why an attention with sinks keeps its fused ``Attention``.

    Args:
        model: rewritten in place.
        declined: collects why an attention keeps its path (what ``GroupQueryAttention`` would refuse,
            :mod:`posenc.graphs.op_limits`).

    Returns:
        The number of attentions replaced.
    """
    return apply_with_sink(model, _GroupQueryAttention, declined)


def apply_with_sink(model: ir.Model, rule: Any, declined: list[str] | None) -> int:
    """Apply a cache fusion's rule class (its ``rule(declined, sink=...)``) in both forms, plain and with the sink
    fusion's zero slot, after a cleanup; a model it rewrote imports the ``com.microsoft`` domain. Returns the count."""
    fold.cleanup(model)
    collected = declined if declined is not None else []
    rules = [rule.rule(collected), rule.rule(collected, sink=True)]
    count = int(pattern.RewriteRuleSet(rules).apply_to_model(model))
    if count:
        model.opset_imports.setdefault(mu.MS_DOMAIN, 1)
    return count


__all__ = [
    "RING_ON_TENSORRT",
    "CacheFacts",
    "attention_refusal",
    "gqa_over_cache",
    "gqa_refusal",
    "shape_rules",
]


def shape_rules(model: ir.Model) -> tuple[str, ...]:
    """The rules (:mod:`posenc.export.shape_rules`) the graph's cache kernels impose on a call's sizes: a
    ``GroupQueryAttention`` whose past buffer is a graph input (the in-place cache it shares with its output) serves
    several new tokens over a filled cache one batch row at a time."""
    inputs = list(model.graph.inputs)
    for node in model.graph:
        gqa = node.op_type == "GroupQueryAttention" and node.domain == mu.MS_DOMAIN and len(node.inputs) > 3
        if gqa and node.inputs[3] is not None and any(node.inputs[3] is value for value in inputs):
            return (CHUNK_OVER_CACHE_ONE_ROW,)
    return ()
