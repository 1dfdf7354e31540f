"""A module's tensors from a checkpoint that transformers stores converted: fused, split, renamed or transposed.

transformers converts some checkpoints' tensors while it loads them (``from_pretrained``: its weight conversion
mapping) and reverts the conversion when it saves (``save_pretrained``: ``revert_weight_conversion``), so a module's
parameters can sit on disk under other names and in other shapes: GTE's, Molmo 2's or NomicBERT's ``q_proj``,
``k_proj`` and ``v_proj`` as one fused ``qkv`` matrix, GPT-OSS-like ``sinks`` renamed. Such conversions move
elements and never compute with them (concatenate, chunk, split, transpose, permute, rename), so posenc reads a
module's tensors through the revert itself, run on *index tensors*: each parameter filled with the positions
``offset .. offset + numel`` of one flat buffer. What the revert returns says, for every tensor name on disk, which
element of which parameter each of its elements is; the disk tensors are then read (one at a time, as any other
tensor) and scattered back. Every element must be covered exactly once, or the conversion is refused (it is not a
rearrangement). Nothing is guessed: the mapping is transformers' own, for the model's class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from posenc.checkpoints.source import CheckpointSource, tensor_sha256
from posenc.errors import ConfigError


def saved_layout(model: Any, marks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``revert_weight_conversion`` of ``model`` applied to ``marks`` (in-memory name -> tensor): the names and
    tensors ``save_pretrained`` would write for them.

    Raises:
        ConfigError: the revert cannot run on these tensors alone.
    """
    from transformers.core_model_loading import revert_weight_conversion

    try:
        return dict(revert_weight_conversion(model, dict(marks)))
    except Exception as exc:  # a conversion that needs tensors outside the module
        raise ConfigError(
            f"transformers' weight conversion of {type(model).__name__} cannot be reverted on the module's tensors "
            f"alone ({type(exc).__name__}: {str(exc)[:200]})."
        ) from None


def load_converted(
    source: CheckpointSource,
    model: Any,
    module: nn.Module,
    prefix: str,
    locate: Callable[[str], str | None],
) -> dict[str, str] | None:
    """Load ``module``'s parameters from ``source`` where the checkpoint stores them converted (see the module
    docstring); returns full tensor name -> sha256 of the disk tensors read, or None where transformers converts
    none of them (nothing was loaded).

    Args:
        source: the checkpoint.
        model: the transformers model whose conversion mapping applies (the module's model, or its wrapper).
        module: the module to load (its state dict's floating parameters are filled).
        prefix: the module's name in ``model`` with a trailing dot (``layers.0.self_attn.``).
        locate: a name ``save_pretrained`` writes (relative to ``model``) -> the checkpoint's name for it, or None
            when the checkpoint lacks it.

    Raises:
        ConfigError: the checkpoint lacks a converted tensor, a tensor has another shape than the revert gives, or
            the conversion is not a rearrangement of elements.
    """
    expected = module.state_dict()
    params = [name for name, _ in module.named_parameters()]
    marks: dict[str, torch.Tensor] = {}
    spans: dict[str, tuple[int, int]] = {}
    total = 0
    for key in params:
        count = expected[key].numel()
        marks[prefix + key] = torch.arange(total, total + count, dtype=torch.int64).reshape(expected[key].shape)
        spans[key] = (total, count)
        total += count
    saved = saved_layout(model, marks)
    if set(saved) == set(marks) and all(torch.equal(saved[name], mark) for name, mark in marks.items()):
        return None
    values = torch.zeros(total, dtype=torch.float64)
    seen = torch.zeros(total, dtype=torch.int64)
    tensors: dict[str, str] = {}
    for name, index in saved.items():
        full = locate(name)
        if full is None:
            raise ConfigError(
                f"checkpoint {source.location} lacks {name!r}, where transformers stores {type(module).__name__}'s "
                f"weights for this model (its weight conversion)."
            )
        tensor = source.tensor(full)
        if tuple(tensor.shape) != tuple(index.shape) or index.dtype != torch.int64:
            raise ConfigError(
                f"tensor {full!r} in {source.location} has shape {list(tensor.shape)}, but transformers' weight "
                f"conversion of {type(model).__name__} writes {list(index.shape)} there; the weights do not belong "
                f"to this config."
            )
        flat = index.reshape(-1)
        values[flat] = tensor.reshape(-1).to(torch.float64)
        seen.index_add_(0, flat, torch.ones_like(flat))
        tensors[full] = tensor_sha256(tensor)
    if not bool((seen == 1).all()):
        raise ConfigError(
            f"transformers' weight conversion of {type(model).__name__} does not store each element of "
            f"{type(module).__name__}'s parameters once; posenc reads only conversions that rearrange elements."
        )
    state = {key: values[start : start + count].reshape(expected[key].shape).to(expected[key].dtype)
             for key, (start, count) in spans.items()}  # fmt: skip
    module.load_state_dict({**expected, **state})
    return tensors


__all__ = ["load_converted", "saved_layout"]
