"""The block of a geometry: :func:`build_block` and :func:`attention_config_from_dict` pick
:class:`~posenc.blocks.attention.AttentionBlock` for an :class:`~posenc.config.AttentionConfig` and
:class:`~posenc.blocks.mla.MLABlock` for an :class:`~posenc.blocks.mla.MLAConfig`, so checkpoints, manifests and eager
rebuilds carry either."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from posenc.blocks.attention import AttentionBlock
from posenc.blocks.mla import MLA_KIND, MLABlock, MLAConfig
from posenc.config import AttentionConfig
from posenc.schemes.base import PositionalScheme, TableMode

Geometry = AttentionConfig | MLAConfig
"""The geometry of an attention block of either kind."""


def build_block(
    config: Geometry,
    scheme: str | PositionalScheme = "rope",
    params: Mapping[str, Any] | None = None,
    table_mode: TableMode | str | None = None,
    max_positions: int | None = None,
    table_dtype: torch.dtype | None = None,
) -> AttentionBlock | MLABlock:
    """The block of a geometry: :class:`MLABlock` for an :class:`MLAConfig`, else :class:`AttentionBlock`."""
    if isinstance(config, MLAConfig):
        return MLABlock(config, scheme, params, table_mode, max_positions, table_dtype)
    return AttentionBlock(config, scheme, params, table_mode, max_positions, table_dtype)


def rotary_geometry(config: Geometry) -> AttentionConfig:
    """The geometry a block's positional scheme rotates: ``config`` itself, or for an :class:`MLAConfig` the
    ``AttentionConfig`` of its rope slice (:meth:`MLAConfig.rope_config`)."""
    return config.rope_config() if isinstance(config, MLAConfig) else config


def attention_config_from_dict(data: Mapping[str, Any]) -> Geometry:
    """An :class:`MLAConfig` (its dict says ``"block": "mla"``) or an :class:`AttentionConfig` from a dict."""
    if data.get("block") == MLA_KIND:
        return MLAConfig.from_dict(data)
    return AttentionConfig.from_dict(data)


__all__ = ["Geometry", "attention_config_from_dict", "build_block", "rotary_geometry"]
