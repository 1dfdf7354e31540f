"""What an instantiated transformers model shows of its positions and layers: the census's own reading of a type.

:func:`read_anatomy` walks the text part of a model (the submodule whose config is the text config; vision and
audio towers left out) and finds:

- **the positional scheme**, from the modules and parameters transformers built (never from posenc):

  ==========================  ============================================================================
  RoPE                        a rotary module (class name ``*Rotary*`` / ``*RoPE*``, or an ``inv_freq`` buffer),
                              or rotary settings in the config (``rotary_dim``, ``rotary_pct``)
  ALiBi                       the modeling source builds ALiBi slopes and the config does not turn them off
  T5 relative bias            a ``relative_attention_bias`` embedding
  disentangled (DeBERTa)      ``rel_embeddings`` beside a ``*Disentangled*`` attention
  Transformer-XL relative     ``r_w_bias`` / ``r_r_bias`` parameters
  learned absolute            a trainable position embedding (``position_embeddings``, ``embed_positions``, ``wpe``;
                              Reformer's axial one)
  sinusoidal                  a ``*Sinusoidal*`` module, or a frozen position table
  NoPE                        attention and none of the above
  none (no attention)         no attention module, or a config without attention heads
  ==========================  ============================================================================

- **the layer stacks and layer kinds**: the top-most ``ModuleList`` s of layers in the text part (an
  encoder-decoder's ``encoder`` and ``decoder`` stacks, else its longest one); a layer's kind is its class, the
  classes of its attention modules and its entries in the config's per-layer lists
  (:func:`posenc.census.tiny.layer_kinds`). A kind without an attention module is not exported.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from collections.abc import Iterator
from typing import Any

from torch import nn

from posenc.census.tiny import layer_kinds
from posenc.trace.counts import nested_attentions
from posenc.trace.model import attention_layers

SCHEMES = (
    "RoPE",
    "RoPE / ALiBi",
    "ALiBi",
    "T5 relative bias",
    "disentangled (DeBERTa)",
    "Transformer-XL relative",
    "learned absolute",
    "sinusoidal",
    "other relative",
    "NoPE",
    "none (no attention)",
)
"""The positional schemes of the census, in the order of its tables."""
_ATTENTION = re.compile(r"Attention|Attn|MLA$", re.IGNORECASE)
_ROTARY = re.compile(r"Rotary|RoPE", re.IGNORECASE)
_POSITION_TABLE = re.compile(
    r"(position_embeddings?|embed_positions|positions_embed|(^|\.)wpe|pos_emb\w*|position_embedder)$"
)
_HEADS_FIELD = re.compile(r"heads$|^n_head$")
_OTHER_MODALITY = re.compile(r"Vision|Visual|Image|Audio|Speech|Video|Pixel|Codec|Vq|Mel|Acoustic|Wav|Siglip|Clip|Vit")
_TABLE_CLASS = re.compile(r"Positional|Sinusoid")
"""An ``inv_freq`` buffer in such a class builds an added table (BROS's box embedding), not a rotation."""
_SINUSOID_BUFFER = re.compile(r"^(pos_encoding|positional_encoding|pe|sinusoids?|position_embeddings?|pos_emb\w*)$")
_RELATIVE_CLASS = re.compile(r"Relative|RelPos")


@dataclasses.dataclass(frozen=True)
class LayerKind:
    """One kind of layer of a stack, and the first layer of that kind.

    Attributes:
        stack: ``encoder`` / ``decoder`` for an encoder-decoder's stacks, else None.
        layer: the index of the first layer of this kind in its stack.
        label: what makes the kind (layer class, attention classes, per-layer config entries).
        attention: whether the layer holds a softmax self-attention module (a kind without one is not exported).
        count: how many layers of the stack are of this kind.
        skipped: why a kind without one is not exported (no attention module, cross-attention alone, a
            linear-attention / state-space layer by ``layer_types``, no attention heads); empty otherwise.
    """

    stack: str | None
    layer: int
    label: str
    attention: bool
    count: int
    skipped: str = ""


@dataclasses.dataclass(frozen=True)
class Anatomy:
    """The census's reading of one model (see the module docstring).

    Attributes:
        scheme: one of :data:`SCHEMES`.
        evidence: what the scheme was read from (module paths, class names, config fields).
        kinds: the layer kinds of the text part, per stack.
    """

    scheme: str
    evidence: tuple[str, ...]
    kinds: tuple[LayerKind, ...]


def text_part(model: nn.Module, text_config: Any) -> tuple[str, nn.Module]:
    """``(path, module)`` of the model's text part: the first submodule whose ``config`` is the text config."""
    for name, module in model.named_modules():
        config = getattr(module, "config", None)
        if config is text_config:
            return name, module
    for name, module in model.named_modules():  # copies of the text config (T5's stacks, ...)
        if type(getattr(module, "config", None)) is type(text_config):
            return name, module
    return "", model


def _own_modules(root: nn.Module, text_config: Any) -> Iterator[tuple[str, nn.Module]]:
    """``root``'s submodules, leaving out the towers of other modalities: a subtree whose module holds a config of
    another class and whose config or module class names a vision, audio or codec part."""
    foreign: list[str] = []
    for name, module in root.named_modules():
        if any(name == f or name.startswith(f + ".") for f in foreign):
            continue
        config = getattr(module, "config", None)
        other = config is not None and hasattr(config, "model_type") and type(config) is not type(text_config)
        if name and other and config is not text_config:
            names = f"{type(config).__name__} {type(module).__name__}"
            if _OTHER_MODALITY.search(names):
                foreign.append(name)
                continue
        yield name, module


def _stacks(root: nn.Module, text_config: Any) -> list[tuple[str, list[nn.Module]]]:
    """Top-most ``ModuleList`` s whose entries hold attention or are named ``*Layer`` / ``*Block`` (not norms),
    those holding attention first."""
    found: list[tuple[str, list[nn.Module]]] = []
    for name, module in _own_modules(root, text_config):
        if not isinstance(module, nn.ModuleList) or not len(module):
            continue
        if any(name.startswith(prefix + ".") for prefix, _ in found):
            continue
        layers: list[nn.Module] = []
        for entry in module:
            layers.extend(entry if isinstance(entry, nn.ModuleList) else [entry])
        names = [type(layer).__name__ for layer in layers]
        layer_like = all(re.search(r"Layer|Block", n) and not n.endswith("Norm") for n in names)
        if layer_like or _holds_attention(layers):
            found.append((name, layers))
    return sorted(found, key=lambda stack: not _holds_attention(stack[1]))


def _holds_attention(layers: list[nn.Module]) -> bool:
    return any(_ATTENTION.search(type(m).__name__) for layer in layers for m in layer.modules())


def _stack_label(path: str, encoder_decoder: bool) -> str | None:
    if not encoder_decoder:
        return None
    parts = path.split(".")
    if any("decoder" in p for p in parts):
        return "decoder"
    if any("encoder" in p for p in parts):
        return "encoder"
    return None


def _attention_classes(layer: nn.Module) -> tuple[str, ...]:
    # The layer's own class counts only where the layer is the attention (XLM keeps its attentions in a list of
    # their own); a decoder layer named "...AttentionDecoderLayer" is not.
    own = [] if re.search(r"Layer|Block", type(layer).__name__) else [layer]
    names = [
        type(m).__name__
        for name, m in layer.named_modules()
        if (name or m in own) and _ATTENTION.search(type(m).__name__)
    ]
    return tuple(dict.fromkeys(names))


_CROSS = re.compile(r"Cross", re.IGNORECASE)


def cross_only(classes: tuple[str, ...]) -> bool:
    """Whether a layer's attention modules are all cross-attention (Mllama's ``MllamaTextCrossAttention`` layers attend
    to the vision encoder's states): not a self-attention layer of the text model, so not exported."""
    return bool(classes) and all(_CROSS.search(name) for name in classes)


def _skip_reason(classes: tuple[str, ...], layer: int, softmax: list[int] | None) -> str:
    """Why a layer kind with these attention ``classes`` is not exported (``softmax``: the layers ``layer_types``
    gives softmax attention, None where it does not say); empty where it is."""
    if not classes:
        return "no attention module in this layer"
    if cross_only(classes):
        return ("cross-attention only: it attends to another model's states (an image encoder's), not a "
                "self-attention layer of the text model")  # fmt: skip
    if softmax is not None and layer not in softmax:
        return "no softmax attention: a linear-attention or state-space layer by its layer_types entry"
    return ""


def layer_stacks(model: nn.Module, text_config: Any) -> list[LayerKind]:
    """The layer kinds of the text part (see the module docstring)."""
    _, root = text_part(model, text_config)
    encoder_decoder = bool(getattr(text_config, "is_encoder_decoder", False))
    stacks = _stacks(root, text_config)
    if encoder_decoder:
        stacks = [s for s in stacks if _stack_label(s[0], True)] or stacks
        by_label: dict[str | None, tuple[str, list[nn.Module]]] = {}
        for path, layers in stacks:
            by_label.setdefault(_stack_label(path, True), (path, layers))
        chosen = list(by_label.values())
    else:  # attention first, then the length the config gives its layers (Evolla's compressor has 6), then longest
        counts = {v for k, v in text_config.to_dict().items() if isinstance(v, int) and re.search(r"layers?$", k)}
        chosen = sorted(stacks, key=lambda s: (not _holds_attention(s[1]), len(s[1]) not in counts, -len(s[1])))[:1]
    per_layer = layer_kinds(text_config)
    softmax = None if encoder_decoder else attention_layers(text_config)  # layer_types: MiniMax's linear layers
    nested = nested_attentions(text_config)  # LongCat-Flash's two attentions per layer: a kind each
    kinds: list[LayerKind] = []
    for path, layers in chosen:
        stack = _stack_label(path, encoder_decoder)
        seen: dict[tuple[Any, ...], list[int]] = {}
        per = nested.per_entry(text_config) if nested is not None and not encoder_decoder else 1
        for index, layer in enumerate(layers):
            entries = per_layer[index] if not encoder_decoder and index < len(per_layer) else ()
            for inner in range(per):  # several attentions per layer: posenc's layer per * index + inner
                where = (f"attention {inner} of its layer",) if per > 1 else ()
                key = (type(layer).__name__, _attention_classes(layer), *where, *entries)
                seen.setdefault(key, []).append(per * index + inner)
        for key, indices in seen.items():
            skipped = _skip_reason(key[1], indices[0], softmax)
            label = ", ".join([key[0], *key[1], *(str(e) for e in key[2:])])
            kinds.append(LayerKind(stack, indices[0], label, not skipped, len(indices), skipped))
    return kinds


def _modeling_source(model: nn.Module) -> str:
    sources = []
    for cls in type(model).__mro__:
        module = sys.modules.get(cls.__module__)
        if module is not None and cls.__module__.startswith("transformers.models."):
            try:
                sources.append(inspect.getsource(module))
            except (OSError, TypeError):
                continue
    return "\n".join(dict.fromkeys(sources))


def _has_heads(data: Any) -> bool:
    """Whether a config dict (or one nested in it) counts attention heads: RWKV's time mixing has none."""
    if not isinstance(data, dict):
        return False
    return any(
        (_HEADS_FIELD.search(str(k)) and isinstance(v, (int, list)) and not isinstance(v, bool) and v) or _has_heads(v)
        for k, v in data.items()
    )


def read_anatomy(model: nn.Module, config: Any) -> Anatomy:
    """The scheme and layer kinds of ``model`` (built from ``config``), read as the module docstring says."""
    try:
        text_config = config.get_text_config(decoder=True)
    except Exception:  # composites without a text config are judged by themselves
        text_config = config
    _, root = text_part(model, text_config)
    evidence: list[str] = []
    found: set[str] = set()
    attention = False
    for name, module in _own_modules(root, text_config):
        cls = type(module).__name__
        if _ATTENTION.search(cls):
            attention = True
        inv_freq = "inv_freq" in dict(module.named_buffers(recurse=False)) and not _TABLE_CLASS.search(cls)
        if _ROTARY.search(cls) or inv_freq:
            found.add("RoPE")
            evidence.append(f"{name or 'model'}: {cls}")
        own = dict(module.named_parameters(recurse=False))
        if name.endswith("relative_attention_bias") or "relative_attention_bias" in own:
            found.add("T5 relative bias")
            evidence.append(f"{name}: {cls}")
        if name.endswith("rel_embeddings") or "Disentangled" in cls:
            found.add("disentangled (DeBERTa)")
            evidence.append(f"{name}: {cls}")
        for buffer in dict(module.named_buffers(recurse=False)):
            if _SINUSOID_BUFFER.search(buffer):
                found.add("sinusoidal")
                evidence.append(f"{name}.{buffer}: a position table buffer")
        for param, value in own.items():
            if _POSITION_TABLE.search(param) and value.ndim >= 2:  # a table held as a bare parameter
                found.add("learned absolute")
                evidence.append(f"{name}.{param}: a position parameter")
        if _RELATIVE_CLASS.search(cls):
            found.add("other relative")
            evidence.append(f"{name}: {cls}")
        if {"r_w_bias", "r_r_bias"} & set(own):
            found.add("Transformer-XL relative")
            evidence.append(f"{name}: r_w_bias / r_r_bias")
        if "Sinusoidal" in cls or "PositionalEncoding" in cls:
            found.add("sinusoidal")
            evidence.append(f"{name}: {cls}")
        elif _POSITION_TABLE.search(name) and getattr(getattr(module, "weight", None), "ndim", 0) == 2:
            trainable = module.weight.requires_grad  # an nn.Embedding, or a table like I-BERT's QuantEmbedding
            found.add("learned absolute" if trainable else "sinusoidal")
            evidence.append(f"{name}: {cls}{'' if trainable else ' (frozen table)'}")
        elif _POSITION_TABLE.search(name) and "Axial" in cls:  # Reformer's table factorised into per-axis weights
            found.add("learned absolute")
            evidence.append(f"{name}: {cls} (axial)")
    for field in ("rotary_dim", "rotary_pct", "rotary_emb_base"):
        if getattr(text_config, field, None):
            found.add("RoPE")
            evidence.append(f"config.{field}")
    source = _modeling_source(model)
    if "sinusoidal" in found and re.search(r"def apply_rotary|rotate_half", source):
        found.add("RoPE")  # RoFormer rotates q and k with its sinusoidal table
        evidence.append("modeling source rotates q/k with the sinusoidal table")
    if re.search(r"def (build_)?alibi|alibi_bias|build_alibi", source):
        alibi_on = getattr(text_config, "alibi", None)
        attn_config = getattr(text_config, "attn_config", None)
        alibi_on = alibi_on if alibi_on is not None else getattr(attn_config, "alibi", None)
        if alibi_on is None or alibi_on:
            found.add("ALiBi")
            evidence.append("modeling source builds ALiBi slopes")
        elif "RoPE" in found:
            found.add("RoPE / ALiBi")
            evidence.append("ALiBi when the config sets alibi=True")
    declared = str(getattr(text_config, "position_embedding_type", "") or "").lower()
    if declared in ("nope", "none") and found & {"RoPE", "learned absolute", "sinusoidal"}:
        # Granite 4's rotary module is built but its attention reads the config and skips it.
        found -= {"RoPE", "learned absolute", "sinusoidal"}
        evidence.append(f"config.position_embedding_type = {declared!r}")
    if not attention or not _has_heads(text_config.to_dict()):
        scheme = "none (no attention)"
    elif "RoPE / ALiBi" in found:  # a config switch between the two (Falcon)
        scheme = "RoPE / ALiBi"
    else:  # the first of SCHEMES found: RoPE before a learned table (a model with both rotates), ...
        scheme = next((s for s in SCHEMES if s in found), "NoPE")
    kinds = layer_stacks(model, text_config)
    if scheme == "none (no attention)":  # RWKV's "RwkvSelfAttention" mixes time without attention heads
        why = "no attention heads in this model (it mixes positions another way)"
        kinds = [dataclasses.replace(kind, attention=False, skipped=kind.skipped or why) for kind in kinds]
    return Anatomy(scheme, tuple(dict.fromkeys(evidence))[:6], tuple(kinds))


__all__ = ["SCHEMES", "Anatomy", "LayerKind", "cross_only", "layer_stacks", "read_anatomy", "text_part"]
