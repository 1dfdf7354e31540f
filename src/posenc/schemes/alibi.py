"""ALiBi: a per-head linear penalty on the attention scores, any head count (score placement)."""

from __future__ import annotations

import torch

from posenc import functional
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.schemes.base import (
    BOTH_TABLE_MODES,
    Param,
    Placement,
    PositionalScheme,
    SchemeSpec,
    TableMode,
    relative_distance,
)
from posenc.schemes.registry import register


def round_to_bfloat16(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to the nearest bfloat16 (ties to even), kept in ``x``'s dtype (a Cast pair in ONNX)."""
    return x.to(torch.bfloat16).to(x.dtype)


class Alibi(PositionalScheme):
    """ALiBi bias ``m_h * (j - i)`` (causal) or ``-m_h * |i - j|`` (symmetric), slopes from :func:`alibi_slopes`.

    ``alibi_bias_max`` is the largest exponent (MPT's ``attn_config.alibi_bias_max``; BLOOM, Falcon and the paper
    use 8); BLOOM's head order for other head counts is also MPT's. The bias is added to the scaled scores
    (BLOOM, MPT: ``q·k·scale + bias``); with ``scaled`` it is multiplied by the block's score scale too
    (Falcon: ``(q·k + bias)·scale``), which is folded into the slopes.

    ``bf16_rounding`` reproduces Falcon's ``build_alibi_tensor``, which computes the bias in bfloat16 from the
    key position alone: ``bf16(bf16(m_h) · bf16(j))`` for key position ``j`` (softmax sees it as ``m_h (j - i)``
    up to that rounding; every query row differs by the constant ``m_h i``), then ``· scale`` with ``scaled``.

    ``precomputed`` stores a ``[2 * max_positions - 1, H]`` table over relative distance (``[max_positions, H]``
    over key positions with ``bf16_rounding``); ``dynamic`` stores only the slopes. Shapes: q_pos ``[B, Sq]``,
    k_pos ``[B, Sk]`` -> bias ``[B, H, Sq, Sk]``.
    """

    # Buffers registered by register_table (which ones depends on the table mode): typed for the checker.
    key_table: torch.Tensor
    slopes: torch.Tensor
    table: torch.Tensor

    def build(self) -> None:
        symmetric = self.params["symmetric"]
        self.symmetric = (not self.config.causal) if symmetric is None else bool(symmetric)
        self.rounded = bool(self.params["bf16_rounding"])
        slopes = functional.alibi_slopes(
            self.config.num_heads, dtype=torch.float64, bias_max=self.params["alibi_bias_max"]
        )
        scale = self.score_scale() if self.params["scaled"] else 1.0
        if self.rounded:
            self.bias_scale = scale
            slopes = round_to_bfloat16(slopes)
            if self.table_mode is TableMode.PRECOMPUTED:
                values = self._rounded_values(torch.arange(self.max_positions, dtype=torch.float64), slopes) * scale
                self.register_table("key_table", values.to(self.table_dtype))
            else:
                self.register_table("slopes", slopes.to(self.table_dtype))
            return
        slopes = slopes * scale
        if self.table_mode is TableMode.PRECOMPUTED:
            distance = torch.arange(-(self.max_positions - 1), self.max_positions, dtype=torch.float64)
            self.register_table("table", (self._shape(distance).unsqueeze(-1) * slopes).to(self.table_dtype))
        else:
            self.register_table("slopes", slopes.to(self.table_dtype))

    def _shape(self, distance: torch.Tensor) -> torch.Tensor:
        return -distance.abs() if self.symmetric else distance

    @staticmethod
    def _rounded_values(positions: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
        """Falcon's ``bf16(bf16(m) · bf16(j))`` of float key positions ``[...]`` and bf16 slopes: ``[..., H]``."""
        return round_to_bfloat16(round_to_bfloat16(positions).unsqueeze(-1) * slopes)

    def bias(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        self.check_positions(q_pos)
        self.check_positions(k_pos)
        if self.rounded:
            if self.table_mode is TableMode.PRECOMPUTED:
                values = self.key_table[k_pos]  # [B, Sk, H]
            else:
                values = self._rounded_values(k_pos.to(self.slopes.dtype), self.slopes) * self.bias_scale
            b, sq, sk = k_pos.shape[0], q_pos.shape[1], k_pos.shape[1]
            return values.permute(0, 2, 1).unsqueeze(2).expand(b, self.config.num_heads, sq, sk)
        distance = relative_distance(q_pos, k_pos)  # j - i, [B, Sq, Sk]
        if self.table_mode is TableMode.PRECOMPUTED:
            return self.table[distance + (self.max_positions - 1)].permute(0, 3, 1, 2)
        shaped = self._shape(distance.to(self.slopes.dtype))
        return shaped.unsqueeze(1) * self.slopes.view(1, -1, 1, 1)


def _validate(params: dict, config: AttentionConfig) -> None:
    symmetric = (not config.causal) if params["symmetric"] is None else params["symmetric"]
    if params["bf16_rounding"] and symmetric:
        raise ConfigError(
            "alibi: bf16_rounding reproduces Falcon's bias of the key position, which stands for m(j - i) only "
            "in causal attention; use symmetric=False (a causal block) or bf16_rounding=False."
        )


Alibi.spec = SchemeSpec(
    name="alibi",
    title="ALiBi (attention with linear biases)",
    family="alibi",
    placement=Placement.SCORE,
    params=(
        Param(
            "symmetric",
            "bool",
            None,
            "False: m(j - i) for causal decoders; True: -m|i - j| for encoders; unset: True exactly when the "
            "block is not causal",
            optional=True,
        ),
        Param(
            "scaled",
            "bool",
            False,
            "False: q·k·scale + bias (BLOOM, MPT); True: (q·k + bias)·scale (Falcon, TensorRT-LLM alibi_with_scale)",
        ),
        Param(
            "bf16_rounding",
            "bool",
            False,
            "Falcon's build_alibi_tensor: slope and slope × key position rounded to bfloat16 (causal only)",
        ),
        Param(
            "alibi_bias_max",
            "float",
            8.0,
            "slopes 2^(-alibi_bias_max·i/n) (MPT's attn_config.alibi_bias_max; the paper, BLOOM, Falcon: 8)",
            minimum=0,
            exclusive_minimum=True,
        ),
    ),
    table_modes=BOTH_TABLE_MODES,
    validate=_validate,
    citation="Press et al., Train Short, Test Long: Attention with Linear Biases, ICLR 2022 (arXiv:2108.12409)",
    summary="Per-head linear distance penalty; slopes 2^(-8i/n), BLOOM's (= MPT's) order for other head counts.",
    cases={
        "default": {},
        "symmetric": {"symmetric": True},
        "falcon": {"scaled": True, "bf16_rounding": True},
        "bias_max": {"alibi_bias_max": 6.0},
    },
    verified_against="BLOOM, Falcon build_alibi_tensor and MPT build_mpt_alibi_tensor slopes; FalconAttention's "
    "(q·k + alibi)·scale; the paper's bias -m|i-j|",
)
register(Alibi.spec, Alibi)
