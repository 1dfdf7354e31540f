"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5: the text attention of the vision-language checkpoints, with M-RoPE.

The language model is a Llama-convention decoder (Qwen2-VL / 2.5-VL: q/k/v biases; Qwen3-VL: per-head q/k RMSNorm,
no biases) whose rotary module takes position ids ``[3, B, S]`` (temporal, height, width; transformers'
``get_rope_index`` gives image patches their row and column) and recombines the frequency slots per
``mrope_section``: in chunks (``Qwen2VLRotaryEmbedding``) or interleaved t,h,w,t,h,w,... (Qwen3-VL's module always
interleaves, with or without ``mrope_interleaved`` in its config). The mask follows token order
(``cache_position``), not the ids: posenc's block does the same for multi-axis schemes.

Qwen3.5 (``qwen3_5_text``, ``qwen3_5_moe_text``; their vision-language wrappers load as text towers) adds Qwen3-Next's
attention to Qwen3-VL's: a sigmoid output gate held in ``q_proj`` (each head's query rows, then its gate rows),
zero-centred q/k norms (``1 + w``), partial rotary, and Gated DeltaNet ``linear_attention`` layers between the
attention layers (refused, naming the attention layers).

The checkpoint is the whole vision-language model (``model.language_model.layers.N``); the config's text part
(``get_text_config()``) describes the layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from posenc.checkpoints import rotary
from posenc.checkpoints.family import Family, LayerPlan, Rule, register
from posenc.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Variant:
    """What differs between the Qwen vision-language generations."""

    module: str
    """transformers module (``models.<module>.modeling_<module>``)."""
    prefix: str
    """class prefix of the text attention and rotary module (``Qwen2VL`` -> ``Qwen2VLAttention``)."""
    interleaved: bool
    """the rotary module interleaves the t/h/w slots (Qwen3-VL)."""
    qk_norm: bool
    gated: bool = False
    """Qwen3.5: a sigmoid output gate in ``q_proj``, zero-centred q/k norms."""
    attention_prefix: str | None = None
    """class prefix of the attention module where it differs from the rotary module's (``Qwen3_5Attention`` beside
    ``Qwen3_5TextRotaryEmbedding``)."""


VARIANTS: Mapping[str, Variant] = {
    "qwen2_vl": Variant("qwen2_vl", "Qwen2VL", interleaved=False, qk_norm=False),
    "qwen2_5_vl": Variant("qwen2_5_vl", "Qwen2_5_VL", interleaved=False, qk_norm=False),
    "qwen3_vl": Variant("qwen3_vl", "Qwen3VLText", interleaved=True, qk_norm=True),
    "qwen3_vl_moe": Variant("qwen3_vl_moe", "Qwen3VLMoeText", interleaved=True, qk_norm=True),
    "qwen3_5_text": Variant("qwen3_5", "Qwen3_5Text", interleaved=True, qk_norm=True, gated=True,
                            attention_prefix="Qwen3_5"),
    "qwen3_5_moe_text": Variant("qwen3_5_moe", "Qwen3_5MoeText", interleaved=True, qk_norm=True, gated=True,
                                attention_prefix="Qwen3_5Moe"),
}  # fmt: skip


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    """The text decoder's layer: M-RoPE with the sections (and interleaving) the model's rotary module uses."""
    variant = VARIANTS[hf.model_type]
    text = hf.get_text_config()
    features: dict[str, Any] = {}
    if variant.qk_norm:
        features.update(qk_norm="rms", qk_norm_eps=float(text.rms_norm_eps))
    else:
        features.update(qkv_bias=True)  # Qwen2VLAttention: biases on q/k/v, none on o_proj
    if getattr(text, "attention_bias", False):
        features.update(qkv_bias=True, out_bias=True)
    if variant.gated:
        features["output_gate"] = "sigmoid"
    rotary.check_layer(layer, int(text.num_hidden_layers))
    rotary.check_attention_layer(text, layer)
    plan = rotary.decoder_plan(text, layer, layer_type, **features)
    plan = dataclasses.replace(plan, layout=rotary.layout_tags("q_proj" if variant.gated else None, variant.gated))
    if plan.scheme != "rope_mrope":
        raise ConfigError(
            f"{hf.model_type} layer {layer} imports as {plan.scheme!r}, not M-RoPE: its text config's rope_parameters "
            f"lack mrope_section. posenc follows the model's rotary module, which needs it."
        )
    params = dict(plan.params)
    if variant.interleaved:
        params["mrope_interleaved"] = True
    return dataclasses.replace(plan, params=params)


RULES: tuple[Rule, ...] = (*rotary.PROJECTION_RULES_BUT_QUERY, *rotary.FEATURE_RULES)


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> rotary.RotaryReference:
    variant = VARIANTS[hf.model_type]
    text = hf.get_text_config()
    text._attn_implementation = "eager"
    return rotary.RotaryReference.build(
        text, plan, tensors, variant.module, variant.prefix, angles, dtype, attention_prefix=variant.attention_prefix
    )


QWEN_VL = register(
    Family(
        name="qwen_vl",
        model_types=tuple(VARIANTS),
        title="Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 (text attention, M-RoPE)",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.language_model.", "language_model.model.", "model."),
        geometry=geometry,
        rules=RULES,
        reference=reference,
    )
)
