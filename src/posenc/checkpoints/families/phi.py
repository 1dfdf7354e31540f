"""Phi (phi-1, phi-1.5, phi-2) and Persimmon: partial rotary, biases everywhere, an output projection named
``dense``, and q/k LayerNorm.

``PhiAttention`` has separate ``q_proj`` / ``k_proj`` / ``v_proj`` and ``dense``, all with biases; with
``qk_layernorm`` it applies ``nn.LayerNorm(head_dim)`` (weight and bias) to q and k per head before the rotation
(posenc's ``qk_norm="layer"``). ``PersimmonAttention`` fuses the projections into ``query_key_value`` laid out per
head ``[q, k, v]`` (GPT-NeoX's layout, :mod:`.fused`) and always normalises q and k with a LayerNorm when
``qk_layernorm`` (default True). Both rotate the first ``partial_rotary_factor · D`` features of each head (half
layout), angles from their model's rotary module, and take ``position_embeddings`` like a Llama-convention module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.checkpoints import rotary
from posenc.checkpoints.families.fused import fused_rules
from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename_linear

CLASSES: Mapping[str, tuple[str, str]] = {"phi": ("phi", "Phi"), "persimmon": ("persimmon", "Persimmon")}
"""model_type -> (transformers module, class prefix)."""


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    features: dict[str, Any] = {"qkv_bias": True, "out_bias": True}
    if hf.qk_layernorm:
        features.update(qk_norm="layer", qk_norm_eps=float(hf.layer_norm_eps))
    return rotary.decoder_plan(hf, layer, layer_type, **features)


NORM_RULES: tuple[Rule, ...] = tuple(
    rename_linear(
        ("q_norm", "q_layernorm"), ("k_norm", "k_layernorm"), when=lambda plan: plan.attention.qk_norm == "layer"
    )
)
"""The q/k LayerNorms' weights and biases."""


PROJECTION_RULES: tuple[Rule, ...] = tuple(
    rename_linear(("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("o_proj", "dense"))
)
"""Phi's separate projections and ``dense``, all with biases."""


reference = rotary.reference_by_model_type(CLASSES)


PHI = register(
    Family(
        name="phi",
        model_types=("phi",),
        title="Phi (phi-1, phi-1.5, phi-2)",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.", ""),
        geometry=geometry,
        rules=(*PROJECTION_RULES, *NORM_RULES),
        reference=reference,
    )
)

PERSIMMON = register(
    Family(
        name="persimmon",
        model_types=("persimmon",),
        title="Persimmon",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.", ""),
        geometry=geometry,
        rules=(*fused_rules(), *NORM_RULES),
        reference=reference,
    )
)
