"""BART and Marian: encoder-decoder models whose positions enter at each stack's embedding step.

``layer_type`` picks the stack (``encoder``, default, or ``decoder``); only self-attention layers are exported:
the decoder's cross-attention (``encoder_attn``) has no positional encoding of its own (its keys are the encoder's
outputs), so it is not a positional block. Encoder layers are bidirectional; decoder self-attention layers causal
with a cache (positions continue after the cached tokens, as the decoder's ``past_key_values_length`` makes them).

Layer 0 of a stack starts at the embedding step (see :mod:`.embedding_step`); its ``hidden`` is the stack's
``inputs_embeds`` already multiplied by ``embed_scale`` (``√d_model`` with ``scale_embedding``; BART scales inside
its word embedding, Marian after it — either way before positions are added):

- BART: ``layernorm_embedding(hidden + embed_positions.weight[p + 2])`` (``BartLearnedPositionalEmbedding``'s
  offset of 2: posenc's ``learned`` scheme with ``position_offset=2`` and ``embedding_norm``, eps 1e-5);
- Marian: ``hidden + PE[p]`` with ``MarianSinusoidalPositionalEmbedding``'s table (``concat`` layout: ``⌈E/2⌉``
  sines then ``⌊E/2⌋`` cosines, odd widths included), which checkpoints do not store: posenc's ``sinusoidal``
  scheme computes it (float64 angles), as transformers does (numpy float64, rounded to float32).

Then ``XxxAttention`` (q/k/v/out biases, scale ``head_dim ** -0.5``) including its ``out_proj``; the residual and
LayerNorm after it are not part of the block. Layers ``1 ..`` see no positions and load as ``nope``.

mBART is not loaded: its layers normalise their input (``self_attn_layer_norm`` before attention), so layer 0 runs
two LayerNorms between the position step and the attention, which posenc's block cannot express.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from posenc.checkpoints.families.embedding_step import (
    Embed,
    EmbeddingStepReference,
    carries_positions,
    embedding_plan,
    learned_rules,
)
from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename_linear
from posenc.checkpoints.reference import hf_class, load_module
from posenc.checkpoints.rotary import check_layer, float64_scheme
from posenc.config import AttentionConfig

STACKS = ("encoder", "decoder")
CROSS_ATTENTION = (
    "Only self-attention layers are exported: the decoder's cross-attention (encoder_attn) has no positional "
    "encoding of its own (its keys are the encoder's outputs), so it is not a positional block."
)
BART_OFFSET = 2
"""``BartLearnedPositionalEmbedding.offset``: row ``p + 2`` serves position ``p``."""
STACK = "/{stack}."
"""The layer's stack (``encoder.`` or ``decoder.``), relative to the model root: its embedding modules live there."""
BART_NORM_EPS = 1e-5
"""``layernorm_embedding`` is ``nn.LayerNorm(d_model)`` with torch's default epsilon."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """What differs between BART and Marian."""

    classes: str
    """Dotted prefix of its classes: ``models.bart.modeling_bart.Bart`` + ``Attention``, ..."""
    scheme: str
    params: Mapping[str, Any]


VARIANTS: Mapping[str, Variant] = {
    "bart": Variant(
        "models.bart.modeling_bart.Bart",
        "learned",
        {"position_offset": BART_OFFSET, "embedding_norm": True, "norm_eps": BART_NORM_EPS},
    ),
    "marian": Variant("models.marian.modeling_marian.Marian", "sinusoidal", {"layout": "concat", "base": 10000.0}),
}


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    """One self-attention layer of the ``layer_type`` stack (default ``encoder``)."""
    stack = layer_type or "encoder"
    decoder = stack == "decoder"
    check_layer(layer, int(hf.decoder_layers if decoder else hf.encoder_layers), f"{stack} layers")
    config = AttentionConfig(
        hidden_size=int(hf.d_model),
        num_heads=int(hf.decoder_attention_heads if decoder else hf.encoder_attention_heads),
        causal=decoder,
        max_position_embeddings=int(hf.max_position_embeddings),
        qkv_bias=True,
        out_bias=True,
    )
    variant = VARIANTS[hf.model_type]
    return embedding_plan(config, layer, variant.scheme, dict(variant.params), stack)


RULES: tuple[Rule, ...] = (
    *rename_linear(("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("o_proj", "out_proj")),
    *learned_rules(STACK + "embed_positions.weight", STACK + "layernorm_embedding"),
)


def _bart_embed(path: str, hf: Any, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> Embed:
    """``layernorm_embedding(hidden + embed_positions(position_ids))`` as ``BartDecoder.forward`` computes it."""
    positions = hf_class(f"{path}LearnedPositionalEmbedding")(int(hf.max_position_embeddings), int(hf.d_model))
    load_module(positions, tensors, STACK + "embed_positions.", dtype)
    norm = nn.LayerNorm(int(hf.d_model))  # BartEncoder/BartDecoder.layernorm_embedding
    load_module(norm, tensors, STACK + "layernorm_embedding.", dtype)

    def embed(hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        # BartLearnedPositionalEmbedding takes one row of explicit ids ([S] -> [1, S, E]); the batch is row by row.
        rows = torch.cat([positions(None, position_ids=row) for row in position_ids])
        return norm(hidden + rows)

    return embed


def _marian_embed(path: str, hf: Any, plan: LayerPlan, angles: str, dtype: torch.dtype) -> Embed:
    """``hidden + embed_positions(shape, position_ids=position_ids)`` as ``MarianDecoder.forward`` computes it."""
    positions = hf_class(f"{path}SinusoidalPositionalEmbedding")(int(hf.max_position_embeddings), int(hf.d_model))
    if angles == "float64":  # the same table from float64 angles, kept in float64
        table = float64_scheme(plan).rows(torch.arange(positions.num_embeddings).unsqueeze(0))[0]
    else:  # the model's own table (numpy float64 angles, rounded to float32), as _init_weights fills it
        table = positions.create_weight()
    positions.weight = nn.Parameter(table.to(dtype), requires_grad=False)
    positions.eval()

    def embed(hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return hidden + positions(hidden.shape[:2], position_ids=position_ids)

    return embed


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> EmbeddingStepReference:
    """``XxxAttention`` as ``XxxEncoderLayer`` / ``XxxDecoderLayer`` builds it, after the stack's embedding step."""
    variant = VARIANTS[hf.model_type]
    path = variant.classes
    decoder = plan.layer_type == "decoder"
    heads = hf.decoder_attention_heads if decoder else hf.encoder_attention_heads
    attention = hf_class(f"{path}Attention")(
        embed_dim=int(hf.d_model),
        num_heads=int(heads),
        dropout=float(hf.attention_dropout),
        is_decoder=decoder,
        is_causal=decoder,
        config=hf,
        layer_idx=plan.layer,
    )
    load_module(attention, tensors, "", dtype)
    embed: Embed | None = None
    if carries_positions(plan) and variant.scheme == "learned":
        embed = _bart_embed(path, hf, tensors, dtype)
    elif carries_positions(plan):
        embed = _marian_embed(path, hf, plan, angles, dtype)
    return EmbeddingStepReference(attention, embed, None, plan, angles, dtype)


BART = register(
    Family(
        name="bart",
        model_types=tuple(VARIANTS),
        title="BART, Marian",
        layer_prefixes=("{stack}.layers.{layer}.self_attn.",),
        roots=("model.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
        layer_types=STACKS,
        layer_types_note=CROSS_ATTENTION,
    )
)
