"""RoPE fusion over the registry: every RoPE-using scheme x parameter case x table mode.

For each exported op graph the fusion must find exactly as many rotations as the float64 eager reference
performs (calls of ``posenc.functional.apply_rope``), and the graph's ONNX Runtime outputs must stay within
the scheme's tolerance of that reference, before and after, for both targets.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from posenc import rope_types
from posenc.errors import PositionError
from posenc.export import FeedShape, check_feed, load_manifest, make_feed
from posenc.graphs import load_model, optimize_model
from posenc.schemes import Placement, specs
from posenc.validate import tolerance_for
from tests.conftest import SMALL
from tests.graphs.artifacts import count_rotations, export_case
from tests.graphs.helpers import GUARD_OPS, assert_close, nodes, op_counts, ort_run, past_guard
from tests.matrix import MatrixCase, exportable, exported, slow_if_same_graph

FEED = FeedShape(batch=2, seq=5, past=0)

ROPE_CASES = [
    MatrixCase(spec.name, mode.value, "float32", "op", "decomposed", case)
    for spec in specs()
    if spec.family == "rope" and exportable(spec.name, "op")
    for mode in sorted(spec.table_modes, key=lambda m: m.value)
    for case in spec.cases
]
# In `make test`: every rotation layout (half, interleaved, partial, interleaved partial) on rope's graphs, every
# other scheme's default case (its own cos/sin source), and ReRoPE's interleaved case (an interleaved rotation inside
# attention, which TensorRT-RTX refuses). A scheme's layout variants combine its cos/sin source with one of rope's
# rotations, both covered apart, and run with `make test-slow`, as do the defaults whose graph is another scheme's
# up to constant values (tests.matrix.SAME_GRAPH: static scalings are rope's graph, ...). The layout variants run in
# `make test` in the dynamic table mode (the graph computes cos/sin before slicing or interleaving them); their
# precomputed graphs (the rotation of the variant over a table Gather, which rope's default case fuses in both modes)
# run with `make test-slow`.
_LAYOUT_VARIANTS_IN_MAKE_TEST = {"rope", "rerope"}


def _param(case: MatrixCase):
    param = slow_if_same_graph(case, case.id.removesuffix("-op-decomposed"))
    variant = case.case != "default"
    if variant and (case.scheme not in _LAYOUT_VARIANTS_IN_MAKE_TEST or case.table_mode != "dynamic"):
        return pytest.param(case, id=param.id, marks=[pytest.mark.slow])
    return param


def _partial(case: MatrixCase) -> bool:
    """Whether the rotation leaves a tail of the head dim alone (a proportional type rotates all of it)."""
    from posenc.schemes import get_spec
    from posenc.schemes.rope import rotary_width

    params = get_spec(case.scheme).resolve(case.params)
    factor = params.get("partial_rotary_factor", 1.0)
    rope_type = next((name for name in rope_types.names() if rope_types.get(name).scheme == case.scheme), "default")
    return rotary_width(rope_type, SMALL.head_dim, factor) < SMALL.head_dim


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
        # ReRoPE's ops attend (a softmax; linear attention has none): TensorRT-RTX cannot build an interleaved
        # RotaryEmbedding there, so it stays decomposed
        attends = bool(nodes(load_model(path), "Softmax"))
        refused = target == "trt" and attends and case.params.get("layout") == "interleaved"
        fused = 0 if refused else expected
        assert counts["fuse_rope"] == fused, (target, counts)
        assert counts["fuse_partial_rope"] == (fused if _partial(case) else 0), (target, counts)
        assert op_counts(model).get("RotaryEmbedding", 0) == fused
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
FP16_FAST = {("precomputed", "default"), ("dynamic", "interleaved_partial")}
"""In make test: each table mode and each layout once (the precomputed graph's position ids and the interleaved
partial rotation's slices); the other two combinations in make test-slow."""


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c,
            id=c.id.removesuffix("-op-decomposed"),
            marks=[] if (c.table_mode, c.case) in FP16_FAST else [pytest.mark.slow],
        )
        for c in FP16_CASES
    ],
)
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
        assert past_guard(node.outputs[0]) in outputs, "the rotation should write the fp16 graph output, no Cast"
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
    kinds = {node.op_type for node in model.graph} - GUARD_OPS  # the guard works on position ids, not on q and k
    assert kinds <= {"RotaryEmbedding", "Identity"}, kinds
    for node in nodes(model, "RotaryEmbedding"):
        assert node.inputs[0].shape.rank() == 3
    after = ort_run(model, feed)
    for name, new, ref in zip(manifest.output_names, after, reference, strict=True):
        tol = tolerance_for("rope", "float32", name)
        assert_close(new, ref.numpy(), tol.atol, tol.rtol, f"op-3d {case} {name}")


@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_xpos_becomes_two_rotary_nodes_with_their_own_caches_and_the_plugin_declines_it(export_cache, mode) -> None:
    """xPos scales q and k apart: each fused RotaryEmbedding carries its own cos/sin (valid ONNX, and TensorRT's
    rotary layer per tensor); the fused graph runs at other shapes; the plugin pass, which applies one cos/sin to
    q and k, leaves them with the reason."""
    from posenc.graphs import model_io
    from posenc.graphs.rope_plugin import rope_to_plugin

    path = export_case(export_cache, MatrixCase("rope_xpos", mode, "float32", "op", "decomposed"))
    manifest = load_manifest(path, verify=False)
    model = load_model(path)
    assert optimize_model(model, "trt").counts["fuse_rope"] == 2
    q_rope, k_rope = nodes(model, "RotaryEmbedding")
    assert q_rope.inputs[1] is not k_rope.inputs[1]
    assert q_rope.inputs[2] is not k_rope.inputs[2]
    if mode == "precomputed":  # the tables are initializers: q's grow with the position where k's shrink
        q_cos, k_cos = (_constant(node.inputs[1]) for node in (q_rope, k_rope))
        assert np.all(np.abs(q_cos[-1]) <= np.abs(k_cos[-1]))
        assert not np.allclose(q_cos, k_cos)
    for shape in (FeedShape(1, 1), FeedShape(3, 17)):
        feed = make_feed(manifest, shape, seed=4)
        _, reference = count_rotations(path, feed)
        for name, got, ref in zip(manifest.output_names, ort_run(model, feed), reference, strict=True):
            tol = tolerance_for("rope_xpos", "float32", name)
            assert_close(got, ref.numpy(), tol.atol, tol.rtol, f"xpos {mode} {name} at {shape.label}")
    limit = 35695 if mode == "dynamic" else SMALL.max_position_embeddings  # where float32 scales end / table rows
    assert manifest.max_positions == limit
    feed = make_feed(manifest, FeedShape(1, 2), seed=5)
    feed["position_ids"][:] = limit
    with pytest.raises(PositionError, match=f"position {limit}, past (position {limit - 1}|the precomputed table)"):
        check_feed(manifest, feed)
    declined: list[str] = []
    assert rope_to_plugin(model, declined=declined) == 0
    assert len(declined) == 2, declined
    assert all("different cos/sin" in reason for reason in declined), declined
    assert len(nodes(model, "RotaryEmbedding")) == 2
    assert model_io.default_opset(model) >= 23
    # `posenc optimize --rope plugin` records the same reasons (the manifest and `posenc inspect` show them)
    plugin = optimize_model(load_model(path), "trt", "plugin")
    (record,) = [record for record in plugin.passes if record.name == "rope_plugin"]
    assert (record.count, list(record.declined)) == (0, declined)


def _constant(value: ir.Value) -> np.ndarray:
    """The constant array behind a (possibly cast) cache input."""
    array = value.const_value.numpy() if value.const_value is not None else None
    assert array is not None, f"{value.name} is not a constant table"
    return array
