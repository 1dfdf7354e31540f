"""Gemma 4 (text): p-RoPE on full layers, wider full-layer heads, keys as values, a value norm, score scale 1.

The full layers' partial rotation is p-RoPE: Barbero et al., "Round and Round We Go! What makes Rotary Positional
Encodings useful?", 2024, https://arxiv.org/abs/2410.06205.

What transformers' ``Gemma4TextAttention`` computes, and how the block holds it:

- ``layer_types``: ``sliding_attention`` layers see the last ``sliding_window`` keys and rotate with default RoPE
  (``rope_parameters["sliding_attention"]``); ``full_attention`` layers see every key and rotate with
  proportional RoPE (``rope_type: proportional``, ``partial_rotary_factor`` 0.25 in transformers' default:
  frequencies over the whole head width, the trailing pairs unrotated; posenc's ``rope_proportional``);
- per layer type geometry (transformers' ``per_layer_config``, from ``global_head_dim`` and, with
  ``attention_k_eq_v``, ``num_global_key_value_heads``): full layers have their own head width and kv heads, read
  by :func:`posenc.config.from_hf_config`;
- q and k: per-head RMSNorm ``x · rsqrt(mean(x²) + eps) · w`` (weights as stored, not Gemma 3's ``1 + w``) before
  the rotation; v: the same norm without weights (the block's ``v_norm``);
- scores ``q·kᵀ`` unscaled (``self.scaling = 1.0``: the q norm sets the scale), no soft-cap;
- ``attention_k_eq_v`` full layers have no ``v_proj``: the value is the key projection's output before ``k_norm``
  and the rotation (the block's ``values_from_keys``: no ``v_proj`` either, one projection for both);
- KV sharing (``num_kv_shared_layers``; 0, no sharing, in transformers' default config and the tiny samples): the
  last ``num_kv_shared_layers`` layers have no key or value projections and attend over the keys and values an
  earlier layer of their type computed from that layer's input. One layer's block cannot take another layer's
  input, so such a layer is refused, naming the layer whose keys it reads (export that one; its cache is the one
  the shared layers read). The producer layers (``store``) compute like any other layer;
- ``use_bidirectional_attention="all"`` (every token sees every other; not the text models') is refused.

The reference calls the module as ``Gemma4TextModel`` does: the rotary module's cos/sin for the layer's type (or
float64 angles), the additive mask, the cache and a fresh ``shared_kv_states`` dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from posenc.checkpoints import rotary
from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename
from posenc.errors import ConfigError


def kv_producer(hf: Any, layer: int) -> int | None:
    """The layer whose keys and values layer ``layer`` reuses (``kv_sharing_modes[layer] == "reuse"``: the last
    non-shared layer of its type), or None for a layer with its own projections."""
    modes = list(hf.kv_sharing_modes)
    if modes[layer] != "reuse":
        return None
    kind = hf.layer_types[layer]
    first_shared = int(hf.num_hidden_layers) - int(hf.num_kv_shared_layers)
    return max(i for i in range(first_shared) if hf.layer_types[i] == kind)


def keys_are_values(hf: Any, kind: str | None) -> bool:
    """Whether a layer of ``kind`` takes its values from ``k_proj`` (``attention_k_eq_v`` on non-sliding layers)."""
    return bool(getattr(hf, "attention_k_eq_v", False)) and kind != "sliding_attention"


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    """One decoder layer: its type's geometry and RoPE, q/k/v norms, score scale 1, its window (sliding layers)."""
    rotary.check_layer(layer, int(hf.num_hidden_layers))
    if getattr(hf, "use_bidirectional_attention", None) == "all":
        raise ConfigError(
            "this gemma4 config sets use_bidirectional_attention='all' (every token attends every other); posenc's "
            "Gemma 4 family loads the causal text layers. Export it through its own module: --via trace."
        )
    producer = kv_producer(hf, layer)
    if producer is not None:
        raise ConfigError(
            f"layer {layer} of this gemma4 checkpoint shares its keys and values (num_kv_shared_layers="
            f"{hf.num_kv_shared_layers}): it has no key or value projection and attends over the cache of layer "
            f"{producer}, computed from that layer's input. Export layer {producer} (its cache is the one layer "
            f"{layer} reads) or a layer below {int(hf.num_hidden_layers) - int(hf.num_kv_shared_layers)}."
        )
    bias = bool(hf.attention_bias)
    features: dict[str, Any] = {"qkv_bias": bias, "out_bias": bias, "attn_scale": 1.0, "v_norm": True}
    features.update(qk_norm="rms", qk_norm_eps=float(hf.rms_norm_eps))
    features["values_from_keys"] = keys_are_values(hf, rotary.layer_kind(hf, layer, layer_type))
    return rotary.decoder_plan(hf, layer, layer_type, **features)


def _own_values(plan: LayerPlan) -> bool:
    return not plan.attention.values_from_keys


_PROJECTIONS = tuple(r for r in rotary.PROJECTION_RULES if r.targets not in (("v_proj.weight",), ("v_proj.bias",)))
RULES: tuple[Rule, ...] = (
    *_PROJECTIONS,
    *rename(("v_proj.weight", "v_proj.weight"), when=_own_values),
    *rename(("v_proj.bias", "v_proj.bias"), when=lambda plan: _own_values(plan) and plan.attention.qkv_bias),
    *rotary.norm_rules(),
)
"""q/k/o projections as stored, ``v_proj`` where the layer has one (not on ``attention_k_eq_v`` layers); the q/k
norm weights as stored (the module multiplies by ``w``). The value norm has no weights."""


class Gemma4Reference(rotary.RotaryReference):
    """``Gemma4TextAttention(hidden, position_embeddings, attention_mask, shared_kv_states, past_key_values)`` as
    ``Gemma4TextModel`` calls it, with a fresh ``shared_kv_states`` dict (the layer may store into it; it never
    reads from it, see :func:`geometry`)."""

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        embeddings = self.position_embeddings(hidden, position_ids)
        return self.attention(
            hidden, position_embeddings=embeddings, attention_mask=mask, shared_kv_states={}, past_key_values=cache
        )[0]


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> Gemma4Reference:
    """``Gemma4TextAttention`` of the layer (its tensors loaded) with the model's ``Gemma4TextRotaryEmbedding``."""
    built = Gemma4Reference.build(hf, plan, tensors, "gemma4", "Gemma4Text", angles, dtype)
    return built  # type: ignore[return-value]  # build() returns the calling subclass


GEMMA4 = register(
    Family(
        name="gemma4",
        model_types=("gemma4_text",),
        title="Gemma 4 (text): p-RoPE full layers, keys as values, value norm",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.", "model.language_model.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
        layer_types=("sliding_attention", "full_attention"),
    )
)
