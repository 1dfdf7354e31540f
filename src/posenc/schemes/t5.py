"""T5 bucketed relative bias (score placement), and the bucket-bias module TUPE reuses."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from posenc import functional
from posenc.citations import SU_2021_POSITION_ENCODINGS
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.schemes.base import (
    BOTH_TABLE_MODES,
    Param,
    Placement,
    PositionalScheme,
    SchemeSpec,
    TableHolder,
    TableMode,
    relative_distance,
)
from posenc.schemes.registry import register
from posenc.schemes.relative import (
    distance_range,
    index_by_distance,
    lookup_magnitude,
    magnitude_lookup_table,
)

T5_PARAMS = (
    Param("bidirectional", "bool", True, "True: keys after the query get their own half of the buckets (encoders)"),
    Param("num_buckets", "int", 32, "number of buckets: half exact distances, half log-spaced", minimum=2),
    Param(
        "max_distance", "int", 128, "distance at which the log-spaced buckets end (farther shares the last)", minimum=1
    ),
)
"""The bucket parameters of T5 (shared with TUPE's relative term)."""


def validate_t5_buckets(params: dict, config: AttentionConfig | None = None) -> None:
    """Raise :class:`ConfigError` for bucket parameters that give no log-spaced buckets."""
    per_side = params["num_buckets"] // 2 if params["bidirectional"] else params["num_buckets"]
    if per_side < 2:
        raise ConfigError(
            f"num_buckets {params['num_buckets']} leaves {per_side} bucket(s) per direction (bidirectional mode "
            f"halves them); use num_buckets >= 4 when bidirectional, >= 2 otherwise."
        )
    exact = per_side // 2
    if params["max_distance"] <= exact:
        raise ConfigError(
            f"max_distance {params['max_distance']} must exceed the {exact} exact buckets "
            f"(num_buckets // {4 if params['bidirectional'] else 2}); raise max_distance or lower num_buckets."
        )


class T5BucketBias(TableHolder):
    """Learned bias per (bucket, head): ``bias[b, h, i, j] = weight[bucket(k_pos[j] - q_pos[i]), h]``.

    ``precomputed``: bucket ids over the ``2M - 1`` distances (from :func:`posenc.functional.t5_relative_bucket`);
    ``dynamic``: bucket ids from a magnitude lookup table (no float log in the graph, no length limit).

    Args:
        num_heads: H.
        bidirectional, num_buckets, max_distance: as in :func:`posenc.functional.t5_relative_bucket`.
        table_mode: :class:`TableMode`.
        max_positions: M (precomputed mode).
        init_std: standard deviation of the initial weights.
    """

    # Buffers registered by register_table (which ones depends on the table mode): typed for the checker.
    bucket_table: torch.Tensor
    magnitude_buckets: torch.Tensor

    def __init__(
        self,
        num_heads: int,
        bidirectional: bool,
        num_buckets: int,
        max_distance: int,
        table_mode: TableMode,
        max_positions: int,
        init_std: float,
    ) -> None:
        super().__init__()
        self.bidirectional = bool(bidirectional)
        self.num_buckets = int(num_buckets)
        self.max_distance = int(max_distance)
        self.table_mode = table_mode
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.randn(num_buckets, num_heads) * init_std)
        if table_mode is TableMode.PRECOMPUTED:
            self.register_table("bucket_table", self.reference_bucket(distance_range(max_positions)))
        else:
            per_side = num_buckets // 2 if bidirectional else num_buckets
            self.register_table(
                "magnitude_buckets",
                magnitude_lookup_table(
                    lambda m: self.reference_bucket(-m), lambda b: b >= per_side - 1, max_distance + 1
                ),
            )

    @classmethod
    def of_scheme(cls, scheme: PositionalScheme) -> T5BucketBias:
        """The bias of a scheme with T5 bucket parameters (t5, tupe): its table mode and length, std E^-1/2."""
        config, params = scheme.config, scheme.params
        return cls(
            config.num_heads,
            params["bidirectional"],
            params["num_buckets"],
            params["max_distance"],
            scheme.table_mode,
            scheme.max_positions,
            init_std=config.hidden_size**-0.5,
        )

    def reference_bucket(self, distance: torch.Tensor) -> torch.Tensor:
        """Eager bucket ids of ``distance = key_pos - query_pos`` (the functional reference)."""
        return functional.t5_relative_bucket(distance, self.bidirectional, self.num_buckets, self.max_distance)

    def graph_bucket(self, distance: torch.Tensor) -> torch.Tensor:
        """Bucket ids of int64 ``distance [...]`` with integer ops and one lookup (what ``dynamic`` exports)."""
        if self.bidirectional:
            after = (distance > 0).to(torch.int64) * (self.num_buckets // 2)
            return lookup_magnitude(self.magnitude_buckets, distance.abs()) + after
        return lookup_magnitude(self.magnitude_buckets, (-distance).clamp(min=0))

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Positions ``[B, Sq]``, ``[B, Sk]`` -> bias ``[B, H, Sq, Sk]`` in the weight's dtype."""
        distance = relative_distance(q_pos, k_pos)
        if self.table_mode is TableMode.PRECOMPUTED:
            buckets = index_by_distance(self.bucket_table, distance, self.max_positions)
        else:
            buckets = self.graph_bucket(distance)
        return F.embedding(buckets, self.weight).permute(0, 3, 1, 2)


class T5Bias(PositionalScheme):
    """T5 relative bias (Raffel et al.): a learned ``[num_buckets, H]`` table added to unscaled scores.

    T5 folds ``1/√D`` into its initialisation, so its default score scale is 1. Shapes: positions ``[B, S]`` ->
    bias ``[B, H, Sq, Sk]``.
    """

    def build(self) -> None:
        self.relative_bias = T5BucketBias.of_scheme(self)

    def default_score_scale(self) -> float:
        return 1.0

    def bias(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        self.check_positions(q_pos)
        self.check_positions(k_pos)
        return self.relative_bias(q_pos, k_pos)


T5Bias.spec = SchemeSpec(
    name="t5",
    title="T5 bucketed relative bias",
    family="relative",
    placement=Placement.SCORE,
    params=T5_PARAMS,
    table_modes=BOTH_TABLE_MODES,
    citation="Raffel et al., Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer, "
    f"JMLR 2020 (arXiv:1910.10683); {SU_2021_POSITION_ENCODINGS}, section T5式 and its bucket table",
    summary="Learned per-head scalar per bucket of key - query: exact near, log-spaced far; unscaled q·k.",
    cases={"default": {}, "causal": {"bidirectional": False, "num_buckets": 16, "max_distance": 32}},
    validate=validate_t5_buckets,
    verified_against="Hugging Face T5Attention._relative_position_bucket; the bucket table of Su Jianlin (2021), "
    "https://kexue.fm/archives/8130",
)
register(T5Bias.spec, T5Bias)
