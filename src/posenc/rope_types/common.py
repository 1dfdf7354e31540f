"""What every ``rope_type`` function uses: parameter readers that raise :class:`ConfigError`, the default
frequencies of a base, and the two length rules (a floor, a switch) written once for numbers and tensors.

A function receives ``seq_len`` as ``None`` (no current length), a Python int (eager) or a 0-d integer tensor
(``max(position_ids) + 1`` inside a traced graph). :func:`at_least` and :func:`switch_at` take all three, so one
definition of a length-dependent type serves the float64 eager path, exported graphs and the plugin's twin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar, cast

import torch

from posenc.errors import ConfigError

__all__ = [
    "at_least",
    "default_inv_freq",
    "finite",
    "ntk_exponent",
    "positive",
    "positive_int",
    "require",
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
