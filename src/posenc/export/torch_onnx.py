"""Generic torch -> ONNX: any module to an in-memory ``onnx.ModelProto`` (:func:`to_onnx_model`) or an ONNX file
without manifest (:func:`export_module`), and the opsets posenc exports.

The path: ``torch.export`` (dynamic dims) -> complex-to-real rewrite when needed (:mod:`posenc.export.complex`) ->
``torch.onnx.export(dynamo=True)`` with posenc's translations (exact Python scalars, the in-place cache write as
``TensorScatter``) -> the opset converter below 18 -> graph inputs no node reads removed -> ``onnx.checker``.
Nothing here knows schemes, blocks or manifests (:mod:`posenc.export.exporter` does).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posenc.artifacts.files import atomic_outputs
from posenc.errors import ExportError, PosencError
from posenc.export.complex import realify_complex
from posenc.export.kinds import UnitKind
from posenc.export.onnx_registry import reused_translation_registry

SUPPORTED_OPSETS: tuple[int, ...] = (17, 18, 23, 24)
DEFAULT_OPSET = 23
INPLACE_OPSET = 24
"""The in-place cache writes with ``TensorScatter``, an opset-24 op: ``block-inplace`` graphs need opset 24."""
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


def check_opset(opset: int) -> int:
    """The opset as an int; anything but 17, 18, 23, 24 raises :class:`ExportError`."""
    if isinstance(opset, bool) or not isinstance(opset, int) or opset not in SUPPORTED_OPSETS:
        raise ExportError(
            f"opset {opset!r} is not supported; use one of {list(SUPPORTED_OPSETS)} (23 has the standard "
            f"RotaryEmbedding and Attention ops, 24 adds TensorScatter for the in-place cache; 17/18 are for older "
            f"runtimes)."
        )
    return opset


def default_opset(unit: UnitKind) -> int:
    """The opset a unit is exported with unless one is given: 24 for ``block-inplace``, else 23."""
    return INPLACE_OPSET if unit is UnitKind.BLOCK_INPLACE else DEFAULT_OPSET


def check_unit_opset(unit: UnitKind, opset: int) -> None:
    """Refuse an in-place block below opset 24 (:class:`ExportError` naming the opset it needs)."""
    if unit is UnitKind.BLOCK_INPLACE and opset < INPLACE_OPSET:
        raise ExportError(
            f"the in-place cache writes its new slots with TensorScatter, an opset-{INPLACE_OPSET} op; export "
            f"--kv-cache inplace with --opset {INPLACE_OPSET} (opset {opset} has no in-place write)."
        )


# --------------------------------------------------------------------------------------------------
# Quiet torch.onnx
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
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


def _tensor_scatter_ring(cache, new, past_length):
    """``posenc::write_ring`` (:func:`posenc.functional.write_cache` with ``ring=True``) as ONNX ``TensorScatter``
    (opset 24) in ``circular`` mode: the new slots at ``past_length`` modulo the cache's ``C`` slots."""
    import onnxscript

    return onnxscript.values.Opset("", INPLACE_OPSET).TensorScatter(cache, new, past_length, axis=2, mode="circular")


def _translation_table() -> dict[Any, Any]:
    import posenc.functional  # noqa: F401 (registers posenc::write_cache)

    return {
        torch.ops.aten.scalar_tensor.default: _exact_scalar_tensor,
        torch.ops.posenc.write_cache.default: _tensor_scatter,
        torch.ops.posenc.write_ring.default: _tensor_scatter_ring,
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
    deferred_guards: bool = False,
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
        deferred_guards: torch.export's ``prefer_deferred_runtime_asserts_over_guards``: a guard on the dynamic
            lengths it cannot prove becomes a runtime assert instead of a refusal (the traced path's last resort).

    Returns:
        ``(model proto, notes)``; graph inputs that no node reads are removed.

    Raises:
        ExportError: tracing or conversion failed (the message carries torch's reason).
    """
    import onnx

    opset = check_opset(opset)
    notes: list[str] = []
    shapes = tuple(dynamic_shapes) if dynamic_shapes is not None else None
    with quiet_exporter(), torch.no_grad(), reused_translation_registry():
        try:
            program = torch.export.export(
                module,
                tuple(args),
                dynamic_shapes=shapes,
                strict=False,
                prefer_deferred_runtime_asserts_over_guards=deferred_guards,
            )
        except PosencError:
            raise
        except Exception as exc:
            raise ExportError(f"torch.export could not trace {type(module).__name__}: {first_line(exc)}") from exc
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
            raise ExportError(f"torch.onnx.export failed: {first_line(exc)}") from exc
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
        raise ExportError(f"the exported graph is not valid ONNX: {first_line(exc)}") from exc
    return model, notes


def first_line(exc: BaseException) -> str:
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
            f"converting the graph to opset {opset} failed: {first_line(exc)}; use opset 18 or 23."
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
            f"the graph converted to opset {opset} is not valid: {first_line(exc)}; use 18 or 23."
        ) from exc
    return converted


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


__all__ = [
    "DEFAULT_OPSET",
    "INPLACE_OPSET",
    "SUPPORTED_OPSETS",
    "check_opset",
    "check_unit_opset",
    "default_opset",
    "export_module",
    "first_line",
    "quiet_exporter",
    "to_onnx_model",
]
