"""The embedding step of a first layer whose positions enter at the embeddings (learned position tables).

:func:`_embedding_step` finds, from the capture's recorded calls, the module that adds the position embeddings before
layer 0 and the layer's pre-attention norms, and checks them on the capture (:class:`EmbeddingStep`).
Used by :mod:`posenc.trace.capture`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from posenc.errors import ExportError
from posenc.trace.arguments import call_args, classify, keep, rebuild, same_tensor
from posenc.trace.calls import _NAMED, Call
from posenc.trace.model import class_path
from posenc.trace.orders import BATCH_MAJOR, from_model
from posenc.trace.record import CallRecipe, EmbeddingRecord, ModuleRef


@dataclasses.dataclass
class EmbeddingStep:
    """The embedding step a first layer's unit starts with (:class:`~posenc.trace.record.EmbeddingRecord`): the
    position module and the layer's pre-attention norms, loaded with the checkpoint's tensors."""

    record: EmbeddingRecord
    position: nn.Module
    norms: list[nn.Module]


def _embedding_step(
    calls: Mapping[str, Call],
    model: nn.Module,
    layer_path: str,
    attention_input: torch.Tensor,
    positions: torch.Tensor,
    cache_class: type,
    order: str = BATCH_MAJOR,
) -> tuple[EmbeddingStep | None, str]:
    """The embedding step before the first layer's attention, when the model adds a position embedding to the token
    embeddings: ``(step, "")``; else ``(None, why)``.

    Found from the recorded calls and checked on them: a module outside the layers called with the position ids
    returns ``P [B, S, E]``; the layer's input ``X`` is ``T + P`` for the output ``T`` of another module (the token
    embeddings), or it is the output of an embeddings module that takes ``inputs_embeds`` (BERT-like encoders: it adds
    token types and normalises), which, called with ``inputs_embeds=T`` and the position ids, gives ``X`` again; the
    layer's norms called before the attention turn ``X`` into the attention's input. ``attention_input`` is
    ``[B, S, E]``; the layer's input is taken from the model's axis ``order`` (:mod:`posenc.trace.orders`), where
    the layer must not normalise it before its attention (the unit's norms run on ``[B, S, E]``).
    """
    layer_call = calls.get(layer_path)
    if layer_call is None:
        return None, "the first layer's call was not recorded"
    x = layer_call.args[0] if layer_call.args else layer_call.kwargs.get("hidden_states")
    if not torch.is_tensor(x):
        return None, "the first layer's input is not a hidden-state tensor"
    x = from_model(x, order) if x.dim() == 3 else x
    outside = layer_path.rsplit(".", 1)[0] + "."
    found = [
        name
        for name, call in calls.items()
        if not name.startswith(outside)
        and torch.is_tensor(call.output)
        and call.output.is_floating_point()
        and call.output.shape[-2:] == x.shape[-2:]
        and any(same_tensor(a, positions) for a in [*call.args, *call.kwargs.values()])
    ]
    if not found:
        return None, "no module embeds the position ids before the first layer (its positions do not enter at them)"
    called = [n for n in calls if n.startswith(layer_path + ".") and n.count(".") == layer_path.count(".") + 1]
    norms = [n for n in called if "Norm" in type(model.get_submodule(n)).__name__]
    if norms and order != BATCH_MAJOR:
        return None, f"the first layer normalises its {order} input before its attention"
    y = x
    with torch.no_grad():
        for name in norms:
            y = model.get_submodule(name)(y)
    if not torch.allclose(y, attention_input, atol=1e-6):
        return None, "the attention's input is not the layer's input through its norms"
    norm_refs = tuple(ModuleRef(n, class_path(model.get_submodule(n))) for n in norms)
    norm_modules = [model.get_submodule(n) for n in norms]
    for name in found:
        position_out = calls[name].output
        token = x - position_out
        tokens = [n for n, call in calls.items() if n != name and torch.is_tensor(call.output)
                  and call.output.shape == x.shape and torch.allclose(call.output, token, atol=1e-6)]  # fmt: skip
        if tokens:
            try:
                recipe = _embedding_recipe(calls[name], positions, cache_class, model.get_submodule(name))
            except ExportError as exc:
                return None, f"{name} is called with an argument posenc cannot rebuild ({exc})"
            record = EmbeddingRecord(
                position=ModuleRef(name, class_path(model.get_submodule(name))),
                call=recipe,
                norms=norm_refs,
            )
            return EmbeddingStep(record, model.get_submodule(name), norm_modules), ""
    step = _embeddings_module(calls, model, outside, x, positions, found, cache_class)
    if step is None:
        return None, f"the first layer's input is not the token embeddings plus {found[0]}'s position embeddings"
    record, module = step
    return EmbeddingStep(dataclasses.replace(record, norms=norm_refs), module, norm_modules), ""


def _embeddings_module(
    calls: Mapping[str, Call], model: nn.Module, outside: str, x: torch.Tensor, positions: torch.Tensor,
    found: list[str], cache_class: type,
) -> tuple[EmbeddingRecord, nn.Module] | None:  # fmt: skip
    """The embeddings module that turns the token embeddings and the positions into the first layer's input ``x``
    (it takes ``inputs_embeds`` and the position ids, and holds a module of ``found``), checked on the capture:
    ``(record, module)`` with its token table replaced by nothing (the unit starts at the token embeddings), or None.
    A module that takes no position ids counts them from the sequence length (LXMERT's): it would ignore the unit's
    ``position_ids``, so it is no step (its positions enter outside the unit, as the manifest then says)."""
    for name, call in calls.items():
        if name.startswith(outside) or not torch.is_tensor(call.output) or call.output.shape != x.shape:
            continue
        module = model.get_submodule(name)
        accepts = inspect.signature(module.forward).parameters
        holds = any(f == name or f.startswith(name + ".") for f in found)
        if "inputs_embeds" not in accepts or not holds or not torch.allclose(call.output, x, atol=1e-6):
            continue
        if "position_ids" not in accepts:  # it counts positions from the length (LXMERT's): the unit's are not read
            continue
        ids = call.kwargs.get("input_ids", call.args[0] if call.args else None)
        if not torch.is_tensor(ids) or ids.is_floating_point():
            continue
        table = next((n for n, c in calls.items() if n.startswith(name + ".") and c.args
                      and same_tensor(c.args[0], ids) and torch.is_tensor(c.output)), None)  # fmt: skip
        if table is None:
            continue
        recipe = _inputs_embeds_recipe(call, module, ids, positions, cache_class)
        if recipe is None:
            continue
        args, kwargs = _step_args(recipe, calls[table].output, positions)
        with torch.no_grad():
            again = module(*args, **kwargs)
        if torch.is_tensor(again) and again.shape == x.shape and torch.allclose(again, x, atol=1e-6):
            tokens = ModuleRef(table[len(name) + 1 :], class_path(model.get_submodule(table)))
            return EmbeddingRecord(ModuleRef(name, class_path(module)), recipe, tokens=tokens), module
    return None


def _inputs_embeds_recipe(
    call: Call, module: nn.Module, ids: torch.Tensor, positions: torch.Tensor, cache_class: type
) -> CallRecipe | None:
    """The embeddings module's call, every argument by name, with ``inputs_embeds`` (the unit's ``hidden``) in place
    of the token ids and the position ids passed where it takes them; None where its arguments cannot be named."""
    signature = inspect.signature(module.forward)
    try:
        bound = signature.bind_partial(*call.args, **call.kwargs).arguments
    except TypeError:
        return None
    if any(signature.parameters[name].kind not in _NAMED for name in bound):
        return None
    keywords: dict[str, str] = {}
    constants: dict[str, Any] = {}
    for key, value in bound.items():
        if value is ids or key == "input_ids":
            kind, value = "constant", None
        elif key == "inputs_embeds":
            kind = "hidden"
        else:
            kind = classify(key, value, positions, None, cache_class, False)
        keep(constants, key, kind, value)
        keywords[key] = kind
    keywords["inputs_embeds"] = "hidden"
    if "position_ids" in signature.parameters:
        keywords["position_ids"] = "position_ids"
        constants.pop("position_ids", None)
    return CallRecipe((), keywords, constants)


def _step_args(recipe: CallRecipe, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[list[Any], dict[str, Any]]:
    """The arguments of an embedding step's call (:data:`~posenc.trace.arguments.PLAIN_KINDS`)."""
    return call_args(recipe, lambda key, kind: rebuild(key, kind, recipe.constants, hidden, positions, 0))


def token_width(calls: Mapping[str, Call], step: EmbeddingStep, width: int) -> int:
    """The width of the token embeddings an embeddings-module step takes as ``inputs_embeds`` (its token table's
    output on the capture: MobileBERT's ``embedding_size`` 128, before its embeddings widen them to 512); ``width``
    for any other step."""
    if step.record.tokens is None:
        return width
    table = calls.get(f"{step.record.position.path}.{step.record.tokens.path}")
    out = table.output if table is not None else None
    return int(out.shape[-1]) if torch.is_tensor(out) and out.dim() == 3 else width


def drop_token_table(embeddings: nn.Module, record: EmbeddingRecord) -> None:
    """Replace an embeddings module's token table (``record.tokens``) with nothing: the unit starts at the token
    embeddings, so the table is neither read nor exported."""
    if record.tokens is None:
        return
    parent, _, child = record.tokens.path.rpartition(".")
    setattr(embeddings.get_submodule(parent) if parent else embeddings, child, nn.Identity())


def _embedding_recipe(call: Call, positions: torch.Tensor, cache_class: type, module: nn.Module) -> CallRecipe:
    """How the model calls its position module; token ids it reads only for their shape (Whisper's decoder passes
    them beside the position ids) are rebuilt as zeros, checked on the capture call (:func:`_shape_only`)."""
    positional: list[str] = []
    keywords: dict[str, str] = {}
    constants: dict[str, Any] = {}
    for key, value in [(f"#{i}", v) for i, v in enumerate(call.args)] + list(call.kwargs.items()):
        try:
            kind = classify(key, value, positions, None, cache_class, False)
        except ExportError:
            if not _shape_only(module, call, key):
                raise
            kind = "zeros"
        keep(constants, key, kind, value)
        (positional.append(kind) if key.startswith("#") else keywords.__setitem__(key, kind))
    return CallRecipe(tuple(positional), keywords, constants)


def _shape_only(module: nn.Module, call: Call, key: str) -> bool:
    """Whether ``module``'s output on the recorded call stays the same with integer ids ``[B, S]`` at ``key`` set to
    zeros (the module reads only their shape)."""
    index = int(key[1:]) if key.startswith("#") else None
    value = call.args[index] if index is not None else call.kwargs[key]
    if not torch.is_tensor(value) or value.is_floating_point() or value.dim() != 2 or not torch.is_tensor(call.output):
        return False
    args = list(call.args)
    kwargs = dict(call.kwargs)
    if index is not None:
        args[index] = torch.zeros_like(value)
    else:
        kwargs[key] = torch.zeros_like(value)
    with torch.no_grad():
        again = module(*args, **kwargs)
    return torch.is_tensor(again) and again.shape == call.output.shape and torch.equal(again, call.output)


__all__ = ["EmbeddingStep", "drop_token_table", "token_width"]
