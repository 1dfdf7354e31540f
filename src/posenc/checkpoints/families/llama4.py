"""Llama 4 (text): iRoPE — RoPE layers with chunked attention and NoPE layers with attention-temperature tuning.

``no_rope_layers[i]`` (1 = RoPE, 0 = NoPE; by default every ``no_rope_layer_interval``-th layer is NoPE) picks the
kind of layer i; transformers' ``layer_types`` names them ``chunked_attention`` (RoPE) and ``full_attention``
(NoPE). ``Llama4TextAttention``:

- RoPE layers rotate q and k in complex form (``view_as_complex`` of pairs (2i, 2i+1): posenc's ``interleaved``
  layout) with the model's frequencies (``rope_parameters``, llama3 scaling in the released models), then apply
  ``Llama4TextL2Norm`` (RMS norm without weight, ``use_qk_norm``) to q and k, and attend within chunks of
  ``attention_chunk_size`` tokens (``create_chunked_causal_mask``);
- NoPE layers use no positions; with ``attn_temperature_tuning`` q is multiplied by
  ``log1p(floor((p + 1) / floor_scale)) · attn_scale + 1`` and the mask is plain causal.

The module computes that temperature's positions as the cache length plus ``arange(S)``; the reference hands it a
cache that reports the first position id as its length, so feeds whose ids start past the cache (positions near
the context length) are scaled at those positions, as the model is after that many tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from posenc.checkpoints import rotary
from posenc.checkpoints.family import Family, LayerPlan, Rule, register
from posenc.checkpoints.reference import import_transformers


def uses_rope(hf: Any, layer: int) -> bool:
    """Whether layer ``layer`` is a RoPE layer (``no_rope_layers[layer]`` is 1)."""
    return bool(hf.no_rope_layers[layer])


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    bias = bool(hf.attention_bias)
    rotary.check_layer(layer, int(hf.num_hidden_layers))
    if uses_rope(hf, layer):
        features: dict[str, Any] = {"qkv_bias": bias, "out_bias": bias}
        if hf.use_qk_norm:
            features.update(qk_norm="l2", qk_norm_eps=float(hf.rms_norm_eps), qk_norm_after_rope=True)
        plan = rotary.decoder_plan(hf, layer, layer_type, **features)
        config = plan.config
        if rotary.layer_kind(hf, layer, layer_type) == "chunked_attention" and hf.attention_chunk_size:
            config = dataclasses.replace(plan.attention, attention_chunk_size=int(hf.attention_chunk_size))
        return LayerPlan(config, plan.scheme, {**plan.params, "layout": "interleaved"}, layer, plan.layer_type)
    features = {"qkv_bias": bias, "out_bias": bias}
    if hf.attn_temperature_tuning:
        features.update(temperature_floor_scale=int(hf.floor_scale), temperature_scale=float(hf.attn_scale))
    plan = rotary.decoder_plan(hf, layer, layer_type, **features)
    return LayerPlan(plan.config, "nope", {}, layer, plan.layer_type)


RULES: tuple[Rule, ...] = rotary.PROJECTION_RULES


class Llama4Reference(rotary.RotaryReference):
    """``Llama4TextAttention`` with its model's rotary module (complex ``freqs_cis``) or float64 angles."""

    def position_embeddings(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> Any:
        if self.exact is not None:
            cos, sin = self.exact.cos_sin(position_ids)
            return torch.complex(cos.double(), sin.double())
        return self.rotary(hidden, position_ids)

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        embeddings = self.position_embeddings(hidden, position_ids) if self.plan.scheme != "nope" else None
        first = int(position_ids[0, 0])
        past = keys.shape[1] - position_ids.shape[1]
        if first != past:  # ids past the cache: the temperature's positions follow the ids (see the module docs)
            cache = _offset_cache(cache, first, self.plan.layer)
        return self.attention(hidden, position_embeddings=embeddings, attention_mask=mask, past_key_values=cache)[0]


def _offset_cache(cache: Any, first: int, layer: int) -> Any:
    """``cache`` whose ``get_seq_length`` reports ``first`` (the first new position) for the module's temperature;
    keys and values stay the cache's."""

    class OffsetCache(type(cache)):  # type: ignore[misc]  # a subclass of the cache's runtime class
        def get_seq_length(self, layer_idx: int = 0) -> int:
            return first

    cache.__class__ = OffsetCache
    return cache


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> Llama4Reference:
    import_transformers()
    return Llama4Reference.build(hf, plan, tensors, "llama4", "Llama4Text", angles, dtype)  # type: ignore[return-value]  # build() returns the calling subclass


LLAMA4 = register(
    Family(
        name="llama4",
        model_types=("llama4_text",),
        title="Llama 4 (text): iRoPE — chunked RoPE layers, NoPE layers with temperature tuning",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.", "language_model.model.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
        layer_types=("chunked_attention", "full_attention"),
    )
)
