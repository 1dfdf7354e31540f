"""``prefill_over_gqa`` (ort-cpu, concatenated cache): a first prompt through contrib ``GroupQueryAttention``, every
other call through the block's own ``Attention``.

Which branch a call takes is read from the graph itself (the ``If`` condition exposed as an output), so each parity
check below is known to exercise the branch it names. Parity reference: the float64 eager block
(:func:`posenc.export.load_eager`), stepped through its cache by :func:`posenc.validate.decode.validate_decode`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch

from posenc.config import AttentionConfig
from posenc.export import FeedShape, export_scheme, load_eager, load_manifest, make_feed, reference_inputs
from posenc.graphs import optimize_file
from posenc.graphs.fold import infer_shapes
from posenc.graphs.inspect import inspect_model
from posenc.graphs.model_io import model_to_proto
from posenc.graphs.prefill import prefill_over_gqa
from posenc.validate import tolerance_for
from posenc.validate.decode import validate_decode
from tests.graphs.helpers import assert_close, concat_cache_block, ort_run

CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=48)


def _optimized(folder: Path, scheme: str, **config: object) -> tuple[Path, Path]:
    geometry = AttentionConfig(**{**CONFIG.__dict__, **config})
    source = export_scheme(scheme, folder / f"{scheme}.onnx", config=geometry).path
    target = folder / f"{scheme}.ort-cpu.onnx"
    optimize_file(source, target, "ort-cpu")
    return source, target


def _with_condition(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (changed in place) with its prefill ``If``'s condition as a last output (True: the
    GroupQueryAttention branch)."""
    (branch,) = [node for node in model.graph.node if node.op_type == "If"]
    model.graph.output.append(onnx.helper.make_tensor_value_info(branch.input[0], onnx.TensorProto.BOOL, None))
    return model


def _takes_gqa(target: Path, feed: dict[str, np.ndarray]) -> bool:
    """The value of the prefill ``If``'s condition for ``feed``."""
    probe = _with_condition(onnx.load(str(target)))
    return bool(np.asarray(ort_run(probe.SerializeToString(), feed)[-1]).all())


def _eager(source: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    module, manifest = load_eager(source)
    with torch.no_grad():
        outputs = module(*reference_inputs(manifest, feed, torch.float64))
    return [out.numpy() for out in outputs]


def _assert_matches_eager(
    source: Path, target: Path, feed: dict[str, np.ndarray], what: str, scheme: str = "rope"
) -> None:
    manifest_outputs = ("out", "present_key", "present_value")
    for name, got, want in zip(manifest_outputs, ort_run(target, feed), _eager(source, feed), strict=True):
        tol = tolerance_for(scheme, "float32", name)
        assert_close(got, want, tol.atol, tol.rtol, f"{what} {name}")


def _reversed(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**feed, "position_ids": np.ascontiguousarray(feed["position_ids"][:, ::-1])}


@pytest.fixture(scope="module")
def rope(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _optimized(tmp_path_factory.mktemp("prefill"), "rope")


@pytest.mark.parametrize(
    ("shape", "reverse", "gqa"),
    [
        (FeedShape(2, 19, 0), False, True),  # a first prompt
        (FeedShape(1, 1, 0), False, True),  # one token, nothing cached
        (FeedShape(2, 6, 0, start=7), False, True),  # positions 7.. with nothing cached: still the causal triangle
        (FeedShape(2, 5, 3), False, False),  # a cache: the concat path
        (FeedShape(2, 1, 30), False, False),  # a decode step
        (FeedShape(2, 19, 0), True, False),  # positions out of order: the mask is not the triangle
    ],
    ids=["prompt", "one-token", "offset", "cached", "decode", "reversed"],
)
def test_the_branch_taken_matches_the_eager_block(rope, shape: FeedShape, reverse: bool, gqa: bool) -> None:
    source, target = rope
    feed = make_feed(load_manifest(target, verify=False), shape, seed=3)
    if reverse:
        feed = _reversed(feed)
    assert _takes_gqa(target, feed) is gqa
    _assert_matches_eager(source, target, feed, f"{shape} reversed={reverse}")


def test_a_prompt_then_decode_steps_carry_the_cache_across_both_branches(rope) -> None:
    source, target = rope
    assert "GroupQueryAttention" in {n.op_type for g in _graphs(target) for n in g.node}
    steps = [FeedShape(2, 20, 0)] + [FeedShape(2, 1, 20 + i) for i in range(8)] + [FeedShape(2, 1, 46, start=46)]
    report = validate_decode([source, target], steps)
    assert report.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]


def _graphs(target: Path) -> list[onnx.GraphProto]:
    model = onnx.load(str(target))
    branches = [a.g for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
    return [model.graph, *branches]


def test_a_window_shorter_than_the_prompt_keeps_the_attention_path(tmp_path: Path) -> None:
    source, target = _optimized(tmp_path, "rope", sliding_window=8)
    manifest = load_manifest(target, verify=False)
    long, short = make_feed(manifest, FeedShape(1, 19, 0), seed=1), make_feed(manifest, FeedShape(1, 8, 0), seed=2)
    assert not _takes_gqa(target, long)  # the window hides keys the triangle shows
    assert _takes_gqa(target, short)  # the whole prompt fits in the window: the mask is the triangle
    for feed in (long, short):
        _assert_matches_eager(source, target, feed, "sliding window")


def test_a_block_without_a_causal_mask_is_left_alone(tmp_path: Path) -> None:
    source, target = _optimized(tmp_path, "rope", causal=False)
    assert "If" not in {n.op_type for n in onnx.load(str(target)).graph.node}
    feed = make_feed(load_manifest(target, verify=False), FeedShape(2, 12, 0), seed=4)
    _assert_matches_eager(source, target, feed, "non-causal")


def test_a_bias_that_reads_the_keys_is_declined_with_the_reason_in_inspect(tmp_path: Path) -> None:
    _, target = _optimized(tmp_path, "deberta")
    text = inspect_model(target).to_text()
    assert "prefill_over_gqa: the cached keys or values feed more than the attention" in text
    assert "GroupQueryAttention" not in {n.op_type for g in _graphs(target) for n in g.node}


def test_a_score_bias_goes_in_alone_and_the_masked_sum_is_built_only_for_the_present_path(tmp_path: Path) -> None:
    source, target = _optimized(tmp_path, "alibi")
    model = onnx.load(str(target))
    (branch,) = [node for node in model.graph.node if node.op_type == "If"]
    branches = {attribute.name: attribute.g for attribute in branch.attribute}
    then, other = branches["then_branch"], branches["else_branch"]
    (gqa,) = [node for node in then.node if node.op_type == "GroupQueryAttention"]
    producers = {out: node.op_type for node in model.graph.node for out in node.output}
    assert producers[gqa.input[10]] != "Add", "the raw bias, not bias + Where(mask, 0, -inf)"
    assert {"Where", "Add", "Attention"} <= {node.op_type for node in other.node}
    manifest = load_manifest(target, verify=False)
    for shape, fresh in ((FeedShape(2, 19, 0), True), (FeedShape(2, 5, 3), False)):
        feed = make_feed(manifest, shape, seed=6)
        assert _takes_gqa(target, feed) is fresh
        _assert_matches_eager(source, target, feed, f"alibi {shape}", scheme="alibi")


def test_attention_sinks_go_into_group_query_attention_as_head_sink(tmp_path: Path) -> None:
    """The sink fusion's zero key and sink column become GroupQueryAttention's head_sink (the block's own sinks) for a
    first prompt; cached calls keep the Attention with the zero key; both match the float64 eager block."""
    source, target = _optimized(tmp_path, "rope", attention_sinks=True)
    model = onnx.load(str(target))
    (branch,) = [node for node in model.graph.node if node.op_type == "If"]
    then = {attribute.name: attribute.g for attribute in branch.attribute}["then_branch"]
    (gqa,) = [node for node in then.node if node.op_type == "GroupQueryAttention"]
    constants = {out: node for node in [*model.graph.node, *then.node] for out in node.output}
    head_sink = onnx.numpy_helper.to_array(constants[gqa.input[11]].attribute[0].t)
    module, _ = load_eager(source)
    np.testing.assert_allclose(head_sink, module.sinks.detach().numpy(), rtol=1e-6)
    assert np.abs(head_sink).max() > 0.1  # sinks that show
    manifest = load_manifest(target, verify=False)
    for shape, fresh in ((FeedShape(2, 9, 0), True), (FeedShape(2, 5, 3), False), (FeedShape(1, 1, 20), False)):
        feed = make_feed(manifest, shape, seed=8)
        assert _takes_gqa(target, feed) is fresh
        _assert_matches_eager(source, target, feed, f"sinks {shape}")
    steps = [FeedShape(2, 12, 0)] + [FeedShape(2, 1, 12 + i) for i in range(3)]
    report = validate_decode([source, target], steps)
    assert report.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]


def test_attention_sinks_beside_a_score_bias_are_declined_with_the_reason(tmp_path: Path) -> None:
    source, target = _optimized(tmp_path, "alibi", attention_sinks=True)
    assert "attention sinks: the mask is not the causal mask beside constant sinks" in inspect_model(target).to_text()
    assert "GroupQueryAttention" not in {n.op_type for g in _graphs(target) for n in g.node}
    assert "Attention" in {n.op_type for n in onnx.load(str(target)).graph.node}  # the sink as a zero key, fused
    feed = make_feed(load_manifest(target, verify=False), FeedShape(2, 9, 0), seed=9)
    _assert_matches_eager(source, target, feed, "alibi sinks", scheme="alibi")


def test_a_mask_given_as_input_takes_the_fused_branch_only_when_it_is_the_causal_triangle() -> None:
    original = concat_cache_block()
    model = ir.serde.deserialize_model(original)
    infer_shapes(model)
    assert prefill_over_gqa(model) == 1
    probe = _with_condition(model_to_proto(model))
    rng = np.random.default_rng(7)
    batch, seq = 2, 6
    causal = np.tril(np.ones((seq, seq), dtype=bool))[None, None].repeat(batch, 0)
    padded = causal.copy()
    padded[1, :, :, :2] = False  # row 1 left-padded by two tokens
    padded[1, :, np.arange(2), np.arange(2)] = True  # (each padding token still sees itself)
    for mask, fused in ((causal, True), (padded, False)):
        feed = {
            "q": rng.standard_normal((batch, seq, 64)).astype(np.float32),
            "k": rng.standard_normal((batch, seq, 32)).astype(np.float32),
            "v": rng.standard_normal((batch, seq, 32)).astype(np.float32),
            "past_key": np.zeros((batch, 2, 0, 16), np.float32),
            "past_value": np.zeros((batch, 2, 0, 16), np.float32),
            "mask": mask,
        }
        want = ort_run(original.SerializeToString(), feed)
        got = ort_run(probe.SerializeToString(), feed)
        assert bool(got[-1].all()) is fused
        for name, a, b in zip(("out", "present_key", "present_value"), got, want, strict=False):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"fused={fused} {name}")


@pytest.mark.slow  # an export and an optimize (about 10 s); the default run's budget is spent on the eager proofs
def test_values_narrower_than_the_keys_are_padded_for_group_query_attention(tmp_path: Path) -> None:
    """MiMo-V2-Flash's values (here 8 wide against 16-wide keys, with sinks): the first prompt takes
    GroupQueryAttention with the values zero-padded to 16 and its output and present values cut back to 8 per head;
    cached calls keep the Attention; both match the float64 eager block."""
    source, target = _optimized(tmp_path, "rope", attention_sinks=True, v_head_dim=8)
    manifest = load_manifest(target, verify=False)
    assert manifest.input("past_value").shape[-1] == 8
    for shape, fresh in ((FeedShape(2, 9, 0), True), (FeedShape(2, 5, 3), False)):
        feed = make_feed(manifest, shape, seed=8)
        assert _takes_gqa(target, feed) is fresh
        _assert_matches_eager(source, target, feed, f"narrow values {shape}")
