"""Reading and writing ONNX files with clear errors for bad files (writes go through export.files)."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_ir as ir

from posenc.errors import ModelFileError
from posenc.export.files import write_bytes_atomic
from posenc.export.runtime import check_model_file

_PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: str | os.PathLike[str]) -> ir.Model:
    """Load an ONNX file into the in-memory IR that the passes rewrite.

    Raises:
        ModelFileError: the file is missing, not a regular file, truncated, not an ONNX model, or names external
            data outside its folder (:func:`posenc.export.check_model_file`).
    """
    path = Path(path)
    check_model_file(path)  # a regular, non-empty, valid ONNX file whose external data stays inside its folder
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


def default_opset(model: ir.Model) -> int:
    """Version of the default (``ai.onnx``) opset the model imports (0 when it imports none)."""
    return int(model.opset_imports.get("", 0))
