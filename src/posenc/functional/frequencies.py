"""RoPE and sinusoidal frequencies: ``inv_freq`` of a ``rope_type`` (through :mod:`posenc.rope_types`), its sets.

Shape legend: ``r`` rotary dim (even, <= D).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from posenc import rope_types
from posenc.errors import ConfigError, parameter_domain
from posenc.functional.guard import is_tracing


def _check_rotary_dim(rotary_dim: Any) -> int:
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise ConfigError(f"rotary_dim must be an int, got {type(rotary_dim).__name__}.")
    if rotary_dim < 2 or rotary_dim % 2:
        raise ConfigError(
            f"rotary_dim must be an even integer >= 2 (RoPE rotates pairs of dimensions), got {rotary_dim}."
        )
    return rotary_dim


def _check_seq_len(seq_len: int | torch.Tensor | None) -> None:
    if isinstance(seq_len, torch.Tensor):
        if seq_len.dtype.is_floating_point or seq_len.dtype == torch.bool or seq_len.numel() != 1:
            raise ConfigError(
                f"a tensor seq_len must hold one integer (max position + 1), got {seq_len.dtype} {list(seq_len.shape)}."
            )
    elif seq_len is not None and (isinstance(seq_len, bool) or int(seq_len) < 1):
        raise ConfigError(f"seq_len must be a positive int (max position + 1), got {seq_len!r}.")


def rope_inv_freq(
    rotary_dim: int, params: Mapping[str, Any] | None = None, *, seq_len: int | torch.Tensor | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of RoPE for a ``rope_type`` and its parameters.

    Checks the keys every type shares, then calls the type's function from the :mod:`posenc.rope_types` registry.

    Args:
        rotary_dim: number of rotated dimensions r (even). ``partial_rotary_factor`` is the caller's
            business: pass ``int(head_dim * partial_rotary_factor)``.
        params: Hugging Face ``rope_parameters`` / ``rope_scaling`` dict (``rope_type``, ``rope_theta``,
            ``factor``, ...). It may also carry ``max_position_embeddings`` (the model's context length).
            ``rope_type`` values (``ROPE_TYPES``): default, linear, ntk (static NTK-aware: base * factor**(r/(r-2))),
            dynamic, yarn, longrope, llama3, truncation (base truncation with ``truncation_a``,
            ``truncation_c``, ``truncation_beta``: θ_i kept if θ_i >= c, set to β if a < θ_i < c, 0 if θ_i <= a),
            and any type registered since.
        seq_len: current length (max position + 1) for the length-dependent types ``dynamic`` and ``longrope``:
            an int, or a 0-d integer tensor (inside a traced graph the result is then computed in the graph).

    Returns:
        ``(inv_freq, attention_factor)``: float64 ``[r // 2]`` and the float multiplied into cos and sin.

    Raises:
        ConfigError: unknown rope_type or key, odd rotary_dim, factor <= 0, missing required parameters.

    Example::

        inv_freq, scale = rope_inv_freq(128, {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 8192})
    """
    rotary_dim = _check_rotary_dim(rotary_dim)
    params = dict(params or {})
    keys = rope_types.parameter_keys()
    unknown = sorted(set(params) - keys)
    if unknown:
        raise ConfigError(f"unknown RoPE parameter(s) {unknown}; valid keys are {sorted(keys)}.")
    entry = rope_types.get(rope_types.rope_type_name(params))
    theta = params.get("rope_theta")
    base = rope_types.positive(10000.0 if theta is None else theta, "rope_theta")
    _check_seq_len(seq_len)
    with parameter_domain(
        f"rope_type {entry.name!r} cannot compute frequencies from {params}",
        f"these values leave its domain (see `posenc show {entry.scheme}`).",
    ):
        inv_freq, factor = entry.inv_freq(rotary_dim, base, params, seq_len)
    if not is_tracing() and not (bool(torch.isfinite(inv_freq).all()) and math.isfinite(float(factor))):
        raise ConfigError(
            f"rope_type {entry.name!r} with {params} gives non-finite frequencies or attention factor; choose "
            f"parameters in its range (see `posenc show {entry.scheme}`)."
        )
    return inv_freq, factor


def rope_frequency_sets(
    rotary_dim: int, params: Mapping[str, Any] | None = None
) -> tuple[tuple[int, ...], list[tuple[torch.Tensor, float]]]:
    """Every frequency set a ``rope_type`` uses, and the lengths at which it switches between them.

    Static types have one set. A type whose frequencies switch with the current length L (LongRoPE) has one set
    per interval: set 0 for L <= points[0], set i for points[i-1] < L <= points[i], the last for L > points[-1]
    (:func:`posenc.rope_types.switch_at` is the rule).

    Returns:
        ``(points, sets)``: ascending switch lengths (empty for static types) and ``len(points) + 1`` pairs
        ``(inv_freq float64 [r // 2], attention_factor)``, each from :func:`rope_inv_freq`.

    Raises:
        ConfigError: bad parameters, or a type that depends on L continuously (dynamic NTK): evaluate
            :func:`rope_inv_freq` with ``seq_len`` instead.
    """
    entry = rope_types.get(rope_types.rope_type_name(params))
    first = rope_inv_freq(rotary_dim, params)  # validates the parameters
    if not entry.length_dependent:
        return (), [first]
    if entry.switch_points is None:
        raise ConfigError(
            f"rope_type {entry.name!r} depends continuously on the current length, so it has no finite set of "
            f"frequencies; evaluate rope_inv_freq(..., seq_len=L) per length (a 0-d tensor inside a graph)."
        )
    points = tuple(sorted(entry.switch_points(dict(params or {}))))
    lengths = (points[0], *(point + 1 for point in points))
    return points, [rope_inv_freq(rotary_dim, params, seq_len=length) for length in lengths]


def sinusoidal_inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Frequencies ``1 / base**(2i/dim)`` of the sinusoidal encoding, float64 ``[ceil(dim / 2)]``.

    An odd ``dim`` has one more sine than cosines, so it gets ``(dim + 1) / 2`` frequencies (the exponent keeps
    the odd ``dim`` as its denominator, as Marian's and XLM's tables do).
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ConfigError(f"sinusoidal dim must be a positive int, got {dim!r}.")
    return rope_types.default_inv_freq(dim, rope_types.positive(base, "base"))
