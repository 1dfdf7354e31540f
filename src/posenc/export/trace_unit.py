"""The traced graph's interface (:func:`traced_unit`): its inputs (hidden states, positions, the caches the layer
holds, second streams, boxes) and outputs, in the order of the unit's forward
(:meth:`posenc.trace.module.TracedAttention.forward`), checked against it."""

from __future__ import annotations

import dataclasses

import torch

from posenc.config import AttentionConfig
from posenc.errors import ExportError
from posenc.export.feeds import SOURCE, Slot, box_slot
from posenc.export.kinds import UnitKind
from posenc.export.units import ExportUnit, _slots
from posenc.schemes.base import Placement
from posenc.trace.arguments import stream_shapes
from posenc.trace.capture import Captured
from posenc.trace.inputs import STREAM_OUTPUTS


def traced_unit(module: torch.nn.Module, config: AttentionConfig, captured: Captured) -> ExportUnit:
    """The ``block`` unit; without a cache its ``hidden`` and ``position_ids`` alone, and ``out``; with values of
    another width than the keys (``value_dim``, :mod:`posenc.trace.caches`), ``past_value [B, Hkv, P, Dv]``; with
    a DSA layer's indexer keys, ``past_indexer_key [B, P, Di]`` -> ``present_indexer_key``; with a hybrid cache
    layer's fixed-size states, ``past_<name> [B, ...]`` -> ``present_<name>`` each (:mod:`posenc.trace.caches`)."""
    slots, outputs = _slots(UnitKind.BLOCK, Placement.QK, config, 1)
    if captured.cacheless:
        slots, outputs = [slot for slot in slots if slot.kind != "past"], outputs[:1]
    elif captured.value_dim is not None:
        slots = [value_width(slot, captured.value_dim) if slot.name == "past_value" else slot for slot in slots]
        outputs = [(name, "[B, Hkv, P+S, Dv]" if name == "present_value" else layout) for name, layout in outputs]
    if not captured.cacheless and captured.indexer_dim is not None:
        slots.append(Slot("past_indexer_key", "past", ("batch", "past", captured.indexer_dim), "[B, P, Di] (indexer)"))
        outputs.append(("present_indexer_key", "[B, P+S, Di] (indexer)"))
    for state in () if captured.cacheless else captured.states:  # a hybrid layer's states, fixed in size
        layout = f"[B, {', '.join(str(d) for d in state.shape)}] ({state.name.replace('_', ' ')})"
        slots.append(Slot(f"past_{state.name}", "past", ("batch", *state.shape), layout))
        outputs.append((f"present_{state.name}", layout))
    for key, (length, width) in stream_shapes(captured.call).items():  # second streams, last (TracedAttention)
        slots.append(Slot(key, "act", ("batch", length, width), stream_layout(key, length, width)))
        if key in STREAM_OUTPUTS:  # returned updated (PEGASUS-X's global tokens' states), after the other outputs
            outputs.append((f"{key}_out", f"[B, {length}, {width}] ({key}, updated by the attention)"))
    if captured.boxes is not None:  # the tokens' boxes, last (posenc.trace.boxes)
        slots.append(box_slot(captured.boxes.dtype, captured.boxes.top))
    check_inputs(module, slots)
    return ExportUnit(UnitKind.BLOCK, module, module, config, torch.float32, slots, outputs)


NAMED_INPUTS = 8
"""The traced unit's named parameters (``hidden, position_ids, past_key, past_value, past_2 .. past_5``): torch.export
binds one graph input to each; more would fall into ``*streams``, which it cannot give dynamic shapes one by one."""


def check_inputs(module: torch.nn.Module, slots: list[Slot]) -> None:
    """The graph's cache inputs are the ones the unit's forward takes, in its order
    (:attr:`posenc.trace.module.TracedAttention.cache_inputs`), and no more inputs than it names.

    Raises:
        ExportError: a layer whose cache holds both indexer keys and states, or too many inputs.
    """
    caches = [slot.name for slot in slots if slot.kind == "past"]
    expected = getattr(module, "cache_inputs", None)
    if caches and expected is not None and caches != list(expected)[: len(caches)]:
        raise ExportError(
            f"this layer's cache holds {', '.join(caches)}, but posenc's traced unit takes {', '.join(expected)}; "
            f"a cache of both indexer keys and states cannot be traced yet."
        )
    if len(slots) > NAMED_INPUTS:
        raise ExportError(
            f"this layer's unit would take {len(slots)} inputs ({', '.join(slot.name for slot in slots)}); posenc's "
            f"traced unit names {NAMED_INPUTS}, so this attention cannot be traced yet."
        )


def stream_layout(key: str, length: int | str, width: int) -> str:
    """A second stream's layout in the manifest: over the tokens, or of its own length (an encoder's states, fed
    at every call: the merged attention projects its keys and values of them each time, no cache holds them)."""
    if length == "seq":
        return f"[B, S, {width}] ({key}, from the token ids)"
    if length == SOURCE:
        return f"[B, S_enc, {width}] ({key}: fed at every call, its keys and values projected each time, not cached)"
    return f"[B, {length}, {width}] ({key})"


def value_width(slot: Slot, value_dim: int) -> Slot:
    """``past_value`` with its last axis ``value_dim`` wide (the cache's values differ from its keys in width)."""
    return dataclasses.replace(slot, shape=(*slot.shape[:-1], value_dim), layout="[B, Hkv, P, Dv]")


__all__ = ["NAMED_INPUTS", "check_inputs", "stream_layout", "traced_unit", "value_width"]
