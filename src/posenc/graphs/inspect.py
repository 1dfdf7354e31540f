"""``posenc inspect``: what is in an ONNX file and whether TensorRT can take it.

Reports the op histogram, initializer bytes (total and the largest tables), the fused ops present
(RotaryEmbedding, Attention, GroupQueryAttention, posenc plugin nodes), the passes recorded in the manifest (with
the reason of each one that could not run on the graph), for a traced export which positional parts posenc replaced
with its tables and which it kept (and why), and the result of
parsing with TensorRT (``tensorrt`` or ``tensorrt_rtx``; a failure names the node and op). The parse is the
caller's ``tensorrt_check`` (``posenc inspect`` passes :func:`posenc.engine.check_parse`): this layer sits below
``posenc.engine`` and does not import it.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import onnx_ir as ir

from posenc.graphs import model_io
from posenc.graphs.manifests import read_manifest
from posenc.records import to_json
from posenc.trace.record import TraceRecord

FUSED_OPS = ("RotaryEmbedding", "Attention", "GroupQueryAttention")


class TensorRTParse(Protocol):
    """What a TensorRT parse reports (:class:`posenc.engine.ParseReport`)."""

    backend: str | None
    parsed: bool | None
    message: str
    layers: dict[str, int]
    inlined_plugin_layers: int
    inlined_reason: str


TensorRTCheck = Callable[[Path], TensorRTParse]
"""``check(path) -> report``: parse the file with TensorRT, never raising (:func:`posenc.engine.check_parse`)."""
ProfileText = Callable[[Any], str]
"""``describe(manifest) -> text``: the optimization profiles ``posenc build`` would use for the graph
(:func:`posenc.engine.engine_profiles`, composed by the CLI)."""


@dataclasses.dataclass(frozen=True)
class Initializer:
    """One stored tensor of the graph."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int


@dataclasses.dataclass
class InspectReport:
    """Everything ``posenc inspect`` prints (``to_dict`` for ``--json``)."""

    path: str
    opset: int
    ops: dict[str, int]
    nodes: int
    initializer_bytes: int
    largest_initializers: list[Initializer]
    fused_ops: dict[str, int]
    fusions: dict[str, int] | None
    target: str | None
    declined: tuple[str, ...]
    """Why the recorded passes left constructs decomposed (the manifest's ``optimized`` record)."""
    tensorrt: TensorRTParse | None
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    """Passes of the optimization that could not run on this graph, and why (e.g. a fused op that cannot express
    the scheme)."""
    engine_profiles: str | None = None
    """The optimization profiles a ``posenc build`` of this graph uses (min:opt:max per dimension)."""
    traced: str | None = None
    """For a traced export (``posenc export --via trace``): the layer it traced, else None."""
    positional_parts: tuple[str, ...] = ()
    """For a traced export: each positional part, replaced by posenc's tables, kept as traced (and why) or absent."""
    table_bytes: int = 0
    """Bytes of position tables the graph stores (its manifest's ``weights.tables``; external data counted once)."""
    weight_bytes: int = 0
    """Bytes of every other stored tensor (external data counted once)."""
    warnings: tuple[str, ...] = ()
    """What to change (tables outweighing the weights)."""

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)

    def to_text(self) -> str:
        lines = [f"{self.path}: {self.nodes} nodes, opset {self.opset}"]
        lines.append("ops: " + ", ".join(f"{op} {n}" for op, n in self.ops.items()))
        lines.append(f"initializers: {_human(self.initializer_bytes)}")
        for item in self.largest_initializers:
            lines.append(f"  {item.name} {item.dtype}{list(item.shape)}: {_human(item.bytes)}")
        lines.append(
            f"stored: position tables {_human(self.table_bytes)}, weights {_human(self.weight_bytes)} (each external "
            f"tensor counted once)"
        )
        lines.extend(f"warning: {warning}" for warning in self.warnings)
        lines.append("fused ops: " + (", ".join(f"{op} {n}" for op, n in self.fused_ops.items()) or "none"))
        if self.traced is not None:
            lines.append(f"traced: {self.traced}")
            lines.extend(f"  {part}" for part in self.positional_parts)
        if self.fusions is None:
            lines.append("fusions applied: unknown (no `posenc optimize` record in the manifest)")
        else:
            applied = ", ".join(f"{name} {n}" for name, n in self.fusions.items() if n) or "none"
            lines.append(f"fusions applied (target {self.target}): {applied}")
            for name, reason in self.skipped.items():
                lines.append(f"  not applied: {name}: {reason}")
        lines.extend(f"left decomposed: {reason}" for reason in self.declined)
        if self.engine_profiles:
            lines.append(f"engine profiles (posenc build, min:opt:max): {self.engine_profiles}")
        if self.tensorrt is not None:
            trt = self.tensorrt
            if trt.parsed is None:
                lines.append(f"TensorRT: {trt.message}")
            elif trt.parsed and trt.inlined_plugin_layers:
                lines.append(
                    f"TensorRT ({trt.backend}): parses, with the posenc plugin inlined as its ONNX function "
                    f"({trt.inlined_plugin_layers} layers): {trt.inlined_reason}"
                )
                lines.append("  layers: " + ", ".join(f"{k} {v}" for k, v in trt.layers.items()))
            elif trt.parsed:
                layers = ", ".join(f"{k} {v}" for k, v in trt.layers.items())
                lines.append(f"TensorRT ({trt.backend}): parses ({layers})")
            else:
                lines.append(f"TensorRT ({trt.backend}): does NOT parse: {trt.message}")
        return "\n".join(lines)


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def _op_name(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def _traced_line(trace: TraceRecord) -> str:
    """``model_type layer N (attention class)``, and ``called without a KV cache`` for an encoder's attention."""
    line = f"{trace.model_type} layer {trace.layer} ({trace.attention.cls})"
    return line + (", called without a KV cache (no past)" if trace.cacheless else "")


def inspect_model(
    path: str | os.PathLike[str],
    *,
    tensorrt_check: TensorRTCheck | None = None,
    top: int = 5,
    profile_text: ProfileText | None = None,
) -> InspectReport:
    """Inspect an ONNX file (and its manifest); ``tensorrt_check`` (e.g. :func:`posenc.engine.check_parse`)
    parses it with TensorRT, ``profile_text`` describes the engine profiles a build would use; ``None`` leaves
    either out.

    Raises:
        ModelFileError: the file is missing or not ONNX.
    """
    path = Path(path)
    model = model_io.load_model(path)
    ops = collections.Counter(_op_name(node) for node in model.graph.all_nodes())
    tables = []
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is None:
            continue
        shape = tuple(int(d) for d in tensor.shape.numpy())
        tables.append(Initializer(value.name or "", tensor.dtype.name.lower(), shape, int(tensor.nbytes)))
    tables.sort(key=lambda item: -item.bytes)
    manifest = read_manifest(path)
    table_bytes, weight_bytes = _stored_bytes(model, manifest)
    record = None if manifest is None else manifest.optimized
    fusions = record.counts if record else None
    fused = {op: n for op, n in ops.items() if op.split("::")[-1] in FUSED_OPS or ("::" in op and "posenc" in op)}
    tensorrt = tensorrt_check(path) if tensorrt_check is not None else None
    trace = getattr(manifest, "trace", None)
    return InspectReport(
        path=str(path),
        opset=model_io.default_opset(model),
        ops=dict(ops.most_common()),
        nodes=sum(ops.values()),
        initializer_bytes=sum(item.bytes for item in tables),
        largest_initializers=tables[:top],
        fused_ops=dict(sorted(fused.items())),
        fusions=fusions,
        target=record.target if record else None,
        declined=tuple(reason for item in (record.passes if record else ()) for reason in item.declined),
        tensorrt=tensorrt,
        skipped={p.name: p.skipped for p in record.passes if p.skipped} if record else {},
        engine_profiles=profile_text(manifest) if profile_text is not None else None,
        traced=None if trace is None else _traced_line(trace),
        positional_parts=() if trace is None else tuple(trace.summary()),
        table_bytes=table_bytes,
        weight_bytes=weight_bytes,
        warnings=_table_warning(manifest, table_bytes, weight_bytes),
    )


def _stored_bytes(model: ir.Model, manifest: Any) -> tuple[int, int]:
    """``(position table bytes, other tensor bytes)`` of the graph's initializers: each external region (file,
    offset) counted once, whichever initializers read it; a table is an initializer named after a key of the
    manifest's ``weights.tables`` (the export's name, a shared tables file's ``kind.key``, a pass's key + suffix)."""
    keys = tuple(getattr(getattr(manifest, "weights", None), "tables", ()) or ())
    seen: set[Any] = set()
    tables = weights = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is None:
            continue
        location = getattr(tensor, "location", None)
        region = (location, getattr(tensor, "offset", None)) if location is not None else id(tensor)
        if region in seen:
            continue
        seen.add(region)
        name = value.name or ""
        if any(key in name for key in keys):
            tables += int(tensor.nbytes)
        else:
            weights += int(tensor.nbytes)
    return tables, weights


def _table_warning(manifest: Any, tables: int, weights: int) -> tuple[str, ...]:
    if tables <= weights or getattr(manifest, "table_mode", None) != "precomputed":
        return ()
    return (
        f"the position tables ({_human(tables)}) outweigh the weights ({_human(weights)}); export with "
        f"--table-mode dynamic to compute them in the graph from the position ids instead (the same float64-exact "
        f"angles, the same accuracy: posenc validate holds both modes to one tolerance), or fewer --max-positions",
    )
