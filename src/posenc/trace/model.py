"""The base model a capture runs, and the layer's attention in it.

:func:`build_base_model` builds a checkpoint's base model with transformers from its config (layers ``0 .. N`` only,
eager attention, seeded random weights); :func:`layer_list` and :func:`attention_child` find layer N's self-attention
module in it; :func:`default_layer` picks the layer from ``layer_types``. Used by :mod:`posenc.trace.capture`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import inspect
import math
import pkgutil
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from posenc.checkpoints.reference import import_transformers
from posenc.errors import ConfigError
from posenc.trace.masks import with_sub_configs
from posenc.trace.stacks import check_lone, cut_stack, lone_config, lone_stack

ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention", "mixer")
"""Child names under which decoder layers hold their attention module (tried first, in order)."""
TRAILING_COUNTS = ("num_kv_shared_layers",)
"""Config fields counting the model's *last* layers (Gemma 3n: the last ``num_kv_shared_layers`` reuse an earlier
layer's cache): cut with the layers so that each of layers ``0 .. N`` keeps its role."""
LAST_LAYER_DIFFERS = frozenset({"gpt_neox_japanese"})
"""Model types whose last layer is built unlike the others (GPT-NeoX-Japanese: only the last attention has its
``dense_bias``): the capture builds one layer past layer N where the checkpoint has one, so that layer N is built as
the checkpoint's layer N."""
LINEAR_KINDS = ("linear_attention", "mamba", "conv", "recurrent", "ssm", "mlp", "moe", "dummy")
"""``layer_types`` entries of layers without softmax attention."""


def class_path(module: Any) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


STACK_COUNTS: dict[str, str] = {
    # HRM runs two stacks of num_layers_per_stack layers (L_module, H_module) in cycles; num_hidden_layers counts
    # its cache slots (layers x cycles). Layer N is layer N of the first stack, called first at cycle offset 0.
    "hrm_text": "num_layers_per_stack",
    # LXMERT's language encoder (l_layers; its config's num_hidden_layers is a dict of the three stages' counts).
    "lxmert": "l_layers",
    # BLT's local encoder over the bytes (its own config's count): the text attention whose positions are the bytes'.
    "blt": "encoder_config.num_hidden_layers",
}
"""Model types whose layer list counts by another field than ``num_hidden_layers``: the field (dotted: in a
sub-config)."""
LAYER_PATHS: dict[str, str] = {
    # BLT's patcher, global transformer and local decoder hold layer lists of their own.
    "blt": "local_encoder.layers",
}
"""Model types whose traced layer list is one of several alike: its path in the base model."""


def part_view(data: dict[str, Any]) -> dict[str, Any]:
    """A config dict as the traced layer list's part sees it: where :data:`STACK_COUNTS` names a count in a
    sub-config (BLT's ``encoder_config``), that sub-config's fields over the top-level ones (its geometry and
    ``rope_parameters`` are the layer's); else ``data``."""
    field = STACK_COUNTS.get(str(data.get("model_type", "")), "")
    part = data.get(field.split(".")[0]) if "." in field else None
    return {**data, **part} if isinstance(part, dict) else data


def part_config(hf: Any) -> Any:
    """The config the traced layer list's part is built from: the sub-config :data:`STACK_COUNTS` names a count in
    (BLT's ``encoder_config``: its window, heads and context are the local encoder's), else ``hf``."""
    field = STACK_COUNTS.get(str(getattr(hf, "model_type", "")), "")
    return getattr(hf, field.split(".")[0]) if "." in field else hf


def _get(config: Any, field: str) -> Any:
    for name in field.split("."):
        config = getattr(config, name, None)
    return config


def _set(config: Any, field: str, value: Any) -> None:
    *path, name = field.split(".")
    for part in path:
        config = getattr(config, part)
    setattr(config, name, value)


OTHER_STAGES: dict[str, dict[str, int]] = {
    # LXMERT runs its language layers first, then the vision (r_layers) and cross-modality (x_layers) stages: the
    # capture stops at a language layer's attention, so the other stages are built at their minimum, no layers.
    "lxmert": {"r_layers": 0, "x_layers": 0},
    # Funnel's decoder (num_decoder_layers) runs after the encoder's blocks.
    "funnel": {"num_decoder_layers": 0},
}
"""Per-stage layer counts of the stages a capture never reaches (they run after the traced layer list): set to their
minimum in the capture's model (each stage's own field)."""
BLOCKS: dict[str, tuple[str, str]] = {
    # Funnel Transformer counts its layers per block (num_hidden_layers is their sum and cannot be set) and pools
    # the sequence between blocks: the first block's layers attend over the tokens themselves.
    "funnel": ("block_sizes", "block_repeats"),
}
"""Model types whose layers are counted per block (the fields of the block sizes and of their repeats): layers are
numbered across the blocks; the traced ones are the first block's, cut to that block alone."""


NOT_ONE_STACK: dict[str, str] = {
    # Perceiver IO (Jaegle et al., 2021, https://arxiv.org/abs/2107.14795).
    "perceiver": "Perceiver IO's self-attention layers attend over its learned latent array (no positions); the "
    "tokens and their learned position embeddings reach it only through a cross-attention from the latents, and "
    "posenc's unit is a self-attention over the tokens",
    # pi0 (Black et al., 2024, https://arxiv.org/abs/2410.24164).
    "pi0": "pi0 is two models: PaliGemma (vlm_config) fills a cache from an image and a prompt (one bidirectional "
    "prefix), a Gemma action expert (dit_config) attends over it and the actions; it runs on images, state and "
    "actions, and its text config is itself. Export a PaliGemma or Gemma checkpoint instead",
}
"""Model types whose attention is not in one layer list posenc can cut and capture on token ids: why, each said in
the refusal (:func:`layer_count`)."""


ATTENTION_IMPLEMENTATIONS: dict[str, str] = {
    # Nemotron ASR streaming's encoder attention reads its mask as boolean (masked_fill(mask.logical_not(), -inf)):
    # sdpa's mask is; eager's additive 0/min mask gets inverted by it (every visible score -inf, rows of NaN) in
    # transformers 5.23. sdpa, the implementation the model runs by default, is the one that computes the model.
    "nemotron_asr_streaming_encoder": "sdpa",
}
"""Config ``model_type`` (the model's, or a sub-config's) -> the attention implementation the capture builds it
with, where transformers' ``eager`` (the default here: plain tensor code) does not compute the model."""


def attention_implementation(hf: Any) -> str:
    """The attention implementation the capture builds ``hf``'s model with: ``eager``, or the entry of
    :data:`ATTENTION_IMPLEMENTATIONS` for its type or a sub-config's (``encoder_config``)."""
    found = (ATTENTION_IMPLEMENTATIONS.get(str(getattr(config, "model_type", ""))) for config in with_sub_configs(hf))
    return next((name for name in found if name is not None), "eager")


@dataclasses.dataclass(frozen=True)
class NestedAttentions:
    """Where a model type keeps several attentions in each entry of its layer list (one level down, in a
    ``ModuleList``), each an attention of its own in the model's numbering: posenc's layer ``K`` is attention
    ``K % per`` of entry ``K // per``.

    Attributes:
        path: the entry's child that lists them (the attentions themselves, or sublayers holding one).
        per: how many per entry: an int, or the config field that says.
        count: config fields whose product is the number of attentions (posenc's layer count).
        cut: whether the capture builds only the entries it needs (False: the model as configured, every entry).
        why: what the model does (the reason for the entry).
    """

    path: str
    per: int | str
    count: tuple[str, ...]
    cut: bool
    why: str

    def per_entry(self, hf: Any) -> int:
        return self.per if isinstance(self.per, int) else int(getattr(hf, self.per))


NESTED_ATTENTIONS: dict[str, NestedAttentions] = {
    "longcat_flash": NestedAttentions(
        "self_attn", 2, ("num_hidden_layers",), cut=True,
        why="each LongCat-Flash decoder layer calls two MLA attentions (self_attn[0], self_attn[1]), each after its "
        "own norm and with its own weights and cache slot (layer_idx 2N and 2N + 1); the config counts them as "
        "num_hidden_layers = 2 * num_layers",
    ),
    "albert": NestedAttentions(
        "albert_layers", "inner_group_num", ("num_hidden_groups", "inner_group_num"), cut=False,
        why="ALBERT shares its layers across depths: num_hidden_groups groups of inner_group_num layers "
        "(encoder.albert_layer_groups.G.albert_layers.J), group G run at every depth i with "
        "int(i * groups / num_hidden_layers) == G; its attentions are these G * inner_group_num shared modules, "
        "captured at their first depth",
    ),
}  # fmt: skip
"""Model types whose layer entries hold several attentions (:class:`NestedAttentions`)."""


def nested_attentions(hf: Any) -> NestedAttentions | None:
    """The :data:`NESTED_ATTENTIONS` entry of ``hf``'s model type, or None."""
    return NESTED_ATTENTIONS.get(str(getattr(hf, "model_type", "")))


def layer_count(hf: Any) -> int:
    """The number of layers of ``hf``'s layer list (:data:`STACK_COUNTS`, else ``num_hidden_layers`` / ``n_layer`` /
    ``num_layers``).

    Raises:
        ConfigError: a :data:`NOT_ONE_STACK` type (with its reason), or a config naming no count.
    """
    reason = NOT_ONE_STACK.get(str(getattr(hf, "model_type", "")))
    if reason is not None:
        raise ConfigError(f"{reason}.")
    nested = nested_attentions(hf)
    if nested is not None:
        return int(math.prod(int(getattr(hf, field)) for field in nested.count))
    field = STACK_COUNTS.get(str(getattr(hf, "model_type", "")))
    count = _get(hf, field) if field else None
    count = count or getattr(hf, "num_hidden_layers", None) or getattr(hf, "n_layer", None)
    count = count or getattr(hf, "num_layers", None)
    if not isinstance(count, int) or count < 1:
        raise ConfigError(
            f"the {hf.model_type} config names no layer count (num_hidden_layers); posenc traces decoder layers."
        )
    return count


def layer_config(hf: Any, layer: int) -> Any:
    """The config layer ``layer`` is built from: a heterogeneous config's per-layer view (EmbeddingGemma 2's and
    NeoMME's ``per_layer_config``, whose per-layer fields the global config refuses to give), the part's config
    (:func:`part_config`), else ``hf``."""
    if getattr(hf, "is_heterogeneous", False):
        return hf.per_layer_config[layer]
    return part_config(hf)


def built_layers(hf: Any, layers: int) -> int:
    """How many layers :func:`build_base_model` builds to reach layers ``0 .. layers - 1``: one more where the last
    layer differs (:data:`LAST_LAYER_DIFFERS`) and the checkpoint has one."""
    if getattr(hf, "model_type", None) in LAST_LAYER_DIFFERS:
        return min(layers + 1, layer_count(hf))
    nested = nested_attentions(hf)
    if nested is not None and nested.cut:  # whole entries: attentions 0 .. layers - 1 end in entry ceil(layers/per)
        per = nested.per_entry(hf)
        return -(-layers // per) * per
    return layers


def reduced_config(hf: Any, layers: int, stack: str | None = None, *, lists: bool = True) -> Any:
    """A copy of ``hf`` with only the first ``layers`` layers (per-layer lists cut to match, unless ``lists`` is
    False), eager attention; of an encoder-decoder's ``stack``, the first ``layers`` of that stack
    (:func:`posenc.trace.stacks.cut_stack`).

    The capture runs layers ``0 .. N``; a model's later layers are never built.
    """
    reduced = copy.deepcopy(hf)
    nested = nested_attentions(hf)
    if stack is not None or (nested is not None and not nested.cut):  # shared layers (ALBERT's): built whole
        if stack is not None:
            cut_stack(reduced, stack, layers)
        reduced._attn_implementation = attention_implementation(hf)
        return reduced
    total = layer_count(hf)
    field = STACK_COUNTS.get(str(getattr(hf, "model_type", "")))
    for name, minimum in OTHER_STAGES.get(str(getattr(hf, "model_type", "")), {}).items():
        setattr(reduced, name, minimum)
    if str(getattr(hf, "model_type", "")) in BLOCKS:
        _first_block(reduced, layers)
        reduced._attn_implementation = attention_implementation(hf)
        return reduced
    if field and layers < total:  # the per-stack count alone: the cache keeps its slots for every cycle
        _set(reduced, field, layers)
    elif layers < total:
        names = nested.count if nested is not None else ("num_hidden_layers", "n_layer", "num_layers")
        for name in names:  # LongCat-Flash's num_hidden_layers sets num_layers (entries) to half of it
            if isinstance(getattr(reduced, name, None), int):
                try:
                    setattr(reduced, name, layers)
                except NotImplementedError as exc:  # a count computed from per-stage sizes (Funnel's block_sizes)
                    raise ConfigError(
                        f"the {hf.model_type} config computes {name} from per-stage sizes and cannot be cut to "
                        f"layers 0 .. {layers - 1} ({exc}); posenc does not trace models with per-stage layer lists."
                    ) from None
        for name in TRAILING_COUNTS:
            value = getattr(reduced, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(reduced, name, max(0, layers - (total - value)))
        for name, value in list(vars(reduced).items()):
            if lists and isinstance(value, list) and len(value) == total and not name.startswith("_"):
                setattr(reduced, name, value[:layers])
    reduced._attn_implementation = attention_implementation(hf)
    return reduced


def _first_block(config: Any, layers: int) -> None:
    """Cut a :data:`BLOCKS` config to its first block's first ``layers`` layers.

    Raises:
        ConfigError: layer ``layers - 1`` lies in a later block (after the sequence is pooled).
    """
    sizes_field, repeats_field = BLOCKS[config.model_type]
    sizes, repeats = list(getattr(config, sizes_field)), list(getattr(config, repeats_field))
    if layers > sizes[0]:
        block = next(i for i in range(len(sizes)) if sum(sizes[: i + 1]) >= layers)
        raise ConfigError(
            f"layer {layers - 1} of this {config.model_type} model is in block {block} ({sizes_field} {sizes}), "
            f"whose attention reads a pooled sequence; posenc traces the first block's layers 0 .. {sizes[0] - 1}, "
            f"which attend over the tokens themselves."
        )
    setattr(config, sizes_field, [layers])
    setattr(config, repeats_field, repeats[:1])


def build_base_model(hf: Any, layers: int, model_class: Any = None, stack: str | None = None) -> nn.Module:
    """The base model of ``hf`` (transformers ``AutoModel``, else the class its ``architectures`` names: a text tower
    such as ``SiglipTextModel``; ``model_class`` alone where given: a wrapper's text tower, as the wrapper builds it)
    with its first ``layers`` layers, seeded random weights (only the capture call runs on them), eval mode; of an
    encoder-decoder, ``layers`` layers of ``stack``.

    Raises:
        ConfigError: transformers has no model class for this config.
    """
    transformers = import_transformers()
    if stack is None:
        layers = built_layers(hf, layers)
    configs = [reduced_config(hf, layers, stack)]
    if stack is not None:  # a per-layer list that ties the stacks' counts together (LED's attention_window): uncut
        configs.append(copy.deepcopy(hf))
        configs[-1]._attn_implementation = attention_implementation(hf)
    else:  # a list as long as the layers but not per layer (Falcon-H1's two mlp_multipliers at 2 layers): uncut
        configs.append(reduced_config(hf, layers, lists=False))
    builders = _builders(hf, model_class)
    first: Exception | None = None
    for config in configs:
        for build in builders:
            try:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(0)
                    return build(config, attn_implementation=attention_implementation(hf)).eval()
            except (ValueError, KeyError, TypeError, IndexError) as exc:  # IndexError: NeoMME's first full layer
                first = first or exc
    raise ConfigError(
        f"transformers {transformers.__version__} cannot build a {hf.model_type} model from this config "
        f"({str(first)[:200]}); posenc traces models transformers can build."
    )


def _builders(hf: Any, model_class: Any) -> list[Any]:
    """The ``_from_config`` builders :func:`build_base_model` tries, in order."""
    transformers = import_transformers()
    if model_class is not None:
        return [model_class._from_config]
    builders = [transformers.AutoModel.from_config]
    for name in getattr(hf, "architectures", None) or []:  # a text tower AutoModel does not map (SiglipTextModel)
        found = getattr(transformers, str(name), None)
        if isinstance(found, type) and issubclass(found, transformers.PreTrainedModel):
            named: Any = found
            builders.append(named._from_config)
    # A text tower transformers neither maps nor exports (AltRobertaModel, Kosmos2TextModel, DiaDecoder): the
    # model classes its config's own modeling package declares for that config, base models first.
    own: list[Any] = base_classes_first(module_classes(type(hf)))
    builders += [cls._from_config for cls in own]
    return builders


def one_stack(hf: Any, stack: str, layer_type: str | None, model_class: Any = None) -> str:
    """The stack a layer of an encoder-decoder config is in: ``stack``, or the one stack the model transformers
    builds from ``hf`` is (a decoder tower whose config says encoder-decoder: :func:`posenc.trace.stacks.lone_stack`,
    on a model built on the meta device from a config with distinct stack counts: no memory, no weights).

    Raises:
        ConfigError: ``layer_type`` names the stack a one-stack model is not.
    """
    probe = lone_config(hf)
    probe._attn_implementation = "eager"
    for build in _builders(hf, model_class):
        try:
            with torch.device("meta"):
                model = build(probe, attn_implementation="eager")
        except (ValueError, KeyError, TypeError, RuntimeError, NotImplementedError):
            continue  # the capture's own build reports a config it cannot build
        lone = lone_stack(model)
        return stack if lone is None else check_lone(hf, lone, layer_type)
    return stack


def module_classes(config_class: type) -> list[type]:
    """``PreTrainedModel`` classes of the config's model package (every ``modeling_*`` module: BLIP's text model
    lives in ``modeling_blip_text``) whose ``config_class`` is ``config_class``, in definition order."""
    transformers = import_transformers()
    package = importlib.import_module(config_class.__module__.rpartition(".")[0])
    found = []
    for info in pkgutil.iter_modules(getattr(package, "__path__", [])):
        if not info.name.startswith("modeling_"):
            continue
        try:
            module = importlib.import_module(f"{package.__name__}.{info.name}")
        except ImportError:  # a backend this environment lacks (tf, flax, ...)
            continue
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, transformers.PreTrainedModel)
                and value.__module__ == module.__name__
                and getattr(value, "config_class", None) is config_class
            ):
                found.append(value)
    return found


def base_classes_first(classes: list[type]) -> list[type]:
    """``classes`` without the abstract ``*PreTrainedModel`` ones, those without a head (no ``For`` in the name:
    ``Kosmos2TextModel``, ``DiaDecoder``) before the heads."""
    concrete = [c for c in classes if "PreTrained" not in c.__name__]
    return sorted(concrete, key=lambda c: "For" in c.__name__)


def layer_list(model: nn.Module, count: int) -> tuple[str, nn.ModuleList]:
    """The ``(path, ModuleList)`` of the model's decoder layers (the list of ``count`` modules; its
    :data:`LAYER_PATHS` entry where the model has several alike)."""
    path = LAYER_PATHS.get(str(getattr(getattr(model, "config", None), "model_type", "")))
    if path is not None:
        return path, model.get_submodule(path)  # type: ignore[return-value]  # a ModuleList by the table
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == count
             and not all(isinstance(child, nn.ModuleList) for child in m)]  # fmt: skip  # blocks of layers: no
    found.sort(key=lambda item: (item[0].split(".")[-1] not in ("layers", "h", "layer", "blocks"), len(item[0])))
    if not found:
        raise ConfigError(f"cannot find the {count} decoder layers of {type(model).__name__}; posenc cannot trace it.")
    return found[0]


def _is_attention(name: str, module: nn.Module) -> bool:
    cls = type(module).__name__
    if "cross" in name.lower() or "encoder_attn" in name.lower() or "Cross" in cls:
        return False
    after = cls.split("Attention")[-1]  # a norm after attention (AttentionNorm), not a pre-norm model's attention
    return "Attention" in cls and "Norm" not in after and "Rotary" not in cls


def attention_child(layer_module: nn.Module) -> tuple[str, nn.Module] | None:
    """The layer's self-attention module ``(child name, module)``, or None (a layer without attention)."""
    children = dict(layer_module.named_children())
    for name in ATTENTION_NAMES:
        if name in children and _is_attention(name, children[name]):
            return name, children[name]
    for name, child in children.items():
        if _is_attention(name, child):
            return name, child
    return None


@dataclasses.dataclass(frozen=True)
class Located:
    """Where layer N's attention sits in a base model.

    Attributes:
        list_path: the path of the layer list (``layers``, XLM's ``attentions``); ``entry``: the index in it.
        child: the attention's path inside the entry (``self_attn``; LongCat-Flash's ``self_attn.1``; empty where
            the entry is the attention itself: XLM's ``attentions.N``); None: the entry holds no attention.
        attention: the attention module (None where ``child`` is).
        layer: the entry (the layer module; for an error naming what it holds).
    """

    list_path: str
    entry: int
    child: str | None
    attention: nn.Module | None
    layer: nn.Module

    @property
    def layer_path(self) -> str:
        return f"{self.list_path}.{self.entry}"

    @property
    def path(self) -> str:
        return f"{self.layer_path}.{self.child}" if self.child else self.layer_path


def locate_attention(model: nn.Module, hf: Any, layer: int) -> Located:
    """Layer ``layer``'s self-attention in a base model built for it (:func:`build_base_model`, no stack).

    The layer list's entry ``layer`` and its attention child (:func:`attention_child`); for a model type of
    :data:`NESTED_ATTENTIONS`, attention ``layer % per`` of entry ``layer // per``; where the entry holds no
    attention but another list of as many modules holds the attentions themselves (XLM and FlauBERT keep theirs in
    ``attentions`` beside ``layer_norm1``, ``ffns``, ``layer_norm2``: no module per layer), that list's entry.
    """
    nested = nested_attentions(hf)
    if nested is not None:
        per = nested.per_entry(hf)
        entry, inner = divmod(layer, per)
        entries = -(-built_layers(hf, layer + 1) // per) if nested.cut else None
        list_path, layers = _entry_list(model, nested.path, entries)
        listed = layers[entry].get_submodule(nested.path) if entry < len(layers) else None
        held = listed[inner] if isinstance(listed, nn.ModuleList) else None
        if held is None:
            return Located(list_path, entry, None, None, layers[min(entry, len(layers) - 1)])
        found = attention_child(held)  # a sublayer holding it (ALBERT's), else the attention the table names
        if found is None:  # LongCat-Flash's LongcatFlashMLA
            return Located(list_path, entry, f"{nested.path}.{inner}", held, layers[entry])
        return Located(list_path, entry, f"{nested.path}.{inner}.{found[0]}", found[1], layers[entry])
    count = built_layers(hf, layer + 1)
    list_path, layers = layer_list(model, count)
    found = attention_child(layers[layer])
    if found is not None:
        return Located(list_path, layer, found[0], found[1], layers[layer])
    for path, module in model.named_modules():  # the attentions in a list of their own (XLM's attentions)
        if isinstance(module, nn.ModuleList) and len(module) == count and _is_attention(path, module[layer]):
            return Located(path, layer, "", module[layer], module[layer])
    return Located(list_path, layer, None, None, layers[layer])


def _entry_list(model: nn.Module, child: str, count: int | None) -> tuple[str, nn.ModuleList]:
    """The layer list whose entries hold ``child`` (a :data:`NESTED_ATTENTIONS` model's; of ``count`` entries where
    given)."""
    for path, module in model.named_modules():
        if (isinstance(module, nn.ModuleList) and len(module) and (count is None or len(module) == count)
                and all(isinstance(getattr(e, child.split(".")[0], None), nn.ModuleList) for e in module)):  # fmt: skip
            return path, module
    raise ConfigError(f"cannot find the layers of {type(model).__name__} holding {child}; posenc cannot trace it.")


def attention_layers(hf: Any) -> list[int] | None:
    """Layers with softmax attention according to ``layer_types`` (None: the config does not say)."""
    kinds = getattr(hf, "layer_types", None)
    if not kinds:
        return None
    return [i for i, kind in enumerate(kinds) if not any(word in str(kind) for word in LINEAR_KINDS)]


def no_attention_error(hf: Any, layer: int, layer_module: nn.Module) -> ConfigError:
    held = ", ".join(f"{type(child).__name__} ({name})" for name, child in layer_module.named_children())
    with_attention = attention_layers(hf)
    where = f"; layers with attention: {with_attention[:12]}" if with_attention else ""
    return ConfigError(
        f"layer {layer} of this {hf.model_type} model has no softmax attention (it holds {held}){where}. "
        f"Pass --layer N of a layer with attention."
    )


def default_layer(hf: Any, layer_type: str | None) -> int:
    """The first layer of ``layer_type`` (or the first with attention when the config lists layer types)."""
    kinds = list(getattr(hf, "layer_types", None) or [])
    if layer_type is not None:
        if layer_type not in kinds:
            raise ConfigError(
                f"this {hf.model_type} model has no layer type {layer_type!r}"
                + (f"; its layer types are {sorted(set(kinds))}." if kinds else "; it has one layer type.")
            )
        return kinds.index(layer_type)
    with_attention = attention_layers(hf)
    return with_attention[0] if with_attention else 0


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings (config consistency notes, slow-kernel fallbacks) silenced while posenc builds and runs
    a model it only captures a call from."""
    import warnings

    logging = import_transformers().logging
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(level)


__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "ATTENTION_NAMES",
    "BLOCKS",
    "LAST_LAYER_DIFFERS",
    "LAYER_PATHS",
    "LINEAR_KINDS",
    "NESTED_ATTENTIONS",
    "NOT_ONE_STACK",
    "OTHER_STAGES",
    "STACK_COUNTS",
    "TRAILING_COUNTS",
    "Located",
    "NestedAttentions",
    "attention_child",
    "attention_implementation",
    "attention_layers",
    "base_classes_first",
    "build_base_model",
    "built_layers",
    "class_path",
    "default_layer",
    "layer_config",
    "layer_count",
    "layer_list",
    "locate_attention",
    "module_classes",
    "nested_attentions",
    "no_attention_error",
    "one_stack",
    "part_config",
    "part_view",
    "quiet_transformers",
    "reduced_config",
]
