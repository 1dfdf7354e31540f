"""TUPE: untied absolute-position correlation plus an optional T5-style relative bias (score placement)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from posenc.citations import SU_2021_POSITION_ENCODINGS
from posenc.config import AttentionConfig
from posenc.dtypes import compute_dtype
from posenc.schemes.base import Param, Placement, PositionalScheme, SchemeSpec, TableMode
from posenc.schemes.registry import register
from posenc.schemes.relative import linear_in
from posenc.schemes.t5 import T5_PARAMS, T5BucketBias, validate_t5_buckets


class Tupe(PositionalScheme):
    """TUPE (Ke et al.): ``α_ij = q_i·k_j/√(2D) + (p_i U^Q)·(p_j U^K)/√(2D) + b_{j-i}``.

    ``p`` is a learned absolute table ``[max_positions, hidden]`` (so only ``precomputed`` exists), ``U^Q``,
    ``U^K`` per-head projections ``hidden -> H·D`` kept apart from the content projections (the untying), and
    ``b`` the T5 bucketed bias (:class:`posenc.schemes.t5.T5BucketBias`) when ``relative`` is set.
    :meth:`bias` returns the two position terms. Shapes: positions ``[B, S]`` -> bias ``[B, H, Sq, Sk]``.
    """

    def build(self) -> None:
        hidden, width = self.config.hidden_size, self.config.num_heads * self.config.head_dim
        self.position_embeddings = nn.Parameter(torch.randn(self.max_positions, hidden) * 0.02)
        self.pos_query_proj = nn.Linear(hidden, width, bias=False)  # U^Q
        self.pos_key_proj = nn.Linear(hidden, width, bias=False)  # U^K
        self.relative_bias = T5BucketBias.of_scheme(self) if self.params["relative"] else None

    def default_score_scale(self) -> float:
        return 1.0 / math.sqrt(2 * self.config.head_dim)

    def _project(self, positions: torch.Tensor, layer: nn.Linear, dtype: torch.dtype) -> torch.Tensor:
        """``p[positions] U`` per head: ``[B, S]`` -> ``[B, H, S, D]``."""
        b, s = positions.shape
        projected = linear_in(F.embedding(positions, self.position_embeddings), layer, dtype)
        return projected.view(b, s, self.config.num_heads, self.config.head_dim).transpose(1, 2)

    def bias(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        self.check_positions(q_pos)
        self.check_positions(k_pos)
        compute = compute_dtype(q)
        pos_q = self._project(q_pos, self.pos_query_proj, compute)
        pos_k = self._project(k_pos, self.pos_key_proj, compute)
        untied = (pos_q @ pos_k.transpose(-1, -2)) * self.score_scale()
        if self.relative_bias is None:
            return untied
        return untied + self.relative_bias(q_pos, k_pos).to(compute)


def _validate(params: dict, config: AttentionConfig) -> None:
    if params["relative"]:
        validate_t5_buckets(params, config)


Tupe.spec = SchemeSpec(
    name="tupe",
    title="TUPE (untied position correlation)",
    family="relative",
    placement=Placement.SCORE,
    params=(
        Param("relative", "bool", True, "add the T5-style bucketed relative bias b_{j-i}"),
        *T5_PARAMS,
    ),
    table_modes=frozenset({TableMode.PRECOMPUTED}),
    citation="Ke, He, Liu, Rethinking Positional Encoding in Language Pre-training, ICLR 2021 (arXiv:2006.15595); "
    f"{SU_2021_POSITION_ENCODINGS}, section T5式",
    summary="Absolute positions correlated through their own projections, 1/sqrt(2D) scaling, plus T5 buckets.",
    cases={"default": {}, "untied_only": {"relative": False}},
    validate=_validate,
    verified_against="naive per-(i, j) loop of the paper's eq. (float64); T5 buckets as in t5",
)
register(Tupe.spec, Tupe)
