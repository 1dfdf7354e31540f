"""The traced unit's weights: the checkpoint's tensors of the attention (and of an embedding step's modules), read one
by one with their sha256, under the names ``save_pretrained`` wrote.

A checkpoint stores the base model under some root (``model.``, ``transformer.``, none). transformers may also rename
tensors between disk and memory (its weight conversions: LFM3 keeps ``self_attn.g_proj`` in memory and writes
``self_attn.gate_proj``); ``save_pretrained`` reverts them
(``transformers.core_model_loading.revert_weight_conversion``), so each in-memory name is looked up as that revert
gives it, on meta tensors of the model the capture built.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

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
    source: CheckpointSource, attention: nn.Module, path: str, model: nn.Module | None = None
) -> dict[str, str]:
    """Load the checkpoint's tensors of the module at ``path`` of ``model`` (the attention, or a module of the
    embedding step; under whatever root the checkpoint stores the base model, under the names ``save_pretrained``
    writes) into it; returns full tensor name -> sha256.

    Raises:
        ConfigError: a parameter of the module is missing from the checkpoint, or has another shape.
    """
    expected = attention.state_dict()
    names = list(source.names())
    params = {name for name, _ in attention.named_parameters()}
    probe = next(iter(sorted(params)), None) or next(iter(expected), None)
    if probe is None:
        return {}
    saved = {key: saved_name(model, f"{path}.{key}") for key in expected}
    suffix = saved[probe]
    roots = sorted({name[: -len(suffix)] for name in names if name.endswith(suffix)}, key=len)
    if not roots:
        raise ConfigError(
            f"checkpoint {source.location} has no tensor ending in {suffix!r}; its weights are not laid out as "
            f"transformers' {type(attention).__name__} expects for this config."
        )
    root = roots[0]
    state: dict[str, torch.Tensor] = {}
    tensors: dict[str, str] = {}
    for key, current in expected.items():
        full = f"{root}{saved[key]}"
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


__all__ = ["load_attention_weights", "saved_name"]
