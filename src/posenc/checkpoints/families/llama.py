"""Llama-convention decoders: Llama, Mistral, Mixtral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm).

Their attention modules share one layout (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``), one call
(``attention(hidden, position_embeddings=(cos, sin), attention_mask, past_key_values)``) and a model-level rotary
module (``XxxRotaryEmbedding(config)(x, position_ids) -> (cos, sin)``, half layout, cos/sin ``[B, S, r]``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from posenc.checkpoints import rotary
from posenc.checkpoints.family import Family, LayerPlan, Rule, register


@dataclasses.dataclass(frozen=True)
class Variant:
    """What differs between the model types of this convention."""

    prefix: str
    """transformers class prefix and module: ``Llama`` -> ``models.llama.modeling_llama.LlamaAttention``."""
    module: str
    qkv_bias: str | bool = "attention_bias"
    """config attribute (or a constant) saying whether q/k/v carry biases."""
    out_bias: str | bool = "attention_bias"
    qk_norm: bool = False


VARIANTS: Mapping[str, Variant] = {
    "llama": Variant("Llama", "llama"),
    "mistral": Variant("Mistral", "mistral", qkv_bias=False, out_bias=False),
    "mixtral": Variant("Mixtral", "mixtral", qkv_bias=False, out_bias=False),
    "qwen2": Variant("Qwen2", "qwen2", qkv_bias=True, out_bias=False),
    "qwen3": Variant("Qwen3", "qwen3", qk_norm=True),
}


def _flag(hf: Any, value: str | bool) -> bool:
    return bool(getattr(hf, value, False)) if isinstance(value, str) else value


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    """Geometry, scheme and parameters of one decoder layer of a Llama-convention model."""
    variant = VARIANTS[hf.model_type]
    norm = {"qk_norm": "rms", "qk_norm_eps": float(hf.rms_norm_eps)} if variant.qk_norm else {}
    return rotary.decoder_plan(
        hf, layer, layer_type, qkv_bias=_flag(hf, variant.qkv_bias), out_bias=_flag(hf, variant.out_bias), **norm
    )


RULES: tuple[Rule, ...] = (*rotary.PROJECTION_RULES, *rotary.norm_rules())


reference = rotary.reference_by_model_type({name: (v.module, v.prefix) for name, v in VARIANTS.items()})


LLAMA = register(
    Family(
        name="llama",
        model_types=tuple(VARIANTS),
        title="Llama, Mistral, Mixtral, Qwen2, Qwen3",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
    )
)
