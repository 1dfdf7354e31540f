"""Benchmark the artifact a user ships: an exported (or optimized) ONNX file with its manifest, as it is.

``posenc bench MODEL.onnx`` times the file itself — its dtype, table mode, cache layout, biases, real RoPE
parameters and weights — instead of a scheme rebuilt with default parameters. The workload's eager module is the
manifest's float rebuild with the file's own weights (:func:`posenc.export.load_eager`, in the graph's dtype), its
inputs the realistic feed every validation uses (:func:`posenc.export.make_feed`), and its graph the file: the
``ort-cpu`` backend runs it unchanged, ``ort-cpu-fused`` runs it after ``posenc optimize --target ort-cpu`` (made in
the run's scratch folder; an already optimized file is timed as it is). The harness times a GEMM of the same FLOPs
beside prefill calls and a copy beside decode steps, so the report gives prefill as a share of the GEMM rate and
decode as a share of the copy bandwidth, from one run.

Default shapes (:func:`artifact_shapes`): a prefill of ``min(512, context)`` tokens and one decode step whose cache
fills the context but one slot (at most 4095), within the graph's table or cache capacity.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from posenc.bench.plan import BenchCase
from posenc.bench.shapes import Shape, check_bench_shapes
from posenc.bench.workloads import BLOCK_UNITS, Workload
from posenc.config import AttentionConfig
from posenc.dtypes import torch_dtype
from posenc.errors import ConfigError
from posenc.export.eager import load_eager
from posenc.export.feeds import make_feed
from posenc.export.manifest import Manifest, load_manifest
from posenc.validate.feeds import serving_limit

PREFILL_TOKENS = 512
DECODE_PAST = 4095
UNOPTIMIZED_BACKENDS = ("torch", "ort-cpu", "ort-cpu-fused")
"""Default backends of an exported file: its eager twin, the file, and the file optimized for ``ort-cpu``."""
OPTIMIZED_BACKENDS = ("torch", "ort-cpu")
"""Default backends of a file ``posenc optimize`` already wrote: its eager twin and the file as it is."""


def artifact_key(path: Path) -> str:
    """File-name identifier of an artifact's graphs in the run's store: its stem and a hash of its resolved path,
    size and modification time (a rewritten file is a new artifact)."""
    stat = path.stat()
    ident = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return f"artifact-{path.stem}-{hashlib.sha1(ident.encode()).hexdigest()[:8]}"


def artifact_shapes(manifest: Manifest) -> list[Shape]:
    """A prefill and, for a block, one decode step, sized within the artifact's context (see the module doc)."""
    context = serving_limit(manifest, ring_positions=True)
    shapes = [Shape(1, min(PREFILL_TOKENS, context), name="prefill")]
    if manifest.unit in BLOCK_UNITS and context > 1:
        shapes.append(Shape(1, 1, min(DECODE_PAST, context - 1), name="decode"))
    return shapes


def _check_benchable(path: Path, manifest: Manifest) -> None:
    if not isinstance(manifest.attention_config(), AttentionConfig):
        raise ConfigError(
            f"{path}: benchmarking an MLA artifact is not supported yet; time its scheme with "
            f"`posenc bench -s {manifest.scheme} --unit block` instead."
        )
    if manifest.unit not in BLOCK_UNITS and not manifest.unit.startswith("op"):
        raise ConfigError(f"{path}: unit {manifest.unit!r} cannot be benchmarked.")


def artifact_plan(
    paths: Sequence[str | os.PathLike[str]], shapes: Sequence[Shape] | None = None, backends: Sequence[str] = ()
) -> list[BenchCase]:
    """One case per artifact and shape (default :func:`artifact_shapes`), on ``backends`` (default: the three of an
    exported file, the two of an optimized one).

    Raises:
        ModelFileError: a file or manifest that cannot be read.
        ConfigError: an artifact posenc cannot time, or a shape beyond its context.
    """
    cases = []
    for raw in paths:
        path = Path(raw)
        manifest = load_manifest(path)
        _check_benchable(path, manifest)
        chosen = tuple(backends) or (OPTIMIZED_BACKENDS if manifest.optimized is not None else UNOPTIMIZED_BACKENDS)
        if manifest.optimized is not None and "ort-cpu-fused" in chosen:
            raise ConfigError(
                f"{path} is already optimized (for {manifest.optimized.target}); it runs on backend ort-cpu as it is. "
                f"Bench the exported file to compare it with its optimized graph."
            )
        context = serving_limit(manifest, ring_positions=True)
        skip = ""
        if manifest.dtype == "bfloat16" and all(name.startswith(("torch", "ort-cpu")) for name in chosen):
            skip = "a bf16 graph has no ONNX Runtime CPU kernels for its ops; time it on a GPU backend"
        for shape in check_bench_shapes(shapes) if shapes else artifact_shapes(manifest):
            if shape.positions > context:
                raise ConfigError(
                    f"shape {shape.label} reaches position {shape.positions - 1}, past {path.name}'s context of "
                    f"{context} positions; choose a shorter shape."
                )
            config = manifest.attention_config()
            cases.append(
                BenchCase(
                    manifest.scheme,
                    manifest.unit,
                    manifest.table_mode,
                    shape,
                    config,
                    chosen,
                    skip,
                    artifact=str(path),
                    dtype=manifest.dtype,
                )
            )
    return cases


def artifact_workload(path: str | os.PathLike[str], shape: Shape, seed: int = 0) -> Workload:
    """The :class:`Workload` of an artifact at one shape: its eager twin with the file's weights, the realistic
    feed in the graph's dtype, the graph itself as the export (:attr:`Workload.artifact`)."""
    path = Path(path)
    manifest = load_manifest(path)
    _check_benchable(path, manifest)
    activation = torch_dtype(manifest.dtype)
    module, manifest = load_eager(path, dtype=activation, manifest=manifest)
    feed = make_feed(manifest, shape.feed, seed=seed)
    inputs = {name: _tensor(array, activation) for name, array in feed.items()}
    with torch.inference_mode():
        result = module(*inputs.values())
    outputs = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    weights = 0
    if manifest.unit in BLOCK_UNITS:
        weights = sum(p.numel() * p.element_size() for n, p in module.named_parameters() if "scheme." not in n)
    config = manifest.attention_config()
    output_names = [o.name for o in manifest.outputs]
    return Workload(
        manifest.scheme,
        manifest.unit,
        manifest.table_mode,
        shape,
        config,
        module,
        module,
        inputs,
        output_names,
        outputs,
        weights,
        artifact=path,
        artifact_key=artifact_key(path),
    )


def _tensor(array: np.ndarray, activation: torch.dtype) -> torch.Tensor:
    if array.dtype.kind == "f" and activation == torch.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(array.astype(np.float32))).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))
