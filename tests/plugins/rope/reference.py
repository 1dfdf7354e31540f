"""Float64 references for the RoPE plugin tests (posenc.functional in float64, and a naive loop)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from posenc import functional


def positions_of(positions: torch.Tensor, mode: str, batch: int, seq: int) -> torch.Tensor:
    """Position ids ``[B, S]`` from ids ``[B|1, S]`` or start offsets ``[B|1]``."""
    if mode == "offset":
        return (positions.reshape(-1, 1) + torch.arange(seq)).expand(batch, seq).to(torch.int64)
    return positions.expand(batch, seq).to(torch.int64)


def rotate_reference(
    x: torch.Tensor,
    pos: torch.Tensor,
    inv_freq: torch.Tensor,
    attention_factor: float,
    layout: str,
    rotary_dim: int,
) -> torch.Tensor:
    """RoPE of ``x [B, H, S, D]`` at ``pos [B, S]`` in float64; ``inv_freq`` is ``[r/2]`` or per row ``[B, r/2]``."""
    inv = inv_freq.to(torch.float64)
    if inv.dim() == 1:
        inv = inv.expand(pos.shape[0], -1)
    cos = torch.stack(
        [functional.rope_cos_sin(pos[b], inv[b], attention_factor, torch.float64)[0] for b in range(len(pos))]
    )
    sin = torch.stack(
        [functional.rope_cos_sin(pos[b], inv[b], attention_factor, torch.float64)[1] for b in range(len(pos))]
    )
    return functional.apply_rope(x.to(torch.float64), cos[:, None], sin[:, None], layout, rotary_dim)


def row_inv_freq(rotary_dim: int, params: Mapping[str, Any], pos: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Per-row frequencies of a length-dependent type: each row's length L = max position + 1."""
    rows, factor = [], 1.0
    for b in range(pos.shape[0]):
        inv, factor = functional.rope_inv_freq(rotary_dim, params, seq_len=int(pos[b].max()) + 1)
        rows.append(inv)
    return torch.stack(rows), factor


def naive_rotation(x: list[float], position: int, inv_freq: list[float], layout: str) -> list[float]:
    """One head row rotated with Python floats (math.cos/sin of exact float64 angles), pair by pair."""
    out = list(x)
    half = len(inv_freq)
    for i, freq in enumerate(inv_freq):
        a, b = (i, i + half) if layout == "half" else (2 * i, 2 * i + 1)
        angle = math.fmod(position * freq, 2 * math.pi)
        c, s = math.cos(angle), math.sin(angle)
        out[a], out[b] = x[a] * c - x[b] * s, x[b] * c + x[a] * s
    return out
