"""Build a TensorRT engine from an ONNX file, with a manifest beside it, written atomically.

``model.engine`` gets ``model.engine.manifest.json``::

    {"format": "posenc.engine/1", "backend": "tensorrt_rtx", "backend_version": "1.7.1.116",
     "targets": ["sm89", "sm120"], "profiles": [{"batch": {"min": 1, "opt": 1, "max": 8}, ...}],
     "input_shapes": {"q": {"min": [...], "opt": [...], "max": [...]}, ...},
     "precision": "float16", "decomposable_attention": 0, "layers": {"ROTARY_EMBEDDING": 2, ...},
     "timing_cache": null, "source_onnx": "rope.trt.onnx", "source_onnx_sha256": "...",
     "source_manifest": {...}, "engine_sha256": "...", "engine_bytes": 199708, "build_seconds": 0.4, ...}
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import onnx

from posenc.artifacts.files import atomic_outputs, json_text, reading
from posenc.artifacts.paths import input_file, output_path, sha256_file
from posenc.dtypes import dtype_name
from posenc.engine.backend import ERRORS, Backend, configure_polygraphy, load_backend
from posenc.engine.network import (
    fused_remedy,
    inlined_plugin_layers,
    layer_histogram,
    mark_fp32_attention_decomposable,
    parse_onnx,
    plugin_reason,
)
from posenc.engine.profiles import DimProfile, input_shapes, resolve_profiles
from posenc.engine.targets import capability_tuple, resolve_targets
from posenc.errors import BuildError, ConfigError, ModelFileError
from posenc.export.manifest import Manifest, OptimizedRecord, read_manifest_json
from posenc.export.units import BLOCK_INPLACE
from posenc.graphs.manifests import ModelInfo, read_model_info
from posenc.records import Document, field

ENGINE_FORMAT = "posenc.engine/1"


def engine_manifest_path(engine_path: str | os.PathLike[str]) -> Path:
    """``model.engine`` -> ``model.engine.manifest.json``."""
    path = Path(engine_path)
    return path.with_name(path.name + ".manifest.json")


def verify_engine(engine_path: str | os.PathLike[str]) -> Path:
    """The engine file, checked before it is read: a regular, non-empty file whose manifest (when it has one)
    records its sha256 (an interrupted ``posenc build`` in its folder is finished first).

    Raises:
        ModelFileError: missing, not a regular file, empty, or not the bytes its manifest describes.
    """
    path = input_file(
        engine_path, "engine", error=ModelFileError, missing=f"build it with `posenc build MODEL.onnx -o {engine_path}`"
    )
    manifest_path = engine_manifest_path(path)
    with reading(path):
        manifest_json = read_manifest_json(manifest_path) if manifest_path.exists() else None
        digest = sha256_file(path)
    if manifest_json is not None:
        manifest = EngineManifest.from_dict(manifest_json, f"engine manifest {manifest_path}")
        if digest != manifest.engine_sha256:
            raise ModelFileError(
                f"engine {path} does not match its manifest {manifest_path.name} (sha256 differs): it was modified "
                f"or replaced. Rebuild it (`posenc build ...`)."
            )
    return path


@dataclasses.dataclass(frozen=True)
class ShapeRange:
    """The ``min``/``opt``/``max`` shape of one engine input."""

    min: list[int]
    opt: list[int]
    max: list[int]


@dataclasses.dataclass(frozen=True)
class EngineSource:
    """What the engine's graph is, copied from its manifest (absent keys: the graph had no export manifest)."""

    scheme: str | None = field(optional=True, default=None)
    params: dict[str, Any] | None = field(optional=True, default=None)
    unit: str | None = field(optional=True, default=None)
    table_mode: str | None = field(optional=True, default=None)
    dtype: str | None = field(optional=True, default=None)
    max_positions: int | None = field(optional=True, default=None)
    attention: dict[str, Any] | None = field(optional=True, default=None)
    optimized: OptimizedRecord | None = field(optional=True, default=None)

    @classmethod
    def of(cls, info: ModelInfo) -> EngineSource:
        m = info.manifest
        if m is None:
            return cls(optimized=info.optimized)
        fields = ("scheme", "params", "unit", "table_mode", "dtype", "max_positions", "attention", "optimized")
        return cls(**{name: getattr(m, name) for name in fields})


@dataclasses.dataclass(frozen=True)
class EngineManifest(Document):
    """``model.engine.manifest.json``: what was built, from what, how (see the module docstring)."""

    FORMAT: ClassVar[str] = ENGINE_FORMAT
    REMEDY: ClassVar[str] = "rebuild the engine with this posenc version (`posenc build ...`)"

    backend: str
    backend_version: str
    targets: tuple[str, ...]
    targets_note: str
    profiles: tuple[dict[str, DimProfile], ...]
    input_shapes: dict[str, ShapeRange]
    """The input shapes of profile 0 (``prefill``)."""
    precision: str
    strongly_typed: bool
    decomposable_attention: int
    layers: dict[str, int]
    timing_cache: str | None
    timing_cache_note: str
    source_onnx: str
    source_onnx_sha256: str | None
    source_manifest: EngineSource
    engine_bytes: int
    build_seconds: float
    created: str
    engine_sha256: str
    format: str = ENGINE_FORMAT
    profile_names: tuple[str, ...] = field(optional=True, default=())
    """The name of each of :attr:`profiles`, in order (``prefill``, ``decode``; ``default`` without a context)."""
    inlined_plugin_layers: int = field(optional=True, default=0)
    """Layers made of posenc plugin nodes' ONNX function instead of the plugin (a build that asked for it)."""


@dataclasses.dataclass
class EngineResult:
    """A built engine: where it is, its manifest, and what went into it."""

    path: Path
    manifest_path: Path
    manifest: EngineManifest

    @property
    def targets(self) -> list[str]:
        return list(self.manifest.targets)


def _symbolic_inputs(
    parsed: Any, manifest: Manifest | None, onnx_dims: Mapping[str, list[int | str]]
) -> list[tuple[str, list[int | str]]]:
    """Input shapes with dim names: the manifest's where it describes the input, else the ONNX dim params."""
    described = {spec.name: spec.shape for spec in (manifest.inputs if manifest is not None else ())}
    shapes = []
    for name, dims, _ in parsed.inputs():
        if name in described and len(described[name]) == len(dims):
            shapes.append((name, list(described[name])))
            continue
        named = list(onnx_dims.get(name, []))
        shape: list[int | str] = []
        for axis, size in enumerate(dims):
            label = named[axis] if axis < len(named) else 0
            shape.append(size if size >= 0 else (label if isinstance(label, str) and label else f"{name}[{axis}]"))
        shapes.append((name, shape))
    return shapes


def _onnx_dim_names(model: onnx.ModelProto) -> dict[str, list[int | str]]:
    return {
        value.name: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        for value in model.graph.input
    }


def _precision(parsed: Any) -> str:
    names = {str(dtype).split(".")[-1].lower() for _, _, dtype in parsed.inputs()}
    for candidate in ("bf16", "half", "float"):  # TensorRT's names, lowest precision first
        if candidate in names:
            return dtype_name(candidate)
    return "float32"


def engine_profiles(
    manifest: Manifest | None, overrides: Sequence[str] | Mapping[str, DimProfile] | None = None
) -> dict[str, dict[str, DimProfile]]:
    """The named optimization profiles a build of this graph uses (:func:`posenc.engine.profiles.resolve_profiles`):
    sized to the model's context, ``prefill`` then ``decode`` for a graph with a cache whose block is causal (an
    encoder's layer, bidirectional, is never stepped: ``prefill`` alone)."""
    if manifest is None:
        return resolve_profiles(None, overrides)
    context = int(manifest.attention.get("max_position_embeddings") or 0) or None
    cached = "past" in manifest.dynamic_dims or manifest.unit == BLOCK_INPLACE
    decoder = cached and bool(manifest.attention.get("causal", True))
    return resolve_profiles(manifest.dynamic_dims, overrides, context=context, decoder=decoder)


def build_engine(
    onnx_path: str | os.PathLike[str],
    output: str | os.PathLike[str],
    targets: Sequence[str] | None = None,
    profile: Sequence[str] | Mapping[str, DimProfile] | None = None,
    *,
    backend: str | None = None,
    timing_cache: str | os.PathLike[str] | None = None,
    workspace_bytes: int | None = None,
    inline_plugins: bool = False,
) -> EngineResult:
    """Build ``output`` (engine) and its manifest from an ONNX file.

    Args:
        onnx_path: the graph (ideally ``posenc optimize --target trt`` output); its manifest gives the
            dynamic ranges.
        output: engine path; ``<output>.manifest.json`` is written beside it.
        targets: compute capabilities (``sm89``, ``sm120``, ...); RTX default: its default set.
        profile: dim overrides (``["seq=1:128:512"]``), within the manifest's ranges.
        backend: ``tensorrt`` / ``tensorrt_rtx`` / ``None`` (datacenter when importable).
        timing_cache: timing cache file (read and updated) for datacenter TensorRT; ignored by RTX, whose
            timing cache would force a GPU query in ahead-of-time builds.
        workspace_bytes: builder workspace limit.
        inline_plugins: build a graph holding posenc plugin nodes even where TensorRT has no such plugin
            (TensorRT-RTX has none) and inlines their ONNX function instead: many elementwise layers, slower than
            TensorRT's own rotary layer (``posenc optimize --rope fused``). Default: refuse.

    Raises:
        BackendUnavailable: no TensorRT (says what to install).
        ConfigError: unsupported target (lists the supported), profile outside the manifest's ranges.
        BuildError: the graph does not parse (names node and op), its posenc plugin nodes would be inlined
            (without ``inline_plugins``), or the build fails. No engine file is written then.
    """
    onnx_path, output = Path(onnx_path), output_path(output, "engine")
    if workspace_bytes is not None and (
        isinstance(workspace_bytes, bool) or not isinstance(workspace_bytes, int) or workspace_bytes <= 0
    ):
        raise ConfigError(f"workspace_bytes must be a positive int (bytes), got {workspace_bytes!r}.")
    if timing_cache is not None:
        output_path(timing_cache, "timing cache")  # read when it exists, written after the build
    source = read_model_info(onnx_path)  # a manifest that no longer matches the file is an error
    trt_backend = load_backend(backend)
    chosen = resolve_targets(trt_backend, targets)
    source_manifest = source.manifest
    profiles = engine_profiles(source_manifest, profile)
    configure_polygraphy(trt_backend)
    parsed = parse_onnx(trt_backend, onnx_path)
    graph = onnx.load(str(onnx_path), load_external_data=False)
    inlined = inlined_plugin_layers(parsed, graph)
    if inlined and not inline_plugins:
        raise BuildError(
            f"{onnx_path.name} holds posenc plugin nodes, but {plugin_reason(trt_backend)}: TensorRT would inline "
            f"the plugin's ONNX function as {inlined} layers, slower than its own rotary layer. "
            f"{fused_remedy(onnx_path)}: build that graph, or pass --inline-plugins (inline_plugins=True) to build "
            f"this one anyway."
        )
    symbolic = _symbolic_inputs(parsed, source_manifest, _onnx_dim_names(graph))
    all_shapes = [input_shapes(symbolic, dim_profile) for dim_profile in profiles.values()]
    shapes = all_shapes[0]
    decomposable = mark_fp32_attention_decomposable(parsed)
    cache_path = Path(timing_cache) if timing_cache and trt_backend.has_timing_cache else None
    started = time.perf_counter()
    engine = _serialize(trt_backend, parsed, chosen, all_shapes, cache_path, workspace_bytes)
    seconds = time.perf_counter() - started
    manifest = EngineManifest(
        backend=trt_backend.name,
        backend_version=trt_backend.version,
        targets=tuple(chosen),
        targets_note="" if chosen else "backend default (TensorRT-RTX: Ampere and later)",
        profiles=tuple(dict(p) for p in profiles.values()),
        profile_names=tuple(profiles),
        input_shapes={n: ShapeRange(*s) for n, s in shapes.items()},
        precision=_precision(parsed),
        strongly_typed=True,
        decomposable_attention=decomposable,
        layers=layer_histogram(parsed),
        timing_cache=str(cache_path) if cache_path else None,
        timing_cache_note="" if trt_backend.has_timing_cache else "TensorRT-RTX: not used (forces a GPU query)",
        source_onnx=onnx_path.name,
        source_onnx_sha256=source.sha256,
        source_manifest=EngineSource.of(source),
        engine_bytes=len(engine),
        build_seconds=round(seconds, 3),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        engine_sha256=hashlib.sha256(engine).hexdigest(),
        inlined_plugin_layers=inlined,
    )
    manifest_path = engine_manifest_path(output)
    with atomic_outputs(output, manifest_path) as (tmp_engine, tmp_manifest):  # the engine lands last
        tmp_engine.write_bytes(engine)
        tmp_manifest.write_text(json_text(manifest.to_dict()))
    return EngineResult(path=output, manifest_path=manifest_path, manifest=manifest)


def _serialize(
    backend: Backend,
    parsed: Any,
    targets: list[str],
    shapes: Sequence[Mapping[str, tuple[list[int], list[int], list[int]]]],
    timing_cache: Path | None,
    workspace_bytes: int | None,
) -> bytes:
    from polygraphy.backend.trt import EngineBytesFromNetwork, Profile
    from polygraphy.exception import PolygraphyException

    profiles = []
    for profile_shapes in shapes:
        profile = Profile()
        for name, (low, opt, high) in profile_shapes.items():
            profile.add(name, min=low, opt=opt, max=high)
        profiles.append(profile)
    options: dict[str, Any] = {"profiles": profiles}
    if workspace_bytes:
        options["memory_pool_limits"] = {backend.trt.MemoryPoolType.WORKSPACE: int(workspace_bytes)}
    if backend.is_rtx:
        from polygraphy.backend.tensorrt_rtx import CreateConfigRTX

        capabilities = [capability_tuple(t) for t in targets] or None
        create = CreateConfigRTX(compute_capabilities=capabilities, **options)

        def config(builder: Any, network: Any) -> Any:  # polygraphy leaves TF32 on for RTX: fp32 must stay fp32
            created = create(builder, network)
            if hasattr(backend.trt.BuilderFlag, "TF32"):
                created.clear_flag(backend.trt.BuilderFlag.TF32)
            return created

        loader = EngineBytesFromNetwork(parsed.as_polygraphy(), config=config)
    else:
        from polygraphy.backend.trt import CreateConfig

        if timing_cache is not None:
            options["load_timing_cache"] = str(timing_cache) if timing_cache.exists() else None
        loader = EngineBytesFromNetwork(
            parsed.as_polygraphy(),
            config=CreateConfig(**options),
            save_timing_cache=str(timing_cache) if timing_cache else None,
        )
    from polygraphy.logger import G_LOGGER

    ERRORS.start()
    quiet = G_LOGGER.INFO if os.environ.get("POSENC_TRT_VERBOSE") else G_LOGGER.ERROR
    try:
        with G_LOGGER.verbosity(quiet):
            serialized = loader()
    except PolygraphyException as exc:
        details = "; ".join(ERRORS.errors[-5:]) or str(exc)
        raise BuildError(f"{backend.describe()} failed to build the engine: {details}") from None
    if serialized is None:
        raise BuildError(f"{backend.describe()} returned no engine: {'; '.join(ERRORS.errors[-5:]) or 'no details'}")
    data = bytes(serialized)
    if not data:
        raise ModelFileError("TensorRT returned an empty engine; rebuild with POSENC_TRT_VERBOSE=1 for details.")
    return data
