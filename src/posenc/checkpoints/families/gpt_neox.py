"""GPT-NeoX (Pythia, GPT-NeoX-20B, ...): fused per-head ``query_key_value``, partial RoPE, biases.

``GPTNeoXAttention`` views its fused projection as ``[B, S, H, 3·D]`` and chunks the last axis, so each head's rows
are ``[q, k, v]`` (:mod:`.fused`); both ``query_key_value`` and ``dense`` carry a bias when ``attention_bias``
(default True). RoPE acts on the first ``partial_rotary_factor · D`` features of each head (legacy ``rotary_pct``,
default 0.25), half layout, angles from the model's ``GPTNeoXRotaryEmbedding``. The module takes its cache as
``layer_past``; otherwise it is called like a Llama-convention module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from posenc.checkpoints import rotary
from posenc.checkpoints.families.fused import fused_rules
from posenc.checkpoints.family import Family, LayerPlan, register


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    bias = bool(hf.attention_bias)
    return rotary.decoder_plan(hf, layer, layer_type, qkv_bias=bias, out_bias=bias)


class GPTNeoXReference(rotary.RotaryReference):
    """``GPTNeoXAttention(hidden, attention_mask, layer_past, position_embeddings)`` of the layer."""

    cache_argument = "layer_past"


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> rotary.RotaryReference:
    return GPTNeoXReference.build(hf, plan, tensors, "gpt_neox", "GPTNeoX", angles, dtype)


GPT_NEOX = register(
    Family(
        name="gpt_neox",
        model_types=("gpt_neox",),
        title="GPT-NeoX, Pythia",
        layer_prefixes=("layers.{layer}.attention.",),
        roots=("gpt_neox.", ""),
        geometry=geometry,
        rules=fused_rules(),
        reference=reference,
    )
)
