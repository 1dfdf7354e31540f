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
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
from collections import UserDict
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from posenc.checkpoints.reference import attention_mask, hf_config, import_transformers
from posenc.checkpoints.source import CheckpointSource
from posenc.checkpoints.towers import base_tower
from posenc.errors import ConfigError, ExportError
from posenc.provenance import CheckpointWeights, Quantization
from posenc.trace.arguments import call_args, classify, keep, rebuild, same_tensor
from posenc.trace.record import CallRecipe, EmbeddingRecord, MaskRecipe, ModuleRef
from posenc.trace.stacks import (
    cache_kind,
    cut_stack,
    nested_self_attention,
    new_cache,
    positions_outside,
    self_attention_cache,
    stack_inputs,
    stack_layer_count,
    stack_layers,
    stack_module,
    stack_of,
)
from posenc.trace.weights import load_attention_weights, load_module_weights

CAPTURE_TOKENS = 8
"""Tokens of the capture forward (more when a small sliding window must be seen to be told apart)."""
ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention", "mixer")
"""Child names under which decoder layers hold their attention module (tried first, in order)."""
LINEAR_KINDS = ("linear_attention", "mamba", "conv", "recurrent", "ssm", "mlp", "moe", "dummy")
"""``layer_types`` entries of layers without softmax attention."""
FAMILY_NAME = "trace"
"""The ``family`` a traced layer's provenance names."""


class _Stop(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """Raised by the capture hook after the layer's attention ran: the rest of the forward is not needed."""


@dataclasses.dataclass
class Call:
    """One recorded module call: its positional and keyword arguments and its output; ``later``: the module's
    later calls in the same forward (a rotary module called once per layer type: ModernBERT, LFM3)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any = None
    later: list[Call] = dataclasses.field(default_factory=list)

    def every(self) -> list[Call]:
        """This call and the module's later ones, in order."""
        return [self, *self.later]


@dataclasses.dataclass
class EmbeddingStep:
    """The embedding step a first layer's unit starts with (:class:`~posenc.trace.record.EmbeddingRecord`): the
    position module and the layer's pre-attention norms, loaded with the checkpoint's tensors."""

    record: EmbeddingRecord
    position: nn.Module
    norms: list[nn.Module]


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
        kv_heads, head_dim: the layer's cache layout ``[B, Hkv, P, D]``.
        hidden_size: E.
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
        cache_kind: the cache the model calls it with (:data:`posenc.trace.stacks.CACHE_KINDS`).
        outside: the module of a stack's embeddings that adds its positions before layer 0, where the unit does not
            start from it; None otherwise.
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


# --------------------------------------------------------------------------------------------------
# Building the model and finding the layer's attention
# --------------------------------------------------------------------------------------------------


def class_path(module: Any) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def layer_count(hf: Any) -> int:
    count = getattr(hf, "num_hidden_layers", None) or getattr(hf, "n_layer", None) or getattr(hf, "num_layers", None)
    if not isinstance(count, int) or count < 1:
        raise ConfigError(
            f"the {hf.model_type} config names no layer count (num_hidden_layers); posenc traces decoder layers."
        )
    return count


def reduced_config(hf: Any, layers: int, stack: str | None = None) -> Any:
    """A copy of ``hf`` with only the first ``layers`` layers (per-layer lists cut to match), eager attention; of an
    encoder-decoder's ``stack``, the first ``layers`` of that stack (:func:`posenc.trace.stacks.cut_stack`).

    The capture runs layers ``0 .. N``; a model's later layers are never built.
    """
    reduced = copy.deepcopy(hf)
    if stack is not None:
        cut_stack(reduced, stack, layers)
        reduced._attn_implementation = "eager"
        return reduced
    total = layer_count(hf)
    if layers < total:
        for name in ("num_hidden_layers", "n_layer", "num_layers"):
            if isinstance(getattr(reduced, name, None), int):
                setattr(reduced, name, layers)
        for name, value in list(vars(reduced).items()):
            if isinstance(value, list) and len(value) == total and not name.startswith("_"):
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
    configs = [reduced_config(hf, layers, stack)]
    if stack is not None:  # a per-layer list that ties the stacks' counts together (LED's attention_window): uncut
        configs.append(copy.deepcopy(hf))
        configs[-1]._attn_implementation = "eager"
    if model_class is not None:
        builders = [model_class._from_config]
    else:
        builders = [transformers.AutoModel.from_config]
        for name in getattr(hf, "architectures", None) or []:  # a text tower AutoModel does not map (SiglipTextModel)
            found = getattr(transformers, str(name), None)
            if isinstance(found, type) and issubclass(found, transformers.PreTrainedModel):
                named: Any = found
                builders.append(named._from_config)
    first: Exception | None = None
    for config in configs:
        for build in builders:
            try:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(0)
                    return build(config, attn_implementation="eager").eval()
            except (ValueError, KeyError, TypeError) as exc:
                first = first or exc
    raise ConfigError(
        f"transformers {transformers.__version__} cannot build a {hf.model_type} model from this config "
        f"({str(first)[:200]}); posenc traces models transformers can build."
    )


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


# --------------------------------------------------------------------------------------------------
# The capture forward
# --------------------------------------------------------------------------------------------------


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


@contextlib.contextmanager
def _hooks(handles: list[Any]) -> Iterator[None]:
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _record_calls(model: nn.Module, attention: nn.Module, target: Call) -> tuple[dict[str, Call], list[Any]]:
    """Hooks that record every module's call (until the attention's) and the attention's own; the attention's
    forward hook stops the forward with :class:`_Stop`."""
    calls: dict[str, Call] = {}
    handles = []
    for name, module in model.named_modules():
        if module is attention or not name:
            continue

        def pre(mod: nn.Module, args: tuple, kwargs: dict, name: str = name) -> None:
            call = Call(args, dict(kwargs))
            if name in calls:
                calls[name].later.append(call)
            else:
                calls[name] = call

        def post(mod: nn.Module, args: tuple, kwargs: dict, output: Any, name: str = name) -> None:
            pending = [call for call in calls[name].every() if call.output is None] if name in calls else []
            if pending:
                pending[-1].output = output

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))

    def attention_pre(mod: nn.Module, args: tuple, kwargs: dict) -> None:
        target.args, target.kwargs = args, dict(kwargs)

    def attention_post(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        target.output = output
        raise _Stop

    handles.append(attention.register_forward_pre_hook(attention_pre, with_kwargs=True))
    handles.append(attention.register_forward_hook(attention_post, with_kwargs=True))
    return calls, handles


def _run_forward(
    model: nn.Module, hf: Any, tokens: int, runner: nn.Module | None = None, cache: bool = True
) -> torch.Tensor:
    """Run the base model (or ``runner``, one stack of it; ``cache``: ask it for a KV cache) on ``tokens`` token
    ids (position ids ``0 .. tokens - 1``; a speech encoder on seeded features instead) until the hook stops it."""
    vocab = int(getattr(hf, "vocab_size", None) or 32)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, max(vocab, 2), (1, tokens), generator=generator)
    positions = torch.arange(tokens).unsqueeze(0)
    features = stack_inputs(runner, hf, tokens) if runner is not None else []
    attempts = features or [
        {"input_ids": ids, "position_ids": positions, "use_cache": True},
        {"input_ids": ids, "use_cache": True},
        {"input_ids": ids},
    ]
    if not cache and not features:  # an encoder stack (T5's refuses use_cache=True)
        attempts = [{"input_ids": ids, "position_ids": positions}, {"input_ids": ids}]
    last: Exception | None = None
    for number, kwargs in enumerate(attempts):
        try:
            with torch.no_grad():
                (runner or model)(**kwargs)
        except _Stop:
            return positions
        except Exception as exc:
            # a forward without position_ids / use_cache; a speech encoder's features in another layout
            next_layout = bool(features) and isinstance(exc, RuntimeError) and number + 1 < len(attempts)
            if isinstance(exc, TypeError) or next_layout:
                last = exc
                continue
            raise ExportError(
                f"the {hf.model_type} model's forward failed before layer's attention ran "
                f"({type(exc).__name__}: {str(exc)[:300]}); posenc cannot capture how it calls its attention."
            ) from None
        break
    raise ExportError(
        f"the {hf.model_type} model's forward never called the layer's attention module"
        + (f" ({last})" if last else "")
        + "; posenc cannot capture how it calls it."
    )


def _attended_positions(target: Call, hidden_key: str | None, positions: torch.Tensor) -> torch.Tensor:
    """The positions of the attention's input: ``positions``, or ``0 .. T - 1`` where a speech encoder's attention
    sees ``T`` frames of its features rather than the capture's tokens."""
    hidden = target.kwargs.get(hidden_key) if hidden_key else (target.args[0] if target.args else None)
    if torch.is_tensor(hidden) and hidden.dim() == 3 and hidden.shape[1] != positions.shape[1]:
        return torch.arange(hidden.shape[1]).unsqueeze(0)
    return positions


def _producer(calls: Mapping[str, Call], value: tuple[Any, ...]) -> tuple[str, Call] | None:
    """The module whose output holds the tensors of ``value`` (the last-named, innermost one) and the call of it that
    returned them (a module called several times returns other tensors each time)."""
    found = None
    for name, first in calls.items():
        for call in first.every():
            out = call.output
            items = out if isinstance(out, (tuple, list)) else (out,)
            if all(any(v is item for item in items) for v in value if torch.is_tensor(v)):
                found = (name, call)
    return found


def _recipe(
    call: Call,
    positions: torch.Tensor,
    calls: Mapping[str, Call],
    cache_class: type,
    hidden_key: str | None,
    names: list[str],
) -> tuple[CallRecipe, tuple[str, Call] | None]:
    """The attention's :class:`CallRecipe` and the module that computed its position embeddings (its path and the
    call that returned them); ``names``: the forward's parameter names (a positional argument is classified, and
    named in errors, by its parameter's name: GIT's and VisualBERT's masks are passed positionally)."""
    hidden = call.kwargs.get(hidden_key) if hidden_key else (call.args[0] if call.args else None)
    rotary = None
    keywords: dict[str, str] = {}
    constants: dict[str, Any] = {}
    positional = []
    items = [(f"#{i}", v) for i, v in enumerate(call.args)] + list(call.kwargs.items())
    for key, value in items:
        producer = _producer(calls, tuple(value)) if isinstance(value, (tuple, list)) else None
        index = int(key[1:]) if key.startswith("#") else -1
        name = names[index] if 0 <= index < len(names) else key
        kind = classify(name, value, positions, hidden, cache_class, producer is not None)
        if kind == "position_embeddings":
            rotary = producer
        keep(constants, key, kind, value)
        if key.startswith("#"):
            positional.append(kind)
        else:
            keywords[key] = kind
    return CallRecipe(tuple(positional), keywords, constants), rotary


def _rotary_recipe(call: Call, positions: torch.Tensor, cache_class: type) -> CallRecipe:
    positional: list[str] = []
    keywords: dict[str, str] = {}
    constants: dict[str, Any] = {}
    for key, value in [(f"#{i}", v) for i, v in enumerate(call.args)] + list(call.kwargs.items()):
        if torch.is_tensor(value) and value.is_floating_point():
            kind = "hidden"  # the rotary module reads only its dtype and device
        else:
            kind = classify(key, value, positions, None, cache_class, False)
        keep(constants, key, kind, value)
        (positional.append(kind) if key.startswith("#") else keywords.__setitem__(key, kind))
    return CallRecipe(tuple(positional), keywords, constants)


def _embedding_step(
    calls: Mapping[str, Call],
    model: nn.Module,
    layer_path: str,
    attention_input: torch.Tensor,
    positions: torch.Tensor,
    cache_class: type,
) -> tuple[EmbeddingStep | None, str]:
    """The embedding step before the first layer's attention, when the model adds a position embedding to the token
    embeddings: ``(step, "")``; else ``(None, why)``.

    Found from the recorded calls and checked on them: a module outside the layers called with the position ids
    returns ``P [B, S, E]``; the layer's input ``X`` is ``T + P`` for the output ``T`` of another module (the token
    embeddings), or it is the output of an embeddings module that takes ``inputs_embeds`` (BERT-like encoders: it adds
    token types and normalises), which, called with ``inputs_embeds=T`` and the position ids, gives ``X`` again; the
    layer's norms called before the attention turn ``X`` into the attention's input.
    """
    layer_call = calls.get(layer_path)
    if layer_call is None:
        return None, "the first layer's call was not recorded"
    x = layer_call.args[0] if layer_call.args else layer_call.kwargs.get("hidden_states")
    if not torch.is_tensor(x):
        return None, "the first layer's input is not a hidden-state tensor"
    outside = layer_path.rsplit(".", 1)[0] + "."
    found = [
        name
        for name, call in calls.items()
        if not name.startswith(outside)
        and torch.is_tensor(call.output)
        and call.output.is_floating_point()
        and call.output.shape[-2:] == x.shape[-2:]
        and any(same_tensor(a, positions) for a in [*call.args, *call.kwargs.values()])
    ]
    if not found:
        return None, "no module embeds the position ids before the first layer (its positions do not enter at them)"
    order = [n for n in calls if n.startswith(layer_path + ".") and n.count(".") == layer_path.count(".") + 1]
    norms = [n for n in order if "Norm" in type(model.get_submodule(n)).__name__]
    y = x
    with torch.no_grad():
        for name in norms:
            y = model.get_submodule(name)(y)
    if not torch.allclose(y, attention_input, atol=1e-6):
        return None, "the attention's input is not the layer's input through its norms"
    norm_refs = tuple(ModuleRef(n, class_path(model.get_submodule(n))) for n in norms)
    norm_modules = [model.get_submodule(n) for n in norms]
    for name in found:
        position_out = calls[name].output
        token = x - position_out
        tokens = [n for n, call in calls.items() if n != name and torch.is_tensor(call.output)
                  and call.output.shape == x.shape and torch.allclose(call.output, token, atol=1e-6)]  # fmt: skip
        if tokens:
            try:
                recipe = _embedding_recipe(calls[name], positions, cache_class, model.get_submodule(name))
            except ExportError as exc:
                return None, f"{name} is called with an argument posenc cannot rebuild ({exc})"
            record = EmbeddingRecord(
                position=ModuleRef(name, class_path(model.get_submodule(name))),
                call=recipe,
                norms=norm_refs,
            )
            return EmbeddingStep(record, model.get_submodule(name), norm_modules), ""
    step = _embeddings_module(calls, model, outside, x, positions, found, cache_class)
    if step is None:
        return None, f"the first layer's input is not the token embeddings plus {found[0]}'s position embeddings"
    record, module = step
    return EmbeddingStep(dataclasses.replace(record, norms=norm_refs), module, norm_modules), ""


def _embeddings_module(
    calls: Mapping[str, Call], model: nn.Module, outside: str, x: torch.Tensor, positions: torch.Tensor,
    found: list[str], cache_class: type,
) -> tuple[EmbeddingRecord, nn.Module] | None:  # fmt: skip
    """The embeddings module that turns the token embeddings and the positions into the first layer's input ``x``
    (it takes ``inputs_embeds`` and holds a module of ``found``), checked on the capture: ``(record, module)`` with
    its token table replaced by nothing (the unit starts at the token embeddings), or None."""
    for name, call in calls.items():
        if name.startswith(outside) or not torch.is_tensor(call.output) or call.output.shape != x.shape:
            continue
        module = model.get_submodule(name)
        accepts = inspect.signature(module.forward).parameters
        holds = any(f == name or f.startswith(name + ".") for f in found)
        if "inputs_embeds" not in accepts or not holds or not torch.allclose(call.output, x, atol=1e-6):
            continue
        ids = call.kwargs.get("input_ids", call.args[0] if call.args else None)
        if not torch.is_tensor(ids) or ids.is_floating_point():
            continue
        table = next((n for n, c in calls.items() if n.startswith(name + ".") and c.args
                      and same_tensor(c.args[0], ids) and torch.is_tensor(c.output)), None)  # fmt: skip
        if table is None:
            continue
        recipe = _inputs_embeds_recipe(call, module, ids, positions, cache_class)
        if recipe is None:
            continue
        args, kwargs = _step_args(recipe, calls[table].output, positions)
        with torch.no_grad():
            again = module(*args, **kwargs)
        if torch.is_tensor(again) and again.shape == x.shape and torch.allclose(again, x, atol=1e-6):
            tokens = ModuleRef(table[len(name) + 1 :], class_path(model.get_submodule(table)))
            return EmbeddingRecord(ModuleRef(name, class_path(module)), recipe, tokens=tokens), module
    return None


def _inputs_embeds_recipe(
    call: Call, module: nn.Module, ids: torch.Tensor, positions: torch.Tensor, cache_class: type
) -> CallRecipe | None:
    """The embeddings module's call, every argument by name, with ``inputs_embeds`` (the unit's ``hidden``) in place
    of the token ids and the position ids passed where it takes them; None where its arguments cannot be named."""
    signature = inspect.signature(module.forward)
    try:
        bound = signature.bind_partial(*call.args, **call.kwargs).arguments
    except TypeError:
        return None
    if any(signature.parameters[name].kind not in _NAMED for name in bound):
        return None
    keywords: dict[str, str] = {}
    constants: dict[str, Any] = {}
    for key, value in bound.items():
        if value is ids or key == "input_ids":
            kind, value = "constant", None
        elif key == "inputs_embeds":
            kind = "hidden"
        else:
            kind = classify(key, value, positions, None, cache_class, False)
        keep(constants, key, kind, value)
        keywords[key] = kind
    keywords["inputs_embeds"] = "hidden"
    if "position_ids" in signature.parameters:
        keywords["position_ids"] = "position_ids"
        constants.pop("position_ids", None)
    return CallRecipe((), keywords, constants)


_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _step_args(recipe: CallRecipe, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[list[Any], dict[str, Any]]:
    """The arguments of an embedding step's call (:data:`~posenc.trace.arguments.PLAIN_KINDS`)."""
    return call_args(recipe, lambda key, kind: rebuild(key, kind, recipe.constants, hidden, positions, 0))


def drop_token_table(embeddings: nn.Module, record: EmbeddingRecord) -> None:
    """Replace an embeddings module's token table (``record.tokens``) with nothing: the unit starts at the token
    embeddings, so the table is neither read nor exported."""
    if record.tokens is None:
        return
    parent, _, child = record.tokens.path.rpartition(".")
    setattr(embeddings.get_submodule(parent) if parent else embeddings, child, nn.Identity())


def _embedding_recipe(call: Call, positions: torch.Tensor, cache_class: type, module: nn.Module) -> CallRecipe:
    """How the model calls its position module; token ids it reads only for their shape (Whisper's decoder passes
    them beside the position ids) are rebuilt as zeros, checked on the capture call (:func:`_shape_only`)."""
    positional: list[str] = []
    keywords: dict[str, str] = {}
    constants: dict[str, Any] = {}
    for key, value in [(f"#{i}", v) for i, v in enumerate(call.args)] + list(call.kwargs.items()):
        try:
            kind = classify(key, value, positions, None, cache_class, False)
        except ExportError:
            if not _shape_only(module, call, key):
                raise
            kind = "zeros"
        keep(constants, key, kind, value)
        (positional.append(kind) if key.startswith("#") else keywords.__setitem__(key, kind))
    return CallRecipe(tuple(positional), keywords, constants)


def _shape_only(module: nn.Module, call: Call, key: str) -> bool:
    """Whether ``module``'s output on the recorded call stays the same with integer ids ``[B, S]`` at ``key`` set to
    zeros (the module reads only their shape)."""
    index = int(key[1:]) if key.startswith("#") else None
    value = call.args[index] if index is not None else call.kwargs[key]
    if not torch.is_tensor(value) or value.is_floating_point() or value.dim() != 2 or not torch.is_tensor(call.output):
        return False
    args = list(call.args)
    kwargs = dict(call.kwargs)
    if index is not None:
        args[index] = torch.zeros_like(value)
    else:
        kwargs[key] = torch.zeros_like(value)
    with torch.no_grad():
        again = module(*args, **kwargs)
    return torch.is_tensor(again) and again.shape == call.output.shape and torch.equal(again, call.output)


def _mask_recipe(
    mask: Any, hf: Any, layer_type: str | None, positions: torch.Tensor, causal_without: bool = True
) -> MaskRecipe:
    """The :class:`MaskRecipe` that rebuilds the captured mask from positions (causal or not, window or not);
    ``causal_without``: whether the attention is causal when the model passes no mask."""
    if mask is None:
        return MaskRecipe("none", causal=causal_without)
    if not torch.is_tensor(mask) or mask.dim() != 4:
        raise ExportError(f"the attention's mask is a {type(mask).__name__}, not a [B, 1, S, K] tensor; cannot trace.")
    kind = "bool" if mask.dtype == torch.bool else "additive"
    allowed = mask if kind == "bool" else mask > torch.finfo(mask.dtype).min / 2
    if allowed.shape[-2] == 1 and bool(allowed.all()):  # a padding mask [B, 1, 1, K] hiding no key
        return MaskRecipe(kind, causal=False)
    windows: list[int | None] = [None]
    for name in ("sliding_window", "attention_window", "local_attention", "window_size"):
        value = getattr(hf, name, None)
        if isinstance(value, int) and value > 0:
            windows += [value, value + 1, value // 2]
    if layer_type is not None and "sliding" in layer_type:
        windows = [w for w in windows if w is not None] + [None]
    for causal in (True, False):
        for window in windows:
            rebuilt = attention_mask(positions, positions, causal, window, torch.float32)[..., : allowed.shape[-1]] == 0
            if rebuilt.shape[-2:] == allowed.shape[-2:] and torch.equal(rebuilt.expand_as(allowed), allowed):
                return MaskRecipe(kind, causal=causal, window=window)
    raise ExportError(
        f"cannot rebuild the mask this {hf.model_type} model gives layer's attention from positions (tried causal and "
        f"bidirectional, with and without its sliding window); this model's attention cannot be traced yet."
    )


def _capture_tokens(hf: Any) -> int:
    windows = [getattr(hf, name, None) for name in ("sliding_window", "attention_window")]
    small = [w for w in windows if isinstance(w, int) and 0 < w < 60]
    return max([CAPTURE_TOKENS, *[w + 3 for w in small]])


def _probe(
    attention: nn.Module,
    target: Call,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    cache_class: type,
    step: EmbeddingStep | None,
    calls: Mapping[str, Call],
    layer: int,
    fresh_cache: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention (with the checkpoint's weights) called exactly as the model called it, on random hidden states
    and a fresh cache (``fresh_cache()`` in place of any ``cache_class``): ``(hidden, position_ids, out)``; with an
    embedding step, ``hidden`` are random token embeddings that the model's own position embeddings (as computed in
    the capture call) and norms turn into the attention's input."""
    generator = torch.Generator().manual_seed(1)
    fresh = torch.randn(hidden.shape, generator=generator, dtype=torch.float32)
    inputs = fresh
    if step is not None:
        call = calls[step.record.position.path]
        with torch.no_grad():  # the position module with the checkpoint's table, called as in the capture
            if step.record.tokens is None:
                inputs = fresh + step.position(*call.args, **call.kwargs)
            else:  # the embeddings module, with the random token embeddings as its inputs_embeds
                args, kwargs = _step_args(step.record.call, fresh, positions)
                inputs = step.position(*args, **kwargs)
            for norm in step.norms:
                inputs = norm(inputs)

    def fresh_state(value: Any) -> Any:  # the cache and the shared keys and values, as the unit passes them
        return fresh_cache() if isinstance(value, cache_class) else ({} if isinstance(value, UserDict) else value)

    kwargs = {k: fresh_state(v) for k, v in target.kwargs.items()}
    args = [fresh_state(v) for v in target.args]
    if "hidden_states" in kwargs:
        kwargs["hidden_states"] = inputs
    else:
        args[0] = inputs
    with torch.no_grad():
        try:
            output = attention(*args, **kwargs)
        except Exception as exc:
            raise _probe_error(exc, target, cache_class, layer) from None
    out = output[0] if isinstance(output, (tuple, list)) else output
    return fresh, positions, out.detach().clone()


def _probe_error(exc: Exception, target: Call, cache_class: type, layer: int) -> Exception:
    """Why the attention fails when called with the fresh state the unit gives it (else ``exc`` itself): it reads keys
    and values another layer stored, or its cache layer carries a convolution or recurrent state (a hybrid model's
    layer that keeps one beside its keys and values, Inkling 2's)."""
    values = [*enumerate(target.args), *target.kwargs.items()]
    shared = [k for k, v in values if isinstance(v, UserDict)]
    if isinstance(exc, KeyError) and shared:
        return ExportError(
            f"the attention reads keys and values another layer stored ({shared[0]!r}, entry {exc}): its cache is "
            f"that layer's, so it cannot be traced alone; export a layer that computes its own keys and values."
        )
    caches: list[Any] = [v for _, v in values if isinstance(v, cache_class)]
    entries = [cache.layers[layer] for cache in caches if layer < len(getattr(cache, "layers", []))]
    stateful = [type(e).__name__ for e in entries if hasattr(e, "conv_states") or hasattr(e, "recurrent_states")]
    if stateful:
        return ExportError(
            f"the attention reads a convolution or recurrent state from its cache ({stateful[0]}; "
            f"{type(exc).__name__}: {str(exc)[:120]} with a cache of keys and values alone); the traced path exports "
            f"caches of keys and values [B, Hkv, P, D] only."
        )
    return exc


def _settings(attention: nn.Module) -> dict[tuple[str, str], Any]:
    """The plain settings (str, int, float, bool attributes) of the attention and its submodules."""
    return {(name, key): value for name, module in attention.named_modules() for key, value in vars(module).items()
            if isinstance(value, (str, int, float, bool)) and not key.startswith("_")}  # fmt: skip


def _check_settings(before: dict[tuple[str, str], Any], attention: nn.Module, model_type: Any) -> None:
    """Refuse an attention whose model changed its settings during the capture forward: the captured call would be
    another computation than the module built from the config (BigBird's block-sparse attention turns to full
    attention on short inputs)."""
    after = _settings(attention)
    changed = [(key, value, after.get(key)) for key, value in before.items() if after.get(key) != value]
    if changed:
        (name, attribute), old, new = changed[0]
        where = f"{name}.{attribute}" if name else attribute
        raise ExportError(
            f"the {model_type} model changed its attention's setting {where} from {old!r} to {new!r} while posenc "
            f"captured the call (on {CAPTURE_TOKENS}-token inputs); the module it runs then is not the one its config "
            f"builds, so it cannot be traced. Choose the setting in config.json (e.g. {attribute}={new!r})."
        )


def _module_causal(attention: nn.Module) -> bool:
    """Whether an attention module called without a mask hides later keys itself (its ``is_causal``)."""
    return any(getattr(module, "is_causal", False) is True for module in attention.modules())


def cacheless_heads(hf: Any, attention: nn.Module, hidden_size: int) -> tuple[int, int]:
    """``(kv heads, head width)`` of an attention called without a cache: the module's own counts (BERT's
    ``num_attention_heads`` and ``attention_head_size``, ``head_dim``, ``num_key_value_heads``), else the config's.

    Raises:
        ConfigError: neither names the heads.
    """
    sources = [*attention.modules(), hf]

    def first(*names: str) -> int | None:
        for source in sources:
            for name in names:
                value = getattr(source, name, None)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        return None

    heads = first("num_attention_heads", "num_heads", "n_head", "n_heads", "encoder_attention_heads")
    if heads is None:
        raise ConfigError(
            f"the {hf.model_type} attention called without a cache names no head count (num_attention_heads); "
            f"posenc cannot describe its geometry."
        )
    head_dim = first("attention_head_size", "head_dim", "head_size") or hidden_size // heads
    kv_heads = first("num_key_value_heads", "num_kv_heads") or heads
    return kv_heads, head_dim


# --------------------------------------------------------------------------------------------------
# The entry point
# --------------------------------------------------------------------------------------------------


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
    with CheckpointSource.open(model_or_folder) as source, quiet_transformers():
        model_type = source.config.get("model_type")
        if not model_type:
            raise ConfigError(f"{source.location}/config.json has no model_type; posenc cannot build its model.")
        outer = source.hf_model.config if source.hf_model is not None else hf_config(source.config)
        tower = base_tower(outer, source.config, source.hf_model)  # a wrapper: its text tower is traced
        hf = tower.config if tower is not None else outer
        names = tower.checkpoint_names if tower is not None else None
        stack = stack_of(hf, layer_type)
        total = layer_count(hf) if stack is None else stack_layer_count(hf, stack)
        index = (default_layer(hf, layer_type) if stack is None else 0) if layer is None else layer
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < total:
            where = f"the checkpoint's {stack} has" if stack else "the checkpoint has"
            raise ConfigError(f"layer {index!r} is out of range: {where} {total} layers (0 .. {total - 1}).")
        kinds = list(getattr(hf, "layer_types", None) or []) if stack is None else []
        kind = stack or (kinds[index] if index < len(kinds) else None)
        if layer_type is not None and kind != layer_type:
            raise ConfigError(f"layer {index} is a {kind or 'plain'} layer, not {layer_type!r}.")
        model = build_base_model(hf, index + 1, tower.model_class if tower is not None else None, stack)
        tower_ref = ModuleRef(tower.path, class_path(model)) if tower is not None else None
        if stack is None:
            list_path, layers = layer_list(model, index + 1)
            found = attention_child(layers[index])
        else:
            list_path, layers = stack_layers(model, stack, index + 1)
            found = attention_child(layers[index]) or nested_self_attention(layers[index])
        if found is None:
            raise no_attention_error(hf, index, layers[index])
        child, attention = found
        attention_path = f"{list_path}.{index}.{child}"
        target = Call((), {})
        calls, handles = _record_calls(model, attention, target)
        settings = _settings(attention)
        with _hooks(handles):
            runner = stack_module(model, list_path) if stack else None
            positions = _run_forward(model, hf, _capture_tokens(hf), runner, cache=stack != "encoder")
        _check_settings(settings, attention, model_type)
        hidden_key = "hidden_states" if "hidden_states" in target.kwargs else None
        parameters = [n for n, p in inspect.signature(attention.forward).parameters.items() if p.kind in _NAMED]
        positions = _attended_positions(target, hidden_key, positions)
        call, producer = _recipe(target, positions, calls, transformers.Cache, hidden_key, parameters)
        rotary_path = producer[0] if producer is not None else None
        cache = next((v for v in target.kwargs.values() if isinstance(v, transformers.Cache)), None)
        masks = [target.kwargs[k] for k, kind in call.keywords.items() if kind == "mask"]
        masks += [target.args[i] for i, kind in enumerate(call.positional) if kind == "mask"]
        mask_value = masks[0] if masks else None
        mask = _mask_recipe(mask_value, hf, kind, positions, cache is not None or _module_causal(attention))
        rotary = model.get_submodule(rotary_path) if rotary_path else None
        rotary_call = _rotary_recipe(producer[1], positions, transformers.Cache) if producer is not None else None
        hidden = target.kwargs[hidden_key] if hidden_key else target.args[0]
        if cache is None:  # an encoder's attention (or a decoder's run without a cache): no past, no presents
            kv_heads, head_dim = cacheless_heads(hf, attention, int(hidden.shape[-1]))
        else:
            own = self_attention_cache(cache)  # an encoder-decoder's: its self-attention part
            keys, values = own.layers[index].keys, own.layers[index].values
            if keys is None or keys.dim() != 4 or values is None or keys.shape != values.shape:
                raise ExportError(
                    f"layer {index}'s cache of this {model_type} model does not hold keys and values of one shape "
                    f"[B, Hkv, P, D]; the traced path exports that cache layout only."
                )
            kv_heads, head_dim = int(keys.shape[1]), int(keys.shape[3])
        step, note = None, ""
        if rotary_path is None and index == 0:  # positions may enter at the embeddings, before this layer
            step, note = _embedding_step(calls, model, f"{list_path}.{index}", hidden, positions, transformers.Cache)
        if step is not None:
            drop_token_table(step.position, step.record)
        outside = positions_outside(list(calls), list_path) if stack and step is None and index == 0 else None
        owner = (tower.model, f"{tower.path}.") if tower is not None else (model, "")
        tensors = load_module_weights(source, attention, attention_path, names, owner)
        if step is not None:
            for ref, module in zip((step.record.position, *step.record.norms), (step.position, *step.norms),
                                   strict=True):  # fmt: skip
                tensors.update(load_module_weights(source, module, ref.path, names, owner))
        kind_of_cache = cache_kind(cache)
        probe = _probe(attention.float().eval(), target, hidden, positions, transformers.Cache, step, calls, index,
                       lambda: new_cache(kind_of_cache))  # fmt: skip
        del model  # the other layers were only needed for the capture call
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
            hidden_size=int(hidden.shape[-1]),
            tensors=tensors,
            location=source.location,
            probe=probe,
            embedding=step,
            embedding_note=note,
            quantization=source.quantized.record(tensors),
            cacheless=cache is None,
            tower=tower_ref,
            cache_kind=kind_of_cache,
            outside=outside,
        )


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
