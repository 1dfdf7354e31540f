"""MiMo-V2-Flash: values narrower than keys, attention sinks and twice the kv heads on sliding layers, partial RoPE
per layer type, scaled values.

LLM-Core Xiaomi, "MiMo-V2-Flash Technical Report", 2026, https://arxiv.org/abs/2601.02780; attention sinks: Xiao et
al., "Efficient Streaming Language Models with Attention Sinks", 2023, https://arxiv.org/abs/2309.17453.

What transformers' ``MiMoV2FlashAttention`` computes, against the Llama block:

- q/k heads ``head_dim`` wide (192 released), values ``v_head_dim`` wide (128): ``v_proj [Hkv·Dv, E]``, ``o_proj
  [E, H·Dv]``, the value cache ``[B, Hkv, P, Dv]`` (the block's ``v_head_dim``);
- ``layer_types``: ``sliding_attention`` layers see the last ``sliding_window`` keys (129 released: 128 before the
  query, and the query), have ``2 · num_key_value_heads`` kv heads and a learned sink logit per query head
  (``sinks [H]``, concatenated as one more softmax column and dropped, as gpt-oss); ``full_attention`` layers have
  ``num_key_value_heads`` and no sinks;
- RoPE per layer type (``rope_parameters[layer_type]``: theta 5e6 full, 1e4 sliding) over the first
  ``int(head_dim · partial_rotary_factor)`` features (0.334: 64 of 192), half layout, the rest passed through;
- the values times ``attention_value_scale`` (0.707) after ``v_proj``: folded into ``v_proj``'s weight and bias (the
  cache then holds the scaled values, as the module's does);
- scores ``q·kᵀ / √head_dim``, no soft-cap, no q/k norms; q/k/v biases with ``attention_bias``, ``o_proj`` never.

The reference calls the module as ``MiMoV2FlashModel`` does: the rotary module's cos/sin for the layer's type (or
float64 angles), the additive mask of the layer's type and the cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from posenc.checkpoints import rotary
from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename
from posenc.errors import ConfigError

SLIDING = "sliding_attention"
V_SCALE = "v_scale="
"""Layout tag prefix: the module multiplies the values by this factor (``attention_value_scale``) after ``v_proj``."""


def value_scale(hf: Any) -> float:
    """``attention_value_scale`` (None: 1, as the module reads it)."""
    scale = getattr(hf, "attention_value_scale", None)
    scale = 1.0 if scale is None else float(scale)
    if not scale > 0 or scale == float("inf"):
        raise ConfigError(
            f"mimo_v2_flash attention_value_scale={scale!r}: the values' scale must be a finite number > 0 "
            f"(0.707 in the released config)."
        )
    return scale


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    """One decoder layer: its type's RoPE, window, kv heads and sinks; values ``v_head_dim`` wide."""
    rotary.check_layer(layer, int(hf.num_hidden_layers))
    sliding = rotary.layer_kind(hf, layer, layer_type) == SLIDING
    head_dim, value_dim = int(hf.head_dim), int(hf.v_head_dim)
    features: dict[str, Any] = {"qkv_bias": bool(hf.attention_bias), "attention_sinks": sliding}
    features["v_head_dim"] = value_dim if value_dim != head_dim else None
    plan = rotary.decoder_plan(hf, layer, layer_type, **features)
    kv_heads = int(hf.num_key_value_heads) * (2 if sliding else 1)  # sliding layers double the kv heads
    return dataclasses.replace(
        plan,
        config=dataclasses.replace(plan.attention, num_kv_heads=kv_heads),
        layout=(f"{V_SCALE}{value_scale(hf)!r}",),
    )


def scaled_values(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """``v_proj``'s weight or bias times the layer's value scale (the module scales ``v_proj``'s output)."""
    tag = next(t for t in plan.layout if t.startswith(V_SCALE))
    scale = float(tag[len(V_SCALE) :])
    return [t * scale for t in tensors]


SINKS_STORED = "attention_sink_bias"
"""The sinks' name in a saved checkpoint: transformers' weight conversion for ``mimo_v2_flash`` renames
``self_attn.attention_sink_bias`` to the module's ``sinks`` on load (and back on ``save_pretrained``)."""
_VALUES = (("v_proj.weight",), ("v_proj.bias",))
RULES: tuple[Rule, ...] = (
    *(rule for rule in rotary.PROJECTION_RULES if rule.targets not in _VALUES),
    Rule(("v_proj.weight",), ("v_proj.weight",), scaled_values),
    Rule(("v_proj.bias",), ("v_proj.bias",), scaled_values, when=lambda plan: plan.attention.qkv_bias),
    *rename(("sinks", SINKS_STORED), when=lambda plan: plan.attention.attention_sinks),
)
"""q/k/o projections as stored (``o_proj`` without bias), ``v_proj`` times ``attention_value_scale``, the sinks of
sliding layers (stored as ``attention_sink_bias``)."""


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> rotary.RotaryReference:
    """``MiMoV2FlashAttention`` of the layer (its tensors loaded as stored, the sinks under the module's name) with the
    model's ``MiMoV2FlashRotaryEmbedding``, called with the layer's type."""
    tensors = {"sinks" if name == SINKS_STORED else name: tensor for name, tensor in tensors.items()}
    return rotary.RotaryReference.build(hf, plan, tensors, "mimo_v2_flash", "MiMoV2Flash", angles, dtype)


MIMO = register(
    Family(
        name="mimo_v2_flash",
        model_types=("mimo_v2_flash",),
        title="MiMo-V2-Flash: values narrower than keys, sinks on sliding layers",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
        layer_types=(SLIDING, "full_attention"),
    )
)
