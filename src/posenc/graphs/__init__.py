"""ONNX graph passes: constant folding, RoPE -> ``RotaryEmbedding``, attention -> ``Attention``, inspection.

Public API::

    from posenc.graphs import optimize_file, optimize_model, inspect_model
    from posenc.validate import check_ort_parity                           # the before/after check

    result = optimize_file("rope.onnx", "rope.trt.onnx", target="trt", check=check_ort_parity)
    result.counts            # {"fold_constants": 3, "fuse_rope": 2, "fuse_partial_rope": 0, ...}
    report = inspect_model("rope.trt.onnx", tensorrt_check=check_parse)   # ops, bytes, fusions, TRT parse
                                                    # (check_parse from posenc.engine, a layer above)

Each pass rewrites an ``onnx_ir.Model`` in place with onnxscript's pattern rewriter and returns its match
count: :func:`fold_constants`, :func:`convert_contrib_rope`, :func:`fuse_rope`, :func:`fuse_partial_rope`,
:func:`rope_to_3d` (ONNX Runtime CPU layout), :func:`rope_for_tensorrt`, :func:`fuse_attention`,
:func:`fold_causal_into_mask`; the KV-cache passes of :mod:`posenc.graphs.cache` and the cost passes
``gathernd_to_gather``, ``project_tables``, ``prefill_over_gqa`` and ``fuse_projections``. :func:`optimize_model`
chains them per target (``ort-cpu``, ``ort-cuda``, ``trt``).
:func:`optimize_file` checks parity before/after with the caller's ``check`` (``posenc optimize`` passes
:func:`posenc.validate.check_ort_parity`; this layer does not import ``posenc.validate``).
"""

from __future__ import annotations

from posenc._lazy import lazy_exports

# Imported on first use, so that `posenc --help` does not load onnxscript or TensorRT.
_EXPORTS: dict[str, str] = {
    "DEFAULT_FOLD_LIMIT": "posenc.graphs.choices",
    "InspectReport": "posenc.graphs.inspect",
    "OptimizeResult": "posenc.graphs.optimize",
    "ParityCheck": "posenc.graphs.optimize",
    "PassRecord": "posenc.graphs.optimize",
    "ROPE_MODES": "posenc.graphs.choices",
    "TARGETS": "posenc.graphs.choices",
    "cleanup": "posenc.graphs.fold",
    "convert_contrib_rope": "posenc.graphs.rope_contrib",
    "fold_causal_into_mask": "posenc.graphs.attention",
    "fold_constants": "posenc.graphs.fold",
    "fuse_attention": "posenc.graphs.attention",
    "fuse_partial_rope": "posenc.graphs.rope",
    "fuse_rope": "posenc.graphs.rope",
    "inspect_model": "posenc.graphs.inspect",
    "load_model": "posenc.graphs.model_io",
    "optimize_file": "posenc.graphs.optimize",
    "optimize_model": "posenc.graphs.optimize",
    "rope_for_tensorrt": "posenc.graphs.rope_layouts",
    "rope_to_3d": "posenc.graphs.rope_layouts",
    "save_model": "posenc.graphs.model_io",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
