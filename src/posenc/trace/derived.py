"""Arguments a stack derives from the sequence alone: relative-position tensors computed once per stack.

Some models compute a positional tensor once, before their layers, and hand it to every layer's attention: RoFormer's
``sinusoidal_pos`` ``[1, 1, S, D]`` (its encoder's ``embed_positions`` module, sin and cos of the positions), MPNet's
``position_bias`` ``[B, H, S, S]`` (its encoder's ``compute_position_bias``: T5's bucketed relative bias). The traced
unit cannot rebuild these from the hidden states and positions by kind (:mod:`posenc.trace.arguments`); instead
it calls the **model's own code that computed them**, recorded at capture: a module's forward (recorded by the
capture's hooks) or a method of a module that holds the layer list (recorded here, :func:`record_methods`), whose own
arguments are of plain kinds (the hidden states for their shape, the shape itself, the sequence length, constants;
never an input the capture filled in for the model, :data:`posenc.trace.inputs.SUBSTITUTED`, but the tokens' boxes,
which the unit takes as its input ``bbox``: :mod:`posenc.trace.boxes`).
The argument's kind is then ``derived`` and :class:`~posenc.trace.record.DerivedRecipe` says which code and how it is
called. The unit computes it from its inputs as the model does, so the graph holds it (kept as traced, the part
:data:`DERIVED_PART`); the capture checks the rebuild equal to what the model passed, on the capture's hidden states
and on other random ones (so it reads the hidden states for their shape only).

Only an attention called without a KV cache (an encoder's) takes derived arguments: its sequence length is its key
length, so a length argument is the number of tokens; with a cache the capture cannot tell a query length from a key
length, and such a call is refused.

RoFormer is "RoFormer: Enhanced Transformer with Rotary Position Embedding" (Su et al., 2021,
https://arxiv.org/abs/2104.09864); MPNet is "MPNet: Masked and Permuted Pre-training for Language Understanding"
(Song et al., 2020, https://arxiv.org/abs/2004.09297), whose relative bias is T5's ("Exploring the Limits of Transfer
Learning with a Unified Text-to-Text Transformer", Raffel et al., 2019, https://arxiv.org/abs/1910.10683).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import inspect
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from posenc.errors import ConfigError, ExportError
from posenc.trace.arguments import call_args, classify, keep, rebuild, segments_of
from posenc.trace.boxes import box_form
from posenc.trace.inputs import SEGMENTS, SUBSTITUTED
from posenc.trace.record import CallRecipe, DerivedRecipe, ModuleRef, TracePart
from posenc.trace.tensorwise import covered, rewritten

DERIVED_PART = "stack position tensor"
"""The positional part a derived argument is: computed by the model's own code from the sequence, kept as traced."""


@dataclasses.dataclass
class MethodCall:
    """One recorded call of a stack module's method (``owner``: its path; ``method``: its name), or of a function of
    the model's modeling module (``owner`` None; ``method``: ``module:name``): arguments, output and the paths of the
    owner's children the call ran (the rest of the owner is left out of the unit)."""

    owner: str | None
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any = None
    children: set[str] = dataclasses.field(default_factory=set)


def _stack_owners(model: nn.Module, list_path: str) -> list[tuple[str, nn.Module]]:
    """The modules that hold the layer list at ``list_path`` (the base model and each module on the way to it) and
    their other children that are not module lists (Funnel's ``encoder.attention_structure``, whose
    ``init_attention_inputs`` computes what every layer's attention reads)."""
    parts = list_path.split(".")[:-1]
    owners = [("", model)]
    for i in range(len(parts)):
        path = ".".join(parts[: i + 1])
        owners.append((path, model.get_submodule(path)))
    on_path = {path for path, _ in owners} | {list_path}
    helpers = []
    for path, module in owners:
        for name, child in module.named_children():
            full = f"{path}.{name}" if path else name
            if full not in on_path and not isinstance(child, nn.ModuleList):
                helpers.append((full, child))
    return owners + helpers


def _same(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are equal tensors (shape, dtype, values), or tuples / lists of such, alike."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and (torch.equal(a, b))
        )
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        same_kind = isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b)
        return same_kind and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a is None and b is None


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _derivable(value: Any) -> bool:
    """A floating or boolean tensor, or a tuple (list) of tensors and Nones with a floating one: what
    :func:`derive` looks for (Funnel's ``attention_inputs``: encodings, token-type matrix, masks)."""
    if torch.is_tensor(value):
        return value.is_floating_point() or value.dtype == torch.bool
    leaves = _leaves(value) if isinstance(value, (tuple, list)) else []
    tensors = [leaf for leaf in leaves if torch.is_tensor(leaf)]
    return (
        bool(tensors)
        and all(leaf is None or torch.is_tensor(leaf) for leaf in leaves)
        and any(t.is_floating_point() for t in tensors)
    )


def _own_functions(model: nn.Module, owners: list[tuple[str, nn.Module]]) -> list[tuple[Any, str]]:
    """``(python module, name)`` of the functions the modeling modules of the stack modules' classes define (Beam's
    ``compute_attention_scaling``)."""
    found: list[tuple[Any, str]] = []
    for name in dict.fromkeys(type(module).__module__ for _, module in owners):
        if not name.startswith("transformers.models."):
            continue
        python = sys.modules[name]
        for attribute, value in vars(python).items():
            if inspect.isfunction(value) and value.__module__ == name and not attribute.startswith("__"):
                found.append((python, attribute))
    return found


def _own_methods(module: nn.Module) -> list[str]:
    """The methods a transformers model class defines itself (not ``forward``, not ``torch.nn``'s or the base
    classes' of every model)."""
    names: list[str] = []
    for klass in type(module).__mro__:
        if not klass.__module__.startswith("transformers.models."):
            continue
        for name, value in vars(klass).items():
            is_function = inspect.isfunction(value) or isinstance(value, staticmethod)
            if is_function and name != "forward" and not name.startswith("__") and name not in names:
                names.append(name)
    return names


@contextlib.contextmanager
def record_methods(model: nn.Module, list_path: str) -> Iterator[list[MethodCall]]:
    """Record every call of the stack modules' own methods during the capture forward (their outputs are the
    candidates for a derived argument); the methods are restored after."""
    calls: list[MethodCall] = []
    active: list[MethodCall] = []
    names = {id(module): name for name, module in model.named_modules()}
    patched: list[tuple[nn.Module, str]] = []

    def on_module(module: nn.Module, args: tuple[Any, ...]) -> None:
        for call in active:
            if call.owner is None:
                continue
            name = names.get(id(module), "")
            prefix = f"{call.owner}." if call.owner else ""
            if name.startswith(prefix) and name != call.owner:
                call.children.add(name[len(prefix) :].split(".")[0])

    def wrap(owner: str | None, method: str, function: Any) -> Any:
        @functools.wraps(function)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            call = MethodCall(owner, method, args, dict(kwargs))
            active.append(call)
            try:
                call.output = function(*args, **kwargs)
            finally:
                active.remove(call)
            calls.append(call)
            return call.output

        return recorded

    owners = _stack_owners(model, list_path)
    for owner, module in owners:
        for method in _own_methods(module):
            function = getattr(module, method, None)
            if callable(function) and not isinstance(function, nn.Module):
                setattr(module, method, wrap(owner, method, function))
                patched.append((module, method))
    functions = _own_functions(model, owners)
    originals = [getattr(python, name) for python, name in functions]
    for (python, name), function in zip(functions, originals, strict=True):
        setattr(python, name, wrap(None, f"{python.__name__}:{name}", function))
    hook = nn.modules.module.register_module_forward_pre_hook(on_module)
    try:
        yield calls
    finally:
        hook.remove()
        for module, method in patched:
            with contextlib.suppress(AttributeError):
                delattr(module, method)
        for (python, name), function in zip(functions, originals, strict=True):
            setattr(python, name, function)


def _lead(value: Any, output: Any) -> int | None:
    """How many leading unit axes the model put before ``output`` to pass ``value`` (0: ``value`` is it; a tuple:
    equal to it), or None where ``value`` is not ``output`` so arranged."""
    if not torch.is_tensor(value):
        return 0 if _same(value, output) else None
    if not torch.is_tensor(output) or value.dtype != output.dtype:
        return None
    lead = value.dim() - output.dim()
    if lead < 0 or tuple(value.shape) != (1,) * lead + tuple(output.shape):
        return None
    return (
        lead if value is output or value._base is output or torch.equal(value.reshape(output.shape), output) else None
    )


def _arg_kind(key: str, value: Any, positions: torch.Tensor, hidden: torch.Tensor, name: str | None = None) -> str:
    """The kind of an argument of the code that derives a tensor: the hidden states (a float tensor of their shape,
    read for its shape: checked), their shape, the sequence length, or a plain kind; ``name``: the parameter a
    positional argument binds to."""
    if box_form(value) is not None:  # the tokens' boxes: the unit's bbox input (posenc.trace.boxes)
        return "boxes"
    if key in SUBSTITUTED or name in SUBSTITUTED:  # another input the capture filled in: the user's data
        raise ExportError(f"{key!r} is an input the capture filled in (posenc.trace.inputs), not a position")
    tokens = int(positions.shape[-1])
    if torch.is_tensor(value) and value.is_floating_point() and value.shape == hidden.shape:
        return "hidden"
    ints = isinstance(value, tuple) and value and all(isinstance(n, int) for n in value)
    if ints and tuple(value) == tuple(hidden.shape[: len(value)]):
        return "shape"
    if isinstance(value, int) and not isinstance(value, bool) and value == tokens and value > 1:
        return "length"
    if isinstance(value, torch.device):
        return "device"
    if (key in SEGMENTS or name in SEGMENTS) and segments_of(value, positions) is not None:
        return "segments"  # CPM-Ant's prompt | text segments, a function of the position in one call
    return classify(key, value, positions, None, _NoCache, False)


class _NoCache:
    """No argument of the code that derives a tensor is a cache (an attention with one is refused)."""


def _call_recipe(args: tuple[Any, ...], kwargs: Mapping[str, Any], positions: torch.Tensor,
                 hidden: torch.Tensor, names: tuple[str, ...] = ()) -> CallRecipe:  # fmt: skip
    positional: list[str] = []
    keywords: dict[str, str] = {}
    constants: dict[str, Any] = {}
    for key, value in [(f"#{i}", v) for i, v in enumerate(args)] + list(kwargs.items()):
        index = int(key[1:]) if key.startswith("#") else len(names)
        kind = _arg_kind(key, value, positions, hidden, names[index] if index < len(names) else None)
        if kind == "shape":
            constants[key] = len(value)
        else:
            keep(constants, key, kind, value)
        (positional.append(kind) if key.startswith("#") else keywords.__setitem__(key, kind))
    return CallRecipe(tuple(positional), keywords, constants)


def source_module(module: nn.Module | None, children: tuple[str, ...] | None) -> nn.Module | None:
    """The module that computes a derived argument as the unit holds it: ``module`` itself (``children`` None), or a
    shallow copy of a stack module keeping only ``children`` (the submodules its method reads: MPNet's encoder without
    its layers) and its buffers, none of its own parameters."""
    if children is None or module is None:
        return module
    clone = copy.copy(module)
    clone._modules = {name: child for name, child in module._modules.items() if name in children}
    clone._parameters = {}
    clone._buffers = dict(module._buffers)
    return clone


def function_of(name: str) -> Any:
    """The function ``module:name`` of a transformers modeling module (a recipe's ``method`` for a function).

    Raises:
        ConfigError: not a function of a transformers modeling module here (an edited or foreign record).
    """
    module, _, attribute = name.partition(":")
    found = None
    if module.startswith("transformers.models."):
        with contextlib.suppress(ImportError):
            found = getattr(importlib.import_module(module), attribute, None)
    if not inspect.isfunction(found):
        raise ConfigError(f"the trace record names the function {name!r}, which the installed transformers lacks; "
                          f"export the layer again with this transformers.")  # fmt: skip
    return found


def compute(recipe: DerivedRecipe, source: nn.Module | None, hidden: torch.Tensor, position_ids: torch.Tensor) -> Any:
    """The derived tensor for ``hidden [B, S, E]`` and ``position_ids [B, S]``: the model's code called with its
    arguments rebuilt from them, arranged as the model passes it."""
    if recipe.source is None:
        function = function_of(recipe.method)
    else:
        function = source if recipe.method == "forward" else getattr(source, recipe.method)

    def value(key: str, kind: str) -> Any:
        if kind == "shape":
            return hidden.shape[: int(recipe.call.constants[key])]
        if kind == "length":
            return hidden.shape[1]
        if kind == "device":
            return hidden.device
        return rebuild(key, kind, recipe.call.constants, hidden, position_ids, 0)

    args, kwargs = call_args(recipe.call, value)
    with rewritten(source):  # under torch.export only: code that reads the length as a number, from tensors
        output = function(*args, **kwargs)
    return output[(None,) * recipe.lead] if recipe.lead else output


@dataclasses.dataclass
class Derived:
    """A derived argument found at capture: its recipe and the module that computes it."""

    recipe: DerivedRecipe
    module: nn.Module | None

    def needs_length(self) -> bool:
        """Whether its code reads the sequence's length (the hidden states' shape): an attention called with a
        cache cannot take it (its query length is not its key length)."""
        kinds = (*self.recipe.call.positional, *self.recipe.call.keywords.values())
        return any(kind in ("hidden", "shape", "length", "ones", "zeros", "boxes") for kind in kinds)


def derive(
    key: str,
    value: Any,
    positions: torch.Tensor,
    hidden: torch.Tensor,
    modules: Mapping[str, Any],
    methods: list[MethodCall],
    model: nn.Module,
    class_path: Any,
) -> Derived | None:
    """The code that computed ``value`` (an argument of the attention's call named ``key``) from the sequence alone,
    checked by calling it again as the unit will; None where no recorded call did.

    Args:
        modules: the capture's recorded module calls (path -> :class:`~posenc.trace.calls.Call`).
        methods: the stack modules' recorded method calls (:func:`record_methods`).
        class_path: ``module -> "module.QualName"``.
    """
    if not _derivable(value):
        return None
    candidates: list[tuple[str | None, str, tuple[Any, ...], dict[str, Any], Any, tuple[str, ...] | None]] = [
        (call.owner, call.method, call.args, call.kwargs, call.output,
         tuple(sorted(call.children)) if call.owner is not None else None)
        for call in reversed(methods)
    ]  # fmt: skip
    for name, first in modules.items():
        for call in first.every():
            candidates.append((name, "forward", call.args, call.kwargs, call.output, None))
    for path, method, args, kwargs, output, children in candidates:
        lead = _lead(value, output)
        if lead is None:
            continue
        owner = None if path is None else model.get_submodule(path) if path else model
        try:
            recipe_call = _call_recipe(args, kwargs, positions, hidden, _parameter_names(owner, method))
        except ExportError:
            continue
        ref = None if owner is None or path is None else ModuleRef(path, class_path(owner))
        recipe = DerivedRecipe(ref, method, recipe_call, lead, children)
        source = source_module(owner, children)
        if _reproduces(recipe, source, value, hidden, positions):
            return Derived(recipe, source)
        read = _read_children(recipe, owner, value, hidden, positions)
        if read is not None:
            recipe = dataclasses.replace(recipe, children=read)
            return Derived(recipe, source_module(owner, read))
    return None


def _parameter_names(owner: nn.Module | None, method: str) -> tuple[str, ...]:
    """The parameter names of the code a candidate call ran (a method of ``owner``, its forward, or the function
    ``module:name`` where ``owner`` is None), in order; empty where they cannot be read."""
    try:
        function = function_of(method) if owner is None else getattr(owner, method)
        return tuple(inspect.signature(function).parameters)
    except (ConfigError, AttributeError, TypeError, ValueError):
        return ()


def _read_children(recipe: DerivedRecipe, owner: nn.Module | None, value: torch.Tensor, hidden: torch.Tensor,
                   positions: torch.Tensor) -> tuple[str, ...] | None:  # fmt: skip
    """The children a method reads without calling them (LayoutLMv3's ``_cal_1d_pos_emb`` indexes
    ``rel_pos_bias.weight``), where the children it ran are not enough: the fewest of the owner's children (never a
    module list: the layers) with which the method gives ``value`` again; None where none do."""
    if owner is None or recipe.children is None:
        return None
    ran = set(recipe.children)
    extra = [n for n, c in owner.named_children() if n not in ran and not isinstance(c, (nn.ModuleList, nn.ModuleDict))]
    kept = sorted(ran | set(extra))
    if not extra or not _reproduces(recipe, source_module(owner, tuple(kept)), value, hidden, positions):
        return None
    for name in extra:  # drop each extra child the method does not need
        fewer = [n for n in kept if n != name]
        if _reproduces(recipe, source_module(owner, tuple(fewer)), value, hidden, positions):
            kept = fewer
    return tuple(kept)


def _reproduces(recipe: DerivedRecipe, source: nn.Module | None, value: Any, hidden: torch.Tensor,
                positions: torch.Tensor) -> bool:  # fmt: skip
    """Whether the recipe gives ``value`` again, on the capture's hidden states and on random ones of their shape."""
    fresh = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(2), dtype=hidden.dtype)
    try:
        with torch.no_grad():
            again = [compute(recipe, source, h, positions) for h in (hidden, fresh)]
    except Exception:
        return False
    return all(_same(a, value) for a in again)


def with_checkpoint_tensors(call: Any, derived: Mapping[str, Derived], hidden: torch.Tensor,
                            positions: torch.Tensor) -> Any:  # fmt: skip
    """The attention's recorded call (a :class:`~posenc.trace.calls.Call`) with each derived argument computed
    again by its code now holding the checkpoint's tensors (the capture's model was built with its own initial
    weights): the model's own call of the attention with the checkpoint's weights, for the probe."""
    if not derived:
        return call
    args, kwargs = list(call.args), dict(call.kwargs)
    with torch.no_grad():
        for key, found in derived.items():
            value = compute(found.recipe, found.module, hidden, positions)
            if key.startswith("#"):
                args[int(key[1:])] = value
            else:
                kwargs[key] = value
    return dataclasses.replace(call, args=tuple(args), kwargs=kwargs)


def derived_parts(recipes: Mapping[str, DerivedRecipe]) -> tuple[TracePart, ...]:
    """The manifest's parts for the derived arguments: kept as traced, naming the code that computes them."""
    parts = []
    for key, recipe in recipes.items():
        if recipe.source is None:
            code = f"function {recipe.method}"
        else:
            where = recipe.source.path or "the base model"
            code = f"{where}.{recipe.method}" if recipe.method != "forward" else f"{where} ({recipe.source.cls})"
        kinds = (*recipe.call.positional, *recipe.call.keywords.values())
        data = "the sequence and the tokens' boxes (the input bbox)" if "boxes" in kinds else "the sequence"
        detail = (f"argument {key!r}, computed once per stack by the model's own {code} from {data}, as the "
                  f"model computes it (posenc recomputes no stack tensor)")  # fmt: skip
        splits = {tuple(value[:3]) for k, value in recipe.call.constants.items()
                  if dict(_kinds(recipe.call)).get(k) == "segments"}  # fmt: skip
        for split, before, after in sorted(splits):  # CPM-Ant's prompt | text segments (trace.inputs.SEGMENTS)
            detail += (f"; its segment ids rebuilt from the positions, {before} below position {split} and {after} "
                       f"from it, as the model's are in one call of prompt and text without padding (checked on the "
                       f"capture)")  # fmt: skip
        rewrites = covered(recipe.source.cls) if recipe.source is not None else []
        if rewrites:  # the graph holds posenc's tensor-wise rewrite of a method that reads the length as a number
            detail += (
                f"; in the graph, {'; '.join(rewrites)} computed from tensors by posenc (posenc.trace.tensorwise: the "
                f"same values at every length; the model's code is the reference it is validated against)"
            )
        parts.append(TracePart(DERIVED_PART, "kept", detail))
    return tuple(parts)


def _kinds(call: CallRecipe) -> list[tuple[str, str]]:
    """``(key, kind)`` of every argument of a recipe's call (``"#i"`` for positional ``i``)."""
    return [(f"#{i}", kind) for i, kind in enumerate(call.positional)] + list(call.keywords.items())


def refuse_with_cache(key: str) -> ExportError:
    """Why a derived argument of an attention called with a KV cache is refused (its code reads the length)."""
    return ExportError(
        f"the attention is called with argument {key!r}, which the model computes from the sequence's length before "
        f"its layers; posenc rebuilds such a tensor only for an attention called without a KV cache (with one, the "
        f"capture cannot tell the query length from the key length); this model's attention cannot be traced yet."
    )


__all__ = [
    "DERIVED_PART",
    "Derived",
    "MethodCall",
    "compute",
    "derive",
    "derived_parts",
    "function_of",
    "record_methods",
    "refuse_with_cache",
    "source_module",
    "with_checkpoint_tensors",
]
