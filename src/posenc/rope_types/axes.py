"""Built-in ``rope_type`` functions of positions with several axes: ``mrope`` (temporal, height, width ids) and
``axial`` (rows and columns of image patches).

Each section is one type: its function, then its :func:`register` call (the contract: :mod:`posenc.rope_types`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from posenc.citations import Citation
from posenc.errors import ConfigError
from posenc.params import Param
from posenc.rope_types.common import (
    SeqLen,
    default_inv_freq,
    default_type_inv_freq,
)
from posenc.rope_types.registry import RopeType, register

__all__ = ["AXIAL_COLUMNS", "axial_slot_axes", "mrope_slot_axes"]

# --------------------------------------------------------------------------------------------------
# mrope (Qwen2-VL / Qwen2.5-VL / Qwen3-VL): frequency slots split between temporal, height and width ids
# --------------------------------------------------------------------------------------------------


def _mrope_sections(rotary_dim: int, params: Mapping[str, Any]) -> tuple[int, int, int]:
    """``mrope_section`` (three slot counts t, h, w summing to r/2), or the Qwen split of r/2 when absent."""
    half = rotary_dim // 2
    given = params.get("mrope_section")
    if given is None:
        if params.get("mrope_interleaved"):
            h = (5 * half) // 16  # Qwen3-VL: [24, 20, 20] of 64
            return half - 2 * h, h, h
        t = half // 4  # Qwen2-VL: [16, 24, 24] of 64
        h = (half - t) // 2
        return t, h, half - t - h
    if isinstance(given, (str, bytes)) or not hasattr(given, "__len__") or len(given) != 3:
        raise ConfigError(f"mrope_section must be three slot counts [t, h, w] (e.g. [16, 24, 24]), got {given!r}.")
    try:
        counts = [int(value) for value in given if not isinstance(value, bool) and float(value).is_integer()]
    except (TypeError, ValueError):
        counts = []
    if len(counts) != 3 or min(counts) < 0:
        raise ConfigError(f"mrope_section entries must be ints >= 0, got {given!r}.")
    if sum(counts) != half:
        raise ConfigError(
            f"mrope_section {counts} sums to {sum(counts)}, but the rotary dim {rotary_dim} has {half} frequency "
            f"slots; the sections must cover them exactly (Qwen2-VL: [16, 24, 24] for head_dim 128)."
        )
    return counts[0], counts[1], counts[2]


def mrope_slot_axes(rotary_dim: int, params: Mapping[str, Any]) -> torch.Tensor:
    """Axis (0 temporal, 1 height, 2 width) of each of the r/2 slots.

    Chunked (Qwen2-VL's ``recomposition_frequencies``): the first t slots read the temporal ids, the next h the
    height ids, the last w the width ids. Interleaved (``mrope_interleaved``, Qwen3-VL): slot j reads height when
    ``j % 3 == 1`` and ``j < 3h``, width when ``j % 3 == 2`` and ``j < 3w``, temporal otherwise.
    """
    t, h, w = _mrope_sections(rotary_dim, params)
    half = rotary_dim // 2
    slots = torch.arange(half)
    if not params.get("mrope_interleaved"):
        return (slots >= t).to(torch.int64) + (slots >= t + h).to(torch.int64)
    axes = torch.zeros(half, dtype=torch.int64)
    axes[(slots % 3 == 1) & (slots < 3 * h)] = 1
    axes[(slots % 3 == 2) & (slots < 3 * w)] = 2
    if torch.bincount(axes, minlength=3).tolist() != [t, h, w]:
        raise ConfigError(
            f"mrope_section {[t, h, w]} cannot be interleaved over {half} slots (t, h, w, t, h, w, ...): the height "
            f"and width sections need 3·h - 2 and 3·w - 1 < {half}; use sections like Qwen3-VL's [24, 20, 20]."
        )
    return axes


def _mrope(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    mrope_slot_axes(rotary_dim, params)  # the sections are validated with the frequencies
    return default_type_inv_freq(rotary_dim, base, params, seq_len)


register(
    RopeType(
        name="mrope",
        inv_freq=_mrope,
        scheme="rope_mrope",
        title="M-RoPE (multimodal RoPE: temporal, height, width ids)",
        summary="RoPE whose frequency slots read three position ids [3, B, S] (temporal, height, width): in "
        "chunks of mrope_section (Qwen2-VL, Qwen2.5-VL) or interleaved t,h,w,t,h,w,... (Qwen3-VL); text tokens "
        "carry equal ids on the three axes, where it is plain RoPE. The causal mask follows token order.",
        citation=Citation(
            "Wang et al.",
            "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any Resolution",
            2024,
            "https://arxiv.org/abs/2409.12191",
        ),
        params=(
            Param(
                "mrope_section",
                "ints",
                None,
                "slots of the temporal, height and width ids, summing to r/2 (default: Qwen's split)",
                optional=True,
                minimum=0,
            ),
            Param("mrope_interleaved", "bool", False, "interleave t,h,w slots (Qwen3-VL) instead of chunks"),
        ),
        claims={"default": "mrope_section"},
        position_axes=3,
        slot_axes=mrope_slot_axes,
        cases={"qwen3_interleaved": {"mrope_interleaved": True}},
        reference="transformers' Qwen2VLTextRotaryEmbedding / Qwen3VLTextRotaryEmbedding and apply_rotary_pos_emb",
    )
)


# --------------------------------------------------------------------------------------------------
# axial (Qwen2-VL / Pixtral vision towers): rows and columns of image patches
# --------------------------------------------------------------------------------------------------

AXIAL_COLUMNS: tuple[str, ...] = ("same", "odd")
"""Column frequencies of axial RoPE: the rows' (Qwen2-VL vision) or the odd ones of the full set (Pixtral)."""


def _axial_columns(rotary_dim: int, params: Mapping[str, Any]) -> str:
    if rotary_dim % 4:
        raise ConfigError(
            f"axial RoPE splits the {rotary_dim // 2} frequency slots of rotary dim {rotary_dim} between rows and "
            f"columns; it needs a rotary dim divisible by 4."
        )
    columns = params.get("column_freqs", "same")
    if columns not in AXIAL_COLUMNS:
        raise ConfigError(f"axial column_freqs must be one of {list(AXIAL_COLUMNS)}, got {columns!r}.")
    return str(columns)


def axial_slot_axes(rotary_dim: int, params: Mapping[str, Any]) -> torch.Tensor:
    """Rows (axis 0) in the first r/4 slots, columns (axis 1) in the last r/4 (``cat(h, w)``, then the half layout's
    ``cat(hw, hw)``)."""
    _axial_columns(rotary_dim, params)
    quarter = rotary_dim // 4
    return torch.cat((torch.zeros(quarter, dtype=torch.int64), torch.ones(quarter, dtype=torch.int64)))


def _axial(rotary_dim: int, base: float, params: Mapping[str, Any], seq_len: SeqLen) -> tuple[torch.Tensor, float]:
    """Slots ``cat(rows, columns)``: rows get θ^(-4j/r) (the even frequencies of r), columns the same
    (``same``: Qwen2-VL's ``VisionRotaryEmbedding`` over head_dim / 2) or θ^(-(4j+2)/r) (``odd``: Pixtral's
    ``cat(inv_freq[0::2], inv_freq[1::2])``)."""
    columns = _axial_columns(rotary_dim, params)
    full = default_inv_freq(rotary_dim, base)
    return torch.cat((full[0::2], full[0::2] if columns == "same" else full[1::2])), 1.0


register(
    RopeType(
        name="axial",
        inv_freq=_axial,
        scheme="rope_axial",
        title="Axial 2-D RoPE (image patches: rows and columns)",
        summary="RoPE for vision patches with position ids [2, B, S] (row, column): the first half of the "
        "frequency slots rotate by the row, the second by the column, recombined cat(h, w) then cat(hw, hw). "
        "Columns use the rows' frequencies (Qwen2-VL vision) or the odd ones (Pixtral). Vision configs label it "
        "'axial' but each model recombines its own way, so config.json import leaves it to you.",
        citation=Citation(
            "Heo, Park, Han and Yun",
            "Rotary Position Embedding for Vision Transformer",
            2024,
            "https://arxiv.org/abs/2403.13298",
        ),
        params=(
            Param(
                "column_freqs",
                "str",
                "same",
                "same: columns rotate with the rows' frequencies (Qwen2-VL vision); odd: with θ^(-(4j+2)/r) (Pixtral)",
                choices=AXIAL_COLUMNS,
            ),
        ),
        in_transformers=False,
        position_axes=2,
        slot_axes=axial_slot_axes,
        cases={"pixtral": {"column_freqs": "odd"}},
        reference="transformers' Qwen2VLVisionRotaryEmbedding and PixtralVisionRotaryEmbedding with rotate_half",
    )
)
