"""Constant folding and cleanup, with a size threshold so position tables are never blown up.

Folding evaluates nodes whose inputs are all constants. Left unbounded it would, for example, turn
``Gather(cos_table, constant_positions)`` or an ``Expand`` of a table into a new, much larger initializer.
The threshold bounds both the inputs a folded node may read and the output it may store.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxscript.optimizer

from posenc.graphs.choices import DEFAULT_FOLD_LIMIT

__all__ = ["DEFAULT_FOLD_LIMIT", "cleanup", "fold_constants", "infer_shapes"]


def fold_constants(model: ir.Model, size_limit: int = DEFAULT_FOLD_LIMIT) -> int:
    """Fold constant subgraphs and apply onnxscript's clean-up rewrites, bounded by ``size_limit``.

    Args:
        model: rewritten in place.
        size_limit: largest constant (in elements) a folded node may read or create.

    Returns:
        How many computing nodes disappeared (folded into constants, or removed as no-ops / unused).
    """
    before = _computing_nodes(model)
    onnxscript.optimizer.optimize(  # inline=False keeps model-local functions (e.g. plugin nodes' ORT twins)
        model, num_iterations=2, input_size_limit=size_limit, output_size_limit=size_limit, inline=False
    )
    cleanup(model)
    return max(0, before - _computing_nodes(model))


def _computing_nodes(model: ir.Model) -> int:
    return sum(1 for node in model.graph.all_nodes() if node.op_type != "Constant")


def cleanup(model: ir.Model) -> int:
    """Drop unused nodes, initializers and opset imports; re-sort; refresh shapes. Returns nodes removed."""
    before = sum(1 for _ in model.graph.all_nodes())
    common_passes.RemoveUnusedNodesPass()(model)
    common_passes.RemoveUnusedFunctionsPass()(model)
    common_passes.RemoveUnusedOpsetsPass()(model)
    common_passes.TopologicalSortPass()(model)
    infer_shapes(model)
    return before - sum(1 for _ in model.graph.all_nodes())


def infer_shapes(model: ir.Model) -> None:
    """ONNX shape and type inference on the IR (new values from rewrites get their shapes and dtypes)."""
    common_passes.ShapeInferencePass()(model)
