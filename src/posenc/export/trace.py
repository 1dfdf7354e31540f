"""The traced export: a checkpoint's own attention layer to ONNX, with the interface of a family export.

The path of one traced export::

    checkpoint folder -> capture how the model calls layer N's attention (posenc.trace.capture)
      -> TracedAttention (the model's module, its rotary module, its mask; the position guard)
      -> torch.export + torch.onnx.export(dynamo=True), opset 23, onnxscript's optimizer without its fusions
      -> the caller's ``rewrite`` (posenc.graphs.trace_rewrite.replace_positions: posenc's tables for the traced
         angles, or the reason they stay)
      -> model.onnx + model.weights.safetensors + model.manifest.json (with its ``trace`` record), atomically

The graph's inputs and outputs are a ``block`` export's: ``hidden [B, S, E]``, ``position_ids [B, S]``,
``past_key`` / ``past_value [B, Hkv, P, D]`` -> ``out [B, S, E]``, ``present_key`` / ``present_value
[B, Hkv, P + S, D]``, so ``validate`` (and ``--against-hf``, ``--decode``), ``optimize``, ``inspect`` and ``bench``
take it unchanged. An attention its model calls without a KV cache (an encoder's) exports as the same unit fed no
past: ``hidden``, ``position_ids`` -> ``out`` (the manifest's dims have no ``past``; validation feeds no cache and
``--decode`` is refused). The graph stage sits above this one, so ``posenc export --via trace`` passes the rewrite in
(``rewrite=None`` keeps the traced angles and says so in the manifest).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc.artifacts.files import atomic_outputs, manifest_path_for, weights_path_for
from posenc.artifacts.paths import output_path, sha256_file
from posenc.errors import ConfigError, ExportError
from posenc.export.checks import ONNX_FILE_LIMIT
from posenc.export.describe import graph_specs, library_versions, source_info
from posenc.export.exporter import ExportResult
from posenc.export.external import LINKED_WEIGHTS_FORMAT, write_linked
from posenc.export.feeds import SOURCE, Slot, dim_size
from posenc.export.manifest import DimRange, Manifest, WeightsRecord
from posenc.export.shapes import SAMPLE_SHAPE
from posenc.export.torch_onnx import DEFAULT_OPSET, quiet_exporter, to_onnx_model
from posenc.export.trace_bounds import (
    bounded_export,
    deferrable,
    deferred_export,
    deferred_note,
    slot_shapes,
)
from posenc.export.trace_unit import traced_unit
from posenc.export.units import ExportUnit
from posenc.records import to_json
from posenc.schemes import get_spec
from posenc.schemes.base import PositionalScheme, TableMode, table_keys
from posenc.trace.arguments import padding_block
from posenc.trace.build import NOPE, TracePlan, plan_trace, relative_parts, trace_record, traced_module
from posenc.trace.capture import capture_layer
from posenc.trace.derived import derived_parts
from posenc.trace.inputs import EVERY_KEY
from posenc.trace.orders import order_parts
from posenc.trace.record import ROTARY_PART, TracePart, angles_replaced, tower_note
from posenc.trace.stacks import bias_parts, outside_parts
from posenc.trace.stems import stem_parts
from posenc.trace.windows import chunk_window

TRACE_OPSET = DEFAULT_OPSET
"""Traced graphs are exported at opset 23 (the standard RotaryEmbedding and Attention ops the passes fuse into)."""


@dataclasses.dataclass
class RewriteRequest:
    """What the graph rewrite of a traced export is given.

    Attributes:
        model: the traced ``onnx.ModelProto``.
        plan: the traced layer (geometry, scheme, the layout of its cos/sin).
        exact: posenc's scheme whose cos/sin replace the traced ones (float32 tables, the export's table mode and
            rows), or None when the layer's angles are not posenc's (``plan.note`` says why).
        position_limit: the bound the graph's position guard checks (None: any position >= 0).
    """

    model: Any
    plan: TracePlan
    exact: PositionalScheme | None
    position_limit: int | None


Rewrite = Callable[[RewriteRequest], tuple[Any, tuple[TracePart, ...]]]
"""``rewrite(request) -> (model proto, parts)``: posenc's is :func:`posenc.graphs.trace_rewrite.replace_positions`."""


def _optimize_without_fusions(model: Any) -> Any:
    """onnxscript's optimizer (constant folding, dead code, common subexpressions) without its opset-23 fusions, so
    the graph keeps the model's own rotation and attention for posenc's passes to read."""
    import onnx_ir as ir
    from onnxscript import optimizer

    graph = ir.serde.deserialize_model(model)
    optimizer.optimize_ir(graph)
    return ir.serde.serialize_model(graph)


def _check_options(dtype: str, kv_cache: str, opset: int | None) -> None:
    if dtype not in ("fp32", "float32"):
        raise ExportError(
            f"the traced path exports float32 graphs only (got {dtype}); export with --dtype fp32, or --via family "
            f"where the model type has a family."
        )
    if kv_cache != "concat":
        raise ExportError(
            "the traced path exports the concatenated cache only; drop --kv-cache inplace (or use --via family)."
        )
    if opset not in (None, TRACE_OPSET):
        raise ExportError(f"the traced path exports opset {TRACE_OPSET} graphs; drop --opset {opset}.")


def _guard_limit(plan: TracePlan, exact: PositionalScheme | None) -> int | None:
    """The positions the graph serves: posenc's table's, a learned table's rows, else any position >= 0; at most a
    DSA layer's ``index_topk`` or a reference sliding window's ``W`` (:func:`_served_limit`)."""
    if exact is not None:
        limit = exact.position_limit
    else:
        limit = plan.config.max_position_embeddings if plan.captured.embedding is not None else None
    topk = _served_limit(plan)
    return limit if topk is None else topk if limit is None else min(limit, topk)


WINDOW_PART = "reference sliding window"
"""The positional part of a cache that keeps the prompt's keys apart from a sliding window of decoded ones
(:data:`posenc.trace.caches.REFERENCE_WINDOWS`)."""


def _window_limit(plan: TracePlan) -> int | None:
    """A reference sliding-window layer's window ``W`` (its config field), else None: below ``W`` positions no key
    leaves its cache and every key is visible, so the graph (a plain concatenated cache) serves those.

    Raises:
        ExportError: the config gives no window.
    """
    field = plan.captured.window_field
    if field is None:
        return None
    window = getattr(plan.captured.hf, field, None)
    if not (isinstance(window, int) and not isinstance(window, bool) and window > 0):
        raise ExportError(
            f"the layer's cache keeps the prompt's keys apart from a sliding window, but its config gives no {field} "
            f"(got {window!r}); posenc cannot bound the positions where that cache is a plain one, so it does not "
            f"export it."
        )
    return int(window)


def _served_limit(plan: TracePlan) -> int | None:
    """The bound a cache's selection sets on the positions the graph serves (a DSA layer's ``index_topk``, a
    reference sliding window's ``W``), else None."""
    bounds = [bound for bound in (_selection_limit(plan), _window_limit(plan)) if bound is not None]
    return min(bounds) if bounds else None


SELECTION_PART = "sparse top-k selection"
"""The positional part of a DSA layer: its lightning indexer keeps the ``index_topk`` keys of highest score."""


def _selection_limit(plan: TracePlan) -> int | None:
    """A DSA layer's ``index_topk`` (its cache holds indexer keys), else None. Its index scores tie exactly (a sum of
    ReLUs: keys every head scores at or below 0 tie at 0), and ONNX Runtime's TopK and PyTorch's topk break ties
    differently (on DeepSeek-V3.2's tiny layer with index_topk 3, 0.17 apart on two of six seeded feeds), so the
    graph serves positions below ``index_topk``: every cached key is then kept, whatever the order of ties. A layer
    handed an earlier layer's selection is served below that selection's ``k`` (the unit passes every key's index,
    which is the selection only there); a config without it is refused."""
    field = "index_topk" if plan.captured.indexer_dim is not None else _shared_selection(plan)
    if field is None:
        return None
    topk = getattr(plan.captured.hf, field, None)
    if isinstance(topk, int) and not isinstance(topk, bool) and topk > 0:
        return int(topk)
    if plan.captured.indexer_dim is None:
        raise ExportError(
            f"the layer reuses an earlier layer's top-k selection, but its config gives no {field} (got {topk!r}); "
            f"posenc cannot bound the positions where that selection is every key, so it does not export it."
        )
    return None


def _shared_selection(plan: TracePlan) -> str | None:
    """The config field bounding the top-k selection an earlier layer made and this layer reuses (an ``every_key``
    argument, :data:`posenc.trace.inputs.EVERY_KEY`), else None."""
    call = plan.captured.call
    if "every_key" in call.positional:  # no model passes one so; its bound is looked up by keyword
        raise ExportError("the attention takes a reused top-k selection positionally; posenc reads it by keyword.")
    keys = [key for key, kind in call.keywords.items() if kind == "every_key"]
    return EVERY_KEY.get(keys[0]) if keys else None


PADDING_PART = "sequence padding"


def _padding_parts(plan: TracePlan) -> tuple[TracePart, ...]:
    """The unit pads the sequence as the model does before its layers, to whole blocks
    (:data:`posenc.trace.inputs.PADDED_BLOCKS`: PEGASUS-X) or to its attention window (:mod:`posenc.trace.windows`:
    Longformer, LED's encoder): said in the manifest."""
    block = padding_block(plan.captured.call)
    window = chunk_window(plan.captured.attention) if plan.captured.cacheless else None
    if block is not None:
        detail = (f"the model's stack pads the sequence to whole blocks of {block} before its layers; the unit pads "
                  f"its input the same way, hides the padding in the attention's padding mask and drops the padded "
                  f"rows of its output")  # fmt: skip
    elif window is not None:
        detail = (f"the model pads the sequence to a multiple of its attention window ({window}) before its layers; "
                  f"the unit pads its input by more than one window to a multiple of it, marks the padding in the "
                  f"attention's masks and drops the padded rows of its output")  # fmt: skip
    else:
        return ()
    return (TracePart(PADDING_PART, "kept", detail),)


def _selection_parts(plan: TracePlan) -> tuple[TracePart, ...]:
    window = _window_limit(plan)
    if window is not None:
        detail = (f"the cache keeps the prompt's keys and slides a window of {window} over the decoded ones (every "
                  f"prompt key stays visible); below {window} positions no key leaves it and every key is visible, so "
                  f"the graph carries one concatenated cache and serves positions below {window} "
                  f"(guarded)")  # fmt: skip
        return (TracePart(WINDOW_PART, "kept", detail),)
    topk = _selection_limit(plan)
    if topk is None:
        return ()
    if plan.captured.indexer_dim is None:  # a shared layer: the selection is an earlier layer's
        detail = (f"this layer reuses the keys an earlier layer's lightning indexer kept (its top {topk}); below "
                  f"{topk} keys that is every key, so the unit passes every key's index, and the graph serves "
                  f"positions below {topk} (guarded)")  # fmt: skip
    else:
        detail = (f"the lightning indexer keeps the {topk} keys of highest index score; scores tie exactly and ONNX "
                  f"Runtime and PyTorch break ties differently, so the graph serves positions below {topk} "
                  f"(guarded), where it keeps every key")  # fmt: skip
    return (TracePart(SELECTION_PART, "kept", detail),)


def export_traced(
    path: str | os.PathLike[str],
    checkpoint: Any,
    *,
    layer: int | None = None,
    layer_type: str | None = None,
    table_mode: TableMode | str | None = None,
    max_positions: int | None = None,
    dtype: str = "fp32",
    kv_cache: str = "concat",
    opset: int | None = None,
    position_guard: bool = True,
    rewrite: Rewrite | None = None,
) -> ExportResult:
    """Export layer ``layer`` of a checkpoint as its model runs it (see the module docstring).

    Args:
        path: the ONNX file; manifest and weights go beside it.
        checkpoint: a checkpoint folder or an in-memory transformers model.
        layer, layer_type: the layer (default: the first of ``layer_type``, else the first with attention).
        table_mode, max_positions: posenc's tables that replace the traced angles (default: precomputed, the context
            length's rows).
        dtype, kv_cache, opset: fp32, concat and 23 only (the traced path's scope).
        position_guard: guard the positions (an invalid one raises in ONNX Runtime, gives NaN in TensorRT).
        rewrite: the graph pass that puts posenc's tables in (``None``: keep the traced angles; the manifest says so).

    Raises:
        ConfigError: the checkpoint, layer or options are unusable (the message says what to change).
        ExportError: the model's attention cannot be traced or exported (the message names the reason).
    """
    _check_options(dtype, kv_cache, opset)
    if not isinstance(position_guard, bool):
        raise ConfigError(f"position_guard must be True or False, got {position_guard!r}.")
    path = output_path(path, "ONNX model")
    plan = plan_trace(capture_layer(checkpoint, layer, layer_type))
    topk = _served_limit(plan)
    if topk is not None and plan.angles is not None:  # posenc's tables serve what the graph serves
        if max_positions is not None and max_positions > topk:
            window = _window_limit(plan) is not None
            why = f"{WINDOW_PART}: keys leave the cache" if window else f"{SELECTION_PART}: ties break differently"
            raise ConfigError(
                f"--max-positions {max_positions} is beyond this layer's cache bound {topk}: the graph serves "
                f"positions below {topk} only ({why} beyond); drop it."
            )
        max_positions = min(topk, plan.config.max_position_embeddings) if max_positions is None else max_positions
    exact = None
    if plan.angles is not None:
        mode = table_mode if table_mode is not None else None
        exact = plan.exact_scheme(mode, max_positions)
    elif table_mode is not None or max_positions is not None:
        raise ConfigError(
            f"--table-mode and --max-positions choose posenc's tables, but this layer's angles stay traced "
            f"({plan.note}); drop them."
        )
    limit = _guard_limit(plan, exact)
    module = traced_module(plan, angles="native", position_limit=limit)
    module.guard_exported = position_guard
    unit = traced_unit(module, plan.config, plan.captured)
    sample = unit.sample_inputs(SAMPLE_SHAPE, position_limit=limit)

    def export(dims: Mapping[str, Any], deferred: bool = False) -> tuple[Any, list[str]]:
        return to_onnx_model(
            module,
            sample,
            input_names=unit.input_names,
            output_names=unit.output_names,
            dynamic_shapes=slot_shapes(unit.slots, dims),
            dim_names=unit.dynamic_shapes(names=True),
            opset=TRACE_OPSET,
            optimize=False,
            deferred_guards=deferred,
        )

    ranges = _dim_ranges(limit, plan.captured.cacheless, unit.slots)
    served = limit if limit is not None else plan.config.max_position_embeddings  # the model's context, unguarded
    name = type(plan.captured.attention).__name__
    try:
        (model, notes), ranges, bounds = bounded_export(export, ranges, served, name)
    except ExportError as exc:
        if not deferrable(plan, exc):
            raise
        # the deferred export may still bound the lengths (Nemotron ASR's encodings refuse more frames than its
        # max_position_embeddings): the same narrowing as the first export's; where torch.export's solver fails on
        # the named lengths (LongT5's padding to blocks), unnamed dynamic lengths (deferred_export)
        try:
            (model, notes), ranges, bounds = bounded_export(
                lambda dims: export(dims, deferred=True), ranges, served, name
            )
        except ExportError:
            dynamic = dict(zip(unit.input_names, unit.dynamic_shapes(names=True), strict=True))
            try:
                (model, notes), bounds = deferred_export(export, ranges, dynamic), []
            except ExportError:  # the retries fail too (Funnel's list(range(seq_len))): the first refusal says why
                raise exc from None
        bounds = [*bounds, deferred_note(exc)]
    notes = [*notes, *bounds]
    with quiet_exporter():
        model = _optimize_without_fusions(model)
    if rewrite is None:
        parts: tuple[TracePart, ...] = _unrewritten(plan)
    else:
        model, parts = rewrite(RewriteRequest(model, plan, exact, limit))
    captured = plan.captured
    derived = derived_parts({key: found.recipe for key, found in captured.derived.items()})
    parts = (
        *parts,
        *bias_parts(captured.attention),
        *outside_parts(captured.outside, captured.model_type),
        *derived,
        *relative_parts(captured),
        *order_parts(captured.order),
        *stem_parts(captured.stem_ref),
        *_selection_parts(plan),
        *_padding_parts(plan),
    )
    replaced = angles_replaced(parts)
    weights_module = traced_module(plan, angles="exact", table_mode=table_mode, max_positions=max_positions,
                                   position_limit=limit) if replaced else module  # fmt: skip
    return _write(Path(path), model, unit, weights_module, plan, exact if replaced else None, parts, notes,
                  limit, position_guard, ranges)  # fmt: skip


def _unrewritten(plan: TracePlan) -> tuple[TracePart, ...]:
    if plan.captured.rotary is None:
        return ()
    return (TracePart(ROTARY_PART, "kept", "exported without posenc's graph rewrite (rewrite=None)"),)


def _scheme_of(plan: TracePlan, parts: tuple[TracePart, ...]) -> str:
    """The manifest's scheme: the plan's, or ``nope`` when the traced graph holds no positional part."""
    rotary = [part for part in parts if part.part == ROTARY_PART]
    if rotary and all(part.status == "absent" for part in rotary) and plan.captured.embedding is None:
        return NOPE
    return plan.scheme


def _write(
    path: Path,
    model: Any,
    unit: ExportUnit,
    weights_module: torch.nn.Module,
    plan: TracePlan,
    exact: PositionalScheme | None,
    parts: tuple[TracePart, ...],
    notes: list[str],
    limit: int | None,
    guard: bool,
    ranges: dict[str, DimRange],
) -> ExportResult:
    manifest_path, weights_path = manifest_path_for(path), weights_path_for(path)
    scheme = _scheme_of(plan, parts)
    spec = get_spec(scheme)
    record = trace_record(plan, parts)
    rows = int(exact.max_positions) if exact is not None else plan.config.max_position_embeddings
    where = tower_note(plan.captured.model_type, plan.captured.tower)
    notes = [*notes, f"traced from {plan.captured.attention_ref.cls} (layer {plan.captured.layer}{where})"]
    notes += [f"positional part {line}" for line in record.summary()]
    with atomic_outputs(path, weights_path, manifest_path) as (tmp_model, tmp_weights, tmp_manifest):
        # every tensor once: in the weights file, which the graph reads as its external data
        write_linked(model, weights_module.state_dict(), tmp_weights, weights_path.name)
        data = model.SerializeToString()
        if len(data) > ONNX_FILE_LIMIT:
            raise ExportError("the traced graph is over ONNX's 2 GiB single-file limit; export a smaller layer.")
        tmp_model.write_bytes(data)
        manifest = Manifest(
            scheme=scheme,
            family=spec.family,
            placement=spec.placement.value,
            params=to_json(dict(plan.params)) if scheme != NOPE else {},
            unit="block",
            table_mode=_table_mode(plan, exact),
            dtype="float32",
            table_dtype="float32",
            opset=TRACE_OPSET,
            attention=plan.config.to_dict(),
            max_positions=limit,
            build_max_positions=rows,
            dynamic_dims=ranges,
            inputs=graph_specs(model.graph.input, unit.input_layouts(), "activation"),
            outputs=graph_specs(model.graph.output, {n: (None, lay, "output") for n, lay in unit.outputs}, "output"),
            onnx_sha256=hashlib.sha256(data).hexdigest(),
            weights=WeightsRecord(
                path=weights_path.name,
                sha256=sha256_file(tmp_weights),
                format=LINKED_WEIGHTS_FORMAT,
                tables=tuple(sorted(table_keys(weights_module))),
                source=plan.captured.provenance(),
            ),
            source=source_info(weights_module),
            versions=library_versions(),
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            notes=tuple(notes),
            position_guard=guard,
            trace=record,
        )
        manifest.save(tmp_manifest)
    return ExportResult(path, manifest, manifest_path, weights_path)


def _table_mode(plan: TracePlan, exact: PositionalScheme | None) -> str:
    """posenc's tables' mode; a learned table's ``precomputed``; angles kept as traced are computed in the graph."""
    if exact is not None:
        return exact.table_mode.value
    mode = TableMode.PRECOMPUTED if plan.captured.embedding is not None else TableMode.DYNAMIC
    return mode.value


def _dim_ranges(limit: int | None, cacheless: bool, slots: Sequence[Slot] = ()) -> dict[str, DimRange]:
    dims = {
        "batch": DimRange(1, None, SAMPLE_SHAPE.batch),
        "seq": DimRange(1, limit, SAMPLE_SHAPE.seq),
        "past": DimRange(0, None if limit is None else limit - 1, SAMPLE_SHAPE.past),
    }
    if cacheless:
        del dims["past"]
    if any(SOURCE in slot.shape for slot in slots):  # a stream of its own length (an encoder's states)
        dims[SOURCE] = DimRange(1, None, dim_size(SOURCE, SAMPLE_SHAPE))
    return dims


__all__ = ["TRACE_OPSET", "Rewrite", "RewriteRequest", "export_traced"]
