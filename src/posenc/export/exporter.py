"""Scheme and block export with a manifest: :func:`export_onnx` writes a built module's graph, weights and manifest;
:func:`export_scheme` builds a scheme's module and calls it.

The path of one export::

    module (a copy, .to(dtype), tables stay float32) -> the unit's wrapper (posenc.export.units)
      -> refusals before tracing (posenc.export.checks)
      -> torch.export + torch.onnx.export(dynamo=True, opset 23 | 24 | 18 | 17) (posenc.export.torch_onnx)
      -> model.onnx + model.weights.safetensors + model.manifest.json (posenc.export.describe), written atomically

Weights are never silently random: the manifest's ``weights.source`` says where they came from (a checkpoint's
layer with every tensor's name and sha256, ``random`` with the seed, or a module the caller built). A checkpoint's
layer exported as the model calls it (the traced path) goes through :func:`posenc.export.trace.export_traced`.
"""

from __future__ import annotations

import copy as _copy
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
from posenc.export.units import make_unit, op_module
from posenc.provenance import ModuleWeights, RandomWeights, WeightsSource
from posenc.schemes import build_scheme, get_spec
from posenc.schemes.base import PositionalScheme, TableMode

Exportable = AttentionBlock | MLABlock | PositionalScheme
"""What :func:`export_onnx` takes: a block (any unit) or a scheme (its op units)."""


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


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """How a built module becomes a graph: :func:`export_onnx`'s options (documented there), for the writers that
    prepare several graphs with the same ones (:mod:`posenc.export.layers`)."""

    dtype: str | torch.dtype = "float32"
    opset: int | None = None
    optimize: bool = True
    position_guard: bool = True
    cache_capacity: int | None = None


# --------------------------------------------------------------------------------------------------
# The entry point: a built module
# --------------------------------------------------------------------------------------------------


def export_onnx(
    module: Exportable,
    path: str | os.PathLike[str],
    *,
    unit: UnitKind | str = UnitKind.BLOCK,
    dtype: str | torch.dtype = "float32",
    opset: int | None = None,
    optimize: bool = True,
    position_guard: bool = True,
    cache_capacity: int | None = None,
    provenance: WeightsSource | None = None,
    copy: bool = True,
) -> ExportResult:
    """Export a built block or scheme to ONNX, with manifest and weights.

    Args:
        module: an :class:`AttentionBlock` / :class:`~posenc.blocks.mla.MLABlock` (any unit; an op unit exports its
            scheme) or a :class:`PositionalScheme` (op units), e.g. :func:`build_module`'s, a checkpoint layer's
            (:meth:`posenc.checkpoints.LoadedLayer.block`) or a trained one.
        path: the ONNX file to write; ``<stem>.manifest.json`` and ``<stem>.weights.safetensors`` go beside it.
        unit: ``block`` (the block, concatenated cache), ``block-inplace`` (a preallocated cache written in place:
            opset 24), ``op`` (the scheme's op alone) or ``op-3d`` (a rotary op on the projection layout
            ``[B, S, H*D]``): a :class:`~posenc.export.kinds.UnitKind` or its name; see :mod:`posenc.export.units`.
        dtype: fp32 / fp16 / bf16: weights and activation inputs; position tables keep the module's table dtype.
        opset: 23 (default; 24 for the in-place cache), 24, 18 or 17.
        optimize: run the onnxscript optimizer on the graph.
        position_guard: guard the graph's positions (:func:`posenc.functional.position_guard`): a position
            outside the table (or negative) makes ONNX Runtime raise and TensorRT return NaN, never a plausible
            number. ``False`` leaves it out (measure what it costs with ``posenc bench --no-position-guard``);
            recorded in the manifest.
        cache_capacity: slots of the in-place cache (``block-inplace``), independent of the table's length:
            a 131072-position model served 8192 tokens at a time needs 8192 slots, not 131072 (default: the
            table's length).
        provenance: where the weights came from, recorded as the manifest's ``weights.source`` (e.g.
            :meth:`posenc.checkpoints.LoadedLayer.provenance`, or ``RandomWeights(seed)`` for a module built with a
            seed); default :class:`~posenc.provenance.ModuleWeights` (the module's class).
        copy: export a copy and leave ``module`` as it was (default); ``False`` casts and freezes ``module`` itself
            (for a module built for this export alone).

    Returns:
        :class:`ExportResult` with the written paths and the manifest.

    Raises:
        ExportError: unsupported opset, dtype, unit, or a tracing/conversion failure. Nothing is
            written unless all three files are complete.
        ConfigError: invalid options, or tables and weights the graph's dtype cannot hold.

    Example::

        block = build_module("rope_yarn", "block", params={"factor": 8.0}, table_mode="dynamic")
        result = export_onnx(block, "rope.onnx", dtype="fp16")
        print(result.manifest.inputs)
    """
    path = output_path(path, "ONNX model")  # before any work: a folder, device or FIFO is refused here
    options = ExportOptions(dtype, opset, optimize, position_guard, cache_capacity)
    prepared = prepare_export(module, UnitKind.parse(unit), options, provenance=provenance, copy=copy)
    return _write_artifacts(path, prepared)


def prepare_export(
    module: Exportable,
    unit: UnitKind,
    options: ExportOptions = ExportOptions(),
    *,
    provenance: WeightsSource | None = None,
    copy: bool = True,
) -> PreparedExport:
    """The graph :func:`export_onnx` writes, not yet written (arguments as there): for writers that store several
    graphs' tensors together (:mod:`posenc.export.layers`)."""
    opset = check_opset(default_opset(unit) if options.opset is None else options.opset)
    check_unit_opset(unit, opset)
    if not isinstance(options.position_guard, bool):
        raise ConfigError(f"position_guard must be True or False, got {options.position_guard!r}.")
    if not isinstance(module, Exportable):
        raise ExportError(
            f"export_onnx exports an AttentionBlock, MLABlock or PositionalScheme, got {type(module).__name__}."
        )
    capacity = check_cache_capacity(options.cache_capacity, unit)
    inner: nn.Module = module if unit.is_block else op_module(module, unit)
    scheme = module.scheme if isinstance(module, (AttentionBlock, MLABlock)) else module
    activation = torch_dtype(check_dtype(options.dtype, scheme.spec.name))
    if copy:
        inner = _copy.deepcopy(inner)
    inner = inner.to(activation).eval()
    for parameter in inner.parameters():
        parameter.requires_grad_(False)
    check_exportable(inner, activation, provenance)
    export_unit = make_unit(inner, unit, activation, capacity)
    scheme_module = export_unit.scheme
    scheme_module.guard_exported = options.position_guard
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
        optimize=options.optimize,
    )
    source = provenance or ModuleWeights(f"{type(module).__module__}.{type(module).__qualname__}")
    return PreparedExport(model, export_unit, notes, opset, source)


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


# --------------------------------------------------------------------------------------------------
# A scheme by name: build its module, then export_onnx
# --------------------------------------------------------------------------------------------------


def build_module(
    scheme: str,
    unit: UnitKind | str = UnitKind.BLOCK,
    *,
    config: AttentionConfig | MLAConfig | None = None,
    params: Mapping[str, Any] | None = None,
    table_mode: TableMode | str | None = None,
    max_positions: int | None = None,
    table_dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Exportable:
    """The module :func:`export_onnx` exports as ``unit`` for a registered scheme, with seeded random weights.

    Args:
        scheme: registered scheme name (see ``posenc list``).
        unit: as :func:`export_onnx`'s (a name or :class:`~posenc.export.kinds.UnitKind`).
        config: attention geometry (default :class:`AttentionConfig()`; an :class:`~posenc.blocks.mla.MLAConfig`
            builds an :class:`~posenc.blocks.mla.MLABlock`, or its rope slice's scheme for the op).
        params: scheme parameter overrides.
        table_mode: ``precomputed`` (tables of ``max_positions`` rows as initializers) or ``dynamic``
            (tables computed in the graph from position ids); default: ``precomputed`` where the scheme has it.
        max_positions: rows of precomputed tables (default ``config.max_position_embeddings``).
        table_dtype: dtype of position tables (float32; float16 only to measure what it costs).
        seed: seed of the random weights (record it: ``provenance=RandomWeights(seed)``).

    Raises:
        ExportError: the scheme has no such unit.
        ConfigError: invalid scheme parameters, geometry, table mode or seed.
    """
    kind = UnitKind.parse(unit)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be an int >= 0, got {seed!r}.")
    spec = get_spec(scheme)
    if kind.export_name not in spec.exports:
        raise ExportError(
            f"scheme {scheme!r} cannot be exported as unit {kind.value!r}; it supports {sorted(spec.exports)}."
        )
    config = config or AttentionConfig()
    built = (table_mode, max_positions, table_dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind is UnitKind.BLOCK:
            return build_block(config, scheme, params, *built)
        if isinstance(config, MLAConfig):
            if kind is UnitKind.BLOCK_INPLACE:
                raise ConfigError("an MLA block keeps its concatenated cache; export it with kv_cache='concat'.")
            config = rotary_geometry(config)  # the op of an MLA geometry rotates its rope slice
        if kind is UnitKind.BLOCK_INPLACE:
            return AttentionBlock(config, scheme, params, *built)
        return build_scheme(scheme, config, params, *built)


def export_scheme(
    scheme: str,
    path: str | os.PathLike[str],
    *,
    unit: UnitKind | str = UnitKind.BLOCK,
    kv_cache: str = "concat",
    **keywords: Any,
) -> ExportResult:
    """:func:`build_module` then :func:`export_onnx`: a registered scheme's unit with seeded random weights (the
    manifest records the seed).

    ``kv_cache``: the block's cache, ``concat`` or ``inplace`` (unit ``block-inplace``); ``keywords``: those of
    :func:`build_module` (config, params, table_mode, max_positions, table_dtype, seed) and the options of
    :func:`export_onnx` (:class:`ExportOptions`: dtype, opset, optimize, position_guard, cache_capacity).

    Example::

        result = export_scheme("rope_yarn", "rope.onnx", params={"factor": 8.0}, table_mode="dynamic", dtype="fp16")
    """
    path = output_path(path, "ONNX model")  # before any work
    kind = UnitKind.parse(unit, kv_cache)
    options = {name: keywords.pop(name) for name in _OPTION_NAMES if name in keywords}
    module = build_module(scheme, kind, **keywords)
    seed = keywords.get("seed", 0)
    return export_onnx(module, path, unit=kind, provenance=RandomWeights(seed), copy=False, **options)


_OPTION_NAMES = tuple(field.name for field in dataclasses.fields(ExportOptions))


__all__ = [
    "ExportOptions",
    "ExportResult",
    "Exportable",
    "build_module",
    "export_onnx",
    "export_scheme",
    "prepare_export",
]
