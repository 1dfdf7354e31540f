"""Rotary schemes: RoPE with every scaling type (one scheme per ``rope_type``, registered as types are).

All rotary schemes share one cos/sin source (:class:`RotaryAngles` and its data-dependent variants,
:mod:`posenc.schemes.rope_angles`): a precomputed float64-exact table gathered by position ids, or angles computed
from the positions with float32-exact range reduction (:func:`posenc.functional.exact_angles`), exact up to position
2**24. The family's parameters are in :mod:`posenc.schemes.rope_params`; ReRoPE / Leaky ReRoPE in
:mod:`posenc.schemes.rerope`; RoPE inside linear attention in :mod:`posenc.schemes.rope_linear`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from posenc import functional, rope_types
from posenc.errors import ConfigError, PositionError
from posenc.schemes.base import Placement, PositionalScheme, SchemeSpec, TableMode
from posenc.schemes.registry import get_spec, register, unregister
from posenc.schemes.rope_angles import RotaryAngles, build_rope_angles, scaled_position_limit
from posenc.schemes.rope_params import (
    _COMMON,
    ROFORMER,
    _rope_tolerances,
    _validate_rope,
    rope_parameters,
    rotary_width,
    scale_rate,
)


class Rotary(PositionalScheme):
    """RoPE: rotate q and k by position-dependent angles so that ⟨R_m q, R_n k⟩ depends on m - n only.

    The frequencies are those of one registered ``rope_type`` (:mod:`posenc.rope_types`); every ``rope*`` scheme
    is this class. Shapes: q ``[B, H, S, D]``, k ``[B, Hkv, S, D]``, position_ids ``[B, S]``; cos/sin ``[B, S, r/2]``.
    A type with a per-position scale (xPos) gives q and k their own cos/sin (:meth:`key_cos_sin`); positions are
    then limited to those whose scales stay normal numbers of the table dtype (:attr:`scale_limit`).
    """

    def __init__(self, *args: Any, rope_type: str = "default", **kwargs: Any) -> None:
        """:class:`PositionalScheme`'s arguments, plus the registered ``rope_type`` whose frequencies it uses."""
        self.rope_type = rope_type  # a name, not the entry: built modules pickle (torch.save) and stay small
        super().__init__(*args, **kwargs)

    @property
    def spec(self) -> SchemeSpec:  # type: ignore[override]  # a property over the base's class attribute
        return get_spec(rope_types.get(self.rope_type).scheme)

    def build(self) -> None:
        entry = rope_types.get(self.rope_type)
        self.position_axes = entry.position_axes
        self.layout = self.params["layout"]
        self.rotary_dim = rotary_width(self.rope_type, self.config.head_dim, self.params["partial_rotary_factor"])
        rate = scale_rate(self.rope_type, self.params, self.config)
        self.scale_limit = None if rate is None else scaled_position_limit(rate, self.table_dtype)
        self.table_dtype_name = str(self.table_dtype).removeprefix("torch.")
        precomputed = self.table_mode is TableMode.PRECOMPUTED
        if self.scale_limit is not None and precomputed and self.max_positions > self.scale_limit:
            raise ConfigError(
                f"{self.spec.name}: the q/k scales exp(±λ·n) leave {self.table_dtype_name}'s normal range past "
                f"position {self.scale_limit - 1}, so a table of {self.max_positions} rows cannot be built; use "
                f"max_positions <= {self.scale_limit} or a larger scale_base (the limit grows with it)."
            )
        build = functools.partial(
            build_rope_angles,
            self.rope_type,
            self.params,
            self.config,
            self.table_mode,
            self.max_positions,
            self.table_dtype,
        )
        self.angles = build()
        self.key_angles = None if rate is None else build(key=True)
        if entry.slot_axes is not None:
            axes = entry.slot_axes(self.rotary_dim, rope_parameters(self.rope_type, self.params, self.config))
            select = F.one_hot(axes, self.position_axes).T.reshape(self.position_axes, 1, 1, -1)
            self.register_table("axis_select", select.to(self.table_dtype))

    @property
    def position_limit(self) -> int | None:
        """The table's rows (precomputed), further bounded by :attr:`scale_limit` for scaled types."""
        limits = [limit for limit in (super().position_limit, self.scale_limit) if limit is not None]
        return min(limits) if limits else None

    def check_positions(self, position_ids: torch.Tensor) -> None:
        """:meth:`PositionalScheme.check_positions`, and for scaled types the range their scales stay finite in."""
        if self.scale_limit is not None and not functional.is_tracing() and position_ids.numel():
            high = int(position_ids.max())
            if high >= self.scale_limit:
                raise PositionError(
                    f"{self.spec.name}: position {high} is past {self.scale_limit - 1}, where the q/k scales "
                    f"exp(±λ·n) leave {self.table_dtype_name}'s normal range; raise scale_base (the limit grows "
                    f"with it)."
                )
        super().check_positions(position_ids)

    def cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [B, S]`` (``[A, B, S]`` for a multi-axis type) -> cos, sin ``[B, S, r/2]`` of q (attention
        factor and q's scale included). A multi-axis type computes each slot's cos/sin from every axis and keeps the
        axis the slot reads (a one-hot sum, exact): the same per-token cos/sin a fused ``RotaryEmbedding`` takes."""
        self.check_positions(position_ids)
        if self.position_axes == 1:
            return self.angles(position_ids)
        self._check_axes(position_ids)
        cos, sin = self.angles(position_ids)  # [A, B, S, r/2]
        return (cos * self.axis_select).sum(0), (sin * self.axis_select).sum(0)

    def _check_axes(self, position_ids: torch.Tensor) -> None:
        if not functional.is_tracing() and (position_ids.dim() != 3 or position_ids.shape[0] != self.position_axes):
            raise ConfigError(
                f"{self.spec.name} takes position ids [{self.position_axes}, B, S] (one row per axis), got shape "
                f"{list(position_ids.shape)}."
            )

    def key_cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [B, S]`` -> cos, sin ``[B, S, r/2]`` of k: :meth:`cos_sin` unless the type scales q and k."""
        if self.key_angles is None:
            return self.cos_sin(position_ids)
        self.check_positions(position_ids)
        return self.key_angles(position_ids)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(position_ids)
        key_cos, key_sin = (cos, sin) if self.key_angles is None else self.key_angles(position_ids)
        return (
            functional.apply_rope(q, cos.unsqueeze(1), sin.unsqueeze(1), self.layout, self.rotary_dim),
            functional.apply_rope(k, key_cos.unsqueeze(1), key_sin.unsqueeze(1), self.layout, self.rotary_dim),
        )


_FAMILY_CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "partial": {"partial_rotary_factor": 0.5},
    "interleaved": {"layout": "interleaved"},
}


def rope_scheme_spec(entry: rope_types.RopeType) -> SchemeSpec:
    """The scheme of a ``rope_type``: the RoPE family's parameters and cases plus the type's own."""
    own = str(entry.citation)
    return SchemeSpec(
        name=entry.scheme,
        title=entry.title,
        family="rope",
        placement=Placement.QK,
        params=(*_COMMON, *entry.params),
        table_modes=frozenset(TableMode(mode) for mode in entry.table_modes),
        citation=ROFORMER if own == ROFORMER else f"{ROFORMER}; {own}",
        summary=entry.summary,
        tolerances=_rope_tolerances(),
        cases={**_FAMILY_CASES, **entry.cases},
        validate=_validate_rope(entry.name),
        length_dependent=entry.length_dependent,
        verified_against=entry.reference,
        position_axes=entry.position_axes,
    )


def _add_scheme(entry: rope_types.RopeType) -> None:
    register(rope_scheme_spec(entry), functools.partial(Rotary, rope_type=entry.name))


def _remove_scheme(entry: rope_types.RopeType) -> None:
    unregister(entry.scheme)


rope_types.watch(_add_scheme, _remove_scheme)  # every rope_type, now and registered later, is a scheme

__all__ = ["ROFORMER", "Rotary", "RotaryAngles", "rope_parameters", "rope_scheme_spec", "rotary_width", "scale_rate"]
