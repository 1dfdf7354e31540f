"""The one dtype table: names and aliases, and the torch and numpy dtypes they stand for.

Canonical names are torch's (``float32``, ``float16``, ``bfloat16``, ``float64``, ``int64``); the aliases
``fp32``/``float``, ``fp16``/``half``, ``bf16``, ``fp64``/``double`` and torch dtypes map onto them. numpy has
no bfloat16: ``ml_dtypes`` (a dependency of onnx) provides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from posenc.errors import ConfigError

DTYPE_ALIASES: Mapping[str, str] = {
    "fp32": "float32",
    "float": "float32",
    "float32": "float32",
    "fp16": "float16",
    "half": "float16",
    "float16": "float16",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp64": "float64",
    "float64": "float64",
    "double": "float64",
    "int64": "int64",
}
"""Every accepted spelling -> canonical name (also TensorRT's ``float``/``half``/``bf16`` names)."""

SHORT_NAMES: Mapping[str, str] = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}
"""Canonical name -> the short name reports and Triton signatures use."""

TORCH_DTYPES: Mapping[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
}

try:  # ml_dtypes ships with onnx; it gives numpy a bfloat16 type
    import ml_dtypes

    _BF16: Any = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - onnx depends on ml_dtypes
    _BF16 = None

NUMPY_DTYPES: Mapping[str, Any] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "float64": np.dtype(np.float64),
    "int64": np.dtype(np.int64),
    "bfloat16": _BF16,
}


def dtype_name(dtype: str | torch.dtype) -> str:
    """Canonical dtype name of a torch dtype, a canonical name or an alias (see :data:`DTYPE_ALIASES`).

    Raises:
        ConfigError: an unknown name.
    """
    key = str(dtype).removeprefix("torch.").lower()
    if key not in DTYPE_ALIASES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of fp32, fp16, bf16 (or float32, float16, bfloat16).")
    return DTYPE_ALIASES[key]


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a name or alias (see :func:`dtype_name`)."""
    return TORCH_DTYPES[dtype_name(dtype)]


def numpy_dtype(dtype: str | torch.dtype) -> Any:
    """The numpy dtype of a name or alias (bfloat16: ``ml_dtypes.bfloat16``)."""
    return NUMPY_DTYPES[dtype_name(dtype)]


def short_name(dtype: str | torch.dtype) -> str:
    """``fp32``/``fp16``/``bf16``/``fp64`` (other dtypes keep their canonical name)."""
    name = dtype_name(dtype)
    return SHORT_NAMES.get(name, name)


def compute_dtype(x: torch.Tensor | torch.dtype) -> torch.dtype:
    """The dtype posenc computes in for activations of ``x``'s dtype: float64 for float64, float32 otherwise (half
    precision is widened)."""
    dtype = x if isinstance(x, torch.dtype) else x.dtype
    return torch.float64 if dtype == torch.float64 else torch.float32
