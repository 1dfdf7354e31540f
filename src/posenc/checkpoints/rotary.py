"""Shared by the rotary decoder families: a layer's plan from its config, and the reference that calls
``XxxAttention(hidden, position_embeddings=(cos, sin), attention_mask, past_key_values)``."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from posenc.checkpoints.family import LayerPlan, Rule, Transform, rename, same
from posenc.checkpoints.reference import HFModule, ModuleReference, hf_class, load_module
from posenc.config import from_hf_config
from posenc.errors import ConfigError
from posenc.schemes import build_scheme, get_spec
from posenc.schemes.base import TableMode


def check_layer(layer: int, count: int, what: str = "layers") -> int:
    """``layer`` if ``0 <= layer < count``, else a ConfigError naming the valid range."""
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < count:
        raise ConfigError(f"layer {layer!r} is out of range: the checkpoint has {count} {what} (0 .. {count - 1}).")
    return layer


def layer_kind(hf: Any, layer: int, layer_type: str | None) -> str | None:
    """The ``layer_types[layer]`` entry of configs that have one; a contradicting ``layer_type`` raises."""
    kinds = getattr(hf, "layer_types", None)
    kind = kinds[layer] if kinds else None
    if layer_type is not None and layer_type != kind:
        valid = sorted(set(kinds)) if kinds else []
        raise ConfigError(
            f"layer {layer} is a {kind or 'plain'} layer, not {layer_type!r}"
            + (f"; this model's layer types are {valid}." if valid else "; this model has one layer type.")
        )
    return kind


def sliding_window_of(hf: Any, kind: str | None) -> int | None:
    """The attention window of a layer: ``sliding_window`` for sliding layers (or every layer of models that
    have no layer types but a window, such as Mistral); ``None`` for full attention."""
    window = getattr(hf, "sliding_window", None)
    if not window:
        return None
    if kind is None:
        return int(window)
    return int(window) if kind == "sliding_attention" else None


def decoder_plan(hf: Any, layer: int, layer_type: str | None, **features: Any) -> LayerPlan:
    """The plan of one rotary decoder layer: geometry from ``hf``, the RoPE scheme and parameters as
    :func:`posenc.config.from_hf_config` imports them (per layer type where the model has several), and the
    block features given (only non-default ones are passed on, e.g. ``qkv_bias=True``)."""
    check_layer(layer, int(hf.num_hidden_layers))
    kind = layer_kind(hf, layer, layer_type)
    # the transformers config object's fields, not config.json's: its class fills what the file leaves out
    # (rope_theta, the rope_parameters transformers 5 standardizes from legacy keys), as the model it builds has them
    data = hf.to_dict()
    rope = data.get("rope_parameters") or {}
    nested = any(isinstance(value, Mapping) for value in rope.values())
    imported = from_hf_config(data, kind if nested else None)
    window = sliding_window_of(hf, kind)
    given = {k: v for k, v in features.items() if not (v is None or v is False or v == "none")}
    if window is not None:
        given["sliding_window"] = window
    return LayerPlan(
        config=dataclasses.replace(imported.config, causal=True, **given),
        scheme=imported.scheme,
        params=dict(imported.params),
        layer=layer,
        layer_type=kind,
        decoder=True,
    )


PROJECTION_RULES: tuple[Rule, ...] = (
    *rename(("q_proj.weight", "q_proj.weight"), ("k_proj.weight", "k_proj.weight"), ("v_proj.weight", "v_proj.weight")),
    *rename(("o_proj.weight", "o_proj.weight")),
    *rename(
        ("q_proj.bias", "q_proj.bias"),
        ("k_proj.bias", "k_proj.bias"),
        ("v_proj.bias", "v_proj.bias"),
        when=lambda plan: plan.attention.qkv_bias,
    ),
    *rename(("o_proj.bias", "o_proj.bias"), when=lambda plan: plan.attention.out_bias),
)
"""Separate ``q_proj``/``k_proj``/``v_proj``/``o_proj`` modules (and their biases), named as in the block."""


NOT_ATTENTION: Mapping[str, str] = {
    "linear_attention": "a linear-attention (Gated DeltaNet) layer",
    "conv": "a short-convolution layer",
}
"""``layer_types`` entries of layers that are not softmax attention (Qwen3-Next's and Qwen3.5's Gated DeltaNet,
LFM's convolution blocks), and what they are."""


def check_attention_layer(hf: Any, layer: int) -> None:
    """Raise for a layer that is not softmax attention (:data:`NOT_ATTENTION`), naming the layers posenc loads."""
    kinds = list(getattr(hf, "layer_types", None) or [])
    if layer < len(kinds) and kinds[layer] in NOT_ATTENTION:
        attention = [i for i, kind in enumerate(kinds) if kind not in NOT_ATTENTION]
        raise ConfigError(
            f"layer {layer} of this {hf.model_type} checkpoint is {NOT_ATTENTION[kinds[layer]]}, not softmax "
            f"attention; posenc loads its attention layers: pass --layer with one of {attention[:8]}."
        )


GATES = ("q_proj", "gate_proj", "g_proj")
"""Where an output gate's weights are: in ``q_proj`` (each head's query rows, then its gate rows: Qwen3-Next,
Qwen3.5), or in a module of that name (AFMoE ``gate_proj``, Laguna ``g_proj``)."""
PLUS_ONE = "norm:1+w"
"""Layout tag: the q/k norm weights are stored zero-centred (the module multiplies by ``1 + w``)."""


def layout_tags(gate: str | None, norm_plus_one: bool) -> tuple[str, ...]:
    """:attr:`LayerPlan.layout` of a layer whose gate weights are in ``gate`` (one of :data:`GATES`, or None) and
    whose q/k norms are zero-centred or not; read by :data:`FEATURE_RULES`."""
    if gate is not None and gate not in GATES:
        raise ValueError(f"gate {gate!r} is not one of {GATES}")
    return (*((f"gate:{gate}",) if gate else ()), *((PLUS_ONE,) if norm_plus_one else ()))


def split_packed_gate(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """A ``q_proj`` holding the gate, rows ``[H, 2, D, ...]`` (each head's query, then its gate: the module views the
    output as ``[..., H, 2·D]`` and chunks it) -> the query ``[H·D, ...]`` and the gate ``[H·D, ...]``."""
    config = plan.attention
    packed = tensors[0]
    rest = tuple(packed.shape[1:])
    heads = packed.reshape(config.num_heads, 2, config.head_dim, *rest)
    width = config.num_heads * config.head_dim
    return heads[:, 0].reshape(width, *rest), heads[:, 1].reshape(width, *rest)


def zero_bias(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """A zero bias for the rows of a weight (the block's gate has a bias with ``qkv_bias``; AFMoE's and Laguna's
    gate modules have none)."""
    return [torch.zeros(tensors[0].shape[0], dtype=tensors[0].dtype)]


def _packed(plan: LayerPlan) -> bool:
    return "gate:q_proj" in plan.layout


def _normed(plus_one: bool) -> Callable[[LayerPlan], bool]:
    return lambda plan: plan.attention.qk_norm != "none" and (PLUS_ONE in plan.layout) == plus_one


def _gate_in(name: str, bias: bool = False) -> Callable[[LayerPlan], bool]:
    return lambda plan: f"gate:{name}" in plan.layout and (plan.attention.qkv_bias or not bias)


def norm_rules(transform: Transform = same) -> tuple[Rule, ...]:
    """Per-head q/k RMSNorm weights (``q_norm``/``k_norm``), through ``transform`` (e.g. Gemma's ``1 + w``)."""
    return tuple(
        Rule((target,), (target,), transform, when=lambda plan: plan.attention.qk_norm != "none")
        for target in ("q_norm.weight", "k_norm.weight")
    )


def plus_one(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """A zero-centred norm weight ``w`` (Gemma, Qwen3-Next: the module multiplies by ``1 + w``) -> the ``1 + w`` the
    block multiplies by (rounded in the stored dtype's float32)."""
    return [1.0 + t.float() for t in tensors]


def float64_scheme(plan: LayerPlan) -> Any:
    """posenc's scheme of ``plan`` with float64 angles (dynamic tables where the scheme has them)."""
    modes = get_spec(plan.scheme).table_modes
    mode = TableMode.DYNAMIC if TableMode.DYNAMIC in modes else TableMode.PRECOMPUTED
    return build_scheme(plan.scheme, plan.attention, plan.params, mode, table_dtype=torch.float64)


class RotaryReference(ModuleReference):
    """A Llama-convention attention module with its model's rotary module (or float64 angles).

    Shapes: cos/sin handed to the module are ``[B, S, r]`` (``cat(freqs, freqs)``, half layout), in its dtype.
    """

    cache_argument = "past_key_values"
    """The keyword of the module's cache argument (GPT-NeoX, Falcon: ``layer_past``)."""

    def __init__(self, attention: HFModule, rotary: HFModule, plan: LayerPlan, angles: str, dtype: torch.dtype) -> None:
        super().__init__(attention, plan, angles, dtype)
        self.rotary = rotary
        self.exact = float64_scheme(plan) if angles == "float64" and plan.scheme != "nope" else None
        """posenc's float64 scheme; None for the model's own angles, and for a NoPE layer (its module is handed the
        model's cos/sin and does not use them)."""
        self._pass_layer_type = "layer_type" in inspect.signature(rotary.forward).parameters

    @classmethod
    def build(
        cls,
        hf: Any,
        plan: LayerPlan,
        tensors: Mapping[str, torch.Tensor],
        module: str,
        prefix: str,
        angles: str = "native",
        dtype: torch.dtype = torch.float32,
        attention_prefix: str | None = None,
        **arguments: Any,
    ) -> RotaryReference:
        """``models.<module>.modeling_<module>.<prefix>Attention`` loaded with the layer's ``tensors`` (built with
        ``arguments`` besides the config and layer, e.g. Laguna's ``num_heads``; ``attention_prefix``: the attention
        class's prefix where it differs from the rotary module's), with ``<prefix>RotaryEmbedding``."""
        path = f"models.{module}.modeling_{module}."
        attention_class = hf_class(f"{path}{attention_prefix or prefix}Attention")
        attention = attention_class(hf, layer_idx=plan.layer, **arguments)
        load_module(attention, tensors, "", dtype)
        rotary = hf_class(f"{path}{prefix}RotaryEmbedding")(hf)
        return cls(attention, rotary, plan, angles, dtype)

    def position_embeddings(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.exact is not None:
            cos, sin = self.exact.cos_sin(position_ids)
            return torch.cat((cos, cos), dim=-1).to(self.dtype), torch.cat((sin, sin), dim=-1).to(self.dtype)
        if self._pass_layer_type:
            return tuple(self.rotary(hidden, position_ids, self.plan.layer_type))
        return tuple(self.rotary(hidden, position_ids))

    def call(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        embeddings = self.position_embeddings(hidden, position_ids)
        return self.attention(
            hidden, position_embeddings=embeddings, attention_mask=mask, **{self.cache_argument: cache}
        )[0]


ReferenceBuilder = Callable[[Any, LayerPlan, Mapping[str, torch.Tensor], str, torch.dtype], RotaryReference]
"""A family's ``reference`` (:class:`posenc.checkpoints.family.Family`)."""


def reference_by_model_type(modules: Mapping[str, tuple[str, str]]) -> ReferenceBuilder:
    """The ``reference`` of a family whose model types each name their transformers ``(module, class prefix)``:
    ``{"gemma2": ("gemma2", "Gemma2")}`` builds ``models.gemma2.modeling_gemma2.Gemma2Attention``."""

    def reference(
        hf: Any, plan: LayerPlan, tensors: Mapping[str, torch.Tensor], angles: str, dtype: torch.dtype
    ) -> RotaryReference:
        module, prefix = modules[hf.model_type]
        return RotaryReference.build(hf, plan, tensors, module, prefix, angles, dtype)

    return reference


_QUERY = (("q_proj.weight",), ("q_proj.bias",))
PROJECTION_RULES_BUT_QUERY: tuple[Rule, ...] = tuple(r for r in PROJECTION_RULES if r.targets not in _QUERY)
""":data:`PROJECTION_RULES` without ``q_proj`` (which :data:`FEATURE_RULES` reads, split when it holds a gate)."""
FEATURE_RULES: tuple[Rule, ...] = (
    Rule(("q_proj.weight",), ("q_proj.weight",), when=lambda plan: not _packed(plan)),
    Rule(("q_proj.bias",), ("q_proj.bias",), when=lambda plan: plan.attention.qkv_bias and not _packed(plan)),
    Rule(("q_proj.weight", "gate_proj.weight"), ("q_proj.weight",), split_packed_gate, when=_packed),
    Rule(("q_proj.bias", "gate_proj.bias"), ("q_proj.bias",), split_packed_gate,
         when=lambda plan: plan.attention.qkv_bias and _packed(plan)),
    *(Rule(("gate_proj.weight",), (f"{name}.weight",), when=_gate_in(name)) for name in GATES[1:]),
    *(Rule(("gate_proj.bias",), (f"{name}.weight",), zero_bias, when=_gate_in(name, bias=True)) for name in GATES[1:]),
    *rename(("sinks", "sinks"), when=lambda plan: plan.attention.attention_sinks),
    *(Rule((t,), (t,), when=_normed(False)) for t in ("q_norm.weight", "k_norm.weight")),
    *(Rule((t,), (t,), plus_one, when=_normed(True)) for t in ("q_norm.weight", "k_norm.weight")),
)  # fmt: skip
"""``q_proj`` (and the gate it may hold), the output gate's own module, attention sinks and the q/k norms (as
stored or ``1 + w``), by the plan's options and :attr:`LayerPlan.layout` (:func:`layout_tags`)."""
