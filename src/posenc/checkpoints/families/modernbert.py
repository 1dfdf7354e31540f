"""ModernBERT: a rotary encoder with a fused ``Wqkv``, local sliding-window layers between global ones, and one RoPE
theta per layer kind.

Warner et al., "Smarter, Better, Faster, Longer: A Modern Bidirectional Encoder for Fast, Memory Efficient, and Long
Context Finetuning and Inference", 2024, https://arxiv.org/abs/2412.13663.

What transformers' ``ModernBertAttention`` computes, and how the block holds it:

- no causal mask and no KV cache (an encoder; the layer loads with ``decoder=False``, so ``validate`` feeds it no
  past and ``--decode`` is refused);
- ``Wqkv [3·H·D, E]`` viewed ``[..., 3, H, D]``: the q rows, then the k rows, then the v rows (not per head);
  ``Wo`` the output projection; both with biases when ``attention_bias``;
- ``layer_types`` (or the older ``global_attn_every_n_layers``: every n-th layer from 0 is ``full_attention``, the
  rest ``sliding_attention``); a sliding layer sees keys with ``|q - k| <= local_attention // 2`` (transformers'
  ``sliding_window_bidirectional_overlay`` at ``config.sliding_window = local_attention // 2``), the block's
  bidirectional window ``|q - k| < w`` with ``w = local_attention // 2 + 1`` (the module's own
  ``self.sliding_window``);
- ``rope_parameters`` keyed by layer kind: ``full_attention`` (``global_rope_theta``, 160000 in the released
  models) and ``sliding_attention`` (``local_rope_theta``, 10000), read by :func:`posenc.config.from_hf_config`.

The layer's ``attn_norm`` (an identity in layer 0) runs before the attention module and is not part of the block,
as the input norms of the decoder families are not. The reference calls the module as ``ModernBertModel`` does,
with the model's rotary module for the layer's kind (or float64 angles) and the bidirectional mask; the module keeps
no cache, so the keys and values the block returns are the module's own ``Wqkv`` rows rotated by its modeling file's
``apply_rotary_pos_emb`` with the same cos/sin (as :mod:`.deberta` reads its module's keys).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename
from posenc.checkpoints.reference import HFModule, Past, Step, attention_mask, hf_class, load_module
from posenc.checkpoints.rotary import RotaryReference, check_layer, layer_kind
from posenc.config import AttentionConfig, from_hf_config
from posenc.errors import ConfigError

MODULE = "models.modernbert.modeling_modernbert."
SLIDING = "sliding_attention"


def window_of(hf: Any, kind: str | None) -> int | None:
    """The block's bidirectional window of a layer: ``local_attention // 2 + 1`` for a sliding layer, else None."""
    if kind != SLIDING:
        return None
    return int(hf.local_attention) // 2 + 1


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    """One encoder layer: geometry, its kind's RoPE parameters, bidirectional (windowed on sliding layers)."""
    check_layer(layer, int(hf.num_hidden_layers))
    kind = layer_kind(hf, layer, layer_type)
    imported = from_hf_config(hf.to_dict(), kind)
    bias = bool(hf.attention_bias)
    config = AttentionConfig.from_dict(
        dict(
            imported.config.to_dict(),
            causal=False,
            qkv_bias=bias,
            out_bias=bias,
            sliding_window=window_of(hf, kind),
        )
    )
    return LayerPlan(config, imported.scheme, dict(imported.params), layer, kind, decoder=False)


def split_wqkv(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """``Wqkv`` ``[3·H·D, ...]`` (weight or bias; viewed ``[3, H, D]`` by the module) -> q, k, v ``[H·D, ...]``."""
    return tuple(tensors[0].chunk(3, dim=0))


def _biased(plan: LayerPlan) -> bool:
    return plan.attention.qkv_bias


_TARGETS = ("q_proj", "k_proj", "v_proj")
RULES: tuple[Rule, ...] = (
    Rule(tuple(f"{t}.weight" for t in _TARGETS), ("Wqkv.weight",), split_wqkv),
    Rule(tuple(f"{t}.bias" for t in _TARGETS), ("Wqkv.bias",), split_wqkv, when=_biased),
    *rename(("o_proj.weight", "Wo.weight")),
    *rename(("o_proj.bias", "Wo.bias"), when=_biased),
)


class ModernBertReference(RotaryReference):
    """``ModernBertAttention(hidden, position_embeddings=(cos, sin), attention_mask)`` as ``ModernBertModel`` calls
    it: no cache, the bidirectional (sliding) mask over the tokens' positions, the rotary module's output for the
    layer's kind (``rotary(x, position_ids, layer_type)``) or float64 angles.

    Shapes: ``hidden [B, S, E]``, ``position_ids [B, S]`` -> ``(out [B, S, E], keys, values [B, H, S, D])``.
    """

    def __init__(self, attention: HFModule, rotary: HFModule, plan: LayerPlan, angles: str, dtype: torch.dtype) -> None:
        super().__init__(attention, rotary, plan, angles, dtype)
        self.rotate = hf_class(f"{MODULE}apply_rotary_pos_emb")

    def step(self, hidden: torch.Tensor, position_ids: torch.Tensor, past_key: Past, past_value: Past) -> Step:
        if past_key is not None and past_key.shape[2] > 0:
            raise ConfigError(
                "ModernBERT layers are encoder layers: they take no cache (past_key/past_value); validate them "
                "without --decode and without a past."
            )
        config = self.plan.attention
        mask = attention_mask(position_ids, position_ids, False, config.sliding_window, self.dtype)
        cos, sin = self.position_embeddings(hidden, position_ids)
        out = self.attention(hidden, position_embeddings=(cos, sin), attention_mask=mask)[0]
        return (out, *self.keys_values(hidden, cos, sin))

    def keys_values(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The module's keys (rotated) and values ``[B, H, S, D]``, formed as its ``forward`` forms them."""
        heads = self.attention.Wqkv(hidden).view(*hidden.shape[:-1], 3, -1, self.attention.head_dim)
        query, key, value = (t.transpose(1, 2) for t in heads.unbind(dim=-3))
        _, key = self.rotate(query, key, cos, sin, unsqueeze_dim=1)
        return key, value


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> ModernBertReference:
    """``ModernBertAttention`` of the layer (its tensors loaded) with the model's ``ModernBertRotaryEmbedding``."""
    attention = hf_class(f"{MODULE}ModernBertAttention")(hf, layer_idx=plan.layer)
    load_module(attention, tensors, "", dtype)
    rotary = hf_class(f"{MODULE}ModernBertRotaryEmbedding")(hf)
    return ModernBertReference(attention, rotary, plan, angles, dtype)


MODERNBERT = register(
    Family(
        name="modernbert",
        model_types=("modernbert",),
        title="ModernBERT",
        layer_prefixes=("layers.{layer}.attn.",),
        roots=("model.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
        layer_types=("full_attention", SLIDING),
    )
)
