"""Llama-convention decoders: Llama, Mistral, Mixtral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm), and the
model types whose attention module is theirs up to a declared difference (:data:`ALIASES`).

Their attention modules share one layout (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``), one call
(``attention(hidden, position_embeddings=(cos, sin), attention_mask, past_key_values)``) and a model-level rotary
module (``XxxRotaryEmbedding(config)(x, position_ids) -> (cos, sin)``, half layout, cos/sin ``[B, S, r]``).

An alias is registered only with a test against its own transformers module (tests/checkpoints/test_aliases.py:
a tiny seeded checkpoint per type, the block against the module and the module against the whole model). What
an alias's module does differently is declared in its :class:`Variant` (which config attribute gives the biases,
a softmax scale, interleaved pairs, layers without RoPE, options the block cannot express and so refuses).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from posenc.checkpoints import rotary
from posenc.checkpoints.family import Family, LayerPlan, Rule, register
from posenc.errors import ConfigError

NopeRule = Callable[[Any, str | None, int], bool]
"""``(config, layer kind, layer) -> True`` for a layer whose module skips the rotation."""


def nope_when_not_sliding(hf: Any, kind: str | None, layer: int) -> bool:
    """EXAONE 4, Kolibri: with a window configured only sliding layers rotate (``sliding_window is None or
    is_sliding``)."""
    return bool(getattr(hf, "sliding_window", None)) and kind != "sliding_attention"


def nope_unless_windowed(hf: Any, kind: str | None, layer: int) -> bool:
    """Cohere 2: only layers with a window rotate (``if self.sliding_window is not None``); full layers are NoPE."""
    return rotary.sliding_window_of(hf, kind) is None


def nope_by_table(hf: Any, kind: str | None, layer: int) -> bool:
    """SmolLM3: ``no_rope_layers[i] == 0`` marks a layer without RoPE."""
    return not hf.no_rope_layers[layer]


NOPE_RULES: Mapping[str, NopeRule] = {
    "when_not_sliding": nope_when_not_sliding,
    "unless_windowed": nope_unless_windowed,
    "no_rope_layers": nope_by_table,
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """What differs between the model types of this convention."""

    prefix: str
    """transformers class prefix and module: ``Llama`` -> ``models.llama.modeling_llama.LlamaAttention``."""
    module: str
    qkv_bias: str | bool = "attention_bias"
    """config attribute (or a constant) saying whether q/k/v carry biases."""
    out_bias: str | bool = "attention_bias"
    qk_norm: str | bool = False
    """per-head q/k RMSNorm before the rotation: a constant, or the config attribute that switches it on."""
    scale: str | None = None
    """config attribute holding the softmax scale (Granite's ``attention_multiplier``); None: ``head_dim ** -0.5``."""
    interleaved: bool = False
    """the module rotates pairs ``(2i, 2i + 1)`` (GLM-4, Helium, ERNIE 4.5, Cohere)."""
    nope: str | None = None
    """which layers skip the rotation: a name in :data:`NOPE_RULES`."""
    refuse: tuple[tuple[str, Any], ...] = ()
    """``(config attribute, the only value posenc accepts)``: options the block cannot express (OLMo's
    ``clip_qkv``, Cohere's per-head LayerNorm ``use_qk_norm``)."""
    cos_sin_interleaved: bool = False
    """the model's rotary module returns cos/sin repeated pairwise (Cohere) rather than concatenated."""


CORE: Mapping[str, Variant] = {
    "llama": Variant("Llama", "llama"),
    "mistral": Variant("Mistral", "mistral", qkv_bias=False, out_bias=False),
    "mixtral": Variant("Mixtral", "mixtral", qkv_bias=False, out_bias=False),
    "qwen2": Variant("Qwen2", "qwen2", qkv_bias=True, out_bias=False),
    "qwen3": Variant("Qwen3", "qwen3", qk_norm=True),
}

ALIASES: Mapping[str, Variant] = {
    # Llama's own attention, built from another config class
    "internlm3": Variant("Llama", "llama"),
    "iquestcoder": Variant("Llama", "llama"),
    # the Llama module under another name
    "arcee": Variant("Arcee", "arcee"),
    "aria_text": Variant("AriaText", "aria"),
    "jais2": Variant("Jais2", "jais2"),
    "phimoe": Variant("Phimoe", "phimoe"),
    "ministral": Variant("Ministral", "ministral", qkv_bias=False, out_bias=False),
    "nemotron": Variant("Nemotron", "nemotron"),
    "solar_open": Variant("SolarOpen", "solar_open", out_bias=False),
    "seed_oss": Variant("SeedOss", "seed_oss", out_bias="attention_out_bias"),
    "starcoder2": Variant("Starcoder2", "starcoder2", qkv_bias="use_bias", out_bias="use_bias"),
    "qwen2_moe": Variant("Qwen2Moe", "qwen2_moe", qkv_bias="qkv_bias", out_bias=False),
    "olmo": Variant("Olmo", "olmo", refuse=(("clip_qkv", None),)),
    "cwm": Variant("Cwm", "cwm", qkv_bias=False, out_bias=False),
    "stablelm": Variant("StableLm", "stablelm", qkv_bias="use_qkv_bias", out_bias=False,
                        refuse=(("qk_layernorm", False),)),
    # the softmax scale from the config
    "granite": Variant("Granite", "granite", scale="attention_multiplier"),
    "granitemoe": Variant("GraniteMoe", "granitemoe", scale="attention_multiplier"),
    "granitemoeshared": Variant("GraniteMoeShared", "granitemoeshared", scale="attention_multiplier"),
    "hyperclovax": Variant("HyperCLOVAX", "hyperclovax", scale="attention_multiplier"),
    # per-head q/k RMSNorm before the rotation
    "qwen3_moe": Variant("Qwen3Moe", "qwen3_moe", qk_norm=True),
    "apertus": Variant("Apertus", "apertus", qk_norm=True),
    "dots1": Variant("Dots1", "dots1", qk_norm=True),
    "hy_v3": Variant("HYV3", "hy_v3", qk_norm=True),
    "mellum": Variant("Mellum", "mellum", qk_norm=True),
    "glm4_moe": Variant("Glm4Moe", "glm4_moe", out_bias=False, qk_norm="use_qk_norm"),
    # layers without RoPE
    "exaone4": Variant("Exaone4", "exaone4", qkv_bias=False, out_bias=False, qk_norm=True, nope="when_not_sliding"),
    "exaone_moe": Variant("ExaoneMoe", "exaone_moe", qkv_bias=False, out_bias=False, qk_norm=True,
                          nope="when_not_sliding"),
    "kolibri1": Variant("Kolibri1", "kolibri1", qkv_bias=False, out_bias=False, qk_norm=True, nope="when_not_sliding"),
    "smollm3": Variant("SmolLM3", "smollm3", nope="no_rope_layers"),
    # interleaved pairs
    "glm": Variant("Glm", "glm", interleaved=True, out_bias=False),
    "glm4": Variant("Glm4", "glm4", interleaved=True, out_bias=False),
    "helium": Variant("Helium", "helium", interleaved=True, out_bias=False),
    "ernie4_5": Variant("Ernie4_5", "ernie4_5", qkv_bias="use_bias", out_bias="use_bias", interleaved=True),
    "ernie4_5_moe": Variant("Ernie4_5_Moe", "ernie4_5_moe", qkv_bias="use_bias", out_bias="use_bias",
                            interleaved=True),
    "cohere": Variant("Cohere", "cohere", interleaved=True, cos_sin_interleaved=True,
                      refuse=(("use_qk_norm", False),)),
    "cohere2": Variant("Cohere2", "cohere2", interleaved=True, cos_sin_interleaved=True, nope="unless_windowed"),
}  # fmt: skip
"""Model types whose attention is the Llama convention's up to what their Variant declares; each is proven against
its own module by tests/checkpoints/test_aliases.py."""

VARIANTS: Mapping[str, Variant] = {**CORE, **ALIASES}


def _flag(hf: Any, value: str | bool) -> bool:
    return bool(getattr(hf, value, False)) if isinstance(value, str) else value


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    """Geometry, scheme and parameters of one decoder layer of a Llama-convention model."""
    variant = VARIANTS[hf.model_type]
    for option, accepted in variant.refuse:
        if getattr(hf, option, accepted) != accepted:
            raise ConfigError(
                f"{hf.model_type} {option}={getattr(hf, option)!r} is not supported: posenc's block cannot express "
                f"it (only {option}={accepted!r} loads); export the scheme by hand."
            )
    features: dict[str, Any] = {"qkv_bias": _flag(hf, variant.qkv_bias), "out_bias": _flag(hf, variant.out_bias)}
    if _flag(hf, variant.qk_norm):
        features.update(qk_norm="rms", qk_norm_eps=float(hf.rms_norm_eps))
    if variant.scale is not None:
        features["attn_scale"] = float(getattr(hf, variant.scale))
    plan = rotary.decoder_plan(hf, layer, layer_type, **features)
    if variant.nope is not None and NOPE_RULES[variant.nope](hf, plan.layer_type, layer):
        return dataclasses.replace(plan, scheme="nope", params={})
    if variant.interleaved:
        return dataclasses.replace(plan, params={**plan.params, "layout": "interleaved"})
    return plan


RULES: tuple[Rule, ...] = (*rotary.PROJECTION_RULES, *rotary.norm_rules())


class InterleavedCosSinReference(rotary.RotaryReference):
    """A module whose model's rotary module repeats cos/sin pairwise (Cohere): float64 angles are handed over the
    same way."""

    def position_embeddings(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.exact is None:
            return super().position_embeddings(hidden, position_ids)
        cos, sin = self.exact.cos_sin(position_ids)
        return cos.repeat_interleave(2, -1).to(self.dtype), sin.repeat_interleave(2, -1).to(self.dtype)


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> rotary.RotaryReference:
    variant = VARIANTS[hf.model_type]
    cls = InterleavedCosSinReference if variant.cos_sin_interleaved else rotary.RotaryReference
    return cls.build(hf, plan, tensors, variant.module, variant.prefix, angles, dtype)


LLAMA = register(
    Family(
        name="llama",
        model_types=tuple(VARIANTS),
        title="Llama, Mistral, Mixtral, Qwen2, Qwen3 and their aliases",
        layer_prefixes=("layers.{layer}.self_attn.",),
        roots=("model.", ""),
        geometry=geometry,
        rules=RULES,
        reference=reference,
    )
)
