"""What a traced layer's KV cache holds: the widths of its keys and values, or why the traced unit cannot carry it.

The traced unit feeds the model's own cache back as two inputs, ``past_key [B, Hkv, P, Dk]`` and ``past_value
[B, Hkv, P, Dv]`` (the layer's ``DynamicLayer.keys`` / ``.values``), and returns them grown by the new tokens. Most
models cache up-to-date keys and values of one width (``Dk == Dv``). Two layouts differ and are carried as they are:

- values narrower or wider than keys (MiMo-V2-Flash's ``v_head_dim``);
- multi-head latent attention (MLA: DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts
  Language Model", 2024, https://arxiv.org/abs/2405.04434), whose transformers modules cache the compressed latent
  ``[B, 1, P, kv_lora_rank]`` as "keys" and the rotated shared key slice ``[B, 1, P, qk_rope_head_dim]`` as
  "values", and up-project them at every call (MiniCPM3, GLM-4-MoE-Lite, Youtu, AXK1).

DeepSeek sparse attention (DeepSeek-AI, "DeepSeek-V3.2: Pushing the Frontier of Open Large Language Models", 2025,
https://arxiv.org/abs/2512.02556) also caches its lightning indexer's keys ``[B, P, Di]``
(``DynamicIndexedLayer.indexer_keys``): the unit carries them as a third cache, ``past_indexer_key`` ->
``present_indexer_key``.

A hybrid layer's cache (transformers' ``LinearAttention*Layer``: ZAYA's compressed convolutional attention) also
holds **states of fixed size** the attention reads and rewrites at every call: convolution states ``conv_states[i]``
(the last inputs of a causal convolution, ``[B, C, K]``) and recurrent states ``recurrent_states[i]`` (``[B, ...]``).
Each filled one is a further cache input ``past_<name>`` and output ``present_<name>`` of its shape
(:class:`CacheState`, names ``conv_state_0``, ``recurrent_state_0``, ...), read from the cache layer after the
capture's call; the unit puts them in a cache layer of the model's own class (:func:`new_cache`, kind ``linear``)
before the call and reads them back after it, so a decode step runs the module on the state the model would hold.
A call given no cache inputs at all leaves the layer without previous state (the model's first call); a call given a
past (even an empty one) takes the states as given: a first call of the exported graph feeds the states the model
starts from (zeros for a convolution).

A cache layer that holds other state (:data:`EXTRA_STATE`: the prompt's keys kept apart from a sliding window of
decoded ones), or keys and values of other ranks, is refused by name: the unit's interface has no input for that
state.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from posenc.errors import ConfigError, ExportError

INDEXER = "indexer_keys"
"""The attribute of DSA's ``DynamicIndexedLayer`` holding the lightning indexer's keys ``[B, P, Di]``: carried as a
third cache (``past_indexer_key``)."""
EXTRA_STATE: dict[str, str] = {
    # Qwen4-Exp: the model, not the attention, writes them; what stops the trace is what they serve
    "indexer_position_ids": "the indexer's multi-axis positions of every cached token: the model hands this "
    "attention the rotary angles of all P + S positions, and its indexer picks each query's key blocks in a Python "
    "loop over the batch and the new tokens, sized by the mask (torch.nonzero: a data-dependent count of blocks "
    "that torch.export cannot hold in one graph)",
    "compressed_kv": "the compressed key-value entries of earlier windows of tokens (DeepSeek-V4's CSA and HCA "
    "compressors: a window of compress_rate tokens becomes one entry when it fills, so the entries' count and the "
    "buffer's length follow the cached length modulo the rate, an update one graph of dynamic lengths cannot hold)",
    "buffer_kv": "the tokens since the last full window, not yet compressed (DeepSeek-V4's CSA and HCA compressors: "
    "the buffer is folded into one compressed entry when it reaches compress_rate tokens, an update whose shapes "
    "follow the cached length modulo the rate, which one graph of dynamic lengths cannot hold)",
}
"""Attributes of transformers' cache layers that hold state beyond keys, values and indexer keys (Qwen4-Exp's indexer
positions, DeepSeek-V4's compressors: a dict of tensors per compressor), and what they hold: a layer that fills one
is refused (the unit does not carry it)."""

REFERENCE_WINDOWS: dict[str, str] = {"prefill_keys": "sliding_window"}
"""Cache layers that keep the prompt's keys apart from a sliding window over the decoded ones (Unlimited-OCR's
reference sliding-window attention, R-SWA: every prompt key stays visible, decoded keys slide): the attribute holding
the prompt's keys (``prefill_keys``, beside ``prefill_values``) -> the config field of the window ``W``. Which keys
stay visible depends on which call was the prompt, which a cache of positions cannot say; but below ``W`` positions
no key is evicted and every key is visible, so there the layer is a plain causal cache: the unit carries the prompt's
and the decoded keys as one concatenated cache and the graph serves positions below ``W`` (guarded,
:func:`posenc.export.trace.export_traced`)."""


ENCODER_CACHES: dict[str, tuple[str | None, str]] = {
    "xlm": ("causal", "XLM's model is an encoder (XLMModel refuses is_encoder=False) whose forward makes an "
            "EncoderDecoderCache itself and hands it to every attention; without its causal mask it cuts its padding "
            "mask to the new tokens, so its attention extends a cache by one token at a time only"),
    "flaubert": ("causal", "FlauBERT's model is XLM's: an encoder whose forward makes a cache itself and, without "
                 "its causal mask, cuts the padding mask to the new tokens (one token per cached step only)"),
    "cpmant": (None, "CPM-Ant's forward prepends its prompt tokens again at every call and slices its embeddings, "
               "bias and mask by the cache's length, so a call over a filled cache is not the next tokens' (its "
               "attention is traced as it runs on a whole sequence: prompt and text without padding)"),
}  # fmt: skip
"""Model types traced without a KV cache although their forward hands the attention one: ``model_type -> (config
flag that keeps the cache (None: none does), why)``. Their attention, unless the flag is set, cannot extend the cache
by several tokens (CPM-Ant's forward cannot run over a filled one at all), so a unit with a past would not be what the
model computes; it is traced as called on a whole sequence (the cache the model made is empty on that call, and the
capture's probe, which calls the module with a fresh one, checks the unit against it)."""


def encoder_cache(hf: Any) -> bool:
    """Whether ``hf``'s layer is traced without the cache its forward makes (:data:`ENCODER_CACHES`)."""
    entry = ENCODER_CACHES.get(str(getattr(hf, "model_type", "")))
    return entry is not None and (entry[0] is None or not getattr(hf, entry[0], False))


STATE_LISTS: dict[str, str] = {"conv_state": "conv_states", "recurrent_state": "recurrent_states"}
"""State name prefix -> the attribute of transformers' ``LinearAttentionCacheLayerMixin`` holding those states by
index (``{i: tensor}``): a convolution's last inputs, a recurrence's state."""
_INITIALIZED = {"conv_states": "is_conv_states_initialized", "recurrent_states": "is_recurrent_states_initialized"}


@dataclasses.dataclass(frozen=True)
class CacheState:
    """One fixed-size state a cache layer holds beside its keys and values: ``name`` (``conv_state_0``: the graph's
    ``past_conv_state_0`` / ``present_conv_state_0``) and its shape after the batch axis."""

    name: str
    shape: tuple[int, ...]

    @property
    def location(self) -> tuple[str, int]:
        """The cache layer's attribute and index holding it (``("conv_states", 0)``)."""
        prefix, _, index = self.name.rpartition("_")
        return STATE_LISTS[prefix], int(index)


def cache_states(layer: Any) -> tuple[CacheState, ...]:
    """The filled fixed-size states of a transformers cache layer (:data:`STATE_LISTS`), in name order."""
    found = []
    for prefix, attribute in STATE_LISTS.items():
        for index, value in sorted((getattr(layer, attribute, None) or {}).items()):
            if _filled(value):
                found.append(CacheState(f"{prefix}_{index}", tuple(int(d) for d in value.shape[1:])))
    return tuple(found)


def set_states(layer: Any, states: dict[str, Any]) -> None:
    """Put ``states`` (name -> ``[B, ...]`` tensor) into a fresh linear-attention cache ``layer`` as the state of an
    earlier call (``has_previous_state``), copies so the layer's in-place updates leave the inputs as they were."""
    for name, value in states.items():
        attribute, index = CacheState(name, ()).location
        getattr(layer, attribute)[index] = value.clone()
        getattr(layer, _INITIALIZED[attribute])[index] = True
        layer.has_previous_state[index] = True
        if attribute == "conv_states":
            layer.conv_kernel_size[index] = int(value.shape[-1])
        layer.dtype, layer.device = value.dtype, value.device


def read_states(layer: Any, names: list[str]) -> list[Any]:
    """The states ``names`` of a cache layer after the call (its ``present_<name>`` outputs)."""
    out = []
    for name in names:
        attribute, index = CacheState(name, ()).location
        out.append(getattr(layer, attribute)[index])
    return out


@dataclasses.dataclass(frozen=True)
class CacheWidths:
    """The layout of a layer's cache ``keys [B, Hkv, P, key_dim]``, ``values [B, Hkv, P, value_dim]``."""

    kv_heads: int
    key_dim: int
    value_dim: int
    indexer_dim: int | None = None
    """The width of the lightning indexer's keys ``[B, P, Di]`` the layer also caches (DSA), else None."""
    window_field: str | None = None
    """The config field of the window below which a reference sliding-window layer is a plain cache
    (:data:`REFERENCE_WINDOWS`), else None."""
    states: tuple[CacheState, ...] = ()
    """The fixed-size states the layer also caches (a hybrid layer's convolution and recurrent states)."""

    @property
    def same(self) -> bool:
        """Whether keys and values have one width (the layout of posenc's own blocks)."""
        return self.key_dim == self.value_dim


def cache_widths(layer: Any, index: int, model_type: str) -> CacheWidths:
    """The :class:`CacheWidths` of a transformers cache layer after the capture call filled it. Values may be zero
    wide: an MLA layer without RoPE (Mistral Large 4's NoPE layers, ``qk_rope_head_dim`` 0 there) caches its empty
    rotated key slice ``[B, 1, P, 0]`` as values, and the unit carries it as the model holds it.

    Args:
        layer: ``cache.layers[index]`` (a ``DynamicLayer`` or a subclass).
        index: the layer index (for messages).
        model_type: the model's type (for messages).

    Raises:
        ExportError: the layer also caches other state, or its keys and values are not 4-D tensors with one batch,
            head count and length.
    """
    extra = [name for name in EXTRA_STATE if _filled_any(getattr(layer, name, None))]
    if extra:
        raise ExportError(
            f"layer {index}'s cache of this {model_type} model ({type(layer).__name__}) holds {extra[0]} beside its "
            f"keys and values ({EXTRA_STATE[extra[0]]}); the traced unit carries keys, values, a DSA layer's indexer "
            f"keys and a hybrid layer's convolution and recurrent states only (past_key, past_value, past_<state>), so "
            f"this attention cannot be traced yet."
        )
    keys: Any = getattr(layer, "keys", None)
    values: Any = getattr(layer, "values", None)
    window = next((name for name in REFERENCE_WINDOWS if _filled(getattr(layer, name, None))), None)
    if window is not None:  # the capture's call was the prompt: its keys and values are all prefill ones
        keys = layer.prefill_keys if not _filled(keys) else torch.cat([layer.prefill_keys, keys], -2)
        values = layer.prefill_values if not _filled(values) else torch.cat([layer.prefill_values, values], -2)
    if not (_filled(keys) and hasattr(values, "dim") and keys.dim() == 4 and values.dim() == 4
            and keys.shape[:3] == values.shape[:3]):  # fmt: skip
        got = f"keys {_shape(keys)}, values {_shape(values)}"
        raise ExportError(
            f"layer {index}'s cache of this {model_type} model ({type(layer).__name__}) does not hold keys "
            f"[B, Hkv, P, Dk] and values [B, Hkv, P, Dv] ({got}); the traced path exports that cache layout only."
        )
    indexer: Any = getattr(layer, INDEXER, None)
    if _filled(indexer) and not (indexer.dim() == 3 and indexer.shape[:2] == (keys.shape[0], keys.shape[2])):
        raise ExportError(
            f"layer {index}'s cache of this {model_type} model ({type(layer).__name__}) holds indexer keys "
            f"{_shape(indexer)}, not [B, P, Di] beside keys {_shape(keys)}; the traced path carries that layout only."
        )
    width = int(indexer.shape[2]) if _filled(indexer) else None
    states = cache_states(layer)
    field = REFERENCE_WINDOWS[window] if window is not None else None
    return CacheWidths(int(keys.shape[1]), int(keys.shape[3]), int(values.shape[3]), width, field, states)


def _filled(value: Any) -> bool:
    return hasattr(value, "dim") and value.numel() > 0


def _filled_any(value: Any) -> bool:
    """A filled tensor, or a dict holding one (state per compressor)."""
    return _filled(value) or (isinstance(value, dict) and any(_filled(item) for item in value.values()))


def _shape(value: Any) -> str:
    return str(list(value.shape)) if hasattr(value, "shape") else repr(value)


CACHE_KINDS = ("dynamic", "encoder-decoder", "indexed", "linear")
"""The KV caches a traced attention is called with: transformers' ``DynamicCache``, the ``EncoderDecoderCache``
of an encoder-decoder's decoder (its self-attention part holds the layer's keys and values; Moonshine's attention
reads its ``is_updated``), a ``DynamicCache`` of ``DynamicIndexedLayer`` s (DeepSeek sparse attention: each layer
also holds its lightning indexer's keys, :mod:`posenc.trace.caches`), or a ``DynamicCache`` whose layer is a
hybrid one (``LINEAR_LAYERS``: keys and values beside convolution and recurrent states)."""

LINEAR_LAYERS: dict[str, str] = {
    "LinearAttentionAndFullAttentionLayer": "LinearAttentionAndFullAttentionLayer",
    "LinearAttentionAndSlidingWindowAttentionLayer": "LinearAttentionAndFullAttentionLayer",
}
"""The hybrid cache layer classes of ``transformers.cache_utils`` a ``linear`` cache is captured with -> the class
the unit rebuilds it as. A sliding window's layer keeps only its last ``window - 1`` keys; the unit, as for every
traced sliding layer, carries the concatenated cache (keys at positions ``0 .. P - 1``) and its mask hides the keys
outside the window, so it is rebuilt as the full layer, whose states are the same."""


def cache_kind(cache: Any, layer: int | None = None) -> str:
    """The :data:`CACHE_KINDS` entry of a captured cache (``layer``: the traced layer, whose class decides a hybrid
    cache)."""
    if hasattr(cache, "self_attention_cache"):
        return "encoder-decoder"
    layers = getattr(cache, "layers", None) or []  # None: an attention called without a cache
    if layer is not None and layer < len(layers) and hasattr(layers[layer], "conv_states"):
        return "linear"
    return "indexed" if any(hasattr(entry, "update_indexer") for entry in layers) else "dynamic"


def linear_layer(cache: Any, layer: int, model_type: str) -> str:
    """The class a hybrid cache's ``layer`` is rebuilt as (:data:`LINEAR_LAYERS`).

    Raises:
        ExportError: a class not listed there (a static cache's, preallocated to a length).
    """
    name = type(cache.layers[layer]).__name__
    if name not in LINEAR_LAYERS:
        raise ExportError(
            f"layer {layer}'s cache of this {model_type} model is a {name}; the traced unit rebuilds the hybrid cache "
            f"layers {list(LINEAR_LAYERS)} only, so this attention cannot be traced yet."
        )
    return LINEAR_LAYERS[name]


def new_cache(kind: str, layers: int = 0, layer_class: str | None = None) -> Any:
    """An empty cache of ``kind`` (:data:`CACHE_KINDS`); an ``indexed`` one holds ``layers`` indexed layers (the
    indexer's keys are written before the layer's keys and values, so its layer must exist), a ``linear`` one
    ``layers`` layers of ``layer_class`` (:data:`LINEAR_LAYERS`: the attention reads its states before writing)."""
    from posenc.checkpoints.reference import import_transformers

    transformers = import_transformers()
    if kind == "encoder-decoder":
        return transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache())
    if kind not in CACHE_KINDS:
        raise ConfigError(f"unknown cache kind {kind!r} in a trace record (one of {list(CACHE_KINDS)}); re-export.")
    cache = transformers.DynamicCache()
    if kind == "indexed":
        from transformers.cache_utils import DynamicIndexedLayer

        cache.layer_class_to_replicate = DynamicIndexedLayer
        cache.layers.extend(DynamicIndexedLayer() for _ in range(layers))
    if kind == "linear":
        from transformers import cache_utils

        if layer_class is None or layer_class not in LINEAR_LAYERS.values():
            raise ConfigError(f"a linear cache of layers {layer_class!r} (not a class posenc rebuilds); re-export.")
        made = getattr(cache_utils, layer_class)
        cache.layers.extend(made(number_of_states=4) for _ in range(layers))
    return cache


__all__ = [
    "CACHE_KINDS",
    "ENCODER_CACHES",
    "EXTRA_STATE",
    "INDEXER",
    "LINEAR_LAYERS",
    "REFERENCE_WINDOWS",
    "STATE_LISTS",
    "CacheState",
    "CacheWidths",
    "cache_kind",
    "cache_states",
    "cache_widths",
    "encoder_cache",
    "linear_layer",
    "new_cache",
    "read_states",
    "set_states",
]
