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
``present_indexer_key``. A cache layer that holds other state (:data:`EXTRA_STATE`: the prompt's keys kept apart
from a sliding window of decoded ones), or keys and values of other ranks, is refused by name: the unit's interface
has no input for that state.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from posenc.errors import ConfigError, ExportError

INDEXER = "indexer_keys"
"""The attribute of DSA's ``DynamicIndexedLayer`` holding the lightning indexer's keys ``[B, P, Di]``: carried as a
third cache (``past_indexer_key``)."""
EXTRA_STATE: dict[str, str] = {
    "indexer_position_ids": "the indexer's multi-axis positions",
    # Unlimited-OCR's reference sliding window (R-SWA): its mask depends on the prompt's length, not on positions
    "prefill_keys": "the prompt's keys and values, kept apart from a sliding window of decoded ones: every prompt key "
    "stays visible while the decoded keys slide, a mask that depends on the prompt's length",
    "compressed_kv": "the compressed key-value entries of earlier windows of tokens (DeepSeek-V4's CSA and HCA "
    "compressors)",
    "buffer_kv": "the tokens since the last full window, not yet compressed (DeepSeek-V4's CSA and HCA compressors)",
}
"""Attributes of transformers' cache layers that hold state beyond keys, values and indexer keys (Unlimited-OCR's
reference sliding window, DeepSeek-V4's compressors: a dict of tensors per compressor), and what they hold: a layer
that fills one is refused (the unit does not carry it)."""


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


@dataclasses.dataclass(frozen=True)
class CacheWidths:
    """The layout of a layer's cache ``keys [B, Hkv, P, key_dim]``, ``values [B, Hkv, P, value_dim]``."""

    kv_heads: int
    key_dim: int
    value_dim: int
    indexer_dim: int | None = None
    """The width of the lightning indexer's keys ``[B, P, Di]`` the layer also caches (DSA), else None."""

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
            f"keys and values ({EXTRA_STATE[extra[0]]}); the traced unit carries keys, values and indexer keys only "
            f"(past_key, past_value, past_indexer_key), so this attention cannot be traced yet."
        )
    keys: Any = getattr(layer, "keys", None)
    values: Any = getattr(layer, "values", None)
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
    return CacheWidths(int(keys.shape[1]), int(keys.shape[3]), int(values.shape[3]), width)


def _filled(value: Any) -> bool:
    return hasattr(value, "dim") and value.numel() > 0


def _filled_any(value: Any) -> bool:
    """A filled tensor, or a dict holding one (state per compressor)."""
    return _filled(value) or (isinstance(value, dict) and any(_filled(item) for item in value.values()))


def _shape(value: Any) -> str:
    return str(list(value.shape)) if hasattr(value, "shape") else repr(value)


CACHE_KINDS = ("dynamic", "encoder-decoder", "indexed")
"""The KV caches a traced attention is called with: transformers' ``DynamicCache``, the ``EncoderDecoderCache``
of an encoder-decoder's decoder (its self-attention part holds the layer's keys and values; Moonshine's attention
reads its ``is_updated``), or a ``DynamicCache`` of ``DynamicIndexedLayer`` s (DeepSeek sparse attention: each layer
also holds its lightning indexer's keys, :mod:`posenc.trace.caches`)."""


def cache_kind(cache: Any) -> str:
    """The :data:`CACHE_KINDS` entry of a captured cache."""
    if hasattr(cache, "self_attention_cache"):
        return "encoder-decoder"
    layers = getattr(cache, "layers", ())  # None: an attention called without a cache
    return "indexed" if any(hasattr(layer, "update_indexer") for layer in layers) else "dynamic"


def new_cache(kind: str, layers: int = 0) -> Any:
    """An empty cache of ``kind`` (:data:`CACHE_KINDS`); an ``indexed`` one holds ``layers`` indexed layers (the
    indexer's keys are written before the layer's keys and values, so its layer must exist)."""
    from posenc.checkpoints.reference import import_transformers

    transformers = import_transformers()
    if kind == "encoder-decoder":
        return transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache())
    if kind not in ("dynamic", "indexed"):
        raise ConfigError(f"unknown cache kind {kind!r} in a trace record (one of {list(CACHE_KINDS)}); re-export.")
    cache = transformers.DynamicCache()
    if kind == "indexed":
        from transformers.cache_utils import DynamicIndexedLayer

        cache.layer_class_to_replicate = DynamicIndexedLayer
        cache.layers.extend(DynamicIndexedLayer() for _ in range(layers))
    return cache


__all__ = [
    "CACHE_KINDS",
    "ENCODER_CACHES",
    "EXTRA_STATE",
    "INDEXER",
    "CacheWidths",
    "cache_kind",
    "cache_widths",
    "encoder_cache",
    "new_cache",
]
