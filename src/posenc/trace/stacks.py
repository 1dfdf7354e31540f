"""The stacks of an encoder-decoder model on the traced path: which layer list a layer index counts in, how the
model is cut to it, where a layer's self-attention sits, and how the capture forward runs one stack alone.

An encoder-decoder checkpoint (``config.is_encoder_decoder``: BART-likes, T5-likes, Whisper, ...) has two layer
stacks, each numbered from 0; ``--layer-type encoder`` / ``decoder`` (default ``encoder``, as the BART family's)
picks one. The capture builds the model with that stack cut to layers ``0 .. N`` (the other stack to one layer:
it never runs) and calls the stack's own module (``model.encoder`` / ``model.decoder``) on token ids, or on the
features a speech encoder takes; the decoder runs without encoder states, so its self-attention is called exactly
as in the whole model while its cross-attention (which reads the encoder's output, not positions) is skipped.
Only self-attention is traced: a layer's cross-attention is left out by name (``encoder_attn``,
``EncDecAttention``, ``*CrossAttention``).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
from torch import nn

from posenc.errors import ConfigError
from posenc.trace.record import TracePart

STACKS = ("encoder", "decoder")
"""The stacks of an encoder-decoder model, as ``--layer-type`` names them."""
DEFAULT_STACK = "encoder"
"""The stack a layer of an encoder-decoder model is in when no ``--layer-type`` is given (as the BART family's)."""
COUNT_FIELDS: dict[str, tuple[str, ...]] = {
    "encoder": ("encoder_layers", "num_encoder_layers", "encoder_num_hidden_layers", "num_layers", "num_hidden_layers"),
    "decoder": ("decoder_layers", "num_decoder_layers", "decoder_num_hidden_layers", "num_hidden_layers", "num_layers"),
}
"""Config fields holding a stack's layer count, first found wins (BART: ``encoder_layers``; T5: ``num_layers`` and
``num_decoder_layers``; Moonshine: ``encoder_num_hidden_layers``; ProphetNet: ``num_encoder_layers``)."""
CONTEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "encoder": ("max_source_positions", "max_encoder_position_embeddings", "encoder_max_position_embeddings"),
    "decoder": ("max_target_positions", "max_decoder_position_embeddings", "decoder_max_position_embeddings"),
}
"""Config fields holding a stack's own context length, where it differs from ``max_position_embeddings`` (Whisper:
1500 encoder frames, 448 decoder tokens)."""
_CROSS = re.compile(r"cross|encoder_attn|encdec", re.IGNORECASE)
"""Names of cross-attention modules (a child name or a class name), left out of a stack's self-attention."""
_ATTENTION = re.compile(r"Attention")


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


def self_attention_cache(cache: Any) -> Any:
    """The part of ``cache`` that holds the self-attention's keys and values (the cache itself, or an
    encoder-decoder cache's ``self_attention_cache``)."""
    return getattr(cache, "self_attention_cache", cache)


OUTSIDE_PART = "stack embeddings"
"""The positional part of a stack whose positions enter at its embeddings in a way the unit cannot start from
(MBart's ``layernorm_embedding`` after the sum, a table read by shape): outside the traced unit, said so."""
_POSITION_MODULE = re.compile(r"(embed_positions|position_embeddings?|pos_emb\w*|positional_encoding|wpe)$")


def positions_outside(called: list[str], list_path: str) -> str | None:
    """The module (of those ``called`` before the layer, outside the layer list at ``list_path``) that embeds
    positions by its name, or None."""
    stack = list_path.rsplit(".", 1)[0] + "." if "." in list_path else ""
    for name in called:
        if name.startswith(stack) and not name.startswith(list_path + ".") and _POSITION_MODULE.search(name):
            return name
    return None


_POSITION_BUFFER = re.compile(r"(^|\.)(pos_encoding|positional_encoding|pos_emb\w*|position_embeddings?)$")


def position_buffer(model: Any, list_path: str) -> str | None:
    """A buffer of ``model`` outside the layer list at ``list_path`` named as a position table, or None: CTRL's
    ``pos_encoding``, whose rows (read by the position ids) its forward adds to the embeddings itself, with no module
    posenc could call as the unit's embedding step."""
    for name, _ in model.named_buffers():
        if not name.startswith(list_path + ".") and _POSITION_BUFFER.search(name):
            return name
    return None


def outside_parts(outside: str | None) -> tuple[TracePart, ...]:
    """The manifest's part for positions added at a stack's embeddings outside the unit (``outside``: the module),
    or none."""
    if outside is None:
        return ()
    detail = (f"the positions enter at {outside} before layer 0, outside this unit (it starts at the token "
              f"embeddings only where the layer's input is their sum with a module's output on the position ids, "
              f"then the layer's norms); the graph is the attention alone, fed the embedded states")  # fmt: skip
    return (TracePart(OUTSIDE_PART, "absent", detail),)


def stack_view(data: dict[str, Any], stack: str | None) -> dict[str, Any]:
    """A config dict as one stack sees it: each ``<stack>_<field>`` also as ``<field>`` where that is absent
    (Moonshine's ``decoder_num_attention_heads`` -> ``num_attention_heads``), so the config's positional scheme
    imports for the stack's geometry."""
    if stack is None:
        return data
    prefix = f"{stack}_"
    return {**{k[len(prefix) :]: v for k, v in data.items() if k.startswith(prefix)}, **data}


BIAS_PART = "relative position bias"
"""T5's bucketed relative bias (UMT5, Switch Transformers, Pop2Piano, LongT5's decoder, ...), computed inside the
attention module from the query and key positions the model derives from the sequence length and the cache."""


def bias_parts(attention: nn.Module) -> tuple[TracePart, ...]:
    """The manifest's part for a relative position bias the attention computes itself (a ``relative_attention_bias``
    table), kept as traced; none without one."""
    table = getattr(attention, "relative_attention_bias", None)
    if not isinstance(table, nn.Embedding):
        return ()
    detail = (f"the module's bucketed table {list(table.weight.shape)} gathered at key - query offsets, as the model "
              f"computes them from the sequence length and the cache (posenc recomputes no learned table)")  # fmt: skip
    return (TracePart(BIAS_PART, "kept", detail),)


def stack_of(hf: Any, layer_type: str | None) -> str | None:
    """The stack ``layer_type`` picks in an encoder-decoder config (default :data:`DEFAULT_STACK`, where the config
    counts its layers); None for a model with one stack, or where ``layer_type`` is one of the config's own
    ``layer_types``.

    Raises:
        ConfigError: an encoder-decoder model and a layer type that is neither a stack nor one of its layer types.
    """
    if not getattr(hf, "is_encoder_decoder", False):
        return None
    if layer_type is not None and layer_type in (getattr(hf, "layer_types", None) or []):
        return None
    if layer_type is None:  # the default stack where the config counts its layers (else: one stack, as before)
        return DEFAULT_STACK if _count_field(hf, DEFAULT_STACK) is not None else None
    if layer_type not in STACKS:
        raise ConfigError(
            f"this {hf.model_type} model is an encoder-decoder; --layer-type picks its stack: one of {list(STACKS)}, "
            f"not {layer_type!r}."
        )
    return layer_type


def _count_field(hf: Any, stack: str) -> str | None:
    for name in COUNT_FIELDS[stack]:
        value = getattr(hf, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name
    return None


def stack_layer_count(hf: Any, stack: str) -> int:
    """The layer count of ``stack`` in ``hf``.

    Raises:
        ConfigError: the config names none (:data:`COUNT_FIELDS`).
    """
    name = _count_field(hf, stack)
    if name is None:
        raise ConfigError(
            f"the {hf.model_type} config names no {stack} layer count ({' / '.join(COUNT_FIELDS[stack])}); "
            f"posenc cannot pick a layer of its {stack}."
        )
    return int(getattr(hf, name))


def stack_context(hf: Any, stack: str | None) -> int | None:
    """The context length of ``stack`` where the config gives the stack its own (:data:`CONTEXT_FIELDS`), else
    None (the model's ``max_position_embeddings`` holds)."""
    for name in CONTEXT_FIELDS.get(stack or "", ()):
        value = getattr(hf, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def cut_stack(config: Any, stack: str, layers: int) -> None:
    """Cut ``config`` (a copy) to ``layers`` layers of ``stack`` and one layer of the other stack (never run)."""
    own = _count_field(config, stack)
    other = _count_field(config, STACKS[1 - STACKS.index(stack)])
    if own is not None and layers < int(getattr(config, own)):
        setattr(config, own, layers)
    if other is not None and other != own:
        setattr(config, other, 1)


def stack_layers(model: nn.Module, stack: str, count: int) -> tuple[str, nn.ModuleList]:
    """``(path, ModuleList)`` of the ``stack``'s layers in the base model (``encoder.layers``, ``decoder.block``,
    ...): a list of at least ``count`` layers (the model may be built uncut) under a module named after the stack,
    the shortest path first.

    Raises:
        ConfigError: none is found.
    """
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        and len(module) >= count
        and any(stack in part for part in name.split(".")[:-1])
        and not any(other in part for part in name.split(".") for other in STACKS if other != stack)
    ]
    found.sort(key=lambda item: len(item[0]))
    if not found:
        raise ConfigError(f"cannot find the {count} {stack} layers of {type(model).__name__}; posenc cannot trace it.")
    return found[0]


def nested_self_attention(layer: nn.Module) -> tuple[str, nn.Module] | None:
    """A layer's self-attention module held deeper than its children (T5's ``layer.0.SelfAttention``): the first
    innermost module whose class names attention, outside any cross-attention; ``(dotted path, module)`` or None."""
    cross: list[str] = []
    candidates: list[tuple[str, nn.Module]] = []
    for name, module in layer.named_modules():
        if not name:
            continue
        if any(name == c or name.startswith(c + ".") for c in cross):
            continue
        cls = type(module).__name__
        if _CROSS.search(name.rsplit(".", 1)[-1]) or _CROSS.search(cls):
            cross.append(name)
            continue
        if _ATTENTION.search(cls) and "Norm" not in cls.split("Attention")[-1] and "Rotary" not in cls:
            candidates.append((name, module))
    inner = [(n, m) for n, m in candidates if not any(o.startswith(n + ".") for o, _ in candidates)]
    return inner[0] if inner else None


def stack_module(model: nn.Module, list_path: str) -> nn.Module:
    """The module of the stack whose layer list is at ``list_path`` (``encoder.layers`` -> ``encoder``)."""
    parent = list_path.rsplit(".", 1)[0] if "." in list_path else ""
    return model.get_submodule(parent) if parent else model


def stack_inputs(runner: nn.Module, hf: Any, tokens: int) -> list[dict[str, Any]]:
    """Candidate main inputs of a stack's forward that takes no token ids: a speech encoder's features, seeded, in
    the layouts speech encoders use (``input_features [1, bins, frames]`` at Whisper's fixed length ``2 ·
    max_source_positions``, ``[1, bins, 16·tokens]``, ``[1, 16·tokens, bins]``; ``input_values [1, 400·tokens]``);
    empty where it takes token ids (the caller tries those)."""
    accepts = inspect.signature(runner.forward).parameters
    if "input_ids" in accepts:
        return []
    generator = torch.Generator().manual_seed(0)
    frames = 16 * tokens
    if "input_features" in accepts:
        channels = int(getattr(hf, "input_channels", 1) or 1)
        per_channel = getattr(hf, "input_feat_per_channel", None)
        bins = int(getattr(hf, "num_mel_bins", None) or (per_channel and per_channel * channels) or 80)
        shapes = [(1, bins, frames), (1, frames, bins)]
        fixed = int(getattr(hf, "max_source_positions", 0) or 0) * 2
        if 0 < fixed <= 4096:
            shapes.insert(0, (1, bins, fixed))
        return [{"input_features": torch.randn(shape, generator=generator)} for shape in shapes]
    if "input_values" in accepts:
        return [{"input_values": torch.randn(1, 400 * tokens, generator=generator)}]
    return []


__all__ = [
    "BIAS_PART",
    "CACHE_KINDS",
    "COUNT_FIELDS",
    "DEFAULT_STACK",
    "OUTSIDE_PART",
    "STACKS",
    "bias_parts",
    "cache_kind",
    "cut_stack",
    "nested_self_attention",
    "new_cache",
    "outside_parts",
    "position_buffer",
    "positions_outside",
    "self_attention_cache",
    "stack_context",
    "stack_inputs",
    "stack_layer_count",
    "stack_layers",
    "stack_module",
    "stack_of",
    "stack_view",
]
