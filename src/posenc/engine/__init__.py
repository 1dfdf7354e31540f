"""TensorRT engines: backend choice, targets, profiles from the manifest, atomic builds, a runner.

Public API::

    from posenc.engine import build_engine, load_backend, engine_runner

    result = build_engine("rope.trt.onnx", "rope.engine", targets=["sm89", "sm120"])
    result.manifest.backend, result.manifest.targets           # "tensorrt_rtx", ("sm89", "sm120")

- :func:`load_backend`: ``tensorrt`` when importable, else ``tensorrt_rtx``; :class:`BackendUnavailable`
  (with the install command) when neither imports.
- :func:`build_engine`: strongly typed network (precision from the graph's dtypes), fp32 attention marked
  decomposable, one optimization profile from the manifest's dynamic ranges (overridable within them),
  compute-capability targets, timing cache where the backend has one, engine + manifest written
  atomically (a failed build leaves no engine file).
- :func:`parse_onnx` (errors name the failing node and op), :func:`check_parse` for ``posenc inspect``.
- :func:`engine_runner`: polygraphy ``TrtRunner`` (GPU + datacenter TensorRT only).
"""

from __future__ import annotations

from posenc._lazy import lazy_exports

# Imported on first use, so that `posenc --help` does not load onnxscript or TensorRT.
_EXPORTS: dict[str, str] = {
    "BACKENDS": "posenc.engine.backend",
    "Backend": "posenc.engine.backend",
    "DimProfile": "posenc.engine.profiles",
    "ENGINE_FORMAT": "posenc.engine.build",
    "EngineManifest": "posenc.engine.build",
    "EngineResult": "posenc.engine.build",
    "INSTALL_HINT": "posenc.engine.backend",
    "ParseIssue": "posenc.engine.network",
    "ParseReport": "posenc.engine.parse_check",
    "available_backends": "posenc.engine.backend",
    "build_engine": "posenc.engine.build",
    "check_parse": "posenc.engine.parse_check",
    "engine_manifest_path": "posenc.engine.build",
    "engine_runner": "posenc.engine.runner",
    "load_backend": "posenc.engine.backend",
    "mark_fp32_attention_decomposable": "posenc.engine.network",
    "normalize_target": "posenc.engine.targets",
    "parse_onnx": "posenc.engine.network",
    "parse_override": "posenc.engine.profiles",
    "resolve_profile": "posenc.engine.profiles",
    "resolve_targets": "posenc.engine.targets",
    "supported_targets": "posenc.engine.targets",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
