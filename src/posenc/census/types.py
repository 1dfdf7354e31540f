"""The text model types of the installed transformers, derived from transformers itself.

A ``model_type`` of ``transformers.CONFIG_MAPPING`` is a *text model type* when a model of it reads token ids:

1. its default config instantiates;
2. it has a model class (its Auto base class, an Auto head class, or — for a text tower registered only as another
   model's ``text_config`` — a ``PreTrainedModel`` of its modeling module whose ``config_class`` is its config);
3. that model's ``forward`` takes ``input_ids`` or ``decoder_input_ids``;
4. a composite (its ``get_text_config()`` is a sub-config) counts only where transformers maps it to a head that
   reads or writes text (causal / masked / seq2seq LM, image-text-to-text, classification, ...); a dual encoder
   (CLIP-like) is left out, its text tower being a type of its own.

Each type gets a *kind*: ``text`` (its config is its own text config), ``multimodal`` (a composite whose text
config is another type, e.g. llava -> llama) or ``tower`` (a text config of another type with no head of its own,
e.g. qwen2_vl_text). Everything left out is listed with the reason, so the census accounts for every type.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

from posenc.checkpoints.reference import import_transformers

CHECKPOINT_HEADS: tuple[str, ...] = (
    "CAUSAL_LM",
    "IMAGE_TEXT_TO_TEXT",
    "MULTIMODAL_LM",
    "SEQ_TO_SEQ_CAUSAL_LM",
    "SPEECH_SEQ_2_SEQ",
    "MASKED_LM",
)
"""The head a tiny checkpoint is saved from, first match: the class real checkpoints of the type are saved from
(its tensor names carry that class's prefixes, e.g. ``model.`` of ``...ForCausalLM``); else the base model."""
TEXT_HEADS: tuple[str, ...] = (
    *CHECKPOINT_HEADS,
    "TEXT_ENCODING",
    "SEQUENCE_CLASSIFICATION",
    "TOKEN_CLASSIFICATION",
    "QUESTION_ANSWERING",
    "VISUAL_QUESTION_ANSWERING",
    "DOCUMENT_QUESTION_ANSWERING",
    "PRETRAINING",
    "TEXT_TO_SPECTROGRAM",
    "TEXT_TO_WAVEFORM",
)
"""transformers' Auto head mappings (``MODEL_FOR_<name>_MAPPING_NAMES``) whose models read or write text."""
TOKEN_INPUTS = ("input_ids", "decoder_input_ids")
KINDS = ("text", "multimodal", "tower")


@dataclasses.dataclass(frozen=True)
class ModelType:
    """A text model type of the installed transformers.

    Attributes:
        name: the ``model_type``.
        kind: ``text``, ``multimodal`` or ``tower`` (see the module docstring).
        text_type: the ``model_type`` of its text config (itself for ``text`` and ``tower``).
        config_class: the transformers config class name.
        model_class: the class its tiny checkpoint is saved from.
    """

    name: str
    kind: str
    text_type: str
    config_class: str
    model_class: str


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """A ``model_type`` of transformers that is not a text model type, and why."""

    name: str
    reason: str


def _mapping(name: str) -> dict[str, Any]:
    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    return dict(getattr(auto, f"MODEL_FOR_{name}_MAPPING_NAMES", {}) if name != "MODEL" else auto.MODEL_MAPPING_NAMES)


def _first_class_name(value: Any) -> str:
    return str(value[0] if isinstance(value, (list, tuple)) else value)


def model_classes_for(
    model_type: str, config_class: type | None = None, encoder_decoder: bool = False, composite: bool = False
) -> list[type]:
    """The classes a tiny checkpoint of ``model_type`` may be saved from, best first (see :data:`CHECKPOINT_HEADS`):
    an encoder-decoder's sequence-to-sequence head first (BART has a decoder-only ``BartForCausalLM`` too), a
    composite's multimodal head first, and none whose ``config_class`` is not the composite's config (a head of its
    text part); then the modeling module's own classes of the config."""
    transformers = import_transformers()

    def preferred(head: str) -> bool:
        if encoder_decoder:
            return "SEQ" in head
        return composite and head in ("IMAGE_TEXT_TO_TEXT", "MULTIMODAL_LM")

    found: list[type] = []
    for head in (*sorted(CHECKPOINT_HEADS, key=lambda head: not preferred(head)), "MODEL"):
        name = _mapping(head).get(model_type)
        cls = getattr(transformers, _first_class_name(name), None) if name is not None else None
        try:
            declared = getattr(cls, "config_class", None)
        except ImportError:  # a placeholder for a missing backend: kept, and reported as such by the caller
            declared = None
        # A composite's head that takes another config is a head of its text part (llama4 -> Llama4ForCausalLM
        # takes Llama4TextConfig); a plain type may map to another type's classes (internlm3).
        foreign = composite and config_class is not None and declared is not None
        if cls is not None and not (foreign and not issubclass(config_class, declared)):  # type: ignore[arg-type]
            found.append(cls)
    if config_class is not None:
        from posenc.trace.model import module_classes

        own = [c for c in module_classes(config_class) if "PreTrained" not in c.__name__]
        for suffix in ("ForCausalLM", "ForConditionalGeneration", "Model", ""):  # "": T5Gemma2TextEncoder, ...
            found += [c for c in own if c.__name__.endswith(suffix)]
    return list(dict.fromkeys(found))


def model_class_for(
    model_type: str, config_class: type | None = None, encoder_decoder: bool = False, composite: bool = False
) -> type | None:
    """The first of :func:`model_classes_for`, or None."""
    found = model_classes_for(model_type, config_class, encoder_decoder, composite)
    return found[0] if found else None


def _missing_backend(cls: type) -> str:
    """What transformers says is missing to use ``cls`` (its placeholder classes raise on attribute access)."""
    try:
        cls.forward  # type: ignore[attr-defined]  # noqa: B018  # a torch module class; placeholders raise here
    except ImportError as exc:
        return " ".join(str(exc).split())[:120]
    except AttributeError:
        return ""
    return ""


def reads_tokens(cls: type) -> bool:
    """Whether ``cls.forward`` takes token ids."""
    try:
        parameters = inspect.signature(cls.forward).parameters  # type: ignore[attr-defined]  # a torch module class
    except (TypeError, ValueError, AttributeError):
        return False
    return any(name in parameters for name in TOKEN_INPUTS)


def _classify(model_type: str, text_heads: set[str], towers: Callable[[], set[str]]) -> ModelType | LeftOut:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config_class = CONFIG_MAPPING[model_type]
        config = config_class()
    except Exception as exc:  # a config whose defaults do not validate cannot be shrunk either
        return LeftOut(model_type, f"its default config does not instantiate ({type(exc).__name__}: {str(exc)[:120]})")
    base = _mapping("MODEL").get(model_type)
    subs = dict(getattr(config_class, "sub_configs", None) or {})
    if base is None and subs and all(getattr(sub, "__name__", "") == "AutoConfig" for sub in subs.values()):
        return LeftOut(model_type, f"a generic composite of any {' and '.join(subs)} (each counted as its own type)")
    if base is None and model_type not in text_heads and model_type not in towers():
        return LeftOut(model_type, "no model class of its own (a generic composite, or a part of another model)")
    try:
        text = config.get_text_config(decoder=True)
    except Exception:  # composites whose text config cannot be chosen are judged by themselves
        text = config
    text_type = str(getattr(text, "model_type", "") or model_type)
    composite = text is not config and text_type != model_type
    cls = model_class_for(model_type, config_class, bool(getattr(config, "is_encoder_decoder", False)), composite)
    if cls is None:
        return LeftOut(model_type, "transformers has no model class for its config")
    probe = getattr(import_transformers(), _first_class_name(base), cls) if base is not None else cls
    missing = _missing_backend(probe) or _missing_backend(cls)
    if missing:
        return LeftOut(model_type, f"{cls.__name__} needs a package this environment lacks ({missing})")
    if not (reads_tokens(probe) or reads_tokens(cls)):
        return LeftOut(model_type, f"{probe.__name__}.forward takes no token ids (not a text model)")
    if composite:
        if model_type not in text_heads:
            return LeftOut(model_type, f"a dual encoder without a text head; its text tower {text_type} is counted")
        return ModelType(model_type, "multimodal", text_type, config_class.__name__, cls.__name__)
    kind = "tower" if model_type not in text_heads and model_type in towers() else "text"
    return ModelType(model_type, kind, model_type, config_class.__name__, cls.__name__)


def _towers(names: Iterable[str]) -> set[str]:
    """Types that are the text config of another type."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    found = set()
    for name in names:
        try:
            config = CONFIG_MAPPING[name]()
            text = config.get_text_config(decoder=True)
        except Exception:  # reported by _classify
            continue
        if text is not config and getattr(text, "model_type", name) != name:
            found.add(str(text.model_type))
    return found


def text_model_types(only: Iterable[str] | None = None) -> tuple[list[ModelType], list[LeftOut]]:
    """``(text model types, left-out types)`` of the installed transformers, sorted by name.

    Args:
        only: restrict to these ``model_type`` s (the rest are neither classified nor listed).
    """
    import_transformers()
    import transformers

    transformers.utils.logging.set_verbosity_error()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    names = sorted(CONFIG_MAPPING_NAMES)
    text_heads = {name for head in TEXT_HEADS for name in _mapping(head)}
    found_towers: list[set[str]] = []

    def towers() -> set[str]:  # every config instantiated once, only where a type without a text head needs it
        if not found_towers:
            found_towers.append(_towers(names))
        return found_towers[0]

    selected = names if only is None else sorted(set(only) & set(names))
    found: list[ModelType] = []
    left: list[LeftOut] = []
    for name in selected:
        result = _classify(name, text_heads, towers)
        (found if isinstance(result, ModelType) else left).append(result)  # type: ignore[arg-type]
    return found, left


def model_type_info(name: str) -> ModelType | LeftOut:
    """The classification of one ``model_type`` (unknown names: a :class:`LeftOut` saying so)."""
    import_transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if name not in CONFIG_MAPPING_NAMES:
        return LeftOut(name, "transformers does not know this model_type")
    found, left = text_model_types([name])
    if found:
        return found[0]
    return left[0]


__all__ = [
    "KINDS",
    "LeftOut",
    "ModelType",
    "model_class_for",
    "model_classes_for",
    "model_type_info",
    "text_model_types",
]
