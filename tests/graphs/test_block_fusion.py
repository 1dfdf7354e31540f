"""Attention blocks: RoPE before the head transpose (ORT CPU), attention -> Attention with the bias as mask.

Every score-placement scheme of the registry (ALiBi, T5, DeBERTa, Transformer-XL, TUPE, ...) must reach the
``Attention`` op with its bias as additive mask, and keep parity with the float64 eager block.
"""

from __future__ import annotations

import pytest

from posenc.export import FeedShape, load_manifest, make_feed
from posenc.graphs import load_model, optimize_model
from posenc.graphs.optimize import TRT_INTERLEAVED_ROPE_REASON
from posenc.schemes import Placement, specs
from posenc.validate import tolerance_for
from tests.graphs.artifacts import count_rotations, export_case
from tests.graphs.helpers import assert_close, nodes, ort_run
from tests.matrix import MatrixCase

SCORE_SCHEMES = [spec.name for spec in specs() if spec.placement is Placement.SCORE]
KEYED_BIAS = {"deberta", "transformer_xl"}  # their score bias reads the cached keys: no GroupQueryAttention prefill
PROJECTED_TABLES = {"transformer_xl": 1, "tupe": 2}  # R W_r; P U_q and P U_k
PREFILL_KEYS_REASON = "prefill_over_gqa: the cached keys or values feed more than the attention"
# fp16 blocks come from the shared export cache (the parity and engine matrices use the same files);
# one fp32 block with interleaved partial RoPE covers the other dtype and layout.
BLOCKS = [
    MatrixCase("rope", "precomputed", "float16", "block"),
    MatrixCase("rope", "dynamic", "float32", "block", case="interleaved_partial"),
    MatrixCase("alibi", "dynamic", "float16", "block"),
    *(MatrixCase(name, "precomputed", "float16", "block") for name in SCORE_SCHEMES),
]


@pytest.mark.parametrize("case", BLOCKS, ids=lambda c: c.id.removesuffix("-decomposed"))
@pytest.mark.parametrize("target", ["ort-cpu", "trt"])
def test_block_fuses_rope_and_attention(export_cache, case: MatrixCase, target: str) -> None:
    path = export_case(export_cache, case)
    manifest = load_manifest(path, verify=False)
    feed = make_feed(manifest, FeedShape(batch=2, seq=5, past=3), seed=4)
    rotations, reference = count_rotations(path, feed)
    model = load_model(path)
    result = optimize_model(model, target)
    counts = result.counts
    declined = [reason for record in result.passes for reason in record.declined]
    if target == "trt" and case.params.get("layout") == "interleaved":  # TensorRT-RTX cannot build it in a block
        rotations = 0
        assert declined == [TRT_INTERLEAVED_ROPE_REASON]
    elif target == "ort-cpu" and case.scheme in KEYED_BIAS:
        assert [reason[: len(PREFILL_KEYS_REASON)] for reason in declined] == [PREFILL_KEYS_REASON]
    else:
        assert not declined
    assert counts["fuse_rope"] == rotations
    assert counts["fuse_attention"] == 1
    prefill = target == "ort-cpu" and case.scheme not in KEYED_BIAS
    assert counts.get("prefill_over_gqa", 0) == int(prefill)
    (attention,) = nodes(model, "Attention")  # (in the If's present branch when prefill_over_gqa took it)
    heads = {value.shape[1] for value in attention.inputs[:3]}
    assert heads == {manifest.attention["num_heads"], manifest.attention["num_kv_heads"]}, "GQA heads unrepeated"
    assert attention.inputs[3] is not None, "causal mask (and the bias) must reach the op as attn_mask"
    if manifest.placement == "score":
        assert attention.inputs[3].dtype == attention.inputs[0].dtype, "additive mask in the activation dtype"
    if target == "trt":
        assert "softmax_precision" not in attention.attributes, "TensorRT's parser rejects softmax_precision"
    for node in nodes(model, "RotaryEmbedding"):
        if target == "ort-cpu":
            assert node.inputs[0].shape.rank() == 3
            assert node.attributes.get_int("num_heads", 0) > 0
        else:
            assert node.inputs[0].shape.rank() == 4
    assert counts.get("rope_to_3d", 0) == (rotations if target == "ort-cpu" else 0)
    assert not nodes(model, "GatherND"), "bias-table lookups are Gathers (gathernd_to_gather)"
    if case.scheme in PROJECTED_TABLES:  # their position tables are projected once, in the graph's constants
        assert counts["project_tables"] == PROJECTED_TABLES[case.scheme]
    if target == "ort-cpu":  # q, k and v read the same hidden states: one product, split
        assert counts["fuse_projections"] >= 2
        assert nodes(model, "Split")
    if prefill:  # the first prompt goes through GroupQueryAttention, a score bias as its attention_bias
        (gqa,) = nodes(model, "GroupQueryAttention")
        assert (len(gqa.inputs) == 11) == (manifest.placement == "score")
        assert not [n for n in model.graph if n.op_type == "Attention"], "the present path is the If's other branch"
        assert gqa.inputs[0].shape.rank() == 3, "q, k, v in the projection layout [B, S, h*D]"
    feeds = [(feed, reference)]
    if prefill:
        fresh = make_feed(manifest, FeedShape(batch=2, seq=19, past=0), seed=5)
        feeds.append((fresh, count_rotations(path, fresh)[1]))
    for inputs, expected in feeds:
        after = ort_run(model, inputs)
        for name, new, ref in zip(manifest.output_names, after, expected, strict=True):
            tol = tolerance_for(case.scheme, case.dtype, name)
            assert_close(new, ref.numpy(), tol.atol, tol.rtol, f"{case.id} {target} {name}")


def test_plugin_mode_replaces_the_rotation_pair(export_cache, tmp_path) -> None:
    pytest.importorskip("posenc.graphs.rope_plugin", reason="the RoPE plugin pass is not available")
    from posenc.graphs import optimize_file
    from posenc.validate import check_ort_parity

    source = export_case(export_cache, BLOCKS[0])
    result = optimize_file(source, tmp_path / "plugin.onnx", "trt", "plugin", check=check_ort_parity)
    assert result.counts["fuse_rope"] == 2
    assert result.counts["rope_plugin"] == 1
    assert not nodes(result.model, "RotaryEmbedding")
    assert result.parity is not None, "the plugin's ONNX Runtime twin lets parity be checked"


def test_interleaved_rope_block_builds_for_tensorrt(export_cache, tmp_path) -> None:
    """The block TensorRT-RTX failed to build with a fused interleaved RotaryEmbedding (Myelin error) builds with
    the rotation decomposed and the attention fused."""
    pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx not installed")
    from posenc.engine import build_engine
    from posenc.graphs import optimize_file

    source = export_case(export_cache, BLOCKS[1])
    fused = optimize_file(source, tmp_path / "interleaved.trt.onnx", "trt")
    result = build_engine(fused.path, tmp_path / "interleaved.engine", targets=["sm89"])
    assert "ROTARY_EMBEDDING" not in result.manifest.layers
    assert result.manifest.layers.get("ATTENTION_OUTPUT") == 1
    assert result.manifest.engine_bytes > 0
