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
    from posenc.engine import targets
    from posenc.engine.build import verify_engine

    path = verify_engine(path)
    missing = [] if targets.current_gpu_target() else ["no NVIDIA GPU is visible here (to torch with CUDA)"]
    try:
        backend = load_backend("tensorrt")
    except BackendUnavailable:
        missing.append("datacenter tensorrt is not installed")
    if missing:
        raise BackendUnavailable(
            f"running a TensorRT engine needs an NVIDIA GPU and datacenter `tensorrt`: {'; '.join(missing)}. "
            f"TensorRT-RTX builds engines ahead of time without a GPU but cannot run them. Run `posenc validate "
            f"--engine` on a machine with an NVIDIA GPU after `pip install tensorrt` (scripts/gpu_check.py runs every "
            f"GPU check)."
        )
    configure_polygraphy(backend)
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    return TrtRunner(EngineFromBytes(BytesFromPath(str(path))), name=name or f"trt:{path.name}")
