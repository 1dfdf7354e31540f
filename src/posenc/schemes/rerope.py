"""ReRoPE and Leaky ReRoPE (attention placement: two score matrices).

Su Jianlin, "The road to upgrading Transformers 12: ReRoPE, infinite extrapolation?" (2023),
https://kexue.fm/archives/9708 (:data:`posenc.citations.SU_2023_REROPE`). Registers the schemes ``rerope`` and
``leaky_rerope``.
"""

from __future__ import annotations

from typing import Any

import torch

from posenc import functional
from posenc.citations import SU_2023_REROPE, ZHAO_2023_LLM_SURVEY
from posenc.config import AttentionConfig
from posenc.dtypes import compute_dtype
from posenc.schemes.base import (
    BOTH_TABLE_MODES,
    Param,
    Placement,
    PositionalScheme,
    SchemeSpec,
    soft_cap,
    softmax_attention,
)
from posenc.schemes.registry import register
from posenc.schemes.rope_angles import RotaryAngles
from posenc.schemes.rope_params import _COMMON, _rope_tolerances, rotary_dim_of


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


__all__ = ["LeakyReRope", "ReRope"]
