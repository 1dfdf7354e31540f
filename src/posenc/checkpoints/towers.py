"""Text towers: a checkpoint whose ``model_type`` wraps a text model loads its text tower's layer through the
tower's family.

Vision-language, audio-language and other wrappers (``llava``, ``gemma3``, ``mistral3``, ``idefics3``,
``qwen2_audio``, ``llama4``, ...) describe their language model with ``config.get_text_config()`` and build it as
a submodule (``model.language_model``, ``model.text_model``, ``language_model``, ...). posenc finds that submodule
the way transformers builds it, with no table of wrappers:

1. the wrapper's model class (``config.json``'s ``architectures``, else its ``AutoModel`` class) is built on the
   meta device (no memory, no weights); an in-memory model is used as it is;
2. its outermost submodel whose config is the text tower's ``model_type`` is the tower; the module under it that
   sits at the family's layer path (``layers.3.self_attn``) gives the tower's root in memory
   (``model.language_model.``), and the tower's config is the one the wrapper built it with;
3. ``save_pretrained`` reverts transformers' weight conversions before it writes (Llava-style wrappers are written
   as ``language_model.model.layers...``), so the root on disk is that revert
   (``transformers.core_model_loading.revert_weight_conversion``) applied to the layer's name; the loader takes
   the first root under which the checkpoint holds the layer.

The reference of such a layer is the tower's own attention module, the class the wrapper builds for that layer
(checked by name against the family's reference), made from the tower's config.

A tower whose ``model_type`` no family claims goes through the traced path instead (:mod:`posenc.trace.capture`):
:func:`base_tower` gives the tower's base model as the wrapper builds it (its class and config, and its path in the
wrapper) and the names its tensors have in the checkpoint (:meth:`BaseTower.checkpoint_names`: the saved name
``revert_weight_conversion`` gives, then the in-memory one, then the tensor the wrapper ties it to: DiffusionGemma
writes its encoder's text layers once, as its decoder's), so the traced unit is the wrapper's own text module.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from posenc.checkpoints.reference import import_transformers
from posenc.errors import BackendUnavailable, ConfigError


@dataclasses.dataclass(frozen=True)
class Tower:
    """Where a wrapper checkpoint keeps one layer of its text tower.

    Attributes:
        wrapper: the checkpoint's ``model_type`` (``llava``).
        model_type: the text tower's ``model_type`` (``llama``).
        config: the tower's transformers config as the wrapper builds the tower with it (a copy, eager attention).
        roots: the tower's model root in the checkpoint, most likely first: as ``save_pretrained`` writes it
            (``language_model.model.``), then as the model holds it in memory (``model.language_model.``).
        saved: the layer's attention tensors (names relative to the attention module) under the full names
            ``save_pretrained`` writes, where those are not a root plus the in-memory path (a conversion that
            renames inside the layer); empty otherwise.
        attention_class: the class name of the attention module the wrapper builds for the layer.
    """

    wrapper: str
    model_type: str
    config: Any
    roots: tuple[str, ...]
    saved: Mapping[str, str]
    attention_class: str


@dataclasses.dataclass(frozen=True)
class BaseTower:
    """The base model of a wrapper's text tower, as the wrapper builds it (the traced path's tower).

    Attributes:
        wrapper: the checkpoint's ``model_type`` (``blip-2``).
        model_type: the tower's ``model_type`` (``opt``).
        path: the base model's path in the wrapper model (``language_model.model``: the ``OPTModel`` under the
            ``OPTForCausalLM`` the wrapper holds).
        model_class: its transformers class (``OPTModel``).
        config: the config the wrapper built it with (a copy, eager attention).
        model: the wrapper model (on the meta device for a folder; the in-memory model as given) for the names of
            its tensors on disk.
        in_memory: the checkpoint is an in-memory model (its tensors carry their in-memory names).
    """

    wrapper: str
    model_type: str
    path: str
    model_class: type
    config: Any
    model: Any = dataclasses.field(repr=False, compare=False)
    in_memory: bool = False

    def checkpoint_names(self, relative: str) -> tuple[str, ...]:
        """The names the checkpoint may hold the tower's tensor ``relative`` (relative to the base model,
        ``decoder.layers.0.self_attn.q_proj.weight``) under, most likely first: as ``save_pretrained`` writes it
        (transformers' ``revert_weight_conversion``), then as the wrapper holds it in memory, then the tensor the
        wrapper ties it to (``all_tied_weights_keys``: ``save_pretrained`` writes a tied tensor once, under its
        source's name; DiffusionGemma's encoder text layers are its decoder's)."""
        inner = f"{self.path}.{relative}" if self.path else relative
        if self.in_memory:
            return (inner,)
        from transformers.core_model_loading import revert_weight_conversion

        names = [inner]
        tied = getattr(self.model, "all_tied_weights_keys", None) or {}
        if inner in tied:
            names.append(str(tied[inner]))
        saved = []
        for name in names:
            try:
                (found,) = revert_weight_conversion(self.model, {name: torch.empty(0, device="meta")})
            except Exception:  # a conversion that cannot run on one meta tensor: the in-memory name
                found = name
            saved.append(str(found))
        return tuple(dict.fromkeys((saved[0], inner, *saved[1:], *names[1:])))


def base_tower(hf: Any, config: dict[str, Any], model: Any, stack: str | None = None) -> BaseTower | None:
    """The base model of the text tower of a wrapper checkpoint (see the module docstring), or None when its config
    is its own text config.

    Args:
        hf: the checkpoint's transformers config.
        config: its ``config.json`` (for ``architectures``).
        model: the in-memory transformers model, or None for a folder (the wrapper is built on the meta device).
        stack: where the wrapper holds a submodel of its tower's type per stack (T5Gemma's ``model.encoder`` and
            ``model.decoder``), the one whose name ends with it.

    Raises:
        ConfigError: the wrapper does not build, or holds several submodels of its tower's model_type (and
            ``stack`` names none of them).
        BackendUnavailable: the wrapper's model class needs a package that is missing here.
    """
    tower_type = text_model_type(hf)
    if tower_type is None:
        return None
    built = model if model is not None else _meta_model(hf, config)
    name, tower = _tower_module(built, tower_type, hf.model_type, stack)
    base = getattr(tower, "base_model", tower)
    prefix = getattr(tower, "base_model_prefix", "")
    if base is not tower and prefix and getattr(tower, prefix, None) is base:
        name = f"{name}.{prefix}"
    else:
        base = tower
    text = copy.deepcopy(base.config)
    text._attn_implementation = "eager"
    return BaseTower(hf.model_type, tower_type, name, type(base), text, built, model is not None)


def text_config(hf: Any) -> Any:
    """``hf.get_text_config()``; where that is ambiguous (MusicGen holds a T5 ``text_encoder`` and its own
    ``decoder``), transformers' text stack that generates, ``get_text_config(decoder=True)``."""
    getter = getattr(hf, "get_text_config", None)
    if getter is None:
        return hf
    try:
        return getter()
    except ValueError:  # "Multiple valid text configs were found"
        return getter(decoder=True)


def text_model_type(hf: Any) -> str | None:
    """The ``model_type`` of the text tower :func:`text_config` describes, or None when the config is its own
    text config (no tower)."""
    text = text_config(hf)
    if text is hf or getattr(text, "model_type", None) in (None, "", hf.model_type):
        return None
    return str(text.model_type)


def locate(hf: Any, config: dict[str, Any], model: Any, layer_path: str) -> Tower:
    """The text tower of a wrapper checkpoint, found in its transformers model (see the module docstring).

    Args:
        hf: the wrapper's transformers config.
        config: its ``config.json`` (for ``architectures``).
        model: the in-memory transformers model, or None for a folder (the model is then built on the meta device).
        layer_path: the layer's attention module relative to the tower root (the family's prefix,
            ``layers.3.self_attn.``).

    Raises:
        ConfigError: the config has no text tower, or the wrapper model has no module at the layer's path.
        BackendUnavailable: the wrapper's model class cannot be built here (e.g. a vision tower needing timm).
    """
    tower_type = text_model_type(hf)
    if tower_type is None:
        raise ConfigError(f"model_type {hf.model_type!r} has no text tower (its get_text_config() is itself).")
    built = model if model is not None else _meta_model(hf, config)
    name, tower = _tower_module(built, tower_type, hf.model_type)
    suffix = layer_path.rstrip(".")
    found = [n for n, _ in tower.named_modules() if n == suffix or n.endswith("." + suffix)]
    shallowest = [n for n in found if n.count(".") == min(m.count(".") for m in found)]
    found = shallowest if len(shallowest) == 1 else found  # the decoder's layer, not a deeper copy's (MTP heads)
    if len(found) != 1:
        raise ConfigError(
            f"{hf.model_type}'s text tower ({type(tower).__name__}, model_type {tower_type!r}) has "
            f"{'no' if not found else 'more than one'} module at {suffix!r}; is the layer index within its "
            f"{getattr(tower.config, 'num_hidden_layers', '?')} layers?"
        )
    inner = f"{name}.{found[0]}" if name else found[0]
    memory_root = inner[: -len(suffix)]
    attention = built.get_submodule(inner)
    roots, saved = [memory_root], {}
    if model is None:
        saved = _saved_names(built, inner, attention)
        roots.insert(0, _saved_root(saved, suffix) or memory_root)
        saved = {k: v for k, v in saved.items() if v != f"{inner}.{k}" and v != f"{roots[0]}{suffix}.{k}"}
    text = copy.deepcopy(tower.config)
    text._attn_implementation = "eager"
    return Tower(hf.model_type, tower_type, text, tuple(dict.fromkeys(roots)), saved, type(attention).__name__)


def _meta_model(hf: Any, config: dict[str, Any]) -> Any:
    """The wrapper's model class (``architectures[0]``, else its AutoModel class) built on the meta device."""
    transformers = import_transformers()
    names = [str(a) for a in config.get("architectures") or []]
    model_class = next((getattr(transformers, n) for n in names if hasattr(transformers, n)), None)
    try:
        with torch.device("meta"):
            if model_class is None:
                return transformers.AutoModel.from_config(hf)
            return model_class(hf)
    except ImportError as exc:
        raise BackendUnavailable(
            f"posenc finds the text tower of a {hf.model_type} checkpoint by building its transformers model on "
            f"the meta device, which needs a missing package: {str(exc).strip()[:300]}"
        ) from None
    except Exception as exc:
        raise ConfigError(
            f"cannot build the {hf.model_type} model (on the meta device) to find its text tower: "
            f"{type(exc).__name__}: {str(exc)[:300]}"
        ) from None


def _tower_module(model: Any, tower_type: str, wrapper: str, stack: str | None = None) -> tuple[str, Any]:
    """``(name, module)`` of the outermost submodel of ``model`` whose config has ``model_type == tower_type``; of
    several, the one whose name ends with ``stack`` where one does."""
    transformers = import_transformers()
    found: list[tuple[str, Any]] = []
    for name, module in model.named_modules():
        if not name or not isinstance(module, transformers.PreTrainedModel):
            continue
        if getattr(module.config, "model_type", None) != tower_type:
            continue
        if not any(name.startswith(outer + ".") for outer, _ in found):
            found.append((name, module))
    picked = [(n, m) for n, m in found if stack and n.rsplit(".", 1)[-1] == stack]
    found = picked if len(found) > 1 and len(picked) == 1 else found
    if len(found) != 1:
        raise ConfigError(
            f"the {wrapper} model holds {len(found)} submodels of its text tower's model_type {tower_type!r} "
            f"({[n for n, _ in found]}); posenc needs exactly one to know which layer is meant."
        )
    return found[0]


def _saved_names(model: Any, inner: str, attention: Any) -> dict[str, str]:
    """The attention module's tensors (names relative to it) -> the full names ``save_pretrained`` writes:
    transformers reverts its weight conversions on save (``revert_weight_conversion``), here on meta tensors."""
    from transformers.core_model_loading import revert_weight_conversion

    relative = [name for name, _ in attention.named_parameters()]
    saved = {}
    for name in relative:
        try:
            (full,) = revert_weight_conversion(model, {f"{inner}.{name}": torch.empty(0, device="meta")})
        except Exception:  # a conversion that cannot run on one meta tensor: keep the in-memory name
            full = f"{inner}.{name}"
        saved[name] = str(full)
    return saved


def _saved_root(saved: Mapping[str, str], suffix: str) -> str | None:
    """The tower root of the saved names: what precedes the layer path's segments (``language_model.model.`` of
    ``language_model.model.layers.1.self_attn.q_proj.weight``), also where a conversion renames inside the path."""
    for relative, full in saved.items():
        tail = len(f"{suffix}.{relative}".split("."))
        pieces = full.split(".")
        if len(pieces) >= tail:
            return "".join(piece + "." for piece in pieces[:-tail])
    return None


__all__ = ["BaseTower", "Tower", "base_tower", "locate", "text_config", "text_model_type"]
