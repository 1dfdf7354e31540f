"""Gemma, Gemma 2, Gemma 3 (text): the Llama convention plus what Gemma adds.

- Gemma 2 and 3 scale scores by ``query_pre_attn_scalar ** -0.5`` instead of ``head_dim ** -0.5``;
- Gemma 2 soft-caps the scaled scores (``attn_logit_softcapping``: ``cap * tanh(scores / cap)``); Gemma 3's config
  carries the same key, but transformers' ``Gemma3Attention`` never passes it to its attention function, so a
  Gemma 3 layer is loaded without soft-capping (the module is the reference, not the config);
- Gemma 2 and 3 alternate sliding-window and full-attention layers (``layer_types``, ``sliding_window``);
- Gemma 3 normalises q and k per head (``q_norm``/``k_norm``, RMSNorm computed as ``x̂ · (1 + w)``: the block
  stores ``1 + w``, which float32 rounds exactly as transformers does at run time) and gives each layer type its
  own RoPE parameters (``rope_parameters`` keyed by ``sliding_attention`` / ``full_attention``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.checkpoints import rotary
from posenc.checkpoints.family import Family, LayerPlan, Rule, register

CLASSES: Mapping[str, tuple[str, str]] = {
    "gemma": ("gemma", "Gemma"),
    "gemma2": ("gemma2", "Gemma2"),
    "gemma3_text": ("gemma3", "Gemma3"),
    "vaultgemma": ("vaultgemma", "VaultGemma"),
}
"""model_type -> (transformers module, class prefix)."""


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    features: dict[str, Any] = {"qkv_bias": bool(hf.attention_bias), "out_bias": bool(hf.attention_bias)}
    if getattr(hf, "query_pre_attn_scalar", None):
        features["attn_scale"] = float(hf.query_pre_attn_scalar) ** -0.5
    if hf.model_type in ("gemma2", "vaultgemma") and hf.attn_logit_softcapping:
        features["logit_softcap"] = float(hf.attn_logit_softcapping)
    if hf.model_type == "gemma3_text":
        features.update(qk_norm="rms", qk_norm_eps=float(hf.rms_norm_eps))
    return rotary.decoder_plan(hf, layer, layer_type, **features)


RULES: tuple[Rule, ...] = (*rotary.PROJECTION_RULES, *rotary.norm_rules(rotary.plus_one))


reference = rotary.reference_by_model_type(CLASSES)


GEMMA = register(
    Family(
        name="gemma",
        model_types=tuple(CLASSES),
        title="Gemma, Gemma 2, Gemma 3",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.", "model.language_model.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
        layer_types=("sliding_attention", "full_attention"),
    )
)
