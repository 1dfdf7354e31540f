"""Every scheme's attention block, optimized for ONNX Runtime CPU, keeps parity with the float64 eager reference.

The per-scheme stage of ``posenc demo`` (export -> ``optimize --target ort-cpu`` with its before/after check ->
validate), run on the fp16 blocks of the session's shared export cache (the parity and engine matrices read the
same files), in the table mode the quick demo picks. A block that repeats another scheme's graph up to constant
values (``tests.matrix.SAME_GRAPH``) runs in ``make test-slow`` only. ``tests/test_demo.py`` runs the whole demo
for one scheme per placement in ``make test`` and for every scheme in ``make test-slow``.
"""

from __future__ import annotations

import pytest

from posenc.bench.plan import table_modes_for
from posenc.schemes import scheme_names
from posenc.validate import check_ort_parity, validate_onnx
from tests.conftest import SMALL
from tests.matrix import MatrixCase, graph_for, slow_if_same_graph

CASES = [MatrixCase(name, table_modes_for(name, "auto")[0][0], "float16", "block", "fused") for name in scheme_names()]


@pytest.mark.parametrize("case", [slow_if_same_graph(c, f"{c.scheme}-{c.table_mode}") for c in CASES])
def test_block_optimized_for_ort_cpu_matches_the_eager_reference(export_cache, case: MatrixCase) -> None:
    path = graph_for(case, export_cache, SMALL, target="ort-cpu", check=check_ort_parity)
    report = validate_onnx(path)
    assert report.rows, "no parity rows: the check would prove nothing"
    assert report.passed, report.to_markdown()
