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
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from posenc.errors import ConfigError
from posenc.trace.caches import new_cache
from posenc.trace.inputs import ONE_STREAM, stack_capture_inputs
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


def self_attention_cache(cache: Any) -> Any:
    """The part of ``cache`` that holds the self-attention's keys and values (the cache itself, or an
    encoder-decoder cache's ``self_attention_cache``)."""
    return getattr(cache, "self_attention_cache", cache)


OUTSIDE_PART = "stack embeddings"
"""The positional part of a stack whose positions enter at its embeddings in a way the unit cannot start from
(MBart's ``layernorm_embedding`` after the sum, a table read by shape): outside the traced unit, said so."""
_POSITION_MODULE = re.compile(r"(embed_positions|position_embeddings?|pos_emb\w*|positional_encoding|wpe)$")


def positions_outside(called: list[str], list_path: str, *, anywhere: bool = False) -> str | None:
    """The module (of those ``called`` before the layer, outside the layer list at ``list_path``; in the stack that
    holds it, or ``anywhere`` in the model) that embeds positions by its name, or None."""
    stack = list_path.rsplit(".", 1)[0] + "." if "." in list_path and not anywhere else ""
    for name in called:
        if name.startswith(stack) and not name.startswith(list_path + ".") and _POSITION_MODULE.search(name):
            return name
    return None


def token_stream(calls: Mapping[str, Any], model: nn.Module, layer_path: str) -> bool:
    """Whether the layer at ``layer_path`` was called (in ``calls``, recorded module calls by name: their ``args``,
    ``kwargs``, ``output``) on the output of a token embedding (an ``nn.Embedding`` call) unchanged: no positions
    were added to its stream before it, whatever a position module outside it computed for another stream."""
    layer = calls.get(layer_path)
    if layer is None:
        return False
    hidden = layer.kwargs.get("hidden_states", layer.args[0] if layer.args else None)
    if not isinstance(hidden, torch.Tensor):
        return False
    for name, call in calls.items():
        output = call.output
        if (
            isinstance(model.get_submodule(name), nn.Embedding)
            and isinstance(output, torch.Tensor)
            and output.shape == hidden.shape
            and torch.equal(output, hidden)
        ):
            return True
    return False


_POSITION_BUFFER = re.compile(r"(^|\.)(pos_encoding|positional_encoding|pos_emb\w*|position_embeddings?)$")


def position_buffer(model: Any, list_path: str) -> str | None:
    """A buffer of ``model`` outside the layer list at ``list_path`` named as a position table, or None: CTRL's
    ``pos_encoding``, whose rows (read by the position ids) its forward adds to the embeddings itself, with no module
    posenc could call as the unit's embedding step."""
    for name, _ in model.named_buffers():
        if not name.startswith(list_path + ".") and _POSITION_BUFFER.search(name):
            return name
    return None


def outside_parts(outside: str | None, model_type: str = "") -> tuple[TracePart, ...]:
    """The manifest's part for positions added at a stack's embeddings outside the unit (``outside``: the module),
    or none; for a model whose layers attend over text and another modality in one sequence (:data:`ONE_STREAM`),
    what that sequence is."""
    if outside is None:
        return ()
    joined = ONE_STREAM.get(model_type)
    if joined is not None:
        detail = (f"{joined}, which every layer's attention reads; the positions of each part enter there ({outside}, "
                  f"...) before layer 0, outside this unit: the graph is the attention over the whole sequence, fed "
                  f"the embedded states as the model hands them to the layer (a unit that started at the text tokens "
                  f"would not be what the model computes)")  # fmt: skip
        return (TracePart(OUTSIDE_PART, "absent", detail),)
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


def tower_stack(hf: Any, layer_type: str | None) -> str | None:
    """The stack whose text tower a wrapper holding one per stack is traced in (T5Gemma: ``model.encoder`` and
    ``model.decoder`` are both ``t5_gemma_module``): ``layer_type`` where it names a stack, else the encoder, as the
    BART family's default; None for a config that is not an encoder-decoder."""
    if not getattr(hf, "is_encoder_decoder", False):
        return None
    return layer_type if layer_type in STACKS else DEFAULT_STACK


def check_tower_stack(hf: Any, picked: str | None, tower: Any) -> None:
    """Refuse the decoder's tower of a wrapper holding one per stack (``picked``: :func:`tower_stack`; ``tower``:
    the :class:`~posenc.checkpoints.towers.BaseTower` found, or None).

    Raises:
        ConfigError: the tower's layers are picked by their own layer types, and a decoder tower cannot be recorded
            apart from the encoder's yet.
    """
    if picked == "decoder" and tower is not None and not getattr(tower.config, "is_encoder_decoder", False):
        raise ConfigError(
            f"the {hf.model_type} model's text tower is a submodel per stack; posenc traces the encoder's "
            f"(--layer-type picks one of its own layer types), not its decoder's ({tower.path}) yet."
        )


_GENERIC_COUNTS = ("num_layers", "num_hidden_layers")
"""The count fields of :data:`COUNT_FIELDS` that name no stack: read after a ``<stack>_config`` sub-config's."""


def _count_at(hf: Any, stack: str) -> tuple[Any, str] | None:
    """``(config, field)`` holding ``stack``'s layer count: a field naming the stack, else the count of the stack's
    own sub-config (``encoder_config.num_hidden_layers``: Parakeet's RNN-T and TDT, Cohere ASR, Nemotron ASR, whose
    top-level ``num_hidden_layers`` is the decoder's or absent), else a generic field; None where none is set."""
    sub = getattr(hf, f"{stack}_config", None)
    owners = [(hf, [n for n in COUNT_FIELDS[stack] if n not in _GENERIC_COUNTS])]
    if sub is not None and not isinstance(sub, dict):
        owners.append((sub, list(COUNT_FIELDS[stack])))
    owners.append((hf, [n for n in COUNT_FIELDS[stack] if n in _GENERIC_COUNTS]))
    for owner, names in owners:
        for name in names:
            value = getattr(owner, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return owner, name
    return None


def _count_field(hf: Any, stack: str) -> str | None:
    found = _count_at(hf, stack)
    return found[1] if found is not None else None


def stack_layer_count(hf: Any, stack: str) -> int:
    """The layer count of ``stack`` in ``hf``.

    Raises:
        ConfigError: the config names none (:data:`COUNT_FIELDS`).
    """
    found = _count_at(hf, stack)
    if found is None:
        raise ConfigError(
            f"the {hf.model_type} config names no {stack} layer count ({' / '.join(COUNT_FIELDS[stack])}, also in "
            f"its {stack}_config); posenc cannot pick a layer of its {stack}."
        )
    return int(getattr(*found))


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
    own = _count_at(config, stack)
    other = _count_at(config, STACKS[1 - STACKS.index(stack)])
    if own is not None and layers < int(getattr(*own)):
        setattr(*own, layers)
    if other is not None and (own is None or other[0] is not own[0] or other[1] != own[1]):
        setattr(*other, 1)


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
    if not found and not _names_stacks(model):  # the model is one stack alone (CanaryDecoder): its own list
        found = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) >= count]
    found.sort(key=lambda item: len(item[0]))
    if not found:
        raise ConfigError(f"cannot find the {count} {stack} layers of {type(model).__name__}; posenc cannot trace it.")
    return found[0]


def holds_stack(model: nn.Module, stack: str, lone: str | None) -> bool:
    """Whether ``model`` holds the layer list of ``stack``: one under a module named after it (``encoder.layers``),
    or, for a config whose model is that one stack alone (``lone``: :func:`lone_stack`; Canary's decoder), a model
    holding no stack named after either. LED's cut config builds ``LEDDecoder`` alone: it holds no encoder, and its
    ``layers`` are not the encoder's, nor, of a config whose model holds both stacks, the decoder's as the model
    builds it."""
    if not _names_stacks(model):
        return lone == stack
    return any(
        isinstance(module, nn.ModuleList) and any(stack in part for part in name.split(".")[:-1])
        for name, module in model.named_modules()
    )


def _names_stacks(model: nn.Module) -> bool:
    """Whether a module of ``model`` holding a layer list is named after a stack (``encoder``, ``decoder``)."""
    return any(
        isinstance(module, nn.ModuleList) and any(s in part for part in name.split(".")[:-1] for s in STACKS)
        for name, module in model.named_modules()
    )


LONE_COUNTS = {"encoder": 2, "decoder": 3}
"""Layer counts a probe config gives each stack, so that the length of the layer list of a model built from it says
which stack's count it follows (:func:`lone_stack`)."""


def lone_config(hf: Any) -> Any:
    """A copy of ``hf`` with each stack's count set to :data:`LONE_COUNTS` (where one field counts both stacks, it
    holds the decoder's)."""
    import copy

    probe = copy.deepcopy(hf)
    for stack, number in LONE_COUNTS.items():
        found = _count_at(probe, stack)
        if found is not None:
            setattr(*found, number)
    return probe


def lone_stack(model: nn.Module) -> str | None:
    """The stack a model built from :func:`lone_config` is, where it is one stack alone: an encoder-decoder config
    whose model transformers builds as a single layer stack (the decoder towers of Canary, Dia, Pix2Struct,
    PP-FormulaNet; ``is_encoder_decoder`` copied from their composite); None where the model holds stacks named
    ``encoder`` / ``decoder`` or its layer list follows neither count."""
    if _names_stacks(model):
        return None
    lengths = {len(m) for m in model.modules() if isinstance(m, nn.ModuleList)}
    found = [stack for stack, number in LONE_COUNTS.items() if number in lengths]
    return found[0] if len(found) == 1 else None


def check_lone(hf: Any, lone: str, layer_type: str | None) -> str:
    """The stack a layer of a one-stack model is in: ``lone``, where ``layer_type`` names no stack or that one.

    Raises:
        ConfigError: ``layer_type`` names the other stack.
    """
    if layer_type in STACKS and layer_type != lone:
        raise ConfigError(
            f"this {hf.model_type} model is its {lone} stack alone (its config says encoder-decoder, but the model "
            f"transformers builds from it holds one layer stack); pass --layer-type {lone}, or none."
        )
    return lone


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


def encoder_states(runner: nn.Module, hf: Any, tokens: int) -> dict[str, torch.Tensor]:
    """Seeded encoder states ``[1, tokens, width]`` for a decoder stack whose cross-attention runs even without
    them (Cohere ASR's: it projects ``encoder_hidden_states`` unconditionally); empty where the stack takes none.
    The width is the encoder's (``encoder_config.hidden_size``, else ``d_model`` / ``hidden_size``). Only the
    cross-attention reads them; the self-attention the capture records is called as without them."""
    if "encoder_hidden_states" not in inspect.signature(runner.forward).parameters:
        return {}
    encoder = getattr(hf, "encoder_config", None)
    width = getattr(encoder, "hidden_size", None) or getattr(hf, "d_model", None) or getattr(hf, "hidden_size", None)
    if not isinstance(width, int):
        return {}
    generator = torch.Generator().manual_seed(1)
    return {"encoder_hidden_states": torch.randn(1, tokens, width, generator=generator)}


TOKEN_AXES: dict[str, str] = {
    "dia_decoder": "num_channels",  # Dia's decoder reads one audio code per codebook channel: ids [B, S, channels]
}
"""Model types whose stack reads several token ids per position, ``[B, S, C]``: the config field holding ``C``."""


def stack_inputs(runner: nn.Module, hf: Any, tokens: int) -> list[dict[str, Any]]:
    """Candidate main inputs of a stack's forward that takes no token ids: a speech encoder's features, seeded, in
    the layouts speech encoders use (``input_features [1, bins, frames]`` at Whisper's fixed length ``2 ·
    max_source_positions``, ``[1, bins, 16·tokens]``, ``[1, 16·tokens, bins]``; ``input_values [1, 400·tokens]``);
    token ids ``[1, tokens, C]`` of a type in :data:`TOKEN_AXES`; empty where it takes plain token ids (the caller
    tries those)."""
    own = stack_capture_inputs(runner, hf, tokens)  # a type's own stack inputs (posenc.trace.inputs)
    if own is not None:
        return [own]
    accepts = inspect.signature(runner.forward).parameters
    generator = torch.Generator().manual_seed(0)
    if "input_ids" in accepts:
        axis = TOKEN_AXES.get(str(getattr(hf, "model_type", "")))
        if axis is None:
            return []
        vocab, codes = int(getattr(hf, "vocab_size", 32) or 32), int(getattr(hf, axis))
        ids = torch.randint(0, max(vocab, 2), (1, tokens, codes), generator=generator)
        cached = {"past_key_values": new_cache("encoder-decoder")} if "past_key_values" in accepts else {}
        return [{"input_ids": ids, "use_cache": True, **cached}, {"input_ids": ids}]
    frames = 16 * tokens
    if "input_features" in accepts:
        own = getattr(runner, "config", None)  # the stack's own config (Parakeet's encoder_config holds its bins)
        source = own if own is not None and hasattr(own, "num_mel_bins") else hf
        channels = int(getattr(source, "input_channels", 1) or 1)
        per_channel = getattr(source, "input_feat_per_channel", None)
        bins = int(getattr(source, "num_mel_bins", None) or (per_channel and per_channel * channels) or 80)
        shapes = [(1, bins, frames), (1, frames, bins)]
        fixed = int(getattr(hf, "max_source_positions", 0) or 0) * 2
        if 0 < fixed <= 4096:
            shapes.insert(0, (1, bins, fixed))
        return [{"input_features": torch.randn(shape, generator=generator)} for shape in shapes]
    if "input_values" in accepts:
        return [{"input_values": torch.randn(1, 400 * tokens, generator=generator)}]
    width = getattr(hf, "hidden_size", None) or getattr(hf, "d_model", None)
    if "hidden_states" in accepts and isinstance(width, int):  # a stack whose prenets sit outside it (SpeechT5's)
        return [{"hidden_states": torch.randn(1, tokens, width, generator=generator), "use_cache": True},
                {"hidden_states": torch.randn(1, tokens, width, generator=generator)}]  # fmt: skip
    return []


__all__ = [
    "BIAS_PART",
    "COUNT_FIELDS",
    "DEFAULT_STACK",
    "LONE_COUNTS",
    "OUTSIDE_PART",
    "STACKS",
    "TOKEN_AXES",
    "bias_parts",
    "check_lone",
    "check_tower_stack",
    "cut_stack",
    "encoder_states",
    "holds_stack",
    "lone_config",
    "lone_stack",
    "nested_self_attention",
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
    "token_stream",
    "tower_stack",
]
