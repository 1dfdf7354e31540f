"""Which path posenc took for an exported layer, read from its manifest (and what a traced export kept).

The census reads the manifest as plain JSON, so fields added after this module was written do not break it, and it
says ``unknown`` rather than guess where nothing fits. In order:

1. an explicit field naming the path — ``via``, ``path`` or ``route`` at the top level, in ``weights.source`` or
   in a ``trace`` record — whose value is one of :data:`PATHS`;
2. a trace record (a top-level ``trace`` object, or ``weights.source.kind`` ``trace``/``traced``): ``trace``;
3. checkpoint weights (``weights.source.kind == "checkpoint"``) mapped by a posenc family:
   ``alias`` where the family lists the type among its ``aliases``; ``tower`` where the checkpoint's type wraps a
   text model (its text config is another type) and the family is that text type's; else ``family``;
4. anything else: ``unknown``.

A trace's ``kept`` / ``replaced`` lists (in the trace record, else at the top level) are reported as they are:
each entry a string or an object whose ``what`` / ``name`` / ``reason`` fields are joined; so are the entries of
the trace record's ``parts`` (posenc's own form: ``part``, ``status`` kept / replaced, ``detail``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

PATHS = ("family", "alias", "tower", "trace")
"""The ways a checkpoint's layer reaches an exported graph; a type none of them takes is ``refused``."""
REFUSED = "refused"
UNKNOWN = "unknown"
_PATH_FIELDS = ("via", "path", "route", "export_path")


@dataclasses.dataclass(frozen=True)
class Route:
    """How a layer was exported.

    Attributes:
        path: one of :data:`PATHS`, or ``unknown``.
        family: the posenc family that mapped the weights (``""`` where none is named).
        kept: what a traced export left as traced (with the reason, where the manifest gives one).
        replaced: what a traced export replaced with posenc's parts.
    """

    path: str
    family: str = ""
    kept: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()


def _explicit(*records: Mapping[str, Any]) -> str | None:
    for record in records:
        for field in _PATH_FIELDS:
            value = record.get(field)
            if isinstance(value, str) and value.lower() in PATHS:
                return value.lower()
    return None


def _entries(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Mapping):
        return tuple(f"{k}: {v}" if not isinstance(v, (Mapping, list)) else str(k) for k, v in value.items())
    if not isinstance(value, Sequence):
        return ()
    out = []
    for entry in value:
        if isinstance(entry, Mapping):
            parts = [str(entry[k]) for k in ("what", "name", "part", "op", "reason", "why") if entry.get(k)]
            out.append(": ".join(parts) if parts else str(dict(entry)))
        else:
            out.append(str(entry))
    return tuple(out)


def _parts(parts: Any, status: str) -> tuple[str, ...]:
    """The ``part (detail)`` of each entry of a trace record's ``parts`` list with this ``status``
    (:class:`posenc.trace.record.TracePart`: ``{"part", "status", "detail"}``)."""
    if not isinstance(parts, Sequence) or isinstance(parts, str):
        return ()
    found = [p for p in parts if isinstance(p, Mapping) and p.get("status") == status and p.get("part")]
    return tuple(f"{p['part']} ({p['detail']})" if p.get("detail") else str(p["part"]) for p in found)


def _family_route(source: Mapping[str, Any], model_type: str, text_type: str) -> str:
    from posenc.checkpoints.family import all_families, family_for
    from posenc.errors import ConfigError

    name = str(source.get("family", ""))
    family = next((f for f in all_families() if f.name == name), None)
    if family is None:
        return UNKNOWN
    if model_type in tuple(getattr(family, "aliases", ()) or ()):
        return "alias"
    if text_type != model_type:
        try:
            if family_for(text_type).name == family.name:
                return "tower"
        except ConfigError:
            pass
    if source.get("tower") or source.get("text_tower"):
        return "tower"
    return "family"


def classify(manifest: Mapping[str, Any], model_type: str, text_type: str | None = None) -> Route:
    """The :class:`Route` of an export of a ``model_type`` checkpoint whose text config is of ``text_type``."""
    weights = manifest.get("weights")
    source = weights.get("source", {}) if isinstance(weights, Mapping) else {}
    source = source if isinstance(source, Mapping) else {}
    trace = manifest.get("trace")
    trace = trace if isinstance(trace, Mapping) else {}
    family = str(source.get("family", "") or "")
    record = trace or manifest
    kept, replaced = _entries(record.get("kept", ())), _entries(record.get("replaced", ()))
    kept += _parts(record.get("parts"), "kept")
    replaced += _parts(record.get("parts"), "replaced")
    explicit = _explicit(manifest, source, trace)
    if explicit:
        return Route(explicit, family, kept, replaced)
    if trace or str(source.get("kind", "")).lower() in ("trace", "traced"):
        return Route("trace", family, kept, replaced)
    if source.get("kind") == "checkpoint":
        return Route(_family_route(source, model_type, text_type or model_type), family, kept, replaced)
    return Route(UNKNOWN, family, kept, replaced)


def module_of(manifest: Mapping[str, Any]) -> str:
    """The qualified name of the checkpoint module an export is of: a trace record's attention (``path`` after its
    text tower's, ``: class``), else the dotted prefix all the layer's checkpoint tensors share
    (``model.layers.3.self_attn``); ``""`` where the manifest names neither. Two layer kinds of a type with the same
    name exported the same module (:func:`posenc.census.worker.same_modules`)."""
    trace = manifest.get("trace")
    attention = trace.get("attention") if isinstance(trace, Mapping) else None
    if isinstance(attention, Mapping) and attention.get("path") is not None:
        tower = trace.get("tower") if isinstance(trace, Mapping) else None
        prefix = f"{tower['path']}." if isinstance(tower, Mapping) and tower.get("path") else ""
        return f"{prefix}{attention['path']}: {attention.get('cls', '')}"
    weights = manifest.get("weights")
    source = weights.get("source") if isinstance(weights, Mapping) else None
    tensors = source.get("tensors") if isinstance(source, Mapping) else None
    if not isinstance(tensors, Mapping) or not tensors:
        return ""
    split = [str(name).split(".") for name in tensors]
    common = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)


__all__ = ["PATHS", "REFUSED", "UNKNOWN", "Route", "classify", "module_of"]
