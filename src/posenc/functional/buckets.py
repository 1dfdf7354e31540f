"""Bias producers: ALiBi head slopes, T5 relative buckets, DeBERTa log buckets."""

from __future__ import annotations

import math

import torch

from posenc import rope_types
from posenc.errors import ConfigError


def alibi_slopes(num_heads: int, dtype: torch.dtype = torch.float32, *, bias_max: float = 8.0) -> torch.Tensor:
    """ALiBi head slopes: ``2**(-bias_max·i/n)``, ``i = 1..n``, for n a power of two (the paper's bias_max is 8).

    Other head counts take the slopes of the power of two ``c`` below n, then every other slope of ``2c``
    (``2**(-bias_max·j/(2c))`` for odd ``j``) until n: the ALiBi paper's code, BLOOM and Falcon. MPT's order
    (transformers' ``build_mpt_alibi_tensor``: the ``2c`` slopes at even positions, then those at odd ones, cut
    at n) is the same sequence, so one function serves all three; MPT's ``alibi_bias_max`` is ``bias_max``.

    Slopes are computed in float64 and cast to ``dtype``. Returns ``[num_heads]``.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ConfigError(f"num_heads must be a positive int, got {num_heads!r}.")
    bias_max = rope_types.positive(bias_max, "bias_max")

    def powers(count: int, exponents: torch.Tensor) -> torch.Tensor:
        return 2.0 ** (-(bias_max / count) * exponents.to(torch.float64))

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = powers(closest, torch.arange(1, closest + 1))
    if closest != num_heads:
        remaining = min(closest, num_heads - closest)
        slopes = torch.cat((slopes, powers(2 * closest, torch.arange(1, 1 + 2 * remaining, 2))))
    return slopes.to(dtype)


def t5_relative_bucket(
    relative_position: torch.Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5 relative-position bucket (Mesh TensorFlow / Hugging Face ``_relative_position_bucket``).

    Half the buckets are exact distances, the rest log-spaced up to ``max_distance``; bidirectional
    mode gives keys after the query their own half of the buckets. The float32 log matches the original.

    Args:
        relative_position: int tensor ``key_pos - query_pos``.

    Returns:
        int64 tensor of the same shape, values in ``[0, num_buckets)``.
    """
    _check_buckets(num_buckets, max_distance, bidirectional)
    rel = relative_position.to(torch.int64)
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).to(torch.int64) * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    # Clamp before the log so that log(0) never appears (those entries are "small" anyway).
    large = max_exact + (
        torch.log(rel.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.int64)
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, rel, large)


def _check_buckets(num_buckets: int, max_distance: int, bidirectional: bool = False) -> None:
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 2:
        raise ConfigError(f"num_buckets must be an int >= 2, got {num_buckets!r}.")
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance < 1:
        raise ConfigError(f"max_distance must be a positive int, got {max_distance!r}.")
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    if per_direction < 2:
        raise ConfigError(
            f"bidirectional T5 buckets split num_buckets={num_buckets} into two directions of {per_direction}; "
            f"each needs >= 2 (exact and log buckets). Use num_buckets >= 4."
        )
    if max_distance <= per_direction // 2:
        raise ConfigError(
            f"max_distance={max_distance} must exceed the {per_direction // 2} exact-distance buckets "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional}); use max_distance > {per_direction // 2}."
        )


def deberta_log_bucket(
    relative_position: torch.Tensor, bucket_size: int = 256, max_position: int = 512
) -> torch.Tensor:
    """DeBERTa-v2 log bucket (``make_log_bucket_position``): exact within ±bucket_size/2, log beyond.

    Args:
        relative_position: int tensor ``query_pos - key_pos``.

    Returns:
        int64 tensor of the same shape (signed bucket ids).
    """
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 4:
        raise ConfigError(f"bucket_size must be an int >= 4, got {bucket_size!r}.")
    if isinstance(max_position, bool) or not isinstance(max_position, int) or max_position <= bucket_size // 2 + 1:
        raise ConfigError(f"max_position must be an int > bucket_size // 2 + 1, got {max_position!r}.")
    rel = relative_position.to(torch.int64)
    sign = torch.sign(rel)
    mid = bucket_size // 2
    abs_pos = torch.where((rel < mid) & (rel > -mid), torch.full_like(rel, mid - 1), rel.abs())
    log_pos = (
        torch.ceil(torch.log(abs_pos.float() / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1))
        + mid
    )
    return torch.where(abs_pos <= mid, rel.to(log_pos.dtype), log_pos * sign).to(torch.int64)
