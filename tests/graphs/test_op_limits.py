"""What ONNX Runtime's fused kernels accept (:mod:`posenc.graphs.op_limits`), checked before a pass emits them.

Two kinds of tests. First, each rule is held against the installed ONNX Runtime itself: a lone fused op
(``GroupQueryAttention``, ``Attention``, ``RotaryEmbedding``) is run on the CPU kernel with inputs that keep or break
the rule, and ONNX Runtime must refuse exactly the cases ``op_limits`` gives a reason for. Second, each pass that
emits the op is shown a graph that breaks a rule (it declines, the reason is recorded, and the graph still computes
what it did: the original graph on ONNX Runtime, or the float64 eager block, is the parity reference) and one that
keeps it (it fires, and parity holds).
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from posenc.config import AttentionConfig
from posenc.export import FeedShape, export_scheme
from posenc.graphs import fuse_attention, fuse_rope, optimize_file
from posenc.graphs import op_limits as limits
from posenc.graphs.cache import CacheFacts, gqa_refusal
from posenc.graphs.fold import infer_shapes
from posenc.graphs.inspect import inspect_model
from posenc.graphs.prefill import prefill_over_gqa
from posenc.validate.decode import validate_decode
from tests.graphs.helpers import concat_cache_block, half_rotation_nodes, hand_built, ort_run

F = TensorProto.FLOAT
MS = helper.make_opsetid("com.microsoft", 1)


def _value(shape: list[int | str], dtype: ir.DataType = ir.DataType.FLOAT) -> ir.Value:
    return ir.Value(name="v", shape=ir.Shape(shape), type=ir.TensorType(dtype))


def _ort_refuses(nodes: list[onnx.NodeProto], feed: dict[str, np.ndarray], outputs: int = 1) -> bool:
    """Whether ONNX Runtime CPU refuses to run ``nodes`` on ``feed`` (a graph of those nodes alone)."""
    types = {np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
             np.dtype(np.bool_): TensorProto.BOOL, np.dtype(np.float32): F}  # fmt: skip
    inputs = [helper.make_tensor_value_info(name, types[array.dtype], None) for name, array in feed.items()]
    names = [f"out{i}" for i in range(outputs)]
    graph = helper.make_graph(nodes, "lone", inputs, [helper.make_tensor_value_info(n, F, None) for n in names])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23), MS])
    model.ir_version = 10
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    except Exception:  # onnxruntime's own exception types
        return True
    return False


def _normal(*shape: int) -> np.ndarray:
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# The rules against ONNX Runtime itself
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(3, 3, 15), (4, 2, 12), (4, 2, 8), (4, 2, 24), (3, 2, 16)])
def test_group_query_attention_head_rules_are_onnx_runtimes(heads: int, kv_heads: int, head_dim: int) -> None:
    batch, seq = 2, 4
    q4, kv4 = _value([batch, heads, seq, head_dim]), _value([batch, kv_heads, seq, head_dim])
    reason = limits.gqa_heads(q4, kv4, kv4)
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens", "total"], ["out0", "pk", "pv"],
                            domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads)  # fmt: skip
    feed = {"q": _normal(batch, seq, heads * head_dim), "k": _normal(batch, seq, kv_heads * head_dim),
            "v": _normal(batch, seq, kv_heads * head_dim), "seqlens": np.full(batch, seq - 1, np.int32),
            "total": np.array(seq, np.int32)}  # fmt: skip
    assert _ort_refuses([node], feed) is (reason is not None), reason


@pytest.mark.parametrize(
    ("head_dim", "half", "rows", "slots"),
    [(16, 8, 48, 48), (32, 8, 48, 48), (16, 4, 48, 48), (16, 6, 48, 48), (32, 12, 48, 48), (24, 8, 48, 48),
     (16, 8, 40, 48)],
)  # fmt: skip
def test_group_query_attention_rotation_rules_are_onnx_runtimes(
    head_dim: int, half: int, rows: int, slots: int
) -> None:
    """A rotating GroupQueryAttention over an in-place cache of ``slots`` filled to the last slot."""
    batch, heads, kv_heads, seq = 1, 4, 2, 1
    reason = limits.gqa_rotary(head_dim, half, rows, slots)
    inputs = ["q", "k", "v", "cache_k", "cache_v", "seqlens", "total", "cos", "sin", "positions"]
    node = helper.make_node("GroupQueryAttention", inputs, ["out0", "pk", "pv"], domain="com.microsoft",
                            num_heads=heads, kv_num_heads=kv_heads, do_rotary=1)  # fmt: skip
    feed = {"q": _normal(batch, seq, heads * head_dim), "k": _normal(batch, seq, kv_heads * head_dim),
            "v": _normal(batch, seq, kv_heads * head_dim), "cache_k": _normal(batch, kv_heads, slots, head_dim),
            "cache_v": _normal(batch, kv_heads, slots, head_dim), "seqlens": np.full(batch, slots - 1, np.int32),
            "total": np.array(slots, np.int32), "cos": _normal(rows, half), "sin": _normal(rows, half),
            "positions": np.full((batch, seq), min(rows, slots) - 1, np.int64)}  # fmt: skip
    assert _ort_refuses([node], feed) is (reason is not None), reason


MASKS = [[1, 4, 6, 6], [2, 1, 6, 6], [2, 4, 6, 6], [1, 4, 1, 6], [2, 1, 1, 6], [1, 2, 6, 6], [3, 4, 6, 6], [1, 4, 6, 1]]
"""Score masks for 2 x 4 query heads, 6 queries over 6 keys: whole, broadcast over batch or heads (accepted), and
broadcast along the queries or keys, over the key heads, or of another batch (refused)."""


@pytest.mark.parametrize("shape", MASKS, ids=str)
def test_group_query_attention_bias_rules_are_onnx_runtimes(shape: list[int]) -> None:
    batch, heads, kv_heads, seq, head_dim = 2, 4, 2, 6, 16
    reason = limits.gqa_bias(_value(shape), _value([batch, heads, seq, head_dim]), _value([batch, 2, seq, head_dim]))
    inputs = ["q", "k", "v", "", "", "seqlens", "total", "", "", "", "bias"]
    node = helper.make_node("GroupQueryAttention", inputs, ["out0", "pk", "pv"], domain="com.microsoft",
                            num_heads=heads, kv_num_heads=kv_heads)  # fmt: skip
    feed = {"q": _normal(batch, seq, heads * head_dim), "k": _normal(batch, seq, kv_heads * head_dim),
            "v": _normal(batch, seq, kv_heads * head_dim), "seqlens": np.full(batch, seq - 1, np.int32),
            "total": np.array(seq, np.int32), "bias": _normal(*shape)}  # fmt: skip
    assert _ort_refuses([node], feed) is (reason is not None), reason


@pytest.mark.parametrize("shape", [*MASKS, [6, 6], [1, 6], [4, 6, 6], [2, 6, 6]], ids=str)
def test_attention_mask_rules_are_onnx_runtimes(shape: list[int]) -> None:
    batch, heads, seq, head_dim = 2, 4, 6, 16
    q4, keys = _value([batch, heads, seq, head_dim]), _value([batch, 2, seq, head_dim])
    reason = limits.attention_mask([_value(shape)], q4, keys)
    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["out0"])
    feed = {"q": _normal(batch, heads, seq, head_dim), "k": _normal(batch, 2, seq, head_dim),
            "v": _normal(batch, 2, seq, head_dim), "mask": _normal(*shape)}  # fmt: skip
    assert _ort_refuses([node], feed) is (reason is not None), reason


@pytest.mark.parametrize(
    ("positions", "cache"), [([2, 5], None), ([1, 5], None), ([2, 1], None), (None, [2, 5]), (None, [1, 5])]
)
def test_rotary_input_rules_are_onnx_runtimes(positions: list[int] | None, cache: list[int] | None) -> None:
    x = _value([2, 4, 5, 16])
    if positions is not None:
        reason = limits.rotary_inputs(x, _value([*positions, 8]), _value(positions, ir.DataType.INT64))
        node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "positions"], ["out0"])
        feed = {"x": _normal(2, 4, 5, 16), "cos": _normal(16, 8), "sin": _normal(16, 8),
                "positions": np.zeros(positions, np.int64)}  # fmt: skip
    else:
        assert cache is not None
        reason = limits.rotary_inputs(x, _value([*cache, 8]), None)
        node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["out0"])
        feed = {"x": _normal(2, 4, 5, 16), "cos": _normal(*cache, 8), "sin": _normal(*cache, 8)}
    assert _ort_refuses([node], feed) is (reason is not None), reason


def test_a_dimension_the_graph_leaves_symbolic_is_taken_to_fit_unless_it_is_a_broadcast() -> None:
    q4, keys = _value(["B", 4, "S", 16]), _value(["B", 2, "T", 16])
    assert limits.attention_mask([_value(["B", 1, "S", "T"])], q4, keys) is None
    assert "query length" in (limits.attention_mask([_value(["B", 1, 1, "T"])], q4, keys) or "")
    # a broadcast sum spans the queries when one part does
    assert limits.attention_mask([_value([1, 4, 1, "T"]), _value(["B", 1, "S", "T"])], q4, keys) is None


# --------------------------------------------------------------------------------------------------
# The passes decline what the op would refuse, and keep their graph's results
# --------------------------------------------------------------------------------------------------


def _prefill_feed(heads: int, kv_heads: int, head_dim: int, batch: int = 2, seq: int = 6) -> dict[str, np.ndarray]:
    empty = np.zeros((batch, kv_heads, 0, head_dim), np.float32)
    return {"q": _normal(batch, seq, heads * head_dim), "k": _normal(batch, seq, kv_heads * head_dim),
            "v": _normal(batch, seq, kv_heads * head_dim), "past_key": empty, "past_value": empty,
            "mask": np.tril(np.ones((seq, seq), bool))[None, None].repeat(batch, 0)}  # fmt: skip


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "fires"),
    [(3, 3, 15, False), (4, 2, 12, False), (4, 2, 8, True), (4, 2, 24, True)],
)
def test_prefill_takes_group_query_attention_only_for_head_sizes_it_runs(
    heads: int, kv_heads: int, head_dim: int, fires: bool
) -> None:
    original = concat_cache_block(heads, kv_heads, head_dim)
    model = ir.serde.deserialize_model(original)
    infer_shapes(model)
    declined: list[str] = []
    assert prefill_over_gqa(model, declined) == int(fires)
    assert ("GroupQueryAttention" in {n.op_type for n in model.graph.all_nodes()}) is fires
    if not fires:
        assert declined == [f"prefill_over_gqa: head size {head_dim}: ONNX Runtime's GroupQueryAttention needs a "
                            f"multiple of 8 (group_query_attention_helper.h)"]  # fmt: skip
    feed = _prefill_feed(heads, kv_heads, head_dim)  # a first prompt: the fused branch when it fires
    want = ort_run(original.SerializeToString(), feed)
    for name, got, expected in zip(("out", "present_key", "present_value"), ort_run(model, feed), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=name)


def _with_score_bias(model: onnx.ModelProto, bias_queries: int | str) -> onnx.ModelProto:
    """``model`` (concat_cache_block) attending under ``bias + Where(mask, 0, -inf)``, the bias an input
    ``[1, H, bias_queries, T]``."""
    (attention,) = [node for node in model.graph.node if node.op_type == "Attention"]
    attention.input[3] = "scores_mask"
    model.graph.initializer.extend(
        [numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
         numpy_helper.from_array(np.full(1, -np.inf, np.float32), "ninf")]
    )  # fmt: skip
    model.graph.node.insert(0, helper.make_node("Where", ["mask", "zero", "ninf"], ["hidden"]))
    model.graph.node.insert(1, helper.make_node("Add", ["bias", "hidden"], ["scores_mask"]))
    model.graph.input.append(helper.make_tensor_value_info("bias", F, [1, 4, bias_queries, "T"]))
    return model


@pytest.mark.parametrize(("bias_queries", "alone"), [("S", True), (1, False)])
def test_prefill_gives_group_query_attention_the_score_bias_alone_only_when_it_spans_the_queries(
    bias_queries: int | str, alone: bool
) -> None:
    """A bias ``[1, H, 1, T]`` (one row for every query) is valid for the block's ``bias + Where(mask, 0, -inf)``
    and refused as ``attention_bias``: the fused branch then gets the whole mask, whose sum spans the queries."""
    original = _with_score_bias(concat_cache_block(), bias_queries)
    model = ir.serde.deserialize_model(original)
    infer_shapes(model)
    declined: list[str] = []
    assert prefill_over_gqa(model, declined) == 1
    assert declined == []
    (gqa,) = [node for node in model.graph.all_nodes() if node.op_type == "GroupQueryAttention"]
    given = gqa.inputs[10]
    assert given is not None
    assert (given.name == "bias") is alone  # else the whole mask: ONNX Runtime would refuse the bias alone
    feed = {**_prefill_feed(4, 2, 16), "bias": _normal(1, 4, 6 if alone else 1, 6)}
    want = ort_run(original.SerializeToString(), feed)
    for name, got, expected in zip(("out", "present_key", "present_value"), ort_run(model, feed), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=name)


def test_an_odd_head_size_keeps_the_attention_path_with_the_reason_in_inspect(tmp_path: Path) -> None:
    """Marian's 3 heads of 15 as a posenc block: optimize's own parity check runs the result on ONNX Runtime."""
    from posenc.validate import check_ort_parity

    config = AttentionConfig(hidden_size=45, num_heads=3, num_kv_heads=3, max_position_embeddings=48)
    source = export_scheme("sinusoidal", tmp_path / "odd.onnx", config=config).path
    target = tmp_path / "odd.ort-cpu.onnx"
    result = optimize_file(source, target, "ort-cpu", check=check_ort_parity)
    assert result.counts["prefill_over_gqa"] == 0
    assert result.counts["fuse_attention"] == 1
    assert result.parity is not None
    text = inspect_model(target).to_text()
    assert (
        "left decomposed: prefill_over_gqa: head size 15: ONNX Runtime's GroupQueryAttention needs a multiple of 8"
        in text
    )


def _attention_graph(mask_queries: int | str) -> ir.Model:
    """Exported-style softmax attention ``Softmax(Where(Not(mask), -inf, q·kᵀ·s))·v``, the mask ``[B, 1, m, T]``."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scores"]),
        helper.make_node("Not", ["mask"], ["hidden"]),
        helper.make_node("Where", ["hidden", "ninf", "scores"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["out"]),
    ]
    inputs = [helper.make_tensor_value_info(n, F, ["B", 4, s, 16]) for n, s in (("q", "S"), ("k", "T"), ("v", "T"))]
    inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, ["B", 1, mask_queries, "T"]))
    consts = [numpy_helper.from_array(np.array(0.25, np.float32), "scale"),
              numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf")]  # fmt: skip
    return hand_built(nodes, inputs, [helper.make_tensor_value_info("out", F, None)], consts)


@pytest.mark.parametrize(("mask_queries", "fires"), [("S", True), (1, False)])
def test_attention_fusion_declines_a_mask_broadcast_along_the_queries(mask_queries: int | str, fires: bool) -> None:
    """A key-padding mask ``[B, 1, 1, T]`` (a model from elsewhere) is valid ONNX for the decomposed attention, and
    ONNX Runtime's ``Attention`` refuses it."""
    model = _attention_graph(mask_queries)
    rng = np.random.default_rng(3)
    mask = rng.random((2, 1, 5 if fires else 1, 7)) > 0.3
    mask[..., 0] = True  # every query sees a key
    feed = {"q": _normal(2, 4, 5, 16), "k": _normal(2, 4, 7, 16), "v": _normal(2, 4, 7, 16), "mask": mask}
    before = ort_run(model, feed)[0]
    declined: list[str] = []
    assert fuse_attention(model, declined=declined) == int(fires)
    ops = collections.Counter(n.op_type for n in model.graph.all_nodes())
    assert (ops["Attention"] == 1) is fires
    assert (ops["Softmax"] == 1) is not fires
    if not fires:
        assert declined == ["attention: Attention's attn_mask must span the query length (ONNX Runtime does not "
                            "broadcast it); this mask has 1 along it (shape [?, 1, 1, ?])"]  # fmt: skip
    np.testing.assert_allclose(ort_run(model, feed)[0], before, rtol=1e-5, atol=1e-6)


def _rotation_graph(position_batch: int | str) -> ir.Model:
    """Exported-style half rotation of ``x [B, 2, S, 8]`` by table rows gathered at ``pos [b, S]``."""
    cos, sin = (
        np.cos(np.arange(16)[:, None] * 0.1 * np.arange(1, 5)),
        np.sin(np.arange(16)[:, None] * 0.1 * np.arange(1, 5)),
    )
    ints = {"zero": [0], "h": [4], "end": [8], "ax": [-1], "one": [1]}
    nodes = half_rotation_nodes()
    inputs = [helper.make_tensor_value_info("x", F, ["B", 2, "S", 8]),
              helper.make_tensor_value_info("pos", TensorProto.INT64, [position_batch, "S"])]  # fmt: skip
    consts = [
        numpy_helper.from_array(cos.astype(np.float32), "cos"),
        numpy_helper.from_array(sin.astype(np.float32), "sin"),
    ]
    consts += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    return hand_built(nodes, inputs, [helper.make_tensor_value_info("y", F, None)], consts)


@pytest.mark.parametrize(("position_batch", "fires"), [("B", True), (1, False)])
def test_rotary_fusion_declines_positions_shared_by_the_batch(position_batch: int | str, fires: bool) -> None:
    """Position ids ``[1, S]`` broadcast over a batch of 2 in the decomposed rotation; ``RotaryEmbedding`` needs
    ``[B, S]``."""
    model = _rotation_graph(position_batch)
    feed = {"x": _normal(2, 2, 5, 8), "pos": np.tile(np.arange(3, 8), (2 if fires else 1, 1)).astype(np.int64)}
    before = ort_run(model, feed)[0]
    declined: list[str] = []
    assert fuse_rope(model, declined=declined) == int(fires)
    assert bool(declined) is not fires
    if not fires:
        assert declined[0].startswith("fuse_rope: RotaryEmbedding needs position_ids of the input's batch")
    np.testing.assert_allclose(ort_run(model, feed)[0], before, rtol=1e-5, atol=1e-6)


SHORT = [FeedShape(2, 5, 0)] + [FeedShape(2, 1, 5 + i) for i in range(6)] + [FeedShape(2, 1, 11, start=47)]
"""A batched prompt, single steps, a jump to the last position (what the in-place GroupQueryAttention serves)."""


@pytest.mark.parametrize(
    ("hidden", "params", "gqa"),
    [(48, {}, False), (96, {}, True), (64, {"partial_rotary_factor": 0.5}, True)],
    ids=["head-12", "head-24", "partial-rotary-8-of-16"],
)
def test_in_place_group_query_attention_takes_only_what_it_runs(
    tmp_path: Path, hidden: int, params: dict[str, float], gqa: bool
) -> None:
    """ort-cuda, run here on ONNX Runtime's CPU kernel: heads of 12 keep the Attention path (a multiple of 8 is
    needed), heads of 24 take GroupQueryAttention with the rotation left before it (a rotating op needs a multiple
    of 16), and so does a rotation of 8 of 16 features (its r/2 = 4 is not a multiple of 8). (Heads of 16 with the
    whole head rotated fuse the rotation: tests/graphs/test_cache_passes.py.)"""
    config = AttentionConfig(hidden_size=hidden, num_heads=4, num_kv_heads=2, max_position_embeddings=48)
    source = export_scheme("rope", tmp_path / "b.onnx", kv_cache="inplace", config=config, params=params).path
    target = tmp_path / "b.ort-cuda.onnx"
    result = optimize_file(source, target, "ort-cuda")
    assert result.counts["gqa_over_cache"] == int(gqa)
    graph = onnx.load(str(target)).graph
    ops = collections.Counter(n.op_type for n in graph.node)
    assert ops["GroupQueryAttention"] == int(gqa)
    assert ops["RotaryEmbedding"] == 2, "the rotation stays before the op"
    if not gqa:
        assert (
            "head size 12: ONNX Runtime's GroupQueryAttention needs a multiple of 8" in inspect_model(target).to_text()
        )
    report = validate_decode([source, target], SHORT)
    assert report.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]


def test_the_manifest_refusal_names_onnx_runtimes_head_rule() -> None:
    assert "multiple of 8" in (gqa_refusal(CacheFacts(in_place=True, head_dim=12)) or "")
    assert "at most 256" in (gqa_refusal(CacheFacts(in_place=True, head_dim=264)) or "")
    assert gqa_refusal(CacheFacts(in_place=True, head_dim=24)) is None
