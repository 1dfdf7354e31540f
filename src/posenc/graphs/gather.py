"""Table lookups by one index: ``GatherND`` with a last index axis of 1 is a ``Gather`` along axis 0.

Indexing a table with a tensor in PyTorch (``table[distance + offset]``, the score-bias tables of ALiBi, T5 and
the relative schemes) exports as ``GatherND(table, Unsqueeze(index, -1))``. ONNX Runtime's CPU ``GatherND`` copies
row by row; ``Gather(table, index, axis=0)`` is the same lookup (same output ``index.shape + table.shape[1:]``, same
negative-index rule, same out-of-range error) and is cheaper (docs/performance.md, "Two more passes measured for
this page").
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from posenc.graphs import match_utils as mu


class _GatherNDToGather(pattern.RewriteRuleClassBase):
    """``GatherND(data, indices[..., 1])`` (``batch_dims=0``) -> ``Gather(data, indices[..., 0], axis=0)``."""

    def __init__(self) -> None:
        super().__init__(name="gathernd_to_gather")

    def pattern(self, op, data, indices):
        return op.GatherND(data, indices, _allow_other_attributes=True, _outputs=["out"])

    def check(self, context, data, indices, out, **_):
        result = pattern.MatchResult()
        node = out.producer()
        if mu.int_attr(node, "batch_dims"):
            return result.fail("batch_dims != 0: the lookup is per batch row", node)
        depth = mu.rank(indices)
        if depth is None or mu.static_dim(indices, depth - 1) != 1:
            return result.fail("the index tuples are not of length 1 (or their length is unknown)", indices)
        return result

    def rewrite(self, op, data, indices, **_):
        depth = mu.rank(indices) or 1
        unsqueeze = indices.producer()
        if (
            unsqueeze is not None
            and unsqueeze.op_type == "Unsqueeze"
            and unsqueeze.domain in ("", "ai.onnx")
            and mu.rank(unsqueeze.inputs[0]) == depth - 1
            and mu.const_ints(unsqueeze.inputs[1]) in ([-1], [depth - 1])
        ):
            index = unsqueeze.inputs[0]  # the index before the exporter added its tuple axis
        else:
            index = op.Squeeze(indices, op.Constant(value_ints=[-1]))
        return op.Gather(data, index, axis=0)


_RULES = pattern.RewriteRuleSet([_GatherNDToGather.rule()])


def gathernd_to_gather(model: ir.Model) -> int:
    """Rewrite every single-index ``GatherND`` of ``model`` (in place) into a ``Gather`` along axis 0.

    Returns:
        The number of lookups rewritten.
    """
    return int(_RULES.apply_to_model(model))


__all__ = ["gathernd_to_gather"]
