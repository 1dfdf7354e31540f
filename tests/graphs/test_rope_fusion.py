"""RoPE fusion over the registry: every RoPE-using scheme x parameter case x table mode.

For each exported op graph the fusion must find exactly as many rotations as the float64 eager reference
performs (calls of ``posenc.functional.apply_rope``), and the graph's ONNX Runtime outputs must stay within
the scheme's tolerance of that reference, before and after, for both targets.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from posenc.export import FeedShape, load_manifest, make_feed
from posenc.graphs import load_model, optimize_model
from posenc.schemes import Placement, specs
from posenc.validate import tolerance_for
from tests.conftest import SMALL
from tests.graphs.artifacts import count_rotations, export_case
from tests.graphs.helpers import assert_close, nodes, op_counts, ort_run
from tests.matrix import MatrixCase, exportable, exported

FEED = FeedShape(batch=2, seq=5, past=0)

ROPE_CASES = [
    MatrixCase(spec.name, mode.value, "float32", "op", "decomposed", case)
    for spec in specs()
    if spec.family == "rope" and exportable(spec.name, "op")
    for mode in sorted(spec.table_modes, key=lambda m: m.value)
    for case in spec.cases
]
# Static scalings (linear, ntk, yarn, llama3, truncation) change table values, not the graph: their default
# case runs in `make test`; their layout/partial variants repeat rope's graphs and run with `make test-slow`.
_SAME_GRAPH_AS_ROPE = {"rope_linear", "rope_ntk", "rope_yarn", "rope_llama3", "rope_truncation"}


def _param(case: MatrixCase):  # type: ignore[no-untyped-def]
    slow = case.scheme in _SAME_GRAPH_AS_ROPE and case.case != "default"
    return pytest.param(case, id=case.id.removesuffix("-op-decomposed"), marks=[pytest.mark.slow] if slow else [])


def _partial(case: MatrixCase) -> bool:
    from posenc.schemes import get_spec

    spec = get_spec(case.scheme)
    factor = spec.resolve(case.params).get("partial_rotary_factor", 1.0)
    return factor < 1.0


def test_every_rope_scheme_and_case_is_in_the_matrix() -> None:
    names = {c.scheme for c in ROPE_CASES}
    qk = {s.name for s in specs() if s.placement is Placement.QK}
    assert qk <= names
    assert {"rerope", "leaky_rerope", "rope_linear_attention"} <= names
    assert any(c.case == "interleaved_partial" for c in ROPE_CASES)


@pytest.mark.parametrize("case", [_param(case) for case in ROPE_CASES])
def test_fusion_finds_every_rotation_and_keeps_parity(export_cache, case: MatrixCase) -> None:
    path = export_case(export_cache, case)
    manifest = load_manifest(path, verify=False)
    feed = make_feed(manifest, FEED, seed=1)
    expected, reference = count_rotations(path, feed)
    assert expected >= 2, "the eager reference should rotate q and k at least"
    names = manifest.output_names
    before = ort_run(path, feed)
    for target in ("ort-cpu", "trt"):
        model = load_model(path)
        result = optimize_model(model, target)
        counts = result.counts
        assert counts["fuse_rope"] == expected, (target, counts)
        assert counts["fuse_partial_rope"] == (expected if _partial(case) else 0), (target, counts)
        assert op_counts(model)["RotaryEmbedding"] == expected
        if manifest.placement == "qk":
            assert not nodes(model, "Slice"), "a decomposed rotation is left in the graph"
        for node in nodes(model, "RotaryEmbedding"):
            layout = 1 if case.params.get("layout") == "interleaved" else 0
            assert node.attributes.get_int("interleaved", 0) == layout
        after = ort_run(model, feed)
        for name, old, new, ref in zip(names, before, after, reference, strict=True):
            tol = tolerance_for(case.scheme, case.dtype, name)
            want = ref.numpy()
            assert_close(old, want, tol.atol, tol.rtol, f"{case.id} {name} decomposed")
            assert_close(new, want, tol.atol, tol.rtol, f"{case.id} {name} fused for {target}")


FP16_CASES = [
    MatrixCase("rope", mode, "float16", "op", "decomposed", case)
    for mode in ("precomputed", "dynamic")
    for case in ("default", "interleaved_partial")
]


@pytest.mark.parametrize("case", FP16_CASES, ids=lambda c: c.id.removesuffix("-op-decomposed"))
def test_tensorrt_layout_rotates_in_the_activation_dtype(export_cache, case: MatrixCase) -> None:
    path = export_case(export_cache, case)
    manifest = load_manifest(path, verify=False)
    feed = make_feed(manifest, FEED, seed=2)
    expected, reference = count_rotations(path, feed)
    model = load_model(path)
    counts = optimize_model(model, "trt").counts
    assert counts["rope_for_tensorrt"] == expected
    outputs = set(model.graph.outputs)
    for node in nodes(model, "RotaryEmbedding"):
        assert node.inputs[0].producer() is None, "the rotation should read the fp16 graph input, no Cast"
        assert node.outputs[0] in outputs, "the rotation should write the fp16 graph output, no Cast"
        dtypes = {value.dtype for value in node.inputs[:3]}
        assert dtypes == {ir.DataType.FLOAT16}, "TensorRT needs caches in the activation dtype"
        if case.table_mode == "precomputed":
            assert node.inputs[3].dtype == ir.DataType.INT64
            assert node.inputs[3].shape.rank() == 2
    after = ort_run(model, feed)
    for name, new, ref in zip(manifest.output_names, after, reference, strict=True):
        tol = tolerance_for(case.scheme, case.dtype, name)
        assert_close(new, ref.numpy(), tol.atol, tol.rtol, f"{case.id} {name}")
    # ONNX Runtime CPU keeps the float32 rotation between the exported casts
    model = load_model(path)
    assert optimize_model(model, "ort-cpu").counts["fuse_rope"] == expected
    for node in nodes(model, "RotaryEmbedding"):
        assert node.inputs[0].dtype == ir.DataType.FLOAT


def test_fused_graph_runs_at_other_shapes(export_cache) -> None:
    case = MatrixCase("rope", "dynamic", "float32", "op", "decomposed", "interleaved_partial")
    path = export_case(export_cache, case)
    manifest = load_manifest(path, verify=False)
    model = load_model(path)
    optimize_model(model, "ort-cpu")
    for shape in (FeedShape(1, 1), FeedShape(3, 17), FeedShape(1, 64)):
        feed = make_feed(manifest, shape, seed=3)
        before, after = ort_run(path, feed), ort_run(model, feed)
        for old, new in zip(before, after, strict=True):
            np.testing.assert_allclose(new, old, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["default", "interleaved_partial"])
def test_projection_layout_op_becomes_two_rotary_nodes_for_ort_cpu(export_cache, case: str) -> None:
    """RoPE on [B, S, H*D] (unit op-3d): the head split/merge around the rotation must vanish entirely.

    ONNX Runtime runs a leftover Reshape pair as a full copy of q and k, doubling the op's traffic.
    """
    path = exported(MatrixCase("rope", "precomputed", "float32", "op-3d", case=case), export_cache, SMALL)
    manifest = load_manifest(path, verify=False)
    feed = make_feed(manifest, FEED, seed=3)
    expected, reference = count_rotations(path, feed)
    model = load_model(path)
    counts = optimize_model(model, "ort-cpu").counts
    assert counts["fuse_rope"] + counts["fuse_partial_rope"] >= expected == 2
    kinds = {node.op_type for node in model.graph}
    assert kinds <= {"RotaryEmbedding", "Identity"}, kinds
    for node in nodes(model, "RotaryEmbedding"):
        assert node.inputs[0].shape.rank() == 3
    after = ort_run(model, feed)
    for name, new, ref in zip(manifest.output_names, after, reference, strict=True):
        tol = tolerance_for("rope", "float32", name)
        assert_close(new, ref.numpy(), tol.atol, tol.rtol, f"op-3d {case} {name}")
