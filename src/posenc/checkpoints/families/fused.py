"""Shared by the fused-projection decoders (GPT-NeoX, Falcon, BLOOM): the per-head fused ``query_key_value``
layout, and transformers' ALiBi tensors taken at the keys' positions.

Fused layout: ``query_key_value`` holds, for each of the ``Hkv`` key/value heads, its group of ``g = H / Hkv``
query heads, then its key head, then its value head: rows ``[Hkv, g + 2, D]``. That one layout covers

- GPT-NeoX (``view(B, S, H, 3·D).chunk(3)``), BLOOM and Falcon's classic layout (``view(B, S, H, 3, D)``):
  ``Hkv = H``, ``g = 1``, per head ``[q, k, v]`` — not three ``q | k | v`` blocks;
- Falcon's ``new_decoder_architecture`` (``view(B, S, Hkv, g + 2, D)``): grouped ``[q … q, k, v]``;
- Falcon's ``multi_query`` (``view(B, S, H + 2, D)``): ``Hkv = 1``, ``g = H``.

Query head ``kv · g + i`` of the fused layout is the ``i``-th query of kv head ``kv``, which is the block's
grouped-query order (query head ``h`` reads kv head ``h // g``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from posenc.checkpoints.family import LayerPlan, Rule, rename


def split_grouped_qkv(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """Fused ``[Hkv·(g + 2)·D, ...]`` (weight or bias) -> q ``[H·D, ...]``, k ``[Hkv·D, ...]``, v ``[Hkv·D, ...]``."""
    config = plan.attention
    kv, groups, dim = config.num_kv_heads, config.kv_groups, config.head_dim
    fused = tensors[0]
    rest = tuple(fused.shape[1:])
    grouped = fused.reshape(kv, groups + 2, dim, *rest)
    query = grouped[:, :groups].reshape(kv * groups * dim, *rest)
    key = grouped[:, groups].reshape(kv * dim, *rest)
    value = grouped[:, groups + 1].reshape(kv * dim, *rest)
    return query, key, value


def fused_rules(fused: str = "query_key_value", out: str = "dense") -> tuple[Rule, ...]:
    """The weight table of a fused-qkv attention module: ``fused`` split by :func:`split_grouped_qkv` (weight, and
    bias when the plan has ``qkv_bias``), ``out`` onto ``o_proj`` (bias when ``out_bias``)."""
    targets = ("q_proj", "k_proj", "v_proj")
    return (
        Rule(tuple(f"{t}.weight" for t in targets), (f"{fused}.weight",), split_grouped_qkv),
        Rule(
            tuple(f"{t}.bias" for t in targets),
            (f"{fused}.bias",),
            split_grouped_qkv,
            when=lambda plan: plan.attention.qkv_bias,
        ),
        *rename(("o_proj.weight", f"{out}.weight")),
        *rename(("o_proj.bias", f"{out}.bias"), when=lambda plan: plan.attention.out_bias),
    )


AlibiBuilder = Callable[[torch.Tensor, int, torch.dtype], torch.Tensor]
"""transformers' ``build_alibi_tensor(attention_mask [B, L], num_heads, dtype) -> [B·H, 1, L]`` (BLOOM, Falcon)."""


def alibi_at_keys(build: AlibiBuilder, num_heads: int, key_pos: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """transformers' ALiBi tensor at the keys' positions: ``key_pos [B, K]`` -> ``[B·H, 1, K]``.

    ``build_alibi_tensor`` takes the positions from the attention mask's cumulative sum: for an unpadded run of
    ``L`` tokens its column ``j`` is ``slope_h · j``. Built for a run reaching the last key and read at each key's
    position, it is what the model adds for a sequence whose cache sits at ``0 .. P - 1`` and whose new tokens sit
    at ``position_ids`` (also when those start later than ``P``, which the model itself cannot be told). Per query
    row ``slope_h · j`` differs from posenc's ``slope_h · (j - i)`` by the constant ``slope_h · i``, which the
    softmax cancels.
    """
    batch = key_pos.shape[0]
    run = torch.ones(batch, int(key_pos.max()) + 1, dtype=torch.long)
    full = build(run, num_heads, dtype)  # [B·H, 1, L]
    return full.gather(-1, key_pos.repeat_interleave(num_heads, dim=0).unsqueeze(1))


__all__ = ["AlibiBuilder", "alibi_at_keys", "fused_rules", "split_grouped_qkv"]
