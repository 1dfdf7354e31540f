"""BERT, RoBERTa, XLM-RoBERTa: learned absolute positions added at the embedding step, then post-LN layers.

Layer 0's block starts at ``BertEmbeddings`` (see :mod:`.embedding_step`): its ``hidden`` is what the embeddings
module receives as ``inputs_embeds``, and the block computes ``LayerNorm(hidden + token_type_embeddings[0] +
position_embeddings[p + offset])`` (posenc's ``learned`` scheme with ``token_type``, ``embedding_norm``,
``position_offset``), the self-attention (q/k/v biases, scale ``1/√D``) and ``SelfOutput.dense`` (the block's
``o_proj`` with bias), not the residual + LayerNorm after it. Token type 0 is the single-segment input the model
uses by default. Layers ``1 ..`` see no positions and load as ``nope``.

Position offsets: BERT's row of position ``p`` is ``p``; RoBERTa and XLM-RoBERTa number positions from
``padding_idx + 1`` (``create_position_ids_from_input_ids``), so their row is ``p + pad_token_id + 1`` and their
context is ``max_position_embeddings - pad_token_id - 1`` tokens (512 of 514 rows). The reference passes those
row ids explicitly as ``position_ids`` (RoBERTa's embeddings use explicit ids unchanged).

``is_decoder=True`` configs (``BertLMHeadModel``) are causal with a cache: positions continue after the cached
tokens, as ``past_key_values_length`` makes them. Cross-attention layers (``add_cross_attention``) are not
positional blocks and are not exported. transformers 5 implements only absolute positions for these models: a
config asking for ``position_embedding_type="relative_key"`` (or ``relative_key_query``) is refused, since
transformers' modules ignore that key (and the checkpoint's ``distance_embedding``), so no reference would match
what the checkpoint was trained to compute.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from posenc.checkpoints.families.embedding_step import (
    Embed,
    EmbeddingStepReference,
    carries_positions,
    embedding_plan,
    learned_rules,
)
from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename_linear
from posenc.checkpoints.reference import hf_class, load_module
from posenc.checkpoints.rotary import check_layer, layer_kind
from posenc.config import AttentionConfig
from posenc.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Variant:
    """transformers classes of a model type, and whether its positions start after padding."""

    classes: str
    """Dotted prefix of its classes: ``models.bert.modeling_bert.Bert`` + ``SelfAttention``, ..."""
    padding_offset: bool


VARIANTS: Mapping[str, Variant] = {
    "bert": Variant("models.bert.modeling_bert.Bert", padding_offset=False),
    "roberta": Variant("models.roberta.modeling_roberta.Roberta", padding_offset=True),
    "xlm-roberta": Variant("models.xlm_roberta.modeling_xlm_roberta.XLMRoberta", padding_offset=True),
}


def position_offset(hf: Any) -> int:
    """Table row of position 0: ``pad_token_id + 1`` for RoBERTa-style models, else 0."""
    if not VARIANTS[hf.model_type].padding_offset:
        return 0
    if hf.pad_token_id is None:
        raise ConfigError(
            f"{hf.model_type} numbers positions from pad_token_id + 1, but config.json has no pad_token_id; "
            f"set it (1 for the released RoBERTa/XLM-R checkpoints)."
        )
    return int(hf.pad_token_id) + 1


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    """Layer 0: the embedding step + self-attention; later layers: self-attention without positions."""
    check_layer(layer, int(hf.num_hidden_layers))
    layer_kind(hf, layer, layer_type)
    kind = getattr(hf, "position_embedding_type", None) or "absolute"
    if kind != "absolute":
        raise ConfigError(
            f"config.json sets position_embedding_type={kind!r}; transformers 5 implements only 'absolute' for "
            f"{hf.model_type} (its modules ignore this key and the checkpoint's distance_embedding), so there is no "
            f"reference to prove an export against. Export the relative scheme by hand (posenc export --scheme shaw) "
            f"and validate it against your own model."
        )
    offset = position_offset(hf)
    context = int(hf.max_position_embeddings) - offset
    if context < 1:
        raise ConfigError(
            f"max_position_embeddings {hf.max_position_embeddings} leaves no positions after offset {offset}."
        )
    config = AttentionConfig(
        hidden_size=int(hf.hidden_size),
        num_heads=int(hf.num_attention_heads),
        causal=bool(hf.is_decoder),
        max_position_embeddings=context,
        qkv_bias=True,
        out_bias=True,
    )
    params = {
        "position_offset": offset,
        "token_type": True,
        "embedding_norm": True,
        "norm_eps": float(hf.layer_norm_eps),
    }
    return embedding_plan(config, layer, "learned", params)


def first_token_type(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """``token_type_embeddings.weight [types, E]`` -> its row 0 ``[E]`` (single-segment input)."""
    return (tensors[0][0],)


EMBEDDINGS = "/embeddings."
"""The embeddings module, relative to the model root."""

RULES: tuple[Rule, ...] = (
    *rename_linear(
        ("q_proj", "self.query"), ("k_proj", "self.key"), ("v_proj", "self.value"), ("o_proj", "output.dense")
    ),
    *learned_rules(EMBEDDINGS + "position_embeddings.weight", EMBEDDINGS + "LayerNorm"),
    Rule(
        ("scheme.token_type_embedding",),
        (EMBEDDINGS + "token_type_embeddings.weight",),
        first_token_type,
        when=carries_positions,
    ),
)


def _embed(path: str, hf: Any, tensors: Mapping[str, torch.Tensor], offset: int, dtype: torch.dtype) -> Embed:
    """``XxxEmbeddings(inputs_embeds=hidden, position_ids=p + offset, token_type_ids=0)``."""
    small = copy.deepcopy(hf)
    small.vocab_size = int(hf.pad_token_id or 0) + 1  # the word table is not part of the block: inputs_embeds is
    embeddings = hf_class(f"{path}Embeddings")(small)
    del embeddings.word_embeddings
    load_module(embeddings, tensors, EMBEDDINGS, dtype)

    def embed(hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        token_types = torch.zeros_like(position_ids)
        return embeddings(inputs_embeds=hidden, position_ids=position_ids + offset, token_type_ids=token_types)

    return embed


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> EmbeddingStepReference:
    """The embedding step (layer 0), then ``XxxSelfAttention`` and ``XxxSelfOutput.dense``."""
    path = VARIANTS[hf.model_type].classes
    attention = hf_class(f"{path}SelfAttention")(hf, is_causal=plan.config.causal, layer_idx=plan.layer)
    load_module(attention, tensors, "self.", dtype)
    dense = hf_class(f"{path}SelfOutput")(hf).dense
    load_module(dense, tensors, "output.dense.", dtype)
    offset = int(plan.params.get("position_offset", 0))
    embed = _embed(path, hf, tensors, offset, dtype) if carries_positions(plan) else None
    return EmbeddingStepReference(attention, embed, dense, plan, angles, dtype)


BERT = register(
    Family(
        name="bert",
        model_types=tuple(VARIANTS),
        title="BERT, RoBERTa, XLM-RoBERTa",
        layer_prefixes=("encoder.layer.{layer}.attention.",),
        roots=("bert.", "roberta.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
    )
)
