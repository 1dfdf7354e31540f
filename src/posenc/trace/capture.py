"""How a model calls one layer's attention: captured on a short real forward, for any transformers model type.

:func:`capture_layer` builds the checkpoint's base model with transformers (from its config, layers ``0 .. N``
only, eager attention), runs a short forward on it and records, with a forward pre-hook, how layer N's attention
module is called: every argument is classified (:data:`posenc.trace.record.ARGUMENT_KINDS`) — the hidden states,
the position embeddings and the module that computed them (called again the same way), the mask (rebuilt from
positions and checked equal to the model's), the cache, plain constants. An argument of any other kind (a tensor
posenc cannot rebuild from the positions and the cache) is refused with its name. The attention module is then
loaded with the layer's tensors from the checkpoint (read one by one, their sha256 recorded).

What it returns (:class:`Captured`) builds :class:`posenc.trace.module.TracedAttention`, whose forward has the
interface of a family export (``hidden``, ``position_ids``, past -> ``out``, presents); the capture checks that the
wrapper reproduces the model's own call before anything is exported.

The steps live beside it: :mod:`posenc.trace.model` (the base model, the layer's attention),
:mod:`posenc.trace.calls` (the capture forward, call recording, recipes for arguments, masks and rotary calls),
:mod:`posenc.trace.embedding` (the embedding step) and :mod:`posenc.trace.probe` (the probe and settings checks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any

import torch
from torch import nn

from posenc.checkpoints.reference import hf_config, import_transformers
from posenc.checkpoints.source import CheckpointSource
from posenc.checkpoints.towers import base_tower
from posenc.errors import ConfigError, ExportError
from posenc.provenance import CheckpointWeights, Quantization
from posenc.trace.arguments import padding_keys, stream_widths
from posenc.trace.boxes import NAME as BOX_INPUT
from posenc.trace.boxes import Boxes, boxes_record, capture_boxes, feeding
from posenc.trace.caches import (
    CacheState,
    cache_kind,
    cache_states,
    cache_widths,
    encoder_cache,
    linear_layer,
    new_cache,
)
from posenc.trace.calls import (
    _NAMED,
    Call,
    _attended_positions,
    _capture_tokens,
    _hooks,
    _mask_recipe,
    _recipe,
    _record_calls,
    _rotary_recipe,
    _run_forward,
    reads_length,
    split_joined,
)
from posenc.trace.counts import layer_config, layer_count, nested_attentions
from posenc.trace.derived import Derived, derive, record_methods, refuse_with_cache, with_checkpoint_tensors
from posenc.trace.embedding import EmbeddingStep, _embedding_step, drop_token_table, token_width
from posenc.trace.inputs import padded_block
from posenc.trace.model import (
    Located,
    attention_child,
    attention_layers,
    build_base_model,
    class_path,
    default_layer,
    locate_attention,
    no_attention_error,
    one_stack,
    quiet_transformers,
)
from posenc.trace.orders import BATCH_MAJOR, from_model, order_of
from posenc.trace.probe import _check_settings, _module_causal, _probe, _settings, cacheless_heads
from posenc.trace.record import BoxesRecord, CallRecipe, MaskRecipe, ModuleRef
from posenc.trace.stacks import (
    check_tower_stack,
    nested_self_attention,
    position_buffer,
    positions_outside,
    self_attention_cache,
    stack_layer_count,
    stack_layers,
    stack_module,
    stack_of,
    token_stream,
    tower_stack,
)
from posenc.trace.stems import Stem, find_stem, stem_recipe
from posenc.trace.weights import load_attention_weights, load_module_weights

HIDDEN_KEYS: tuple[str, ...] = ("hidden_states", "query")
"""Keywords under which a model may pass its attention the hidden states (else its first positional argument):
``query`` in fairseq's convention (FSMT's ``self_attn(query=x, key=x, ...)``)."""

FAMILY_NAME = "trace"
"""The ``family`` a traced layer's provenance names."""


@dataclasses.dataclass
class Captured:
    """Layer N of a checkpoint, captured (see the module docstring).

    Attributes:
        model_type: ``config.json``'s ``model_type``.
        hf: the transformers config object (eager attention).
        layer: the layer index; ``layer_type`` its ``layer_types`` entry or None.
        attention: the layer's transformers attention module, loaded with the checkpoint's tensors (float32).
        attention_ref: its path in the base model and its class.
        rotary: the module that computes the position embeddings the attention takes (None without one).
        rotary_ref: its path and class.
        call: how the model calls the attention; ``rotary_call``: how it calls the rotary module.
        mask: the mask the model gives the layer.
        kv_heads, head_dim: the layer's cache layout ``[B, Hkv, P, D]``; ``value_dim``: the width of its values
            where it differs from the keys' (``[B, Hkv, P, Dv]``: a latent MLA cache, a ``v_head_dim``), else None
            (:mod:`posenc.trace.caches`). ``indexer_dim``: the width of the indexer keys ``[B, P, Di]`` a DSA layer
            also caches, else None.
        hidden_size: E, the width of the unit's input (the token embeddings' where the unit starts at them).
        tensors: full checkpoint name -> sha256 of the tensors read.
        location: the checkpoint folder (or ``<in-memory ...>``).
        probe: ``(hidden, position_ids, out)``: the attention called as the model called it, with the checkpoint's
            weights, on random hidden states (the self-check of the wrapper).
        embedding: the embedding step the unit starts with, for a first layer whose positions enter at the
            embeddings; None otherwise. ``embedding_note``: why a first layer without rotary angles has none.
        quantization: how a quantized checkpoint's tensors were read (:mod:`posenc.checkpoints.quantized`).
        cacheless: the model calls the attention without a KV cache (an encoder's); ``kv_heads`` and ``head_dim``
            then come from the module's (or the config's) head counts.
        tower: for a wrapper checkpoint (a vision- or audio-language model), its text tower's base model as the
            wrapper builds it: its path in the wrapper and its class; ``hf`` and every module path are then the
            tower's (:func:`posenc.checkpoints.towers.base_tower`). None otherwise.
        cache_kind: the cache the model calls it with (:data:`posenc.trace.caches.CACHE_KINDS`).
        outside: the module of a stack's (or a model's) embeddings that adds its positions before layer 0, where
            the unit does not start from it (or a position buffer the forward reads, CTRL's ``pos_encoding``); None
            otherwise.
        derived: arguments the model computes from the sequence before its layers (keyword or ``"#i"`` -> the code
            that computes them, :mod:`posenc.trace.derived`).
        streams: the second streams the model handed the attention in the capture call (keyword -> ``[B, S, W]``,
            :data:`posenc.trace.inputs.STREAMS`), which the probe's call read too.
        order: the axis order the model hands the attention its hidden states in (:mod:`posenc.trace.orders`).
        rotary_by_length: the rotary module, called without position ids, sizes its output by the hidden states'
            length (CLVP's angles of positions ``0 .. S - 1``, gathered by the attention at the position ids); the
            unit calls it on the context's length instead (:class:`~posenc.trace.module.TracedAttention`).
        stem, stem_ref: the layer's module whose outputs are the attention's inputs, called by the unit on the layer's
            input (:mod:`posenc.trace.stems`: MobileBERT's bottleneck), and its path and class; None otherwise.
        boxes: how a document model takes its tokens' boxes (the unit's last input ``bbox``; the capture's boxes are
            the last entry of ``streams``), else None (:mod:`posenc.trace.boxes`).
        cache_layer, states: a hybrid (``linear``) cache's layer class and the fixed-size states it holds beside keys
            and values (:mod:`posenc.trace.caches`); None and none otherwise. ``window_field``: the config field of
            the window below which a reference sliding-window cache is a plain one
            (:data:`posenc.trace.caches.REFERENCE_WINDOWS`), else None.
    """

    model_type: str
    hf: Any
    layer: int
    layer_type: str | None
    attention: nn.Module
    attention_ref: ModuleRef
    rotary: nn.Module | None
    rotary_ref: ModuleRef | None
    call: CallRecipe
    rotary_call: CallRecipe | None
    mask: MaskRecipe
    kv_heads: int
    head_dim: int
    hidden_size: int
    tensors: dict[str, str]
    location: str
    probe: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    embedding: EmbeddingStep | None = None
    embedding_note: str = ""
    quantization: Quantization | None = None
    cacheless: bool = False
    tower: ModuleRef | None = None
    cache_kind: str = "dynamic"
    outside: str | None = None
    derived: dict[str, Derived] = dataclasses.field(default_factory=dict)
    value_dim: int | None = None
    indexer_dim: int | None = None
    streams: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    order: str = BATCH_MAJOR
    rotary_by_length: bool = False
    stem: nn.Module | None = None
    stem_ref: ModuleRef | None = None
    boxes: BoxesRecord | None = None
    cache_layer: str | None = None
    states: tuple[CacheState, ...] = ()
    window_field: str | None = None

    def provenance(self) -> CheckpointWeights:
        """Where the attention's weights came from (the manifest's ``weights.source``)."""
        return CheckpointWeights(
            checkpoint=self.location,
            model_type=self.model_type,
            family=FAMILY_NAME,
            layer=self.layer,
            layer_type=self.layer_type,
            tensors=dict(sorted(self.tensors.items())),
            quantization=self.quantization,
        )


def capture_layer(model_or_folder: Any, layer: int | None = None, layer_type: str | None = None) -> Captured:
    """Capture how the checkpoint's model calls layer ``layer``'s attention (see the module docstring).

    Args:
        model_or_folder: a checkpoint folder or an in-memory transformers model.
        layer: the layer (default: the first of ``layer_type``, else the first layer with attention).
        layer_type: a ``layer_types`` entry the layer must have.

    Raises:
        ConfigError: no model_type, a layer out of range or without attention, a layer type the model lacks, weights
            that do not fit.
        ExportError: the model calls its attention with an argument posenc cannot rebuild, or with a mask it
            cannot rebuild from positions.
    """
    transformers = import_transformers()
    with CheckpointSource.open(model_or_folder) as source, quiet_transformers(), contextlib.ExitStack() as held:
        model_type = source.config.get("model_type")
        if not model_type:
            raise ConfigError(f"{source.location}/config.json has no model_type; posenc cannot build its model.")
        outer = source.hf_model.config if source.hf_model is not None else hf_config(source.config)
        picked = tower_stack(outer, layer_type)  # a wrapper: its text tower is traced (T5Gemma: one per stack)
        tower = base_tower(outer, source.config, source.hf_model, picked)
        check_tower_stack(outer, picked, tower)
        hf = tower.config if tower is not None else outer
        names = tower.checkpoint_names if tower is not None else None
        stack = stack_of(hf, layer_type)
        if stack is not None:  # a decoder tower whose config says encoder-decoder is its one stack
            stack = one_stack(hf, stack, layer_type, tower.model_class if tower is not None else None)
        total = layer_count(hf) if stack is None else stack_layer_count(hf, stack)
        index = (default_layer(hf, layer_type) if stack is None else 0) if layer is None else layer
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < total:
            where = f"the checkpoint's {stack} has" if stack else "the checkpoint has"
            nested = nested_attentions(hf) if stack is None else None  # layers counted as the model counts them
            why = f" ({nested.why})" if nested is not None else ""
            raise ConfigError(f"layer {index!r} is out of range: {where} {total} layers (0 .. {total - 1}){why}.")
        kinds = list(getattr(hf, "layer_types", None) or []) if stack is None else []
        kind = stack or (kinds[index] if index < len(kinds) else None)
        if layer_type is not None and kind != layer_type:
            raise ConfigError(f"layer {index} is a {kind or 'plain'} layer, not {layer_type!r}.")
        model = build_base_model(hf, index + 1, tower.model_class if tower is not None else None, stack)
        tower_ref = ModuleRef(tower.path, class_path(model)) if tower is not None else None
        if stack is None:  # the layer's attention; several per layer entry, or in a list of their own (XLM)
            located = locate_attention(model, hf, index)
        else:
            list_path, layers = stack_layers(model, stack, index + 1)
            found = attention_child(layers[index]) or nested_self_attention(layers[index])
            child, module = found if found is not None else (None, None)
            located = Located(list_path, index, child, module, layers[index])
        list_path, layer_path = located.list_path, located.layer_path
        softmax = attention_layers(hf) if stack is None else None  # layer_types: linear attention is not softmax
        if located.attention is None or (softmax is not None and index not in softmax):
            raise no_attention_error(hf, index, located.layer)
        attention, attention_path = located.attention, located.path
        target = Call((), {})
        calls, handles = _record_calls(model, attention, target)
        settings = _settings(attention)
        own_config = layer_config(hf, index)  # a heterogeneous config's view of this layer, else hf
        with _hooks(handles), record_methods(model, list_path) as methods:
            runner = stack_module(model, list_path) if stack else None
            positions = _run_forward(model, hf, _capture_tokens(own_config), runner, cache=stack != "encoder")
        box_record = boxes_record(hf)  # a document model's boxes: the unit's input bbox (posenc.trace.boxes)
        boxes = capture_boxes(hf, _capture_tokens(own_config)) if box_record is not None else None
        held.enter_context(feeding(Boxes(boxes, box_record) if boxes is not None and box_record is not None else None))
        _check_settings(settings, attention, model_type)
        parameters = [n for n, p in inspect.signature(attention.forward).parameters.items() if p.kind in _NAMED]
        hidden_key = _hidden_key(target, parameters)
        hidden = target.kwargs[hidden_key] if hidden_key else target.args[0]
        order = order_of(hidden, positions, getattr(hf, "hidden_size", None))  # [B, E, S], [S, B, E]: transposed
        attended = from_model(hidden, order) if torch.is_tensor(hidden) else hidden  # [B, S, E]
        positions = _attended_positions(target, hidden_key, positions, attended)
        derived: dict[str, Derived] = {}

        def stack_tensor(key: str, value: Any, base: nn.Module = model) -> bool:  # derived from the sequence
            made = derive(key, value, positions, attended, calls, methods, base, class_path)
            if made is not None:
                derived[key] = made
            return made is not None

        stem: Stem | None = None
        try:
            call, producer = _recipe(target, positions, calls, transformers.Cache, hidden_key, parameters, stack_tensor)
        except ExportError:  # the attention's inputs may all come from a module of the layer (MobileBERT's bottleneck)
            stem = find_stem(calls, model, layer_path, target)
            if stem is None:
                raise
            derived.clear()
            call, producer = stem_recipe(target, stem, positions, transformers.Cache, parameters), None
            hidden = stem.layer_input  # the unit starts at the layer's input
            order = order_of(hidden, positions, getattr(hf, "hidden_size", None))
            attended = from_model(hidden, order)
        for key in padding_keys(call):  # a padding mask: the block the stack pads to (PEGASUS-X's), or none
            call.constants[key][1] = padded_block(hf)
        rotary_path = producer[0] if producer is not None else None
        passed = [*target.kwargs.values(), *target.args]  # Dia's decoder layer passes its cache positionally
        cache = next((v for v in passed if isinstance(v, transformers.Cache)), None)
        kind_of_cache = cache_kind(cache, index)
        cache_layer = linear_layer(cache, index, str(model_type)) if kind_of_cache == "linear" else None
        if cache is not None and encoder_cache(hf):  # an encoder handed a cache it cannot extend (XLM's)
            cache = None
        masks = [target.kwargs[k] for k, kind in call.keywords.items() if kind == "mask"]
        masks += [target.args[i] for i, kind in enumerate(call.positional) if kind == "mask"]
        masks += [dict.__getitem__(target.kwargs[key], entry) for key, kind in call.keywords.items()
                  if kind == "entries" for entry, (of, _) in call.constants[key].items() if of == "mask"]  # fmt: skip
        streams = {key: target.kwargs[key] for key in stream_widths(call)}
        mask_value, joined = split_joined(masks[0] if masks else None, streams, positions)  # T5Gemma 2's merged mask
        if torch.is_tensor(mask_value) and mask_value.dim() == 3:  # [B, S, S] hiding no key (arguments.is_open_square)
            mask_value = mask_value.unsqueeze(1)
        causal = cache is not None or _module_causal(attention)
        mask = _mask_recipe(mask_value, own_config, kind, positions, causal)
        if joined is not None:
            mask = dataclasses.replace(mask, joined=joined)
        rotary = model.get_submodule(rotary_path) if rotary_path else None
        rotary_call = _rotary_recipe(producer[1], positions, transformers.Cache) if producer is not None else None
        by_length = False  # CLVP's rotary module sizes its angles by the length, the attention reads them at the ids
        reads_ids = "position_ids" in (*call.positional, *call.keywords.values())
        if rotary is not None and rotary_call is not None and producer is not None and reads_ids:
            by_length = reads_length(rotary, producer[1], rotary_call)
        if cache is not None and any(made.needs_length() for made in derived.values()):
            raise refuse_with_cache(next(key for key, made in derived.items() if made.needs_length()))
        states: tuple[CacheState, ...]  # a hybrid cache layer's fixed-size states (posenc.trace.caches)
        window_field: str | None  # a reference sliding window's config field (posenc.trace.caches.REFERENCE_WINDOWS)
        if cache is None:  # an encoder's attention (or a decoder's run without a cache): no past, no presents
            kv_heads, head_dim = cacheless_heads(own_config, attention, int(attended.shape[-1]))
            value_dim, indexer_dim, states, window_field = head_dim, None, (), None
        else:
            own = self_attention_cache(cache)  # an encoder-decoder's: its self-attention part
            widths = cache_widths(own.layers[index], index, str(model_type))
            kv_heads, head_dim, value_dim = widths.kv_heads, widths.key_dim, widths.value_dim
            indexer_dim, states, window_field = widths.indexer_dim, widths.states, widths.window_field
        step, note = None, ""
        if rotary_path is None and index == 0:  # positions may enter at the embeddings, before this layer
            step, note = _embedding_step(calls, model, layer_path, attended, positions, transformers.Cache, order)
        width = int(attended.shape[-1])  # the unit's input: the attention's (or the stem's) input [B, S, E]
        if step is not None:
            width = token_width(calls, step, width)  # token embeddings narrower than the layers (MobileBERT's 128)
            drop_token_table(step.position, step.record)
        # positions added at the embeddings by a module the unit cannot start from (a stack's, or a sinusoidal
        # table read by the token ids: MusicGen's, Kosmos-2's): said so in the manifest
        first = step is None and index == 0 and (stack is not None or rotary_path is None)
        outside = positions_outside(list(calls), list_path, anywhere=stack is None) if first else None
        if outside is not None and token_stream(calls, model, f"{list_path}.{index}"):
            outside = None  # that module positions another stream (Moonshine Streaming's encoder states)
        if outside is None and first and stack is None and rotary_path is None:
            outside = position_buffer(model, list_path)  # positions added from a buffer, outside any module (CTRL)
        owner = (tower.model, f"{tower.path}.") if tower is not None else (model, "")
        tensors = load_module_weights(source, attention, attention_path, names, owner)
        if step is not None:
            for ref, module in zip((step.record.position, *step.record.norms), (step.position, *step.norms),
                                   strict=True):  # fmt: skip
                tensors.update(load_module_weights(source, module, ref.path, names, owner))
        if stem is not None:
            tensors.update(load_module_weights(source, stem.module, stem.path, names, owner))
        for made in derived.values():
            if made.module is not None and made.recipe.source is not None and made.module.state_dict():
                tensors.update(load_module_weights(source, made.module, made.recipe.source.path, names, owner))
        target = with_checkpoint_tensors(target, derived, attended, positions)
        if kind_of_cache == "indexed" and indexer_dim is None:  # a shared DSA layer writes no indexer keys of its own
            kind_of_cache = "dynamic"
        probed: list[Any] = []  # the probe's fresh caches: the states the attention alone fills (not its layer's)

        def fresh() -> Any:
            probed.append(new_cache(kind_of_cache, index + 1, cache_layer))
            return probed[-1]

        probe = _probe(attention.float().eval(), target, hidden, positions, transformers.Cache, step, calls, index,
                       fresh, hidden_key, order, stem, width)  # fmt: skip
        if kind_of_cache == "linear" and probed:  # Inkling's layer also keeps its own convolutions' states there
            states = cache_states(probed[0].layers[index])
        del model  # the other layers were only needed for the capture call
        recipes = [call, *(made.recipe.call for made in derived.values()), *([step.record.call] if step else [])]
        read = boxes is not None and any("boxes" in (*r.positional, *r.keywords.values()) for r in recipes)
        boxes = boxes if read else None  # no code the unit calls reads them (UDOP's decoder): no bbox input
        return Captured(
            model_type=str(model_type),
            hf=hf,
            layer=index,
            layer_type=kind,
            attention=attention.float().eval(),
            attention_ref=ModuleRef(attention_path, class_path(attention)),
            rotary=rotary.float().eval() if rotary is not None else None,
            rotary_ref=ModuleRef(rotary_path, class_path(rotary)) if rotary_path else None,
            call=call,
            rotary_call=rotary_call,
            mask=mask,
            kv_heads=kv_heads,
            head_dim=head_dim,
            value_dim=value_dim if value_dim != head_dim else None,
            indexer_dim=indexer_dim,
            hidden_size=width,
            tensors=tensors,
            location=source.location,
            probe=probe,
            embedding=step,
            embedding_note=note,
            quantization=source.quantized.record(tensors),
            cacheless=cache is None,
            tower=tower_ref,
            cache_kind=kind_of_cache,
            cache_layer=cache_layer,
            states=states,
            window_field=window_field,
            outside=outside,
            derived=derived,
            streams=streams | ({BOX_INPUT: boxes} if read else {}),
            boxes=box_record if boxes is not None else None,
            order=order,
            rotary_by_length=by_length,
            stem=stem.module.float().eval() if stem is not None else None,
            stem_ref=ModuleRef(stem.path, class_path(stem.module)) if stem is not None else None,
        )


def _hidden_key(target: Call, parameters: list[str]) -> str | None:
    """The keyword the attention's hidden states are passed under: ``hidden_states`` (or FSMT's ``query``,
    :data:`HIDDEN_KEYS`), or its forward's first parameter where the call passes everything by keyword (PEGASUS-X's
    ``token_hidden_states``); None where they are the first positional argument."""
    named = next((key for key in HIDDEN_KEYS if key in target.kwargs), None)
    if named is not None:
        return named
    if not target.args and parameters and parameters[0] in target.kwargs:
        return parameters[0]
    return None


__all__ = [
    "FAMILY_NAME",
    "Captured",
    "EmbeddingStep",
    "cacheless_heads",
    "capture_layer",
    "class_path",
    "drop_token_table",
    "load_attention_weights",
]
