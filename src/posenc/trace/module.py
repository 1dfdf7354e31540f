"""The traced unit: a checkpoint's own attention module, called as its model calls it, with a family export's
interface.

:class:`TracedAttention` takes ``hidden [B, S, E]``, ``position_ids [B, S]`` (int64) and ``past_key`` /
``past_value [B, Hkv, P, D]`` and returns ``out [B, S, E]`` and ``present_key`` / ``present_value
[B, Hkv, P + S, D]``, like :class:`posenc.blocks.AttentionBlock`. Inside, it rebuilds every argument of the model's
call from those (:class:`~posenc.trace.record.CallRecipe`): the position embeddings from the model's rotary module
(``angles="native"``) or from posenc's float64 scheme laid out as the model lays them out (``angles="exact"``, the
reference of ``posenc validate``), the mask from positions (cached keys at ``0 .. P - 1``), a transformers
``DynamicCache`` holding the past at the layer's index, the cache positions and the constants the model passed.
Exported graphs guard their positions as posenc's blocks do (:func:`posenc.functional.position_guard`): the poison
enters the hidden states before the module.

An attention its model calls without a KV cache (an encoder's, ``cacheless``) takes ``hidden`` and ``position_ids``
and returns ``(out,)``: the unit of posenc's encoder blocks fed no past.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from posenc.blocks import default_positions
from posenc.checkpoints.reference import key_positions
from posenc.errors import ConfigError, ExportError
from posenc.functional import is_tracing, position_guard
from posenc.schemes.base import PositionalScheme, poisoned
from posenc.schemes.rope import Rotary
from posenc.trace.arguments import (
    attention_output,
    call_args,
    pad_blocks,
    padding_block,
    padding_mask,
    rebuild,
    stream_widths,
)
from posenc.trace.boxes import NAME as BOX_INPUT
from posenc.trace.boxes import box_input, feeding
from posenc.trace.caches import new_cache, read_states, set_states
from posenc.trace.derived import compute
from posenc.trace.inputs import STREAM_OUTPUTS
from posenc.trace.layouts import arrange
from posenc.trace.masks import visible as visible_keys
from posenc.trace.orders import BATCH_MAJOR, from_model, to_model
from posenc.trace.record import AnglesRecord, BoxesRecord, CallRecipe, DerivedRecipe, MaskRecipe
from posenc.trace.stacks import self_attention_cache
from posenc.trace.windows import chunk_window, mark_padding, onnx_mode, pad_rows, padded_length


def scheme_cos_sin(scheme: PositionalScheme, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A rotary scheme's ``cos``, ``sin [B, S, r/2]`` at ``position_ids [B, S]`` (ConfigError for other schemes)."""
    if not isinstance(scheme, Rotary):
        raise ConfigError(f"scheme {scheme.spec.name!r} does not rotate q and k; it has no cos/sin to replace angles.")
    return scheme.cos_sin(position_ids)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default dtype set to ``dtype`` while a float64 rebuild runs (eager only; float32 and exports keep it),
    so the constants a module makes in the default dtype are float64 too: XGLM clamps its scores with
    ``torch.full((), finfo(scores.dtype).min)``, which a float32 default cannot hold."""
    if dtype != torch.float64 or is_tracing():
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class TracedAttention(nn.Module):
    """A transformers attention module with posenc's block interface (see the module docstring).

    Args:
        attention: the layer's attention module (its weights loaded).
        rotary: the model's rotary module, or None.
        layer: the layer index (where the cache holds the past).
        call, rotary_call: how the model calls the attention and the rotary module.
        mask: how the model's mask is rebuilt from positions.
        exact: posenc's scheme whose cos/sin replace the rotary module's output (``angles="exact"``), or None.
        angles_layout: how the model lays out cos/sin (needed with ``exact``).
        position_limit: exclusive bound on positions an exported graph serves (the guard's), or None.
        embedding: the position module of an embedding step (the unit then takes token embeddings as ``hidden`` and
            feeds the attention ``norms(hidden + embedding(...))``), or None; ``embedding_call``: how the model calls
            it; ``norms``: the layer's modules between the embedding sum and the attention. ``embeddings_module``:
            the embedding is the model's whole embeddings module, called with ``inputs_embeds=hidden``
            (``norms(embedding(...))``).
        cacheless: the model calls the attention without a cache; the unit takes no past and returns ``(out,)``.
        cache_kind: the cache the model passes (:data:`posenc.trace.caches.CACHE_KINDS`: a decoder of an
            encoder-decoder gets an ``EncoderDecoderCache``, whose self-attention part holds the past).
        derived: arguments the model computes from the sequence before its layers: keyword (or ``"#i"``) -> how
            and the module whose code computes them (:mod:`posenc.trace.derived`).
        order: the axis order the attention takes its hidden states in (:mod:`posenc.trace.orders`); the unit
            transposes ``hidden`` into it before the module and the output back.
        stem: the layer's module the unit calls on ``hidden`` (the layer's input) first, whose outputs are the
            attention's arguments of kind ``stream`` (MobileBERT's bottleneck, :mod:`posenc.trace.stems`), or None.
        rotary_rows: the length the rotary module is called with where it sizes its output by its input's length and
            the attention reads that output at the position ids (CLVP's angles of positions ``0 .. S - 1``): the
            context's, so every position the unit serves is in it (the model passes only ``0 .. S - 1``); None
            otherwise.
        boxes: how the model takes its tokens' boxes, where the unit takes them as its last input ``bbox [B, S, 4]``
            and calls the model's code that reads them (:mod:`posenc.trace.boxes`), else None.
        cache_layer: the class of a ``linear`` cache's layers (:data:`posenc.trace.caches.LINEAR_LAYERS`), else None.
        states: the fixed-size states that cache layer holds beside keys and values (``conv_state_0``, ...): cache
            inputs ``past_<name>`` after the keys and values, outputs ``present_<name>`` after theirs.
    """

    guard_exported = True
    """Whether an exported graph guards its positions (set by the exporter, like a scheme's)."""

    def __init__(
        self,
        attention: nn.Module,
        rotary: nn.Module | None,
        layer: int,
        call: CallRecipe,
        rotary_call: CallRecipe | None,
        mask: MaskRecipe,
        exact: PositionalScheme | None = None,
        angles_layout: AnglesRecord | None = None,
        position_limit: int | None = None,
        embedding: nn.Module | None = None,
        embedding_call: CallRecipe | None = None,
        norms: list[nn.Module] | None = None,
        embeddings_module: bool = False,
        cacheless: bool = False,
        cache_kind: str = "dynamic",
        derived: Mapping[str, tuple[DerivedRecipe, nn.Module | None]] | None = None,
        order: str = BATCH_MAJOR,
        stem: nn.Module | None = None,
        rotary_rows: int | None = None,
        boxes: BoxesRecord | None = None,
        cache_layer: str | None = None,
        states: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        if exact is not None and angles_layout is None:
            raise ConfigError("exact angles need the model's cos/sin layout (angles_layout).")
        self.attention = attention
        self.rotary = rotary
        self.exact = exact
        self.layer = layer
        self.call = call
        self.rotary_call = rotary_call
        self.mask = mask
        self.angles_layout = angles_layout
        self._limit = position_limit
        if (embedding is None) != (embedding_call is None):
            raise ConfigError("an embedding step needs both its position module and how the model calls it.")
        self.embedding = embedding
        self.embedding_call = embedding_call
        self.norms = nn.ModuleList(norms or [])
        self.embeddings_module = embeddings_module
        self.cacheless = cacheless
        self.cache_kind = cache_kind
        self.boxes = boxes  # the tokens' boxes: the last graph input, bbox [B, S, 4] (posenc.trace.boxes)
        self.stream_keys = [*stream_widths(call), *([BOX_INPUT] if boxes is not None else [])]  # after the others
        self.stream_outputs = [key for key in self.stream_keys if key in STREAM_OUTPUTS]  # returned updated, last
        self.block = padding_block(call)  # the sequence padded to whole blocks (PEGASUS-X's encoder), or None
        if self.block is not None and order != BATCH_MAJOR:
            raise ConfigError("a traced attention over whole blocks takes batch-major hidden states [B, S, E] only.")
        self.order = order
        self.stem = stem
        self.rotary_rows = rotary_rows
        self.cache_layer = cache_layer
        self.states = tuple(states)
        self.derived_recipes = {key: recipe for key, (recipe, _) in (derived or {}).items()}
        self.derived = nn.ModuleDict(
            {_slot(key): module for key, (_, module) in (derived or {}).items() if module is not None}
        )

    @property
    def position_limit(self) -> int | None:
        """Exclusive bound on the positions an exported graph serves (None: any position >= 0)."""
        return self._limit

    @property
    def angles(self) -> str:
        """``exact`` (posenc's cos/sin) or ``native`` (the model's rotary module)."""
        return "exact" if self.exact is not None else "native"

    # -- the arguments of the model's call --------------------------------------------------------

    def position_embeddings(
        self, hidden: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...] | torch.Tensor:
        """What the model's rotary module returns for ``position_ids [B, S]`` (cos, sin in its layout; or the one
        tensor a module of relative encodings returns, e.g. ``[B, 2S - 1, E]``)."""
        if self.exact is not None and self.angles_layout is not None:
            cos, sin = scheme_cos_sin(self.exact, position_ids)
            layout = self.angles_layout.layout
            return arrange(cos, layout).to(hidden.dtype), arrange(sin, layout).to(hidden.dtype)
        if self.rotary is None or self.rotary_call is None:
            raise ExportError("the model's call takes position embeddings, but no rotary module was captured.")
        rows = hidden if self.rotary_rows is None else hidden.new_zeros(1, self.rotary_rows, hidden.shape[-1])
        args, kwargs = self._fill(self.rotary_call, rows, position_ids, None, None, 0)
        out = self.rotary(*args, **kwargs)
        if self.rotary_call.item is not None:  # one entry of what it returns (FastSpeech2-Conformer's pos_enc)
            return out[self.rotary_call.item]
        return out if torch.is_tensor(out) else tuple(out)

    def _mask(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        past: int,
        streams: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """The model's mask ``[B, 1, S, P + S]`` from positions (cached keys at ``0 .. P - 1``): posenc's boolean
        mask (:func:`posenc.trace.masks.visible`, transformers' rules), made additive (0 / the dtype's
        minimum) where the model adds its mask to the scores, ones and zeros where it keeps ones (``keep``). A
        stream joined to the keys (``recipe.joined``: T5Gemma 2's encoder states ``[B, S_enc, E]``) adds ``S_enc``
        columns every query sees: ``[B, 1, S, P + S + S_enc]``."""
        recipe = self.mask
        if recipe.kind == "none":
            return None
        keys = key_positions(position_ids, past)
        visible = visible_keys(position_ids, keys, recipe)
        if visible is None:
            visible = torch.ones(hidden.shape[0], 1, hidden.shape[1], keys.shape[1], dtype=torch.bool)
        if recipe.joined is not None:
            joined = (streams or {})[recipe.joined]
            seen = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=hidden.device)
            seen = seen.expand(visible.shape[0], 1, visible.shape[2], joined.shape[1])
            visible = torch.cat((visible.expand(seen.shape[0], 1, -1, -1), seen), dim=-1)
        if recipe.kind == "bool":
            return visible
        dtype = hidden.dtype if hidden.dtype.is_floating_point else torch.float32
        if recipe.kind == "keep":
            return visible.to(dtype)
        zeros = torch.zeros(visible.shape, dtype=dtype, device=hidden.device)
        return zeros.masked_fill(~visible, torch.finfo(dtype).min)

    def _fill(
        self,
        recipe: CallRecipe,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Any,
        mask: torch.Tensor | None,
        past: int,
        streams: Mapping[str, torch.Tensor] | None = None,
        attended: torch.Tensor | None = None,
        stem: tuple[Any, ...] = (),
    ) -> tuple[list[Any], dict[str, Any]]:
        """The arguments of a call by ``recipe``; ``streams``: the second streams given as graph inputs, by keyword;
        ``attended``: what an argument of kind ``hidden`` is, where not ``hidden`` (the attention's input in the
        model's axis order); ``stem``: the stem's outputs."""

        def value(key: str, kind: str) -> Any:
            if kind == "hidden" and attended is not None:
                return attended
            if kind == "stem":
                return stem[int(recipe.constants[key])]
            if kind == "position_embeddings":
                return self.position_embeddings(hidden, position_ids)
            if kind == "mask":
                return mask
            if kind == "cache":
                return cache
            if kind == "stream":
                return (streams or {})[key]
            if kind == "padding":  # the tokens' mask over the sequence padded to whole blocks (none without a block)
                padded = attended if attended is not None else hidden
                return padding_mask(padded.shape[1], hidden.shape[1], hidden, recipe.constants[key][0])
            if kind == "entries":  # a dict argument: the entries the attention reads
                entries = recipe.constants[key].items()
                return {entry: made if of == "constant" else value(key, of) for entry, (of, made) in entries}
            if kind == "derived":
                code = next((m for name, m in self.derived.items() if name == _slot(key)), None)  # None: a function
                return compute(self.derived_recipes[key], code, hidden, position_ids)
            return rebuild(key, kind, recipe.constants, hidden, position_ids, past)

        return call_args(recipe, value)

    # -- forward ------------------------------------------------------------------------------------

    @property
    def cache_inputs(self) -> list[str]:
        """The cache inputs after ``position_ids``, in order: ``past_key``, ``past_value``, then a DSA layer's
        ``past_indexer_key`` or a hybrid layer's ``past_<state>`` s (:mod:`posenc.trace.caches`)."""
        extra = ["past_indexer_key"] if self.cache_kind == "indexed" else [f"past_{name}" for name in self.states]
        return ["past_key", "past_value", *extra]

    def forward(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_key: torch.Tensor | None = None,
        past_value: torch.Tensor | None = None,
        past_2: torch.Tensor | None = None,
        past_3: torch.Tensor | None = None,
        past_4: torch.Tensor | None = None,
        past_5: torch.Tensor | None = None,
        *streams: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """``(out [B, S, E], present_key, present_value [B, Hkv, P + S, D])`` of the layer's attention, from ``hidden
        [B, S, E]``, ``position_ids [B, S]`` and the cache inputs :attr:`cache_inputs` (``past_key``, ``past_value
        [B, Hkv, P, D]``, ...); ``(out,)`` for an attention called without a cache (whose ``past_key`` / ``past_value``,
        if given, must be empty). After the keys and values: with an ``indexed`` cache (DeepSeek sparse attention)
        ``present_indexer_key [B, P + S, Di]``, the indexer's keys after ``past_indexer_key [B, P, Di]``; with a
        ``linear`` one each state ``present_<name>`` after ``past_<name>`` (its fixed shape). A layer with second
        streams (``stream_keys``, NeoMME's value embeddings ``[B, S, W]``) takes them as the last positional inputs,
        after whatever cache inputs are given; a document model's unit (``boxes``) then its tokens' boxes ``bbox [B,
        S, 4]``. The inputs after ``position_ids`` are named slots (``past_2`` ..
        ``past_5``: the cache inputs after the values, or streams), not ``*args``, so that torch.export binds each
        input to a parameter of its own (dynamic shapes are given one per input)."""
        rest = (past_key, past_value, past_2, past_3, past_4, past_5, *streams)
        caches, given = self._take_streams(rest)
        past_key, past_value = caches[0], caches[1]
        past_indexer_key = caches[2] if self.cache_kind == "indexed" else None
        b, s = hidden.shape[0], hidden.shape[1]
        past = 0 if past_key is None else past_key.shape[2]
        if self.cacheless:
            if past and not is_tracing():
                raise ConfigError(
                    f"this traced layer's model calls its attention without a KV cache; it takes no past "
                    f"(got {past} cached positions). Feed the whole sequence at once."
                )
            past_key = past_value = None
        if position_ids is None:
            position_ids = default_positions(b, s, past, hidden.device)
        elif not is_tracing():
            position_ids = position_ids.expand(b, s)
        if (past_key is None) != (past_value is None):
            raise ConfigError("pass both past_key and past_value, or neither.")
        position_ids, poison = self._guard(position_ids.to(torch.int64))
        hidden = poisoned(hidden, poison, 1)
        cache = None if self.cacheless else new_cache(self.cache_kind, self.layer + 1, self.cache_layer)
        own = self_attention_cache(cache)
        if own is not None and past_key is not None and past_value is not None:
            own.update(past_key.to(hidden.dtype), past_value.to(hidden.dtype), self.layer)
            self._set_states(own.layers[self.layer], caches[2:], hidden.dtype)
        if own is not None and past_indexer_key is not None:
            own.layers[self.layer].update_indexer(past_indexer_key.to(hidden.dtype))
        box = given.pop(BOX_INPUT, None)
        mask = self._mask(hidden, position_ids, past, given)
        with feeding(box_input(box, self.boxes) if box is not None and self.boxes is not None else None):
            hidden = self.embed(hidden, position_ids, past)
            window = chunk_window(self.attention) if self.cacheless else None  # Longformer's sliding chunks
            if window is not None:  # padded to the window as its model pads (posenc.trace.windows)
                hidden = pad_rows(hidden, padded_length(s, window))
                position_ids = pad_rows(position_ids, hidden.shape[1])
            attended = to_model(hidden, self.order)
            if self.block is not None:  # as the model's stack pads before its layers; the padded rows are dropped after
                attended = pad_blocks(attended, self.block)
            stem = tuple(self.stem(attended)) if self.stem is not None else ()
            args, kwargs = self._fill(self.call, hidden, position_ids, cache, mask, past, given, attended, stem)
            if window is not None:
                mark_padding(kwargs, self.call.keywords, s)
            with default_dtype(hidden.dtype), onnx_mode(self.attention):
                output = self.attention(*args, **kwargs)
        out = from_model(attention_output(output), self.order)
        if window is not None or self.block is not None:  # the rows padded to the window or to whole blocks dropped
            out = out[:, :s]
        updated = tuple(output[STREAM_OUTPUTS[key]] for key in self.stream_outputs)  # PEGASUS-X's global states
        if cache is None:
            return (out, *updated)
        entry = own.layers[self.layer]
        if self.cache_kind == "indexed":
            return out, entry.keys, entry.values, entry.indexer_keys, *updated
        return out, entry.keys, entry.values, *read_states(entry, list(self.states)), *updated

    def _set_states(self, layer: Any, given: tuple[torch.Tensor | None, ...], dtype: torch.dtype) -> None:
        """Put the given ``past_<state>`` s into the cache ``layer`` (a ``linear`` cache's; every one or none)."""
        if not self.states:
            return
        if any(value is None for value in given):
            names = ", ".join(f"past_{name}" for name in self.states)
            raise ConfigError(f"this traced layer's cache also holds {names}: pass them after past_key and past_value.")
        set_states(
            layer, {name: value.to(dtype) for name, value in zip(self.states, given, strict=True) if value is not None}
        )

    def _take_streams(self, tail: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, torch.Tensor]]:
        """Split the positional inputs after ``position_ids`` (the cache inputs :attr:`cache_inputs`, then the
        streams) into the cache inputs (padded with None) and the second streams by keyword (the last
        ``len(stream_keys)`` given)."""
        given = list(tail)
        while given and given[-1] is None:
            given.pop()
        count = len(self.stream_keys)
        if len(given) < count:
            names = ", ".join(self.stream_keys)
            raise ConfigError(f"this traced layer takes {names} after its other inputs; pass them last.")
        streams = dict(zip(self.stream_keys, given[len(given) - count :], strict=True))
        slots = len(self.cache_inputs)
        caches = given[: len(given) - count]
        if len(caches) > slots:
            raise ConfigError(
                f"this traced layer takes {slots} cache inputs ({', '.join(self.cache_inputs)}), got {len(caches)}."
            )
        return (*caches, *([None] * (slots - len(caches)))), streams

    def embed(self, hidden: torch.Tensor, position_ids: torch.Tensor, past: int) -> torch.Tensor:
        """The attention's input: ``hidden`` itself, or with an embedding step ``norms(hidden + position
        embeddings)`` or ``norms(embeddings(inputs_embeds=hidden, ...))`` (``hidden``: the token embeddings
        ``[B, S, E]``)."""
        if self.embedding is None or self.embedding_call is None:
            return hidden
        args, kwargs = self._fill(self.embedding_call, hidden, position_ids, None, None, past)
        embedded = self.embedding(*args, **kwargs).to(hidden.dtype)
        x = embedded if self.embeddings_module else hidden + embedded
        for norm in self.norms:
            x = norm(x)
        return x

    def _guard(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:func:`posenc.functional.position_guard` while exporting with the guard on; else the ids unchanged."""
        if not (self.guard_exported and is_tracing()):
            return position_ids, None
        return position_guard(position_ids, self.position_limit)


def _slot(key: str) -> str:
    """The submodule name of a derived argument's module (``"#2"`` -> ``arg2``)."""
    return f"arg{key[1:]}" if key.startswith("#") else key


__all__ = ["TracedAttention"]
