"""The arguments of a captured module call: what kind each is, what a recipe keeps of it, how the unit rebuilds it.

A traced unit calls the model's attention (and its rotary module, and an embedding step) with arguments rebuilt from
the unit's inputs alone: the hidden states ``[B, S, E]``, the position ids ``[B, S]`` and the cache. The capture
(:mod:`posenc.trace.capture`) names each argument of the model's own call by its kind
(:data:`posenc.trace.record.ARGUMENT_KINDS`) with :func:`classify`; :func:`keep` says what a
:class:`~posenc.trace.record.CallRecipe` stores of it (a constant's value, a shape); :func:`rebuild` gives the value of
an argument of a plain kind again (:mod:`posenc.trace.module` adds the kinds that need the unit's state: the mask,
the cache, the position embeddings).

Multi-axis position ids ``[A, B, S]`` (kind ``sections``): vision-language text towers (Qwen2-VL's M-RoPE, GLM-4V,
ERNIE 4.5-VL, PaddleOCR-VL) turn 2-D position ids into one row per rotary section (temporal, height, width) and call
their rotary module (or attention) with them; for text tokens every row is the token's position. The unit serves
text: it rebuilds the rows as copies of ``position_ids`` (checked on the capture: every row equal to it). M-RoPE is
from "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any Resolution" (Wang et al., 2024,
https://arxiv.org/abs/2409.12191).

Keys and values shared between layers (kind ``kv_sharing``: Gemma 4's ``shared_kv_states``, a ``UserDict`` a layer
stores its keys and values in for later layers to reuse): the unit passes a fresh empty one. A layer that computes its
own keys and values only writes it; a layer that reads another layer's is refused at capture (its cache is not its
own).
"""

from __future__ import annotations

from collections import UserDict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from posenc.errors import ConfigError, ExportError
from posenc.trace.boxes import box_form, passed
from posenc.trace.inputs import EVERY_KEY, STREAM_LENGTHS, STREAMS, argument_meaning
from posenc.trace.record import CallRecipe

PLAIN_KINDS: tuple[str, ...] = (
    "hidden",
    "position_ids",
    "sections",
    "cache_position",
    "constant",
    "ones",
    "zeros",
    "kv_sharing",
    "every_key",
    "segments",
    "boxes",
)
"""Kinds :func:`rebuild` fills from the hidden states, positions and the boxes the call holds
(:mod:`posenc.trace.boxes`)."""


def same_tensor(a: Any, b: torch.Tensor) -> bool:
    """Whether ``a`` is ``b`` or a tensor of its shape, dtype and values."""
    return torch.is_tensor(a) and (a is b or (a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)))


def is_sections(value: torch.Tensor, positions: torch.Tensor) -> bool:
    """Whether ``value`` is ``positions [B, S]`` repeated along a leading axis: ``[A, B, S]``, every row equal to
    the positions (multi-axis position ids of text tokens)."""
    return (
        value.dim() == positions.dim() + 1
        and value.shape[1:] == positions.shape
        and 1 < value.shape[0] <= 8
        and value.dtype == positions.dtype
        and bool((value == positions.unsqueeze(0)).all())
    )


def classify(
    key: str,
    value: Any,
    positions: torch.Tensor,
    hidden: torch.Tensor | None,
    cache_class: type,
    produced: bool,
) -> str:
    """The :data:`~posenc.trace.record.ARGUMENT_KINDS` entry of one captured argument.

    Args:
        key: the keyword, or ``"#i"`` for positional argument ``i`` (named in the error).
        value: what the model passed.
        positions: the capture's position ids ``[B, S]``.
        hidden: the layer's hidden states (an argument that *is* them is ``hidden``), or None.
        cache_class: transformers' ``Cache``.
        produced: ``value`` is a tuple another module of the model returned (the rotary module's cos/sin), or one
            tensor of position embeddings it returned (a conformer's relative encodings).

    Raises:
        ExportError: posenc cannot rebuild the argument from the hidden states, positions and cache (named).
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return "constant"
    if isinstance(value, cache_class):
        return "cache"
    if isinstance(value, UserDict):
        return "kv_sharing"
    if box_form(value) is not None:  # the tokens' boxes (or the model's rearrangement of them): the unit's bbox
        return "boxes"
    if produced and (isinstance(value, (tuple, list)) or torch.is_tensor(value)):
        return "position_embeddings"  # cos/sin, or one tensor of relative encodings a module computed
    if torch.is_tensor(value):
        if hidden is not None and value is hidden:
            return "hidden"
        if "mask" in key and (value.dim() == 4 or is_open_square(value)):
            return "mask"
        if same_tensor(value, positions) or is_recast(value, positions):
            return "position_ids"
        if is_sections(value, positions):
            return "sections"
        if value.dim() == 1 and same_tensor(value, positions[0]):
            return "cache_position"
        if value.dim() == 2 and value.numel() and bool((value == 1).all()):
            return "ones"
        if "mask" in key and is_open_padding(value, positions):
            return "padding"
        if value.dim() >= 2 and value.numel() and not value.is_floating_point() and bool((value == 0).all()):
            return "zeros"
        if "mask" in key and value.dim() == 2 and value.numel() and bool((value == 0).all()):
            return "zeros"  # an additive mask of zeros over another length (over the tokens: kind padding above)
    if key in EVERY_KEY and is_every_key(value, positions):
        return "every_key"
    if key in STREAMS and is_stream(value, positions, STREAM_LENGTHS.get(key, "seq")):
        return "stream"
    shape = list(value.shape) if torch.is_tensor(value) else described(value)
    raise ExportError(
        f"the attention is called with argument {key!r} ({shape}){argument_meaning(key)}, which posenc cannot "
        f"rebuild from the hidden states, positions and cache; this model's attention cannot be traced yet."
    )


def described(value: Any) -> str:
    """What a value the unit cannot rebuild holds, for a refusal: a dict's entries (ZAYA's masks per use
    ``{'causal': [1, 1, 8, 8], 'conv': None}``, DeepSeek-V4's cos/sin per rope type), else its type's name."""
    if not isinstance(value, Mapping):
        return type(value).__name__

    def entry(item: Any) -> str:
        if torch.is_tensor(item):
            return str(list(item.shape))
        if isinstance(item, (tuple, list)):
            return f"{type(item).__name__} of {len(item)}"
        return repr(item) if item is None or isinstance(item, (bool, int, float, str)) else type(item).__name__

    return "dict {" + ", ".join(f"{key!r}: {entry(item)}" for key, item in value.items()) + "}"


def is_open_square(value: torch.Tensor) -> bool:
    """Whether ``value`` is a boolean or integer mask ``[B, S, S]`` of ones: it hides no key (CPM-Ant's ``int32``
    mask without padding, which its attention reads through ``view(B, 1, S, K) == False``): taken as a mask; the unit
    passes its ``[B, 1, S, K]`` one, and the capture's probe checks the attention computes the same with it."""
    square = value.dim() == 3 and value.shape[1] == value.shape[2] and not value.is_floating_point()
    return square and value.numel() > 0 and bool((value == 1).all())


def is_recast(value: torch.Tensor, positions: torch.Tensor) -> bool:
    """Whether ``value`` is the position ids in another integer dtype (CPM-Ant's ``int32`` positions): kind
    ``position_ids``, the dtype kept (:func:`keep`)."""
    return (
        value.shape == positions.shape
        and value.dtype != positions.dtype
        and not value.is_floating_point()
        and value.dtype != torch.bool
        and torch.equal(value.to(positions.dtype), positions)
    )


def segments_of(value: Any, positions: torch.Tensor) -> tuple[int, int, int] | None:
    """``(split, before, after)`` where ``value [B, S]`` (integer) is ``before`` at the positions below ``split`` and
    ``after`` from it (:data:`posenc.trace.inputs.SEGMENTS`), else None."""
    if not torch.is_tensor(value) or value.is_floating_point() or value.shape != positions.shape or not value.numel():
        return None
    before, after = int(value[0, 0]), int(value[0, -1])
    split = int((value[0] == before).int().cumprod(0).sum())
    rebuilt = torch.where(positions < split, before, after).to(value.dtype)
    return (split, before, after) if torch.equal(rebuilt, value) else None


def is_stream(value: Any, positions: torch.Tensor, length: str = "seq") -> bool:
    """Whether ``value`` is a floating ``[B, L, W]`` tensor of the capture's batch (a second stream,
    :data:`posenc.trace.inputs.STREAMS`): ``L`` the tokens' ``S`` where ``length`` is ``seq``, any length otherwise
    (:data:`posenc.trace.inputs.STREAM_LENGTHS`)."""
    if not (torch.is_tensor(value) and value.is_floating_point() and value.dim() == 3 and value.shape[1] > 0):
        return False
    if length == "seq":
        return tuple(value.shape[:2]) == tuple(positions.shape)
    return int(value.shape[0]) == int(positions.shape[0])


def is_open_padding(value: torch.Tensor, positions: torch.Tensor) -> bool:
    """Whether ``value`` is an additive padding mask ``[B, S]`` over the capture's tokens that hides none of them
    (floating zeros: PEGASUS-X's encoder mask without padding)."""
    return (
        value.dim() == 2
        and value.is_floating_point()
        and tuple(value.shape) == tuple(positions.shape)
        and not bool(value.any())
    )


def padding_mask(length: Any, tokens: Any, like: torch.Tensor, dtype: str) -> torch.Tensor:
    """An additive padding mask ``[B, length]`` (kind ``padding``): 0 over the first ``tokens`` positions, the dtype's
    minimum over the padding after them (``like``: a ``[B, ...]`` tensor of the batch and device; the lengths may be
    symbolic while exporting)."""
    kind = getattr(torch, dtype)
    index = torch.arange(length, device=like.device).unsqueeze(0).expand(like.shape[0], -1)
    zeros = torch.zeros(index.shape, dtype=kind, device=like.device)
    return zeros.masked_fill(index >= tokens, torch.finfo(kind).min)


def is_every_key(value: Any, positions: torch.Tensor) -> bool:
    """Whether ``value`` is a selection of key indices ``[B, S, K]`` that holds every key ``0 .. K - 1`` for each
    query, in any order, over the capture's keys (``K = S``: the capture runs without a past;
    :data:`posenc.trace.inputs.EVERY_KEY`)."""
    if not torch.is_tensor(value) or value.is_floating_point() or value.dim() != 3:
        return False
    s = int(positions.shape[-1])
    if tuple(value.shape[1:]) != (s, s) or value.shape[0] != positions.shape[0]:
        return False
    return bool((value.sort(dim=-1).values == torch.arange(s, dtype=value.dtype)).all())


def keep(constants: dict[str, Any], key: str, kind: str, value: Any) -> None:
    """What a recipe keeps of an argument: a constant's value; the trailing shape of all-zero ids ``[B, S, ...]``;
    the dtype of a floating mask of ones; the row count ``A`` of multi-axis position ids ``[A, B, S]``."""
    if kind == "constant":
        constants[key] = value
    elif kind == "zeros" and value.dtype != torch.int64:  # flags or an additive mask (Longformer's): their dtype
        constants[key] = {"shape": [int(n) for n in value.shape[2:]], "dtype": str(value.dtype).removeprefix("torch.")}
    elif kind == "zeros":
        constants[key] = [int(n) for n in value.shape[2:]]
    elif kind == "ones" and value.is_floating_point():  # a float padding mask of ones (Funnel's, type_as the states)
        constants[key] = str(value.dtype).removeprefix("torch.")
    elif kind == "sections":
        constants[key] = int(value.shape[0])
    elif kind == "every_key":
        constants[key] = str(value.dtype).removeprefix("torch.")
    elif kind == "padding":
        constants[key] = [str(value.dtype).removeprefix("torch."), None]  # [dtype, block]: the capture sets the block
    elif kind == "stream":  # W; with a length of its own [L, W] (L: ``source``, or the capture's for ``fixed``)
        length = STREAM_LENGTHS.get(key, "seq")
        width = int(value.shape[-1])
        constants[key] = width if length == "seq" else [int(value.shape[1]) if length == "fixed" else length, width]
    elif kind == "position_ids" and torch.is_tensor(value) and value.dtype != torch.int64:  # CPM-Ant's int32
        constants[key] = str(value.dtype).removeprefix("torch.")
    elif kind == "segments":
        split = segments_of(value, torch.arange(value.shape[-1]).expand(value.shape))
        assert split is not None  # classified so
        constants[key] = [*split, str(value.dtype).removeprefix("torch.")]
    elif kind == "boxes":
        constants[key] = box_form(value)


_INDEX_DTYPES = {"int32": torch.int32, "int64": torch.int64}


def rebuild(key: str, kind: str, constants: dict[str, Any], hidden: torch.Tensor, position_ids: torch.Tensor,
            past: int) -> Any:  # fmt: skip
    """The value of an argument of a :data:`PLAIN_KINDS` kind for ``hidden [B, S, E]`` and ``position_ids [B, S]``
    (``past`` cached positions before the new tokens).

    Raises:
        ConfigError: another kind (a record this posenc does not know).
    """
    if kind == "hidden":
        return hidden
    if kind == "position_ids":
        dtype = constants.get(key)  # CPM-Ant's int32; a dict argument's entry keeps the dict's constants (none)
        return position_ids.to(_INDEX_DTYPES[dtype]) if isinstance(dtype, str) else position_ids
    if kind == "segments":  # [split, before, after, dtype]: a segment id per position (SEGMENTS)
        split, before, after, dtype = constants[key]
        return torch.where(position_ids < split, before, after).to(_INDEX_DTYPES[dtype])
    if kind == "sections":
        rows = int(constants.get(key, 3))
        return position_ids.unsqueeze(0).expand(rows, *position_ids.shape)
    if kind == "cache_position":
        return torch.arange(hidden.shape[1], device=hidden.device) + past
    if kind == "constant":
        return constants.get(key)
    if kind == "kv_sharing":
        return {}
    if kind == "boxes":  # the unit's bbox input, as the model passes it (posenc.trace.boxes)
        return passed(str(constants.get(key, "given")))
    if kind == "every_key":  # every key's index for every query [B, S, P + S] (EVERY_KEY)
        total = past + hidden.shape[1]
        dtype = _INDEX_DTYPES.get(str(constants.get(key, "int64")))
        if dtype is None:
            raise ConfigError(f"unknown index dtype {constants.get(key)!r} in a trace record; re-export the model.")
        keys = torch.arange(total, dtype=dtype, device=hidden.device)
        return keys.expand(hidden.shape[0], hidden.shape[1], total)
    if kind == "zeros" and isinstance(constants.get(key), Mapping):  # of another dtype than int64
        kept = constants[key]
        dtype = getattr(torch, str(kept["dtype"]))
        return torch.zeros(hidden.shape[0], hidden.shape[1], *kept["shape"], dtype=dtype, device=hidden.device)
    if kind in ("ones", "zeros"):
        fill = torch.ones if kind == "ones" else torch.zeros
        trailing = constants.get(key, ()) if kind == "zeros" else ()
        named = constants.get(key) if kind == "ones" else None  # a float padding mask of ones keeps its dtype
        dtype = getattr(torch, named) if isinstance(named, str) else torch.int64
        return fill(hidden.shape[0], hidden.shape[1], *trailing, dtype=dtype, device=hidden.device)
    if kind == "padding":  # outside the attention's own call: no sequence padded to blocks there, so it hides nothing
        return padding_mask(hidden.shape[1], hidden.shape[1], hidden, str(constants[key][0]))
    raise ConfigError(f"unknown argument kind {kind!r} in a trace record; re-export the model.")


def stream_shapes(recipe: CallRecipe) -> dict[str, tuple[int | str, int]]:
    """The second streams of a call (kind ``stream``, :data:`posenc.trace.inputs.STREAMS`): keyword -> ``(L, W)`` of
    the ``[B, L, W]`` graph input of that name, in the call's order; ``L`` is ``seq`` (the tokens'), ``source`` (a
    length of its own) or a number (:data:`posenc.trace.inputs.STREAM_LENGTHS`)."""
    if "stream" in recipe.positional:  # no model passes one so; the graph input is named by its keyword
        raise ExportError("the attention takes a second stream positionally; posenc names it by its keyword.")
    shapes: dict[str, tuple[int | str, int]] = {}
    for key, kind in recipe.keywords.items():
        if kind == "stream":
            kept = recipe.constants[key]
            shapes[key] = ("seq", int(kept)) if isinstance(kept, int) else (kept[0], int(kept[1]))
    return shapes


def stream_widths(recipe: CallRecipe) -> dict[str, int]:
    """The width ``W`` of each second stream of a call (:func:`stream_shapes`), by keyword."""
    return {key: width for key, (_, width) in stream_shapes(recipe).items()}


def padding_keys(recipe: CallRecipe) -> list[str]:
    """The arguments of kind ``padding`` of a call (keyword, or ``"#i"``)."""
    kinds = (*((f"#{i}", kind) for i, kind in enumerate(recipe.positional)), *recipe.keywords.items())
    return [key for key, kind in kinds if kind == "padding"]


def padding_block(recipe: CallRecipe) -> int | None:
    """The block a call's ``padding`` mask pads the sequence to (:data:`posenc.trace.inputs.PADDED_BLOCKS`), or
    None (no such argument, or a model that does not pad)."""
    blocks = [recipe.constants[key][1] for key in padding_keys(recipe)]
    return int(blocks[0]) if blocks and blocks[0] else None


def pad_blocks(states: torch.Tensor, block: int) -> torch.Tensor:
    """``states [B, S, E]`` padded with zeros to whole blocks, ``[B, n · block, E]`` with ``n = ceil(S / block)``, as
    PEGASUS-X's encoder pads its sequence before its layers (the padding is hidden by the ``padding`` mask)."""
    length = states.shape[1]
    blocks = (length + block - 1) // block
    return torch.nn.functional.pad(states, (0, 0, 0, blocks * block - length))


def call_args(recipe: CallRecipe, value: Callable[[str, str], Any]) -> tuple[list[Any], dict[str, Any]]:
    """``(args, kwargs)`` of a recipe's call, each argument ``value(key, kind)`` (``key``: ``"#i"`` or the keyword)."""
    args = [value(f"#{i}", kind) for i, kind in enumerate(recipe.positional)]
    return args, {key: value(key, kind) for key, kind in recipe.keywords.items()}


def attention_output(output: Any) -> Any:
    """The attention's output states in what its forward returns: the value itself, the first entry of a tuple (the
    usual ``(out, weights)``), recursively (I-BERT's ``((out,), (scaling,))``), or the first value of a dict
    (SqueezeBERT's ``{"context_layer": out}``)."""
    while isinstance(output, (tuple, list, Mapping)) and output:
        output = next(iter(output.values())) if isinstance(output, Mapping) else output[0]
    return output


__all__ = [
    "PLAIN_KINDS",
    "attention_output",
    "call_args",
    "classify",
    "described",
    "is_every_key",
    "is_open_padding",
    "is_open_square",
    "is_recast",
    "is_sections",
    "is_stream",
    "keep",
    "pad_blocks",
    "padding_block",
    "padding_keys",
    "padding_mask",
    "rebuild",
    "same_tensor",
    "segments_of",
    "stream_shapes",
    "stream_widths",
]
