"""Longformer's sliding chunks in the traced unit: lengths padded to the window, and its ONNX mode while exporting.

Longformer's self-attention (and LED's encoder's, ``LEDEncoderSelfAttention``, the same code) attends each token to
the ``w`` tokens on either side by overlapping chunks of ``2w`` tokens, so it runs only on lengths its model padded
to a multiple of ``attention_window = 2w`` (``LongformerModel._pad_to_window_size``): the padding's tokens are
hidden by the model's own ``[B, S]`` mask (0: local attention, the dtype's minimum: padding) and flagged in
``is_index_masked``. Without global tokens (``is_global_attn`` False, the call the capture records) that is the
whole call. The unit does what the model does: it pads the attention's input to a multiple of the window (by more
than one window: :func:`padded_length`), marks the padding in every all-zero ``*mask*`` argument of its call
(:func:`mark_padding`), and returns the rows of the real tokens. Padded keys get probability 0, so the real rows
are the model's at any length.

While exporting, the module runs in its config's ``onnx_export`` mode (:func:`onnx_mode`): its chunks come from
``unfold`` instead of ``as_strided``. Both give the same chunks in PyTorch, but torch.onnx's translation of that
``as_strided`` (overlapping strides over a reshaped view) gives other values (0.48 off at 16 tokens, torch 2.13,
onnxscript 0.7.2, ONNX Runtime 1.32); with ``unfold`` the graph matches the module as its model runs it (the eager
reference keeps the model's own mode). Longformer: "Longformer: The Long-Document Transformer" (Beltagy, Peters and
Cohan, 2020, https://arxiv.org/abs/2004.05150).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from posenc.functional import is_tracing

WINDOW_ATTRIBUTE = "one_sided_attn_window_size"
"""The attribute of Longformer's (and LED's encoder's) self-attention holding ``w``: the window is ``2w``."""


def chunk_window(attention: nn.Module) -> int | None:
    """The length a module of sliding chunks needs its input padded to a multiple of (``2w``), or None."""
    for module in attention.modules():
        one_sided = getattr(module, WINDOW_ATTRIBUTE, None)
        if isinstance(one_sided, int) and one_sided > 0:
            return 2 * one_sided
    return None


def padded_length(length: int, window: int) -> int:
    """``length`` padded to a multiple of ``window`` with more than one window of padding (the model's
    ``_pad_to_window_size`` pads to the next multiple, none at a multiple). One graph serves every length only where
    its export traced no edge case: torch.export drops a concatenation of zero rows, and over a single pair of
    chunks it fixes the chunk slices' sizes. Padded keys are masked, so the real rows are the model's either way."""
    return length + 2 * window - length % window


def pad_rows(hidden: torch.Tensor, length: int, axis: int = 1) -> torch.Tensor:
    """``hidden`` with zero rows appended along ``axis`` up to ``length`` (their keys are masked: any value)."""
    extra = length - hidden.shape[axis]
    shape = list(hidden.shape)
    shape[axis] = extra
    return torch.cat([hidden, hidden.new_zeros(shape)], dim=axis)


def mark_padding(kwargs: dict[str, Any], kinds: dict[str, str], length: int) -> None:
    """Mark positions ``length ..`` as padding in every all-zero ``*mask*`` keyword of ``kinds`` (``zeros``, or
    ``padding``: an additive ``[B, S]`` mask over the tokens, rebuilt as zeros over the padded length):
    a boolean flag (``is_index_masked``) True, an additive mask its dtype's minimum, as the model's
    ``attention_mask`` after ``_pad_to_window_size`` and ``get_extended_attention_mask``."""
    for key, kind in kinds.items():
        value = kwargs.get(key)
        if kind not in ("zeros", "padding") or "mask" not in key or not torch.is_tensor(value) or value.dim() != 2:
            continue
        padding = (torch.arange(value.shape[1], device=value.device) >= length).expand(value.shape)
        if value.dtype == torch.bool:  # an OR: ONNX Runtime's Where takes no booleans
            kwargs[key] = value | padding
        else:
            kwargs[key] = value.masked_fill(padding, torch.finfo(value.dtype).min)


@contextlib.contextmanager
def onnx_mode(attention: nn.Module) -> Iterator[None]:
    """While tracing, the ``onnx_export`` mode of every config a module of sliding chunks reads (restored after);
    eager calls keep the model's own mode."""
    configs: list[Any] = [
        m.config for m in attention.modules() if hasattr(m, WINDOW_ATTRIBUTE) and hasattr(m, "config")
    ]
    if not is_tracing() or not configs:
        yield
        return
    before = [getattr(c, "onnx_export", False) for c in configs]
    for config in configs:
        config.onnx_export = True
    try:
        yield
    finally:
        for config, value in zip(configs, before, strict=True):
            config.onnx_export = value


__all__ = ["WINDOW_ATTRIBUTE", "chunk_window", "mark_padding", "onnx_mode", "pad_rows", "padded_length"]
