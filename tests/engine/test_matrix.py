"""Ahead-of-time TensorRT-RTX engines for the registry: op-level for every scheme x table mode x dtype x
{decomposed, fused}; block-level for a subset (the full block matrix is in scripts/gpu_check.py).

A graph that cannot build must be listed in ``trt_unsupported.json`` with its reason and plan.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc.engine.matrix import MatrixCase, build_case, matrix_cases
from posenc.errors import PosencError
from tests.conftest import SMALL

pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx not installed (`make setup` installs tensorrt-rtx-cu13)")

UNSUPPORTED_FILE = Path(__file__).with_name("trt_unsupported.json")
UNSUPPORTED = {entry["case"]: entry for entry in json.loads(UNSUPPORTED_FILE.read_text())["entries"]}
OP_CASES = matrix_cases(units=("op",))
BLOCK_CASES = matrix_cases(units=("block",), schemes=("rope", "alibi", "t5"))


def test_unsupported_entries_are_tracked_and_refer_to_matrix_graphs() -> None:
    known = {c.id for c in OP_CASES + BLOCK_CASES}
    for case_id, entry in UNSUPPORTED.items():
        assert case_id in known, f"{case_id} in {UNSUPPORTED_FILE.name} is not a graph of the matrix"
        assert entry.get("reason"), f"{case_id} needs the reason it cannot build"
        assert entry.get("plan"), f"{case_id} needs a tracked plan"


def test_the_op_matrix_covers_every_exportable_scheme_both_dtypes_and_graphs() -> None:
    from posenc.engine.matrix import exportable
    from posenc.schemes import specs

    covered = {(c.scheme, c.table_mode, c.dtype, c.graph) for c in OP_CASES}
    for spec in specs():
        if not exportable(spec.name, "op"):
            continue
        for mode in spec.table_modes:
            for dtype in ("float16", "float32"):
                for graph in ("decomposed", "fused"):
                    assert (spec.name, mode.value, dtype, graph) in covered


@pytest.mark.parametrize("case", OP_CASES + BLOCK_CASES, ids=lambda c: c.id)
def test_engine_builds_ahead_of_time(graph_folder, case: MatrixCase) -> None:
    try:
        result = build_case(case, graph_folder, SMALL, targets=["sm89"])
    except PosencError as exc:
        if case.id in UNSUPPORTED:
            return
        pytest.fail(f"{case.id} does not build ({exc}); fix it or list it in {UNSUPPORTED_FILE.name} with a plan")
    assert case.id not in UNSUPPORTED, f"{case.id} builds now: remove it from {UNSUPPORTED_FILE.name}"
    assert result.path.stat().st_size == result.manifest["engine_bytes"] > 0
    layers = result.manifest["layers"]
    if case.graph == "fused" and case.scheme.startswith("rope") and case.unit == "op":
        assert layers.get("ROTARY_EMBEDDING") == 2, layers
    if case.graph == "fused" and case.unit == "block":
        assert layers.get("ATTENTION_OUTPUT") == 1, layers
        assert result.manifest["decomposable_attention"] == (1 if case.dtype == "float32" else 0)
