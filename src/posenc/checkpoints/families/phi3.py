"""Phi-3 / Phi-3.5 / Phi-4-mini: one fused ``qkv_proj`` (q rows, then k, then v), LongRoPE, partial rotary.

The attention call and rotary module follow the Llama convention (:class:`~posenc.checkpoints.rotary.RotaryReference`);
only the weight layout differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from posenc.checkpoints import rotary
from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    return rotary.decoder_plan(hf, layer, layer_type)


def split_qkv(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """``qkv_proj.weight [(H + 2 Hkv) D, E]`` -> q ``[H D, E]``, k ``[Hkv D, E]``, v ``[Hkv D, E]``."""
    config = plan.attention
    q_rows = config.num_heads * config.head_dim
    kv_rows = config.num_kv_heads * config.head_dim
    return torch.split(tensors[0], [q_rows, kv_rows, kv_rows], dim=0)


RULES: tuple[Rule, ...] = (
    Rule(("q_proj.weight", "k_proj.weight", "v_proj.weight"), ("qkv_proj.weight",), split_qkv),
    *rename(("o_proj.weight", "o_proj.weight")),
)


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> rotary.RotaryReference:
    return rotary.RotaryReference.build(hf, plan, tensors, "phi3", "Phi3", angles, dtype)


PHI3 = register(
    Family(
        name="phi3",
        model_types=("phi3",),
        title="Phi-3, Phi-3.5, Phi-4-mini",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
    )
)
