"""``docs/models.md``: the census as a page — counts by path and by scheme, then one row per model type.

A type's *path* is how its attention layers reach an exported graph (:data:`posenc.census.route.PATHS`), or
``refused`` (posenc's export said no: the reason is the message it printed), ``partial`` (some layer kinds
exported, some refused), ``no attention`` (no layer with an attention module), ``not built`` (the census could
not make a tiny checkpoint of the type: the reason is the config's or the model's error), or ``timeout`` /
``crashed`` (the type's worker process stopped). Its *parity* is the verdict of ``posenc validate --against-hf``
on every exported layer kind, with the largest error against the checkpoint's own transformers module.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Any

from posenc.census.anatomy import SCHEMES
from posenc.census.route import PATHS, REFUSED

STATES = (*PATHS, "unknown", "partial", REFUSED, "no attention", "not built", "timeout", "crashed")
"""Type-level paths, in the order of the tables."""
NO_POSITIONS = ("NoPE", "none (no attention)")
"""Schemes without a positional encoding (left out of the target's denominator)."""


def _attention_kinds(entry: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [k for k in entry.get("layers", []) if k.get("attention") and k.get("path") not in (None, "skipped")]


def type_path(entry: Mapping[str, Any]) -> str:
    """The type-level path of a cache entry (see the module docstring)."""
    status = entry.get("status")
    if status == "no-checkpoint":
        return "not built"
    if status in ("timeout", "crashed") and not _attention_kinds(entry):
        return str(status)
    kinds = _attention_kinds(entry)
    if not kinds:
        return "no attention" if status == "ok" else str(status)
    paths = [str(k["path"]) for k in kinds]
    if all(p == REFUSED for p in paths):
        return REFUSED
    if REFUSED in paths:
        return "partial"
    exported = [p for p in paths if p != REFUSED]
    return min(exported, key=lambda p: STATES.index(p) if p in STATES else len(STATES))  # the most general path


def type_passed(entry: Mapping[str, Any]) -> bool:
    """Every attention layer kind exported and matched its transformers module."""
    kinds = _attention_kinds(entry)
    return (
        entry.get("status") == "ok"
        and bool(kinds)
        and all(k.get("path") != REFUSED and (k.get("parity") or {}).get("passed") for k in kinds)
    )


def _parity_cell(entry: Mapping[str, Any]) -> str:
    kinds = [k for k in _attention_kinds(entry) if k.get("parity")]
    if not kinds:
        return "—"
    worst = [k["parity"].get("worst_hf") for k in kinds if k["parity"].get("worst_hf") is not None]
    error = f" {max(worst):.1e}" if worst else ""
    if all(k["parity"].get("passed") for k in kinds):
        return f"pass{error}"
    failed = sorted({f for k in kinds for f in k["parity"].get("failed", [])})
    return f"**FAIL**{error}" + (f" ({', '.join(failed[:3])})" if failed else "")


def _kind_name(kind: Mapping[str, Any]) -> str:
    stack = f"{kind['stack']} " if kind.get("stack") else ""
    return f"{stack}layer {kind.get('layer')}"


def _escape(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _notes(entry: Mapping[str, Any]) -> str:
    notes = []
    kinds = _attention_kinds(entry)
    path = type_path(entry)
    if path in ("not built", "timeout", "crashed") or (path == "no attention" and entry.get("reason")):
        notes.append(str(entry.get("reason", "")))
    reasons: dict[str, list[str]] = {}
    for kind in kinds:
        if kind.get("path") == REFUSED:
            reasons.setdefault(str(kind.get("reason", "")), []).append(_kind_name(kind))
        if kind.get("kept"):
            notes.append(f"{_kind_name(kind)} kept as traced: {'; '.join(kind['kept'])}")
    for reason, where in reasons.items():
        notes.append((f"{', '.join(where)}: " if len(reasons) > 1 else "") + reason)
    if len(kinds) > 1:
        paths = {str(k.get("path")) for k in kinds}
        labels = [_kind_name(k) + (f" ({k.get('path')})" if len(paths) > 1 else "") for k in kinds]
        notes.append(f"{len(kinds)} layer kinds: " + ", ".join(labels))
    build = entry.get("build") or {}
    if build.get("mode"):
        chosen = ", ".join(f"{key}={value!r}" for key, value in build["mode"].items())
        notes.append(f"the tiny config chooses the model's mode {chosen} (census.tiny.MODES says why)")
    if build and not build.get("kinds_kept", True):
        notes.append(f"the tiny config ({build.get('layers')} layers) lacks some of the default's layer kinds")
    return _escape("; ".join(n for n in notes if n))


def _scheme_cell(entry: Mapping[str, Any]) -> str:
    scheme = str(entry.get("scheme", "—"))
    names = sorted({str(k["posenc_scheme"]) for k in _attention_kinds(entry) if k.get("posenc_scheme")})
    return scheme + (f" ({', '.join(names)})" if names else "")


def counts(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Counts by path, by scheme, scheme x path, and the target's: types with attention and positions that export
    and match."""
    by_path = collections.Counter(type_path(e) for e in entries.values())
    by_scheme = collections.Counter(str(e.get("scheme", "unknown (not built)")) for e in entries.values())
    cross = collections.Counter((str(e.get("scheme", "unknown (not built)")), type_path(e)) for e in entries.values())
    positional = [e for e in entries.values() if e.get("scheme") and e.get("scheme") not in NO_POSITIONS]
    return {
        "types": len(entries),
        "by_path": dict(by_path),
        "by_scheme": dict(by_scheme),
        "cross": {f"{s} | {p}": n for (s, p), n in cross.items()},
        "positional": len(positional),
        "positional_passed": sum(type_passed(e) for e in positional),
        "passed": sum(type_passed(e) for e in entries.values()),
    }


def _ordered(keys: Iterable[str], order: Iterable[str]) -> list[str]:
    order = list(order)
    return sorted(set(keys), key=lambda k: (order.index(k) if k in order else len(order), k))


def render(cache: Mapping[str, Any], *, command: str, wall_s: float | None = None) -> str:
    """The Markdown page of a census cache."""
    entries: dict[str, Mapping[str, Any]] = dict(sorted(cache.get("types", {}).items()))
    c = counts(entries)
    stale = sorted(name for name, e in entries.items() if e.get("fingerprint") != cache.get("fingerprint"))
    share = f"{100 * c['positional_passed'] / c['positional']:.0f} %" if c["positional"] else "—"
    lines = [
        "# Model types of transformers, exported by posenc",
        "",
        f"Produced by `{command}` (`posenc.census`): for every text model type of the installed transformers, a "
        "tiny seeded checkpoint (the type's own config class, sizes shrunk, `save_pretrained` of the random "
        "initialisation: never downloaded), one layer of each layer kind exported with `posenc export --hf-model` "
        "and checked with `posenc validate --against-hf` against the checkpoint's own transformers module. "
        "Scheme and layer kinds are read from the model transformers builds, not from posenc.",
        "",
        f"Fingerprint: {cache.get('fingerprint', '?')}."
        + (f" Wall time of the run: {wall_s / 60:.1f} min." if wall_s else ""),
        "",
        f"**{c['positional_passed']} of the {c['positional']} types with attention and a positional encoding "
        f"({share}) export every layer kind and match their module**; {c['passed']} of {c['types']} types in all.",
        "",
        "## By path",
        "",
        "| path | types |",
        "|---|---:|",
        *[f"| {p} | {c['by_path'][p]} |" for p in _ordered(c["by_path"], STATES)],
        "",
        "## By scheme",
        "",
    ]
    paths = _ordered(c["by_path"], STATES)
    lines += [
        "| scheme | types | " + " | ".join(paths) + " |",
        "|---|---:|" + "---:|" * len(paths),
    ]
    for scheme in _ordered(c["by_scheme"], SCHEMES):
        row = [str(c["cross"].get(f"{scheme} | {p}", "")) for p in paths]
        lines.append(f"| {scheme} | {c['by_scheme'][scheme]} | " + " | ".join(row) + " |")
    lines += [
        "",
        "## Every type",
        "",
        "Kind: `text`, `multimodal` (its text config is another type) or `tower` (a text config of another type). "
        "Parity: every exported layer kind within tolerance, and the largest error against the transformers module.",
        "",
        "| model type | kind | scheme | path | parity | notes |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in entries.items():
        kind = str(entry.get("kind", ""))
        if kind == "multimodal":
            kind += f" ({entry.get('text_type')})"
        mark = " (stale)" if name in stale else ""
        lines.append(
            f"| {name}{mark} | {kind} | {_scheme_cell(entry)} | {type_path(entry)} | {_parity_cell(entry)} | "
            f"{_notes(entry)} |"
        )
    left = cache.get("left_out", {})
    if left:
        lines += ["", f"## Not text model types ({len(left)})", "", "| model type | why |", "|---|---|"]
        lines += [f"| {name} | {_escape(reason)} |" for name, reason in sorted(left.items())]
    return "\n".join(lines) + "\n"


__all__ = ["NO_POSITIONS", "STATES", "counts", "render", "type_passed", "type_path"]
