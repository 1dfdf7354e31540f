"""Every layer of a checkpoint in one command: one artifact per layer, one shared tables file, weights stored once.

``posenc export --hf-model DIR --layers all -o OUT`` writes into the folder ``OUT``::

    layers.json                     the index (LayersIndex): checkpoint, each layer's files and kind, skipped layers
    layer{N}.onnx                   layer N's graph: its weights and tables are ONNX external data, no copy inside
    layer{N}.weights.safetensors    layer N's weights (its state_dict without the position tables), as the graph
                                    stores them (``q_proj.weight.T``), also the eager rebuild's state
    layer{N}.manifest.json          its manifest: layer and kind (weights.source), weights.tables_file -> the tables
    tables.safetensors              each distinct position table once (``cos_table``; a second content of the same
                                    key, e.g. Gemma 3's full-attention layers, ``full_attention.cos_table``)

ONNX external data names a file per tensor, so one graph reads its weights from its own file and its tables from
the shared one. Each layer keeps a weights file of its own, rather than all layers in one file, so that the folder
is written one layer at a time (a safetensors header lists every tensor before the data: one file would hold every
layer in memory, or be written twice), each layer's manifest hashes only its own weights, and a layer artifact
(``layer3.onnx`` + its two files) reads, optimizes and validates like a single export. Peak memory follows one
layer: its tensors are read (:func:`posenc.checkpoints.load_layer` reads only that layer's), exported, written and
dropped; the graphs are kept without tensor data, and the distinct tables until the end, when their offsets in the
tables file are known and the graphs are written.

Every file lands through one :func:`posenc.artifacts.files.atomic_outputs`: a failure at any layer leaves the folder as
it was (a folder the export created is removed again), a killed export is finished or dropped by the next reader.
The folder must hold nothing but what this export writes (files of another export would mix with these).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any, ClassVar

import torch

from posenc.artifacts.files import STAGING_MARK, atomic_outputs, json_text, manifest_path_for, weights_path_for
from posenc.artifacts.paths import output_path, sha256_file
from posenc.errors import ConfigError
from posenc.export.describe import export_manifest
from posenc.export.exporter import ExportOptions, prepare_export
from posenc.export.external import _point, match_initializers, rename_values, safetensors_offsets, write_linked
from posenc.export.kinds import UnitKind
from posenc.export.manifest import FileRecord, Manifest
from posenc.records import Document
from posenc.schemes.base import TableMode, table_keys

INDEX_NAME = "layers.json"
TABLES_NAME = "tables.safetensors"
LAYERS_FORMAT = "posenc.layers/1"


@dataclasses.dataclass(frozen=True)
class LayerArtifact:
    """One exported layer: its index in its stack, its kind (stack or layer type, None for one kind), its ONNX file."""

    layer: int
    layer_type: str | None
    onnx: str


@dataclasses.dataclass(frozen=True)
class SkippedLayer:
    """A layer ``--layers all`` left out (not softmax attention) and why."""

    layer: int
    layer_type: str | None
    reason: str


@dataclasses.dataclass(frozen=True)
class LayersIndex(Document):
    """``layers.json``: what a ``posenc export --layers`` folder holds."""

    FORMAT: ClassVar[str] = LAYERS_FORMAT
    REMEDY: ClassVar[str] = "export the layers again (`posenc export --hf-model DIR --layers all -o OUT`)"

    checkpoint: str
    model_type: str
    layers: tuple[LayerArtifact, ...]
    tables: FileRecord
    skipped: tuple[SkippedLayer, ...] = ()
    format: str = LAYERS_FORMAT


@dataclasses.dataclass(frozen=True)
class LayersResult:
    """What :func:`export_layers` wrote: the folder, its index and each layer's manifest (in index order)."""

    folder: Path
    index: LayersIndex
    manifests: tuple[Manifest, ...]


def _planned_files(folder: Path, names: list[str]) -> list[Path]:
    """The files of the folder, in landing order: the index first (it lands last), each layer's graph, weights and
    manifest, the tables file."""
    files = [folder / INDEX_NAME]
    for name in names:
        onnx = folder / f"{name}.onnx"
        files += [onnx, weights_path_for(onnx), manifest_path_for(onnx)]
    return [*files, folder / TABLES_NAME]


def _check_folder(folder: Path, files: list[Path]) -> None:
    """Refuse a folder holding files this export does not write (another export's layers or graphs would mix)."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ConfigError(f"--layers writes a folder; {folder} is a file. Choose a new or empty folder.")
    ours = {file.name for file in files}
    others = sorted(n for n in os.listdir(folder) if n not in ours and not (n.startswith(".") and STAGING_MARK in n))
    if others:
        raise ConfigError(
            f"{folder} holds files this export would not replace ({', '.join(others[:4])}"
            f"{', ...' if len(others) > 4 else ''}); they would mix with the new layers. Choose a new or empty folder."
        )


class _SharedTables:
    """The distinct position tables of the layers, each once, named by key (a second content of a key: kind + key)."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._by_content: dict[tuple[str, tuple[int, ...], str], str] = {}

    def entry(self, key: str, tensor: torch.Tensor, kind: str | None) -> str:
        data = tensor.detach().cpu().contiguous()
        content = (
            str(data.dtype),
            tuple(data.shape),
            hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest(),
        )
        if content in self._by_content:
            return self._by_content[content]
        name = key if key not in self.tensors else f"{kind or 'layer'}.{key}"
        while name in self.tensors:
            name = f"{name}~{len(self.tensors)}"
        self.tensors[name] = data.clone()
        self._by_content[content] = name
        return name


def _point_tables(model: Any, tables: dict[str, torch.Tensor], shared: _SharedTables, kind: str | None) -> None:
    """Rename the graph's table initializers after their shared entries and mark them external (offsets later)."""
    from onnx import TensorProto

    links = {init: entry for init, entry in match_initializers(model, tables).items() if entry in tables}
    renames = {init: shared.entry(entry, tables[entry], kind) for init, entry in links.items()}
    rename_values(model, {old: new for old, new in renames.items() if old != new})
    pointed = set(renames.values())
    for init in model.graph.initializer:
        if init.name in pointed:
            _point(init, TABLES_NAME, 0, 0)
            init.data_location = TensorProto.EXTERNAL


def _fill_offsets(model: Any, offsets: dict[str, tuple[int, int]]) -> None:
    for init in model.graph.initializer:
        location = {e.key: e.value for e in init.external_data}.get("location")
        if init.data_location == 1 and location == TABLES_NAME:
            _point(init, TABLES_NAME, *offsets[init.name])


def export_layers(
    folder: str | os.PathLike[str],
    checkpoint: Any,
    layers: str = "all",
    *,
    layer_type: str | None = None,
    table_mode: TableMode | str | None = None,
    max_positions: int | None = None,
    dtype: str | torch.dtype = "float32",
    kv_cache: str = "concat",
    opset: int | None = None,
    optimize: bool = True,
    position_guard: bool = True,
    cache_capacity: int | None = None,
) -> LayersResult:
    """Export the selected layers of a checkpoint into ``folder`` (see the module docstring for the files).

    Args:
        folder: the output folder (new, empty, or holding only a previous export of the same layers).
        checkpoint: the checkpoint folder (or in-memory transformers model).
        layers: ``all``, a range ``0-3``, a list ``0,2,5`` or both (``0-2,7``); per stack in encoder-decoder models.
        layer_type: one stack (``encoder``/``decoder``) or one kind of layer (``sliding_attention``); default: all.
        table_mode, max_positions, dtype, kv_cache, opset, optimize, position_guard, cache_capacity: as in
            :func:`posenc.export.export_onnx`, for every layer.

    Raises:
        ConfigError: a malformed or empty selection, a layer out of range, a folder holding other files.
        PosencError: any layer's export failed (the subclass says why); nothing is written then.
    """
    from posenc.checkpoints import load
    from posenc.checkpoints.layers import checkpoint_layers, select_layers

    folder = output_path(folder, "--layers output folder", folder=True)
    kind = UnitKind.parse(UnitKind.BLOCK, kv_cache)
    options = ExportOptions(dtype, opset, optimize, position_guard, cache_capacity)
    chosen, skipped = select_layers(checkpoint_layers(checkpoint, layer_type), layers)
    if not chosen:
        raise ConfigError(f"--layers {layers!r} selects no attention layer of {checkpoint}; every layer is skipped.")
    files = _planned_files(folder, [entry.name for entry in chosen])
    _check_folder(folder, files)
    created = not folder.exists()
    try:
        with atomic_outputs(*files) as temps:
            staged = dict(zip(files, temps, strict=True))
            shared = _SharedTables()
            graphs: list[tuple[Any, Manifest, Path]] = []
            for entry in chosen:
                loaded = load.load_layer(checkpoint, entry.layer, entry.stack)  # this layer's tensors only
                block = loaded.block(table_mode, max_positions)  # built for this export: no copy
                prepared = prepare_export(block, kind, options, provenance=loaded.provenance(), copy=False)
                onnx = folder / f"{entry.name}.onnx"
                weights = weights_path_for(onnx)
                state = prepared.unit.inner.state_dict()
                keys = table_keys(prepared.unit.inner)
                write_linked(prepared.model, {k: v for k, v in state.items() if k not in keys}, staged[weights],
                             weights.name)  # fmt: skip
                _point_tables(prepared.model, {k: v for k, v in state.items() if k in keys}, shared, entry.kind)
                graphs.append((prepared.model, export_manifest(prepared, "", weights, staged[weights]), onnx))
                del loaded, block, prepared, state  # the next layer is read only now: memory follows one layer
            _write_tables(shared, staged[folder / TABLES_NAME])
            record = FileRecord(TABLES_NAME, sha256_file(staged[folder / TABLES_NAME]))
            offsets = safetensors_offsets(staged[folder / TABLES_NAME])
            manifests = []
            for model, manifest, onnx in graphs:
                _fill_offsets(model, offsets)
                data = model.SerializeToString()
                staged[onnx].write_bytes(data)
                reads_tables = any(init.name in offsets for init in model.graph.initializer)
                weights_record = dataclasses.replace(manifest.weights, tables_file=record if reads_tables else None)
                manifest = dataclasses.replace(manifest, onnx_sha256=hashlib.sha256(data).hexdigest(),
                                               weights=weights_record)  # fmt: skip
                staged[manifest_path_for(onnx)].write_text(manifest.to_json())
                manifests.append(manifest)
            index = _index(checkpoint, manifests, chosen, skipped, record)
            staged[folder / INDEX_NAME].write_text(json_text(index.to_dict()))
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty: the staged files are gone
        raise
    return LayersResult(folder, index, tuple(manifests))


def _write_tables(shared: _SharedTables, path: Path) -> None:
    from safetensors.torch import save_file

    # one metadata key: the file's sha256 must not vary with the order safetensors writes a map in
    save_file(shared.tensors, str(path), metadata={"format": "pt"})


def _index(
    checkpoint: Any, manifests: list[Manifest], chosen: list[Any], skipped: list[Any], tables: FileRecord
) -> LayersIndex:
    source = manifests[0].weights.source
    return LayersIndex(
        checkpoint=str(getattr(source, "checkpoint", checkpoint)),
        model_type=str(getattr(source, "model_type", "")),
        layers=tuple(LayerArtifact(e.layer, e.kind, f"{e.name}.onnx") for e in chosen),
        tables=tables,
        skipped=tuple(SkippedLayer(e.layer, e.kind, e.skipped) for e in skipped),
    )


def read_index(folder: str | os.PathLike[str]) -> LayersIndex:
    """The index of a ``posenc export --layers`` folder.

    Raises:
        ModelFileError: no ``layers.json`` in the folder, or an unreadable one.
    """
    from posenc.artifacts.files import reading
    from posenc.errors import ModelFileError
    from posenc.export.manifest import read_manifest_json

    path = Path(folder) / INDEX_NAME
    with reading(folder):
        if not path.exists():
            raise ModelFileError(
                f"{folder} has no {INDEX_NAME}: it is not a folder written by `posenc export --hf-model DIR --layers "
                f"all -o {folder}`. Validate a single model by its .onnx file."
            )
        return LayersIndex.from_dict(read_manifest_json(path), f"layer index {path}")


__all__ = [
    "INDEX_NAME",
    "TABLES_NAME",
    "LayerArtifact",
    "LayersIndex",
    "LayersResult",
    "SkippedLayer",
    "export_layers",
    "read_index",
]
