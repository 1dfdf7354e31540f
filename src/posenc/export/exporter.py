"""Scheme and block export with a manifest: :func:`export_onnx` writes the graph, its weights and its manifest.

The path of one export::

    module (.to(dtype), tables stay float32) -> the unit's wrapper (posenc.export.units)
      -> refusals before tracing (posenc.export.checks)
      -> torch.export + torch.onnx.export(dynamo=True, opset 23 | 24 | 18 | 17) (posenc.export.torch_onnx)
      -> model.onnx + model.weights.safetensors + model.manifest.json (posenc.export.describe), written atomically

Weights are never silently random: the manifest's ``weights.source`` says where they came from (a checkpoint's
layer with every tensor's name and sha256, ``random`` with the seed, or a module the caller built).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posenc.artifacts.files import atomic_outputs, manifest_path_for, weights_path_for
from posenc.artifacts.paths import output_path
from posenc.blocks import AttentionBlock, MLABlock, MLAConfig, build_block, rotary_geometry
from posenc.config import AttentionConfig
from posenc.dtypes import torch_dtype
from posenc.errors import ConfigError, ExportError
from posenc.export.checks import check_cache_capacity, check_dtype, check_exportable
from posenc.export.describe import PreparedExport, export_manifest
from posenc.export.external import write_linked
from posenc.export.kinds import UnitKind
from posenc.export.manifest import Manifest
from posenc.export.shapes import SAMPLE_SHAPE
from posenc.export.torch_onnx import check_opset, check_unit_opset, default_opset, to_onnx_model
from posenc.export.units import make_unit
from posenc.provenance import ModuleWeights, RandomWeights, WeightsSource
from posenc.schemes import build_scheme, get_spec
from posenc.schemes.base import PositionalScheme, TableMode


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What :func:`export_onnx` wrote.

    Attributes:
        path: the ONNX file.
        manifest: its :class:`Manifest` (also written to :attr:`manifest_path`).
        manifest_path: ``<stem>.manifest.json`` beside the model.
        weights_path: ``<stem>.weights.safetensors`` (the module's ``state_dict``) beside the model.
    """

    path: Path
    manifest: Manifest
    manifest_path: Path
    weights_path: Path


# --------------------------------------------------------------------------------------------------
# Scheme / block export with manifest
# --------------------------------------------------------------------------------------------------


def _build_inner(
    unit: UnitKind,
    scheme: str | None,
    module: nn.Module | None,
    params: Mapping[str, Any] | None,
    config: AttentionConfig | MLAConfig | None,
    table_mode: TableMode | str | None,
    max_positions: int | None,
    table_dtype: torch.dtype,
) -> nn.Module:
    if module is not None:
        if scheme is not None or params or config is not None:
            raise ConfigError("pass either a built module or a scheme name (with params, config), not both.")
        if table_mode is not None or max_positions is not None or table_dtype != torch.float32:
            raise ConfigError(
                "table_mode, max_positions and table_dtype belong to building a scheme; a built module already "
                "fixed them. Build it with them (build_scheme / AttentionBlock) and pass only the module."
            )
        if not isinstance(module, (AttentionBlock, MLABlock, PositionalScheme)):
            raise ExportError(
                f"export_onnx exports an AttentionBlock, MLABlock or PositionalScheme, got {type(module).__name__}."
            )
        return copy.deepcopy(module)
    if scheme is None:
        raise ConfigError("give a scheme name (see `posenc list`) or a built module.")
    spec = get_spec(scheme)
    if unit.export_name not in spec.exports:
        raise ExportError(
            f"scheme {scheme!r} cannot be exported as unit {unit.value!r}; it supports {sorted(spec.exports)}."
        )
    config = config or AttentionConfig()
    if unit is UnitKind.BLOCK:
        return build_block(config, scheme, params, table_mode, max_positions, table_dtype)
    if isinstance(config, MLAConfig):
        if unit is UnitKind.BLOCK_INPLACE:
            raise ConfigError("an MLA block keeps its concatenated cache; export it with kv_cache='concat'.")
        config = rotary_geometry(config)  # the op of an MLA geometry rotates its rope slice
    if unit is UnitKind.BLOCK_INPLACE:
        return AttentionBlock(config, scheme, params, table_mode, max_positions, table_dtype)
    return build_scheme(scheme, config, params, table_mode, max_positions, table_dtype)


def export_onnx(
    path: str | os.PathLike[str],
    scheme: str | None = None,
    *,
    unit: str = "block",
    kv_cache: str = "concat",
    params: Mapping[str, Any] | None = None,
    config: AttentionConfig | MLAConfig | None = None,
    table_mode: TableMode | str | None = None,
    dtype: str | torch.dtype = "float32",
    opset: int | None = None,
    max_positions: int | None = None,
    table_dtype: torch.dtype = torch.float32,
    module: nn.Module | None = None,
    optimize: bool = True,
    seed: int = 0,
    provenance: WeightsSource | None = None,
    position_guard: bool = True,
    cache_capacity: int | None = None,
) -> ExportResult:
    """Export a scheme's positional op or a whole :class:`AttentionBlock` to ONNX, with manifest and weights.

    Args:
        path: the ONNX file to write; ``<stem>.manifest.json`` and ``<stem>.weights.safetensors`` go beside it.
        scheme: registered scheme name (see ``posenc list``); or give ``module``.
        unit: ``"block"`` (AttentionBlock), ``"op"`` (the scheme's op alone) or ``"op-3d"`` (a rotary op on
            the projection layout ``[B, S, H*D]``), see :mod:`posenc.export.units`.
        kv_cache: the block's cache: ``concat`` (past in, past + new out) or ``inplace`` (a preallocated cache
            written in place, unit ``block-inplace``: opset 24).
        params: scheme parameter overrides.
        config: attention geometry (default :class:`AttentionConfig()`; an :class:`~posenc.blocks.mla.MLAConfig` exports
            an :class:`~posenc.blocks.mla.MLABlock`, or its rope slice as the op).
        table_mode: ``precomputed`` (tables of ``max_positions`` rows as initializers) or ``dynamic``
            (tables computed in the graph from position ids); default: ``precomputed`` where the scheme has it.
        dtype: fp32 / fp16 / bf16: weights and activation inputs; position tables stay ``table_dtype``.
        opset: 23 (default; 24 for the in-place cache), 24, 18 or 17.
        max_positions: rows of precomputed tables (default ``config.max_position_embeddings``).
        table_dtype: dtype of position tables (float32; float16 only to measure what it costs).
        module: an already built (e.g. trained) AttentionBlock or PositionalScheme instead of a name.
        optimize: run the onnxscript optimizer on the graph.
        seed: seed of the fresh random weights of a block or scheme built from a name (recorded in the manifest).
        provenance: where ``module``'s weights came from, recorded as the manifest's ``weights.source`` (e.g.
            :meth:`posenc.checkpoints.LoadedLayer.provenance`); default :class:`~posenc.provenance.ModuleWeights`.
        position_guard: guard the graph's positions (:func:`posenc.functional.position_guard`): a position
            outside the table (or negative) makes ONNX Runtime raise and TensorRT return NaN, never a plausible
            number. ``False`` leaves it out (measure what it costs with ``posenc bench --no-position-guard``);
            recorded in the manifest.
        cache_capacity: slots of the in-place cache (``kv_cache="inplace"``), independent of the table's length:
            a 131072-position model served 8192 tokens at a time needs 8192 slots, not 131072 (default: the
            table's length).

    Returns:
        :class:`ExportResult` with the written paths and the manifest.

    Raises:
        ExportError: unsupported opset, dtype, unit, or a tracing/conversion failure. Nothing is
            written unless all three files are complete.
        ConfigError: invalid scheme parameters, geometry or table mode.

    Example::

        result = export_onnx("rope.onnx", "rope_yarn", params={"factor": 8.0}, table_mode="dynamic", dtype="fp16")
        print(result.manifest.inputs)
    """
    path = output_path(path, "ONNX model")  # before any work: a folder, device or FIFO is refused here
    prepared = prepare_export(
        scheme,
        unit=unit,
        kv_cache=kv_cache,
        params=params,
        config=config,
        table_mode=table_mode,
        dtype=dtype,
        opset=opset,
        max_positions=max_positions,
        table_dtype=table_dtype,
        module=module,
        optimize=optimize,
        seed=seed,
        provenance=provenance,
        position_guard=position_guard,
        cache_capacity=cache_capacity,
    )
    return _write_artifacts(Path(path), prepared)


def prepare_export(
    scheme: str | None = None,
    *,
    unit: str = "block",
    kv_cache: str = "concat",
    params: Mapping[str, Any] | None = None,
    config: AttentionConfig | MLAConfig | None = None,
    table_mode: TableMode | str | None = None,
    dtype: str | torch.dtype = "float32",
    opset: int | None = None,
    max_positions: int | None = None,
    table_dtype: torch.dtype = torch.float32,
    module: nn.Module | None = None,
    optimize: bool = True,
    seed: int = 0,
    provenance: WeightsSource | None = None,
    position_guard: bool = True,
    cache_capacity: int | None = None,
) -> PreparedExport:
    """The graph :func:`export_onnx` writes, not yet written (arguments as there): for writers that store several
    graphs' tensors together (:mod:`posenc.export.layers`)."""
    kind = UnitKind.parse(unit, kv_cache)  # the one place a unit's name is read
    opset = check_opset(default_opset(kind) if opset is None else opset)
    check_unit_opset(kind, opset)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be an int >= 0, got {seed!r}.")
    if not isinstance(position_guard, bool):
        raise ConfigError(f"position_guard must be True or False, got {position_guard!r}.")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inner = _build_inner(kind, scheme, module, params, config, table_mode, max_positions, table_dtype)
    source = _weights_source(module, seed, provenance)
    scheme_module = inner.scheme if isinstance(inner, (AttentionBlock, MLABlock)) else inner
    if not isinstance(scheme_module, PositionalScheme):
        raise ExportError(f"cannot export {type(inner).__name__}: pass a positional scheme or a block.")
    spec = scheme_module.spec
    dtype = check_dtype(dtype, spec.name)
    activation = torch_dtype(dtype)
    inner = inner.to(activation).eval()
    for parameter in inner.parameters():
        parameter.requires_grad_(False)
    check_exportable(inner, activation, provenance)
    export_unit = make_unit(inner, kind, activation, check_cache_capacity(cache_capacity, kind))
    scheme_module = export_unit.scheme
    scheme_module.guard_exported = position_guard
    limit = scheme_module.position_limit
    sample = export_unit.sample_inputs(SAMPLE_SHAPE, position_limit=limit)
    model, notes = to_onnx_model(
        export_unit.module,
        sample,
        input_names=export_unit.input_names,
        output_names=export_unit.output_names,
        dynamic_shapes=export_unit.dynamic_shapes(),
        dim_names=export_unit.dynamic_shapes(names=True),
        opset=opset,
        optimize=optimize,
    )
    return PreparedExport(model, export_unit, notes, opset, source)


def _weights_source(module: nn.Module | None, seed: int, provenance: WeightsSource | None) -> WeightsSource:
    """The manifest's ``weights.source``: checkpoint provenance, the random seed, or the caller's module."""
    if provenance is not None:
        if module is None:
            raise ConfigError("provenance describes a built module's weights; pass it together with module=.")
        return provenance
    if module is None:
        return RandomWeights(seed)
    return ModuleWeights(f"{type(module).__module__}.{type(module).__qualname__}")


def _write_artifacts(path: Path, prepared: PreparedExport) -> ExportResult:
    manifest_path, weights_path = manifest_path_for(path), weights_path_for(path)
    model = prepared.model
    with atomic_outputs(path, weights_path, manifest_path) as (tmp_model, tmp_weights, tmp_manifest):
        # every tensor once: in the weights file, which the graph reads as its external data
        write_linked(model, prepared.unit.inner.state_dict(), tmp_weights, weights_path.name)
        data = model.SerializeToString()
        tmp_model.write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        manifest = export_manifest(prepared, digest, weights_path, tmp_weights)
        manifest.save(tmp_manifest)
    return ExportResult(path, manifest, manifest_path, weights_path)


__all__ = ["ExportResult", "export_onnx", "prepare_export"]
