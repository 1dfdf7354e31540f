"""The manifest of an exported graph (:func:`export_manifest`): its inputs and outputs, the dims it serves, where its
weights and code came from, the library versions that shaped it.

:class:`PreparedExport` is an exported graph before it is written, the hand-off between tracing
(:func:`posenc.export.exporter.prepare_export`) and the writers (:func:`posenc.export.exporter.export_onnx`,
:mod:`posenc.export.layers`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import inspect
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posenc.artifacts.files import sha256_file
from posenc.dtypes import dtype_name
from posenc.export.external import LINKED_WEIGHTS_FORMAT
from posenc.export.kinds import UnitKind
from posenc.export.manifest import DimRange, Manifest, SourceRecord, TensorSpec, WeightsRecord
from posenc.export.shapes import SAMPLE_SHAPE
from posenc.export.units import ExportUnit
from posenc.provenance import WeightsSource
from posenc.records import to_json
from posenc.schemes.base import table_keys

_ONNX_ELEM_TYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64", 7: "int64", 6: "int32", 9: "bool"}


@dataclasses.dataclass
class PreparedExport:
    """An exported graph before it is written: the ``onnx.ModelProto`` (tensors inside), the unit it came from, the
    exporter's notes, the opset and where the weights came from (see :func:`posenc.export.exporter.prepare_export`)."""

    model: Any
    unit: ExportUnit
    notes: list[str]
    opset: int
    source: WeightsSource


def graph_specs(values: Any, layouts: Mapping[str, tuple[Any, str, str]], role_default: str) -> tuple[TensorSpec, ...]:
    """The manifest's :class:`TensorSpec` of graph inputs or outputs (``layouts``: name -> (shape, layout, role))."""
    specs = []
    for value in values:
        tensor_type = value.type.tensor_type
        shape = tuple(d.dim_param if d.dim_param else int(d.dim_value) for d in tensor_type.shape.dim)
        _, layout, role = layouts.get(value.name, (None, "", role_default))
        dtype = _ONNX_ELEM_TYPES.get(tensor_type.elem_type, "unknown")
        specs.append(TensorSpec(value.name, dtype, shape, layout, role))
    return tuple(specs)


def _served(unit: ExportUnit, table_limit: int | None) -> int | None:
    """New tokens a call may bring at most: the table's length, and an in-place cache's capacity."""
    if unit.kind is not UnitKind.BLOCK_INPLACE:
        return table_limit
    capacity = next(int(s.shape[2]) for s in unit.slots if s.name == "key_cache")
    return capacity if table_limit is None else min(capacity, table_limit)


def _dim_ranges(unit: ExportUnit, limit: int | None) -> dict[str, DimRange]:
    used = {d for slot in unit.slots for d in slot.shape if isinstance(d, str)}
    ranges = {
        "batch": DimRange(1, None, SAMPLE_SHAPE.batch),
        "seq": DimRange(1, limit, SAMPLE_SHAPE.seq),
        "past": DimRange(0, None if limit is None else limit - 1, SAMPLE_SHAPE.past),
        "kv_seq": DimRange(1, limit, SAMPLE_SHAPE.kv_seq),
    }
    return {name: r for name, r in ranges.items() if name in used}


def export_manifest(prepared: PreparedExport, onnx_sha: str, weights_path: Path, tmp_weights: Path) -> Manifest:
    """The manifest of a prepared graph whose bytes hash to ``onnx_sha``, its weights file written at
    ``tmp_weights`` (hashed) under the final name ``weights_path``."""
    model, unit, notes, opset, source = prepared.model, prepared.unit, prepared.notes, prepared.opset, prepared.source
    scheme = unit.scheme
    spec = scheme.spec
    layouts = unit.input_layouts()
    out_layouts = {name: (None, layout, "output") for name, layout in unit.outputs}
    graph_inputs = {v.name for v in model.graph.input}
    dropped = [name for name in unit.input_names if name not in graph_inputs]
    if dropped:
        notes = [*notes, f"inputs {dropped} are not read by {spec.name} and were removed from the graph"]
    return Manifest(
        scheme=spec.name,
        family=spec.family,
        placement=scheme.placement.value,
        params=to_json(dict(scheme.params)),
        unit=unit.kind.value,
        table_mode=scheme.table_mode.value,
        dtype=dtype_name(unit.dtype),
        table_dtype=dtype_name(scheme.table_dtype),
        opset=opset,
        attention=unit.config.to_dict(),
        max_positions=scheme.position_limit,
        build_max_positions=int(scheme.max_positions),
        dynamic_dims=_dim_ranges(unit, _served(unit, scheme.position_limit)),
        inputs=graph_specs(model.graph.input, layouts, "activation"),
        outputs=graph_specs(model.graph.output, out_layouts, "output"),
        onnx_sha256=onnx_sha,
        weights=WeightsRecord(
            path=weights_path.name,
            sha256=sha256_file(tmp_weights),
            format=LINKED_WEIGHTS_FORMAT,
            tables=tuple(sorted(table_keys(unit.inner))),
            source=source,
        ),
        source=source_info(unit.inner),
        versions=library_versions(),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        notes=tuple(notes),
        position_guard=bool(scheme.guard_exported),
        cache_ring=bool(getattr(unit.module, "ring", False)),
    )


def source_info(inner: nn.Module) -> SourceRecord:
    import posenc

    root = Path(posenc.__file__).parent
    classes = {type(m) for m in inner.modules()}
    files = {*(root / "functional").glob("*.py"), *(root / "blocks").glob("*.py"), root / "schemes" / "base.py"}
    for cls in classes:
        with contextlib.suppress(TypeError, OSError):
            source = Path(inspect.getsourcefile(cls) or "")
            if root in source.parents:
                files.add(source)
    digest = hashlib.sha256()
    names = []
    for file in sorted(files):
        if file.exists():
            names.append(str(file.relative_to(root)))
            digest.update(file.read_bytes())
    cls = type(inner)
    return SourceRecord(f"{cls.__module__}.{cls.__qualname__}", digest.hexdigest(), tuple(names))


def library_versions() -> dict[str, str]:
    """Versions of the libraries that shape an exported graph (absent ones are left out)."""
    import importlib.metadata

    import posenc

    versions = {"posenc": posenc.__version__, "python": platform.python_version(), "torch": torch.__version__}
    for package in ("onnx", "onnxruntime", "onnxscript", "onnx-ir", "polygraphy"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return versions


__all__ = ["PreparedExport", "export_manifest", "graph_specs", "library_versions", "source_info"]
