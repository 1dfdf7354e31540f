"""MPT: fused ``Wqkv`` (``q | k | v`` blocks), ``out_proj``, no biases, ALiBi over ``max_seq_len`` keys.

``MptAttention`` splits ``Wqkv``'s output with ``chunk(3)`` (three blocks of ``H·D`` rows), scales ``q·k`` by
``attn_config.softmax_scale`` (default ``1/√D``) and adds the model's ``position_bias`` unscaled:
``build_mpt_alibi_tensor`` over ``L = max_seq_len`` columns, ``slope · (c - (L - 1))`` for column ``c``, of which
the module keeps the last ``K`` for its ``K`` keys — each key gets ``-slope ·`` its distance to the last key. The
reference reads that tensor at column ``L - 1 - (p_last - p)`` for a key at position ``p`` (so a gap between the
cache and the new tokens, which the model has no way to express, still counts). Per query row that is posenc's
``alibi`` scheme ``slope · (p - i)`` up to a constant the softmax cancels (the scheme's slope order for any head
count equals MPT's). ``MptAttention`` takes one ``position_bias [H, 1, K]`` for the whole batch, so the reference
calls it per batch row.

transformers 5.23 runs only part of MPT's ``attn_config`` (see :data:`UNSUPPORTED`): ``MptModel`` always adds
ALiBi built with ``alibi_bias_max=8`` (whatever the config says), ``MptAttention`` has no biases, no q/k
LayerNorm, no prefix-LM or sequence-id masking and one kv head per head; and it clamps q/k/v with ``clip_qkv``,
which is no block feature. posenc refuses those configs (there is no reference that computes them, or no block
that does) instead of deploying something that differs from the model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from posenc.checkpoints import rotary
from posenc.checkpoints.families.phi3 import split_qkv
from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename
from posenc.checkpoints.reference import ModuleReference, Past, Step, hf_class
from posenc.errors import ConfigError

MODULE = "models.mpt.modeling_mpt"
BIAS_MAX = 8
"""The ``alibi_bias_max`` transformers' ``MptModel`` builds its ALiBi with (it does not pass the config's)."""

UNSUPPORTED: Mapping[str, tuple[Callable[[Any], bool], str]] = {
    "attn_config.clip_qkv": (
        lambda value: bool(value),
        "MptAttention clamps the fused q/k/v to ±clip_qkv; posenc's AttentionBlock has no clamp (it is not a "
        "positional-encoding block feature)",
    ),
    "attn_config.qk_ln": (
        bool,
        "transformers' MptAttention has no q/k LayerNorm (it drops the checkpoint's q_ln/k_ln weights), and "
        "posenc's q/k norm is an RMSNorm",
    ),
    "attn_config.prefix_lm": (bool, "transformers' MptModel ignores prefix_lm (its mask is always causal)"),
    "attn_config.attn_uses_sequence_id": (
        bool,
        "transformers' MptModel ignores attn_uses_sequence_id (no per-sequence mask)",
    ),
    "attn_config.alibi": (
        lambda value: not value,
        "transformers' MptModel always adds ALiBi and has no learned position embedding",
    ),
    "attn_config.alibi_bias_max": (
        lambda value: float(value) != BIAS_MAX,
        f"transformers 5.23's MptModel builds its ALiBi with alibi_bias_max={BIAS_MAX} whatever the config says",
    ),
    "attn_config.attn_type": (
        lambda value: value != "multihead_attention",
        "transformers' MptAttention is multi-head attention only (Wqkv of 3 × d_model rows)",
    ),
    "no_bias": (
        lambda value: not value,
        "transformers' MptAttention has no Wqkv/out_proj biases (it drops the checkpoint's)",
    ),
}
"""Config options posenc refuses: ``dotted name -> (refused(value), why)``."""


def check_supported(hf: Any) -> None:
    """Raise :class:`ConfigError` for an MPT config transformers' module does not run as written, or the block
    cannot express (:data:`UNSUPPORTED`)."""
    for name, (refused, why) in UNSUPPORTED.items():
        value = functools.reduce(getattr, name.split("."), hf)
        if refused(value):
            raise ConfigError(
                f"MPT {name}={value!r} is not supported: {why}. posenc loads MPT layers that transformers computes as "
                f"configured; for this checkpoint export the scheme by hand (posenc export --scheme alibi --param "
                f"alibi_bias_max=... with its geometry) and check it against your own implementation."
            )


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    check_supported(hf)
    scale = hf.attn_config.softmax_scale
    return rotary.decoder_plan(
        hf,
        layer,
        layer_type,
        attn_scale=None if scale is None else float(scale),
        max_position_embeddings=int(hf.max_seq_len),
    )


RULES: tuple[Rule, ...] = (
    Rule(("q_proj.weight", "k_proj.weight", "v_proj.weight"), ("Wqkv.weight",), split_qkv),
    *rename(("o_proj.weight", "out_proj.weight")),
)


class MptReference(ModuleReference):
    """``MptAttention(hidden, position_bias, past_key_values, attention_mask)``, one batch row at a time.

    ``position_bias [H, 1, K]``: the model's ``build_mpt_alibi_tensor(H, max_seq_len)`` at the columns of the row's
    keys, counted back from its last key; ``attention_mask``: boolean, True where masked (the model's
    ``create_causal_mask(...).to(bool)``).
    """

    def step(self, hidden: torch.Tensor, position_ids: torch.Tensor, past_key: Past, past_value: Past) -> Step:
        rows = []
        for b in range(hidden.shape[0]):
            row = slice(b, b + 1)
            past = (None if t is None else t[row] for t in (past_key, past_value))
            rows.append(super().step(hidden[row], position_ids[row], *past))
        out, key, value = (torch.cat(parts) for parts in zip(*rows, strict=True))
        return out, key, value

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        config = self.plan.config
        length = config.max_position_embeddings
        bias = hf_class(f"{MODULE}.build_mpt_alibi_tensor")(config.num_heads, length, BIAS_MAX).to(self.dtype)
        columns = length - 1 - (keys[0].max() - keys[0])
        return self.attention(hidden, bias[..., columns], past_key_values=cache, attention_mask=mask < 0)[0]


MPT = register(
    Family(
        name="mpt",
        model_types=("mpt",),
        title="MPT",
        layer_prefixes=("blocks.{layer}.attn.",),
        roots=("transformer.", ""),
        geometry=geometry,
        rules=RULES,
        reference=MptReference.builder(f"{MODULE}.MptAttention"),
    )
)
