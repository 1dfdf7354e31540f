"""GPT-J: interleaved RoPE (``rotate_every_two``) on the first ``rotary_dim`` features, applied inside the module.

``GPTJAttention`` gathers sin/cos from its own ``embed_positions`` buffer (``cat(sin, cos)`` of float32 angles,
``max_position_embeddings`` rows, base 10000) by ``position_ids``; the float64 rendering replaces that buffer by
the same table computed with float64 angles.
"""

from __future__ import annotations

from typing import Any

import torch

from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename
from posenc.checkpoints.reference import HFModule, ModuleReference
from posenc.checkpoints.rotary import decoder_plan, float64_scheme


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    return decoder_plan(hf, layer, layer_type)


RULES: tuple[Rule, ...] = tuple(
    rename(
        ("q_proj.weight", "q_proj.weight"),
        ("k_proj.weight", "k_proj.weight"),
        ("v_proj.weight", "v_proj.weight"),
        ("o_proj.weight", "out_proj.weight"),
    )
)


class GPTJReference(ModuleReference):
    """``GPTJAttention(hidden, layer_past, attention_mask, position_ids)`` of the layer."""

    def __init__(self, attention: HFModule, plan: LayerPlan, angles: str, dtype: torch.dtype) -> None:
        super().__init__(attention, plan, angles, dtype)
        if angles == "float64":
            rows = attention.embed_positions.shape[0]
            cos, sin = float64_scheme(plan).cos_sin(torch.arange(rows))
            attention.embed_positions = torch.cat((sin, cos), dim=-1).to(dtype)

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        return self.attention(hidden, layer_past=cache, attention_mask=mask, position_ids=position_ids)[0]


reference = GPTJReference.builder("models.gptj.modeling_gptj.GPTJAttention")


GPTJ = register(
    Family(
        name="gptj",
        model_types=("gptj",),
        title="GPT-J",
        layer_prefixes=("h.{layer}.attn.",),
        roots=("transformer.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
    )
)
