"""What an export refuses before it traces: dtypes a scheme lacks, an in-place cache's capacity, more tensors than one
ONNX file holds, and tables or checkpoint weights that are not finite in the graph's dtypes."""

from __future__ import annotations

import torch
from torch import nn

from posenc.dtypes import dtype_name
from posenc.errors import ConfigError, ExportError
from posenc.export.kinds import UnitKind
from posenc.provenance import CheckpointWeights, WeightsSource
from posenc.schemes import get_spec
from posenc.schemes.base import table_keys
from posenc.schemes.registry import check_finite_tables

EXPORT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")


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


def check_cache_capacity(capacity: int | None, unit: UnitKind) -> int | None:
    """Slots of an in-place cache (None: the table's length); refused for another unit or below 1."""
    if capacity is None:
        return None
    if unit is not UnitKind.BLOCK_INPLACE:
        raise ConfigError(
            "cache_capacity sizes the in-place cache; export with kv_cache='inplace' (--kv-cache inplace)."
        )
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ConfigError(f"cache_capacity must be an int >= 1 (cache slots), got {capacity!r}.")
    return capacity


ONNX_FILE_LIMIT = 2**31 - (1 << 24)
"""Largest graph posenc writes as one file: protobuf's 2 GiB limit, less room for the graph itself."""


def check_exportable(inner: nn.Module, activation: torch.dtype, provenance: WeightsSource | None = None) -> None:
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


__all__ = ["EXPORT_DTYPES", "ONNX_FILE_LIMIT", "check_cache_capacity", "check_dtype", "check_exportable"]
