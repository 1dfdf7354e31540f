"""T5 and mT5: bucketed relative bias, encoder and decoder stacks.

The bias table lives in layer 0 of each stack (``has_relative_attention_bias``); every layer of the stack adds
that table's bias to its unscaled scores. Encoder layers are bidirectional (buckets for both directions), decoder
self-attention layers causal (one direction of buckets). ``layer_type`` picks the stack (default ``encoder``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename
from posenc.checkpoints.reference import HFModule, ModuleReference, hf_class, load_module
from posenc.checkpoints.rotary import check_layer
from posenc.config import AttentionConfig

STACKS = ("encoder", "decoder")
ATTENTION = {"t5": "models.t5.modeling_t5.T5Attention", "mt5": "models.mt5.modeling_mt5.MT5Attention"}
MAX_POSITIONS = 512
"""Rows of precomputed bucket tables (T5 has no context length of its own; its bias is relative)."""


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    stack = layer_type or "encoder"
    decoder = stack == "decoder"
    count = int(hf.num_decoder_layers if decoder else hf.num_layers)
    check_layer(layer, count, f"{stack} layers")
    config = AttentionConfig(
        hidden_size=int(hf.d_model),
        num_heads=int(hf.num_heads),
        head_dim=int(hf.d_kv),
        causal=decoder,
        max_position_embeddings=int(getattr(hf, "n_positions", None) or MAX_POSITIONS),
    )
    params = {
        "bidirectional": not decoder,
        "num_buckets": int(hf.relative_attention_num_buckets),
        "max_distance": int(hf.relative_attention_max_distance),
    }
    return LayerPlan(config, "t5", params, layer, stack, decoder=decoder)


BIAS_TABLE = "/{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
"""The stack's bias table, owned by its layer 0 (relative to the model root)."""

RULES: tuple[Rule, ...] = (
    *rename(("q_proj.weight", "q.weight"), ("k_proj.weight", "k.weight"), ("v_proj.weight", "v.weight")),
    *rename(("o_proj.weight", "o.weight"), ("scheme.relative_bias.weight", BIAS_TABLE)),
)


class T5Reference(ModuleReference):
    """``T5Attention`` of the layer, with the position bias computed by its stack's layer-0 module (``owner``)."""

    def __init__(self, attention: HFModule, owner: HFModule, plan: LayerPlan, angles: str, dtype: torch.dtype):
        super().__init__(attention, plan, angles, dtype)
        self.owner = owner

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        seq, past = hidden.shape[1], keys.shape[1] - hidden.shape[1]
        bias = self.owner.compute_bias(seq, past + seq, past_seen_tokens=past)
        return self.attention(hidden, mask=mask, position_bias=bias, past_key_values=cache)[0]


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> T5Reference:
    import copy

    attention_class = hf_class(ATTENTION[hf.model_type])
    stack_config = copy.deepcopy(hf)
    stack_config.is_decoder = plan.decoder
    attention = attention_class(stack_config, has_relative_attention_bias=False, layer_idx=plan.layer)
    load_module(attention, {k: v for k, v in tensors.items() if not k.startswith("/")}, "", dtype)
    owner = attention_class(stack_config, has_relative_attention_bias=True, layer_idx=0)
    owner.relative_attention_bias.weight.data.copy_(tensors[BIAS_TABLE])
    owner.to(dtype).eval()
    return T5Reference(attention, owner, plan, angles, dtype)


T5 = register(
    Family(
        name="t5",
        model_types=tuple(ATTENTION),
        title="T5, mT5",
        layer_prefixes=("{stack}.block.{layer}.layer.0.SelfAttention.",),
        roots=("",),
        geometry=geometry,
        rules=RULES,
        reference=reference,
        layer_types=STACKS,
    )
)
