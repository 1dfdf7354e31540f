"""Position tables projected once: ``MatMul([Cast](Gather(T, index)), W)`` -> ``Gather(T @ W, index)``.

Transformer-XL projects its relative-position embeddings (``R W_r``) and TUPE its absolute ones (``P U_q``,
``P U_k``) inside the block, after looking up the rows it needs: ``Gather(T [R, E], index [.., n]) @ W [E, N]``.
Every call projects ``n`` rows again; a decode step at past ``P`` looks up ``P + 1`` (TUPE) or ``P + 2`` (XL) rows,
so at past 4095 a Transformer-XL step spends 8.6 GFLOP re-deriving constants. Both operands are constants, so the
product of every row, ``T @ W``, is a table too: this pass computes it once (in float64, then rounded to the
product's dtype) and looks its rows up instead. Each output row is the same dot product as before (up to the order
of summation, and one rounding instead of two), an index out of range still raises, and negative indices still count
from the end.

Only where the projected table has the table's shape (``W`` square, as ``[E, E]`` when the hidden size is
``heads · head_dim``): the table a manifest promises (checked by shape,
:func:`posenc.export.eager.check_graph_tables`) is then still there, and the graph grows by at most one table per
product beyond the first (Transformer-XL's file shrinks by ``W_r``, 4.2 MB in the Llama-like geometry; TUPE's two
projections of one table grow it by 8.4 MB net). An optional ``Cast`` between the lookup and
the product (fp32 tables, fp16 activations) is folded in.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from posenc.graphs import match_utils as mu


def _only_use(value: ir.Value, node: ir.Node) -> bool:
    uses = list(value.uses())
    return not value.is_graph_output() and len(uses) == 1 and uses[0].node is node


def _lookup(product: ir.Node) -> tuple[ir.Node, ir.Node | None] | None:
    """``(Gather, Cast or None)`` feeding ``product``'s left operand, each read by nothing else; else ``None``."""
    cast = mu.producer_of(product.inputs[0], "Cast")
    rows = cast.inputs[0] if cast is not None else product.inputs[0]
    gather = mu.producer_of(rows, "Gather")
    if gather is None or mu.int_attr(gather, "axis") != 0 or rows is None or not _only_use(rows, cast or product):
        return None
    if cast is not None and not _only_use(mu.operand(product, 0), product):
        return None
    return gather, cast


def _projected(product: ir.Node, gather: ir.Node, cast: ir.Node | None) -> np.ndarray | None:
    """``T @ W`` in the product's dtype when both are constants and the result has ``T``'s shape, else ``None``."""
    table, weight = mu.const_array(gather.inputs[0]), mu.const_array(product.inputs[1])
    if table is None or weight is None or table.ndim != 2 or weight.ndim != 2:
        return None
    if table.dtype.kind != "f" or weight.dtype.kind != "f" or weight.shape != (table.shape[1], table.shape[1]):
        return None
    if cast is None and table.dtype != weight.dtype:
        return None
    return (table.astype(np.float64) @ weight.astype(np.float64)).astype(weight.dtype)


def project_tables(model: ir.Model) -> int:
    """Replace each lookup-then-project of a constant table by a lookup in the projected table (module docstring).

    Args:
        model: rewritten in place (main graph).

    Returns:
        The number of products replaced.
    """
    graph = model.graph
    count = 0
    for product in list(graph):
        if product.op_type != "MatMul" or product.domain not in ("", "ai.onnx") or len(product.inputs) != 2:
            continue
        lookup = _lookup(product)
        table = None if lookup is None else _projected(product, *lookup)
        if lookup is None or table is None:
            continue
        gather = lookup[0]
        stem = f"{product.outputs[0].name or product.name}_table"
        projected = ir.Value(name=stem)
        projected.const_value = ir.tensor(table, name=stem)
        graph.register_initializer(projected)
        rows = ir.Node("", "Gather", [projected, gather.inputs[1]], attributes=[ir.AttrInt64("axis", 0)], name=stem)
        graph.insert_before(product, rows)
        mu.take_over(product.outputs[0], rows.outputs[0])
        graph.remove(product, safe=True)
        count += 1
    return count


__all__ = ["project_tables"]
