"""Fusion of blocks with the options of real checkpoints: biases, q/k norm and windows keep RoPE and Attention
fused; ``attn_scale`` and ``logit_softcap`` become the ``scale`` / ``softcap`` attributes where the target takes
them; what cannot be fused exactly (a soft-cap on TensorRT, a soft-capped score bias) stays decomposed."""

from __future__ import annotations

import pytest

from posenc import AttentionBlock
from posenc.export import FeedShape, load_manifest, make_feed
from posenc.graphs import load_model
from posenc.validate import tolerance_for
from tests.features import FUSION_CASES, FeatureCase, exported_feature, optimized_feature
from tests.graphs.artifacts import count_rotations
from tests.graphs.helpers import assert_close, nodes, ort_run


@pytest.mark.parametrize("case", FUSION_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("target", ["ort-cpu", "trt"])
def test_options_fuse_or_stay_decomposed_exactly(export_cache, case: FeatureCase, target: str) -> None:
    source = exported_feature(export_cache, case)
    manifest = load_manifest(source)
    feed = make_feed(manifest, FeedShape(batch=2, seq=5, past=3), seed=4)
    rotations, reference = count_rotations(source, feed)
    path = optimized_feature(export_cache, case, target)
    record = load_manifest(path, verify=False).optimized.counts
    model = load_model(path)
    assert record["fuse_attention"] == case.fused_attention_expected[target]
    interleaved = case.scheme.startswith("rope") and case.params.get("layout") == "interleaved"
    fused = 0 if target == "trt" and interleaved else rotations  # TensorRT-RTX cannot build it in a block
    assert record["fuse_rope"] == fused  # ReRoPE's rotations too
    if case.scheme == "rope" and target == "ort-cpu":  # a q/k norm before RoPE sits between the head split and it
        config = case.config  # (a norm over the whole projection sits before the head split)
        before_rope = config.qk_norm != "none" and not config.qk_norm_after_rope and not config.qk_norm_full_width
        assert record["rope_to_3d"] == (0 if before_rope else rotations)
    attention = nodes(model, "Attention")
    assert len(attention) == record["fuse_attention"]
    scale = AttentionBlock(case.config, case.scheme, case.params, case.table_mode).scheme.score_scale()
    for node in attention:
        rel = 1e-3 if case.dtype == "float16" else 1e-6  # the graph's scale constant has the activation dtype
        assert node.attributes.get_float("scale", 0.0) == pytest.approx(scale, rel=rel)
        softcap = node.attributes.get_float("softcap", 0.0)
        assert softcap == (case.config.logit_softcap or 0.0)
        if case.config.sliding_window is not None or case.config.causal or case.biased:
            assert node.inputs[3] is not None, "the window / causal mask / bias must reach the op"
    if case.config.logit_softcap is not None and not attention:
        assert nodes(model, "Tanh"), "the declined soft-cap stays in the graph"
    after = ort_run(model, feed)
    for name, new, ref in zip(manifest.output_names, after, reference, strict=True):
        tol = tolerance_for(case.scheme, case.dtype, name)
        assert_close(new, ref.numpy(), tol.atol, tol.rtol, f"{case.id} {target} {name}")


def test_a_sink_attention_left_decomposed_is_named_and_kept_exactly(tmp_path) -> None:
    """TensorRT's parser rejects ``softcap``: a soft-capped sink block keeps its decomposed softmax (the sink column
    included), ``inspect`` says why, and the graph still matches the original on ONNX Runtime."""
    from posenc.config import AttentionConfig
    from posenc.export import export_scheme
    from posenc.graphs import optimize_file
    from posenc.graphs.inspect import inspect_model

    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=32,
                             logit_softcap=2.0, attention_sinks=True)  # fmt: skip
    source = export_scheme("rope", tmp_path / "capped_sinks.onnx", config=config).path
    target = tmp_path / "capped_sinks.trt.onnx"
    result = optimize_file(source, target, "trt")
    assert result.counts["fuse_attention"] == 0
    assert "attention sinks: an attention whose softmax has the sink column stayed decomposed" in (
        inspect_model(target).to_text()
    )
    assert {"Tanh", "Softmax", "Concat"} <= {n.op_type for n in load_model(target).graph}
    feed = make_feed(load_manifest(target, verify=False), FeedShape(batch=2, seq=5, past=3), seed=4)
    reference = ort_run(load_model(source), feed)
    for new, ref in zip(ort_run(load_model(target), feed), reference, strict=True):
        assert_close(new, ref, 1e-5, 1e-5, "capped sinks on trt")
