"""The traced graph's positional subgraph -> posenc's tables, the rotation and mask in posenc's fusable forms.

A checkpoint's attention traced with its own rotary module (:mod:`posenc.export.trace`) computes its angles as
transformers does, in float32: ``position_ids -> Cast -> Mul/MatMul(inv_freq) -> (Concat) -> Cos / Sin (× attention
scaling) -> Unsqueeze``, about ``position * 2**-23`` rad off at far positions. :func:`replace_positions`:

1. finds the positional region (values computed from the position ids, constants and shapes alone), the ``Cos`` /
   ``Sin`` in it and its **frontier**: the cos/sin tensors the rest of the graph reads;
2. runs the traced graph on probe positions (ONNX Runtime) and matches every frontier tensor with posenc's cos or
   sin of the layer's scheme (built from the model's ``rope_parameters`` through :mod:`posenc.rope_types`) in one of
   the layouts of :mod:`posenc.trace.layouts`; a tensor that matches nothing keeps the whole part as traced, with
   the difference found;
3. splices in posenc's own cos/sin subgraph (the scheme's module exported: a float64-exact precomputed table read by
   the guarded position ids, or float32-exact dynamic angles) and gives every frontier tensor its values in the
   model's layout;
4. rewrites the model's rotation (``x·cos + rotate_half(x)·sin``, the interleaved ``stack(-x2, x1)`` form, the
   ``chunk`` form) into posenc's own decomposed rotation over ``cos``/``sin [B, S, r/2]``, which ``posenc optimize``
   fuses per target (``RotaryEmbedding``), and the additive mask ``scores + where(allowed, 0, min)`` into posenc's
   ``Where(Not(allowed), -inf, scores)``, which the attention passes read;
5. checks that the rewritten graph computes what the traced one did at the probe positions (the angles differ by
   transformers' float32 rounding only); otherwise the traced graph is kept and the difference said.

Every positional part gets a :class:`~posenc.trace.record.TracePart`: replaced, kept (why) or absent.

The steps live beside it: :mod:`posenc.graphs.trace_region` (1), :mod:`posenc.graphs.trace_probe` (2, and the probe
runs of 5), :mod:`posenc.graphs.trace_splice` (3) and :mod:`posenc.graphs.trace_rules` (4: the rewrite rules).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import torch

from posenc.errors import ExportError
from posenc.export.trace import RewriteRequest
from posenc.graphs import fold
from posenc.graphs.trace_probe import _match, _probe_seq, _relative, probe_feed, run_graph
from posenc.graphs.trace_region import (
    TABLE_PART,
    Region,
    _guarded_ids,
    _other_positional,
    position_tables,
    positional_region,
)
from posenc.graphs.trace_rules import MASK_RULES, rotation_rules
from posenc.graphs.trace_splice import Replacement, _arranged, _Builder, splice_scheme
from posenc.schemes import get_spec, scheme_names
from posenc.schemes.base import Placement
from posenc.trace.arguments import padding_keys
from posenc.trace.module import scheme_cos_sin
from posenc.trace.record import ROTARY_PART, TracePart

ROTATION_PART = "rotation"
MASK_PART = "attention mask"
VERIFY_TOLERANCE = 1e-2
"""Largest change of an output (relative to its magnitude) the rewrite may make at probe positions below 4096, where
the traced float32 angles are within ~5e-4 rad of posenc's; a wrong rewrite moves outputs by O(1)."""


def _kept(detail: str) -> tuple[TracePart, ...]:
    return (TracePart(ROTARY_PART, "kept", detail),)


def _replace_angles(request: RewriteRequest, model: ir.Model, matched: list[tuple[ir.Value, Any]]) -> list[TracePart]:
    """Splice posenc's cos/sin in, give every matched frontier tensor its values, rewrite the rotations."""
    graph = model.graph
    exact = request.exact
    if exact is None:
        raise ExportError("no posenc scheme to replace the traced angles with.")
    cos3, sin3 = splice_scheme(graph, _guarded_ids(graph), exact)
    build = _Builder(graph, "posenc_angles/")
    half = int(scheme_cos_sin(exact, torch.zeros(1, 1, dtype=torch.int64))[0].shape[-1])
    replacements: dict[int, Replacement] = {}
    layouts = set()
    for value, (source, layout, axes) in matched:
        base = cos3 if source == "cos" else sin3
        new = _arranged(build, base, layout, half)
        extra = [i for i in range(axes.rank) if i not in (axes.batch, axes.seq, axes.rank - 1)]
        if extra:
            new = build.op("Unsqueeze", [new, build.ints(extra)])
        ir.convenience.replace_all_uses_with(value, new)
        replacements[id(new)] = Replacement(source, layout, base, axes)
        layouts.add(layout)
    fold.cleanup(model)
    rotations = rotation_rules(replacements).apply_to_model(model)
    fold.cleanup(model)
    traced = sum(1 for node in graph if node.op_type in ("Cos", "Sin") and not (node.name or "").startswith(
        "posenc_angles/"))  # fmt: skip
    angles = (
        f"{len(matched)} cos/sin tensors ({', '.join(sorted(layouts))} layout) now read posenc's {request.plan.scheme} "
        f"{exact.table_mode.value} tables (float64-exact), guarded; {traced} traced Cos/Sin left"
    )
    rotation = (
        f"{rotations} rotations rewritten to posenc's decomposed form (posenc optimize fuses it into RotaryEmbedding)"
        if rotations
        else "the model's rotation is not a form posenc rewrites; it stays decomposed as traced, on posenc's cos/sin"
    )
    return [TracePart(ROTARY_PART, "replaced", angles), TracePart(ROTATION_PART, "replaced" if rotations else "kept",
                                                                  rotation)]  # fmt: skip


def _rotates(request: RewriteRequest) -> bool:
    """Whether the layer's config names a scheme that rotates q and k."""
    return get_spec(request.plan.scheme).placement is Placement.QK if request.plan.scheme in scheme_names() else False


def replace_positions(request: RewriteRequest) -> tuple[Any, tuple[TracePart, ...]]:
    """The rewrite of a traced export (see the module docstring): ``(model proto, parts)``."""
    model = ir.serde.deserialize_model(request.model)
    graph = model.graph
    region = positional_region(graph, graph.inputs[[v.name for v in graph.inputs].index("position_ids")])
    others = _other_positional(graph, region)
    feed = probe_feed(request, _probe_seq(region.frontier))
    before = run_graph(model, feed)
    kept: list[TracePart] = []
    if others:
        detail = "; ".join(others) + ": computed as the model computes it (posenc has no table for it)"
        kept.append(TracePart("position-dependent values", "kept", detail))
    parts: list[TracePart] = []
    for node in position_tables(graph, region):
        table = node.inputs[0]
        shape = "[" + ", ".join(str(d) for d in table.shape.dims) + "]" if table and table.shape else "[?]"
        detail = (f"Gather of the model's table {table.name if table else '?'} {shape} by the guarded position ids: "
                  f"its own learned values, read as traced (posenc recomputes no learned table)")  # fmt: skip
        kept.append(TracePart(TABLE_PART, "kept", detail))
    if not region.cos_sin and others and _rotates(request):
        inside = ("the config's scheme rotates q and k, but the module computes its angles without Cos/Sin (a "
                  "sinusoid table it reads by position: CodeGen's embed_positions); they stay as traced, among the "
                  "position-dependent values")  # fmt: skip
        parts.append(TracePart(ROTARY_PART, "kept", inside))
    elif not region.cos_sin and not any(part.part == TABLE_PART for part in kept):
        absent = "the traced graph computes no cos/sin of the positions: the layer does not rotate q and k"
        parts.append(TracePart(ROTARY_PART, "absent", absent))
    elif not region.cos_sin:
        pass  # the positions enter through a table, not as angles
    elif request.exact is None:
        parts += _kept(request.plan.note or "posenc has no scheme for these angles")
    else:
        matched, why = _match(request, model, region)
        parts += _replace_angles(request, model, matched) if matched else _kept(why)
    masks = MASK_RULES.apply_to_model(model)
    fold.cleanup(model)
    if masks:
        mask = "the additive mask became posenc's boolean Where(-inf) (posenc optimize fuses it into Attention)"
        parts.append(TracePart(MASK_PART, "replaced", mask))
    elif request.plan.captured.mask.kind == "none" and padding_keys(request.plan.captured.call):
        mask = "the model passes its attention a padding mask [B, S] alone, hiding no token (see sequence padding)"
        parts.append(TracePart(MASK_PART, "absent", mask))
    elif request.plan.captured.mask.kind == "none":
        mask = "the model passes its attention no mask (every key visible, as its model runs it without padding)"
        parts.append(TracePart(MASK_PART, "absent", mask))
    else:
        mask = "the mask stays as traced (not the additive 0/min form posenc rewrites)"
        parts.append(TracePart(MASK_PART, "kept", mask))
    after = run_graph(model, feed)
    moved = max(_relative(after[k], before[k]) for k in before)
    if not moved <= VERIFY_TOLERANCE:
        why = f"posenc's rewrite moved the outputs by {moved:.2e} at probe positions, so the traced graph stays"
        return request.model, (*_kept(why), *kept)
    return ir.serde.serialize_model(model), (*parts, *kept)


__all__ = ["MASK_RULES", "Region", "positional_region", "replace_positions", "rotation_rules", "splice_scheme"]
