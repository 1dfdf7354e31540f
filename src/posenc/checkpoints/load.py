"""One layer of a checkpoint -> posenc's :class:`~posenc.blocks.AttentionBlock` (and its transformers reference).

``load_layer(folder_or_model, layer=N)`` reads the config, finds the family of its ``model_type``, plans the
layer (geometry, scheme, parameters), reads exactly the tensors the family's weight table names for that layer,
transforms them onto the block's ``state_dict`` keys and records their provenance (checkpoint, layer, tensor
names and sha256). Memory follows one layer, not the model.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from posenc.blocks import AttentionBlock, MLABlock, build_block
from posenc.checkpoints import towers
from posenc.checkpoints.family import Family, LayerPlan, Rule, family_for, supported_model_types
from posenc.checkpoints.reference import TransformersReference, hf_config
from posenc.checkpoints.source import CheckpointSource, tensor_sha256
from posenc.checkpoints.towers import Tower
from posenc.config import AttentionConfig
from posenc.errors import ConfigError
from posenc.provenance import CheckpointWeights, Quantization, positional_fields
from posenc.schemes.base import TableMode, table_keys


@dataclasses.dataclass
class LoadedLayer:
    """A checkpoint layer read for posenc.

    Attributes:
        family: the model family.
        plan: geometry, scheme, parameters and layer of the block.
        state: block ``state_dict`` entries (parameters and non-table buffers) from the checkpoint.
        tensors: the checkpoint tensors read, by their names in the family's weight table (relative to the
            layer's attention module; ``/``-prefixed ones relative to the model root).
        names: full checkpoint names of those tensors (same keys as ``tensors``).
        location: the checkpoint folder (or ``<in-memory ...>``).
        hf: the transformers config object.
        model_type: ``config.json``'s ``model_type``.
        tower: where the layer sits when the checkpoint is a wrapper of a text model (:mod:`.towers`), else None.
        quantization: how a quantized checkpoint's tensors were read (:mod:`.quantized`), else None.
    """

    family: Family
    plan: LayerPlan
    state: dict[str, torch.Tensor]
    tensors: dict[str, torch.Tensor]
    names: dict[str, str]
    location: str
    hf: Any
    model_type: str
    tower: Tower | None = None
    weights_file: str | None = None
    """The checkpoint's weights file read (transformers' precedence; :mod:`.source`), None for in-memory models."""
    quantization: Quantization | None = None

    def block(
        self,
        table_mode: TableMode | str | None = None,
        max_positions: int | None = None,
        table_dtype: torch.dtype = torch.float32,
    ) -> AttentionBlock | MLABlock:
        """The layer as an :class:`AttentionBlock` (an :class:`~posenc.blocks.MLABlock` for MLA families) holding the
        checkpoint's weights (float32 parameters).

        Raises:
            ConfigError: a tensor's shape does not fit the geometry the config describes.
        """
        plan = self.plan
        block = build_block(plan.config, plan.scheme, plan.params, table_mode, max_positions, table_dtype)
        load_state(block, self.state, self.location)
        return block.eval()

    def reference(self, angles: str = "native", dtype: torch.dtype = torch.float32) -> TransformersReference:
        """The checkpoint's own transformers attention module for this layer (see :mod:`.reference`); for a text
        tower, the class its wrapper builds for the layer.

        Raises:
            ConfigError: the family builds another attention class than the wrapper does for this layer.
        """
        reference = self.family.reference(self.hf, self.plan, self.tensors, angles, dtype)
        built = type(getattr(reference, "attention", reference)).__name__
        if self.tower is not None and built != self.tower.attention_class:
            raise ConfigError(
                f"{self.model_type}'s text tower builds {self.tower.attention_class} for layer {self.plan.layer}, "
                f"but family {self.family.name} builds {built}; posenc cannot vouch for this layer."
            )
        return reference

    def provenance(self) -> CheckpointWeights:
        """Where the weights came from, for the manifest: checkpoint, layer and every tensor's name and sha256."""
        return CheckpointWeights(
            checkpoint=self.location,
            model_type=self.model_type,
            family=self.family.name,
            layer=self.plan.layer,
            layer_type=self.plan.layer_type,
            tensors={self.names[key]: tensor_sha256(t) for key, t in sorted(self.tensors.items())},
            weights_file=self.weights_file,
            config=positional_fields(self.hf),
            quantization=self.quantization,
        )


def load_layer(model_or_folder: Any, layer: int | None = None, layer_type: str | None = None) -> LoadedLayer:
    """Read layer ``layer`` of a checkpoint folder or in-memory transformers model.

    Args:
        model_or_folder: a local checkpoint folder (config.json + safetensors / bin) or a transformers model.
        layer: the layer index (within its stack for encoder-decoder models); default: the first layer of
            ``layer_type`` where the config lists layer types, else 0.
        layer_type: the stack or layer type where the model has several (``encoder``/``decoder`` for T5,
            ``sliding_attention``/``full_attention`` for Gemma 3); must agree with the layer where it is fixed.

    Raises:
        ConfigError: not a local folder (e.g. a hub id), unsupported model_type (the message lists the supported
            ones), layer out of range, unknown layer type, tensors that do not fit the config.
        ModelFileError: config without weights, a missing shard, a missing or unreadable tensor.
        BackendUnavailable: transformers is not installed.
    """
    with CheckpointSource.open(model_or_folder) as source:
        model_type = source.config.get("model_type")
        if not model_type:
            raise ConfigError(
                f"{source.location}/config.json has no model_type; posenc loads checkpoints of: "
                f"{', '.join(supported_model_types())}."
            )
        try:
            hf = source.hf_model.config if source.hf_model is not None else hf_config(source.config)
        except ConfigError:  # a model_type transformers does not know: say what posenc loads, if it is not one
            family_for(str(model_type))
            raise
        family, text = _family_of(str(model_type), hf)
        if family.layer_types and layer_type is not None and layer_type not in family.layer_types:
            raise ConfigError(
                f"{model_type} has layer types {list(family.layer_types)}, not {layer_type!r}; pass one of them."
                + (f" {family.layer_types_note}" if family.layer_types_note else "")
            )
        plan = family.geometry(text, first_layer(text, layer_type) if layer is None else layer, layer_type)
        tower = None
        if text is not hf:  # a wrapper: find its text tower in its transformers model
            tower = towers.locate(hf, source.config, source.hf_model, family.prefix(plan))
            plan = family.geometry(tower.config, plan.layer, layer_type)
        rules = [rule for rule in family.rules if rule.when(plan)]
        full_name = _naming(source, family, plan, rules, tower)
        tensors: dict[str, torch.Tensor] = {}
        names: dict[str, str] = {}
        state: dict[str, torch.Tensor] = {}
        for rule in rules:
            inputs = []
            for relative in rule.sources:
                full = full_name(relative)
                tensors[relative] = _finite(source.tensor(full), full, source)
                names[relative] = full
                inputs.append(tensors[relative])
            outputs = list(rule.transform(inputs, plan))
            if len(outputs) != len(rule.targets):
                raise ConfigError(f"family {family.name}: rule for {rule.targets} produced {len(outputs)} tensors.")
            for target, value in zip(rule.targets, outputs, strict=True):
                state[target] = value
        hf_family = tower.config if tower else hf
        loaded = LoadedLayer(family, plan, state, tensors, names, source.location, hf_family, str(model_type), tower)
        loaded.weights_file = source.weights_file
        loaded.quantization = source.quantized.record(names.values())
        _check_partial_rotary(loaded)
        return loaded


def _finite(tensor: torch.Tensor, name: str, source: CheckpointSource) -> torch.Tensor:
    """``tensor`` when every value is finite.

    Raises:
        ConfigError: names the checkpoint tensor, its file and how many values are NaN or infinite.
    """
    if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
        nan = int(torch.isnan(tensor).sum())
        inf = int(torch.isinf(tensor).sum())
        raise ConfigError(
            f"checkpoint tensor {name!r} in {source.location}/{source.file_of(name)} holds {nan} NaN and {inf} "
            f"infinite values (of {tensor.numel()}): the checkpoint's weights are damaged, not posenc's parameters. "
            f"Re-download or re-save the checkpoint."
        )
    return tensor


def _check_partial_rotary(loaded: LoadedLayer) -> None:
    """Refuse a partial rotation the checkpoint's own transformers module cannot run (Llama's ``LlamaAttention``
    rotates the whole head, and its rotary module ignores the factor: posenc's block would rotate a part of each head,
    the model all of it). Proven on the module: one token through it with posenc's cos/sin of the partial width (the
    ``float64``-angle reference); a module that cannot take them fails with a shape error, and that is this refusal.

    Raises:
        ConfigError: the module fails on the config's partial rotation (names the factor and the module).
    """
    partial = loaded.plan.params.get("partial_rotary_factor", 1.0)
    config = loaded.plan.config
    if partial >= 1.0 or not isinstance(config, AttentionConfig) or "mrope_section" in loaded.plan.params:
        return
    reference = loaded.reference("float64", torch.float64)
    past = torch.zeros(1, config.num_kv_heads, 0, config.head_dim, dtype=torch.float64)
    past_value = torch.zeros(1, config.num_kv_heads, 0, config.value_dim, dtype=torch.float64)
    hidden = torch.zeros(1, 1, config.hidden_size, dtype=torch.float64)
    try:
        with torch.no_grad():
            reference(hidden, torch.zeros(1, 1, dtype=torch.long), past, past_value)
    except RuntimeError as exc:
        module = type(getattr(reference, "attention", reference)).__name__
        raise ConfigError(
            f"{loaded.model_type} config with partial_rotary_factor={partial}: transformers' {module} cannot run it "
            f"({str(exc).splitlines()[0]}): it rotates the whole head, so no transformers reference computes a "
            f"partial rotation. "
            f"Remove partial_rotary_factor from the config (or export the scheme by hand: posenc export rope "
            f"--param partial_rotary_factor={partial})."
        ) from None


def first_layer(hf: Any, layer_type: str | None) -> int:
    """The first layer whose ``layer_types`` entry is ``layer_type`` (0 when either is absent)."""
    kinds = list(getattr(hf, "layer_types", None) or [])
    if layer_type is None or layer_type not in kinds:
        return 0
    return kinds.index(layer_type)


def _full_name(root: str, prefix: str, relative: str, plan: LayerPlan) -> str:
    """The checkpoint name of ``relative`` (to the layer's attention module, or ``/``-prefixed to the root)."""
    if relative.startswith("/"):
        return root + relative[1:].format(layer=plan.layer, stack=plan.layer_type or "")
    return root + prefix + relative.format(layer=plan.layer, stack=plan.layer_type or "")


def loads_by_family(model_or_folder: Any) -> bool:
    """Whether a checkpoint (folder or in-memory model) loads through a family: its ``model_type`` has one (that
    does not decline its config: ``Family.declines``), or it wraps a text tower (:mod:`.towers`) whose ``model_type``
    has one (:func:`_family_of`). Otherwise the traced path is its route."""
    with CheckpointSource.open(model_or_folder) as source:
        model_type = str(source.config.get("model_type"))
        if model_type in supported_model_types():
            declines = family_for(model_type).declines
            return declines is None or declines(source.config) is None
        try:
            _family_of(model_type, source.hf_model.config if source.hf_model is not None else hf_config(source.config))
        except ConfigError:
            return False
    return True


def _family_of(model_type: str, hf: Any) -> tuple[Family, Any]:
    """``(family, the config it reads)``: the family of ``model_type`` with ``hf``; for a wrapper whose model_type no
    family claims, the family of its text tower with the text config (:mod:`.towers`).

    Raises:
        ConfigError: neither the model_type nor its text tower's (if it has one) is supported.
    """
    if model_type in supported_model_types():
        return family_for(model_type), hf
    tower_type = towers.text_model_type(hf)
    if tower_type is None:
        raise ConfigError(
            f"model_type {model_type!r} is not supported for checkpoint loading, and it wraps no text tower (its "
            f"config's get_text_config() is itself); supported model types: {', '.join(supported_model_types())}, "
            f"and wrappers (vision-, audio-language models) whose text tower is one of them. For other models trace "
            f"the checkpoint's own attention module (posenc export --hf-model DIR --via trace), or export a scheme by "
            f"hand (posenc export --scheme ...)."
        )
    if tower_type not in supported_model_types():
        raise ConfigError(
            f"model_type {model_type!r} wraps a text tower of model_type {tower_type!r}, which posenc does not load; "
            f"posenc loads checkpoints (and text towers) of: {', '.join(supported_model_types())}. For other models "
            f"trace the checkpoint's own attention module (posenc export --hf-model DIR --via trace), or export a "
            f"scheme by hand (posenc export --scheme ...)."
        )
    return family_for(str(tower_type)), towers.text_config(hf)


def _naming(
    source: CheckpointSource, family: Family, plan: LayerPlan, rules: list[Rule], tower: Tower | None
) -> Callable[[str], str]:
    """``relative name -> full checkpoint name`` for the layout this checkpoint stores the layer in: under the first
    root (``model.`` or ``""``, ...; a text tower's roots for a wrapper) that holds it, or a tower's saved names.

    Raises:
        ConfigError: no layout holds the layer's first tensor.
    """
    probe = next(s for rule in rules for s in rule.sources if not s.startswith("/"))
    roots = tower.roots if tower else family.roots
    by_root = [functools.partial(_full_name, root, family.prefix(plan), plan=plan) for root in roots]
    layouts: list[Callable[[str], str]] = list(by_root)
    if tower is not None and tower.saved:  # names save_pretrained writes with a rename inside the layer path
        saved, fallback = tower.saved, by_root[0]
        layouts.insert(0, lambda relative: saved.get(relative) or fallback(relative))
    for layout in layouts:
        if source.has(layout(probe)):
            return layout
    tried = list(dict.fromkeys(layout(probe) for layout in layouts))
    raise ConfigError(
        f"checkpoint {source.location} has no tensor {' or '.join(repr(t) for t in tried)} for layer {plan.layer}; "
        f"its config says model_type {source.config.get('model_type')!r} but its weights are laid out otherwise."
    )


def load_state(block: torch.nn.Module, state: dict[str, torch.Tensor], location: str) -> None:
    """Copy ``state`` into ``block``; every parameter must be given, with the shape the geometry implies.

    Raises:
        ConfigError: a missing block parameter, an unexpected key, or a tensor whose shape does not fit.
    """
    target = block.state_dict()
    tables = table_keys(block)
    missing = sorted(k for k in target if k not in tables and k not in state)
    unexpected = sorted(k for k in state if k not in target)
    if missing or unexpected:
        raise ConfigError(
            f"the tensors read from {location} do not fill the block (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}); the checkpoint does not match its config.json."
        )
    for key, value in state.items():
        if tuple(value.shape) != tuple(target[key].shape):
            raise ConfigError(
                f"tensor for {key!r} in {location} has shape {list(value.shape)}, but the config.json geometry needs "
                f"{list(target[key].shape)}; the weights do not belong to this config."
            )
    block.load_state_dict({**target, **{k: v.to(target[k].dtype) for k, v in state.items()}})


def block_from_hf(
    model_or_folder: Any,
    layer: int | None = None,
    *,
    layer_type: str | None = None,
    table_mode: TableMode | str | None = None,
    max_positions: int | None = None,
) -> tuple[AttentionBlock | MLABlock, LoadedLayer]:
    """``(block, loaded)``: layer ``layer`` of a checkpoint as an AttentionBlock with its weights, and what was read.

    Example::

        block, loaded = block_from_hf("checkpoints/llama", layer=3)
        out, k, v = block(hidden)                      # the layer's attention, posenc's implementation
        ref = loaded.reference()                       # the checkpoint's own transformers module
    """
    if isinstance(model_or_folder, (str, os.PathLike)) and not str(model_or_folder):
        raise ConfigError("give a checkpoint folder (config.json + weights).")
    loaded = load_layer(model_or_folder, layer, layer_type)
    return loaded.block(table_mode, max_positions), loaded


__all__ = ["LoadedLayer", "block_from_hf", "load_layer", "load_state"]
