"""Reading and writing ONNX files with clear errors for bad files (writes go through artifacts.files)."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_ir as ir

from posenc.artifacts.files import write_bytes_atomic
from posenc.errors import ModelFileError
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


def model_to_proto(model: ir.Model, *, keep_external: bool = False) -> onnx.ModelProto:
    """Serialize the IR model to a protobuf: every tensor inside it (what serialized bytes need: ONNX Runtime cannot
    resolve another file from bytes), or, with ``keep_external``, tensors read from a weights file still pointing
    into it (a graph written beside that file)."""
    proto = ir.serde.serialize_model(model)
    if keep_external:
        return proto
    base = next(
        (value.const_value.base_dir for value in model.graph.initializers.values()
         if isinstance(value.const_value, ir.ExternalTensor)),
        None,
    )  # fmt: skip
    if base is not None:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(proto, str(base))
    return proto


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
