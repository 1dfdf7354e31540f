"""HunYuan (dense and MoE v1): NTK-α RoPE and per-head q/k RMSNorm applied after the rotation.

``HunYuanDenseV1Attention`` / ``HunYuanMoEV1Attention`` rotate q and k with the model's rotary module (NTK-α:
base θ·α^(d/(d−2)); the released configs label it ``"dynamic"`` with an ``alpha``, which posenc imports as
``rope_ntk_alpha``, the rule the module itself follows), then normalise them with ``query_layernorm`` /
``key_layernorm`` (RMSNorm with weights over ``head_dim``): posenc's ``qk_norm="rms"`` with
``qk_norm_after_rope``. With weights the norm does not commute with the rotation, so the order matters (a block
that normalised first differs by far more than 1e-5: tests/checkpoints/test_families_modern.py shows it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.checkpoints import rotary
from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename

MODULES: Mapping[str, tuple[str, str]] = {
    "hunyuan_v1_dense": ("hunyuan_v1_dense", "HunYuanDenseV1"),
    "hunyuan_v1_moe": ("hunyuan_v1_moe", "HunYuanMoEV1"),
}
"""model_type -> (transformers module, class prefix)."""


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    bias = bool(hf.attention_bias)
    return rotary.decoder_plan(
        hf, layer, layer_type, qkv_bias=bias, out_bias=bias, qk_norm="rms", qk_norm_eps=float(hf.rms_norm_eps),
        qk_norm_after_rope=True,
    )  # fmt: skip


RULES: tuple[Rule, ...] = (
    *rotary.PROJECTION_RULES,
    *rename(("q_norm.weight", "query_layernorm.weight"), ("k_norm.weight", "key_layernorm.weight")),
)


reference = rotary.reference_by_model_type(MODULES)


HUNYUAN = register(
    Family(
        name="hunyuan",
        model_types=tuple(MODULES),
        title="HunYuan (dense, MoE): NTK-α RoPE, q/k norms after the rotation",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
    )
)
