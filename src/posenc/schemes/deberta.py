"""DeBERTa(-v2) disentangled attention: content-to-position and position-to-content terms (score placement)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from posenc import functional
from posenc.citations import SU_2021_POSITION_ENCODINGS
from posenc.config import AttentionConfig
from posenc.dtypes import compute_dtype
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
from posenc.schemes.relative import (
    distance_range,
    index_by_distance,
    linear_in,
    lookup_magnitude,
    magnitude_lookup_table,
)

ATTENTION_TERMS = ("c2p|p2c", "c2p", "p2c")
"""Values of ``pos_att_type``: both position terms (DeBERTa-v2/v3), or one of them."""


class Deberta(PositionalScheme):
    """DeBERTa-v2 disentangled attention (He et al.), as Hugging Face's ``DisentangledSelfAttention``.

    ``score_ij = [q_i·k_j + q_i·K_r[idx(i, j)] + k_j·Q_r[idx(i, j)]] · scale`` with the c2p term ``q·K_r`` and the
    p2c term ``k·Q_r`` as ``pos_att_type`` selects, ``scale = 1/√(D·(1 + terms))`` (or ``config.attn_scale``),
    ``idx(i, j) = clamp(bucket(q_pos_i - k_pos_j) + span, 0, 2·span - 1)``, ``bucket`` the log bucket of
    :func:`posenc.functional.deberta_log_bucket` (identity when ``position_buckets`` is 0) and
    ``span = position_buckets or max_relative_positions``. Hugging Face's p2c index ``-r(j, i) + span`` equals
    ``idx(i, j)`` because the bucket is odd in its argument.

    Parameters: ``rel_embeddings [2·span, hidden]`` (Hugging Face's ``encoder.rel_embeddings.weight``), optionally
    normalised by ``rel_norm`` (``nn.LayerNorm(hidden)``, the encoder's ``LayerNorm`` with
    ``norm_rel_ebd="layer_norm"``), then projected: ``K_r = pos_key_proj(R)``, ``Q_r = pos_query_proj(R)``
    (``share_att_key=False``; only the projections of the selected terms exist). With ``share_att_key=True`` the
    projections are the block's own ``k_proj`` / ``q_proj`` (biases included): an :class:`AttentionBlock` hands them
    over with :meth:`share_projections`, so they are the same modules (one set of weights in the state dict); the
    scheme built alone (the ``op`` export unit) keeps stand-in ``pos_key_proj`` / ``pos_query_proj`` of its own.

    ``precomputed``: ``idx`` over the ``2M - 1`` distances, and only the embedding rows those distances reach
    are projected; ``dynamic``: bucket magnitudes from a lookup table, sign applied (no float log, no limit).
    """

    # Buffers registered by register_table (which ones depends on the table mode): typed for the checker.
    row_table: torch.Tensor
    magnitude_buckets: torch.Tensor

    def build(self) -> None:
        self.position_buckets = int(self.params["position_buckets"])
        self.max_relative_positions = int(self.params["max_relative_positions"])
        self.span = self.position_buckets if self.position_buckets > 0 else self.max_relative_positions
        self.terms = tuple(self.params["pos_att_type"].split("|"))
        self.share_att_key = bool(self.params["share_att_key"])
        hidden, width = self.config.hidden_size, self.config.num_heads * self.config.head_dim
        self.rel_embeddings = nn.Parameter(torch.randn(2 * self.span, hidden) * 0.02)
        self.rel_norm = nn.LayerNorm(hidden, eps=self.params["rel_norm_eps"]) if self.params["rel_norm"] else None
        if "c2p" in self.terms:
            self.pos_key_proj = nn.Linear(hidden, width)
        if "p2c" in self.terms:
            self.pos_query_proj = nn.Linear(hidden, width)
        self._shared: dict[str, nn.Linear] = {}
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

    def default_score_scale(self) -> float:
        return 1.0 / math.sqrt((1 + len(self.terms)) * self.config.head_dim)

    def share_projections(self, query: nn.Linear, key: nn.Linear) -> None:
        """With ``share_att_key``: use ``query`` / ``key`` (the block's q/k projections) as the position projections.

        The scheme's own ``pos_query_proj`` / ``pos_key_proj`` are dropped; the given modules are referenced, not
        registered, so the block's state dict holds their weights once (under ``q_proj`` / ``k_proj``).
        """
        if not self.share_att_key:
            return
        for name in ("pos_query_proj", "pos_key_proj"):
            self._modules.pop(name, None)
        self._shared = {"pos_query_proj": query, "pos_key_proj": key}

    def projection(self, name: str) -> nn.Linear:
        """``pos_key_proj`` or ``pos_query_proj``: the block's shared projection, else the scheme's own."""
        shared = self._shared.get(name)
        return shared if shared is not None else getattr(self, name)

    def reference_bucket(self, delta: torch.Tensor) -> torch.Tensor:
        """Eager signed bucket of ``delta = query_pos - key_pos`` (the functional reference)."""
        if self.position_buckets <= 0:
            return delta.to(torch.int64)
        return functional.deberta_log_bucket(delta, self.position_buckets, self.max_relative_positions)

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

    def relative_embeddings(self, dtype: torch.dtype) -> torch.Tensor:
        """The used rows of ``rel_embeddings`` (after ``rel_norm``) in ``dtype``: ``[R, hidden]``."""
        rows = self.rel_embeddings[self.first_row : self.first_row + self.num_rows].to(dtype)
        if self.rel_norm is None:
            return rows
        norm = self.rel_norm
        return F.layer_norm(rows, norm.normalized_shape, norm.weight.to(dtype), norm.bias.to(dtype), norm.eps)

    def bias(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        compute = compute_dtype(q)
        rows = self.row_index(q_pos, k_pos)
        b, h, sq, sk, d = q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]
        embeddings = self.relative_embeddings(compute)
        terms = []
        if "c2p" in self.terms:
            pos_key = linear_in(embeddings, self.projection("pos_key_proj"), compute).view(-1, h, d).transpose(0, 1)
            c2p = q.to(compute) @ pos_key.transpose(-1, -2)  # [B, H, Sq, R]
            terms.append(torch.gather(c2p, -1, rows.unsqueeze(1).expand(b, h, sq, sk)))
        if "p2c" in self.terms:
            pos_query = linear_in(embeddings, self.projection("pos_query_proj"), compute)
            pos_query = pos_query.view(-1, h, d).transpose(0, 1)  # [H, R, D]
            p2c = k.to(compute) @ pos_query.transpose(-1, -2)  # [B, H, Sk, R]
            index = rows.transpose(1, 2).unsqueeze(1).expand(b, h, sk, sq)
            terms.append(torch.gather(p2c, -1, index).transpose(-1, -2))
        return sum(terms[1:], terms[0]) * self.score_scale()


def _validate(params: dict, config: AttentionConfig) -> None:
    if params["share_att_key"] and config.num_kv_heads != config.num_heads:
        raise ConfigError(
            f"deberta: share_att_key projects the relative embeddings with the block's k_proj, which has "
            f"{config.num_kv_heads} kv heads but the position term needs {config.num_heads}; use num_kv_heads = "
            f"num_heads (DeBERTa has no grouped-query attention) or share_att_key=False."
        )
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
        Param(
            "pos_att_type",
            "str",
            "c2p|p2c",
            "position terms: c2p (content-to-position), p2c (position-to-content) or both; scale 1/√(D·(1 + terms))",
            choices=ATTENTION_TERMS,
        ),
        Param(
            "share_att_key",
            "bool",
            False,
            "True: the relative embeddings are projected by the block's own q_proj/k_proj (DeBERTa-v3); "
            "False: by separate pos_query_proj/pos_key_proj",
        ),
        Param("rel_norm", "bool", False, "LayerNorm on the relative embeddings (norm_rel_ebd='layer_norm')"),
        Param(
            "rel_norm_eps",
            "float",
            1e-7,
            "epsilon of that LayerNorm (layer_norm_eps)",
            minimum=0,
            exclusive_minimum=True,
        ),
    ),
    table_modes=BOTH_TABLE_MODES,
    citation="He et al., DeBERTa: Decoding-enhanced BERT with Disentangled Attention, ICLR 2021 "
    f"(arXiv:2006.03654); {SU_2021_POSITION_ENCODINGS}, section DeBERTa式",
    summary="Content-to-position and/or position-to-content terms over log-bucketed q - k, scaled 1/sqrt(D(1+terms)).",
    cases={
        "default": {},
        "log_buckets": {"position_buckets": 8, "max_relative_positions": 16},
        "clipped": {"position_buckets": 0, "max_relative_positions": 4},
        "c2p_rel_norm": {"position_buckets": 8, "max_relative_positions": 16, "pos_att_type": "c2p", "rel_norm": True},
    },
    validate=_validate,
    verified_against="Hugging Face DisentangledSelfAttention (share_att_key, pos_att_type), "
    "DebertaV2Encoder.get_rel_embedding, make_log_bucket_position",
)
register(Deberta.spec, Deberta)
