"""Engines on an NVIDIA GPU with datacenter TensorRT: built here, run through polygraphy's TrtRunner.

Skipped on machines without a GPU and ``tensorrt`` (the reason is printed); scripts/gpu_check.py runs the
whole GPU matrix in one go on such a machine.
"""

from __future__ import annotations

import importlib.util

import pytest

from posenc.engine.targets import current_gpu_target
from tests.conftest import SMALL
from tests.matrix import MatrixCase


def _gpu_skip_reason() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return "datacenter TensorRT (`pip install tensorrt`) is not installed"
    if current_gpu_target() is None:
        return "no NVIDIA GPU visible (needs a CUDA build of torch and a driver)"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_gpu_skip_reason() is not None, reason=str(_gpu_skip_reason()))]

CASES = [
    MatrixCase("rope", "precomputed", "float16", "op", "fused"),
    MatrixCase("rope", "dynamic", "float32", "op", "fused", case="interleaved_partial"),
    MatrixCase("rope", "precomputed", "float16", "block", "fused"),
    MatrixCase("alibi", "dynamic", "float32", "block", "fused"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_trt_runner_matches_the_eager_reference(export_cache, case: MatrixCase) -> None:
    from posenc.engine import build_engine, engine_runner
    from posenc.export import FeedShape
    from posenc.validate import check_ort_parity, validate_onnx
    from tests.matrix import graph_for

    onnx_path = graph_for(case, export_cache, SMALL, check=check_ort_parity)
    engine = build_engine(onnx_path, export_cache / f"{case.id}.gpu.engine", backend="tensorrt")
    assert engine.manifest.backend == "tensorrt"
    assert list(engine.manifest.targets) == [current_gpu_target()]
    shapes = [FeedShape(1, 1), FeedShape(2, 7), FeedShape(1, 16)]
    if case.unit == "block":
        shapes.append(FeedShape(2, 1, 9))
    report = validate_onnx(onnx_path, shapes=shapes, runners=[engine_runner(engine.path)])
    assert report.passed, report.to_markdown()
