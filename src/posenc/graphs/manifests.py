"""What the graph stage reads from, and adds to, the manifest beside an ONNX file.

An exported model's manifest (:class:`posenc.export.Manifest`) is carried over with the new file's hash and an
``optimized`` record (:class:`~posenc.export.manifest.OptimizedRecord`)::

    "optimized": {"target": "trt", "rope": "fused", "passes": [{"name": "fuse_rope", "count": 2}, ...],
                  "parity": {...}, "source_onnx": "m.onnx", "source_sha256": "..."}

ONNX files without a manifest (models from elsewhere) still optimize; their new manifest is a
:class:`GraphManifest` (format ``posenc.graphs/1``: hash, ``optimized`` record, notes); the parity check (the
caller's, see :data:`posenc.graphs.optimize.ParityCheck`) then uses random feeds and dtype tolerances.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from posenc.artifacts.files import manifest_path_for, reading, weights_path_for
from posenc.artifacts.paths import input_file, sha256_file
from posenc.errors import ModelFileError
from posenc.export.manifest import Manifest, OptimizedRecord, read_manifest_json, weights_file
from posenc.records import Document

GRAPHS_FORMAT = "posenc.graphs/1"


@dataclasses.dataclass(frozen=True)
class GraphManifest(Document):
    """The manifest of a graph optimized from an ONNX file that had none (JSON: ``to_dict``)."""

    FORMAT: ClassVar[str] = GRAPHS_FORMAT
    REMEDY: ClassVar[str] = "optimize the original ONNX file again (`posenc optimize ...`)"

    onnx_sha256: str
    optimized: OptimizedRecord
    notes: tuple[str, ...]
    format: str = GRAPHS_FORMAT


AnyManifest = Manifest | GraphManifest
"""The manifest beside an ONNX file: an export's (possibly optimized since) or a foreign graph's."""


@dataclasses.dataclass
class ModelInfo:
    """An ONNX file and its manifest, when it has one.

    Attributes:
        path: the ONNX file.
        manifest: its export manifest (``None``: none, or a :class:`GraphManifest`, see ``graph``).
        graph: the manifest of an optimized foreign graph (``posenc.graphs/1``), else ``None``.
        manifest_file: where the manifest is (or would be).
        sha256: hex SHA-256 of the file (``None`` when it does not exist).
    """

    path: Path
    manifest: Manifest | None
    manifest_file: Path
    graph: GraphManifest | None = None
    sha256: str | None = None

    @property
    def weights_path(self) -> Path | None:
        """Where the manifest's weights file would be (not checked; :meth:`weights` checks it)."""
        return None if self.manifest is None else self.manifest_file.parent / self.manifest.weights.path

    def weights(self) -> Path | None:
        """The manifest's weights file by the safe-path rule, its sha256 checked (``None``: no export manifest).

        Raises:
            ModelFileError: the name leads out of the model's folder, the file is missing or not regular, or its
                bytes do not match the manifest.
        """
        return None if self.manifest is None else weights_file(self.manifest, self.manifest_file)

    @property
    def optimized(self) -> OptimizedRecord | None:
        """The ``optimized`` record of whichever manifest the file has."""
        found = self.manifest or self.graph
        return None if found is None else found.optimized

    @staticmethod
    def manifest_path_for(onnx_path: Path) -> Path:
        return manifest_path_for(onnx_path)

    @staticmethod
    def weights_path_for(onnx_path: Path) -> Path:
        return weights_path_for(onnx_path)

    @property
    def dtype(self) -> str:
        return self.manifest.dtype if self.manifest is not None else "float32"


def read_manifest(onnx_path: str | Path) -> AnyManifest | None:
    """The manifest beside ``onnx_path`` (either kind), or ``None`` when there is none.

    Raises:
        ModelFileError: unreadable, of an unknown format, or with missing or unknown fields (says: re-export).
    """
    path = manifest_path_for(onnx_path)
    if not path.exists():
        return None
    data = read_manifest_json(path)
    if data.get("format") == GRAPHS_FORMAT:
        return GraphManifest.from_dict(data, f"manifest {path}")
    return Manifest.from_dict(data, f"manifest {path}")


def read_model_info(onnx_path: str | Path) -> ModelInfo:
    """The file and its manifest; a manifest that no longer matches the file is an error.

    An interrupted write in the folder is finished first (:func:`posenc.artifacts.files.reading`).

    Raises:
        ModelFileError: the model is not a regular, non-empty file, or its manifest is unreadable or describes
            other bytes.
    """
    path = input_file(onnx_path, "ONNX model")
    with reading(path):  # no writer lands files in the folder while they are checked against each other
        found = read_manifest(path)
        digest = sha256_file(path)
    if found is not None and digest != found.onnx_sha256:
        raise ModelFileError(
            f"{path} does not match its manifest {manifest_path_for(path).name} (sha256 differs): the file was "
            f"modified or replaced after the manifest was written. Re-export it, or remove the stale manifest."
        )
    manifest = found if isinstance(found, Manifest) else None
    graph = found if isinstance(found, GraphManifest) else None
    return ModelInfo(path=path, manifest=manifest, manifest_file=manifest_path_for(path), graph=graph, sha256=digest)


def optimized_manifest(
    info: ModelInfo, onnx_sha256: str, record: OptimizedRecord, weights: Path | None
) -> Manifest | GraphManifest:
    """The manifest of a model optimized from ``info`` (bytes hashing to ``onnx_sha256``): the source's with the
    new hash, weights file and ``optimized`` record (the source's own record kept as ``previous``)."""
    previous = info.optimized
    record = dataclasses.replace(record, source_onnx=info.path.name, source_sha256=info.sha256, previous=previous)
    applied = [f"{p.name}={p.count}" for p in record.passes if p.count]
    note = f"posenc optimize --target {record.target} --rope {record.rope}: {', '.join(applied) or 'no change'}"
    if info.manifest is None:
        notes = (*info.graph.notes, note) if info.graph is not None else (note,)
        return GraphManifest(onnx_sha256=onnx_sha256, optimized=record, notes=notes)
    manifest = info.manifest
    # in another folder the graph holds its tables itself (a shared tables file stays with the export's folder)
    weights_record = (
        manifest.weights
        if weights is None
        else dataclasses.replace(manifest.weights, path=weights.name, tables_file=None)
    )
    return dataclasses.replace(
        manifest, onnx_sha256=onnx_sha256, weights=weights_record, optimized=record, notes=(*manifest.notes, note)
    )
