"""Falcon: three fused-qkv layouts, optional biases, RoPE or Falcon's ALiBi.

- Layouts of ``query_key_value`` (:mod:`.fused`): ``new_decoder_architecture`` groups ``[q … q, k, v]`` per kv
  head (``num_kv_heads`` kv heads); ``multi_query`` holds all query heads, then one key and one value head; the
  classic layout (neither) holds per head ``[q, k, v]``. ``FalconAttention`` keeps one kv head for
  ``multi_query`` and ``num_kv_heads`` otherwise (the classic layout only runs with ``num_kv_heads`` equal to
  the head count).
- ``bias``: both ``query_key_value`` and ``dense`` carry one.
- ``alibi=False``: RoPE over the whole head (``FalconRotaryEmbedding``, ``rope_theta``; a
  ``partial_rotary_factor`` is refused, as the module ignores it), scores ``q·k / √D``.
- ``alibi=True``: scores ``(q·k + alibi) · (1/√D)`` with ``alibi = bf16(bf16(slope) · key position)`` from
  ``build_alibi_tensor`` (computed in bfloat16): posenc's ``alibi`` scheme with ``scaled`` and ``bf16_rounding``.

Caches: with ``new_decoder_architecture`` transformers broadcasts each kv head to its ``g`` query heads before
caching (its cache holds ``H`` heads, ``g`` copies of each); the reference repeats posenc's ``[B, Hkv, P, D]`` past
into that layout and returns its presents as ``[B, Hkv, P + S, D]`` again.

Upstream bug (transformers 5.23): ``FalconModel`` folds ``alibi / √D`` into the causal mask for its sdpa path, and
``FalconAttention``'s eager path adds the alibi itself as well, so an eager ``FalconModel`` adds it twice. The
reference therefore calls ``FalconAttention`` (eager) directly, as the model's sdpa path means it: with the alibi
tensor and a plain additive causal mask, giving ``(q·k + alibi) · (1/√D) + mask`` once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from posenc.checkpoints import rotary
from posenc.checkpoints.families.fused import alibi_at_keys, fused_rules
from posenc.checkpoints.family import Family, LayerPlan, register
from posenc.checkpoints.reference import hf_class
from posenc.errors import ConfigError

MODULE = "models.falcon.modeling_falcon"


def kv_heads(hf: Any) -> int:
    """The kv heads ``FalconAttention`` keeps: ``num_kv_heads`` (new architecture), 1 (multi-query) or all heads."""
    heads = int(hf.num_attention_heads)
    if hf.new_decoder_architecture:
        return int(hf.num_kv_heads)
    if hf.multi_query:
        return 1
    if int(hf.num_kv_heads) != heads:
        raise ConfigError(
            f"Falcon's classic layout (new_decoder_architecture and multi_query both false) stores keys and values "
            f"for every head, but num_kv_heads is {hf.num_kv_heads}, not {heads}: transformers' FalconAttention cannot "
            f"run this config either. Set num_kv_heads to {heads}, or new_decoder_architecture=true for grouped kv "
            f"heads."
        )
    return heads


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    bias = bool(hf.bias)
    plan = rotary.decoder_plan(hf, layer, layer_type, num_kv_heads=kv_heads(hf), qkv_bias=bias, out_bias=bias)
    partial = plan.params.get("partial_rotary_factor", 1.0)
    if plan.scheme != "alibi" and partial != 1.0:
        raise ConfigError(
            f"Falcon config with partial_rotary_factor={partial}: transformers' FalconAttention rotates the whole "
            f"head (FalconRotaryEmbedding's default RoPE ignores the factor; other RoPE types fail on it), so no "
            f"reference computes a partial rotation. Remove partial_rotary_factor from rope_parameters."
        )
    return plan


class FalconReference(rotary.RotaryReference):
    """``FalconAttention(hidden, alibi, attention_mask, position_ids, layer_past, position_embeddings)`` (eager).

    RoPE layers get the model's rotary cos/sin (or float64 ones) and ``alibi=None``; ALiBi layers get transformers'
    ``build_alibi_tensor`` at the keys' positions (:func:`~.fused.alibi_at_keys`) and no cos/sin.
    """

    cache_argument = "layer_past"

    @property
    def cached_copies(self) -> int:  # type: ignore[override]  # a property in the base, a method here
        """The new decoder architecture caches each kv head once per query head of its group."""
        return self.plan.attention.kv_groups if self.attention.new_decoder_architecture else 1

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        if self.plan.scheme == "alibi":
            build = hf_class(f"{MODULE}.build_alibi_tensor")
            alibi, embeddings = alibi_at_keys(build, self.plan.config.num_heads, keys, self.dtype), None
        else:
            alibi, embeddings = None, self.position_embeddings(hidden, position_ids)
        return self.attention(
            hidden,
            alibi=alibi,
            attention_mask=mask,
            position_ids=position_ids,
            layer_past=cache,
            position_embeddings=embeddings,
        )[0]


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> rotary.RotaryReference:
    return FalconReference.build(hf, plan, tensors, "falcon", "Falcon", angles, dtype)


FALCON = register(
    Family(
        name="falcon",
        model_types=("falcon",),
        title="Falcon",
        layer_prefixes=("h.{layer}.self_attention.",),
        roots=("transformer.", ""),
        geometry=geometry,
        rules=fused_rules(),
        reference=reference,
    )
)
