"""Exported graphs shared by the graph and engine tests: one export per case per test session.

With pytest-xdist the workers share one folder (each worker's base temp directory is a sibling), and
:mod:`posenc.engine.matrix` locks each file while exporting, so each graph is exported once.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import posenc.functional as PF
from posenc.engine.matrix import MatrixCase, exported, graph_for
from tests.conftest import SMALL


def shared_folder(factory: pytest.TempPathFactory) -> Path:
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / "posenc-graphs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def export_case(folder: Path, case: MatrixCase) -> Path:
    return exported(case, folder, SMALL)


def fused_case(folder: Path, case: MatrixCase, target: str = "trt") -> Path:
    return graph_for(MatrixCase(**{**case.__dict__, "graph": "fused"}), folder, SMALL, target)


def count_rotations(path: Path, feed: dict[str, np.ndarray]) -> tuple[int, list[torch.Tensor]]:
    """Run the float64 eager reference of an export; return (calls of apply_rope, outputs).

    The number of ``posenc.functional.apply_rope`` calls is the number of rotations the fusion must find.
    """
    from posenc.export import load_eager, reference_inputs

    module, manifest = load_eager(path)
    calls = []
    original = PF.apply_rope

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    PF.apply_rope = counting
    try:
        with torch.no_grad():
            outputs = module(*reference_inputs(manifest, feed, torch.float64))
    finally:
        PF.apply_rope = original
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    return len(calls), outputs
