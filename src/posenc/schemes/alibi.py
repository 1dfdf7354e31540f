"""ALiBi: a per-head linear penalty on the attention scores, any head count (score placement)."""

from __future__ import annotations

import torch

from posenc import functional as PF
from posenc.schemes import register
from posenc.schemes.base import Param, Placement, PositionalScheme, SchemeSpec, TableMode, relative_distance


class Alibi(PositionalScheme):
    """ALiBi bias ``m_h * (j - i)`` (causal) or ``-m_h * |i - j|`` (symmetric), slopes from :func:`alibi_slopes`.

    ``precomputed`` stores a ``[2 * max_positions - 1, H]`` table over relative distance; ``dynamic``
    stores only the slopes. Shapes: q_pos ``[B, Sq]``, k_pos ``[B, Sk]`` -> bias ``[B, H, Sq, Sk]``.
    """

    def build(self) -> None:
        symmetric = self.params["symmetric"]
        self.symmetric = (not self.config.causal) if symmetric is None else bool(symmetric)
        slopes = PF.alibi_slopes(self.config.num_heads, dtype=torch.float64)
        if self.table_mode is TableMode.PRECOMPUTED:
            distance = torch.arange(-(self.max_positions - 1), self.max_positions, dtype=torch.float64)
            self.register_table("table", (self._shape(distance).unsqueeze(-1) * slopes).to(self.table_dtype))
        else:
            self.register_table("slopes", slopes.to(self.table_dtype))

    def _shape(self, distance: torch.Tensor) -> torch.Tensor:
        return -distance.abs() if self.symmetric else distance

    def bias(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        self.check_positions(q_pos)
        self.check_positions(k_pos)
        distance = relative_distance(q_pos, k_pos)  # j - i, [B, Sq, Sk]
        if self.table_mode is TableMode.PRECOMPUTED:
            return self.table[distance + (self.max_positions - 1)].permute(0, 3, 1, 2)
        shaped = self._shape(distance.to(self.slopes.dtype))
        return shaped.unsqueeze(1) * self.slopes.view(1, -1, 1, 1)


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
    ),
    table_modes=frozenset({TableMode.PRECOMPUTED, TableMode.DYNAMIC}),
    citation="Press et al., Train Short, Test Long: Attention with Linear Biases, ICLR 2022 (arXiv:2108.12409)",
    summary="Per-head linear distance penalty; slopes 2^(-8i/n), BLOOM's interleaving for other head counts.",
    cases={"default": {}, "symmetric": {"symmetric": True}},
    verified_against="BLOOM build_alibi_tensor slopes; the paper's bias -m|i-j|",
)
register(Alibi.spec, Alibi)
