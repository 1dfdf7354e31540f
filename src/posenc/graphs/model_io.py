"""Reading and writing ONNX files: clear errors for bad files, atomic writes, content hashes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from posenc.errors import ModelFileError

_PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: str | os.PathLike[str]) -> ir.Model:
    """Load an ONNX file into the in-memory IR that the passes rewrite.

    Raises:
        ModelFileError: the file is missing, truncated or not an ONNX model.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"ONNX file {path} does not exist; pass the path of a .onnx file (see `posenc export`).")
    try:
        return ir.load(path)
    except Exception as exc:  # protobuf raises DecodeError, onnx raises its own; all mean the same here
        raise ModelFileError(
            f"{path} is not a readable ONNX model ({type(exc).__name__}: {exc}); re-export it or check the file "
            f"was copied completely."
        ) from None


def model_to_proto(model: ir.Model) -> onnx.ModelProto:
    """Serialize the IR model to a protobuf (external tensors are loaded into it)."""
    return ir.serde.serialize_model(model)


def save_model(model: ir.Model, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` to ``path`` atomically (temporary file in the same directory, then rename).

    Raises:
        ModelFileError: the model is over protobuf's 2 GiB limit or the directory is not writable.
    """
    data = model_to_proto(model).SerializeToString()
    if len(data) > _PROTOBUF_LIMIT:
        raise ModelFileError(
            f"the optimized model is {len(data) / 2**30:.1f} GiB, over ONNX's 2 GiB single-file limit; "
            f"export with table mode 'dynamic' or fewer max_positions."
        )
    return write_bytes_atomic(path, data)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory and an atomic rename."""
    path = Path(path)
    with _atomic_target(path) as tmp:
        tmp.write_bytes(data)
    return path


def write_json_atomic(path: str | os.PathLike[str], payload: dict[str, Any]) -> Path:
    """Write ``payload`` as indented JSON to ``path`` atomically."""
    return write_bytes_atomic(path, (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, on error it is deleted."""
    with _atomic_target(Path(path)) as tmp:
        yield tmp


@contextlib.contextmanager
def _atomic_target(path: Path) -> Iterator[Path]:
    directory = path.parent if str(path.parent) else Path(".")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise ModelFileError(f"cannot write into {directory} ({exc}); choose a writable output path.") from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_opset(model: ir.Model) -> int:
    """Version of the default (``ai.onnx``) opset the model imports (0 when it imports none)."""
    return int(model.opset_imports.get("", 0))
