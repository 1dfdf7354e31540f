"""Relative-position schemes: Shaw et al. (clipped key and value terms) and Transformer-XL / XLNet.

This module also holds the distance helpers the whole relative family shares (T5, DeBERTa and TUPE live in
``t5.py``, ``deberta.py`` and ``tupe.py``):

- ``precomputed`` tables cover the ``2 * max_positions - 1`` relative distances ``-(M - 1) .. M - 1`` with the
  clip or bucket baked in, and are gathered at ``distance + M - 1`` (:func:`distance_range`,
  :func:`index_by_distance`).
- ``dynamic`` bucket ids are computed in the graph without a float log: a small int64 lookup table over the
  distance magnitude ``0 .. A`` is built once in eager torch from the reference bucket function of
  :mod:`posenc.functional`, and magnitudes past ``A`` (where every bucket is saturated) are clamped to ``A``
  (:func:`magnitude_lookup_table`, :func:`lookup_magnitude`). No length limit, and the graph reproduces
  torch's float32 log exactly because it never takes one.

Distances follow :func:`posenc.schemes.base.relative_distance`: ``d = key_pos - query_pos`` (``j - i``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from posenc import functional
from posenc.citations import SU_2021_POSITION_ENCODINGS
from posenc.config import AttentionConfig
from posenc.dtypes import compute_dtype
from posenc.errors import ConfigError, PositionError
from posenc.schemes.base import (
    BOTH_TABLE_MODES,
    Param,
    Placement,
    PositionalScheme,
    SchemeSpec,
    TableMode,
    is_tracing,
    relative_distance,
    soft_cap,
)
from posenc.schemes.registry import register

_MAX_LOOKUP = 1 << 24

# --------------------------------------------------------------------------------------------------
# Shared distance helpers
# --------------------------------------------------------------------------------------------------


def distance_range(max_positions: int) -> torch.Tensor:
    """Every relative distance two positions below ``max_positions`` can have: int64 ``[2M - 1]``, ``-(M-1)..M-1``."""
    return torch.arange(-(max_positions - 1), max_positions, dtype=torch.int64)


def index_by_distance(table: torch.Tensor, distance: torch.Tensor, max_positions: int) -> torch.Tensor:
    """Rows of a table over :func:`distance_range` for ``distance`` ``[...]``: returns ``[..., *table.shape[1:]]``."""
    return table[distance + (max_positions - 1)]


def magnitude_lookup_table(
    bucket_of_magnitude: Callable[[torch.Tensor], torch.Tensor],
    saturated: Callable[[torch.Tensor], torch.Tensor],
    start: int,
    limit: int = _MAX_LOOKUP,
) -> torch.Tensor:
    """A bucket function of the distance magnitude, tabulated up to where it saturates.

    Args:
        bucket_of_magnitude: eager reference, int64 magnitudes ``[n]`` -> int64 buckets ``[n]``; must be
            non-decreasing, so that every magnitude past the first saturated one maps like it.
        saturated: buckets ``[n]`` -> bool ``[n]``, True where the bucket (and so every later one) is saturated.
        start: first table length to try (doubled until saturation is reached).
        limit: largest table length to try.

    Returns:
        int64 ``[A + 1]``: the buckets of magnitudes ``0 .. A``, ``A`` the first saturated magnitude.
    """
    size = max(int(start), 2)
    while size <= limit:
        values = bucket_of_magnitude(torch.arange(size, dtype=torch.int64)).to(torch.int64)
        hits = torch.nonzero(saturated(values)).flatten()
        if hits.numel():
            return values[: int(hits[0]) + 1].clone()
        size *= 2
    raise ConfigError(
        f"the bucket function does not saturate below distance {limit}; use smaller bucket parameters "
        f"or table mode 'precomputed'."
    )


def lookup_magnitude(table: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Buckets of non-negative int64 ``magnitude [...]`` from a :func:`magnitude_lookup_table` (clamped at its end)."""
    return table[magnitude.clamp(max=table.shape[0] - 1)]


def linear_in(x: torch.Tensor, layer: nn.Linear, dtype: torch.dtype) -> torch.Tensor:
    """``layer(x)`` computed in ``dtype`` (float32 math for half-precision weights and activations)."""
    bias = None if layer.bias is None else layer.bias.to(dtype)
    return F.linear(x.to(dtype), layer.weight.to(dtype), bias)


# --------------------------------------------------------------------------------------------------
# Shaw et al. 2018
# --------------------------------------------------------------------------------------------------


class ShawRelative(PositionalScheme):
    """Shaw et al. relative positions with key and value terms (attention placement).

    ``e_ij = q_i · (k_j + a^K[c(j - i)]) / √D`` (``config.attn_scale`` replaces ``1/√D``, then
    ``config.logit_softcap`` and ``config.sliding_window`` apply as in the block),
    ``z_i = Σ_j α_ij (v_j + a^V[c(j - i)])`` with ``c(d) = clip(d, -R, R) + R``. ``a^K`` and ``a^V`` are learned
    ``[2R + 1, D]`` tables shared by all heads. The key term is ``q @ a^Kᵀ`` gathered per (i, j); the value term
    sums the probabilities that fall on each clipped distance (a one-hot matmul, so only Equal/Cast/MatMul reach
    the exported graph).

    ``precomputed`` stores ``c`` over the ``2M - 1`` distances; ``dynamic`` clamps in the graph.
    Shapes: q, k, v ``[B, H, S, D]``; positions ``[B, S]`` -> ``[B, H, Sq, D]``.
    """

    # Buffers registered by register_table (which ones depends on the table mode): typed for the checker.
    row_table: torch.Tensor

    def build(self) -> None:
        self.max_relative_position = int(self.params["max_relative_position"])
        rows, d = 2 * self.max_relative_position + 1, self.config.head_dim
        self.key_table = nn.Parameter(torch.randn(rows, d) * d**-0.5)
        self.value_table = nn.Parameter(torch.randn(rows, d) * d**-0.5)
        if self.table_mode is TableMode.PRECOMPUTED:
            self.register_table("row_table", self.clipped_index(distance_range(self.max_positions)))

    def clipped_index(self, distance: torch.Tensor) -> torch.Tensor:
        """Table row ``clip(d, -R, R) + R`` of each distance ``d = j - i`` (int64, same shape)."""
        r = self.max_relative_position
        return distance.clamp(-r, r) + r

    def row_index(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Row of ``a^K`` / ``a^V`` for every (i, j): int64 ``[B, Sq, Sk]``."""
        self.check_positions(q_pos)
        self.check_positions(k_pos)
        distance = relative_distance(q_pos, k_pos)
        if self.table_mode is TableMode.PRECOMPUTED:
            return index_by_distance(self.row_table, distance, self.max_positions)
        return self.clipped_index(distance)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        causal: bool,
    ) -> torch.Tensor:
        compute = compute_dtype(q)
        rows = self.row_index(q_pos, k_pos)  # [B, Sq, Sk]
        b, h, sq, sk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        qc, kc, vc = q.to(compute), k.to(compute), v.to(compute)
        key_logits = qc @ self.key_table.to(compute).T  # [B, H, Sq, 2R + 1]
        relative = torch.gather(key_logits, -1, rows.unsqueeze(1).expand(b, h, sq, sk))
        scores = soft_cap((qc @ kc.transpose(-1, -2) + relative) * self.score_scale(), self.config.logit_softcap)
        mask = self.visible(q_pos, k_pos, causal)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        one_hot = (rows.unsqueeze(-1) == torch.arange(self.key_table.shape[0], device=rows.device)).to(compute)
        row_weights = (probs.transpose(1, 2) @ one_hot).transpose(1, 2)  # [B, H, Sq, 2R + 1]
        out = probs @ vc + row_weights @ self.value_table.to(compute)
        return out.to(v.dtype)


ShawRelative.spec = SchemeSpec(
    name="shaw",
    title="Shaw relative positions (clipped, key and value terms)",
    family="relative",
    placement=Placement.ATTENTION,
    params=(
        Param(
            "max_relative_position",
            "int",
            16,
            "clip distance R: a^K, a^V have 2R + 1 rows; |j - i| >= R shares the end rows",
            minimum=1,
        ),
    ),
    table_modes=BOTH_TABLE_MODES,
    citation="Shaw, Uszkoreit, Vaswani, Self-Attention with Relative Position Representations, NAACL 2018 "
    f"(arXiv:1803.02155); {SU_2021_POSITION_ENCODINGS}, section 经典式 (classic)",
    summary="Learned a^K, a^V over clip(j - i, -R, R) added to keys (scores) and values (outputs), shared by heads.",
    cases={"default": {}, "clipped": {"max_relative_position": 3}},
    verified_against="naive per-(i, j) loop of the paper's eqs. (float64)",
)
register(ShawRelative.spec, ShawRelative)


# --------------------------------------------------------------------------------------------------
# Transformer-XL / XLNet
# --------------------------------------------------------------------------------------------------


def rel_shift(scores: torch.Tensor, key_length: int) -> torch.Tensor:
    """XLNet's pad-free relative shift (``rel_shift_bnij``).

    Args:
        scores: ``[B, H, Sq, L]`` whose column ``c`` belongs to distance ``start - c`` for a decreasing
            distance sequence of length ``L = Sk + Sq`` (XLNet: ``start = klen``).
        key_length: Sk.

    Returns:
        ``[B, H, Sq, Sk]`` with ``out[..., i, j] = scores[..., i, Sq - i + j]`` (distance ``start - Sq + i - j``).
    """
    b, h, sq, length = scores.shape
    shifted = scores.reshape(b, h, length, sq)[:, :, 1:, :]
    return shifted.reshape(b, h, sq, length - 1)[..., :key_length]


class TransformerXL(PositionalScheme):
    """Transformer-XL / XLNet relative attention (score placement).

    ``score_ij = [(q_i + u)·k_j + (q_i + v)·W_R R_{i-j}] / √D`` with ``R`` the sinusoidal encoding of the
    distance ``i - j`` in Transformer-XL's ``[sin, cos]`` layout, ``u``, ``v`` learned ``[H, D]`` and ``W_R`` a
    learned ``hidden -> H·D`` projection. :meth:`bias` returns everything but ``q·k/√D``.

    The position term is computed for a run of distances (``Sk + Sq`` of them) and then arranged per (i, j):
    ``rel_shift=True`` uses XLNet's reshape trick (positions must be contiguous runs, as in XLNet);
    ``rel_shift=False`` gathers column ``top - (i - j)`` (any positions whose distances fit the run).
    ``precomputed``: ``R`` over distances ``±(M - 1)``; ``dynamic``: ``R`` from float32-exact angles
    (float64 angles when ``table_dtype`` is float64).
    """

    # Buffers registered by register_table (which ones depends on the table mode): typed for the checker.
    r_table: torch.Tensor
    inv_freq: torch.Tensor
    turns: torch.Tensor

    def build(self) -> None:
        h, d, hidden = self.config.num_heads, self.config.head_dim, self.config.hidden_size
        self.use_rel_shift = bool(self.params["rel_shift"])
        self.content_bias = nn.Parameter(torch.randn(h, d) * 0.02)  # u (XLNet r_w_bias)
        self.position_bias = nn.Parameter(torch.randn(h, d) * 0.02)  # v (XLNet r_r_bias)
        self.r_proj = nn.Linear(hidden, h * d, bias=False)  # W_R
        inv_freq = functional.sinusoidal_inv_freq(hidden)
        if self.table_mode is TableMode.PRECOMPUTED:
            angles = distance_range(self.max_positions).to(torch.float64).unsqueeze(-1) * inv_freq
            self.register_table("r_table", functional.sinusoidal_from_angles(angles, "concat").to(self.table_dtype))
        elif self.table_dtype == torch.float64:
            self.register_table("inv_freq", inv_freq)
        else:
            self.register_table("turns", functional.split_turns(inv_freq))

    def encode_distances(self, distance: torch.Tensor) -> torch.Tensor:
        """Sinusoidal ``R`` of int64 distances ``i - j`` ``[...]``: ``[..., hidden]`` in ``table_dtype``.

        In ``precomputed`` mode distances past the table are clamped to its ends (only the spare column of
        the rel-shift can reach them, and it is dropped).
        """
        if self.table_mode is TableMode.PRECOMPUTED:
            rows = (distance + (self.max_positions - 1)).clamp(0, 2 * self.max_positions - 2)
            return self.r_table[rows]
        if self.table_dtype == torch.float64:
            angles = distance.to(torch.float64).unsqueeze(-1) * self.inv_freq
        else:
            angles = functional.exact_angles(distance, self.turns)
        return functional.sinusoidal_from_angles(angles, "concat").to(self.table_dtype)

    def _position_scores(self, query: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        """``(q_i + v)·W_R R_d`` for each distance of ``distance [B, L]``: ``[B, H, Sq, L]``."""
        b, length = distance.shape
        r = linear_in(self.encode_distances(distance), self.r_proj, query.dtype)
        r = r.view(b, length, self.config.num_heads, self.config.head_dim).transpose(1, 2)  # [B, H, L, D]
        return query @ r.transpose(-1, -2)

    def position_term_rel_shift(self, query: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """XLNet's path: distances ``start .. start - (Sk + Sq) + 1`` then :func:`rel_shift`: ``[B, H, Sq, Sk]``.

        ``start = q_pos[:, 0] - k_pos[:, 0] + Sq`` (XLNet's ``klen`` when queries are the last Sq keys).
        """
        sq, sk = q_pos.shape[1], k_pos.shape[1]
        if not is_tracing():
            _require_contiguous(q_pos, "query")
            _require_contiguous(k_pos, "key")
        start = q_pos[:, :1] - k_pos[:, :1] + sq
        distance = start - torch.arange(sk + sq, device=q_pos.device)
        return rel_shift(self._position_scores(query, distance), sk)

    def position_term_gather(self, query: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Gather path: distances ``top .. top - (Sk + Sq) + 2``, column ``top - (i - j)``: ``[B, H, Sq, Sk]``.

        ``top = max(q_pos) - min(k_pos)`` per batch row.
        """
        sq, sk = q_pos.shape[1], k_pos.shape[1]
        top = q_pos.max(dim=1, keepdim=True).values - k_pos.min(dim=1, keepdim=True).values  # [B, 1]
        length = sk + sq - 1
        column = top.unsqueeze(-1) + relative_distance(q_pos, k_pos)  # top - (i - j), [B, Sq, Sk]
        if not is_tracing() and column.numel() and int(column.max()) >= length:
            raise PositionError(
                f"transformer_xl: the query and key positions span more distances than Sq + Sk - 1 = {length} "
                f"(positions with gaps); pass contiguous position ids."
            )
        distance = top - torch.arange(length, device=q_pos.device)
        scores = self._position_scores(query, distance)
        b, h = scores.shape[:2]
        return torch.gather(scores, -1, column.unsqueeze(1).expand(b, h, sq, sk))

    def bias(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        self.check_positions(q_pos)
        self.check_positions(k_pos)
        compute = compute_dtype(q)
        qc, kc = q.to(compute), k.to(compute)
        content = (kc @ self.content_bias.to(compute).unsqueeze(-1)).transpose(-1, -2)  # u·k_j, [B, H, 1, Sk]
        query = qc + self.position_bias.to(compute).unsqueeze(1)  # q_i + v, [B, H, Sq, D]
        if self.use_rel_shift:
            position = self.position_term_rel_shift(query, q_pos, k_pos)
        else:
            position = self.position_term_gather(query, q_pos, k_pos)
        return (content + position) * self.score_scale()


def _require_contiguous(positions: torch.Tensor, which: str) -> None:
    steps = positions[:, 1:] - positions[:, :-1]
    if steps.numel() and not bool((steps == 1).all()):
        raise PositionError(
            f"transformer_xl with rel_shift=True needs contiguous {which} positions (p, p + 1, ...); "
            f"use rel_shift=False for other position ids."
        )


def _validate_xl(params: dict, config: AttentionConfig) -> None:
    if config.hidden_size % 2:
        raise ConfigError(
            f"transformer_xl: hidden_size {config.hidden_size} is odd, but R = [sin, cos] needs an even width; "
            f"use an even hidden_size."
        )


TransformerXL.spec = SchemeSpec(
    name="transformer_xl",
    title="Transformer-XL / XLNet relative attention",
    family="relative",
    placement=Placement.SCORE,
    params=(
        Param(
            "rel_shift",
            "bool",
            True,
            "True: XLNet's reshape rel-shift (contiguous positions); False: gather by i - j (repeats allowed, no gaps)",
        ),
    ),
    table_modes=BOTH_TABLE_MODES,
    citation="Dai et al., Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context, ACL 2019 "
    f"(arXiv:1901.02860); Yang et al., XLNet, NeurIPS 2019; {SU_2021_POSITION_ENCODINGS}, section XLNET式",
    summary="(q + u)·k + (q + v)·W_R R_{i-j}, R sinusoidal [sin, cos] over the distance, XLNet's rel-shift.",
    cases={"default": {}, "gather": {"rel_shift": False}},
    validate=_validate_xl,
    verified_against="Hugging Face XLNetRelativeAttention.rel_attn_core / rel_shift_bnij; naive per-(i, j) loop",
)
register(TransformerXL.spec, TransformerXL)
