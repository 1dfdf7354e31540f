"""The base model a capture runs, and the layer's attention in it.

:func:`build_base_model` builds a checkpoint's base model with transformers from its config (layers ``0 .. N`` only,
eager attention, seeded random weights); :func:`layer_list` and :func:`attention_child` find layer N's self-attention
module in it; :func:`default_layer` picks the layer from ``layer_types``. Used by :mod:`posenc.trace.capture`.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from posenc.checkpoints.reference import import_transformers
from posenc.errors import ConfigError
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
TIED_KINDS: dict[str, str] = {
    # Zamba ties every hybrid layer's shared transformer to the first one's and its tie check refuses a model with
    # one hybrid layer (transformers 5.23: "an issue with your definition of `tie_weights_keys`").
    "zamba": "hybrid",
}
"""Model types that tie the modules of one layer kind (``layer_types`` entry) across layers and cannot be built with
a single layer of it: the capture builds through the second such layer."""
LINEAR_KINDS = ("linear_attention", "mamba", "conv", "recurrent", "ssm", "mlp", "moe", "dummy")
"""``layer_types`` entries of layers without softmax attention."""


def class_path(module: Any) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


STACK_COUNTS: dict[str, str] = {
    # HRM runs two stacks of num_layers_per_stack layers (L_module, H_module) in cycles; num_hidden_layers counts
    # its cache slots (layers x cycles). Layer N is layer N of the first stack, called first at cycle offset 0.
    "hrm_text": "num_layers_per_stack",
}
"""Model types whose layer list counts by another field than ``num_hidden_layers``: the field."""


def layer_count(hf: Any) -> int:
    field = STACK_COUNTS.get(str(getattr(hf, "model_type", "")))
    count = getattr(hf, field, None) if field else None
    count = count or getattr(hf, "num_hidden_layers", None) or getattr(hf, "n_layer", None)
    count = count or getattr(hf, "num_layers", None)
    if not isinstance(count, int) or count < 1:
        raise ConfigError(
            f"the {hf.model_type} config names no layer count (num_hidden_layers); posenc traces decoder layers."
        )
    return count


def layer_config(hf: Any, layer: int) -> Any:
    """The config layer ``layer`` is built from: a heterogeneous config's per-layer view (EmbeddingGemma 2's and
    NeoMME's ``per_layer_config``, whose per-layer fields the global config refuses to give), else ``hf``."""
    if getattr(hf, "is_heterogeneous", False):
        return hf.per_layer_config[layer]
    return hf


def built_layers(hf: Any, layers: int) -> int:
    """How many layers :func:`build_base_model` builds to reach layers ``0 .. layers - 1``: one more where the last
    layer differs (:data:`LAST_LAYER_DIFFERS`) and the checkpoint has one; through the second layer of a kind whose
    modules the model ties (:data:`TIED_KINDS`) where the first layers hold one."""
    if getattr(hf, "model_type", None) in LAST_LAYER_DIFFERS:
        return min(layers + 1, layer_count(hf))
    tied = TIED_KINDS.get(str(getattr(hf, "model_type", "")))
    kinds = list(getattr(hf, "layer_types", None) or []) if tied else []
    of_kind = [i for i, kind in enumerate(kinds) if kind == tied]
    if len(of_kind) > 1 and sum(i < layers for i in of_kind) == 1:
        return max(layers, of_kind[1] + 1)
    return layers


def reduced_config(hf: Any, layers: int, stack: str | None = None, *, lists: bool = True) -> Any:
    """A copy of ``hf`` with only the first ``layers`` layers (per-layer lists cut to match, unless ``lists`` is
    False), eager attention; of an encoder-decoder's ``stack``, the first ``layers`` of that stack
    (:func:`posenc.trace.stacks.cut_stack`).

    The capture runs layers ``0 .. N``; a model's later layers are never built.
    """
    reduced = copy.deepcopy(hf)
    if stack is not None:
        cut_stack(reduced, stack, layers)
        reduced._attn_implementation = "eager"
        return reduced
    total = layer_count(hf)
    field = STACK_COUNTS.get(str(getattr(hf, "model_type", "")))
    if field and layers < total:  # the per-stack count alone: the cache keeps its slots for every cycle
        setattr(reduced, field, layers)
    elif layers < total:
        for name in ("num_hidden_layers", "n_layer", "num_layers"):
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
    reduced._attn_implementation = "eager"
    return reduced


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
        configs[-1]._attn_implementation = "eager"
    else:  # a list as long as the layers but not per layer (Falcon-H1's two mlp_multipliers at 2 layers): uncut
        configs.append(reduced_config(hf, layers, lists=False))
    builders = _builders(hf, model_class)
    first: Exception | None = None
    for config in configs:
        for build in builders:
            try:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(0)
                    return build(config, attn_implementation="eager").eval()
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
    """The ``(path, ModuleList)`` of the model's decoder layers (the list of ``count`` modules)."""
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == count]
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
    "LAST_LAYER_DIFFERS",
    "LINEAR_KINDS",
    "STACK_COUNTS",
    "TIED_KINDS",
    "TRAILING_COUNTS",
    "attention_child",
    "attention_layers",
    "base_classes_first",
    "build_base_model",
    "built_layers",
    "class_path",
    "default_layer",
    "layer_config",
    "layer_count",
    "layer_list",
    "module_classes",
    "no_attention_error",
    "one_stack",
    "quiet_transformers",
    "reduced_config",
]
