"""torch -> ONNX for schemes and attention blocks: ``torch.onnx.export(dynamo=True)`` plus a manifest.

The path of one export::

    module (.to(dtype), tables stay float32) -> torch.export (dynamic batch/seq/past, samples >= 2)
      -> complex-to-real rewrite when needed (posenc.export.complex)
      -> torch.onnx.export(dynamo=True, opset 23 | 24 | 18 | 17) -> drop unread inputs
      -> model.onnx + model.weights.safetensors + model.manifest.json, written atomically together

Weights are never silently random: the manifest's ``weights.source`` says where they came from (a checkpoint's
layer with every tensor's name and sha256, ``random`` with the seed, or a module the caller built).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as _dt
import hashlib
import inspect
import logging
import os
import platform
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posenc.artifacts.files import (
    atomic_outputs,
    manifest_path_for,
    sha256_file,
    weights_path_for,
)
from posenc.artifacts.paths import output_path
from posenc.blocks import AttentionBlock, MLABlock, MLAConfig, build_block, rotary_geometry
from posenc.config import AttentionConfig
from posenc.dtypes import dtype_name, torch_dtype
from posenc.errors import ConfigError, ExportError, PosencError
from posenc.export.complex import realify_complex
from posenc.export.external import LINKED_WEIGHTS_FORMAT, write_linked
from posenc.export.manifest import DimRange, Manifest, SourceRecord, TensorSpec, WeightsRecord
from posenc.export.units import (
    ALL_UNITS,
    BLOCK_INPLACE,
    SAMPLE_SHAPE,
    ExportUnit,
    make_unit,
    unit_for_cache,
)
from posenc.provenance import CheckpointWeights, ModuleWeights, RandomWeights, WeightsSource
from posenc.records import to_json
from posenc.schemes import build_scheme, get_spec
from posenc.schemes.base import PositionalScheme, TableMode, table_keys
from posenc.schemes.registry import check_finite_tables

SUPPORTED_OPSETS: tuple[int, ...] = (17, 18, 23, 24)
DEFAULT_OPSET = 23
INPLACE_OPSET = 24
"""The in-place cache writes with ``TensorScatter``, an opset-24 op: ``block-inplace`` graphs need opset 24."""
EXPORT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")

_ONNX_ELEM_TYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64", 7: "int64", 6: "int32", 9: "bool"}
_REDUCE_OPS_WITH_AXES_ATTRIBUTE_BEFORE_18 = {
    "ReduceMax",
    "ReduceMin",
    "ReduceMean",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
}


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
# Option checks
# --------------------------------------------------------------------------------------------------


def check_opset(opset: int) -> int:
    """The opset as an int; anything but 17, 18, 23, 24 raises :class:`ExportError`."""
    if isinstance(opset, bool) or not isinstance(opset, int) or opset not in SUPPORTED_OPSETS:
        raise ExportError(
            f"opset {opset!r} is not supported; use one of {list(SUPPORTED_OPSETS)} (23 has the standard "
            f"RotaryEmbedding and Attention ops, 24 adds TensorScatter for the in-place cache; 17/18 are for older "
            f"runtimes)."
        )
    return opset


def default_opset(unit: str) -> int:
    """The opset a unit is exported with unless one is given: 24 for ``block-inplace``, else 23."""
    return INPLACE_OPSET if unit == BLOCK_INPLACE else DEFAULT_OPSET


def _check_unit_opset(unit: str, opset: int) -> None:
    if unit == BLOCK_INPLACE and opset < INPLACE_OPSET:
        raise ExportError(
            f"the in-place cache writes its new slots with TensorScatter, an opset-{INPLACE_OPSET} op; export "
            f"--kv-cache inplace with --opset {INPLACE_OPSET} (opset {opset} has no in-place write)."
        )


def check_dtype(dtype: str | torch.dtype, scheme: str | None = None) -> str:
    """Canonical export dtype; raises :class:`ExportError` for dtypes the scheme (or export) lacks."""
    try:
        name = dtype_name(dtype)
    except ConfigError as exc:
        raise ExportError(str(exc)) from None
    if name not in EXPORT_DTYPES:
        raise ExportError(f"dtype {name} cannot be exported; use one of fp32, fp16, bf16.")
    if scheme is not None:
        spec = get_spec(scheme)
        if name not in spec.tolerances:
            raise ExportError(
                f"scheme {scheme!r} does not support dtype {name}; it supports {sorted(spec.tolerances)}. "
                f"Export with --dtype one of those."
            )
    return name


# --------------------------------------------------------------------------------------------------
# Quiet torch.onnx
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence torch.onnx's progress prints, warnings and optional-package log lines."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


# --------------------------------------------------------------------------------------------------
# Exact Python scalars
# --------------------------------------------------------------------------------------------------


def _exact_scalar_tensor(s: float, dtype: int = 1, layout: str = "", device: str = "", pin_memory: bool = False):
    """``aten.scalar_tensor`` as an ONNX constant holding ``s`` exactly in ``dtype``.

    torch.onnx (2.13) turns the Python scalar of ``x / (2 * math.pi)`` or ``x * 2.7`` into a float32
    constant before casting it to ``x``'s dtype, so float64 graph arithmetic (dynamic NTK's in-graph
    frequencies and their split for exact angles) silently uses float32-rounded constants: 2π becomes
    6.28318548, an angle error of ~4e-3 rad at position 131072. This translation keeps the value.
    """
    import numpy as np
    import onnx
    import onnx_ir as ir
    from onnxscript import opset18 as op

    element = onnx.TensorProto.FLOAT if dtype in (-1, None) else int(dtype)
    value = np.array(s, dtype=onnx.helper.tensor_dtype_to_np_dtype(element))
    return op.Constant(value=ir.tensor(value))  # type: ignore[arg-type]  # onnxscript takes onnx_ir tensors too


def _tensor_scatter(cache, new, past_length):
    """``posenc::write_cache`` (:func:`posenc.functional.write_cache`) as ONNX ``TensorScatter`` (opset 24): the new
    slots along the sequence axis of ``[B, Hkv, C, D]``, at ``past_length [B]`` per row."""
    import onnxscript

    return onnxscript.values.Opset("", INPLACE_OPSET).TensorScatter(cache, new, past_length, axis=2)


def _translation_table() -> dict[Any, Any]:
    import posenc.functional  # noqa: F401 (registers posenc::write_cache)

    return {
        torch.ops.aten.scalar_tensor.default: _exact_scalar_tensor,
        torch.ops.posenc.write_cache.default: _tensor_scatter,
    }


# --------------------------------------------------------------------------------------------------
# Generic module -> ONNX model
# --------------------------------------------------------------------------------------------------


def to_onnx_model(
    module: nn.Module,
    args: Sequence[torch.Tensor],
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_shapes: Sequence[Mapping[int, Any]] | None,
    dim_names: Sequence[Mapping[int, str]] | None = None,
    opset: int = DEFAULT_OPSET,
    optimize: bool = True,
) -> tuple[Any, list[str]]:
    """Export ``module`` to an in-memory ``onnx.ModelProto`` (no files written).

    Args:
        module: any module; complex-number code is rewritten into real arithmetic.
        args: positional sample inputs.
        input_names, output_names: graph value names.
        dynamic_shapes: per input ``{axis: torch.export.Dim}`` (or None for static shapes).
        dim_names: per input ``{axis: name}``: the dim names written into the graph.
        opset: 23, 18 or 17.
        optimize: run the onnxscript optimizer (constant folding, dead code removal).

    Returns:
        ``(model proto, notes)``; graph inputs that no node reads are removed.

    Raises:
        ExportError: tracing or conversion failed (the message carries torch's reason).
    """
    import onnx

    opset = check_opset(opset)
    notes: list[str] = []
    shapes = tuple(dynamic_shapes) if dynamic_shapes is not None else None
    with _quiet_exporter(), torch.no_grad():
        try:
            program = torch.export.export(module, tuple(args), dynamic_shapes=shapes, strict=False)
        except PosencError:
            raise
        except Exception as exc:
            raise ExportError(f"torch.export could not trace {type(module).__name__}: {_first_line(exc)}") from exc
        rewritten = realify_complex(program, args, shapes)
        if rewritten is not program:
            notes.append("complex-number ops were rewritten into real arithmetic (posenc.export.complex)")
        try:
            onnx_program = torch.onnx.export(
                rewritten,
                tuple(args),
                dynamo=True,
                opset_version=max(opset, 18),
                input_names=list(input_names),
                output_names=list(output_names),
                dynamic_shapes=tuple(dim_names) if dim_names is not None else None,
                custom_translation_table=_translation_table(),
                optimize=optimize,
                verbose=False,
            )
        except Exception as exc:
            raise ExportError(f"torch.onnx.export failed: {_first_line(exc)}") from exc
    if onnx_program is None:
        raise ExportError("torch.onnx.export returned no program; report this with the command that caused it.")
    model = onnx_program.model_proto
    if opset < 18:
        model = _downgrade_opset(model, opset)
        notes.append(f"converted from opset 18 to {opset} with onnx.version_converter")
    _drop_unread_inputs(model)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"the exported graph is not valid ONNX: {_first_line(exc)}") from exc
    return model, notes


def _first_line(exc: BaseException) -> str:
    """The start of an exception's message: its first three non-empty lines, at most 500 characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    return " ".join(lines[:3])[:500]


def _drop_unread_inputs(model: Any) -> None:
    """Remove graph inputs that no node reads (e.g. q and k of a position-only bias)."""
    read = {name for node in model.graph.node for name in node.input}
    read |= {out.name for out in model.graph.output}
    keep = [value for value in model.graph.input if value.name in read]
    if len(keep) != len(model.graph.input):
        del model.graph.input[:]
        model.graph.input.extend(keep)


def _downgrade_opset(model: Any, opset: int) -> Any:
    """Convert an opset-18 model to ``opset``; fix Reduce* nodes the converter leaves invalid."""
    import onnx
    from onnx import helper, numpy_helper, version_converter

    try:
        converted = version_converter.convert_version(model, opset)
    except Exception as exc:
        raise ExportError(
            f"converting the graph to opset {opset} failed: {_first_line(exc)}; use opset 18 or 23."
        ) from exc
    constants = {init.name: numpy_helper.to_array(init) for init in converted.graph.initializer}
    for node in converted.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    constants[node.output[0]] = numpy_helper.to_array(attr.t)
    for node in converted.graph.node:
        if node.op_type not in _REDUCE_OPS_WITH_AXES_ATTRIBUTE_BEFORE_18 or node.domain not in ("", "ai.onnx"):
            continue
        noop = [a for a in node.attribute if a.name == "noop_with_empty_axes"]
        for attr in noop:
            if attr.i:
                raise ExportError(
                    f"{node.op_type} with noop_with_empty_axes=1 has no opset-{opset} form; use opset 18."
                )
            node.attribute.remove(attr)
        if len(node.input) > 1 and node.input[1]:
            if node.input[1] not in constants:
                raise ExportError(f"{node.op_type} has computed axes, which opset {opset} cannot express; use 18.")
            axes = [int(a) for a in constants[node.input[1]].reshape(-1)]
            del node.input[1:]
            node.attribute.append(helper.make_attribute("axes", axes))
    try:
        onnx.checker.check_model(converted)
    except onnx.checker.ValidationError as exc:
        raise ExportError(
            f"the graph converted to opset {opset} is not valid: {_first_line(exc)}; use 18 or 23."
        ) from exc
    return converted


# --------------------------------------------------------------------------------------------------
# Scheme / block export with manifest
# --------------------------------------------------------------------------------------------------


def _build_inner(
    unit: str,
    scheme: str | None,
    module: nn.Module | None,
    params: Mapping[str, Any] | None,
    config: AttentionConfig | MLAConfig | None,
    table_mode: TableMode | str | None,
    max_positions: int | None,
    table_dtype: torch.dtype,
) -> nn.Module:
    if unit not in ALL_UNITS:
        raise ExportError(f"unknown export unit {unit!r}; use one of {list(ALL_UNITS)}.")
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
    if {"op-3d": "op", BLOCK_INPLACE: "block"}.get(unit, unit) not in spec.exports:
        raise ExportError(f"scheme {scheme!r} cannot be exported as unit {unit!r}; it supports {sorted(spec.exports)}.")
    config = config or AttentionConfig()
    if unit == "block":
        return build_block(config, scheme, params, table_mode, max_positions, table_dtype)
    if isinstance(config, MLAConfig):
        if unit == BLOCK_INPLACE:
            raise ConfigError("an MLA block keeps its concatenated cache; export it with kv_cache='concat'.")
        config = rotary_geometry(config)  # the op of an MLA geometry rotates its rope slice
    if unit == BLOCK_INPLACE:
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


@dataclasses.dataclass
class PreparedExport:
    """An exported graph before it is written: the ``onnx.ModelProto`` (tensors inside), the unit it came from, the
    exporter's notes, the opset and where the weights came from (see :func:`prepare_export`)."""

    model: Any
    unit: ExportUnit
    notes: list[str]
    opset: int
    source: WeightsSource


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
    unit = unit_for_cache(unit, kv_cache)
    opset = check_opset(default_opset(unit) if opset is None else opset)
    _check_unit_opset(unit, opset)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be an int >= 0, got {seed!r}.")
    if not isinstance(position_guard, bool):
        raise ConfigError(f"position_guard must be True or False, got {position_guard!r}.")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inner = _build_inner(unit, scheme, module, params, config, table_mode, max_positions, table_dtype)
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
    _check_exportable(inner, activation, provenance)
    export_unit = make_unit(inner, unit, activation, _cache_capacity(cache_capacity, unit))
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


def _cache_capacity(capacity: int | None, unit: str) -> int | None:
    if capacity is None:
        return None
    if unit != BLOCK_INPLACE:
        raise ConfigError(
            "cache_capacity sizes the in-place cache; export with kv_cache='inplace' (--kv-cache inplace)."
        )
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ConfigError(f"cache_capacity must be an int >= 1 (cache slots), got {capacity!r}.")
    return capacity


ONNX_FILE_LIMIT = 2**31 - (1 << 24)
"""Largest graph posenc writes as one file: protobuf's 2 GiB limit, less room for the graph itself."""


def _check_exportable(inner: nn.Module, activation: torch.dtype, provenance: WeightsSource | None = None) -> None:
    """Refuse before tracing what cannot give a usable graph: more than 2 GiB of tensors, or values that are not
    finite (or overflow the activation dtype for any input of magnitude 1) once cast to the graph's dtypes.

    Raises:
        ExportError: the tensors exceed ONNX's single-file limit.
        ConfigError: a table or weight is not finite in its dtype, or a table's values exceed what the activation
            dtype holds (e.g. rope_longrope with attention_factor 500000 in fp16).
    """
    from posenc.artifacts.memory import human_bytes

    tensors = [*inner.named_buffers(), *inner.named_parameters()]
    total = sum(t.numel() * t.element_size() for _, t in tensors)
    if total > ONNX_FILE_LIMIT:
        raise ExportError(
            f"the graph would hold {human_bytes(total)} ({total:,} bytes) of tables and weights, over ONNX's 2 GiB "
            f"single-file limit; export with --table-mode dynamic or fewer --max-positions."
        )
    if isinstance(provenance, CheckpointWeights):
        _check_checkpoint_weights(inner, activation, provenance)
    check_finite_tables(inner)
    largest = torch.finfo(activation).max
    tables = table_keys(inner)
    for key, tensor in tensors:
        if key in tables and tensor.is_floating_point() and tensor.numel():
            peak = float(tensor.detach().abs().max())
            if peak > largest:
                raise ConfigError(
                    f"table {key!r} holds values up to {peak:.4g}, beyond {dtype_name(activation)}'s largest "
                    f"number {largest:.4g}: every output it scales would overflow to inf. Export in a wider dtype "
                    f"(--dtype fp32 or bf16), or choose smaller scaling parameters (e.g. attention_factor)."
                )


def _check_checkpoint_weights(inner: nn.Module, activation: torch.dtype, provenance: CheckpointWeights) -> None:
    """Name the checkpoint tensor whose values the graph's dtype cannot hold (a weight of 1e6 in fp16 is inf).

    Raises:
        ConfigError: names the block weight, the checkpoint tensor(s) it came from and the weights file.
    """
    tables = table_keys(inner)
    for key, tensor in inner.named_parameters():
        if key in tables or not tensor.is_floating_point() or not tensor.numel():
            continue
        if bool(torch.isfinite(tensor).all()):
            continue
        stem = key.removesuffix(".T")
        sources = [name for name in provenance.tensors if name.endswith(stem)] or list(provenance.tensors)
        where = provenance.checkpoint + (f"/{provenance.weights_file}" if provenance.weights_file else "")
        raise ConfigError(
            f"weight {key!r} of the checkpoint's layer (checkpoint tensor {', '.join(sources[:3])} in {where}) is not "
            f"finite in {dtype_name(activation)}: the checkpoint's values exceed what {dtype_name(activation)} holds "
            f"(largest {torch.finfo(activation).max:.4g}). Export in a wider dtype (--dtype bf16 or fp32)."
        )


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


def _graph_specs(values: Any, layouts: Mapping[str, tuple[Any, str, str]], role_default: str) -> tuple[TensorSpec, ...]:
    specs = []
    for value in values:
        tensor_type = value.type.tensor_type
        shape = tuple(d.dim_param if d.dim_param else int(d.dim_value) for d in tensor_type.shape.dim)
        _, layout, role = layouts.get(value.name, (None, "", role_default))
        dtype = _ONNX_ELEM_TYPES.get(tensor_type.elem_type, "unknown")
        specs.append(TensorSpec(value.name, dtype, shape, layout, role))
    return tuple(specs)


def _served(unit: ExportUnit, table_limit: int | None) -> int | None:
    """New tokens a call may bring at most: the table's length, and an in-place cache's capacity."""
    if unit.unit != BLOCK_INPLACE:
        return table_limit
    capacity = next(int(s.shape[2]) for s in unit.slots if s.name == "key_cache")
    return capacity if table_limit is None else min(capacity, table_limit)


def _dim_ranges(unit: ExportUnit, limit: int | None) -> dict[str, DimRange]:
    used = {d for slot in unit.slots for d in slot.shape if isinstance(d, str)}
    ranges = {
        "batch": DimRange(1, None, SAMPLE_SHAPE.batch),
        "seq": DimRange(1, limit, SAMPLE_SHAPE.seq),
        "past": DimRange(0, None if limit is None else limit - 1, SAMPLE_SHAPE.past),
        "kv_seq": DimRange(1, limit, SAMPLE_SHAPE.kv_seq),
    }
    return {name: r for name, r in ranges.items() if name in used}


def export_manifest(prepared: PreparedExport, onnx_sha: str, weights_path: Path, tmp_weights: Path) -> Manifest:
    """The manifest of a prepared graph whose bytes hash to ``onnx_sha``, its weights file written at
    ``tmp_weights`` (hashed) under the final name ``weights_path``."""
    model, unit, notes, opset, source = prepared.model, prepared.unit, prepared.notes, prepared.opset, prepared.source
    scheme = unit.scheme
    spec = scheme.spec
    layouts = unit.input_layouts()
    out_layouts = {name: (None, layout, "output") for name, layout in unit.outputs}
    graph_inputs = {v.name for v in model.graph.input}
    dropped = [name for name in unit.input_names if name not in graph_inputs]
    if dropped:
        notes = [*notes, f"inputs {dropped} are not read by {spec.name} and were removed from the graph"]
    return Manifest(
        scheme=spec.name,
        family=spec.family,
        placement=scheme.placement.value,
        params=to_json(dict(scheme.params)),
        unit=unit.unit,
        table_mode=scheme.table_mode.value,
        dtype=dtype_name(unit.dtype),
        table_dtype=dtype_name(scheme.table_dtype),
        opset=opset,
        attention=unit.config.to_dict(),
        max_positions=scheme.position_limit,
        build_max_positions=int(scheme.max_positions),
        dynamic_dims=_dim_ranges(unit, _served(unit, scheme.position_limit)),
        inputs=_graph_specs(model.graph.input, layouts, "activation"),
        outputs=_graph_specs(model.graph.output, out_layouts, "output"),
        onnx_sha256=onnx_sha,
        weights=WeightsRecord(
            path=weights_path.name,
            sha256=sha256_file(tmp_weights),
            format=LINKED_WEIGHTS_FORMAT,
            tables=tuple(sorted(table_keys(unit.inner))),
            source=source,
        ),
        source=_source_info(unit.inner),
        versions=library_versions(),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        notes=tuple(notes),
        position_guard=bool(scheme.guard_exported),
    )


def _source_info(inner: nn.Module) -> SourceRecord:
    import posenc

    root = Path(posenc.__file__).parent
    classes = {type(m) for m in inner.modules()}
    files = {root / "functional.py", root / "blocks.py", root / "schemes" / "base.py"}
    for cls in classes:
        with contextlib.suppress(TypeError, OSError):
            source = Path(inspect.getsourcefile(cls) or "")
            if root in source.parents:
                files.add(source)
    digest = hashlib.sha256()
    names = []
    for file in sorted(files):
        if file.exists():
            names.append(str(file.relative_to(root)))
            digest.update(file.read_bytes())
    cls = type(inner)
    return SourceRecord(f"{cls.__module__}.{cls.__qualname__}", digest.hexdigest(), tuple(names))


def library_versions() -> dict[str, str]:
    """Versions of the libraries that shape an exported graph (absent ones are left out)."""
    import importlib.metadata

    import posenc

    versions = {"posenc": posenc.__version__, "python": platform.python_version(), "torch": torch.__version__}
    for package in ("onnx", "onnxruntime", "onnxscript", "onnx-ir", "polygraphy"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return versions


def export_module(
    module: nn.Module,
    args: Sequence[torch.Tensor],
    path: str | os.PathLike[str],
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_dims: Sequence[Mapping[int, str]] | None = None,
    opset: int = DEFAULT_OPSET,
    optimize: bool = True,
) -> Path:
    """Export any module (e.g. a user's complex-number RoPE) to an ONNX file, atomically, without manifest.

    Args:
        module: the module; complex-number code is rewritten into real arithmetic.
        args: positional sample inputs (use sizes >= 2 on dynamic axes).
        path: the ONNX file.
        input_names, output_names: graph value names.
        dynamic_dims: per input ``{axis: dim name}``; equal names share one dimension (min size 1).
        opset: 23, 18 or 17.

    Returns:
        ``path``.
    """
    dims: dict[str, Any] = {}
    shapes = None
    if dynamic_dims is not None:
        shapes = [
            {axis: dims.setdefault(name, torch.export.Dim(name, min=1)) for axis, name in spec.items()}
            for spec in dynamic_dims
        ]
    model, _ = to_onnx_model(
        module,
        args,
        input_names=input_names,
        output_names=output_names,
        dynamic_shapes=shapes,
        dim_names=dynamic_dims,
        opset=opset,
        optimize=optimize,
    )
    path = Path(path)
    with atomic_outputs(path) as (temp,):
        temp.write_bytes(model.SerializeToString())
    return path
