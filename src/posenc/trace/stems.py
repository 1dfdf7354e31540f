"""A layer's module that splits its input into the attention's several inputs: the unit starts one step earlier.

MobileBERT's layer hands its hidden states to a ``bottleneck`` that returns four streams, and calls its attention with
them: ``attention(query, key, value, layer_input, mask)``, the query and key a shared bottleneck projection of the
layer's input, the value the layer's input itself, ``layer_input`` another projection (the attention's residual)
("MobileBERT: a Compact Task-Agnostic BERT for Resource-Limited Devices", Sun et al., 2020,
https://arxiv.org/abs/2004.02984). No one of them is the attention's "hidden states"; all are computed from the
layer's input by that module. The unit then takes the **layer's input** as ``hidden`` and calls the stem module on it,
as the layer does, before the attention: each argument that is one of the stem's outputs is rebuilt as that output
(kind ``stem``, its index kept as the recipe's constant). :func:`find_stem` finds it on the capture: a module inside
the layer, called with the layer's input alone before the attention, that returned a tuple holding the argument
posenc could not otherwise rebuild.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from posenc.trace.arguments import classify, keep
from posenc.trace.calls import Call
from posenc.trace.record import CallRecipe, ModuleRef, TracePart

STEM_PART = "layer stem"
"""The manifest part naming the module the unit calls on the layer's input before the attention."""


@dataclasses.dataclass
class Stem:
    """The layer's module that computes the attention's inputs from the layer's input (see the module docstring).

    Attributes:
        path: its path in the base model.
        module: the module.
        layer_input: the layer's input on the capture (the unit's ``hidden``, in the model's axis order).
        outputs: what it returned on the capture (a tuple of tensors).
    """

    path: str
    module: nn.Module
    layer_input: torch.Tensor
    outputs: tuple[Any, ...]

    def index_of(self, value: Any) -> int | None:
        """Which of the stem's outputs ``value`` is (identity), or None."""
        return (
            next((i for i, item in enumerate(self.outputs) if item is value), None) if torch.is_tensor(value) else None
        )


def find_stem(calls: Mapping[str, Call], model: nn.Module, layer_path: str, target: Call) -> Stem | None:
    """The module inside the layer at ``layer_path`` called with the layer's input alone that returned a tuple
    holding one of the attention's arguments besides the layer's input (:class:`Stem`), or None."""
    layer_call = calls.get(layer_path)
    if layer_call is None:
        return None
    x = layer_call.args[0] if layer_call.args else layer_call.kwargs.get("hidden_states")
    if not torch.is_tensor(x):
        return None
    passed = [v for v in (*target.args, *target.kwargs.values()) if torch.is_tensor(v) and v is not x]
    for name, call in calls.items():
        if not name.startswith(layer_path + ".") or call.kwargs or len(call.args) != 1 or call.args[0] is not x:
            continue
        out = call.output
        if isinstance(out, (tuple, list)) and any(any(v is item for item in out) for v in passed):
            return Stem(name, model.get_submodule(name), x, tuple(out))
    return None


def stem_recipe(target: Call, stem: Stem, positions: torch.Tensor, cache_class: type,
                names: list[str]) -> CallRecipe:  # fmt: skip
    """The attention's :class:`CallRecipe` behind a stem: each argument that is one of the stem's outputs is kind
    ``stem`` (its index kept), the others classified as usual (a mask, a cache, constants; no rotary module)."""
    positional: list[str] = []
    keywords: dict[str, str] = {}
    constants: dict[str, Any] = {}
    for key, value in [(f"#{i}", v) for i, v in enumerate(target.args)] + list(target.kwargs.items()):
        index = stem.index_of(value)
        if index is not None:
            kind = "stem"
            constants[key] = index
        else:
            position = int(key[1:]) if key.startswith("#") else -1
            name = names[position] if 0 <= position < len(names) else key
            kind = classify(name, value, positions, None, cache_class, False)
            keep(constants, key, kind, value)
        (positional.append(kind) if key.startswith("#") else keywords.__setitem__(key, kind))
    return CallRecipe(tuple(positional), keywords, constants)


def stem_parts(ref: ModuleRef | None) -> tuple[TracePart, ...]:
    """The manifest's part for a unit that starts at the layer's input (none without a stem)."""
    if ref is None:
        return ()
    detail = (f"the attention's inputs are computed from the layer's input by {ref.path} "
              f"({ref.cls.rsplit('.', 1)[-1]}); the unit takes the layer's input as hidden and calls it first, as "
              f"the layer does")  # fmt: skip
    return (TracePart(STEM_PART, "kept", detail),)


__all__ = ["STEM_PART", "Stem", "find_stem", "stem_parts", "stem_recipe"]
