"""DeBERTa(-v2) disentangled attention: content-to-position and position-to-content terms (score placement)."""

from __future__ import annotations

import math

import torch
from torch import nn

from posenc import functional as PF
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.schemes import register
from posenc.schemes.base import Param, Placement, PositionalScheme, SchemeSpec, TableMode, relative_distance
from posenc.schemes.relative import (
    BOTH_MODES,
    compute_dtype,
    distance_range,
    index_by_distance,
    linear_in,
    lookup_magnitude,
    magnitude_lookup_table,
)


class Deberta(PositionalScheme):
    """DeBERTa-v2 disentangled attention (He et al.), as Hugging Face's ``DisentangledSelfAttention``.

    ``score_ij = [q_i·k_j + q_i·K_r[idx(i, j)] + k_j·Q_r[idx(i, j)]] / √(3D)`` with
    ``idx(i, j) = clamp(bucket(q_pos_i - k_pos_j) + span, 0, 2·span - 1)``, ``bucket`` the log bucket of
    :func:`posenc.functional.deberta_log_bucket` (identity when ``position_buckets`` is 0) and
    ``span = position_buckets or max_relative_positions``. ``K_r``, ``Q_r`` are the learned relative embeddings
    ``[2·span, hidden]`` through this scheme's own ``pos_key_proj`` / ``pos_query_proj`` (Hugging Face's
    ``share_att_key=False``). Hugging Face's p2c index ``-r(j, i) + span`` equals ``idx(i, j)`` because the
    bucket is odd in its argument.

    ``precomputed``: ``idx`` over the ``2M - 1`` distances, and only the embedding rows those distances reach
    are projected; ``dynamic``: bucket magnitudes from a lookup table, sign applied (no float log, no limit).
    """

    def build(self) -> None:
        self.position_buckets = int(self.params["position_buckets"])
        self.max_relative_positions = int(self.params["max_relative_positions"])
        self.span = self.position_buckets if self.position_buckets > 0 else self.max_relative_positions
        hidden, width = self.config.hidden_size, self.config.num_heads * self.config.head_dim
        self.rel_embeddings = nn.Parameter(torch.randn(2 * self.span, hidden) * 0.02)
        self.pos_key_proj = nn.Linear(hidden, width)
        self.pos_query_proj = nn.Linear(hidden, width)
        if self.table_mode is TableMode.PRECOMPUTED:
            index = self.reference_index(-distance_range(self.max_positions))
            self.first_row, self.num_rows = int(index.min()), int(index.max() - index.min()) + 1
            self.register_table("row_table", index - self.first_row)
        else:
            self.first_row, self.num_rows = 0, 2 * self.span
            self.register_table(
                "magnitude_buckets",
                magnitude_lookup_table(self.reference_bucket, lambda b: b >= self.span, 2 * self.span),
            )

    def score_scale(self) -> float:
        return 1.0 / math.sqrt(3 * self.config.head_dim)

    def reference_bucket(self, delta: torch.Tensor) -> torch.Tensor:
        """Eager signed bucket of ``delta = query_pos - key_pos`` (the functional reference)."""
        if self.position_buckets <= 0:
            return delta.to(torch.int64)
        return PF.deberta_log_bucket(delta, self.position_buckets, self.max_relative_positions)

    def reference_index(self, delta: torch.Tensor) -> torch.Tensor:
        """Embedding row ``clamp(bucket(delta) + span, 0, 2·span - 1)`` of each ``delta = q_pos - k_pos``."""
        return (self.reference_bucket(delta) + self.span).clamp(0, 2 * self.span - 1)

    def graph_index(self, delta: torch.Tensor) -> torch.Tensor:
        """:meth:`reference_index` with integer ops and one lookup (what ``dynamic`` exports)."""
        bucket = torch.sign(delta) * lookup_magnitude(self.magnitude_buckets, delta.abs())
        return (bucket + self.span).clamp(0, 2 * self.span - 1)

    def row_index(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Rows of the used embedding slice for every (i, j): int64 ``[B, Sq, Sk]``."""
        self.check_positions(q_pos)
        self.check_positions(k_pos)
        distance = relative_distance(q_pos, k_pos)  # k - q
        if self.table_mode is TableMode.PRECOMPUTED:
            return index_by_distance(self.row_table, distance, self.max_positions)
        return self.graph_index(-distance)

    def bias(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        compute = compute_dtype(q)
        rows = self.row_index(q_pos, k_pos)
        b, h, sq, sk, d = q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]
        embeddings = self.rel_embeddings[self.first_row : self.first_row + self.num_rows]
        pos_key = linear_in(embeddings, self.pos_key_proj, compute).view(-1, h, d).transpose(0, 1)  # [H, R, D]
        pos_query = linear_in(embeddings, self.pos_query_proj, compute).view(-1, h, d).transpose(0, 1)
        c2p = q.to(compute) @ pos_key.transpose(-1, -2)  # [B, H, Sq, R]
        c2p = torch.gather(c2p, -1, rows.unsqueeze(1).expand(b, h, sq, sk))
        p2c = k.to(compute) @ pos_query.transpose(-1, -2)  # [B, H, Sk, R]
        p2c = torch.gather(p2c, -1, rows.transpose(1, 2).unsqueeze(1).expand(b, h, sk, sq)).transpose(-1, -2)
        return (c2p + p2c) * self.score_scale()


def _validate(params: dict, config: AttentionConfig) -> None:
    buckets, max_relative = params["position_buckets"], params["max_relative_positions"]
    if buckets == 0:
        return
    if buckets < 4:
        raise ConfigError(
            f"deberta: position_buckets {buckets} is too small for log buckets; use >= 4, or 0 for plain "
            f"relative positions clipped at max_relative_positions."
        )
    if max_relative <= buckets // 2 + 1:
        raise ConfigError(
            f"deberta: max_relative_positions {max_relative} must exceed position_buckets // 2 + 1 = "
            f"{buckets // 2 + 1} (the log buckets start there); raise max_relative_positions or lower "
            f"position_buckets."
        )


Deberta.spec = SchemeSpec(
    name="deberta",
    title="DeBERTa disentangled attention (c2p + p2c, log buckets)",
    family="relative",
    placement=Placement.SCORE,
    params=(
        Param(
            "position_buckets",
            "int",
            256,
            "relative-position buckets (exact within ±buckets/2, log beyond); 0 = no buckets, plain clipping",
            minimum=0,
        ),
        Param(
            "max_relative_positions",
            "int",
            512,
            "largest distance the log buckets resolve (span of the embeddings when position_buckets is 0)",
            minimum=1,
        ),
    ),
    table_modes=BOTH_MODES,
    citation="He et al., DeBERTa: Decoding-enhanced BERT with Disentangled Attention, ICLR 2021 "
    "(arXiv:2006.03654); seed 004 eq. 10",
    summary="Content-to-position and position-to-content terms over log-bucketed q - k, all scaled 1/sqrt(3D).",
    cases={
        "default": {},
        "log_buckets": {"position_buckets": 8, "max_relative_positions": 16},
        "clipped": {"position_buckets": 0, "max_relative_positions": 4},
    },
    validate=_validate,
    verified_against="Hugging Face DisentangledSelfAttention.disentangled_attention_bias, make_log_bucket_position",
)
register(Deberta.spec, Deberta)
