"""What every ``rope_type`` function uses: parameter readers that raise :class:`ConfigError`, the default
frequencies of a base (and the ``default`` type's function, which other types reuse), static NTK-aware frequencies,
and the two length rules (a floor, a switch) written once for numbers and tensors.

A function receives ``seq_len`` as ``None`` (no current length), a Python int (eager) or a 0-d integer tensor
(``max(position_ids) + 1`` inside a traced graph). :func:`at_least` and :func:`switch_at` take all three, so one
definition of a length-dependent type serves the float64 eager path, exported graphs and the plugin's twin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import torch

from posenc.errors import ConfigError

__all__ = [
    "HF_REFERENCE",
    "POSITIVE_OPTIONAL",
    "SeqLen",
    "at_least",
    "context_ratio_factor",
    "default_inv_freq",
    "default_type_inv_freq",
    "device_of",
    "factor_param",
    "finite",
    "needs_wide_rotary",
    "ntk_exponent",
    "original_context",
    "positive",
    "positive_int",
    "positive_or",
    "require",
    "static_ntk",
    "switch_at",
]

T = TypeVar("T")


def require(params: Mapping[str, Any], key: str, rope_type: str) -> Any:
    """``params[key]``, or a :class:`ConfigError` saying which key ``rope_type`` needs."""
    value = params.get(key)
    if value is None:
        raise ConfigError(
            f"rope_type={rope_type!r} needs {key!r} in its parameters; add it (Hugging Face "
            f"rope_parameters use the same name)."
        )
    return value


def finite(value: Any, key: str) -> float:
    """``value`` as a finite float, or a :class:`ConfigError` naming ``key``."""
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be a number, got {value!r}.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be a number, got {value!r}.") from None
    if not math.isfinite(number):
        raise ConfigError(f"{key} must be a finite number, got {value!r}.")
    return number


def positive(value: Any, key: str) -> float:
    """``value`` as a finite float > 0, or a :class:`ConfigError` naming ``key``."""
    number = finite(value, key)
    if number <= 0:
        raise ConfigError(f"{key} must be a finite number > 0, got {value!r}.")
    return number


def positive_int(value: Any, key: str) -> int:
    """``value`` as an int >= 1 (integral floats accepted, as in JSON configs), or a :class:`ConfigError`."""
    number = positive(value, key)
    if not number.is_integer():
        raise ConfigError(f"{key} must be an int >= 1, got {value!r}.")
    return int(number)


def default_inv_freq(rotary_dim: int, base: Any, device: torch.device | None = None) -> torch.Tensor:
    """``1 / base ** (2i / r)`` for ``i < r/2``, float64 ``[r // 2]`` (``base``: a float or a 0-d float64 tensor)."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim
    return 1.0 / (base**exponents)


def ntk_exponent(rotary_dim: T) -> T:
    """``r / (r - 2)``: the power of the scale in NTK-aware bases, chosen so that the lowest frequency is
    interpolated by exactly the scale while the highest stays (an int, or a symbolic value)."""
    return rotary_dim / (rotary_dim - 2)  # type: ignore[operator, return-value]  # an int or a symbolic (traced) value


def at_least(length: T, minimum: Any) -> T:
    """``max(length, minimum)`` for a number, a tensor (``clamp``) or any value with ``clamp(min=...)``."""
    if isinstance(length, (int, float)):
        return max(length, minimum)
    clampable: Any = length  # a tensor or a symbolic value: anything with clamp(min=...)
    return cast(T, clampable.clamp(min=minimum))


def switch_at(length: Any, point: int, below: T, above: T) -> T:
    """``above`` when the current length exceeds ``point``, else ``below`` (the whole call picks one; this is
    Hugging Face's rule for LongRoPE). ``length``: ``None`` (no current length: ``below``), an int, or a 0-d
    tensor (then ``torch.where``, so a traced graph switches by itself)."""
    if length is None:
        return below
    if isinstance(length, torch.Tensor):
        return cast(T, torch.where(length > point, cast(torch.Tensor, above), cast(torch.Tensor, below)))
    return above if length > point else below


HF_REFERENCE = "Hugging Face transformers modeling_rope_utils (ROPE_INIT_FUNCTIONS), ONNX RotaryEmbedding-23"
"""The reference implementations of the types transformers defines."""
SeqLen = int | torch.Tensor | None


def device_of(seq_len: SeqLen) -> torch.device | None:
    """The device of a tensor ``seq_len`` (a traced length), else ``None``."""
    return seq_len.device if isinstance(seq_len, torch.Tensor) else None


def factor_param(params: Mapping[str, Any], rope_type: str) -> float:
    """``params["factor"]``, required, a finite float > 0."""
    return positive(require(params, "factor", rope_type), "factor")


def positive_or(params: Mapping[str, Any], key: str, default: float) -> float:
    """``params[key]`` as a finite float > 0, or ``default`` when it is absent or ``None``."""
    value = params.get(key)
    return default if value is None else positive(value, key)


def needs_wide_rotary(rotary_dim: int, what: str) -> None:
    """Refuse ``rotary_dim <= 2`` for ``what``: an NTK exponent r / (r - 2) needs r > 2."""
    if rotary_dim <= 2:
        raise ConfigError(f"{what} needs rotary_dim > 2 (its exponent is r / (r - 2)).")


def original_context(params: Mapping[str, Any], rope_type: str, fallback: str | None = None) -> int:
    """``original_max_position_embeddings`` (or, when absent, the ``fallback`` key), an int >= 1."""
    key = "original_max_position_embeddings"
    if params.get(key) is None and fallback is not None:
        key = fallback
    return positive_int(require(params, key, rope_type), key)


def context_ratio_factor(params: Mapping[str, Any], rope_type: str, original: int) -> float:
    """``factor``, or ``max_position_embeddings / original_max_position_embeddings`` when it is absent."""
    factor = params.get("factor")
    if factor is None:
        max_pos = positive_int(require(params, "max_position_embeddings", rope_type), "max_position_embeddings")
        factor = max_pos / original
    return positive(factor, "factor")


POSITIVE_OPTIONAL: dict[str, Any] = {"optional": True, "minimum": 0, "exclusive_minimum": True}
"""The schema of an optional parameter that must be > 0 when given."""


def static_ntk(key: str, rope_type: str) -> Callable[..., tuple[torch.Tensor, float]]:
    """Static NTK-aware frequencies: the base becomes θ · s^(r/(r-2)) with the scale s read from ``key``."""

    def inv_freq(
        rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen
    ) -> tuple[torch.Tensor, float]:
        scale = positive(require(params, key, rope_type), key)
        needs_wide_rotary(rotary_dim, f"{rope_type} scaling")
        return default_inv_freq(rotary_dim, base * scale ** ntk_exponent(rotary_dim)), 1.0

    return inv_freq


def default_type_inv_freq(
    rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen
) -> tuple[torch.Tensor, float]:
    """The ``default`` type's function: :func:`default_inv_freq` of the base, attention factor 1."""
    return default_inv_freq(rotary_dim, base), 1.0
