"""DeepSeek-V2, DeepSeek-V3 and Mistral 4: multi-head latent attention (MLA) with a decoupled RoPE slice.

One layer becomes a :class:`posenc.blocks.MLABlock` (``config`` an :class:`~posenc.blocks.MLAConfig`): the low-rank
query (``q_lora_rank``; DeepSeek-V2-Lite has a plain ``q_proj``), the KV latent ``kv_a_proj_with_mqa`` ->
``kv_a_layernorm`` -> ``kv_b_proj`` and a rope slice of ``qk_rope_head_dim`` per head whose key part is one head
shared by all heads. RoPE: DeepSeek-V2 rotates in complex form (``view_as_complex`` of pairs (2i, 2i+1): posenc's
``interleaved`` layout); DeepSeek-V3 reads interleaved pairs and writes them in rotate_half order when
``rope_interleave`` (:attr:`MLAConfig.rope_interleave`), else rotates in the half layout. Frequencies follow
``rope_parameters`` (YaRN with ``mscale`` / ``mscale_all_dim`` in the released models, whose softmax scale the
block multiplies by ``mscale(factor, mscale_all_dim)²``, as transformers' ``yarn_apply_mscale``).

Mistral 4 is DeepSeek-V3's attention (``rope_interleave`` by default) with ``llama_4_scaling``: the whole query scaled
by ``1 + β · ln(1 + floor(p / original_max_position_embeddings))`` (:attr:`MLAConfig.temperature_floor_scale`, offset
0); its config states the rope slice as ``partial_rotary_factor = R / (nope + R)`` of the whole head, which is the
full rotation of the slice posenc rotates.

The cache holds what transformers' DeepSeek modules put in theirs: the normalised latent ``[B, 1, P, C]`` (keys)
and the rotated shared key slice ``[B, 1, P, R]`` (values).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from posenc.blocks import MLAConfig
from posenc.checkpoints import rotary
from posenc.checkpoints.family import Family, LayerPlan, Rule, register, rename
from posenc.checkpoints.reference import ModuleReference, hf_class, load_module
from posenc.config import from_hf_config
from posenc.errors import ConfigError

MODULES: Mapping[str, tuple[str, str]] = {
    "deepseek_v2": ("deepseek_v2", "DeepseekV2"),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3"),
    "mistral4": ("mistral4", "Mistral4"),
}
"""model_type -> (transformers module, class prefix)."""


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    rotary.check_layer(layer, int(hf.num_hidden_layers))
    rotary.layer_kind(hf, layer, layer_type)
    data = {**hf.to_dict(), "head_dim": int(hf.qk_rope_head_dim)}  # the scheme rotates the rope slice
    imported = from_hf_config(data)
    interleave = bool(getattr(hf, "rope_interleave", False)) if hf.model_type != "deepseek_v2" else False
    params = dict(imported.params)
    params["layout"] = "interleaved" if hf.model_type == "deepseek_v2" else "half"
    temperature: dict[str, Any] = {}
    if hf.model_type == "mistral4":
        _whole_slice(hf, params)
        rope = dict(hf.rope_parameters or {})
        if rope.get("llama_4_scaling_beta") is None or rope.get("original_max_position_embeddings") is None:
            raise ConfigError(
                "mistral4's rope_parameters lack llama_4_scaling_beta or original_max_position_embeddings, which its "
                "attention module scales the query with; this config cannot be loaded."
            )
        temperature = {"temperature_floor_scale": int(rope["original_max_position_embeddings"]),
                       "temperature_scale": float(rope["llama_4_scaling_beta"]), "temperature_offset": 0}  # fmt: skip
    config = MLAConfig(
        hidden_size=int(hf.hidden_size),
        num_heads=int(hf.num_attention_heads),
        kv_lora_rank=int(hf.kv_lora_rank),
        qk_nope_head_dim=int(hf.qk_nope_head_dim),
        qk_rope_head_dim=int(hf.qk_rope_head_dim),
        v_head_dim=int(hf.v_head_dim),
        q_lora_rank=None if hf.q_lora_rank is None else int(hf.q_lora_rank),
        max_position_embeddings=int(hf.max_position_embeddings),
        attention_bias=bool(hf.attention_bias),
        rope_interleave=interleave,
        **temperature,
    )
    return LayerPlan(config, imported.scheme, params, layer, None)


def _whole_slice(hf: Any, params: dict[str, Any]) -> None:
    """Mistral 4 states its rope slice as ``partial_rotary_factor = R / (nope + R)`` of the whole head: the slice
    rotates whole. Any other factor would rotate part of the slice, which its module does not do: refused."""
    factor = params.pop("partial_rotary_factor", None)
    head = int(hf.qk_nope_head_dim) + int(hf.qk_rope_head_dim)
    if factor is not None and abs(float(factor) * head - int(hf.qk_rope_head_dim)) > 1e-6:
        raise ConfigError(
            f"mistral4 partial_rotary_factor={factor} does not give the rope slice qk_rope_head_dim="
            f"{hf.qk_rope_head_dim} of the {head}-wide head; this config cannot be loaded."
        )


def _bias(plan: LayerPlan) -> bool:
    return bool(plan.mla.attention_bias)


def _lora(plan: LayerPlan) -> bool:
    return plan.mla.q_lora_rank is not None


RULES: tuple[Rule, ...] = (
    *rename(("q_proj.weight", "q_proj.weight"), when=lambda plan: not _lora(plan)),
    *rename(
        ("q_a_proj.weight", "q_a_proj.weight"),
        ("q_a_layernorm.weight", "q_a_layernorm.weight"),
        ("q_b_proj.weight", "q_b_proj.weight"),
        when=_lora,
    ),
    *rename(("q_a_proj.bias", "q_a_proj.bias"), when=lambda plan: _lora(plan) and _bias(plan)),
    *rename(
        ("kv_a_proj_with_mqa.weight", "kv_a_proj_with_mqa.weight"),
        ("kv_a_layernorm.weight", "kv_a_layernorm.weight"),
        ("kv_b_proj.weight", "kv_b_proj.weight"),
        ("o_proj.weight", "o_proj.weight"),
    ),
    *rename(("kv_a_proj_with_mqa.bias", "kv_a_proj_with_mqa.bias"), ("o_proj.bias", "o_proj.bias"), when=_bias),
)


class DeepseekReference(ModuleReference):
    """``DeepseekV2Attention`` / ``DeepseekV3Attention`` with the model's rotary module (or float64 angles), called
    as the decoder layer calls it; its cache holds the latent and the rotated key slice."""

    def __init__(self, attention: Any, rotary_module: Any, plan: LayerPlan, angles: str, dtype: torch.dtype) -> None:
        super().__init__(attention, plan, angles, dtype)
        self.rotary = rotary_module
        self.exact = rotary.float64_scheme(_rope_plan(plan)) if angles == "float64" else None
        self.complex_form = "V2" in type(attention).__name__
        self.takes_positions = "position_ids" in inspect.signature(attention.forward).parameters  # Mistral 4

    def position_embeddings(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> Any:
        if self.exact is None:
            return self.rotary(hidden, position_ids)
        cos, sin = self.exact.cos_sin(position_ids)
        if self.complex_form:
            return torch.complex(cos.double(), sin.double())
        return torch.cat((cos, cos), dim=-1).to(self.dtype), torch.cat((sin, sin), dim=-1).to(self.dtype)

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        embeddings = self.position_embeddings(hidden, position_ids)
        extra = {"position_ids": position_ids} if self.takes_positions else {}
        return self.attention(
            hidden, position_embeddings=embeddings, attention_mask=mask, past_key_values=cache, **extra
        )[0]


def _rope_plan(plan: LayerPlan) -> LayerPlan:
    """The plan of the rope slice alone (the geometry its scheme is built for)."""
    return LayerPlan(plan.mla.rope_config(), plan.scheme, plan.params, plan.layer)


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> DeepseekReference:
    module, prefix = MODULES[hf.model_type]
    path = f"models.{module}.modeling_{module}.{prefix}"
    attention = load_module(hf_class(f"{path}Attention")(hf, layer_idx=plan.layer), tensors, "", dtype)
    return DeepseekReference(attention, hf_class(f"{path}RotaryEmbedding")(hf), plan, angles, dtype)


DEEPSEEK = register(
    Family(
        name="deepseek",
        model_types=tuple(MODULES),
        title="DeepSeek-V2, DeepSeek-V3, Mistral 4: multi-head latent attention, decoupled RoPE",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
    )
)
