"""DeBERTa-v2/v3 and DeBERTa (v1): disentangled attention, content-to-position (c2p) and position-to-content (p2c).

posenc's ``deberta`` scheme (``pos_att_type``, ``share_att_key``, ``position_buckets``, ``max_relative_positions``,
``rel_norm``) with scores ``(q·k + c2p + p2c) / √(D·(1 + terms))``. The relative embeddings and their LayerNorm
belong to the ENCODER, shared by every layer (``encoder.rel_embeddings.weight``, ``encoder.LayerNorm.*`` with
``norm_rel_ebd="layer_norm"``): "/"-rooted rules read them for each layer.

The block is ``DisentangledSelfAttention`` plus ``SelfOutput.dense`` (the block's ``o_proj`` with bias); the
residual + LayerNorm after the dense are not part of it (posenc's block ends at the output projection). Its
``hidden`` is what the encoder hands the layer. With ``position_biased_input=True`` (the v1/v2 default; v3 turns
it off) the embeddings also add a learned absolute table before layer 0; that step is outside this block (a
block carries one scheme). Encoder only: bidirectional, no cache, no decode steps.

The reference is transformers' ``DisentangledSelfAttention`` called as ``DebertaV2Encoder`` calls it:
``relative_pos`` from the encoder's ``get_rel_pos`` (``build_relative_position``: token order, ``q - k``, log
buckets), ``rel_embeddings`` from its ``get_rel_embedding`` (LayerNorm applied), the mask from its
``get_attention_mask``; the encoder is built with no layers so only those pieces exist. transformers derives
relative positions from token order, not from position ids, so the reference takes consecutive position ids only
(any start: the terms depend on ``q - k``). The module returns no keys or values (it has no cache); the presents
compared are its own key and value layers, computed with its projections as its forward does.

DeBERTa v1 differs in layout and is expressed exactly: one ``in_proj`` (per head ``[q; k; v]`` rows, no bias)
plus ``q_bias`` and ``v_bias`` (the key bias is zero), ``pos_proj`` without bias for c2p, ``pos_q_proj`` for p2c,
no buckets, no shared keys, no rel-embedding norm. Its ``att_span = min(max(Sq, Sk), max_relative_positions)``
slice of the embeddings gives the same rows as the clipped index ``clamp(q - k + M, 0, 2M - 1)``. v1's
``talking_head`` (mixing scores across heads) cannot be expressed and is refused.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename, rename_linear
from posenc.checkpoints.reference import HFModule, TransformersReference, hf_class, load_module
from posenc.checkpoints.rotary import check_layer, layer_kind
from posenc.config import from_hf_config
from posenc.errors import ConfigError

ENCODER = "/encoder."
"""The encoder module (relative embeddings and their LayerNorm), relative to the model root."""

KeyValue = Callable[[HFModule, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``(attention module, hidden [B, S, E]) -> (key, value [B, H, S, D])`` as the module's forward computes them."""


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    """One encoder layer: the ``deberta`` scheme as :func:`posenc.config.from_hf_config` imports it, q/k/v and
    output biases, the module's head width."""
    check_layer(layer, int(hf.num_hidden_layers))
    layer_kind(hf, layer, layer_type)
    v1 = hf.model_type == "deberta"
    if v1 and getattr(hf, "talking_head", False):
        raise ConfigError(
            "config.json sets talking_head=True: DeBERTa v1 then mixes attention scores and probabilities across "
            "heads (head_logits_proj, head_weights_proj), which posenc's attention block cannot express."
        )
    imported = from_hf_config(hf.to_dict())
    params = dict(imported.params)
    head_dim = int(hf.hidden_size) // int(hf.num_attention_heads)
    if v1:  # the v1 module has none of the v2 options, whatever the config says
        params.update(share_att_key=False, position_buckets=0, rel_norm=False)
    else:
        head_dim = int(getattr(hf, "attention_head_size", None) or head_dim)
    config = dataclasses.replace(imported.config, head_dim=head_dim, causal=False, qkv_bias=True, out_bias=True)
    return LayerPlan(config, "deberta", params, layer, None, decoder=False)


def _terms(plan: LayerPlan) -> tuple[str, ...]:
    return tuple(plan.params["pos_att_type"].split("|"))


def _own_projection(term: str) -> Callable[[LayerPlan], bool]:
    """The layer has its own position projection for ``term`` (not shared with q/k)."""
    return lambda plan: term in _terms(plan) and not plan.params["share_att_key"]


RELATIVE_RULES: tuple[Rule, ...] = (
    *rename(("scheme.rel_embeddings", ENCODER + "rel_embeddings.weight")),
    *rename_linear(("scheme.rel_norm", ENCODER + "LayerNorm"), when=lambda plan: plan.params["rel_norm"]),
    *rename_linear(("o_proj", "output.dense")),
)
"""Shared by both versions: the encoder's relative embeddings (and norm), the output dense."""

V2_RULES: tuple[Rule, ...] = (
    *rename_linear(("q_proj", "self.query_proj"), ("k_proj", "self.key_proj"), ("v_proj", "self.value_proj")),
    *RELATIVE_RULES,
    *rename_linear(("scheme.pos_key_proj", "self.pos_key_proj"), when=_own_projection("c2p")),
    *rename_linear(("scheme.pos_query_proj", "self.pos_query_proj"), when=_own_projection("p2c")),
)


def split_in_proj(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """v1 ``in_proj.weight [H·3D, E]`` (per head q, k, v rows), ``q_bias``, ``v_bias`` ``[H·D]`` -> q/k/v weights
    ``[H·D, E]`` and biases (the key bias zero), as ``transpose_for_scores(in_proj(x)).chunk(3, -1)`` splits them."""
    weight, q_bias, v_bias = tensors
    h, d = plan.attention.num_heads, plan.attention.head_dim
    q, k, v = weight.view(h, 3, d, weight.shape[-1]).unbind(1)
    rows = h * d
    return q.reshape(rows, -1), k.reshape(rows, -1), v.reshape(rows, -1), q_bias, torch.zeros_like(q_bias), v_bias


def with_zero_bias(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """v1 ``pos_proj`` has no bias: ``(weight,) -> (weight, zeros)``."""
    return tensors[0], torch.zeros(tensors[0].shape[0], dtype=tensors[0].dtype)


V1_RULES: tuple[Rule, ...] = (
    Rule(
        ("q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "k_proj.bias", "v_proj.bias"),
        ("self.in_proj.weight", "self.q_bias", "self.v_bias"),
        split_in_proj,
    ),
    *RELATIVE_RULES,
    Rule(
        ("scheme.pos_key_proj.weight", "scheme.pos_key_proj.bias"),
        ("self.pos_proj.weight",),
        with_zero_bias,
        when=_own_projection("c2p"),
    ),
    *rename_linear(("scheme.pos_query_proj", "self.pos_q_proj"), when=_own_projection("p2c")),
)


def _heads(attention: HFModule, x: torch.Tensor, batch: int) -> torch.Tensor:
    """v2 ``transpose_for_scores`` output ``[B·H, S, D]`` -> ``[B, H, S, D]``."""
    layer = attention.transpose_for_scores(x, attention.num_attention_heads)
    return layer.view(batch, attention.num_attention_heads, layer.shape[-2], layer.shape[-1])


def v2_key_value(attention: HFModule, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b = hidden.shape[0]
    return _heads(attention, attention.key_proj(hidden), b), _heads(attention, attention.value_proj(hidden), b)


def v1_key_value(attention: HFModule, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _, key, value = attention.transpose_for_scores(attention.in_proj(hidden)).chunk(3, dim=-1)
    return key, value + attention.transpose_for_scores(attention.v_bias[None, None, :])


@dataclasses.dataclass(frozen=True)
class Version:
    """transformers module and class prefix of a DeBERTa version, and how its module forms keys and values."""

    module: str
    """``models.deberta_v2.modeling_deberta_v2``"""
    prefix: str
    """``DebertaV2``: ``DebertaV2SelfOutput``, ``DebertaV2Encoder``"""
    key_value: KeyValue


VERSIONS: Mapping[str, Version] = {
    "deberta-v2": Version("models.deberta_v2.modeling_deberta_v2", "DebertaV2", v2_key_value),
    "deberta": Version("models.deberta.modeling_deberta", "Deberta", v1_key_value),
}


class DebertaReference(TransformersReference):
    """``DisentangledSelfAttention`` with the encoder's relative positions, embeddings and mask, then the dense."""

    def __init__(
        self,
        attention: HFModule,
        encoder: HFModule,
        dense: HFModule,
        key_value: KeyValue,
        plan: LayerPlan,
        angles: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(plan, angles, dtype)
        self.attention = attention
        self.encoder = encoder
        self.dense = dense
        self.key_value = key_value
        self.module_name = type(attention).__name__

    def step(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        past_key: torch.Tensor | None,
        past_value: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if past_key is not None and past_key.shape[2] > 0:
            raise ConfigError("DeBERTa layers are encoder layers: they take no cache (past_key/past_value).")
        b, s = position_ids.shape
        consecutive = position_ids - position_ids[:, :1] == torch.arange(s, dtype=position_ids.dtype)
        if not bool(consecutive.all()):
            raise ConfigError(
                "transformers' DeBERTa derives relative positions from token order; its reference takes only "
                "consecutive position ids per row (start + 0, 1, 2, ...)."
            )
        mask = self.encoder.get_attention_mask(torch.ones(b, s, dtype=self.dtype))
        relative_pos = self.encoder.get_rel_pos(hidden)
        rel_embeddings = self.encoder.get_rel_embedding()
        context = self.attention(hidden, mask, relative_pos=relative_pos, rel_embeddings=rel_embeddings)[0]
        key, value = self.key_value(self.attention, hidden)
        return self.dense(context), key, value


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> DebertaReference:
    version = VERSIONS[hf.model_type]
    path = version.module
    attention = hf_class(f"{path}.DisentangledSelfAttention")(hf)
    load_module(attention, tensors, "self.", dtype)
    dense = hf_class(f"{path}.{version.prefix}SelfOutput")(hf).dense
    load_module(dense, tensors, "output.dense.", dtype)
    bare = copy.deepcopy(hf)  # the encoder's own relative-position pieces, without its layers (or conv layer)
    bare.num_hidden_layers, bare.conv_kernel_size = 0, 0
    encoder = hf_class(f"{path}.{version.prefix}Encoder")(bare)
    load_module(encoder, tensors, ENCODER, dtype)
    return DebertaReference(attention, encoder, dense, version.key_value, plan, angles, dtype)


def declines(config: Mapping[str, Any]) -> str | None:
    """Why posenc's ``deberta`` scheme is not this config's (``config.json`` as a dict): no relative attention or no
    c2p/p2c term only (transformers' default config: positions absolute at the embeddings); such a layer is traced."""
    kinds = config.get("pos_att_type") or []
    terms = {str(kind).strip() for kind in (kinds.split("|") if isinstance(kinds, str) else kinds)}
    if config.get("relative_attention") and terms and terms <= {"c2p", "p2c"}:
        return None
    return f"relative_attention={config.get('relative_attention')!r}, pos_att_type={sorted(terms)}"


def _family(model_type: str, title: str, rules: tuple[Rule, ...]) -> Family:
    return register(
        Family(
            name=model_type,
            model_types=(model_type,),
            title=title,
            layer_prefixes=("encoder.layer.{layer}.attention.",),
            roots=("deberta.", ""),
            geometry=geometry,
            rules=rules,
            reference=reference,
            declines=declines,
        )
    )


DEBERTA_V2 = _family("deberta-v2", "DeBERTa-v2, DeBERTa-v3", V2_RULES)
DEBERTA = _family("deberta", "DeBERTa (v1)", V1_RULES)
