"""RoPE target layouts: the fused ONNX RotaryEmbedding arranged for ONNX Runtime CPU and for TensorRT.

:func:`rope_to_3d` (ONNX Runtime CPU) rotates ``[B, S, H*D]`` before the head transpose; :func:`rope_for_tensorrt`
gives the op caches in the activation dtype and int64 position ids of the full batch. Both run after
:func:`posenc.graphs.rope.fuse_rope`; each returns how many matches it rewrote.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from posenc.graphs import match_utils as mu
from posenc.graphs.rope import _FLOATS, _copy_rotary


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


__all__ = ["rope_for_tensorrt", "rope_to_3d"]
