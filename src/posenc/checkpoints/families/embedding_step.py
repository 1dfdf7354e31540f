"""Shared by the families whose positions enter once, at the embedding step (BERT, RoBERTa, BART, Marian).

These models add their position vectors to the token embeddings before the first layer of a stack (and BERT,
RoBERTa and BART normalise the sum); no attention layer sees positions after that. posenc's block of such a
model's layer 0 therefore starts at the embedding step: its input ``hidden [B, S, E]`` is what the embeddings
module receives as ``inputs_embeds`` (already scaled where the model scales token embeddings), and the block
computes ``embed(hidden, position_ids)`` (the ``learned`` or ``sinusoidal`` scheme), the layer's self-attention and
its output projection. Layers ``1 ..`` have no positional encoding at all: they load as the ``nope`` scheme (plain
attention with the layer's biases), their ``hidden`` being the previous layer's output, as in the model.

The reference (:class:`EmbeddingStepReference`) is the model's own embedding modules (layer 0), its self-attention
module called the way its layer calls it (``attention(x, attention_mask=..., past_key_values=...)``, an additive
mask, a ``DynamicCache``), and its separate output projection where the attention module has none inside (BERT's
``SelfOutput.dense``, without the residual LayerNorm that follows it: posenc's block ends at the projection).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from posenc.checkpoints.family import LayerPlan, Rule, rename, rename_linear
from posenc.checkpoints.reference import HFModule, ModuleReference
from posenc.config import AttentionConfig

POSITIONLESS = "nope"
"""The scheme of layers after the first: they see no positions."""

Embed = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(inputs_embeds [B, S, E], position_ids [B, S]) -> hidden [B, S, E]``: a model's embedding step."""


def embedding_plan(
    config: AttentionConfig,
    layer: int,
    scheme: str,
    params: dict[str, Any],
    layer_type: str | None = None,
) -> LayerPlan:
    """Layer 0 carries the embedding step (``scheme``, ``params``); later layers are ``nope``.

    ``config.causal`` decides whether the layer is used with a cache (decode steps).
    """
    if layer != 0:
        scheme, params = POSITIONLESS, {}
    return LayerPlan(config, scheme, dict(params), layer, layer_type, decoder=config.causal)


def carries_positions(plan: LayerPlan) -> bool:
    """True for the layer that starts at the embedding step (its position tensors are read)."""
    return plan.scheme != POSITIONLESS


def learned_rules(table: str, norm: str) -> tuple[Rule, ...]:
    """The ``learned`` scheme's position table and embedding LayerNorm (module ``norm``), read for layer 0 only."""

    def learned(plan: LayerPlan) -> bool:
        return plan.scheme == "learned"

    return (
        *rename(("scheme.weight", table), when=learned),
        *rename_linear(("scheme.embedding_norm", norm), when=learned),
    )


class EmbeddingStepReference(ModuleReference):
    """The model's embedding step (layer 0 only), one self-attention module and its output projection.

    Args:
        attention: the transformers self-attention module of the layer (``BertSelfAttention``, ``BartAttention``,
            ...), called ``attention(x, attention_mask=mask, past_key_values=cache)``; returns ``(out, weights)``.
        embed: the embedding step (``None`` for layers without positions).
        output: the output projection applied to the attention's result where it is a separate module
            (``None`` when ``attention`` projects itself, as ``BartAttention.out_proj`` does).
        plan, angles, dtype: see :class:`TransformersReference`.
    """

    def __init__(
        self,
        attention: HFModule,
        embed: Embed | None,
        output: HFModule | None,
        plan: LayerPlan,
        angles: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(attention, plan, angles, dtype)
        self.embed = embed
        self.output = output
        self.module_name += " with its embedding step" if embed is not None else ""

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        x = hidden if self.embed is None else self.embed(hidden, position_ids)
        out = self.attention(x, attention_mask=mask, past_key_values=cache)[0]
        return out if self.output is None else self.output(out)


__all__ = ["POSITIONLESS", "Embed", "EmbeddingStepReference", "carries_positions", "embedding_plan", "learned_rules"]
