"""Helpers over the session's shared export cache (the ``export_cache`` fixture of tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import posenc.functional as PF
from posenc.validate import check_ort_parity
from tests.conftest import SMALL
from tests.matrix import MatrixCase, exported, graph_for


def export_case(folder: Path, case: MatrixCase) -> Path:
    return exported(case, folder, SMALL)


def fused_case(folder: Path, case: MatrixCase, target: str = "trt") -> Path:
    fused = MatrixCase(**{**case.__dict__, "graph": "fused"})
    return graph_for(fused, folder, SMALL, target, check=check_ort_parity)


def count_rotations(path: Path, feed: dict[str, np.ndarray]) -> tuple[int, list[torch.Tensor]]:
    """Run the float64 eager reference of an export; return (calls of apply_rope, outputs).

    The number of ``posenc.functional.apply_rope`` calls is the number of rotations the fusion must find.
    """
    from posenc.export import load_eager, reference_inputs

    module, manifest = load_eager(path)
    calls = []
    original = PF.apply_rope

    def counting(*args, **kwargs):
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
