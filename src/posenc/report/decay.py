"""The long-range decay of RoPE: how the bound on the rotated inner product shrinks with relative distance.

Source: Su Jianlin, Transformer升级之路：2、博采众长的旋转式位置编码 (2021), https://kexue.fm/archives/8265,
section 远程衰减 (long-range decay); the same argument is in Su et al., RoFormer: Enhanced Transformer with
Rotary Position Embedding (2021), arXiv:2104.09864.

With ``S_j = Σ_{i=0..j} exp(i·m·θ_i)`` and ``θ_i = base^(-2i/d)``, the post bounds the rotated inner product
by ``max |h_{i+1} - h_i| · Σ_j |S_j|`` and plots

    f(m) = (1 / (d/2)) · Σ_{j=0}^{d/2-1} |S_j(m)|

for m = 0..256 and d = 128 (its Mathematica code: ``Sum[Norm[Sum[Exp[I m θ[i]], {i, 0, j}]], {j, 0, d/2-1}]/(d/2)``,
so the inner sum includes i = j). f(0) = (d/2 + 1) / 2 and f falls, with oscillations, as m grows.
"""

from __future__ import annotations

from pathlib import Path

import torch

from posenc import functional
from posenc.errors import ConfigError
from posenc.report.figures import new_figure, save_figure


def rope_long_range_decay(
    head_dim: int = 128, base: float = 10000.0, max_distance: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """``f(m)`` of the post for ``m = 0..max_distance``.

    Args:
        head_dim: d (even); the frequencies are :func:`posenc.functional.rope_inv_freq` of rope_type default.
        base: RoPE base θ.
        max_distance: largest relative distance m.

    Returns:
        ``(m, f)``: int64 ``[max_distance + 1]`` and float64 ``[max_distance + 1]``.

    Raises:
        ConfigError: odd or non-positive ``head_dim``, negative ``max_distance``.
    """
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance < 0:
        raise ConfigError(f"max_distance must be an int >= 0, got {max_distance!r}.")
    theta, _ = functional.rope_inv_freq(head_dim, {"rope_theta": base})  # [d/2] float64
    distances = torch.arange(max_distance + 1)
    angles = distances.to(torch.float64).unsqueeze(-1) * theta  # [M, d/2]
    partial_sums = torch.polar(torch.ones_like(angles), angles).cumsum(dim=-1)  # S_j, [M, d/2]
    return distances, partial_sums.abs().mean(dim=-1)


def plot_rope_decay(path: str | Path, head_dim: int = 128, base: float = 10000.0, max_distance: int = 256) -> Path:
    """Plot :func:`rope_long_range_decay` to a PNG file (written atomically)."""
    m, f = rope_long_range_decay(head_dim, base, max_distance)
    figure = new_figure(7, 3.6)
    axis = figure.subplots()
    axis.plot(m.numpy(), f.numpy(), color="#4c72b0", linewidth=1.2)
    axis.set_xlabel("relative distance m")
    axis.set_ylabel("relative size f(m)")
    axis.set_title(
        f"RoPE long-range decay (d = {head_dim}, θ_i = {base:g}^(-2i/d)); Su et al. 2021, arXiv:2104.09864", fontsize=10
    )
    axis.grid(alpha=0.3)
    axis.set_xlim(0, max_distance)
    return save_figure(figure, path)
