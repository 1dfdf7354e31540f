"""Pure tensor math of positional encodings: frequencies, tables, rotation, buckets, slopes.

This package is the contract the rest of posenc builds on: torch tensors in and out, no module state.
Frequencies and angles are computed in float64 and cast at the end, so tables stay accurate at
positions far beyond 2**17. Callers import it whole (``from posenc import functional``); its modules are
:mod:`~posenc.functional.frequencies` (RoPE and sinusoidal frequencies), :mod:`~posenc.functional.guard` (tracing,
the position guard), :mod:`~posenc.functional.angles` (cos/sin, exact angles, the rotation),
:mod:`~posenc.functional.sinusoidal` (the absolute table), :mod:`~posenc.functional.buckets` (bias producers) and
:mod:`~posenc.functional.cache` (the preallocated KV cache write).

Shape legend: ``B`` batch, ``S`` sequence, ``H`` heads, ``D`` head dim, ``r`` rotary dim (even, <= D).
"""

from __future__ import annotations

from typing import Any

from posenc import rope_types
from posenc.functional.angles import (
    RANGE_REDUCTION_MAX_POSITION,
    ROPE_LAYOUTS,
    apply_rope,
    exact_angles,
    rope_cos_sin,
    split_turns,
)
from posenc.functional.buckets import alibi_slopes, deberta_log_bucket, t5_relative_bucket
from posenc.functional.cache import write_cache
from posenc.functional.frequencies import rope_frequency_sets, rope_inv_freq, sinusoidal_inv_freq
from posenc.functional.guard import is_tracing, position_guard
from posenc.functional.sinusoidal import sinusoidal_from_angles, sinusoidal_table

__all__ = [
    "RANGE_REDUCTION_MAX_POSITION",
    "ROPE_LAYOUTS",
    "ROPE_PARAMETER_KEYS",  # module __getattr__: follows the rope_types registry
    "ROPE_TYPES",
    "alibi_slopes",
    "apply_rope",
    "deberta_log_bucket",
    "exact_angles",
    "is_tracing",
    "position_guard",
    "rope_cos_sin",
    "rope_frequency_sets",
    "rope_inv_freq",
    "sinusoidal_from_angles",
    "sinusoidal_inv_freq",
    "sinusoidal_table",
    "split_turns",
    "t5_relative_bucket",
    "write_cache",
]


def __getattr__(name: str) -> Any:
    """``ROPE_TYPES`` (valid ``rope_type`` values) and ``ROPE_PARAMETER_KEYS`` (valid ``rope_parameters`` keys)
    follow the :mod:`posenc.rope_types` registry, so they include types registered after import."""
    if name == "ROPE_TYPES":
        return tuple(rope_types.names())
    if name == "ROPE_PARAMETER_KEYS":
        return rope_types.parameter_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
