"""Length bounds of a traced export: the sequence and past lengths torch.export may trace a model's module over.

A traced module is the model's own code, which may read a buffer sized to the context by the lengths (GPT-1's and
GPT-Neo's causal ``bias [1, 1, L, L]`` sliced by ``[:S, :P + S]``, ImageGPT's and Doge's likewise, a sinusoidal table
of ``L`` rows): torch.export then guards the lengths (``S <= L``, ``P + S <= L``, and ``S != L`` where slicing the
whole buffer keeps it contiguous) and refuses dimensions declared unbounded. The graph itself needs no such bound
where posenc's position guard already refuses positions beyond the table (every position ``< L`` implies ``P + S <=
L``), so :func:`bounded_export` exports again with the bounds torch.export asks for, when they keep at least half of
the positions the graph serves, and records them in the manifest's ``dynamic_dims``. A module that specialises a
length further (a guard that is not an upper bound: VITS's relative attention pads its table by ``S - window``, a
branch on the length) is refused with the guard named.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from posenc.errors import ExportError
from posenc.export.manifest import DimRange
from posenc.trace.arguments import padding_block

_FIX = re.compile(r"^\s*(\w+) = Dim\('\w+'(?:, min=(\d+))?(?:, max=(\d+))?\)\s*$", re.MULTILINE)
"""torch.export's suggested fix of a dimension's range: ``seq = Dim('seq', max=2046)``."""
_NOT_EQUAL = re.compile(r"values of (\w+) = .*? satisfy the generated guard L\['\w+'\]\.size\(\)\[\d+\] != (\d+)\.")
"""A guard excluding one length (``S != L``: the whole buffer sliced stays contiguous)."""
_GUARD = re.compile(r"values of (\w+) = .*? satisfy the generated guard (.*?)\.?$", re.MULTILINE)
ATTEMPTS = 3
"""Exports tried, each with the bounds the previous one was refused for."""


def export_dims(ranges: Mapping[str, DimRange]) -> dict[str, Any]:
    """``torch.export.Dim`` per dimension name, with the range's bounds."""
    dims = {}
    for name, bounds in ranges.items():
        if bounds.max is None:
            dims[name] = torch.export.Dim(name, min=bounds.min)
        else:
            dims[name] = torch.export.Dim(name, min=bounds.min, max=bounds.max)
    return dims


def narrowed(
    message: str, used: Mapping[str, DimRange], declared: Mapping[str, DimRange]
) -> dict[str, DimRange] | None:
    """The ranges to export with after torch.export refused ``used`` with a constraint violation ``message``: its
    suggested maxima and excluded top lengths, within the ``declared`` maxima; None when they ask for nothing new (the
    module specialises a length in another way)."""
    tops = {name: bounds.max for name, bounds in used.items()}
    for name, _, top in _FIX.findall(message):
        if name in tops and top and (tops[name] is None or int(top) < tops[name]):  # type: ignore[operator]
            tops[name] = int(top)
    for name, value in _NOT_EQUAL.findall(message):
        if name in tops and tops[name] in (None, int(value)):
            tops[name] = int(value) - 1
    for name, bounds in declared.items():
        top = tops.get(name)
        if bounds.max is not None and (top is None or top > bounds.max):
            tops[name] = bounds.max
    if all(tops[name] == bounds.max for name, bounds in used.items()):
        return None
    return {name: DimRange(r.min, tops[name], min(r.sample, tops[name] or r.sample)) for name, r in used.items()}


_CONSTANT = re.compile(r"You marked (\w+) as dynamic but your code specialized it to be a constant \((\d+)\)")
"""torch.export's violation where the module's Python code reads a length as a number (Funnel's
``list(range(seq_len))``): no bound fixes it."""


def _guards(message: str) -> str:
    constants = [f"{name}: fixed at the capture's {value}" for name, value in _CONSTANT.findall(message)]
    found = constants + [f"{name}: {guard}" for name, guard in _GUARD.findall(message)]
    return "; ".join(dict.fromkeys(found))[:300] or message[:300]


def _why(message: str, served: int | None) -> str:
    """What a length specialisation means for the graph (the refusal's reason)."""
    if _CONSTANT.search(message):
        return ("the module's code reads the length as a Python number (a list or loop over the positions), so a "
                "graph would serve that one length")  # fmt: skip
    return (
        "the module computes differently for some sequence or cache lengths"
        + ("" if served is None else f" below the {served} positions it serves")
        + ", so one graph cannot serve them all"
    )


def _violation(exc: BaseException) -> str | None:
    """The message of the torch.export constraint violation behind ``exc`` (its cause or context), else None."""
    cause: BaseException | None = exc.__cause__
    while cause is not None:
        if str(cause).startswith("Constraints violated"):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    return None


def bounded_export(
    export: Callable[[Mapping[str, Any]], Any],
    ranges: Mapping[str, DimRange],
    served: int | None,
    module_name: str,
) -> tuple[Any, dict[str, DimRange], list[str]]:
    """``(export(dims), ranges, notes)``: the export with unbounded dimensions first, then with the bounds torch.export
    asks for (see the module docstring).

    Args:
        export: runs the export with ``{name: torch.export.Dim}``; raises ExportError (its cause the torch error).
        ranges: the manifest's ranges (their maxima: the positions the graph serves).
        served: the positions the graph serves (its position guard's bound, else the model's context length), or
            None for any.
        module_name: the traced module's class, for messages.

    Raises:
        ExportError: torch.export specialises a length in a way no bound within half the served positions fixes.
    """
    used = {name: DimRange(r.min, None, r.sample) for name, r in ranges.items()}
    for attempt in range(ATTEMPTS):
        try:
            return export(export_dims(used)), (dict(ranges) if attempt == 0 else used), _notes(used, ranges, attempt)
        except ExportError as exc:
            message = _violation(exc)
            if message is None:
                raise
            tighter = narrowed(message, used, ranges)
            if (
                tighter is None
                or served is None
                or any(r.max is not None and r.max < served // 2 for name, r in tighter.items() if name != "batch")
            ):
                raise ExportError(
                    f"torch.export specialises the lengths of {module_name} ({_guards(message)}): "
                    f"{_why(message, served)}; this model's attention cannot be traced yet."
                ) from exc
            used = tighter
    raise ExportError(f"torch.export kept refusing the lengths of {module_name} after {ATTEMPTS} bounds.")


def deferrable(plan: Any, exc: ExportError) -> bool:
    """Whether a refusal of :func:`bounded_export` may be retried with torch.export's guards deferred to runtime
    asserts: the lengths were specialised (no bound fixes them) in an attention its model calls without a cache,
    fed relative position encodings a module computes from the sequence length (a conformer's Transformer-XL
    relative shift, ``pad`` -> ``view(-1)`` -> slice -> ``view``: torch.export cannot prove ``(2S - 1) % S != 0``
    for symbolic ``S``), or a tensor its stack derives from the length (LongT5's local attention pads the sequence
    to a multiple of its block, ``S + (-S mod 128)``, which torch.export cannot prove a multiple of 128, and its
    blocked mask is derived from the length; XLNet's ``relative_positional_encoding`` and ``rel_shift_bnij``), or in
    the model's embeddings module the unit starts with (MobileBERT's trigram input pads ``inputs_embeds[:, 1:]``:
    torch.export guards ``S - 1 != 1``), an attention over sliding chunks the unit pads to its window
    (Longformer's, LED's encoder's: :mod:`posenc.trace.windows`), a unit that pads its sequence to whole blocks as
    the model's stack does (PEGASUS-X's encoder, :data:`posenc.trace.inputs.PADDED_BLOCKS`: its local attention views
    the padded length as blocks, which torch.export's solver fails to range, whatever its message), or an attention
    whose cache holds fixed-size states beside its keys and values (:mod:`posenc.trace.caches`: ZAYA's delayed values
    ``cat([state, new[:, :-1]])``, whose contiguity check guards ``S - 1 != 1``). The retried graph is held to the
    model's module at several lengths by ``validate``."""
    from posenc.trace.windows import chunk_window

    captured = plan.captured
    module = captured.rotary is not None and captured.rotary_call is not None
    from_length = any(made.needs_length() for made in captured.derived.values())  # LongT5's blocks, XLNet's shift
    embeddings = captured.embedding is not None and captured.embedding.record.tokens is not None
    if captured.cacheless and padding_block(captured.call) is not None:
        return True
    windowed = chunk_window(captured.attention) is not None
    stateful = bool(getattr(captured, "states", ()))
    cacheless = captured.cacheless and (module or from_length or embeddings or windowed)
    return (cacheless or stateful) and "specialises the lengths" in str(exc)


def deferred_export(
    export: Callable[..., Any], ranges: Mapping[str, DimRange], dynamic: Mapping[str, Mapping[int, str]]
) -> Any:
    """``export(dims, deferred=True)`` (see :func:`deferrable`) with the named dimensions; where torch.export's
    constraint solver fails on them (LongT5's padding to blocks: it cannot range the padded length), with unnamed
    dynamic dimensions (``Dim.DYNAMIC``), the graph then checked to keep every ``dynamic`` axis of its inputs (input
    name -> {axis: dimension name}) dynamic.

    Raises:
        ExportError: the second export fixed a length (a graph of one length, not the unit's).
    """
    try:
        return export(export_dims(ranges), deferred=True)
    except ExportError:
        result = export(dict.fromkeys(ranges, torch.export.Dim.DYNAMIC), deferred=True)
    fixed = [
        f"{value.name}[{axis}] = {dim.dim_value}"
        for value in result[0].graph.input
        for axis, dim in enumerate(value.type.tensor_type.shape.dim)
        if axis in dynamic.get(value.name, {}) and not dim.dim_param
    ]
    if fixed:
        raise ExportError(
            f"torch.export fixed the lengths of the traced module ({', '.join(fixed)}) with its guards deferred; one "
            f"graph cannot serve every length, so this attention cannot be traced yet."
        )
    return result


def deferred_note(exc: ExportError) -> str:
    """The manifest note of an export whose length guards were deferred (:func:`deferrable`)."""
    message = _violation(exc) or str(exc)
    return (f"torch.export's guards on the lengths ({_guards(message)}) deferred to runtime asserts, which the ONNX "
            f"graph does not carry: the module's code for them (a relative shift, padding to blocks) is exported "
            f"for every length")  # fmt: skip


def _notes(used: Mapping[str, DimRange], declared: Mapping[str, DimRange], attempt: int) -> list[str]:
    changed = [f"{name} <= {r.max}" for name, r in used.items() if r.max != declared[name].max]
    if attempt == 0 or not changed:
        return []
    return [
        f"lengths bounded for torch.export: {', '.join(changed)} (the traced module reads a buffer of the context's "
        f"size by the lengths)"
    ]


def slot_shapes(slots: Sequence[Any], dims: Mapping[str, Any]) -> tuple[dict[int, Any], ...]:
    """Per input ``{axis: Dim}`` of a unit's slots (their shapes name the dimensions)."""
    return tuple({axis: dims[size] for axis, size in enumerate(s.shape) if isinstance(size, str)} for s in slots)


__all__ = [
    "ATTEMPTS",
    "bounded_export",
    "deferrable",
    "deferred_export",
    "deferred_note",
    "export_dims",
    "narrowed",
    "slot_shapes",
]
