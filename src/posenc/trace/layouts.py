"""How a model lays out the cos/sin it hands its rotation, against posenc's ``cos``/``sin [..., r/2]``.

Rotary modules return cos and sin in one of three layouts over the r/2 frequencies ``c``:

- ``half``: ``cat(c, c)`` (width r; Llama's ``rotate_half`` convention);
- ``interleaved``: every value twice in a row, ``repeat_interleave(c, 2)`` (width r; GPT-J, Cohere);
- ``narrow``: ``c`` itself (width r/2; GPT-OSS, or a rotation already fused by the exporter).

:func:`match_layout` tells which one a tensor is (and whether it is cos or sin) by comparing its values with
posenc's at probe positions: a match means the model's angles are posenc's up to the model's float32 rounding.
"""

from __future__ import annotations

import numpy as np
import torch

LAYOUTS: tuple[str, ...] = ("half", "interleaved", "narrow")
PROBE_LIMIT = 4096
"""Probe positions stay below this: there transformers' float32 angles are within ~5e-4 rad of exact."""
MATCH_TOLERANCE = 2e-3
"""Largest difference (relative to the table's magnitude) between a model's cos/sin and posenc's at probe positions
that still counts as the same angles; neighbouring frequencies or another layout differ by far more."""


def arrange(values: torch.Tensor, layout: str) -> torch.Tensor:
    """posenc's ``[..., r/2]`` cos or sin in a model's ``layout`` (see the module docstring)."""
    if layout == "half":
        return torch.cat((values, values), dim=-1)
    if layout == "interleaved":
        return torch.repeat_interleave(values, 2, dim=-1)
    if layout == "narrow":
        return values
    raise ValueError(f"unknown layout {layout!r}; one of {LAYOUTS}")


def arrange_np(values: np.ndarray, layout: str) -> np.ndarray:
    """:func:`arrange` for numpy arrays."""
    return arrange(torch.from_numpy(np.ascontiguousarray(values)), layout).numpy()


def width_of(layout: str, half: int) -> int:
    """The width of a layout over ``half`` frequencies."""
    return half if layout == "narrow" else 2 * half


def match_layout(values: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[str, str, float] | None:
    """``(source, layout, error)`` when ``values [N, W]`` (one row per probe token) are posenc's ``cos`` or ``sin
    [N, r/2]`` in one of the :data:`LAYOUTS`; ``source`` is ``"cos"`` or ``"sin"``; None when nothing matches.

    ``error`` is the largest difference, relative to the magnitude of the table (an attention factor scales it).
    """
    best: tuple[str, str, float] | None = None
    for source, table in (("cos", cos), ("sin", sin)):
        scale = max(1.0, float(np.abs(table).max()) if table.size else 1.0)
        for layout in LAYOUTS:
            if values.shape[-1] != width_of(layout, table.shape[-1]):
                continue
            error = float(np.abs(values - arrange_np(table, layout)).max()) / scale
            if error <= MATCH_TOLERANCE and (best is None or error < best[2]):
                best = (source, layout, error)
    return best


def probe_positions(batch: int, seq: int, limit: int | None) -> np.ndarray:
    """``[batch, seq]`` int64 positions spread over ``[0, min(limit, PROBE_LIMIT))``: small ones (where the fastest
    frequencies tell layouts apart) and large ones (where the slowest frequencies do), every row different."""
    top = min(limit or PROBE_LIMIT, PROBE_LIMIT)
    count = batch * seq
    small = np.arange(count, dtype=np.int64) * 3 % max(top, 1)
    large = np.linspace(top // 2, top - 1, count).astype(np.int64)
    mixed = np.where(np.arange(count) % 2 == 0, small, large)
    return mixed.reshape(batch, seq)


__all__ = ["LAYOUTS", "MATCH_TOLERANCE", "arrange", "arrange_np", "match_layout", "probe_positions", "width_of"]
