"""One layer of a checkpoint as posenc builds it (what a family's ``geometry`` returns)."""

from __future__ import annotations

import dataclasses
from typing import Any

from posenc.blocks import MLAConfig
from posenc.config import AttentionConfig


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """One layer of a checkpoint as posenc builds it.

    Attributes:
        config: attention geometry (and block features: biases, norms, scale, window, ...); an
            :class:`~posenc.blocks.mla.MLAConfig` for multi-head latent attention.
        scheme: registered scheme name (``posenc list``).
        params: scheme parameters.
        layer: the layer index within its stack.
        layer_type: the stack or kind of the layer (``decoder``, ``encoder``, ``sliding_attention``, ...), or None.
        decoder: True when the layer is used with a KV cache (decode steps make sense).
        layout: tags a family sets where its model types store the same block differently (e.g. an output gate
            inside ``q_proj`` or in a module of its own), read by the conditions of its weight table's rules.
    """

    config: AttentionConfig | MLAConfig
    scheme: str
    params: dict[str, Any]
    layer: int
    layer_type: str | None = None
    decoder: bool = True
    layout: tuple[str, ...] = ()

    @property
    def attention(self) -> AttentionConfig:
        """``config`` of a (grouped-query) attention layer; TypeError for an MLA layer's plan."""
        if not isinstance(self.config, AttentionConfig):
            raise TypeError(f"layer {self.layer} is multi-head latent attention; it has no AttentionConfig.")
        return self.config

    @property
    def mla(self) -> MLAConfig:
        """``config`` of a multi-head latent attention layer; TypeError for any other layer's plan."""
        if not isinstance(self.config, MLAConfig):
            raise TypeError(f"layer {self.layer} is not multi-head latent attention; it has no MLAConfig.")
        return self.config
