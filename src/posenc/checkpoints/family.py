"""What a model family is to posenc: how one layer of its checkpoint becomes an :class:`AttentionBlock`.

A :class:`Family` holds, in one place, everything posenc knows about a transformers ``model_type``:

- ``geometry``: ``config.json`` (as the transformers config object) -> :class:`LayerPlan` (attention geometry,
  scheme, scheme parameters) for one layer;
- ``weights``: a table of :class:`Rule` s mapping checkpoint tensors (names relative to the layer's attention
  module, or to the model root) onto the block's ``state_dict`` keys, with a transform where the layouts differ
  (fused qkv, Gemma's ``1 + w`` norms, ...);
- ``reference``: how to build and call the checkpoint's own transformers attention module for that layer
  (:mod:`posenc.checkpoints.reference`), the reference every parity claim about a real model is made against.

Adding a family = one module in :mod:`posenc.checkpoints.families` that calls :func:`register` with these three
pieces, plus a test that builds a tiny seeded checkpoint with transformers and proves the block equals it.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from posenc.checkpoints.plan import LayerPlan
from posenc.checkpoints.reference import TransformersReference
from posenc.errors import ConfigError

Transform = Callable[[Sequence[torch.Tensor], LayerPlan], Sequence[torch.Tensor]]
"""``(checkpoint tensors in rule order, plan) -> block tensors in rule order``."""


def same(tensors: Sequence[torch.Tensor], plan: LayerPlan) -> Sequence[torch.Tensor]:
    """The identity transform: the checkpoint tensors are the block's."""
    return tensors


@dataclasses.dataclass(frozen=True)
class Rule:
    """Block keys filled from checkpoint tensors.

    Attributes:
        targets: block ``state_dict`` keys produced (e.g. ``("q_proj.weight",)``).
        sources: checkpoint tensor names relative to the layer's attention module (``"q_proj.weight"``), or to
            the model root when they start with ``"/"`` (``"/encoder.block.0.layer.0.SelfAttention..."``);
            ``{layer}`` is replaced by the layer index.
        transform: maps the source tensors to the target tensors (default: identity).
        when: the rule applies only if this returns True for the plan (e.g. biases present).
    """

    targets: tuple[str, ...]
    sources: tuple[str, ...]
    transform: Transform = same
    when: Callable[[LayerPlan], bool] = lambda plan: True


def rename(*pairs: tuple[str, str], when: Callable[[LayerPlan], bool] = lambda plan: True) -> list[Rule]:
    """One identity :class:`Rule` per ``(block key, checkpoint name)`` pair."""
    return [Rule((target,), (source,), same, when) for target, source in pairs]


def rename_linear(
    *pairs: tuple[str, str], bias: bool = True, when: Callable[[LayerPlan], bool] = lambda plan: True
) -> list[Rule]:
    """:func:`rename` of the ``weight`` (and with ``bias`` the ``bias``) of each ``(block module, checkpoint module)``
    pair, e.g. ``("o_proj", "out_proj")``."""
    suffixes = ("weight", "bias") if bias else ("weight",)
    return rename(*((f"{block}.{s}", f"{source}.{s}") for block, source in pairs for s in suffixes), when=when)


@dataclasses.dataclass(frozen=True)
class Family:
    """A transformers model family (see the module docstring).

    Attributes:
        name: posenc's name of the family (``llama``).
        model_types: the ``config.json`` ``model_type`` values it reads.
        title: human name (``Llama, Mistral``) for errors and docs.
        layer_prefixes: where a layer's attention module lives, relative to the model root, with ``{layer}`` and,
            for multi-stack models, ``{stack}`` (e.g. ``("layers.{layer}.self_attn.",)``).
        roots: prefixes of the model root in the checkpoint (``"model."`` when saved from ``...ForCausalLM``,
            ``""`` when saved from the base model); the first one whose layer tensors exist is used.
        geometry: ``(hf_config, layer, layer_type) -> LayerPlan``.
        rules: the weight table.
        reference: ``(hf_config, plan, checkpoint tensors by rule name, angles, dtype) -> TransformersReference``
            (see :mod:`posenc.checkpoints.reference`).
        layer_types: the stacks/kinds a user may choose with ``layer_type`` (empty: one kind).
        layer_types_note: said when a user asks for another layer type (e.g. why cross-attention is not offered).
        declines: ``hf_config -> reason or None``: configs of the family's model types whose attention is not the
            family's scheme (DeBERTa without relative attention); ``posenc export --hf-model`` then takes the traced
            path by default, and ``--via family`` refuses with the geometry's error.
    """

    name: str
    model_types: tuple[str, ...]
    title: str
    layer_prefixes: tuple[str, ...]
    roots: tuple[str, ...]
    geometry: Callable[[Any, int, str | None], LayerPlan]
    rules: tuple[Rule, ...]
    reference: Callable[[Any, LayerPlan, Mapping[str, torch.Tensor], str, torch.dtype], TransformersReference]
    layer_types: tuple[str, ...] = ()
    layer_types_note: str = ""
    declines: Callable[[Any], str | None] | None = None

    def prefix(self, plan: LayerPlan) -> str:
        """The layer prefix (relative to the root) of ``plan``'s layer."""
        stack = plan.layer_type or ""
        templates = [p for p in self.layer_prefixes if "{stack}" not in p or stack]
        return templates[0].format(layer=plan.layer, stack=stack)


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Register ``family`` for its model types; a model type claimed twice raises."""
    for model_type in family.model_types:
        if model_type in _FAMILIES:
            raise ConfigError(f"model_type {model_type!r} is already claimed by family {_FAMILIES[model_type].name!r}.")
    for model_type in family.model_types:
        _FAMILIES[model_type] = family
    return family


def supported_model_types() -> list[str]:
    """Every ``model_type`` posenc loads checkpoints of, sorted."""
    _load_families()
    return sorted(_FAMILIES)


def all_families() -> list[Family]:
    """Registered families, in registration order, each once."""
    _load_families()
    return list(dict.fromkeys(_FAMILIES.values()))


def family_for(model_type: str) -> Family:
    """The family of a ``model_type``; unknown ones raise with the supported list."""
    _load_families()
    try:
        return _FAMILIES[model_type]
    except KeyError:
        raise ConfigError(
            f"model_type {model_type!r} is not supported for checkpoint loading; supported model types: "
            f"{', '.join(sorted(_FAMILIES))}. For other models trace the checkpoint's own attention module "
            f"(posenc export --hf-model DIR --via trace), or export a scheme by hand (posenc export --scheme ...)."
        ) from None


def _load_families() -> None:
    importlib.import_module("posenc.checkpoints.families")  # family modules register on import


__all__ = [
    "Family",
    "LayerPlan",
    "Rule",
    "all_families",
    "family_for",
    "register",
    "rename",
    "rename_linear",
    "same",
    "supported_model_types",
]
