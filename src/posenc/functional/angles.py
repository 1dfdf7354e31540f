"""Angles, cos/sin and the rotation: float64 tables, float32-exact range reduction, :func:`apply_rope`.

Shape legend: ``B`` batch, ``S`` sequence, ``H`` heads, ``D`` head dim, ``r`` rotary dim (even, <= D).
"""

from __future__ import annotations

import math

import torch

from posenc.dtypes import compute_dtype
from posenc.errors import ConfigError, PositionError
from posenc.functional.guard import is_tracing

ROPE_LAYOUTS: tuple[str, ...] = ("half", "interleaved")

# Exact range reduction: positions are split at this power of two, frequencies into 12-bit pieces.
_POSITION_SPLIT = 4096
_MANTISSA_BITS = 11  # 12 significant bits: product of two 12-bit numbers is exact in float32
RANGE_REDUCTION_MAX_POSITION = _POSITION_SPLIT * _POSITION_SPLIT
"""Largest |position| for which :func:`exact_angles` is exact (2**24)."""


def rope_cos_sin(
    position_ids: torch.Tensor,
    inv_freq: torch.Tensor,
    attention_factor: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``position * inv_freq`` (angles in float64), times ``attention_factor``.

    Args:
        position_ids: integer tensor of any shape, e.g. ``[B, S]``.
        inv_freq: ``[r // 2]``.
        attention_factor: multiplied into cos and sin (YaRN, LongRoPE).
        dtype: dtype of the returned tables.

    Returns:
        ``(cos, sin)``, each ``[*position_ids.shape, r // 2]``.

    Raises:
        ConfigError: floating-point position ids (outside a traced graph).
    """
    if not is_tracing() and (position_ids.is_floating_point() or position_ids.is_complex()):
        raise ConfigError(
            f"position_ids must be an integer tensor (positions are token indices), got {position_ids.dtype}; "
            f"pass e.g. torch.arange(S) or ids cast with .long()."
        )
    angles = position_ids.to(torch.float64).unsqueeze(-1) * inv_freq.to(torch.float64)
    return (
        (torch.cos(angles) * attention_factor).to(dtype),
        (torch.sin(angles) * attention_factor).to(dtype),
    )


def split_turns(inv_freq: torch.Tensor) -> torch.Tensor:
    """Split frequencies (in turns, ``inv_freq / 2π``) into three float32 pieces for :func:`exact_angles`.

    The first two pieces carry 12 significant bits each, so their products with 12-bit position pieces are
    exact in float32; the third carries the rest. Works on float64 input inside exported graphs too.

    Args:
        inv_freq: ``[..., r // 2]`` frequencies (float64 recommended).

    Returns:
        float32 ``[3, ..., r // 2]``.
    """
    turns = inv_freq.to(torch.float64) / (2 * math.pi)
    pieces = []
    rest = turns
    for _ in range(2):
        safe = torch.where(rest == 0, torch.ones_like(rest), rest.abs())
        scale = torch.exp2(_MANTISSA_BITS - torch.floor(torch.log2(safe)))
        piece = torch.where(rest == 0, torch.zeros_like(rest), torch.round(rest * scale) / scale)
        pieces.append(piece)
        rest = rest - piece
    pieces.append(rest)
    return torch.stack(pieces).to(torch.float32)


def exact_angles(position_ids: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Angles ``position * inv_freq`` reduced to ``[0, 2π]`` with float32 arithmetic only, error ~1e-6 rad.

    Naive float32 angles lose ~1e-2 rad at position 131072; this splits positions at 4096 and frequencies
    into 12-bit pieces (:func:`split_turns`) so every large product is exact. Exported graphs use it for
    in-graph (``dynamic``) tables because TensorRT has no float64 arithmetic.

    Args:
        position_ids: int64 ``[...]`` with |position| < 2**24.
        turns: float32 ``[3, r // 2]`` from :func:`split_turns` (or ``[3, ..., r // 2]`` broadcastable).

    Returns:
        float32 ``[..., r // 2]``.

    Raises:
        ConfigError: floating-point position ids (they would be truncated silently).
        PositionError: |position| >= 2**24 in eager mode (the split is no longer exact; exported graphs
            are checked by the runtime helpers instead).
    """
    if position_ids.dtype.is_floating_point or position_ids.dtype == torch.bool:
        raise ConfigError(f"position ids must be an integer tensor (int64), got {position_ids.dtype}.")
    pos = position_ids.to(torch.int64)
    if not is_tracing() and pos.numel():
        far = int(pos.abs().max())
        if far >= RANGE_REDUCTION_MAX_POSITION:
            raise PositionError(
                f"position {far} is past 2**24 = {RANGE_REDUCTION_MAX_POSITION}, where float32 angles stop "
                f"being exact; keep positions below it, or compute tables in float64 (table_dtype=torch.float64, "
                f"eager PyTorch only)."
            )
    high_i = torch.div(pos, _POSITION_SPLIT, rounding_mode="floor") * _POSITION_SPLIT
    high = high_i.to(torch.float32).unsqueeze(-1)
    low = (pos - high_i).to(torch.float32).unsqueeze(-1)
    t1, t2, t3 = turns[0], turns[1], turns[2]

    def centered(x: torch.Tensor) -> torch.Tensor:
        # Fractional part in [-0.5, 0.5]: partial sums stay below 1 in magnitude, so each addition rounds
        # to half the error that sums in [0, 2) would (worst case ~1e-6 rad instead of ~2e-6 rad).
        return x - torch.round(x)

    total = centered(centered(high * t1) + centered(low * t1))
    total = centered(total + centered(high * t2))
    total = centered(total + centered(low * t2))
    total = centered(total + (high + low) * t3)
    return (total - torch.floor(total)) * (2 * math.pi)


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "half",
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` features of ``x`` by the angles whose cos/sin are given.

    ``half`` (GPT-NeoX / Llama ``rotate_half``) pairs features (i, i + r/2); ``interleaved``
    (GPT-J / RoFormer) pairs (2i, 2i + 1). Features past ``rotary_dim`` pass through unchanged.
    Math runs in float32 (float64 for float64 input); the result has ``x``'s dtype.

    Args:
        x: ``[..., D]``, e.g. ``[B, H, S, D]``.
        cos, sin: broadcastable to ``x[..., : r // 2]``, e.g. ``[B, 1, S, r // 2]``.
        layout: ``"half"`` or ``"interleaved"``.
        rotary_dim: r (even, <= D); defaults to ``2 * cos.shape[-1]``.

    Returns:
        Tensor of ``x``'s shape and dtype.
    """
    if layout not in ROPE_LAYOUTS:
        raise ConfigError(f"unknown RoPE layout {layout!r}; use one of {list(ROPE_LAYOUTS)}.")
    half = cos.shape[-1]
    r = 2 * half if rotary_dim is None else rotary_dim
    if r != 2 * half or r % 2:
        raise ConfigError(f"rotary_dim {r} does not match cos/sin of last dim {half} (need rotary_dim = 2*{half}).")
    if r > x.shape[-1]:
        raise ConfigError(f"rotary_dim {r} exceeds the head dim {x.shape[-1]}; use rotary_dim <= head dim.")
    if not is_tracing():
        try:
            torch.broadcast_shapes(cos.shape, sin.shape, (*x.shape[:-1], half))
        except RuntimeError:
            raise ConfigError(
                f"cos {list(cos.shape)} and sin {list(sin.shape)} do not broadcast to x[..., :{r // 2}] of x "
                f"{list(x.shape)}; give one cos/sin row per position of x (e.g. [B, 1, S, r/2] for x [B, H, S, D])."
            ) from None
    compute = compute_dtype(x)
    xr = x[..., :r].to(compute)
    c, s = cos.to(compute), sin.to(compute)
    if layout == "half":
        x1, x2 = xr[..., :half], xr[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    rotated = rotated.to(x.dtype)
    if r == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., r:]), dim=-1)
