"""Feeds: realistic inputs of an export unit's graph, for tracing, validation and benchmarks.

A :class:`Slot` is one graph input (name, kind, symbolic shape, layout); :func:`make_inputs` fills slots for a
:class:`~posenc.export.shapes.Shape` (standard-normal activations and caches, realistic int64 position ids,
multi-axis ids of an image between text), :func:`make_feed` does it for a manifest's graph. Which slots a unit
has is :mod:`posenc.export.units`'.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from posenc.artifacts.memory import attention_call_bytes, check_bytes
from posenc.blocks import MLAConfig
from posenc.config import AttentionConfig
from posenc.dtypes import NUMPY_DTYPES, dtype_name
from posenc.errors import ConfigError
from posenc.export.shapes import Shape
from posenc.trace.boxes import GRID, seeded_boxes
from posenc.trace.boxes import NAME as BOX_INPUT


@dataclasses.dataclass(frozen=True)
class Slot:
    """One graph input: ``kind`` is ``act``, ``pos_q``, ``pos_k``, ``past`` (a cache), ``length`` (filled cache
    slots per row) or ``boxes`` (a document model's boxes per token, in ``dtype``); ``shape`` names its dynamic dims
    (``batch``, ``seq``, ``past``, ``kv_seq``, :data:`SOURCE`)."""

    name: str
    kind: str
    shape: tuple[int | str, ...]
    layout: str
    dtype: str | None = None
    top: float | None = None


def box_slot(dtype: str, top: float) -> Slot:
    """The ``bbox [B, S, 4]`` input of a traced document model's unit (:mod:`posenc.trace.boxes`): ``dtype``
    coordinates in 0 .. ``top``."""
    grid = f"0 .. {int(top)}" if dtype == "int64" else f"0 .. {top:g}"
    return Slot(BOX_INPUT, "boxes", ("batch", "seq", 4), f"[B, S, 4] (x0, y0, x1, y1: {dtype}, {grid})", dtype, top)


SOURCE = "source"
"""The dimension of a second input of its own length (an encoder's states ``[B, S_enc, E]`` a decoder attends in the
same softmax as its tokens: T5Gemma 2's merged attention), beside ``batch``, ``seq``, ``past``, ``kv_seq``."""


def source_length(shape: Shape) -> int:
    """``S_enc`` of a feed at ``shape``: ``(past + seq) // 2 + 3``, a length of its own that grows with the call and
    differs from ``seq`` in most feeds (a decode step's too), so a graph that took it for another length fails."""
    return shape.kv_seq // 2 + 3


def dim_size(dim: int | str, shape: Shape) -> int:
    """The size of a slot's dimension ``dim`` (a number, or a dim name) at ``shape``."""
    if isinstance(dim, int):
        return dim
    if dim == SOURCE:
        return source_length(shape)
    return {"batch": shape.batch, "seq": shape.seq, "past": shape.past, "kv_seq": shape.kv_seq}[dim]


def positions_for(shape: Shape, kind: str, position_limit: int | None = None) -> np.ndarray:
    """Realistic int64 position ids: ``start + arange(seq)`` per row (queries), or the cache's ``arange(past)``
    followed by the queries' (keys).

    ``position_limit`` wraps positions into ``[0, limit)`` (only for tracing samples of tiny tables).
    """
    queries = shape.first + np.arange(shape.seq, dtype=np.int64)
    row = np.concatenate((np.arange(shape.past, dtype=np.int64), queries)) if kind == "pos_k" else queries
    if position_limit is not None:
        row = row % position_limit
    return np.repeat(row[None, :], shape.batch, axis=0)


MULTI_AXIS_FEEDS: tuple[str, ...] = ("vision", "text")
"""What the ``[A, B, S]`` ids of multi-axis feeds hold: a vision-like block (an image between text, or a patch
grid) or text only (every axis the token's position)."""


def multi_axis_positions(
    shape: Shape, axes: int, content: str = "vision", position_limit: int | None = None
) -> np.ndarray:
    """Realistic int64 ids ``[A, B, S]`` of the new tokens of a multi-axis scheme.

    The whole sequence (``past + seq`` tokens per row) is laid out, and its last ``seq`` tokens are the feed's:

    - ``text``: every axis holds the token's position (:func:`positions_for`), where M-RoPE is plain RoPE;
    - ``vision``, 3 axes (M-RoPE, as transformers' Qwen2-VL ``get_rope_index`` lays out a prompt): ``1 + b % 3``
      text tokens (row b), an image of ``rows x cols`` patches at ``(t, t + row, t + col)`` (rows ≈ √(n/2),
      cols = rows + 1, so height and width differ), then text resuming at ``t + max(rows, cols)``;
    - ``vision``, 2 axes (axial): patches of a grid ``ceil(√n)`` wide in raster order, ``(row, col)``.

    ``shape.start`` (if set) shifts every id by ``start - past``, so ids stay within ``[0, shape.last]``.
    ``position_limit`` wraps ids into ``[0, limit)`` (tracing samples of tiny tables only).
    """
    if content not in MULTI_AXIS_FEEDS:
        raise ConfigError(f"multi-axis feed content must be one of {list(MULTI_AXIS_FEEDS)}, got {content!r}.")
    total = shape.kv_seq
    rows = []
    for b in range(shape.batch):
        order = np.arange(total, dtype=np.int64)
        if content == "text":
            ids = np.repeat(order[None], axes, axis=0)
        elif axes == 2:
            width = math.isqrt(total - 1) + 1  # ceil(√total)
            ids = np.stack((order // width, order % width))
        else:
            ids = _prompt_with_image(total, text=min(1 + b % 3, total), axes=axes)
        rows.append(ids[:, shape.past :] + (shape.first - shape.past))
    out = np.stack(rows, axis=1)
    return out % position_limit if position_limit is not None else out


def _prompt_with_image(total: int, text: int, axes: int) -> np.ndarray:
    """``[axes, total]`` ids: ``text`` text tokens, an image block, text after it (see :func:`multi_axis_positions`)."""
    room = total - text - 1  # keep one text token after the image
    side = math.isqrt(max(room, 0) // 2)
    rows, cols = (side, side + 1) if side >= 1 and side * (side + 1) <= room else (0, 0)
    ids = [np.repeat(np.arange(text, dtype=np.int64)[None], axes, axis=0)]
    if rows:
        row, col = np.repeat(np.arange(rows), cols), np.tile(np.arange(cols), rows)
        ids.append(text + np.stack([np.zeros(rows * cols, np.int64), row, col])[:axes])
    resume = text + max(rows, cols) + np.arange(total - text - rows * cols, dtype=np.int64)
    ids.append(np.repeat(resume[None], axes, axis=0))
    return np.concatenate(ids, axis=1)


def make_inputs(
    slots: Sequence[Slot],
    shape: Shape,
    dtype: torch.dtype | str,
    *,
    seed: int = 0,
    position_limit: int | None = None,
    multi_axis: str = "vision",
) -> list[np.ndarray]:
    """Numpy inputs in slot order: standard-normal activations (and caches, every slot) in ``dtype``, realistic
    int64 positions (multi-axis ids ``[A, B, S]`` by :func:`multi_axis_positions` with ``multi_axis`` content),
    ``past`` filled slots per row of a preallocated cache."""
    rng = np.random.default_rng(seed)
    np_dtype = NUMPY_DTYPES[dtype_name(dtype)]
    arrays = []
    for slot in slots:
        if slot.kind == "pos_q" and len(slot.shape) == 3:
            arrays.append(multi_axis_positions(shape, int(slot.shape[0]), multi_axis, position_limit))
        elif slot.kind in ("pos_q", "pos_k"):
            arrays.append(positions_for(shape, slot.kind, position_limit))
        elif slot.kind == "length":
            arrays.append(np.full(shape.batch, shape.past, dtype=np.int64))
        elif slot.kind == "boxes":  # valid boxes in the model's range (posenc.trace.boxes)
            arrays.append(seeded_boxes(shape.batch, shape.seq, slot.dtype or "int64", seed, slot.top or GRID))
        else:
            sizes = tuple(dim_size(d, shape) for d in slot.shape)
            arrays.append(rng.standard_normal(sizes).astype(np.float32).astype(np_dtype))
    return arrays


def slots_from_manifest(manifest: Any) -> list[Slot]:
    """Input slots of a manifest's graph (for :func:`make_feed`)."""
    kinds = {"activation": "act", "cache": "past", "length": "length", "boxes": "boxes"}
    slots = []
    for spec in manifest.inputs:
        if spec.role == "positions":
            kind = "pos_k" if "kv_seq" in spec.shape else "pos_q"
        else:
            kind = kinds.get(spec.role, "act")
        if kind == "boxes":  # the range the model takes, from the trace record
            slots.append(box_slot(spec.dtype, manifest.trace.boxes.top))
            continue
        slots.append(Slot(spec.name, kind, tuple(spec.shape), spec.layout))
    return slots


def check_call_size(config: AttentionConfig | MLAConfig, shape: Shape) -> None:
    """Refuse a shape whose call (inputs, caches, scores, in the float64 reference) this machine cannot hold.

    An MLA block is sized as the multi-head attention it expands to (every head its own keys of width
    nope + rope), an upper bound of what its call holds.

    Raises:
        ConfigError: names the bytes (:func:`posenc.artifacts.memory.check_bytes`).
    """
    if isinstance(config, MLAConfig):
        kv_heads, head_dim = config.num_heads, config.qk_nope_head_dim + config.qk_rope_head_dim
    else:
        kv_heads, head_dim = config.num_kv_heads, config.head_dim
    needed = attention_call_bytes(
        shape.batch, shape.seq, shape.past, config.hidden_size, config.num_heads, kv_heads, head_dim
    )
    check_bytes(needed, f"a call at shape {shape.label}", "give smaller --shape sizes (B,S[,P]).")


def make_feed(manifest: Any, shape: Shape, *, seed: int = 0, multi_axis: str = "vision") -> dict[str, np.ndarray]:
    """A feed dict for an exported model: realistic position ids, random activations in the graph dtype.

    Args:
        manifest: the model's :class:`posenc.export.Manifest`.
        shape: batch, new tokens and cached tokens.
        seed: seed of the activations.
        multi_axis: ids of multi-axis schemes (``[A, B, S]``): ``vision`` (an image between text, or a patch grid)
            or ``text`` (see :func:`multi_axis_positions`).

    Returns:
        ``{input name: numpy array}`` in the manifest's input order.
    """
    check_call_size(manifest.attention_config(), shape)
    slots = slots_from_manifest(manifest)
    arrays = make_inputs(slots, shape, manifest.dtype, seed=seed, multi_axis=multi_axis)
    return {slot.name: array for slot, array in zip(slots, arrays, strict=True)}


__all__ = [
    "MULTI_AXIS_FEEDS",
    "SOURCE",
    "Slot",
    "box_slot",
    "check_call_size",
    "dim_size",
    "make_feed",
    "make_inputs",
    "multi_axis_positions",
    "positions_for",
    "slots_from_manifest",
    "source_length",
]
