"""Ahead-of-time TensorRT-RTX engines for the registry: every scheme x table mode, fp32 positional op and
fp16 attention block, each as the decomposed export and the fused (``posenc optimize --target trt``) graph; in make
test the fused graphs of ``tests.matrix.ONE_PER_PLACEMENT``, their decomposed exports once per unit and table mode
(``DECOMPOSED_FAST``) and three more fused blocks (``FUSED_BLOCKS_FAST``), the rest in make test-slow.
The other dtype of each unit is built by scripts/gpu_check.py (``--rtx`` works here too).

A graph that cannot build must be listed in ``trt_unsupported.json`` with its reason and plan.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc.errors import PosencError
from posenc.schemes import Placement, get_spec
from posenc.validate import check_ort_parity
from tests.conftest import SMALL
from tests.matrix import ONE_PER_PLACEMENT, MatrixCase, build_case, matrix_cases, slow_if_same_graph

pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx not installed (`make setup` installs tensorrt-rtx-cu13)")

UNSUPPORTED_FILE = Path(__file__).with_name("trt_unsupported.json")
UNSUPPORTED = {entry["case"]: entry for entry in json.loads(UNSUPPORTED_FILE.read_text())["entries"]}
# fp32 engines of every positional op and fp16 engines of every attention block (the unit people deploy),
# each decomposed and fused: the same graphs the parity matrix validates (shared export cache). A graph that repeats
# another scheme's up to constant values (tests.matrix.SAME_GRAPH) builds in make test-slow only.
OP_CASES = matrix_cases(units=("op",), dtypes=("float32",))
BLOCK_CASES = matrix_cases(units=("block",), dtypes=("float16",))


def test_unsupported_entries_are_tracked_and_refer_to_matrix_graphs() -> None:
    known = {c.id for c in OP_CASES + BLOCK_CASES}
    for case_id, entry in UNSUPPORTED.items():
        assert case_id in known, f"{case_id} in {UNSUPPORTED_FILE.name} is not a graph of the matrix"
        assert entry.get("reason"), f"{case_id} needs the reason it cannot build"
        assert entry.get("plan"), f"{case_id} needs a tracked plan"


def test_the_matrix_covers_every_scheme_mode_in_fp32_and_fp16_both_graphs() -> None:
    from posenc.schemes import specs
    from tests.matrix import exportable

    covered = {(c.scheme, c.table_mode, c.dtype, c.unit, c.graph) for c in OP_CASES + BLOCK_CASES}
    for spec in specs():
        for mode in spec.table_modes:
            for graph in ("decomposed", "fused"):
                if exportable(spec.name, "op"):
                    assert (spec.name, mode.value, "float32", "op", graph) in covered
                assert (spec.name, mode.value, "float16", "block", graph) in covered


FUSED_BLOCKS_FAST = {
    ("rerope", "precomputed"),  # a rotation inside the attention (two score terms): the ATTENTION placement with RoPE
    ("rope_mrope", "dynamic"),  # position ids over three axes: the engine's profile for a [3, B, S] input
    ("deberta", "precomputed"),  # a score bias that reads the cached keys (no GroupQueryAttention prefill)
}
"""Fused fp16 blocks of schemes outside :data:`ONE_PER_PLACEMENT` built in make test: one per engine input or graph
form the representatives do not have. The other schemes' fused blocks (the same engine build over another scheme's
nodes, 2-5 s each) build in make test-slow."""


def test_the_fast_fused_blocks_are_matrix_graphs_outside_the_representatives() -> None:
    blocks = {(c.scheme, c.table_mode) for c in BLOCK_CASES if c.graph == "fused"}
    assert blocks >= FUSED_BLOCKS_FAST
    assert not {scheme for scheme, _ in FUSED_BLOCKS_FAST} & set(ONE_PER_PLACEMENT)


DECOMPOSED_FAST = {("op", "precomputed"), ("block", "dynamic")}
"""The decomposed exports of :data:`ONE_PER_PLACEMENT` built in make test: the fp32 op with its tables as inputs of a
Gather, the fp16 block computing them; each unit and each table mode is built decomposed once (and fused in both
modes). The other two combinations build in make test-slow."""


def _engine_case(case: MatrixCase) -> object:
    """The fused graphs of :data:`ONE_PER_PLACEMENT` (fp32 op and fp16 block, both table modes) and their decomposed
    exports of :data:`DECOMPOSED_FAST` build in make test, and the fused fp16 blocks of :data:`FUSED_BLOCKS_FAST`; the
    rest in make test-slow: for schemes outside :data:`ONE_PER_PLACEMENT`, the decomposed exports (the same ops as the
    representative of their placement), the fused fp32 positional op (its nodes are the fp16 block's positional part)
    and the fused fp16 block (what `posenc optimize --target trt` hands TensorRT: the same build path as the
    representative of its placement)."""
    param = slow_if_same_graph(case)
    fast_block = case.unit == "block" and case.graph == "fused" and (case.scheme, case.table_mode) in FUSED_BLOCKS_FAST
    repeated_decomposed = case.graph == "decomposed" and (case.unit, case.table_mode) not in DECOMPOSED_FAST
    if (case.scheme not in ONE_PER_PLACEMENT and not fast_block) or repeated_decomposed:
        return pytest.param(case, id=case.id, marks=[pytest.mark.slow])
    return param


@pytest.mark.parametrize("case", [_engine_case(case) for case in OP_CASES + BLOCK_CASES])
def test_engine_builds_ahead_of_time(export_cache, case: MatrixCase) -> None:
    try:
        result = build_case(case, export_cache, SMALL, targets=["sm89"], check=check_ort_parity)
    except PosencError as exc:
        if case.id in UNSUPPORTED:
            return
        pytest.fail(f"{case.id} does not build ({exc}); fix it or list it in {UNSUPPORTED_FILE.name} with a plan")
    assert case.id not in UNSUPPORTED, f"{case.id} builds now: remove it from {UNSUPPORTED_FILE.name}"
    assert result.path.stat().st_size == result.manifest.engine_bytes > 0
    layers = result.manifest.layers
    placement = get_spec(case.scheme).placement
    if case.graph == "fused" and placement is Placement.QK:
        assert layers.get("ROTARY_EMBEDDING") == 2, layers  # q and k on TensorRT's native rotary layer
    if case.graph == "fused" and case.unit == "block" and placement is not Placement.ATTENTION:
        assert layers.get("ATTENTION_OUTPUT") == 1, layers
        assert result.manifest.decomposable_attention == (1 if case.dtype == "float32" else 0)
