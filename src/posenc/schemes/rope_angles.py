"""The rotary schemes' one cos/sin source: :class:`RotaryAngles` and its data-dependent variants.

A precomputed float64-exact table gathered by position ids, or angles computed from the positions with
float32-exact range reduction (:func:`posenc.functional.exact_angles`), exact up to position 2**24;
:class:`SwitchedAngles` switches between frequency sets, :class:`LengthAngles` follows the current length.
:func:`build_rope_angles` picks the source of a ``rope_type``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posenc import functional, rope_types
from posenc.config import AttentionConfig
from posenc.dtypes import compute_dtype
from posenc.errors import ConfigError
from posenc.schemes.base import TableHolder, TableMode
from posenc.schemes.rope_params import rope_parameters, rotary_width, scale_rate


class RotaryAngles(TableHolder):
    """cos/sin of ``angle(p) = p * inv_freq + phase`` (times ``attention_factor``, and times ``exp(log_scale * p)``
    when a per-position scale is given, as xPos gives q and k) for integer positions p.

    ``precomputed``: tables ``[max_positions, r/2]`` computed in float64, stored in ``table_dtype``.
    ``dynamic``: float32-exact angles from the positions (float64 angles when ``table_dtype`` is float64); the
    scale ``exp(p * log_scale)`` in ``table_dtype`` (its relative error in float32 is ~1e-7 · |p · log_scale|).
    """

    # Buffers registered by register_table (which ones depends on the table mode): typed for the checker.
    cos_table: torch.Tensor
    sin_table: torch.Tensor
    inv_freq: torch.Tensor
    phase: torch.Tensor
    turns: torch.Tensor
    log_scale: torch.Tensor

    def __init__(
        self,
        inv_freq: torch.Tensor,
        attention_factor: float,
        table_mode: TableMode,
        max_positions: int,
        table_dtype: torch.dtype,
        phase: torch.Tensor | None = None,
        log_scale: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        inv_freq = inv_freq.to(torch.float64)
        phase = torch.zeros_like(inv_freq) if phase is None else phase.to(torch.float64)
        self.table_mode = table_mode
        self.table_dtype = table_dtype
        self.attention_factor = float(attention_factor)
        self.has_phase = bool(phase.abs().max() > 0) if phase.numel() else False
        self.has_scale = log_scale is not None
        if table_mode is TableMode.PRECOMPUTED:
            positions = torch.arange(max_positions, dtype=torch.float64).unsqueeze(-1)
            angles = positions * inv_freq + phase
            factor = self.attention_factor
            if log_scale is not None:
                factor = torch.exp(positions * log_scale.to(torch.float64)) * factor  # type: ignore[assignment]  # a float becomes a tensor here
            self.register_table("cos_table", (torch.cos(angles) * factor).to(table_dtype))
            self.register_table("sin_table", (torch.sin(angles) * factor).to(table_dtype))
            return
        if table_dtype == torch.float64:
            self.register_table("inv_freq", inv_freq)
            self.register_table("phase", phase)
        else:
            self.register_table("turns", functional.split_turns(inv_freq))
            self.register_table("phase", torch.remainder(phase, 2 * math.pi).to(torch.float32))
        if log_scale is not None:
            self.register_table("log_scale", log_scale.to(compute_dtype(table_dtype)))

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [...]`` int64 -> ``(cos, sin)`` each ``[..., r/2]`` in ``table_dtype``."""
        if self.table_mode is TableMode.PRECOMPUTED:
            return F.embedding(position_ids, self.cos_table), F.embedding(position_ids, self.sin_table)
        if self.table_dtype == torch.float64:
            angles = position_ids.to(torch.float64).unsqueeze(-1) * self.inv_freq + self.phase
        else:
            angles = functional.exact_angles(position_ids, self.turns)
            if self.has_phase:
                angles = angles + self.phase
        cos, sin = torch.cos(angles), torch.sin(angles)
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        if self.has_scale:
            scale = torch.exp(position_ids.to(self.log_scale.dtype).unsqueeze(-1) * self.log_scale)
            cos, sin = cos * scale, sin * scale
        return cos.to(self.table_dtype), sin.to(self.table_dtype)


class SwitchedAngles(TableHolder):
    """Frequencies that switch with the current length L = max(position) + 1 (LongRoPE's short/long factors).

    One :class:`RotaryAngles` per set of :func:`posenc.functional.rope_frequency_sets`; the call's L picks one with
    :func:`posenc.rope_types.switch_at` (the type's own rule; one choice for the whole batch, like Hugging Face),
    computed in the graph, so an exported graph switches frequency sets by itself.
    """

    def __init__(self, sets: list[RotaryAngles], switch_points: tuple[int, ...]) -> None:
        super().__init__()
        if len(sets) != len(switch_points) + 1:
            raise ConfigError(
                f"{len(switch_points)} switch points need {len(switch_points) + 1} sets, got {len(sets)}."
            )
        self.sets = nn.ModuleList(sets)
        self.switch_points = tuple(int(point) for point in switch_points)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [...]`` int64 -> ``(cos, sin)`` each ``[..., r/2]`` of the set the length selects."""
        length = position_ids.max() + 1
        cos, sin = self.sets[0](position_ids)
        for point, source in zip(self.switch_points, list(self.sets)[1:], strict=True):
            cos_above, sin_above = source(position_ids)
            cos, sin = (
                rope_types.switch_at(length, point, cos, cos_above),
                rope_types.switch_at(length, point, sin, sin_above),
            )
        return cos, sin


class LengthAngles(TableHolder):
    """Frequencies that depend continuously on the current length L = max(position) + 1 (dynamic NTK).

    The rope type's own function runs on L as a 0-d tensor (:func:`posenc.functional.rope_inv_freq` with a tensor
    ``seq_len``), in float64, inside the graph; angles are float32-exact (:func:`posenc.functional.exact_angles`)
    or float64. Stateless: equals Hugging Face's cached update whenever the length only grows (prefill, decode).
    """

    def __init__(self, rotary_dim: int, rope_parameters: Mapping[str, Any], table_dtype: torch.dtype) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.rope_parameters = dict(rope_parameters)
        self.table_dtype = table_dtype

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [...]`` int64 -> ``(cos, sin)`` each ``[..., r/2]`` in ``table_dtype``."""
        inv_freq, factor = functional.rope_inv_freq(
            self.rotary_dim, self.rope_parameters, seq_len=position_ids.max() + 1
        )
        if self.table_dtype == torch.float64:
            angles = position_ids.to(torch.float64).unsqueeze(-1) * inv_freq
        else:
            angles = functional.exact_angles(position_ids, functional.split_turns(inv_freq))
        cos, sin = torch.cos(angles), torch.sin(angles)
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        return cos.to(self.table_dtype), sin.to(self.table_dtype)


def scaled_position_limit(rate: torch.Tensor, table_dtype: torch.dtype) -> int:
    """Exclusive bound on positions n whose scales exp(±λ n) stay normal numbers of ``table_dtype``."""
    steepest = float(rate.abs().max())
    if steepest == 0.0:
        return functional.RANGE_REDUCTION_MAX_POSITION
    return int(-math.log(torch.finfo(table_dtype).tiny) / steepest) + 1


def build_rope_angles(
    rope_type: str,
    params: Mapping[str, Any],
    config: AttentionConfig,
    table_mode: TableMode,
    max_positions: int,
    table_dtype: torch.dtype,
    *,
    key: bool = False,
) -> TableHolder:
    """The cos/sin source of a ``rope_type``: static, switching between frequency sets, or length-continuous.

    ``key``: the source of k's cos/sin, which differs from q's for types with a per-position scale (xPos: exp(-λ p)
    where q has exp(λ p)); for the other types both are the same.
    """
    entry = rope_types.get(rope_type)
    width = rotary_width(rope_type, config.head_dim, params["partial_rotary_factor"])
    hf = rope_parameters(rope_type, params, config)
    if entry.continuous:
        if table_mode is not TableMode.DYNAMIC:
            raise ConfigError(
                f"rope_type {rope_type!r} depends on the current length; it exists only in table mode 'dynamic'."
            )
        return LengthAngles(width, hf, table_dtype)
    points, sets = functional.rope_frequency_sets(width, hf)
    rate = scale_rate(rope_type, params, config)
    if rate is not None and key:
        rate = -rate
    sources = [
        RotaryAngles(freq, factor, table_mode, max_positions, table_dtype, log_scale=rate) for freq, factor in sets
    ]
    return SwitchedAngles(sources, points) if points else sources[0]


__all__ = ["LengthAngles", "RotaryAngles", "SwitchedAngles", "build_rope_angles", "scaled_position_limit"]
