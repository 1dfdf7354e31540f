"""The capture forward and what it records: every module's call, and the recipes that rebuild them.

:func:`_record_calls` hooks every module of the base model (the attention's forward hook stops the forward with
:class:`_Stop`); :func:`_run_forward` runs a short forward; :func:`_recipe`, :func:`_rotary_recipe` and
:func:`_mask_recipe` turn the recorded calls of the attention, its rotary module and its mask into
:class:`~posenc.trace.record.CallRecipe` / :class:`~posenc.trace.record.MaskRecipe` (every argument classified by
:mod:`posenc.trace.arguments`). Used by :mod:`posenc.trace.capture`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from posenc.checkpoints.reference import attention_mask
from posenc.errors import ExportError
from posenc.trace.arguments import classify, keep
from posenc.trace.inputs import capture_inputs, capture_refusal, padded_block
from posenc.trace.masks import chunk_candidates, chunk_span, visible
from posenc.trace.record import CallRecipe, MaskRecipe
from posenc.trace.stacks import (
    encoder_states,
    stack_inputs,
)

CAPTURE_TOKENS = 8
"""Tokens of the capture forward (more when a small sliding window must be seen to be told apart)."""


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
    item: int | None = None
    """Set on the call :func:`_outer_producer` picks where the tensor is one entry of the tuple it returned."""

    def every(self) -> list[Call]:
        """This call and the module's later ones, in order."""
        return [self, *self.later]


class ReadDict(dict):
    """A dict argument of the attention that records which entries the attention reads (``read``, in order): ZAYA's
    masks per use ``{'causal', 'conv'}``, DeepSeek-V4's cos/sin per rope type ``{'main', 'compress'}`` of which a
    layer reads one. The unit rebuilds the entries read (:func:`_entries`) and drops the others."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: list[Any] = []

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def _note(self, key: Any) -> None:
        if key not in self.read:
            self.read.append(key)


ENTRY_KINDS = ("mask", "position_embeddings", "constant", "ones", "position_ids", "cache_position", "hidden")
"""Kinds an entry of a dict argument may have (kind ``entries``); another is refused naming the entry."""


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

    def attention_pre(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = {key: ReadDict(value) if type(value) is dict else value for key, value in kwargs.items()}
        target.args, target.kwargs = args, dict(kwargs)
        return args, kwargs  # a dict argument as a ReadDict: which entries the attention reads

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
    refusal = capture_refusal(hf)
    if refusal is not None:
        raise ExportError(refusal)
    shape, extra = capture_inputs(hf, tokens)  # boxes, a language, ids per codebook: posenc.trace.inputs
    ids = torch.randint(0, max(vocab, 2), shape, generator=generator)
    positions = torch.arange(tokens).unsqueeze(0)
    features = stack_inputs(runner, hf, tokens) if runner is not None else []
    attempts = features or [
        {"input_ids": ids, "position_ids": positions, "use_cache": True},
        {"input_ids": ids, "use_cache": True},
        {"input_ids": ids},
    ]
    if not cache and not features:  # an encoder stack (T5's refuses use_cache=True)
        attempts = [{"input_ids": ids, "position_ids": positions}, {"input_ids": ids}]
    extra = _accepted(runner or model, extra)  # FSMT's decoder inputs are not its encoder's
    attempts = [{**attempt, **extra} for attempt in attempts]
    states = encoder_states(runner, hf, tokens) if runner is not None and not features else {}
    stateless = len(attempts) if states else 0  # attempts without encoder states, where the stack takes them
    if states:  # a decoder stack whose cross-attention runs regardless (Cohere ASR): then with encoder states
        attempts += [{**kwargs, **states} for kwargs in attempts]
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
            # a decoder stack that reads its encoder states before its layers (Moonshine Streaming's positions)
            if isinstance(exc, TypeError) or next_layout or number < stateless:
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


def _accepted(module: nn.Module, extra: dict[str, Any]) -> dict[str, Any]:
    """The extra capture inputs ``module``'s forward takes (all of them where it takes ``**kwargs``)."""
    parameters = inspect.signature(module.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return extra
    return {key: value for key, value in extra.items() if key in parameters}


def _attended_positions(
    target: Call, hidden_key: str | None, positions: torch.Tensor, attended: Any = None
) -> torch.Tensor:
    """The positions of the attention's input: ``positions``, or ``0 .. T - 1`` where a speech encoder's attention
    sees ``T`` frames of its features rather than the capture's tokens; ``attended``: that input as ``[B, S, E]``
    where the model passes it in another axis order (:mod:`posenc.trace.orders`)."""
    hidden = target.kwargs.get(hidden_key) if hidden_key else (target.args[0] if target.args else None)
    hidden = hidden if attended is None else attended
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


def _reads_hidden_only(call: Call, hidden: Any) -> bool:
    """Whether every floating tensor a module call took is the hidden states ``[B, S, E]`` or of their shape (a
    relative-encodings module reads them for their length, dtype and device: the unit calls it again on its own);
    False where it took other floating data (BROS's scaled boxes ``[B, S, 8]``, UDOP's mask and boxes), which the
    unit does not hold."""
    shape = tuple(hidden.shape) if torch.is_tensor(hidden) else None
    values = [*call.args, *call.kwargs.values()]
    return all(tuple(v.shape) == shape for v in values if torch.is_tensor(v) and v.is_floating_point())


def _outer_producer(calls: Mapping[str, Call], value: torch.Tensor) -> tuple[str, Call] | None:
    """The outermost module (shortest name) that returned ``value`` itself, or as one entry of a tuple, and that call:
    the module that computes relative encodings from the hidden states (SpeechT5's ``embed_positions``), not a table
    inside it (its ``pe_k``, fed index offsets) nor its dropout (FastSpeech2-Conformer's ``pos_enc`` returns the
    scaled hidden states and the encodings: the call then says which entry, ``Call.item``)."""
    found = []
    for name, first in calls.items():
        for call in first.every():
            if call.output is value:
                found.append((name, call))
            elif isinstance(call.output, tuple):
                index = next((i for i, entry in enumerate(call.output) if entry is value), None)
                if index is not None:
                    found.append((name, dataclasses.replace(call, item=index)))
    return min(found, key=lambda item: item[0].count(".")) if found else None


def _recipe(
    call: Call,
    positions: torch.Tensor,
    calls: Mapping[str, Call],
    cache_class: type,
    hidden_key: str | None,
    names: list[str],
    fallback: Callable[[str, Any], bool] | None = None,
) -> tuple[CallRecipe, tuple[str, Call] | None]:
    """The attention's :class:`CallRecipe` and the module that computed its position embeddings (its path and the
    call that returned them); ``names``: the forward's parameter names (a positional argument is classified, and
    named in errors, by its parameter's name: GIT's and VisualBERT's masks are passed positionally); ``fallback(key,
    value)``: whether an argument no kind fits is one the model derived from the sequence (kind ``derived``,
    :mod:`posenc.trace.derived`), else it is refused."""
    hidden = call.kwargs.get(hidden_key) if hidden_key else (call.args[0] if call.args else None)
    rotary = None
    keywords: dict[str, str] = {}
    constants: dict[str, Any] = {}
    positional = []
    items = [(f"#{i}", v) for i, v in enumerate(call.args)] + list(call.kwargs.items())
    for key, value in items:
        index = int(key[1:]) if key.startswith("#") else -1
        name = names[index] if 0 <= index < len(names) else key
        if isinstance(value, ReadDict):  # a dict argument: the entries the attention read
            constants[key], found = _entries(name, value, positions, calls, cache_class, hidden)
            rotary = found or rotary
            (positional.append("entries") if key.startswith("#") else keywords.__setitem__(key, "entries"))
            continue
        producer = _producer(calls, tuple(value)) if isinstance(value, (tuple, list)) else None
        if producer is None and relative_embeddings(name, value, hidden):
            producer = _outer_producer(calls, value)
            if producer is not None and not _reads_hidden_only(producer[1], hidden):
                producer = None  # computed from other data (BROS's, UDOP's boxes): classified, and refused, below
        try:
            kind = classify(name, value, positions, hidden, cache_class, producer is not None)
        except ExportError:
            if fallback is None or not fallback(key, value):
                raise
            kind = "derived"
        if kind == "position_embeddings":
            rotary = producer
        keep(constants, key, kind, value)
        if key.startswith("#"):
            positional.append(kind)
        else:
            keywords[key] = kind
    return CallRecipe(tuple(positional), keywords, constants), rotary


def _entries(
    name: str, value: ReadDict, positions: torch.Tensor, calls: Mapping[str, Call], cache_class: type, hidden: Any
) -> tuple[dict[str, list[Any]], tuple[str, Call] | None]:
    """The recipe of a dict argument: each entry the attention read -> ``[kind, constant value or None]``
    (:data:`ENTRY_KINDS`), and the module that computed its position embeddings (one entry at most).

    Raises:
        ExportError: an entry of another kind, or position embeddings in two entries (named).
    """
    entries: dict[str, list[Any]] = {}
    rotary = None
    for entry in value.read:
        item = dict.__getitem__(value, entry) if entry in value else None
        label = f"{name}[{entry!r}]"
        producer = _producer(calls, tuple(item)) if isinstance(item, (tuple, list)) else None
        kind = classify(label, item, positions, hidden, cache_class, producer is not None)
        if not isinstance(entry, str) or kind not in ENTRY_KINDS or (kind == "position_embeddings" and rotary):
            raise ExportError(
                f"the attention reads {label} ({kind}) from a dict argument; posenc rebuilds a dict's masks, "
                f"constants and one entry of position embeddings only, so this model's attention cannot be traced yet."
            )
        if kind == "position_embeddings":
            rotary = producer
        entries[str(entry)] = [kind, item if kind == "constant" else None]
    return entries, rotary


def relative_embeddings(name: str, value: Any, hidden: Any) -> bool:
    """Whether an argument may be one tensor of position embeddings a module of the model computed (a conformer's
    sinusoidal relative encodings ``[B, 2T - 1, E]`` of Transformer-XL, Parakeet's ``position_embeddings``): a
    floating tensor, not the hidden states, passed under a parameter naming positions. Its producer is looked up and
    called again as the rotary module is."""
    return torch.is_tensor(value) and value.is_floating_point() and value is not hidden and "pos" in name.lower()


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
    return CallRecipe(tuple(positional), keywords, constants, item=call.item)


def reads_length(module: nn.Module, call: Call, recipe: CallRecipe) -> bool:
    """Whether a rotary module called without position ids sizes its output by its input's length (CLVP's
    ``rotary_pos_emb``: angles of positions ``0 .. S - 1`` that the attention gathers at the position ids): called
    again with one more row of its floating inputs, its output's shape changes."""
    kinds = {*recipe.positional, *recipe.keywords.values()}
    if kinds & {"position_ids", "cache_position", "sections"}:
        return False

    def longer(value: Any) -> Any:
        if torch.is_tensor(value) and value.is_floating_point() and value.dim() >= 2:
            return torch.cat((value, torch.zeros_like(value[:, :1])), dim=1)
        return value

    def shapes(out: Any) -> list[Any]:
        return [tuple(t.shape) for t in (out if isinstance(out, (tuple, list)) else (out,)) if torch.is_tensor(t)]

    try:
        with torch.no_grad():
            again = module(*[longer(v) for v in call.args], **{k: longer(v) for k, v in call.kwargs.items()})
    except Exception:
        return False
    return shapes(again) != shapes(call.output)


_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _mask_recipe(
    mask: Any, hf: Any, layer_type: str | None, positions: torch.Tensor, causal_without: bool = True
) -> MaskRecipe:
    """The :class:`MaskRecipe` that rebuilds the captured mask from positions (causal or not, window or not, by
    chunks where ``hf`` or a sub-config declares them: :mod:`posenc.trace.masks`); ``causal_without``: whether the
    attention is causal when the model passes no mask."""
    if mask is None:
        return MaskRecipe("none", causal=causal_without)
    if not torch.is_tensor(mask) or mask.dim() != 4:
        raise ExportError(f"the attention's mask is a {type(mask).__name__}, not a [B, 1, S, K] tensor; cannot trace.")
    kind = mask_kind(mask)
    seen = mask_allows(mask, kind)
    if seen.shape[-2] == 1 and bool(seen.all()):  # a padding mask [B, 1, 1, K] hiding no key
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
            rebuilt = attention_mask(positions, positions, causal, window, torch.float32)[..., : seen.shape[-1]] == 0
            if rebuilt.shape[-2:] == seen.shape[-2:] and torch.equal(rebuilt.expand_as(seen), seen):
                return MaskRecipe(kind, causal=causal, window=window)
    for recipe in chunk_candidates(kind, hf):
        chunked = visible(positions, positions, recipe)
        if chunked is not None and chunked.shape[-2:] == seen.shape[-2:] and torch.equal(chunked.expand_as(seen), seen):
            return recipe
    band = _band(seen, positions)
    if band is not None:
        return MaskRecipe(kind, causal=False, window=band[0], ahead=band[1])
    raise ExportError(
        f"cannot rebuild the mask this {hf.model_type} model gives layer's attention from positions (tried causal and "
        f"bidirectional, with and without its sliding window, and the chunks its config declares); this model's "
        f"attention cannot be traced yet."
    )


def split_joined(mask: Any, streams: Mapping[str, torch.Tensor], positions: torch.Tensor) -> tuple[Any, str | None]:
    """``(the tokens' part of the mask, the joined stream)``: where the captured mask ``[B, 1, S, S + L]`` has ``L``
    columns more than the capture's tokens and a second stream of another length is ``[B, L, W]``, the stream's keys
    follow the tokens' in the same softmax (T5Gemma 2's merged self- and cross-attention); its columns must all be
    visible (an encoder's states without padding), and the mask's first ``S`` columns are the tokens'. Else the
    mask unchanged and None.

    Raises:
        ExportError: a joined stream's columns hide some key (padding the unit does not rebuild).
    """
    if not torch.is_tensor(mask) or mask.dim() != 4:
        return mask, None
    tokens = int(positions.shape[-1])
    for key, states in streams.items():
        extra = int(states.shape[1])
        if extra == tokens or mask.shape[-1] != tokens + extra:
            continue
        if not bool(mask_allows(mask[..., tokens:], mask_kind(mask)).all()):
            raise ExportError(
                f"the attention's mask hides some of {key!r}'s keys, which it attends beside the tokens' own; posenc "
                f"rebuilds them all visible (no padding), so this model's attention cannot be traced yet."
            )
        return mask[..., :tokens], key
    return mask, None


def mask_allows(mask: torch.Tensor, kind: str) -> torch.Tensor:
    """Which keys a captured mask of :func:`mask_kind` ``kind`` lets each query attend (boolean, its shape)."""
    if kind == "bool":
        return mask
    return mask != 0 if kind == "keep" else mask > torch.finfo(mask.dtype).min / 2


def mask_kind(mask: torch.Tensor) -> str:
    """How a captured mask tensor says which keys a query may attend: ``bool`` (True = may attend); ``keep``, a mask
    of ones (may attend) and zeros in a number dtype that the attention turns boolean (DeBERTa's
    ``attention_mask.bool()``: a product of padding masks, all ones without padding); else ``additive`` (0 / the
    dtype's minimum, added to the scores). An all-zero number mask is additive (it hides nothing either way)."""
    if mask.dtype == torch.bool:
        return "bool"
    if mask.numel() and bool(((mask == 0) | (mask == 1)).all()) and bool((mask == 1).any()):
        return "keep"
    return "additive"


def _band(allowed: torch.Tensor, positions: torch.Tensor) -> tuple[int, int] | None:
    """``(window, ahead)`` of a bidirectional band mask that is not symmetric (keys ``q - window < k <= q +
    ahead``), measured on the captured mask ``allowed [B, 1, S, S]`` over ``positions [1, S]`` and checked equal to
    the band rebuilt from them; None where the mask is no such band (or hides every key of a query)."""
    if allowed.shape[-1] != positions.shape[-1] or allowed.shape[-2] != positions.shape[-1]:
        return None
    offset = (positions.unsqueeze(-2) - positions.unsqueeze(-1)).unsqueeze(1)  # k - q, [1, 1, S, S]
    seen = offset.expand_as(allowed)[allowed]
    if seen.numel() == 0:
        return None
    window, ahead = int(-seen.min()) + 1, int(seen.max())
    rebuilt = (offset > -window) & (offset <= ahead)
    return (window, ahead) if ahead >= 0 and torch.equal(rebuilt.expand_as(allowed), allowed) else None


def _capture_tokens(hf: Any) -> int:
    windows = [getattr(hf, name, None) for name in ("sliding_window", "attention_window")]
    small = [w for w in windows if isinstance(w, int) and 0 < w < 60]
    block = padded_block(hf)  # a stack that pads to whole blocks (PEGASUS-X's): two of them, no padding
    return max([CAPTURE_TOKENS, *[w + 3 for w in small], chunk_span(hf), 2 * block if block else 0])


__all__ = ["CAPTURE_TOKENS", "ENTRY_KINDS", "Call", "ReadDict", "mask_kind", "reads_length", "split_joined"]
