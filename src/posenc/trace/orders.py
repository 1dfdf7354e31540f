"""The axis order in which a model hands its attention the hidden states, and the transposes the unit adds around it.

The traced unit's interface is a family export's: ``hidden [B, S, E]`` -> ``out [B, S, E]`` (batch-major). Some models
call their attention in another order:

- ``channels-first`` ``[B, E, S]``: SqueezeBERT, whose projections are grouped 1-D convolutions over the sequence
  ("SqueezeBERT: What can computer vision teach NLP about efficient neural networks?", Iandola et al., 2020,
  https://arxiv.org/abs/2006.11316);
- ``time-major`` ``[S, B, E]``: XLNet (Transformer-XL's convention) and FSMT (fairseq's).

The unit then permutes ``hidden`` into the model's order before the module and the module's output back
(:func:`to_model`, :func:`from_model`: each order is its own inverse, one ``Transpose`` in the graph each way); the
record says which (``TraceRecord.order``) and the manifest's parts name it (:func:`order_parts`). Anything that reads
the unit's ``hidden`` besides the attention (the embedding step, code that derives a stack tensor from the length)
sees the batch-major states.
"""

from __future__ import annotations

from typing import Any

import torch

from posenc.trace.record import TracePart

ORDERS: dict[str, tuple[int, int, int]] = {
    "batch-major": (0, 1, 2),  # [B, S, E]: the unit's own
    "channels-first": (0, 2, 1),  # [B, E, S]
    "time-major": (1, 0, 2),  # [S, B, E]
}
"""Axis order name -> the permutation from ``[B, S, E]`` to it (each its own inverse)."""
BATCH_MAJOR = "batch-major"
ORDER_PART = "hidden-state layout"
"""The manifest part naming the transposes around a module that takes another order than ``[B, S, E]``."""
SHAPES = {"channels-first": "[B, E, S]", "time-major": "[S, B, E]"}


def order_of(hidden: Any, positions: torch.Tensor, width: Any) -> str:
    """The order of the hidden states ``hidden`` an attention was called with, for ``positions [B, S]`` and the
    config's ``width`` (hidden size): ``channels-first`` where its middle axis is the width and its last is not,
    ``time-major`` where it is ``[S, B, ...]`` with ``S != B``; else ``batch-major``."""
    if not torch.is_tensor(hidden) or hidden.dim() != 3:
        return BATCH_MAJOR
    shape = tuple(int(n) for n in hidden.shape)
    b, s = int(positions.shape[0]), int(positions.shape[-1])
    if isinstance(width, int) and shape[1] == width and shape[2] != width:
        return "channels-first"
    if shape[:2] == (s, b) and s != b:
        return "time-major"
    return BATCH_MAJOR


def to_model(hidden: torch.Tensor, order: str) -> torch.Tensor:
    """``hidden [B, S, E]`` in the model's ``order``."""
    return hidden if order == BATCH_MAJOR else hidden.permute(*ORDERS[order])


def from_model(value: torch.Tensor, order: str) -> torch.Tensor:
    """A tensor in the model's ``order`` back as ``[B, S, E]`` (each order is its own inverse)."""
    return to_model(value, order)


def order_parts(order: str) -> tuple[TracePart, ...]:
    """The manifest's part for an attention that takes another order (none for batch-major)."""
    if order == BATCH_MAJOR:
        return ()
    detail = (
        f"the model calls its attention with hidden states {SHAPES[order]} ({order}); the unit keeps the interface "
        f"hidden [B, S, E] -> out [B, S, E] and transposes into the module's order before it and back after it"
    )
    return (TracePart(ORDER_PART, "kept", detail),)


__all__ = ["BATCH_MAJOR", "ORDERS", "ORDER_PART", "from_model", "order_of", "order_parts", "to_model"]
