"""ONNX Runtime's contrib ``com.microsoft`` RotaryEmbedding -> the standard ``ai.onnx`` RotaryEmbedding (opset 23).

:func:`convert_contrib_rope` is a pass: it rewrites the IR model in place and returns how many matches it rewrote.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from posenc.graphs import match_utils as mu


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


__all__ = ["convert_contrib_rope"]
