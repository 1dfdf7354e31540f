"""Every scheme's attention block, optimized for ONNX Runtime CPU, keeps parity with the float64 eager reference.

The per-scheme stage of ``posenc demo`` (export -> ``optimize --target ort-cpu`` with its before/after check ->
validate), run on the fp16 blocks of the session's shared export cache (the parity and engine matrices read the
same files), in the table mode the quick demo picks. A block that repeats another scheme's graph up to constant
values (``tests.matrix.SAME_GRAPH``), and the blocks of ``SLOW_BLOCKS`` (a path another block or test takes in
``make test``), run in ``make test-slow`` only. ``tests/test_demo.py`` runs the whole demo
for rope and rope_dynamic in ``make test`` and for every scheme in ``make test-slow``.
"""

from __future__ import annotations

import pytest

from posenc.bench.plan import table_modes_for
from posenc.schemes import scheme_names
from posenc.validate import check_ort_parity, validate_onnx
from tests.conftest import SMALL
from tests.matrix import MatrixCase, graph_for, slow_if_same_graph

CASES = [MatrixCase(name, table_modes_for(name, "auto")[0][0], "float16", "block", "fused") for name in scheme_names()]

SLOW_BLOCKS = {
    # score biases: tests/graphs/test_block_fusion.py optimizes each of these blocks for ort-cpu in make test and
    # holds the optimized graph to the float64 eager rebuild of the export (alibi stays here for the placement)
    "deberta": "test_block_fusion",
    "t5": "test_block_fusion",
    "transformer_xl": "test_block_fusion",
    "tupe": "test_block_fusion",
    # a position table added at the embeddings, which no pass touches: sinusoidal stays here for the placement
    "floater": "sinusoidal",
    "learned": "sinusoidal",
    "multiplicative": "sinusoidal",
    # rotation over several position axes: rope_mrope stays here
    "rope_axial": "rope_mrope",
}
"""Schemes whose block optimizes in make test-slow only, with what covers the same path in make test."""


def _case(case: MatrixCase) -> object:
    param = slow_if_same_graph(case, f"{case.scheme}-{case.table_mode}")
    if case.scheme in SLOW_BLOCKS:
        return pytest.param(case, id=f"{case.scheme}-{case.table_mode}", marks=[pytest.mark.slow])
    return param


def test_the_slow_blocks_are_schemes_covered_in_make_test() -> None:
    names = set(scheme_names())
    assert set(SLOW_BLOCKS) < names
    for covered_by in SLOW_BLOCKS.values():
        assert covered_by in names - set(SLOW_BLOCKS) or covered_by == "test_block_fusion"


@pytest.mark.parametrize("case", [_case(c) for c in CASES])
def test_block_optimized_for_ort_cpu_matches_the_eager_reference(export_cache, case: MatrixCase) -> None:
    path = graph_for(case, export_cache, SMALL, target="ort-cpu", check=check_ort_parity)
    report = validate_onnx(path)
    assert report.rows, "no parity rows: the check would prove nothing"
    assert report.passed, report.to_markdown()
