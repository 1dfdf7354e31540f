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
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from posenc.graphs import match_utils as mu
from posenc.graphs import op_limits as limits

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
        width = mu.static_dim(x, -1)
        if mu.rank(x) != 4 or width is None or width % 2:
            return result.fail("rotated input is not [B, H, S, r] with a known even r", x)
        half = width // 2
        slices_ok = (
            mu.is_last_axis(a1, 4)
            and mu.is_last_axis(a2, 4)
            and mu.is_ints(st1, [1])
            and mu.is_ints(st2, [1])
            and mu.is_ints(s1, [0])
            and mu.is_ints(e1, [half])
            and mu.is_ints(s2, [half])
            and (mu.const_ints(e2) or [0])[0] >= width
        )
        if not slices_ok:
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
        width = mu.static_dim(x, -1)
        if mu.rank(x) != 4 or width is None or width % 2:
            return result.fail("rotated input is not [B, H, S, r] with a known even r", x)
        slices_ok = (
            mu.is_last_axis(a1, 4)
            and mu.is_last_axis(a2, 4)
            and mu.is_ints(st1, [2])
            and mu.is_ints(st2, [2])
            and mu.is_ints(s1, [0])
            and mu.is_ints(s2, [1])
            and (mu.const_ints(e1) or [0])[0] >= width - 1
            and (mu.const_ints(e2) or [0])[0] >= width
        )
        if not slices_ok:
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


# --------------------------------------------------------------------------------------------------
# ONNX Runtime CPU: rotate [B, S, H*D] before the head transpose
# --------------------------------------------------------------------------------------------------


def _heads_from_reshape(y: ir.Value, split: ir.Value) -> int | None:
    """H when ``split`` is ``Reshape(y [B, S, H*D]) -> [B, S, H, D]`` with static H and D."""
    heads, head_dim = mu.static_dim(split, 2), mu.static_dim(split, 3)
    if mu.rank(y) != 3 or mu.rank(split) != 4 or heads is None or head_dim is None:
        return None
    width = mu.static_dim(y, 2)
    if width is not None and width != heads * head_dim:
        return None
    if not (mu.same_dim(y, 0, split, 0) and mu.same_dim(y, 1, split, 1)):
        return None
    return heads


class _RotateBeforeHeadTranspose(pattern.RewriteRuleClassBase):
    """``RoPE(Transpose(Reshape(y, [B,S,H,D]), 0213))`` -> ``Transpose(Reshape(RoPE(y, num_heads=H)))``."""

    def __init__(self, with_cast: bool) -> None:
        super().__init__(name="rope_3d_cast" if with_cast else "rope_3d")
        self.with_cast = with_cast

    def pattern(self, op, y, shape4):
        split = op.Reshape(y, shape4, _outputs=["split"])
        x4 = op.Transpose(split, perm=[0, 2, 1, 3])
        if self.with_cast:
            x4 = op.Cast(x4, _outputs=["wide"])
        return op.RotaryEmbedding(x4, _allow_other_inputs=True, _outputs=["rope"])

    def check(self, context, y, split, rope, **_):
        node = rope.producer()
        if mu.int_attr(node, "num_heads") or _heads_from_reshape(y, split) is None:
            return pattern.MatchResult().fail("not a [B, S, H*D] projection split into static heads", split)
        return True

    def rewrite(self, op, y, shape4, split, rope, wide=None, **_):
        heads = _heads_from_reshape(y, split)
        source = op.Cast(y, to=mu.dtype(wide)) if self.with_cast else y
        rotated = _copy_rotary(op, rope, source, num_heads=heads)
        allowzero = mu.int_attr(split.producer(), "allowzero")
        return op.Transpose(op.Reshape(rotated, shape4, allowzero=allowzero), perm=[0, 2, 1, 3])


class _HeadsMergedBack(pattern.RewriteRuleClassBase):
    """``Reshape(Transpose(Transpose(Reshape(y, [B,S,H,D]), 0213), 0213), [B,S,H*D])`` -> ``y``.

    After a rotation moves onto ``[B, S, H*D]``, the head split it left behind is often merged straight back
    (an op whose outputs keep the projection layout). ONNX Runtime cancels the transposes but runs the
    reshape pair as a full copy of q and k, which doubles the traffic of the rotation.
    """

    def __init__(self) -> None:
        super().__init__(name="heads_merged_back")

    def pattern(self, op, y, shape4, shape3):
        split = op.Reshape(y, shape4, _allow_other_attributes=True)
        back = op.Transpose(op.Transpose(split, perm=[0, 2, 1, 3]), perm=[0, 2, 1, 3])
        return op.Reshape(back, shape3, _allow_other_attributes=True, _outputs=["merged"])

    def check(self, context, y, merged, **_):
        shape = y.shape
        producer = y.producer()
        if shape is None and producer is not None and producer.op_type == "RotaryEmbedding":
            shape = producer.inputs[0].shape  # a rotation keeps its input's shape
        if shape is None or merged.shape is None or len(shape) != 3 or len(merged.shape) != 3:
            return pattern.MatchResult().fail("the merge does not restore y's [B, S, H*D] shape", merged)
        for dim_y, dim_merged in zip(shape.dims, merged.shape.dims, strict=True):
            known = isinstance(dim_y, int) or dim_y.value is not None
            if not known or (dim_y if isinstance(dim_y, int) else dim_y.value) != (
                dim_merged if isinstance(dim_merged, int) else dim_merged.value
            ):  # unknown dims are not equal to anything: the merge may not restore y's shape
                return pattern.MatchResult().fail("the merge does not restore y's [B, S, H*D] shape", merged)
        return True

    def rewrite(self, op, y, **_):
        return op.Identity(y)


_LAYOUT_3D_RULES = pattern.RewriteRuleSet(
    [_RotateBeforeHeadTranspose.rule(False), _RotateBeforeHeadTranspose.rule(True)]
)
_MERGE_BACK_RULES = pattern.RewriteRuleSet([_HeadsMergedBack.rule()])


def rope_to_3d(model: ir.Model) -> int:
    """ONNX Runtime CPU: move each RotaryEmbedding before the head transpose, onto ``[B, S, H*D]``.

    ORT's CPU kernel walks ``(b, s, h)`` with heads innermost, so the 3-D input is read contiguously and
    runs several times faster than the 4-D ``[B, H, S, D]`` one. Rotations whose input is not a head
    transpose of a projection (e.g. a graph input already in ``[B, H, S, D]``) keep the 4-D layout,
    which measured faster than adding two transposes around a 3-D op.
    """
    moved = _LAYOUT_3D_RULES.apply_to_model(model)
    if moved:
        _MERGE_BACK_RULES.apply_to_model(model)  # the split left behind may be merged straight back
    return moved


# --------------------------------------------------------------------------------------------------
# TensorRT: activation-dtype caches, int64 position ids of full batch
# --------------------------------------------------------------------------------------------------


class _CastCache:
    """Converts cos/sin caches to another dtype once per (cache, dtype), as initializers when constant."""

    def __init__(self) -> None:
        self._done: dict[tuple[int, ir.DataType], ir.Value] = {}

    def reset(self) -> None:
        self._done.clear()

    def __call__(self, op, cache: ir.Value, target: ir.DataType) -> ir.Value:
        if mu.dtype(cache) == target:
            return cache
        key = (id(cache), target)
        if key in self._done:
            return self._done[key]
        array = mu.const_array(cache)
        if array is not None and cache.is_initializer():
            name = f"{cache.name}_{target.name.lower()}"
            converted = op.initializer(ir.tensor(array.astype(target.numpy()), dtype=target, name=name), name=name)
        else:
            converted = op.Cast(cache, to=target)
            converted.dtype = target
        self._done[key] = converted
        return converted


class _RotaryInActivationDtype(pattern.RewriteRuleClassBase):
    """``Cast_T(RoPE(Cast_f32(x_T), cos, sin, pos))`` -> ``RoPE(x_T, cos_T, sin_T, pos)`` (TensorRT's layer)."""

    def __init__(self) -> None:
        super().__init__(name="rope_activation_dtype")
        self.cast_cache = _CastCache()

    def setup(self) -> None:
        self.cast_cache.reset()

    def pattern(self, op, x):
        rope = op.RotaryEmbedding(op.Cast(x), _allow_other_inputs=True, _outputs=["rope"])
        return op.Cast(rope, _outputs=["back"])

    def check(self, context, x, rope, back, **_):
        if mu.dtype(back) != mu.dtype(x) or mu.dtype(x) not in _FLOATS:
            return pattern.MatchResult().fail("the casts do not return to the activation dtype", back)
        return True

    def rewrite(self, op, x, rope, **_):
        node = rope.producer()
        target = mu.dtype(x)
        inputs = [x, self.cast_cache(op, node.inputs[1], target), self.cast_cache(op, node.inputs[2], target)]
        inputs += list(node.inputs[3:])
        attributes = {name: attr.value for name, attr in node.attributes.items()}
        return op.RotaryEmbedding(*inputs, **attributes)


class _RotaryTensorRTInputs(pattern.RewriteRuleClassBase):
    """Caches in the activation dtype; position ids int64 with the input's batch (TensorRT needs both)."""

    def __init__(self, with_positions: bool) -> None:
        super().__init__(name="rope_trt_inputs" if with_positions else "rope_trt_caches")
        self.with_positions = with_positions
        self.cast_cache = _CastCache()

    def setup(self) -> None:
        self.cast_cache.reset()

    def pattern(self, op, x, cos, sin, pos=None):
        if self.with_positions:
            return op.RotaryEmbedding(x, cos, sin, pos, _outputs=["rope"])
        return op.RotaryEmbedding(x, cos, sin, _outputs=["rope"])

    def _pos_needs_batch(self, x: ir.Value, pos: ir.Value) -> bool:
        return mu.static_dim(pos, 0) == 1 and mu.static_dim(x, 0) != 1

    def check(self, context, x, cos, sin, pos=None, **_):
        known = [mu.dtype(v) for v in (x, cos, sin, pos) if v is not None]
        if None in known:
            return pattern.MatchResult().fail("dtypes unknown (run shape inference first)")
        wrong_cache = mu.dtype(cos) != mu.dtype(x) or mu.dtype(sin) != mu.dtype(x)
        wrong_pos = pos is not None and (mu.dtype(pos) != ir.DataType.INT64 or self._pos_needs_batch(x, pos))
        if not (wrong_cache or wrong_pos):
            return pattern.MatchResult().fail("already in TensorRT's form")
        return True

    def rewrite(self, op, x, cos, sin, rope, pos=None, **_):
        node = rope.producer()
        target = mu.dtype(x)
        inputs = [x, self.cast_cache(op, cos, target), self.cast_cache(op, sin, target)]
        if pos is not None:
            needs_batch = self._pos_needs_batch(x, pos)
            if mu.dtype(pos) != ir.DataType.INT64:
                pos = op.Cast(pos, to=ir.DataType.INT64)
                pos.dtype = ir.DataType.INT64
            if needs_batch:
                seq_axis = 2 if mu.rank(x) == 4 else 1
                batch = op.Shape(x, start=0, end=1)
                seq = op.Shape(pos, start=1, end=2) if mu.static_dim(pos, 1) is None else None
                seq = seq if seq is not None else op.Shape(x, start=seq_axis, end=seq_axis + 1)
                pos = op.Expand(pos, op.Concat(batch, seq, axis=0))
                pos.dtype = ir.DataType.INT64
            inputs.append(pos)
        attributes = {name: attr.value for name, attr in node.attributes.items()}
        return op.RotaryEmbedding(*inputs, **attributes)


_TRT_RULES = pattern.RewriteRuleSet(
    [_RotaryInActivationDtype.rule(), _RotaryTensorRTInputs.rule(True), _RotaryTensorRTInputs.rule(False)]
)


def rope_for_tensorrt(model: ir.Model) -> int:
    """TensorRT's native rotary layer: activation-dtype caches and int64 full-batch position ids.

    Rotations computed in float32 between two casts (fp16/bf16 graphs) run in the activation dtype with
    the caches cast once (constant tables become new initializers); position ids of batch 1 are expanded
    to the input's batch; int32 ids are cast to int64.
    """
    return _TRT_RULES.apply_to_model(model)


# --------------------------------------------------------------------------------------------------
# com.microsoft RotaryEmbedding -> ai.onnx RotaryEmbedding
# --------------------------------------------------------------------------------------------------


class _ContribRotary(pattern.RewriteRuleClassBase):
    """ORT's contrib op (inputs x, position_ids, cos, sin) -> the standard op (x, cos, sin, position_ids)."""

    def __init__(self) -> None:
        super().__init__(name="rope_from_contrib")

    def pattern(self, op, x, pos, cos, sin):
        return op.RotaryEmbedding(x, pos, cos, sin, _domain="com.microsoft", _outputs=["rope"])

    def _num_heads(self, node: ir.Node, x: ir.Value, cos: ir.Value) -> int | None:
        heads = mu.int_attr(node, "num_heads")
        if heads or mu.rank(x) == 4:
            return heads
        half, width = mu.static_dim(cos, 1), mu.static_dim(x, 2)
        if mu.int_attr(node, "rotary_embedding_dim") or half is None or width is None:
            return None
        return width // (2 * half)

    def check(self, context, x, pos, cos, sin, rope, **_):
        result = pattern.MatchResult()
        node = rope.producer()
        if mu.int_attr(node, "is_packed_batching"):
            return result.fail("packed batching has no standard equivalent", node)
        scale = node.attributes.get("scale")
        if scale is not None and float(scale.value) != 1.0:
            return result.fail("a scale other than 1 has no standard equivalent", node)
        if mu.rank(x) not in (3, 4) or mu.rank(pos) not in (1, 2):
            return result.fail("input must be 3-D or 4-D and position ids [B, S] or a start offset", x)
        if mu.rank(pos) == 1 and mu.static_dim(pos, 0) != 1:
            return result.fail("1-D position ids must be a single start offset", pos)
        if mu.rank(x) == 3 and not self._num_heads(node, x, cos):
            return result.fail("3-D input needs num_heads (or a static hidden size) to convert", x)
        return result

    def rewrite(self, op, x, pos, cos, sin, rope, **_):
        node = rope.producer()
        seq_axis = 2 if mu.rank(x) == 4 else 1
        if mu.rank(pos) == 1:  # start offset: positions offset .. offset + S - 1 for every batch row
            seq = op.Squeeze(op.Shape(x, start=seq_axis, end=seq_axis + 1))
            steps = op.Range(op.Constant(value_int=0), seq, op.Constant(value_int=1))
            row = op.Add(op.Unsqueeze(steps, op.Constant(value_ints=[0])), pos)
            pos = op.Expand(row, op.Concat(op.Shape(x, start=0, end=1), op.Shape(row, start=1, end=2), axis=0))
        attributes = {
            "interleaved": mu.int_attr(node, "interleaved"),
            "rotary_embedding_dim": mu.int_attr(node, "rotary_embedding_dim"),
        }
        if mu.rank(x) == 3:
            attributes["num_heads"] = self._num_heads(node, x, cos)
        return op.RotaryEmbedding(x, cos, sin, pos, _domain="", **attributes)


_CONTRIB_RULES = pattern.RewriteRuleSet([_ContribRotary.rule()])


def convert_contrib_rope(model: ir.Model) -> int:
    """Replace ``com.microsoft.RotaryEmbedding`` by ``ai.onnx`` RotaryEmbedding (TensorRT misreads the former)."""
    count = _CONTRIB_RULES.apply_to_model(model)
    if count and not any(n.domain == "com.microsoft" for n in model.graph.all_nodes()):
        model.opset_imports.pop("com.microsoft", None)
    return count


__all__ = [
    "convert_contrib_rope",
    "fuse_partial_rope",
    "fuse_rope",
    "rope_for_tensorrt",
    "rope_to_3d",
]
