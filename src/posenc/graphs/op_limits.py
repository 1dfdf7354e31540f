"""What ONNX Runtime's kernels accept of the fused ops the passes emit, asked before a pass emits one.

A pass calls these functions in its match check; a reason (one sentence, recorded for ``posenc inspect``) means the
match keeps its exact path. Only what the graph states is judged: a dimension it leaves symbolic is taken to fit,
unless a static one shows it cannot (a mask of one query row where the query length is not fixed to 1 is a
broadcast, which these kernels refuse).

The rules, from ONNX Runtime's sources (1.2x; each is run on the installed ONNX Runtime by
``tests/graphs/test_op_limits.py``, violated and satisfied):

- contrib ``GroupQueryAttention`` (``contrib_ops/cpu/bert/group_query_attention_helper.h``): ``num_heads`` a
  multiple of ``kv_num_heads``; one head size for q, k and v, a multiple of 8 (``Check_Q_K_V``); with ``do_rotary``
  the head size a multiple of 16 and ``cos_cache`` ``[rows >= total length, r/2]`` with ``r/2`` a multiple of 8
  and at most ``(head size / 16) · 8`` (``CheckRotaryCaches``); ``attention_bias`` of rank 4,
  ``[B | 1, num_heads | 1, S, total length]`` (``CheckCustomAttentionInputs``). A step of several tokens after
  cached ones runs only with batch 1 (``CheckInputs``, "batch_size must be 1 when sequence_length > 1 and past
  context is given"): a run-time rule no graph shape decides. Kernel types: CPU float32, float16; CUDA float16,
  bfloat16 (the kernel registrations in ``group_query_attention.cc``).
- ``Attention`` (opset 23, ``core/providers/cpu/llm/attention_helper.h``, ``ComputeOutputShapeForAttention``):
  ``attn_mask`` of rank 2 to 4 whose last two dimensions are exactly the query length and the total key length
  (no broadcast there), dimension -3 (rank >= 3) 1 or ``q_num_heads``, dimension 0 (rank 4) 1 or the batch.
- ``RotaryEmbedding`` (opset 23, ``core/providers/cpu/llm/rotary_embedding_helper.h``, ``CheckInputs``):
  ``position_ids`` ``[B, S]`` of the input's batch and length; without them ``cos_cache`` / ``sin_cache``
  ``[B, S, r/2]`` of the input's batch and length (no broadcast); a 3-D input needs ``num_heads``.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from posenc.graphs import match_utils as mu

GQA_CPU_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)
"""What ONNX Runtime's CPU ``GroupQueryAttention`` kernel is registered for."""
GQA_HEAD_MULTIPLE = 8
"""``GroupQueryAttention`` head sizes are multiples of this (``Check_Q_K_V``)."""
GQA_ROTARY_HEAD_MULTIPLE = 16
"""... and of this when the op rotates (``do_rotary``, ``CheckRotaryCaches``), its ``r/2`` a multiple of 8."""

_BROADCAST = 1


def _fits(dim: int | None, wanted: int | None) -> bool:
    """Whether a dimension the kernel wants equal to ``wanted`` can be: unknown dims fit; a static 1 (a broadcast)
    fits only a ``wanted`` fixed to 1; two static dims must be equal."""
    if dim is None:
        return True
    if wanted is None:
        return dim != _BROADCAST
    return dim == wanted


def broadcast_dims(values: Sequence[ir.Value]) -> list[int | None] | None:
    """The static dimensions of the broadcast of ``values`` (right-aligned; ``None``: not static, 1 only where every
    operand is 1 or absent), or ``None`` when a rank is unknown."""
    ranks = [mu.rank(value) for value in values]
    if any(r is None for r in ranks):
        return None
    width = max(r for r in ranks if r is not None)
    dims: list[int | None] = []
    for axis in range(-width, 0):
        found = [mu.static_dim(v, axis) if -axis <= (r or 0) else 1 for v, r in zip(values, ranks, strict=True)]
        known = [d for d in found if d is not None and d != _BROADCAST]
        if known:
            dims.append(known[0])
        elif all(d == _BROADCAST for d in found):
            dims.append(_BROADCAST)
        else:
            dims.append(None)
    return dims


def gqa_heads(q4: ir.Value, k4: ir.Value, v4: ir.Value) -> str | None:
    """Why ``GroupQueryAttention`` cannot take ``q [B, H, S, D]``, ``k``/``v [B, Hkv, T, D]``'s heads (``None``: it
    can)."""
    heads, kv_heads, head_dim = mu.static_dim(q4, 1), mu.static_dim(k4, 1), mu.static_dim(q4, 3)
    if heads is None or kv_heads is None or head_dim is None:
        return "GroupQueryAttention: the head counts or the head size are not static"
    if heads % kv_heads:
        return f"GroupQueryAttention needs num_heads ({heads}) a multiple of kv_num_heads ({kv_heads})"
    value_dim = mu.static_dim(v4, 3)
    if mu.static_dim(k4, 3) == head_dim and value_dim is not None and value_dim != head_dim:
        return (
            f"values {value_dim} wide, queries and keys {head_dim}: GroupQueryAttention takes one head size for q, k "
            f"and v (its value cache has the keys' width)"
        )
    if mu.static_dim(v4, 1) != kv_heads or mu.static_dim(k4, 3) != head_dim or value_dim != head_dim:
        return "GroupQueryAttention needs one head size for q, k and v and as many value heads as key heads"
    return gqa_head_size(head_dim)


def gqa_head_size(head_dim: int) -> str | None:
    """Why ``GroupQueryAttention`` refuses heads of ``head_dim`` features (``None``: it takes them)."""
    if head_dim % GQA_HEAD_MULTIPLE:
        return (
            f"head size {head_dim}: ONNX Runtime's GroupQueryAttention needs a multiple of {GQA_HEAD_MULTIPLE} "
            f"(group_query_attention_helper.h)"
        )
    return None


def gqa_rotary(head_dim: int, half: int, table_rows: int | None, slots: int | None) -> str | None:
    """Why ``GroupQueryAttention`` cannot do a rotation itself (``do_rotary``) with a ``[table_rows, half]`` table
    over a cache of ``slots`` (``None``: it can)."""
    if head_dim % GQA_ROTARY_HEAD_MULTIPLE:
        return f"head size {head_dim}: a rotating GroupQueryAttention needs a multiple of {GQA_ROTARY_HEAD_MULTIPLE}"
    if half % 8 or half > (head_dim // 16) * 8:
        return f"rotated width {2 * half}: a rotating GroupQueryAttention needs r/2 a multiple of 8, r <= head size"
    if table_rows is None or slots is None or table_rows < slots:
        return (
            f"a table of {table_rows} rows for {slots} cache slots: a rotating GroupQueryAttention needs a row for "
            f"every slot"
        )
    return None


def gqa_bias(bias: ir.Value, q4: ir.Value, keys: ir.Value) -> str | None:
    """Why ``GroupQueryAttention`` cannot take ``bias`` as its ``attention_bias`` for ``q [B, H, S, D]`` over
    ``keys [B, Hkv, T, D]`` (``None``: it can)."""
    if mu.rank(bias) != 4:
        return "GroupQueryAttention's attention_bias is [B | 1, H | 1, S, T]; this score bias is not 4-D"
    if mu.dtype(bias) != mu.dtype(q4):
        return "GroupQueryAttention's attention_bias has the query's dtype; this score bias does not"
    return _score_mask(bias, q4, keys, broadcast_dims([bias]), "GroupQueryAttention's attention_bias")


def attention_mask(parts: Sequence[ir.Value], q4: ir.Value, keys: ir.Value) -> str | None:
    """Why ONNX Runtime's ``Attention`` refuses the mask that is the broadcast sum of ``parts`` for
    ``q [B, H, S, D]`` over ``keys [B, Hkv, T, D]`` (``None``: it takes it)."""
    dims = broadcast_dims(parts)
    if dims is not None and not 2 <= len(dims) <= 4:
        return f"Attention's attn_mask is 2-D to 4-D; this mask is {len(dims)}-D"
    return _score_mask(parts[0], q4, keys, dims, "Attention's attn_mask")


def _score_mask(mask: ir.Value, q4: ir.Value, keys: ir.Value, dims: list[int | None] | None, what: str) -> str | None:
    if dims is None:
        return None
    wanted = {-2: mu.static_dim(q4, 2), -1: mu.static_dim(keys, 2)}
    names = {-2: "query length", -1: "key length"}
    for axis, size in wanted.items():
        if not _fits(dims[axis], size):
            return (
                f"{what} must span the {names[axis]} (ONNX Runtime does not broadcast it); this mask has "
                f"{dims[axis]} along it (shape {_shape(dims)})"
            )
    heads = mu.static_dim(q4, 1)
    if len(dims) >= 3 and dims[-3] not in (None, _BROADCAST, heads):
        return f"{what} has {dims[-3]} heads; ONNX Runtime needs 1 or the {heads} query heads"
    if len(dims) == 4 and dims[0] not in (None, _BROADCAST, mu.static_dim(q4, 0)):
        return f"{what} has batch {dims[0]}; ONNX Runtime needs 1 or the query's batch"
    return None


def _shape(dims: list[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def rotary_inputs(x: ir.Value, cos3: ir.Value, positions: ir.Value | None) -> str | None:
    """Why ONNX Runtime's ``RotaryEmbedding`` cannot rotate ``x [B, H, S, r]`` by ``cos3 [B, S, r/2]`` (gathered from a
    table at ``positions [B, S]`` when given) (``None``: it can)."""
    per_token, what = (positions, "position_ids") if positions is not None else (cos3, "cos/sin")
    for axis, x_axis, name in ((0, 0, "batch"), (1, 2, "length")):
        if not _fits(mu.static_dim(per_token, axis), mu.static_dim(x, x_axis)):
            return (
                f"RotaryEmbedding needs {what} of the input's {name} (ONNX Runtime does not broadcast them); "
                f"these have {mu.static_dim(per_token, axis)}"
            )
    return None


__all__ = [
    "GQA_CPU_TYPES",
    "attention_mask",
    "broadcast_dims",
    "gqa_bias",
    "gqa_head_size",
    "gqa_heads",
    "gqa_rotary",
    "rotary_inputs",
]
