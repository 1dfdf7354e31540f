"""torch -> ONNX for positional schemes and attention blocks, with a manifest beside every file.

Public API (stable; the graph, engine, bench and demo stages build on it)::

    from posenc.export import build_module, export_onnx, export_scheme, load_manifest, make_feed, run_onnx, Shape

    block = build_module("rope_yarn", "block", params={"factor": 8.0}, table_mode="dynamic")
    result = export_onnx(block, "out/rope.onnx", unit="block", dtype="fp16", opset=23)
    result = export_scheme("rope_yarn", "out/rope.onnx", params={"factor": 8.0}, dtype="fp16")   # the two in a row
    result.path, result.manifest_path, result.weights_path      # model.onnx, .manifest.json, .weights.safetensors
    manifest = load_manifest("out/rope.onnx")                  # verifies sha256 of model and weights
    feed = make_feed(manifest, Shape(batch=2, seq=7, past=5))   # realistic int64 position ids
    check_feed(manifest, feed)                                 # PositionError past a precomputed table
    outputs = run_onnx("out/rope.onnx", feed)                  # check_feed + ONNX Runtime

- :func:`export_onnx` (module, path, unit="block"|"block-inplace"|"op"|"op-3d", dtype, opset=23|24|18|17,
  optimize, position_guard, cache_capacity, provenance, copy) -> :class:`ExportResult` ``(path, manifest,
  manifest_path, weights_path)``: any built block (an op unit exports its scheme) or scheme. Units
  (:class:`UnitKind`) and their inputs/outputs: :mod:`posenc.export.units`.
- :func:`build_module` (scheme, unit, config, params, table_mode, max_positions, table_dtype, seed): a scheme's
  module with seeded weights; :func:`export_scheme` (scheme, path, unit, kv_cache, ...): it, then :func:`export_onnx`.
- :func:`export_module` (module, args, path, input_names, output_names, dynamic_dims, opset) -> Path:
  any module, no manifest (e.g. a complex-number RoPE; see :mod:`posenc.export.complex`).
- :class:`Manifest`, :func:`load_manifest`; the JSON layout is documented in :mod:`posenc.export.manifest`.
  Files: ``model.onnx`` -> ``model.manifest.json`` and ``model.weights.safetensors`` (``state_dict``) beside it.
- :func:`check_feed`, :func:`make_feed`, :func:`run_onnx`, :func:`ort_session`, :func:`load_eager`
  (rebuild the eager module from manifest + weights; float64 for the reference).
- Constants: :data:`SUPPORTED_OPSETS` (17, 18, 23, 24), :data:`DEFAULT_OPSET` (23; 24 for the in-place cache,
  :data:`INPLACE_OPSET`), :data:`SAMPLE_SHAPE`, :data:`KV_CACHES`.

Graph facts: dynamic ``batch``, ``seq``, ``past`` (block) / ``kv_seq`` (score and attention ops);
the graph runs with ``past = 0``. Weights and activation inputs take the export dtype; position tables
stay float32 (``precomputed``: initializers gathered by position ids; ``dynamic``: computed in the
graph, including dynamic NTK's length-dependent base and LongRoPE's factor switch). Every file is
written to a temporary name and renamed, so a failed export leaves nothing behind. bf16 graphs are
validated by emulation on ONNX Runtime CPU (see :mod:`posenc.validate.bf16`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posenc._lazy import lazy_exports

# Imported on first use, so that `posenc --help` (which reads the unit names of posenc.export.kinds) loads no torch.
_EXPORTS: dict[str, str] = {
    "ALL_UNITS": "posenc.export.kinds",
    "BLOCK_INPLACE": "posenc.export.kinds",
    "DEFAULT_OPSET": "posenc.export.torch_onnx",
    "DimRange": "posenc.export.manifest",
    "EXPORT_DTYPES": "posenc.export.checks",
    "ExportResult": "posenc.export.exporter",
    "FeedShape": "posenc.export.shapes",
    "Shape": "posenc.export.shapes",
    "INPLACE_OPSET": "posenc.export.torch_onnx",
    "KV_CACHES": "posenc.export.kinds",
    "Manifest": "posenc.export.manifest",
    "SAMPLE_SHAPE": "posenc.export.shapes",
    "SUPPORTED_OPSETS": "posenc.export.torch_onnx",
    "TensorSpec": "posenc.export.manifest",
    "UNITS": "posenc.export.kinds",
    "build_eager": "posenc.export.eager",
    "check_dtype": "posenc.export.checks",
    "check_feed": "posenc.export.runtime",
    "check_model_file": "posenc.export.runtime",
    "check_opset": "posenc.export.torch_onnx",
    "dtype_name": "posenc.dtypes",
    "export_module": "posenc.export.torch_onnx",
    "build_module": "posenc.export.exporter",
    "export_onnx": "posenc.export.exporter",
    "export_scheme": "posenc.export.exporter",
    "library_versions": "posenc.export.describe",
    "load_eager": "posenc.export.eager",
    "load_manifest": "posenc.export.manifest",
    "make_feed": "posenc.export.feeds",
    "manifest_path_for": "posenc.artifacts.files",
    "ort_providers": "posenc.export.runtime",
    "ort_session": "posenc.export.runtime",
    "positions_for": "posenc.export.feeds",
    "reference_inputs": "posenc.export.eager",
    "run_onnx": "posenc.export.runtime",
    "sha256_file": "posenc.artifacts.files",
    "to_onnx_model": "posenc.export.torch_onnx",
    "torch_dtype": "posenc.dtypes",
    "UnitKind": "posenc.export.kinds",
    "weights_path_for": "posenc.artifacts.files",
}

__all__ = [
    "ALL_UNITS",
    "BLOCK_INPLACE",
    "DEFAULT_OPSET",
    "EXPORT_DTYPES",
    "INPLACE_OPSET",
    "KV_CACHES",
    "SAMPLE_SHAPE",
    "SUPPORTED_OPSETS",
    "UNITS",
    "DimRange",
    "ExportResult",
    "FeedShape",
    "Manifest",
    "Shape",
    "TensorSpec",
    "UnitKind",
    "build_eager",
    "build_module",
    "check_dtype",
    "check_feed",
    "check_model_file",
    "check_opset",
    "dtype_name",
    "export_module",
    "export_onnx",
    "export_scheme",
    "library_versions",
    "load_eager",
    "load_manifest",
    "make_feed",
    "manifest_path_for",
    "ort_providers",
    "ort_session",
    "positions_for",
    "reference_inputs",
    "run_onnx",
    "sha256_file",
    "to_onnx_model",
    "torch_dtype",
    "weights_path_for",
]

if TYPE_CHECKING:  # what the names are, for type checkers
    from posenc.artifacts.files import manifest_path_for, sha256_file, weights_path_for
    from posenc.dtypes import dtype_name, torch_dtype
    from posenc.export.checks import EXPORT_DTYPES, check_dtype
    from posenc.export.describe import library_versions
    from posenc.export.eager import build_eager, load_eager, reference_inputs
    from posenc.export.exporter import ExportResult, build_module, export_onnx, export_scheme
    from posenc.export.feeds import make_feed, positions_for
    from posenc.export.kinds import ALL_UNITS, BLOCK_INPLACE, KV_CACHES, UNITS, UnitKind
    from posenc.export.manifest import DimRange, Manifest, TensorSpec, load_manifest
    from posenc.export.runtime import check_feed, check_model_file, ort_providers, ort_session, run_onnx
    from posenc.export.shapes import SAMPLE_SHAPE, FeedShape, Shape
    from posenc.export.torch_onnx import (
        DEFAULT_OPSET,
        INPLACE_OPSET,
        SUPPORTED_OPSETS,
        check_opset,
        export_module,
        to_onnx_model,
    )

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
