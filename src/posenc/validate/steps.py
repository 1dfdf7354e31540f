"""The steps of a decode sequence: their shapes (:func:`decode_schedule`, cut to what a ring cache serves:
:func:`ring_schedule`), the new tokens each step feeds (:func:`step_feeds`, with a traced layer's second streams) and
the outputs each step compares (:func:`decode_outputs`). :mod:`posenc.validate.decode` runs them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from posenc.dtypes import NUMPY_DTYPES
from posenc.errors import ConfigError
from posenc.export.feeds import Slot, dim_size, slots_from_manifest
from posenc.export.manifest import Manifest
from posenc.export.shapes import Shape
from posenc.export.units import BLOCK_INPLACE

DECODE_STEPS = 64
"""Single-token steps of the default sequence."""
PREFILL = 5
"""Tokens of the default sequence's first step."""
OUTPUTS = ("out", "present_key", "present_value")


def decode_outputs(manifest: Manifest) -> tuple[str, ...]:
    """The outputs a decode sequence compares: :data:`OUTPUTS`, then every other ``present_<name>`` of a
    concatenated-cache graph (the further caches a traced layer carries, :mod:`posenc.trace.caches`)."""
    extra = () if manifest.unit == BLOCK_INPLACE else tuple(manifest.output_names)
    return (*OUTPUTS, *(name for name in extra if name.startswith("present_") and name not in OUTPUTS))


JUMPS = ("position", "fill")


def decode_schedule(
    limit: int, *, batch: int = 2, prefill: int = PREFILL, steps: int = DECODE_STEPS, jump: str = "position"
) -> list[Shape]:
    """The steps of a decode sequence: a prefill, ``steps`` single tokens, then a long jump to position ``limit - 1``.

    Args:
        limit: positions (and cache slots) the graph serves (:func:`serving_limit`).
        batch: rows of every step.
        prefill: tokens of the first step.
        steps: single-token steps after it.
        jump: ``position``: one token at position ``limit - 1`` right after the single steps; ``fill``: a chunk of
            contiguous tokens up to position ``limit - 2``, then one token at ``limit - 1`` (the cache's last slot).

    Raises:
        ConfigError: an unknown jump, or a sequence that does not fit ``limit``.
    """
    if jump not in JUMPS:
        raise ConfigError(f"unknown jump {jump!r}; use one of {list(JUMPS)}.")
    past = prefill + steps
    if past + 2 > limit:
        raise ConfigError(
            f"{prefill} + {steps} tokens and a jump need more than {limit} positions; export with a longer "
            f"--max-positions, or take fewer steps."
        )
    shapes = [Shape(batch, prefill, 0)] + [Shape(batch, 1, prefill + i) for i in range(steps)]
    if jump == "position":
        return [*shapes, Shape(batch, 1, past, start=limit - 1)]
    return [*shapes, Shape(batch, limit - 1 - past, past), Shape(batch, 1, limit - 1)]


def ring_slots(manifest: Manifest) -> int | None:
    """The slots of a ``block-inplace`` graph's ring cache (``None``: a linear cache or another unit)."""
    if manifest.unit != BLOCK_INPLACE or not manifest.cache_ring:
        return None
    return int(manifest.input("key_cache").shape[2])


def ring_schedule(schedule: Sequence[Shape], slots: int, window: int) -> list[Shape]:
    """``schedule`` with every step cut into calls a ring of ``slots`` slots over a ``window`` serves
    (``S <= C - min(P, W - 1)``, :meth:`posenc.blocks.AttentionBlock.forward_in_place`): the same tokens at the
    same positions."""
    fitted = []
    for shape in schedule:
        done = 0
        while done < shape.seq:
            past = shape.past + done
            seq = min(shape.seq - done, slots - min(past, window - 1))
            fitted.append(dataclasses.replace(shape, seq=seq, past=past, start=shape.first + done))
            done += seq
    return fitted


def keep_last(outputs: dict[str, Any], kept: int) -> dict[str, Any]:
    """The last ``kept`` tokens of each cache output ``[B, Hkv, P, D]`` (what a ring holds)."""
    caches = ("present_key", "present_value")  # token axis 2; a state [B, ...] has none
    return {k: (v[:, :, -kept:] if k in caches and v.shape[2] > kept else v) for k, v in outputs.items()}


def step_feeds(manifest: Manifest, schedule: Sequence[Shape], seed: int = 0) -> list[dict[str, np.ndarray]]:
    """The new tokens of each step: ``hidden`` (standard normal, graph dtype) and ``position_ids``; and a traced
    layer's second streams (:func:`stream_slots`): one over the tokens drawn per step, one of its own length (an
    encoder's states) drawn once and fed at every step, as a decoder reads the same encoder output throughout."""
    rng = np.random.default_rng(seed)
    dtype = NUMPY_DTYPES[manifest.dtype]
    width = int(manifest.attention["hidden_size"])
    streams = stream_slots(manifest)
    whole = {  # streams of the whole sequence, sized at its first step
        slot.name: rng.standard_normal([dim_size(d, schedule[0]) for d in slot.shape]).astype(np.float32)
        for slot in streams
        if "seq" not in slot.shape
    }
    feeds = []
    for shape in schedule:
        hidden = rng.standard_normal((shape.batch, shape.seq, width)).astype(np.float32).astype(dtype)
        positions = np.repeat((shape.first + np.arange(shape.seq, dtype=np.int64))[None], shape.batch, axis=0)
        feed = {"hidden": hidden, "position_ids": positions}
        for slot in streams:
            drawn = whole.get(slot.name)
            if drawn is None:
                drawn = rng.standard_normal([dim_size(d, shape) for d in slot.shape]).astype(np.float32)
            feed[slot.name] = drawn.astype(dtype)
        feeds.append(feed)
    return feeds


def stream_slots(manifest: Manifest) -> list[Slot]:
    """A traced layer's second streams: its activation inputs besides ``hidden`` (NeoMME's value embeddings
    ``[B, S, W]``, T5Gemma 2's encoder states ``[B, S_enc, E]``), in input order."""
    return [slot for slot in slots_from_manifest(manifest) if slot.kind == "act" and slot.name != "hidden"]


__all__ = [
    "DECODE_STEPS",
    "JUMPS",
    "OUTPUTS",
    "PREFILL",
    "decode_outputs",
    "decode_schedule",
    "keep_last",
    "ring_schedule",
    "ring_slots",
    "step_feeds",
    "stream_slots",
]
