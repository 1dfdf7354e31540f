"""What the graph stage reads from, and adds to, the manifest beside an ONNX file.

The manifest format belongs to :mod:`posenc.export.manifest`; this module reads it as raw JSON (so keys
added by later stages survive) and adds an ``optimized`` record::

    "optimized": {"target": "trt", "rope": "fused", "source_onnx": "m.onnx", "source_sha256": "...",
                  "passes": [{"name": "fuse_rope", "count": 2}, ...], "parity": {...}}

ONNX files without a manifest (models from elsewhere) still optimize; their new manifest holds only the
``optimized`` record (format ``posenc.graphs/1``); the parity check (the caller's, see
:data:`posenc.graphs.optimize.ParityCheck`) then uses random feeds and dtype tolerances.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from posenc.errors import ModelFileError
from posenc.export import manifest_path_for, weights_path_for
from posenc.export.files import sha256_file
from posenc.export.manifest import Manifest, read_manifest_json

GRAPHS_FORMAT = "posenc.graphs/1"


@dataclasses.dataclass
class ModelInfo:
    """An ONNX file and, when present, its manifest (raw JSON and parsed)."""

    path: Path
    raw: dict[str, Any] | None
    manifest: Manifest | None
    manifest_file: Path
    sha256: str | None = None
    """Hex SHA-256 of the file (``None`` when it does not exist)."""

    @property
    def weights_path(self) -> Path | None:
        if self.raw is None or "weights" not in self.raw:
            return None
        return self.manifest_file.parent / str(self.raw["weights"].get("path", weights_path_for(self.path).name))

    @staticmethod
    def manifest_path_for(onnx_path: Path) -> Path:
        return manifest_path_for(onnx_path)

    @staticmethod
    def weights_path_for(onnx_path: Path) -> Path:
        return weights_path_for(onnx_path)

    @property
    def dtype(self) -> str:
        return self.manifest.dtype if self.manifest is not None else "float32"


def read_raw_manifest(onnx_path: str | Path) -> dict[str, Any] | None:
    """The manifest JSON beside ``onnx_path`` as a dict, or ``None`` when there is none."""
    path = manifest_path_for(onnx_path)
    return read_manifest_json(path) if path.exists() else None


def read_model_info(onnx_path: str | Path) -> ModelInfo:
    """The file and its manifest; a manifest that no longer matches the file is an error."""
    path = Path(onnx_path)
    raw = read_raw_manifest(path)
    digest = sha256_file(path) if path.exists() else None
    manifest = None
    if raw is not None and raw.get("format") != GRAPHS_FORMAT:
        manifest = Manifest.from_dict(raw)
        if digest is not None and digest != manifest.onnx_sha256:
            raise ModelFileError(
                f"{path} does not match its manifest {manifest_path_for(path).name} (sha256 differs): the file was "
                f"modified after export. Re-export it, or remove the stale manifest."
            )
    return ModelInfo(path=path, raw=raw, manifest=manifest, manifest_file=manifest_path_for(path), sha256=digest)


def optimized_manifest(
    info: ModelInfo, onnx_sha256: str, record: dict[str, Any], weights: Path | None
) -> dict[str, Any]:
    """The manifest of a model optimized from ``info`` (bytes hashing to ``onnx_sha256``): the source's plus
    the ``optimized`` record."""
    data: dict[str, Any] = dict(info.raw) if info.raw is not None else {"format": GRAPHS_FORMAT}
    data["onnx_sha256"] = onnx_sha256
    if weights is not None and "weights" in data:
        data["weights"] = {**data["weights"], "path": weights.name}
    previous = data.get("optimized")
    data["optimized"] = {
        **record,
        "source_onnx": info.path.name,
        "source_sha256": info.sha256,
        **({"previous": previous} if previous else {}),
    }
    notes = list(data.get("notes", []))
    applied = [f"{p['name']}={p['count']}" for p in record["passes"] if p["count"]]
    notes.append(
        f"posenc optimize --target {record['target']} --rope {record['rope']}: {', '.join(applied) or 'no change'}"
    )
    data["notes"] = notes
    return data
