"""RoPE inside linear attention (Su 2021, https://kexue.fm/archives/8265, section 线性场景).

Registers the scheme ``rope_linear_attention``: RoPE in the numerator only (Su, RoFormer eq. 29).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from posenc import functional
from posenc.citations import SU_2021_ROPE
from posenc.config import AttentionConfig
from posenc.dtypes import compute_dtype
from posenc.errors import ConfigError
from posenc.schemes.base import BOTH_TABLE_MODES, Placement, PositionalScheme, SchemeSpec, Tolerance, causal_mask
from posenc.schemes.registry import register
from posenc.schemes.rope_angles import RotaryAngles
from posenc.schemes.rope_params import _COMMON, ROFORMER, rotary_dim_of


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


__all__ = ["RopeLinearAttention"]
