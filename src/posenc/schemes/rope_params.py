"""The RoPE family's shared parameters and what they resolve to: rotated width, Hugging Face ``rope_parameters``.

:data:`_COMMON` (``rope_theta``, ``layout``, ``partial_rotary_factor``) are every rotary scheme's parameters;
:func:`rope_parameters` turns a scheme's resolved parameters into the ``rope_parameters`` of
:func:`posenc.functional.rope_inv_freq`. Used by the rotary schemes (:mod:`posenc.schemes.rope`,
:mod:`posenc.schemes.rerope`, :mod:`posenc.schemes.rope_linear`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from posenc import functional, rope_types
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.schemes.base import Param, Tolerance

ROFORMER = str(rope_types.ROFORMER)
_COMMON = (
    Param(
        "rope_theta",
        "float",
        10000.0,
        "RoPE base θ (frequencies θ^(-2i/r))",
        minimum=0,
        exclusive_minimum=True,
    ),
    Param(
        "layout",
        "str",
        "half",
        "pairing: half = GPT-NeoX/Llama rotate_half, interleaved = GPT-J/RoFormer",
        choices=functional.ROPE_LAYOUTS,
    ),
    Param(
        "partial_rotary_factor",
        "float",
        1.0,
        "fraction of head_dim that is rotated (rest passes through)",
        minimum=0,
        exclusive_minimum=True,
        maximum=1.0,
    ),
)


def rotary_dim_of(head_dim: int, partial_rotary_factor: float) -> int:
    """Rotated width r = int(head_dim * partial_rotary_factor); must be even and >= 2."""
    r = int(head_dim * partial_rotary_factor)
    if r < 2 or r % 2:
        raise ConfigError(
            f"head_dim {head_dim} x partial_rotary_factor {partial_rotary_factor} gives rotary_dim {r}; RoPE "
            f"needs an even rotary_dim >= 2. Choose a factor that makes head_dim * factor even."
        )
    return r


def rotary_width(rope_type: str, head_dim: int, partial_rotary_factor: float) -> int:
    """Width the type's frequencies span: the rotated slice int(D * p) (``slice`` types, see
    :attr:`posenc.rope_types.RopeType.partial_rotary`) or the whole head dim (``proportional`` types)."""
    proportional = rope_types.get(rope_type).partial_rotary == "proportional"
    return rotary_dim_of(head_dim, 1.0 if proportional else partial_rotary_factor)


def rope_parameters(rope_type: str, params: Mapping[str, Any], config: AttentionConfig) -> dict[str, Any]:
    """Hugging Face ``rope_parameters`` for :func:`posenc.functional.rope_inv_freq` from a RoPE scheme's resolved
    parameters; what the scheme left as ``None`` comes from the geometry (:attr:`RopeType.geometry_defaults`)."""
    entry = rope_types.get(rope_type)
    out: dict[str, Any] = {
        "rope_type": entry.name,
        "rope_theta": params["rope_theta"],
        "max_position_embeddings": config.max_position_embeddings,
    }
    if entry.partial_rotary == "proportional":
        out["partial_rotary_factor"] = params["partial_rotary_factor"]
    out.update({name: params[name] for name in entry.param_names if params.get(name) is not None})
    if entry.geometry_defaults is not None:
        width = rotary_width(rope_type, config.head_dim, params["partial_rotary_factor"])
        derived = entry.geometry_defaults(out, width)
        out.update({key: value for key, value in derived.items() if out.get(key) is None})
    return out


def _validate_rope(rope_type: str) -> Callable[[dict[str, Any], AttentionConfig], None]:
    def check(params: dict[str, Any], config: AttentionConfig) -> None:
        width = rotary_width(rope_type, config.head_dim, params["partial_rotary_factor"])
        functional.rope_inv_freq(
            width, rope_parameters(rope_type, params, config), seq_len=config.max_position_embeddings
        )

    return check


def scale_rate(rope_type: str, params: Mapping[str, Any], config: AttentionConfig) -> torch.Tensor | None:
    """The type's per-position q scale rate λ (float64 ``[r/2]``, :attr:`posenc.rope_types.RopeType.scale_rate`;
    k's is -λ), or ``None`` for a pure rotation."""
    entry = rope_types.get(rope_type)
    if entry.scale_rate is None:
        return None
    width = rotary_width(rope_type, config.head_dim, params["partial_rotary_factor"])
    return entry.scale_rate(width, rope_parameters(rope_type, params, config))


def _rope_tolerances() -> dict[str, Tolerance]:
    return {
        "float32": Tolerance(atol=3e-5, rtol=1e-4),
        "float16": Tolerance(atol=4e-3, rtol=4e-3),
        "bfloat16": Tolerance(atol=3e-2, rtol=3e-2),
    }


__all__ = ["ROFORMER", "rope_parameters", "rotary_dim_of", "rotary_width", "scale_rate"]
