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
import pkgutil
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from posenc.checkpoints.reference import import_transformers
from posenc.errors import ConfigError
from posenc.trace.counts import attention_implementation, built_layers, nested_attentions, reduced_config
from posenc.trace.stacks import check_lone, holds_stack, lone_config, lone_stack

ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention", "mixer")
"""Child names under which decoder layers hold their attention module (tried first, in order)."""
LINEAR_KINDS = ("linear_attention", "mamba", "conv", "recurrent", "ssm", "mlp", "moe", "dummy")
"""``layer_types`` entries of layers without softmax attention."""


def class_path(module: Any) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


LAYER_PATHS: dict[str, str] = {
    # BLT's patcher, global transformer and local decoder hold layer lists of their own.
    "blt": "local_encoder.layers",
}
"""Model types whose traced layer list is one of several alike: its path in the base model."""


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
    lone = lone_of(hf, model_class) if stack is not None else None
    first: Exception | None = None
    without: list[str] = []  # models built that do not hold the stack (LED's cut config builds LEDDecoder alone)
    for config in configs:
        for build in builders:
            try:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(0)
                    model = build(config, attn_implementation=attention_implementation(hf)).eval()
            except (ValueError, KeyError, TypeError, IndexError) as exc:  # IndexError: NeoMME's first full layer
                first = first or exc
                continue
            if stack is None or holds_stack(model, stack, lone):
                return model
            without.append(type(model).__name__)
    if without:
        raise ConfigError(
            f"transformers {transformers.__version__} builds no {hf.model_type} model holding its {stack} stack "
            f"from this config (it builds {', '.join(sorted(set(without)))}, which hold"
            f"{'s' if len(set(without)) == 1 else ''} no module named '{stack}'"
            + (f"; the first refusal: {str(first)[:200]}" if first is not None else "")
            + "); posenc traces a stack only in a model that holds it."
        )
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
    lone = lone_of(hf, model_class)
    return stack if lone is None else check_lone(hf, lone, layer_type)


def lone_of(hf: Any, model_class: Any = None) -> str | None:
    """The stack the model transformers builds from an encoder-decoder config ``hf`` is, where it is one stack alone
    (:func:`posenc.trace.stacks.lone_stack` of the first model :func:`_builders` builds from
    :func:`~posenc.trace.stacks.lone_config` on the meta device); None where that model holds both stacks, or none
    builds."""
    probe = lone_config(hf)
    probe._attn_implementation = "eager"
    for build in _builders(hf, model_class):
        try:
            with torch.device("meta"):
                model = build(probe, attn_implementation="eager")
        except (ValueError, KeyError, TypeError, RuntimeError, NotImplementedError):
            continue  # the capture's own build reports a config it cannot build
        return lone_stack(model)
    return None


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
    # a decoder layer held by a layer (Zamba's shared transformer) holds the attention: attention_child looks inside
    return "Attention" in cls and "Norm" not in after and "DecoderLayer" not in after and "Rotary" not in cls


def attention_child(layer_module: nn.Module) -> tuple[str, nn.Module] | None:
    """The layer's self-attention module ``(child name, module)``, or None (a layer without attention)."""
    children = dict(layer_module.named_children())
    for name in ATTENTION_NAMES:
        if name in children and _is_attention(name, children[name]):
            return name, children[name]
    for name, child in children.items():
        if _is_attention(name, child):
            return name, child
    for name, child in children.items():  # held in a module named for it (DBRX's norm_attn_norm, Zamba's hybrid layer)
        inner = attention_child(child) if "Attention" in type(child).__name__ else None
        if inner is not None:
            return f"{name}.{inner[0]}", inner[1]
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
    :data:`~posenc.trace.counts.NESTED_ATTENTIONS`, attention ``layer % per`` of entry ``layer // per``; where the
    entry holds no attention but another list of as many modules holds the attentions themselves (XLM and FlauBERT
    keep theirs in ``attentions`` beside ``layer_norm1``, ``ffns``, ``layer_norm2``: no module per layer), that
    list's entry.
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
    """The layer list whose entries hold ``child`` (a :data:`~posenc.trace.counts.NESTED_ATTENTIONS` model's; of
    ``count`` entries where given)."""
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
    "ATTENTION_NAMES",
    "LAYER_PATHS",
    "LINEAR_KINDS",
    "Located",
    "attention_child",
    "attention_layers",
    "base_classes_first",
    "build_base_model",
    "class_path",
    "default_layer",
    "layer_list",
    "locate_attention",
    "lone_of",
    "module_classes",
    "no_attention_error",
    "one_stack",
    "quiet_transformers",
]
