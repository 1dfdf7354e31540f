"""The traced unit's weights: the checkpoint's tensors of the attention (and of an embedding step's modules), read one
by one with their sha256, under the names ``save_pretrained`` wrote.

A checkpoint stores the base model under some root (``model.``, ``transformer.``, none). transformers may also rename
tensors between disk and memory (its weight conversions: LFM3 keeps ``self_attn.g_proj`` in memory and writes
``self_attn.gate_proj``); ``save_pretrained`` reverts them
(``transformers.core_model_loading.revert_weight_conversion``), so each in-memory name is looked up as that revert
gives it, on meta tensors of the model the capture built.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from posenc.checkpoints.conversions import load_converted
from posenc.checkpoints.source import CheckpointSource, tensor_sha256
from posenc.errors import ConfigError


def saved_name(model: nn.Module | None, name: str) -> str:
    """The name ``save_pretrained`` of ``model`` writes for its in-memory tensor ``name`` (``name`` itself without a
    model, or where the revert cannot run on one meta tensor)."""
    if model is None:
        return name
    try:
        from transformers.core_model_loading import revert_weight_conversion

        pretrained: Any = model  # a transformers PreTrainedModel (the capture's base model)
        (full,) = revert_weight_conversion(pretrained, {name: torch.empty(0, device="meta")})
    except Exception:  # no conversion API, or a conversion that needs the other tensors of its group
        return name
    return str(full)


def load_attention_weights(
    source: CheckpointSource,
    attention: nn.Module,
    path: str,
    model: nn.Module | None = None,
    names: Callable[[str], tuple[str, ...]] | None = None,
) -> dict[str, str]:
    """Load the checkpoint's tensors of the module at ``path`` of ``model`` (the attention, or a module of the
    embedding step; under whatever root the checkpoint stores the base model, under the names ``save_pretrained``
    writes) into it; returns full tensor name -> sha256. ``names``: a wrapper's text tower's names
    (:meth:`posenc.checkpoints.towers.BaseTower.checkpoint_names`: a name relative to the tower's base model -> the
    names the checkpoint may hold it under), instead of any root.

    Raises:
        ConfigError: a parameter of the module is missing from the checkpoint, or has another shape.
    """
    expected = attention.state_dict()
    params = {name for name, _ in attention.named_parameters()}
    probe = next(iter(sorted(params)), None) or next(iter(expected), None)
    if probe is None:
        return {}
    locate = (
        _tower_names(source, attention, path, probe, names) if names else _rooted(source, attention, path, model, probe)
    )
    state: dict[str, torch.Tensor] = {}
    tensors: dict[str, str] = {}
    for key, current in expected.items():
        full = locate(key)
        if not source.has(full):
            if key in params:
                raise ConfigError(f"checkpoint {source.location} lacks {full!r}, a parameter of the traced unit.")
            continue
        tensor = source.tensor(full)
        if tuple(tensor.shape) != tuple(current.shape):
            raise ConfigError(
                f"tensor {full!r} in {source.location} has shape {list(tensor.shape)}, but this config's "
                f"{type(attention).__name__} needs {list(current.shape)}; the weights do not belong to this config."
            )
        tensors[full] = tensor_sha256(tensor)
        state[key] = tensor.to(current.dtype)
    attention.load_state_dict({**expected, **state})
    return tensors


def _rooted(
    source: CheckpointSource, attention: nn.Module, path: str, model: nn.Module | None, probe: str
) -> Callable[[str], str]:
    """Key -> full name under the shortest root the checkpoint stores the base model at, as ``save_pretrained``
    of ``model`` writes it."""
    saved = {key: saved_name(model, f"{path}.{key}") for key in attention.state_dict()}
    ties = _ties(source)
    saved = {key: name if _stored(source, name) or name not in ties else ties[name] for key, name in saved.items()}
    suffix = saved[probe]
    roots = sorted({name[: -len(suffix)] for name in source.names() if name.endswith(suffix)}, key=len)
    if not roots:
        raise ConfigError(
            f"checkpoint {source.location} has no tensor ending in {suffix!r}; its weights are not laid out as "
            f"transformers' {type(attention).__name__} expects for this config."
        )
    return lambda key: f"{roots[0]}{saved[key]}"


def _stored(source: CheckpointSource, name: str) -> bool:
    return any(full == name or full.endswith("." + name) for full in source.names())


def _ties(source: CheckpointSource) -> dict[str, str]:
    """The tensors the checkpoint's own class ties to others (``_tied_weights_keys``: tied name -> the name
    ``save_pretrained`` writes it under once): UDOP's encoder ``relative_bias.biases.0`` is its first block's
    ``relative_attention_bias``. Empty where ``architectures`` names no transformers class."""
    import transformers

    names = source.config.get("architectures") or []
    klass = getattr(transformers, str(names[0]), None) if names else None
    ties = getattr(klass, "_tied_weights_keys", None)
    return {str(k): str(v) for k, v in ties.items()} if isinstance(ties, dict) else {}


def _tower_names(
    source: CheckpointSource,
    attention: nn.Module,
    path: str,
    probe: str,
    names: Callable[[str], tuple[str, ...]],
) -> Callable[[str], str]:
    """Key -> the first of a text tower's candidate names the checkpoint holds (else the first candidate)."""

    def locate(key: str) -> str:
        candidates = names(f"{path}.{key}")
        return next((name for name in candidates if source.has(name)), candidates[0])

    if not source.has(locate(probe)):
        raise ConfigError(
            f"checkpoint {source.location} has no tensor {' or '.join(map(repr, names(f'{path}.{probe}')))}; its "
            f"text tower's weights are not laid out as transformers' {type(attention).__name__} expects for this "
            f"config."
        )
    return locate


def load_module_weights(
    source: CheckpointSource,
    module: nn.Module,
    path: str,
    names: Callable[[str], tuple[str, ...]] | None,
    owner: tuple[nn.Module, str],
) -> dict[str, str]:
    """:func:`load_attention_weights`; where the checkpoint lacks the module's tensors under those names, the
    tensors transformers' weight conversion stores them as (:mod:`posenc.checkpoints.conversions`: fused q/k/v,
    renames), reverted on ``owner`` (the model whose conversion applies, and the module's root in it)."""
    model, root = owner
    try:
        return load_attention_weights(source, module, path, None if root else model, names)
    except ConfigError as plain:
        converted = load_converted(source, model, module, f"{root}{path}.", functools.partial(_on_disk, source, root))
        if converted is None:
            raise plain from None
        return converted


def _on_disk(source: CheckpointSource, root: str, name: str) -> str | None:
    """The checkpoint's name for ``name`` as ``save_pretrained`` writes it: itself under a wrapper's full names
    (``root`` given), else under the shortest root the checkpoint stores the base model at; None if absent."""
    if root:
        return name if source.has(name) else None
    found = sorted((full for full in source.names() if full == name or full.endswith("." + name)), key=len)
    return found[0] if found else None


__all__ = ["load_attention_weights", "load_module_weights", "saved_name"]
