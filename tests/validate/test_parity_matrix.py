"""Parity matrix generated from the registry: every scheme x table mode x {fp32, fp16} on ONNX Runtime CPU.

Each combination is exported once into the session's shared export cache (the spec's ``default`` case,
grouped-query geometry; the fusion and engine matrices reuse the same files) and validated by
polygraphy against the float64 eager reference at shapes other than the export sample (2, 4, 3):
S = 1, odd S with batch 3, decode with 9 cached tokens, S = 13 after 5 cached tokens.

Unit per combination (to keep the matrix within its time budget): fp16 exports the whole AttentionBlock
(the deployed unit, with its KV cache inputs), fp32 exports the scheme's positional op alone (the
scheme's own math, isolated); schemes without an op (NoPE) export the block for both dtypes.
"""

from __future__ import annotations

import pytest

from posenc.schemes import get_spec, specs
from posenc.validate import DEFAULT_SHAPES, default_shapes, validate_onnx
from posenc.validate.feeds import serving_limit
from tests.conftest import SMALL
from tests.matrix import MatrixCase, exported, same_graph_as


def _unit(spec, dtype: str) -> str:
    if "op" not in spec.exports:
        return "block"
    return "block" if dtype == "fp16" else "op"


FULL = {"fp32": "float32", "fp16": "float16"}
MATRIX = [
    pytest.param(
        spec.name,
        mode.value,
        dtype,
        _unit(spec, dtype),
        id=f"{spec.name}-{mode.value}-{dtype}",
        # another scheme's graph up to constant values (tests.matrix.SAME_GRAPH): make test-slow only
        marks=[pytest.mark.slow] if same_graph_as(spec.name, mode.value, FULL[dtype], _unit(spec, dtype)) else [],
    )
    for spec in specs()
    for mode in sorted(spec.table_modes, key=lambda m: m.value)
    for dtype in ("fp32", "fp16")
]


@pytest.mark.parametrize(("scheme", "mode", "dtype", "unit"), MATRIX)
def test_exported_graph_matches_eager_reference(scheme: str, mode: str, dtype: str, unit: str, export_cache) -> None:
    path = exported(MatrixCase(scheme, mode, FULL[dtype], unit), export_cache, SMALL)
    report = validate_onnx(path)
    outputs = len({row.output for row in report.rows})
    shapes = [row.shape for row in report.rows[::outputs]]
    assert shapes == default_shapes(report.manifest)  # the fixed shapes, then the model's boundaries
    assert shapes[: len(DEFAULT_SHAPES)] == list(DEFAULT_SHAPES)
    if get_spec(scheme).position_axes == 1:  # multi-axis ids place images, not far positions
        assert shapes[-1].last == serving_limit(report.manifest) - 1  # the last position the graph serves
    assert report.passed, report.to_markdown()
