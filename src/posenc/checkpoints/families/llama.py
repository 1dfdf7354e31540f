"""Llama-convention decoders: Llama, Mistral, Mixtral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm), and the
model types whose attention module is theirs up to a declared difference (:data:`ALIASES`).

Their attention modules share one layout (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``), one call
(``attention(hidden, position_embeddings=(cos, sin), attention_mask, past_key_values)``) and a model-level rotary
module (``XxxRotaryEmbedding(config)(x, position_ids) -> (cos, sin)``, half layout, cos/sin ``[B, S, r]``).

An alias is registered only with a test against its own transformers module (tests/checkpoints/test_aliases.py:
a tiny seeded checkpoint per type, the block against the module and the module against the whole model). What
an alias's module does differently is declared in its :class:`Variant` (which config attribute gives the biases,
a softmax scale, interleaved pairs, layers without RoPE, q/k norms over the whole projection, attention sinks, an
output gate and where its weights are, a position-scaled query, options the block cannot express and so refuses).
Layers that are not softmax attention (Qwen3-Next's Gated DeltaNet ``linear_attention`` layers, LFM3's ``conv``
layers) are refused.
"""

from __future__ import annotations

import copy
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


def nope_unless_local(hf: Any, kind: str | None, layer: int) -> bool:
    """AFMoE: only ``sliding_attention`` layers rotate (``if self.is_local_attention``)."""
    return kind != "sliding_attention"


NOPE_RULES: Mapping[str, NopeRule] = {
    "when_not_sliding": nope_when_not_sliding,
    "unless_windowed": nope_unless_windowed,
    "no_rope_layers": nope_by_table,
    "unless_local": nope_unless_local,
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
    cos_sin_half: bool = False
    """the model's rotary module returns cos/sin ``[B, S, r / 2]``, once per frequency (gpt-oss)."""
    qk_norm_full_width: bool = False
    """the q/k RMSNorm spans the whole projection, weights ``[H·D]`` / ``[Hkv·D]`` (OLMo 2, MiniMax-M2)."""
    norm_plus_one: bool = False
    """the q/k norms multiply by ``1 + w`` (Qwen3-Next's zero-centred weights)."""
    sinks: bool = False
    """the module holds a learned softmax logit per head, ``sinks [H]`` (gpt-oss, Granite SWA)."""
    gate: str | None = None
    """the module gates its output before ``o_proj``: where the gate's weights are (one of
    :data:`posenc.checkpoints.rotary.GATES`)."""
    gate_when: str | None = None
    """config attribute that switches the gate on (LFM3's ``use_attention_gate``); None: always gated."""
    gate_activation: str = "sigmoid"
    """``sigmoid`` (Qwen3-Next, AFMoE) or ``softplus`` (Laguna)."""
    gate_per_head: str | bool = False
    """one gate value per head: a constant, or the config attribute saying so (Laguna's ``gating``: ``True`` or
    ``"per-head"``)."""
    query_scaling: bool = False
    """Ministral 3's ``llama_4_scaling``: q times ``1 + β · ln(1 + floor(p / original_max_position_embeddings))``
    (``rope_parameters["llama_4_scaling_beta"]``); the module takes ``position_ids``."""
    heads_per_layer: str | None = None
    """config attribute listing each layer's query heads (Laguna's ``num_attention_heads_per_layer``)."""
    theta_per_layer: str | None = None
    """config attribute listing each layer's RoPE theta, 0 for a layer without RoPE (Granite SWA's
    ``layer_rope_theta``; its model builds one rotary module per theta)."""
    module_names: tuple[tuple[str, str], ...] = ()
    """``(name in the checkpoint, name in the module)`` of tensors transformers' weight conversion renames on load
    (LFM3 stores its gate as ``self_attn.gate_proj`` and its module calls it ``g_proj``; ``save_pretrained`` writes
    the stored name back)."""


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
    # q/k RMSNorm over the whole projection
    "olmo2": Variant("Olmo2", "olmo2", qk_norm=True, qk_norm_full_width=True),
    "olmo3": Variant("Olmo3", "olmo3", qk_norm=True, qk_norm_full_width=True),
    "olmoe": Variant("Olmoe", "olmoe", qk_norm=True, qk_norm_full_width=True, refuse=(("clip_qkv", None),)),
    "flex_olmo": Variant("FlexOlmo", "flex_olmo", qk_norm=True, qk_norm_full_width=True),
    "minimax_m2": Variant("MiniMaxM2", "minimax_m2", qkv_bias=False, out_bias=False, qk_norm=True,
                          qk_norm_full_width=True),
    # attention sinks
    "gpt_oss": Variant("GptOss", "gpt_oss", sinks=True, cos_sin_half=True),
    "granite_swa": Variant("GraniteSWA", "granite_swa", scale="attention_multiplier", sinks=True,
                           theta_per_layer="layer_rope_theta"),
    "granitemoe_swa": Variant("GraniteMoeSWA", "granitemoe_swa", scale="attention_multiplier", sinks=True,
                              theta_per_layer="layer_rope_theta"),
    # output gates
    "qwen3_next": Variant("Qwen3Next", "qwen3_next", qk_norm=True, norm_plus_one=True, gate="q_proj"),
    "afmoe": Variant("Afmoe", "afmoe", qk_norm=True, gate="gate_proj", nope="unless_local"),
    "laguna": Variant("Laguna", "laguna", qk_norm=True, gate="g_proj", gate_activation="softplus",
                      gate_per_head="gating", heads_per_layer="num_attention_heads_per_layer"),
    "lfm3": Variant("Lfm3", "lfm3", qk_norm=True, gate="gate_proj", gate_per_head=True, gate_when="use_attention_gate",
                    module_names=(("gate_proj.weight", "g_proj.weight"),)),
    # the query scaled by its position
    "ministral3": Variant("Ministral3", "ministral3", qkv_bias=False, out_bias=False, query_scaling=True),
}  # fmt: skip
"""Model types whose attention is the Llama convention's up to what their Variant declares; each is proven against
its own module by tests/checkpoints/test_aliases.py."""

VARIANTS: Mapping[str, Variant] = {**CORE, **ALIASES}


def _flag(hf: Any, value: str | bool) -> bool:
    return bool(getattr(hf, value, False)) if isinstance(value, str) else value


def _per_head(hf: Any, value: str | bool) -> bool:
    """Laguna's ``gating``: ``True`` or ``"per-head"`` gate per head, ``"per-element"`` per output element."""
    setting = getattr(hf, value, False) if isinstance(value, str) else value
    return setting is True or setting == "per-head"


def _gate(hf: Any, variant: Variant) -> str | None:
    """Where the layer's output gate weights are, or None for a layer without a gate."""
    if variant.gate_when is not None and not getattr(hf, variant.gate_when, False):
        return None
    return variant.gate


def _features(hf: Any, variant: Variant, layer: int) -> dict[str, Any]:
    """The block options of a layer of ``variant`` (see :class:`Variant`)."""
    features: dict[str, Any] = {"qkv_bias": _flag(hf, variant.qkv_bias), "out_bias": _flag(hf, variant.out_bias)}
    if _flag(hf, variant.qk_norm):
        features.update(qk_norm="rms", qk_norm_eps=float(hf.rms_norm_eps))
        features["qk_norm_full_width"] = variant.qk_norm_full_width
    if variant.scale is not None:
        features["attn_scale"] = float(getattr(hf, variant.scale))
    features["attention_sinks"] = variant.sinks
    if _gate(hf, variant) is not None:
        features.update(output_gate=variant.gate_activation, output_gate_per_head=_per_head(hf, variant.gate_per_head))
    if variant.query_scaling:
        rope = dict(hf.rope_parameters or {})
        beta, original = rope.get("llama_4_scaling_beta"), rope.get("original_max_position_embeddings")
        if beta is None or original is None:
            raise ConfigError(
                f"{hf.model_type}'s rope_parameters lack llama_4_scaling_beta or original_max_position_embeddings, "
                f"which its attention module scales the query with; this config cannot be loaded."
            )
        features.update(temperature_floor_scale=int(original), temperature_scale=float(beta), temperature_offset=0)
    if variant.heads_per_layer is not None:
        features["num_heads"] = int(getattr(hf, variant.heads_per_layer)[layer])
    return features


def geometry(hf: Any, layer: int, layer_type: str | None) -> LayerPlan:
    """Geometry, scheme and parameters of one decoder layer of a Llama-convention model."""
    variant = VARIANTS[hf.model_type]
    for option, accepted in variant.refuse:
        if getattr(hf, option, accepted) != accepted:
            raise ConfigError(
                f"{hf.model_type} {option}={getattr(hf, option)!r} is not supported: posenc's block cannot express "
                f"it (only {option}={accepted!r} loads); export the scheme by hand."
            )
    rotary.check_layer(layer, int(hf.num_hidden_layers))
    rotary.check_attention_layer(hf, layer)
    plan = rotary.decoder_plan(hf, layer, layer_type, **_features(hf, variant, layer))
    plan = dataclasses.replace(plan, layout=rotary.layout_tags(_gate(hf, variant), variant.norm_plus_one))
    if variant.nope is not None and NOPE_RULES[variant.nope](hf, plan.layer_type, layer):
        return dataclasses.replace(plan, scheme="nope", params={})
    theta = _layer_theta(hf, variant, layer)
    if theta == 0:
        return dataclasses.replace(plan, scheme="nope", params={})
    if theta is not None:
        plan = dataclasses.replace(plan, params={**plan.params, "rope_theta": theta})
    if variant.interleaved:
        return dataclasses.replace(plan, params={**plan.params, "layout": "interleaved"})
    return plan


def _layer_theta(hf: Any, variant: Variant, layer: int) -> float | None:
    """The layer's own RoPE theta where the config lists one per layer (0: no RoPE), else None."""
    if variant.theta_per_layer is None or not getattr(hf, variant.theta_per_layer, None):
        return None
    return float(getattr(hf, variant.theta_per_layer)[layer])


def _with_theta(hf: Any, theta: float) -> Any:
    """A copy of ``hf`` whose ``rope_parameters`` carry ``theta`` (what Granite SWA builds a layer's rotary from)."""
    copied = copy.deepcopy(hf)
    copied.rope_parameters = {**hf.rope_parameters, "rope_theta": theta}
    return copied


RULES: tuple[Rule, ...] = (*rotary.PROJECTION_RULES_BUT_QUERY, *rotary.FEATURE_RULES)


class InterleavedCosSinReference(rotary.RotaryReference):
    """A module whose model's rotary module repeats cos/sin pairwise (Cohere): float64 angles are handed over the
    same way."""

    def position_embeddings(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.exact is None:
            return super().position_embeddings(hidden, position_ids)
        cos, sin = self.exact.cos_sin(position_ids)
        return cos.repeat_interleave(2, -1).to(self.dtype), sin.repeat_interleave(2, -1).to(self.dtype)


class HalfCosSinReference(rotary.RotaryReference):
    """A module whose model's rotary module returns cos/sin once per frequency, ``[B, S, r / 2]`` (gpt-oss rotates
    the halves itself): float64 angles are handed over the same way."""

    def position_embeddings(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.exact is None:
            return super().position_embeddings(hidden, position_ids)
        cos, sin = self.exact.cos_sin(position_ids)
        return cos.to(self.dtype), sin.to(self.dtype)


class PositionIdsReference(rotary.RotaryReference):
    """A module that also takes ``position_ids`` (Ministral 3 scales its query by position)."""

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        embeddings = self.position_embeddings(hidden, position_ids)
        return self.attention(
            hidden, position_embeddings=embeddings, attention_mask=mask, position_ids=position_ids,
            past_key_values=cache,
        )[0]  # fmt: skip


class UnrotatedReference(rotary.RotaryReference):
    """A layer its model hands no cos/sin (Granite SWA's layers of theta 0: ``position_embeddings=None``)."""

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        return self.attention(hidden, position_embeddings=None, attention_mask=mask, past_key_values=cache)[0]


def reference(
    hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
) -> rotary.RotaryReference:
    variant = VARIANTS[hf.model_type]
    cls: type[rotary.RotaryReference] = rotary.RotaryReference
    if variant.cos_sin_interleaved:
        cls = InterleavedCosSinReference
    elif variant.cos_sin_half:
        cls = HalfCosSinReference
    elif variant.query_scaling:
        cls = PositionIdsReference
    arguments = {"num_heads": plan.attention.num_heads} if variant.heads_per_layer else {}
    theta = _layer_theta(hf, variant, plan.layer)
    if theta == 0:
        cls = UnrotatedReference
    config = _with_theta(hf, theta) if theta else hf
    renamed = dict(variant.module_names)
    tensors = {renamed.get(name, name): tensor for name, tensor in tensors.items()}
    return cls.build(config, plan, tensors, variant.module, variant.prefix, angles, dtype, None, **arguments)


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
