"""File plumbing of exported artifacts: side-car names, hashes and atomic writes.

Every artifact is written to a temporary name in its target directory and renamed into place with
:func:`os.replace`, so an interrupted or failed export never leaves a half-written file behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from posenc.errors import ModelFileError

MANIFEST_SUFFIX = ".manifest.json"
WEIGHTS_SUFFIX = ".weights.safetensors"
WEIGHTS_FORMAT = "safetensors"
LEGACY_WEIGHTS_FORMAT = "torch.save(state_dict)"
"""Weights of manifests written before safetensors: read with ``torch.load(weights_only=True)``."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def _stem(onnx_path: str | os.PathLike[str]) -> Path:
    path = Path(onnx_path)
    return path.with_suffix("") if path.suffix == ".onnx" else path


def manifest_path_for(onnx_path: str | os.PathLike[str]) -> Path:
    """``model.onnx`` -> ``model.manifest.json`` (same directory)."""
    stem = _stem(onnx_path)
    return stem.with_name(stem.name + MANIFEST_SUFFIX)


def weights_path_for(onnx_path: str | os.PathLike[str]) -> Path:
    """``model.onnx`` -> ``model.weights.safetensors`` (same directory)."""
    stem = _stem(onnx_path)
    return stem.with_name(stem.name + WEIGHTS_SUFFIX)


def save_weights(state: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a ``state_dict`` as safetensors (tied tensors are stored once per key; no pickle)."""
    from safetensors.torch import save_file

    tensors = {key: value.detach().cpu().contiguous().clone() for key, value in state.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def load_weights_file(path: str | os.PathLike[str], weights_format: str) -> dict[str, Any]:
    """Read a weights file written by :func:`save_weights` (or a legacy ``torch.save`` one, weights only).

    Raises:
        ModelFileError: unreadable, corrupt, or an unknown format.
    """
    try:
        if weights_format == WEIGHTS_FORMAT:
            from safetensors.torch import load_file

            return dict(load_file(str(path), device="cpu"))
        if weights_format == LEGACY_WEIGHTS_FORMAT:
            import torch

            return dict(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as exc:
        raise ModelFileError(f"cannot read weights {path} ({type(exc).__name__}); re-export the model.") from None
    raise ModelFileError(f"weights {path} have unknown format {weights_format!r}; re-export the model.")


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_outputs(*targets: str | os.PathLike[str]) -> Iterator[list[Path]]:
    """Give temporary paths for ``targets``; rename them all into place only if the block succeeds.

    Each temporary file lives in its target's directory (so the final :func:`os.replace` is atomic on
    one filesystem). If the block raises, every temporary file is removed and no target is touched.
    Targets are renamed last to first: list the main artifact first, so it appears only after its side
    files (a reader that finds the new model also finds its new manifest).

    Example::

        with atomic_outputs("model.onnx", "model.manifest.json") as (tmp_model, tmp_manifest):
            tmp_model.write_bytes(data)
            tmp_manifest.write_text(text)

    Raises:
        ModelFileError: a target's directory cannot be created or written.
    """
    finals = [Path(t) for t in targets]
    for final in finals:
        if final.is_dir():
            raise ModelFileError(f"cannot write {final}: it is a directory; give a file path.")
    temps: list[Path] = []
    try:
        for final in finals:
            try:
                final.parent.mkdir(parents=True, exist_ok=True)
                fd, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
            except OSError as exc:
                raise ModelFileError(f"cannot write {final} ({exc}); choose a writable output path.") from None
            os.close(fd)
            os.chmod(name, _FILE_MODE)  # mkstemp creates 0600; artifacts get the usual permissions
            temps.append(Path(name))
        yield list(temps)
        landed: list[Path] = []
        for temp, final in reversed(list(zip(temps, finals, strict=True))):
            try:
                os.replace(temp, final)
            except OSError as exc:
                for side in landed:  # side files of a main file that did not land would describe another file
                    side.unlink(missing_ok=True)
                raise ModelFileError(f"cannot write {final} ({exc}); choose a writable file path.") from None
            landed.append(final)
    finally:
        for temp in temps:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    with atomic_outputs(path) as (temp,):
        temp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file and a rename."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def json_text(payload: Any) -> str:
    """The JSON form posenc writes: indented, keys sorted, newline-terminated."""
    return json.dumps(payload, indent=2, sort_keys=True) + "\n"


def write_json_atomic(path: str | os.PathLike[str], payload: Any) -> Path:
    """Write ``payload`` as JSON (:func:`json_text`) to ``path`` atomically."""
    return write_text_atomic(path, json_text(payload))
