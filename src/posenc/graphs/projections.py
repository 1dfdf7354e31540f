"""Projections of one input as one matrix product: ``MatMul(x, W_q)``, ``MatMul(x, W_k)``, ``MatMul(x, W_v)`` ->
``Split(MatMul(x, [W_q | W_k | W_v]), [N_q, N_k, N_v], axis=-1)``.

A block's query, key and value projections read the same hidden states ``x [B, S, E]``. A grouped-query block's key
and value projections are narrow (``[E, Hkv·D]``, 256 columns in the Llama-like block), and a narrow GEMM runs
well below the machine's GEMM rate; one ``[E, (H + 2·Hkv)·D]`` product runs at the rate of a wide one, and the
``Split`` afterwards copies only the activations (``[B, S, ΣN]``). This is how onnxruntime-genai builds its
decoders (a packed ``qkv_proj``). Each output column is the same dot product as before, so results match up to the
order ONNX Runtime's GEMM sums in.

Only ``MatMul`` nodes of the default domain whose weight is a 2-D constant (initializer or ``Constant``) of the
same dtype and row count are merged; a product whose output is a graph output keeps its own node. Initializer
weights are packed by a ``Concat`` node, which ONNX Runtime folds into one matrix when a session loads the graph: the
weights stay stored once, in the export's weights file; ``Constant`` weights are concatenated here.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from posenc.graphs import match_utils as mu


def _weight(node: ir.Node) -> np.ndarray | None:
    """The 2-D constant weight of ``MatMul(x, W)``, else ``None``."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    if node.outputs[0].is_graph_output():
        return None
    weight = mu.const_array(node.inputs[1])
    return weight if weight is not None and weight.ndim == 2 else None


def _groups(graph: ir.Graph) -> list[tuple[ir.Value, list[tuple[ir.Node, np.ndarray]]]]:
    """For each value read by two or more mergeable products (as their left operand): the products in graph order,
    grouped by weight dtype and row count."""
    found: dict[tuple[int, str, int], tuple[ir.Value, list[tuple[ir.Node, np.ndarray]]]] = {}
    for node in graph:
        weight = _weight(node)
        x = node.inputs[0] if weight is not None else None
        if x is None or weight is None:
            continue
        key = (id(x), weight.dtype.str, weight.shape[0])
        found.setdefault(key, (x, []))[1].append((node, weight))
    return [(x, products) for x, products in found.values() if len(products) > 1]


def fuse_projections(model: ir.Model) -> int:
    """Merge the products of one input with constant weights into one ``MatMul`` and a ``Split`` (module docstring).

    Args:
        model: rewritten in place (main graph only; subgraphs keep their nodes).

    Returns:
        The number of ``MatMul`` nodes removed (a merge of three removes two).
    """
    graph = model.graph
    removed = 0
    for x, products in _groups(graph):
        nodes = [node for node, _ in products]
        widths = [int(weight.shape[1]) for _, weight in products]
        stem = "_".join(str(node.outputs[0].name) for node in nodes) + "_packed"  # value names are unique
        stored = [node.inputs[1] for node in nodes]
        if all(value is not None and value.is_initializer() for value in stored):
            # the weights stay where they are stored (the export's weights file): ONNX Runtime folds this Concat
            # of initializers into one matrix when the session loads, so the file holds no second copy
            concat = ir.Node("", "Concat", stored, attributes=[ir.AttrInt64("axis", 1)], name=f"{stem}_weight")
            concat.outputs[0].name = f"{stem}_weight"
            graph.insert_before(nodes[0], [concat])
            packed = concat.outputs[0]
        else:
            packed = ir.Value(name=f"{stem}_weight")
            packed.const_value = ir.tensor(np.concatenate([weight for _, weight in products], axis=1), name=packed.name)
            graph.register_initializer(packed)
        product = ir.Node("", "MatMul", [x, packed], name=stem)
        product.outputs[0].name = stem  # named here: an unnamed value would get a "val_N" that a subgraph may hold
        sizes = ir.Value(name=f"{stem}_sizes")
        sizes.const_value = ir.tensor(np.array(widths, dtype=np.int64), name=sizes.name)
        graph.register_initializer(sizes)
        split = ir.Node(
            "", "Split", [product.outputs[0], sizes], attributes=[ir.AttrInt64("axis", -1)],
            num_outputs=len(nodes), name=f"{stem}_split",
        )  # fmt: skip
        graph.insert_before(nodes[0], [product, split])
        for node, piece in zip(nodes, split.outputs, strict=True):
            mu.take_over(node.outputs[0], piece)
            graph.remove(node, safe=True)
        removed += len(nodes) - 1
    return removed


__all__ = ["fuse_projections"]
