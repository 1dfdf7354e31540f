"""Attention blocks: projections, heads, a KV cache and one positional scheme, as torch modules.

``attention`` holds :class:`AttentionBlock` (multi-head and grouped-query attention with today's features: biases,
q/k norms, soft-caps, windows, sinks, gates), ``mla`` the multi-head latent attention block of DeepSeek-V2/V3, and
``build`` the factory that picks the block of a geometry. A block feature is a field of
:class:`posenc.config.AttentionConfig` and its step in ``AttentionBlock`` (docs/architecture.md, "Where additions go").
"""

from posenc.blocks.attention import AttentionBlock, default_positions
from posenc.blocks.build import Geometry, attention_config_from_dict, build_block, rotary_geometry
from posenc.blocks.mla import MLABlock, MLAConfig

__all__ = [
    "AttentionBlock",
    "Geometry",
    "MLABlock",
    "MLAConfig",
    "attention_config_from_dict",
    "build_block",
    "default_positions",
    "rotary_geometry",
]
