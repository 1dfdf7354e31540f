"""Running a built engine through polygraphy's ``TrtRunner`` (a GPU and datacenter ``tensorrt`` needed)."""

from __future__ import annotations

import os
from typing import Any

from posenc.engine.backend import configure_polygraphy, load_backend
from posenc.errors import BackendUnavailable


def engine_runner(path: str | os.PathLike[str], name: str | None = None) -> Any:
    """A polygraphy ``TrtRunner`` for a serialized engine, for :func:`posenc.validate.validate_onnx` runners.

    Args:
        path: the engine file (``posenc build`` output).
        name: runner name in reports (default ``trt:<file name>``).

    Raises:
        ModelFileError: the file is missing or not a regular file, or its engine manifest (when present) records
            other bytes.
        BackendUnavailable: datacenter ``tensorrt`` is not importable or no GPU is visible (TensorRT-RTX
            engines cannot be run on this machine either).
    """
    from posenc.engine.build import verify_engine

    path = verify_engine(path)
    backend = load_backend("tensorrt")
    from posenc.engine.targets import current_gpu_target

    if current_gpu_target() is None:
        raise BackendUnavailable(
            "running a TensorRT engine needs an NVIDIA GPU with a CUDA build of torch; none is visible here. "
            "Run `posenc validate` with the TrtRunner on a GPU machine (scripts/gpu_check.py runs every GPU check)."
        )
    configure_polygraphy(backend)
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    return TrtRunner(EngineFromBytes(BytesFromPath(str(path))), name=name or f"trt:{path.name}")
