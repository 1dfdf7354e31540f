"""The absolute sinusoidal position table (Vaswani et al., "Attention Is All You Need", 2017,
https://arxiv.org/abs/1706.03762) in its interleaved and concatenated layouts.
"""

from __future__ import annotations

import torch

from posenc.errors import ConfigError
from posenc.functional.frequencies import sinusoidal_inv_freq


def sinusoidal_table(
    num_positions: int,
    dim: int,
    layout: str = "interleaved",
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Sinusoidal position table of Vaswani et al.

    ``interleaved``: ``PE[t, 2i] = sin(t / base**(2i/dim))``, ``PE[t, 2i+1] = cos(...)`` (XLM's
    ``create_sinusoidal_embeddings``; an odd ``dim`` ends on a sine).
    ``concat``: ``PE[t] = [sin(t·ω_0..), cos(t·ω_0..)]`` (tensor2tensor / Transformer-XL order; Marian's
    ``MarianSinusoidalPositionalEmbedding``: an odd ``dim`` has ``(dim + 1) / 2`` sines, then ``(dim - 1) / 2``
    cosines). ``ω_i = base**(-2i/dim)``.

    Returns:
        ``[num_positions, dim]`` in ``dtype`` (angles in float64).
    """
    if layout not in ("interleaved", "concat"):
        raise ConfigError(f"unknown sinusoidal layout {layout!r}; use 'interleaved' or 'concat'.")
    if isinstance(num_positions, bool) or not isinstance(num_positions, int) or num_positions < 1:
        raise ConfigError(f"num_positions must be a positive int, got {num_positions!r}.")
    inv_freq = sinusoidal_inv_freq(dim, base)
    angles = torch.arange(num_positions, dtype=torch.float64).unsqueeze(-1) * inv_freq
    return sinusoidal_from_angles(angles, layout, dim).to(dtype)


def sinusoidal_from_angles(angles: torch.Tensor, layout: str, dim: int | None = None) -> torch.Tensor:
    """Arrange sin/cos of ``angles [..., ceil(dim / 2)]`` into ``[..., dim]`` in the given layout.

    ``dim`` defaults to twice the angles' width; an odd ``dim`` drops the last cosine.
    """
    sin, cos = torch.sin(angles), torch.cos(angles)
    odd = dim is not None and dim % 2 == 1
    if layout == "concat":
        return torch.cat((sin, cos[..., :-1] if odd else cos), dim=-1)
    pairs = torch.stack((sin, cos), dim=-1).flatten(-2)
    return pairs[..., :-1] if odd else pairs
