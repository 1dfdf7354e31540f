"""BLOOM: fused per-head ``query_key_value`` with biases, ``dense`` with a bias, unscaled ALiBi.

- ``BloomAttention`` views ``query_key_value`` as ``[B, S, H, 3, D]``: per head ``[q, k, v]`` (:mod:`.fused`);
  both projections always carry biases, except that with ``pretraining_tp > 1`` and ``slow_but_exact`` the module
  computes ``dense`` in slices *without* its bias — the loader follows the module and drops it too.
- Scores: ``alibi.baddbmm(q, kᵀ, beta=1, alpha=1/√D)`` = ``q·k/√D + alibi``: the bias is added unscaled
  (posenc's ``alibi`` scheme, ``scaled=False``), with ``alibi = slope · key position`` from ``build_alibi_tensor``
  (positions from the attention mask's cumulative sum, float32). Per query row that is posenc's
  ``slope · (j - i)`` plus the constant ``slope · i``, which the softmax cancels.
- ``BloomAttention.forward`` also takes the block's ``residual`` and returns ``dense(attention) + residual``; the
  reference passes zeros, so its output is the attention alone (what posenc's block computes).
- BLOOM has no context length of its own (ALiBi has no table); posenc uses :data:`MAX_POSITIONS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posenc.checkpoints import rotary
from posenc.checkpoints.families.fused import alibi_at_keys, fused_rules
from posenc.checkpoints.family import Family, LayerPlan, Rule, register
from posenc.checkpoints.reference import ModuleReference, hf_class

MODULE = "models.bloom.modeling_bloom"
MAX_POSITIONS = 2048
"""Context length posenc gives BLOOM layers (rows of precomputed ALiBi tables; BLOOM was trained on 2048 tokens)."""


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    sliced_without_bias = int(hf.pretraining_tp) > 1 and bool(hf.slow_but_exact)
    return rotary.decoder_plan(
        hf, layer, layer_type, qkv_bias=True, out_bias=not sliced_without_bias, max_position_embeddings=MAX_POSITIONS
    )


def reference_only(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """No block tensor: the checkpoint tensor is read for the transformers module alone."""
    return ()


RULES: tuple[Rule, ...] = (
    *fused_rules(),
    Rule((), ("dense.bias",), reference_only, when=lambda plan: not plan.attention.out_bias),
)
"""The fused weight table; a ``dense.bias`` the module ignores is still read, because the module holds it."""


class BloomReference(ModuleReference):
    """``BloomAttention(hidden, residual=0, alibi, attention_mask, layer_past)`` of the layer."""

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        alibi = alibi_at_keys(hf_class(f"{MODULE}.build_alibi_tensor"), self.plan.config.num_heads, keys, self.dtype)
        return self.attention(hidden, torch.zeros_like(hidden), alibi=alibi, attention_mask=mask, layer_past=cache)[0]


BLOOM = register(
    Family(
        name="bloom",
        model_types=("bloom",),
        title="BLOOM",
        layer_prefixes=("h.{layer}.self_attention.",),
        roots=("transformer.", ""),
        geometry=geometry,
        rules=RULES,
        reference=BloomReference.builder(f"{MODULE}.BloomAttention"),
    )
)
