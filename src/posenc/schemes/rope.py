"""Rotary schemes: RoPE with every scaling type, ReRoPE / Leaky ReRoPE, RoPE inside linear attention.

All of them share one cos/sin source (:class:`RotaryAngles` and its data-dependent variants): a
precomputed float64-exact table gathered by position ids, or angles computed from the positions with
float32-exact range reduction (:func:`posenc.functional.exact_angles`), exact up to position 2**24.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posenc import functional, rope_types
from posenc.citations import SU_2021_ROPE, SU_2023_REROPE, ZHAO_2023_LLM_SURVEY
from posenc.config import AttentionConfig
from posenc.dtypes import compute_dtype
from posenc.errors import ConfigError, PositionError
from posenc.schemes.base import (
    BOTH_TABLE_MODES,
    Param,
    Placement,
    PositionalScheme,
    SchemeSpec,
    TableHolder,
    TableMode,
    Tolerance,
    causal_mask,
    soft_cap,
    softmax_attention,
)
from posenc.schemes.registry import get_spec, register, unregister

ROFORMER = str(rope_types.ROFORMER)


# --------------------------------------------------------------------------------------------------
# cos/sin sources
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Parameters shared by the RoPE family
# --------------------------------------------------------------------------------------------------

_COMMON = (
    Param(
        "rope_theta",
        "float",
        10000.0,
        "RoPE base θ (frequencies θ^(-2i/r))",
        minimum=0,
        exclusive_minimum=True,
    ),
    Param(
        "layout",
        "str",
        "half",
        "pairing: half = GPT-NeoX/Llama rotate_half, interleaved = GPT-J/RoFormer",
        choices=functional.ROPE_LAYOUTS,
    ),
    Param(
        "partial_rotary_factor",
        "float",
        1.0,
        "fraction of head_dim that is rotated (rest passes through)",
        minimum=0,
        exclusive_minimum=True,
        maximum=1.0,
    ),
)


def rotary_dim_of(head_dim: int, partial_rotary_factor: float) -> int:
    """Rotated width r = int(head_dim * partial_rotary_factor); must be even and >= 2."""
    r = int(head_dim * partial_rotary_factor)
    if r < 2 or r % 2:
        raise ConfigError(
            f"head_dim {head_dim} x partial_rotary_factor {partial_rotary_factor} gives rotary_dim {r}; RoPE "
            f"needs an even rotary_dim >= 2. Choose a factor that makes head_dim * factor even."
        )
    return r


def rotary_width(rope_type: str, head_dim: int, partial_rotary_factor: float) -> int:
    """Width the type's frequencies span: the rotated slice int(D * p) (``slice`` types, see
    :attr:`posenc.rope_types.RopeType.partial_rotary`) or the whole head dim (``proportional`` types)."""
    proportional = rope_types.get(rope_type).partial_rotary == "proportional"
    return rotary_dim_of(head_dim, 1.0 if proportional else partial_rotary_factor)


def rope_parameters(rope_type: str, params: Mapping[str, Any], config: AttentionConfig) -> dict[str, Any]:
    """Hugging Face ``rope_parameters`` for :func:`posenc.functional.rope_inv_freq` from a RoPE scheme's resolved
    parameters; what the scheme left as ``None`` comes from the geometry (:attr:`RopeType.geometry_defaults`)."""
    entry = rope_types.get(rope_type)
    out: dict[str, Any] = {
        "rope_type": entry.name,
        "rope_theta": params["rope_theta"],
        "max_position_embeddings": config.max_position_embeddings,
    }
    if entry.partial_rotary == "proportional":
        out["partial_rotary_factor"] = params["partial_rotary_factor"]
    out.update({name: params[name] for name in entry.param_names if params.get(name) is not None})
    if entry.geometry_defaults is not None:
        width = rotary_width(rope_type, config.head_dim, params["partial_rotary_factor"])
        derived = entry.geometry_defaults(out, width)
        out.update({key: value for key, value in derived.items() if out.get(key) is None})
    return out


def _validate_rope(rope_type: str) -> Callable[[dict[str, Any], AttentionConfig], None]:
    def check(params: dict[str, Any], config: AttentionConfig) -> None:
        width = rotary_width(rope_type, config.head_dim, params["partial_rotary_factor"])
        functional.rope_inv_freq(
            width, rope_parameters(rope_type, params, config), seq_len=config.max_position_embeddings
        )

    return check


def scale_rate(rope_type: str, params: Mapping[str, Any], config: AttentionConfig) -> torch.Tensor | None:
    """The type's per-position q scale rate λ (float64 ``[r/2]``, :attr:`posenc.rope_types.RopeType.scale_rate`;
    k's is -λ), or ``None`` for a pure rotation."""
    entry = rope_types.get(rope_type)
    if entry.scale_rate is None:
        return None
    width = rotary_width(rope_type, config.head_dim, params["partial_rotary_factor"])
    return entry.scale_rate(width, rope_parameters(rope_type, params, config))


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


# --------------------------------------------------------------------------------------------------
# RoPE (qk placement): one class, parameterised by the rope_type
# --------------------------------------------------------------------------------------------------


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


def _rope_tolerances() -> dict[str, Tolerance]:
    return {
        "float32": Tolerance(atol=3e-5, rtol=1e-4),
        "float16": Tolerance(atol=4e-3, rtol=4e-3),
        "bfloat16": Tolerance(atol=3e-2, rtol=3e-2),
    }


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


# --------------------------------------------------------------------------------------------------
# ReRoPE and Leaky ReRoPE (attention placement: two score matrices)
# --------------------------------------------------------------------------------------------------


class ReRope(PositionalScheme):
    """ReRoPE / Leaky ReRoPE: relative position t kept within the window w, compressed beyond it.

    ``g(t) = t`` for ``|t| < w``; ``sign(t) * (w + (|t| - w) / k)`` beyond (Leaky ReRoPE with factor k;
    ReRoPE is k = ∞, i.e. ``sign(t) * w``). Implemented with two score matrices (three when
    bidirectional): normal RoPE inside the window, and q rotated at ``i/k ± w(1 - 1/k)`` against k rotated
    at ``j/k`` outside, selected per (i, j). Shapes: q, k, v ``[B, H, S, D]``; positions ``[B, S]``.
    """

    leaky = False

    def build(self) -> None:
        self.layout = self.params["layout"]
        self.window = int(self.params["window"])
        self.rotary_dim = rotary_dim_of(self.config.head_dim, self.params["partial_rotary_factor"])
        inv_freq, _ = functional.rope_inv_freq(self.rotary_dim, {"rope_theta": self.params["rope_theta"]})
        inverse_k = 1.0 / self.params["factor"] if self.leaky else 0.0
        shift = inv_freq * (self.window * (1.0 - inverse_k))

        def angles(freq: torch.Tensor, phase: torch.Tensor | None = None) -> RotaryAngles:
            return RotaryAngles(freq, 1.0, self.table_mode, self.max_positions, self.table_dtype, phase=phase)

        self.near = angles(inv_freq)
        self.far_q = angles(inv_freq * inverse_k, shift)
        self.far_q_neg = angles(inv_freq * inverse_k, -shift)
        self.far_k = angles(inv_freq * inverse_k)

    def _rot(self, x: torch.Tensor, source: RotaryAngles, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = source(pos)
        return functional.apply_rope(x, cos.unsqueeze(1), sin.unsqueeze(1), self.layout, self.rotary_dim)

    def scores(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool
    ) -> torch.Tensor:
        """Scaled scores ``[B, H, Sq, Sk]`` (before masking), computed in float32 (float64 for float64)."""
        self.check_positions(q_pos)
        self.check_positions(k_pos)
        compute = compute_dtype(q)
        q, k = q.to(compute), k.to(compute)
        near = self._rot(q, self.near, q_pos) @ self._rot(k, self.near, k_pos).transpose(-1, -2)
        k_far = self._rot(k, self.far_k, k_pos).transpose(-1, -2)
        far = self._rot(q, self.far_q, q_pos) @ k_far
        distance = (q_pos.unsqueeze(2) - k_pos.unsqueeze(1)).unsqueeze(1)  # i - j, [B, 1, Sq, Sk]
        scores = torch.where(distance >= self.window, far, near)
        if not causal:
            far_neg = self._rot(q, self.far_q_neg, q_pos) @ k_far
            scores = torch.where(distance <= -self.window, far_neg, scores)
        return scores * self.score_scale()

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        causal: bool,
    ) -> torch.Tensor:
        scores = soft_cap(self.scores(q, k, q_pos, k_pos, causal), self.config.logit_softcap)
        mask = self.visible(q_pos, k_pos, causal)
        return softmax_attention(scores, v.to(scores.dtype), mask).to(v.dtype)


class LeakyReRope(ReRope):
    __doc__ = ReRope.__doc__
    leaky = True


_WINDOW = Param("window", "int", 512, "window w: exact relative positions for |i - j| < w", minimum=1)
_RE_CASES: dict[str, dict[str, Any]] = {"default": {"window": 6}, "interleaved": {"window": 5, "layout": "interleaved"}}


def _check_rotary_dim(params: dict[str, Any], config: AttentionConfig) -> None:
    """Refuse a ``partial_rotary_factor`` that rotates no pair of the head dim (raises ConfigError)."""
    rotary_dim_of(config.head_dim, params["partial_rotary_factor"])


_REROPE_CITE = f"{SU_2023_REROPE}; {ZHAO_2023_LLM_SURVEY}, book §5.4 (position truncation)"

ReRope.spec = SchemeSpec(
    name="rerope",
    title="ReRoPE (window-truncated relative positions)",
    family="rope",
    placement=Placement.ATTENTION,
    params=(*_COMMON, _WINDOW),
    table_modes=BOTH_TABLE_MODES,
    citation=_REROPE_CITE,
    summary="RoPE whose relative position is clipped to the window w beyond it; two score matrices.",
    tolerances=_rope_tolerances(),
    cases=_RE_CASES,
    validate=_check_rotary_dim,
    verified_against="naive per-(i, j) rotation by g(i - j) (ReRoPE's g of kexue.fm/archives/9708)",
)
LeakyReRope.spec = SchemeSpec(
    name="leaky_rerope",
    title="Leaky ReRoPE",
    family="rope",
    placement=Placement.ATTENTION,
    params=(
        *_COMMON,
        _WINDOW,
        Param(
            "factor",
            "float",
            16.0,
            "k: beyond the window relative positions grow 1/k as fast; k = (T'_max - w) / (T_max - w)",
            minimum=1.0,
            exclusive_minimum=True,
        ),
    ),
    table_modes=BOTH_TABLE_MODES,
    citation=_REROPE_CITE,
    summary="ReRoPE that keeps growing beyond the window with slope 1/k (linear interpolation of far positions).",
    tolerances=_rope_tolerances(),
    cases={
        "default": {"window": 6, "factor": 4.0},
        "interleaved": {"window": 5, "factor": 3.0, "layout": "interleaved"},
    },
    validate=_check_rotary_dim,
    verified_against="naive per-(i, j) rotation by g(i - j) (Leaky ReRoPE's g of kexue.fm/archives/9708)",
)
register(ReRope.spec, ReRope)
register(LeakyReRope.spec, LeakyReRope)


# --------------------------------------------------------------------------------------------------
# RoPE inside linear attention (Su 2021, https://kexue.fm/archives/8265, section 线性场景)
# --------------------------------------------------------------------------------------------------


class RopeLinearAttention(PositionalScheme):
    """Linear attention with RoPE in the numerator only (Su, RoFormer eq. 29).

    ``out_i = Σ_j [R_i φ(q_i)]ᵀ [R_j φ(k_j)] v_j / Σ_j φ(q_i)ᵀ φ(k_j)`` with φ = elu + 1, the sums over
    j <= i when causal. Computed in the quadratic form (exact); :meth:`attend_recurrent` is the O(S)
    form. Shapes: q, k, v ``[B, H, S, D]``; positions ``[B, S]``.
    """

    def build(self) -> None:
        self.layout = self.params["layout"]
        self.rotary_dim = rotary_dim_of(self.config.head_dim, self.params["partial_rotary_factor"])
        inv_freq, _ = functional.rope_inv_freq(self.rotary_dim, {"rope_theta": self.params["rope_theta"]})
        self.angles = RotaryAngles(inv_freq, 1.0, self.table_mode, self.max_positions, self.table_dtype)

    @staticmethod
    def feature_map(x: torch.Tensor) -> torch.Tensor:
        """φ(x) = elu(x) + 1 (non-negative), Katharopoulos et al. 2020."""
        return F.elu(x) + 1.0

    def _rot(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self.angles(pos)
        return functional.apply_rope(x, cos.unsqueeze(1), sin.unsqueeze(1), self.layout, self.rotary_dim)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        causal: bool,
    ) -> torch.Tensor:
        self.check_positions(q_pos)
        self.check_positions(k_pos)
        compute = compute_dtype(q)
        qf, kf, vc = self.feature_map(q.to(compute)), self.feature_map(k.to(compute)), v.to(compute)
        numerator = self._rot(qf, q_pos) @ self._rot(kf, k_pos).transpose(-1, -2)
        denominator = qf @ kf.transpose(-1, -2)
        if causal:
            keep = causal_mask(q_pos, k_pos).to(compute)
            numerator, denominator = numerator * keep, denominator * keep
        out = (numerator @ vc) / denominator.sum(-1, keepdim=True)
        return out.to(v.dtype)

    def attend_recurrent(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Causal O(S) form: running sums of ``R_j φ(k_j) v_jᵀ`` and ``φ(k_j)`` (q, k, v share positions)."""
        compute = compute_dtype(q)
        qf, kf, vc = self.feature_map(q.to(compute)), self.feature_map(k.to(compute)), v.to(compute)
        qr, kr = self._rot(qf, position_ids), self._rot(kf, position_ids)
        state = torch.cumsum(kr.unsqueeze(-1) * vc.unsqueeze(-2), dim=2)  # [B, H, S, D, Dv]
        norm = torch.cumsum(kf, dim=2)  # [B, H, S, D]
        numerator = (qr.unsqueeze(-2) @ state).squeeze(-2)
        denominator = (qf * norm).sum(-1, keepdim=True)
        return (numerator / denominator).to(v.dtype)


def _validate_linear_attention(params: dict, config: AttentionConfig) -> None:
    rotary_dim_of(config.head_dim, params["partial_rotary_factor"])
    softmax_only = {
        name: getattr(config, name)
        for name in ("attn_scale", "logit_softcap", "sliding_window")
        if getattr(config, name)
    }
    if softmax_only:
        raise ConfigError(
            f"rope_linear_attention has no softmax scores for {sorted(softmax_only)} to act on (φ(q)·φ(k) is "
            f"normalised by its own sum); leave them unset, or use a softmax scheme such as 'rope'."
        )


RopeLinearAttention.spec = SchemeSpec(
    name="rope_linear_attention",
    title="RoPE in linear attention",
    family="rope",
    placement=Placement.ATTENTION,
    params=_COMMON,
    table_modes=BOTH_TABLE_MODES,
    citation=f"{ROFORMER} (RoPE with linear attention); {SU_2021_ROPE}, section 线性场景 (linear attention); "
    "Katharopoulos et al., Transformers are RNNs, ICML 2020 (φ = elu + 1)",
    summary="Linear attention with RoPE only in the numerator; the only relative scheme linear attention admits.",
    tolerances={
        "float32": Tolerance(atol=5e-5, rtol=2e-4),
        "float16": Tolerance(atol=6e-3, rtol=6e-3),
        "bfloat16": Tolerance(atol=4e-2, rtol=4e-2),
    },
    cases={"default": {}, "interleaved": {"layout": "interleaved"}},
    validate=_validate_linear_attention,
    verified_against="the numerator-only formula of kexue.fm/archives/8265 (section 线性场景) computed per query "
    "with explicit loops; the O(S) recurrent form",
)
register(RopeLinearAttention.spec, RopeLinearAttention)
