"""The in-place cache's attention per target: ``decode_over_cache`` (ort-cpu), contrib ``GroupQueryAttention``
(ort-cuda, run here on ONNX Runtime's CPU kernel), TensorRT's KV-cache update layer (parse), and the reasons a scheme
keeps its path. Parity reference: the float64 eager block stepping its concatenated cache
(:func:`posenc.validate.decode.validate_decode`)."""

from __future__ import annotations

import collections
from pathlib import Path

import onnx
import onnx.numpy_helper
import pytest

from posenc.config import AttentionConfig
from posenc.export import FeedShape, export_scheme
from posenc.graphs import cache_decode, optimize_file
from posenc.graphs.cache import CacheFacts, gqa_refusal
from posenc.graphs.inspect import inspect_model
from posenc.validate.decode import validate_decode
from tests.conftest import shared_export

CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=48)
SHORT = [FeedShape(2, 5, 0)] + [FeedShape(2, 1, 5 + i) for i in range(12)] + [FeedShape(2, 1, 17, start=47)]
"""A prefill, 12 single steps, a jump to the last position (the full 64-step sequence is in validate/test_decode)."""


def _ops(path: Path) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def _in_place(export_cache: Path, scheme: str) -> Path:
    """``scheme``'s in-place block of :data:`CONFIG`, exported once for the session (tests read it, and write their
    optimized graphs into their own folder)."""
    return shared_export(export_cache, f"cache_passes_inplace_{scheme}", scheme, kv_cache="inplace", config=CONFIG).path


def test_ort_cuda_target_makes_one_group_query_attention_with_fused_rotary(tmp_path: Path, export_cache: Path) -> None:
    source = _in_place(export_cache, "rope")
    target = tmp_path / "rope.ort-cuda.onnx"
    result = optimize_file(source, target, "ort-cuda")
    assert result.counts["gqa_over_cache"] == 1
    ops = _ops(target)
    assert ops["GroupQueryAttention"] == 1
    assert ops["TensorScatter"] == ops["RotaryEmbedding"] == ops["Attention"] == 0  # writes and rotation inside
    (gqa,) = [n for n in onnx.load(str(target)).graph.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
    assert (attrs["num_heads"], attrs["kv_num_heads"], attrs["do_rotary"]) == (4, 2, 1)
    assert list(gqa.output[1:]) == ["present_key", "present_value"]
    assert list(gqa.input[3:5]) == ["key_cache", "value_cache"]  # past and present share the buffers
    report = validate_decode([source, target], SHORT)
    assert report.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]


def test_validate_feeds_an_in_place_group_query_attention_only_the_shapes_it_serves(
    tmp_path: Path, export_cache: Path
) -> None:
    """ONNX Runtime's GroupQueryAttention over the shared cache refuses a chunk over a filled cache with more than
    one row; the optimized manifest says so, the default feeds take one row there, a requested shape is refused."""
    from posenc.cli import main
    from posenc.export import load_manifest
    from posenc.export.shape_rules import CHUNK_OVER_CACHE_ONE_ROW
    from posenc.validate import validate_onnx

    target = tmp_path / "rope.ort-cuda.onnx"
    optimize_file(_in_place(export_cache, "rope"), target, "ort-cuda")
    assert load_manifest(target).optimized.shape_rules == (CHUNK_OVER_CACHE_ONE_ROW,)
    report = validate_onnx(target)  # before: ONNX Runtime raised "batch_size must be 1 ..." on (2, 13, 5)
    assert report.passed
    assert FeedShape(1, 13, 5) in {row.shape for row in report.rows}
    assert main(["validate", str(target), "--shape", "2,13,5"]) == 2  # refused up front, not an internal error
    assert main(["validate", str(target), "--shape", "2,1,9"]) == 0  # single tokens take any batch


def test_score_bias_goes_into_group_query_attention(tmp_path: Path, export_cache: Path) -> None:
    source = _in_place(export_cache, "alibi")
    target = tmp_path / "alibi.ort-cuda.onnx"
    assert optimize_file(source, target, "ort-cuda").counts["gqa_over_cache"] == 1
    report = validate_decode([target], SHORT)
    assert report.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]


def _branches(node: onnx.NodeProto) -> dict[str, onnx.GraphProto]:
    return {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}


def test_ort_cpu_target_reads_the_cache_without_copies_when_decoding(
    tmp_path: Path, export_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both branches and, in the grouped one, both value products: per head over 3 chunks of 16 slots for single
    steps (the chunk size shrunk to this cache's), grouped for a step of 2 tokens."""
    monkeypatch.setattr(cache_decode, "VALUE_CHUNK_BYTES", 16 * 16 * 4)  # 16 slots of 16 floats
    source = _in_place(export_cache, "rope")
    target = tmp_path / "rope.ort-cpu.onnx"
    assert optimize_file(source, target, "ort-cpu").counts["decode_over_cache"] == 1
    (outer,) = [n for n in onnx.load(str(target)).graph.node if n.op_type == "If"]  # grouped, or sliced (prefill)
    grouped = _branches(outer)["then_branch"]
    ops = collections.Counter(n.op_type for n in grouped.node)
    assert ops["MatMul"] == 1  # the scores K·qᵀ
    assert ops["If"] == 1  # the values per head or grouped
    (values,) = [n for n in grouped.node if n.op_type == "If"]
    per_head = _branches(values)["then_branch"]
    assert [g.name for g in _branches(values).values()] == ["per_head_values", "grouped_values"]
    constants = [n.attribute[0].t for n in per_head.node if n.op_type == "Constant"]
    constants = [onnx.numpy_helper.to_array(tensor).tolist() for tensor in constants]
    assert [0, 2, 3, 1, 16, 16] in constants  # the value cache [B, 2, 48, 16] as 3 chunks of 16 slots
    assert any(n.op_type == "ReduceSum" for n in per_head.node)
    # a prefill of 30 tokens (sliced branch), single steps with the cache filled past a third (grouped branch, values
    # per head), two tokens at once (values grouped)
    shapes = [FeedShape(1, 30, 0)] + [FeedShape(1, 1, 30 + i) for i in range(4)] + [FeedShape(1, 2, 34)]
    report = validate_decode([target], shapes)
    assert report.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]


@pytest.mark.slow  # the default run proves both value products at 2 heads per kv head (the test above)
@pytest.mark.parametrize(("hidden", "heads", "kv_heads"), [(64, 4, 4), (48, 6, 2), (64, 8, 1)], ids=["G1", "G3", "G8"])
def test_ort_cpu_decode_keeps_every_group_size_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hidden: int, heads: int, kv_heads: int
) -> None:
    """One query row per kv head keeps ``MatMul(q, Kᵀ)``; 3 heads per kv head take the scores as ``K·qᵀ`` and single
    steps' values per head over chunks; 8 take the scores as ``K·qᵀ`` and the values grouped. Single steps and a
    3-token step past a third of the cache, against the float64 eager block."""
    monkeypatch.setattr(cache_decode, "VALUE_CHUNK_BYTES", 16 * 8 * 4)  # 16 slots of 8 floats: 3 chunks
    geometry = AttentionConfig(hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads, max_position_embeddings=48)
    source = export_scheme("rope", tmp_path / "g.onnx", kv_cache="inplace", config=geometry).path
    target = tmp_path / "g.ort-cpu.onnx"
    assert optimize_file(source, target, "ort-cpu").counts["decode_over_cache"] == 1
    (outer,) = [n for n in onnx.load(str(target)).graph.node if n.op_type == "If"]
    grouped = _branches(outer)["then_branch"]
    assert sum(n.op_type == "If" for n in grouped.node) == (heads // kv_heads == 3)
    shapes = [FeedShape(1, 20, 0)] + [FeedShape(1, 1, 20 + i) for i in range(3)] + [FeedShape(1, 3, 23)]
    report = validate_decode([target], shapes)
    assert report.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]


@pytest.mark.parametrize(
    ("slots", "width", "chunks"),
    [(8192, 512, 64), (8192, 128, 16), (527, 256, 17), (144, 128, 1), (8191, 512, None), (None, 64, None)],
)
def test_value_chunks_hold_a_quarter_mebibyte_or_less_and_divide_the_cache(slots, width, chunks) -> None:
    assert cache_decode._value_chunks(slots, width, 4) == chunks
    if chunks is not None:
        assert slots % chunks == 0
        assert slots // chunks * width * 4 <= cache_decode.VALUE_CHUNK_BYTES


def test_schemes_the_fused_op_cannot_express_keep_their_path_with_the_reason(
    tmp_path: Path, export_cache: Path
) -> None:
    source = _in_place(export_cache, "rerope")
    target = tmp_path / "rerope.ort-cuda.onnx"
    result = optimize_file(source, target, "ort-cuda")
    assert result.counts["gqa_over_cache"] == 0
    assert _ops(target)["GroupQueryAttention"] == 0
    report = inspect_model(target)
    assert "computes its attention itself" in report.skipped["gqa_over_cache"]
    assert "not applied: gqa_over_cache: the scheme computes its attention itself" in report.to_text()
    decode = validate_decode([source, target], SHORT)  # the kept path still steps its cache in place
    assert decode.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in decode.rows if not r.passed]


def test_attention_sinks_go_into_group_query_attention_over_the_cache(tmp_path: Path) -> None:
    """An in-place block with sinks: ort-cuda's GroupQueryAttention takes them as head_sink, ort-cpu's grouped decode
    as a softmax column of their own (the sliced branch keeps the fused Attention with the sink as a zero key). Both
    step their caches like the float64 eager block, through both of ort-cpu's branches (steps past a third of the
    cache take the grouped one)."""
    geometry = AttentionConfig(**{**CONFIG.__dict__, "attention_sinks": True})
    source = export_scheme("rope", tmp_path / "sinks.onnx", kv_cache="inplace", config=geometry).path
    cuda, cpu = tmp_path / "sinks.ort-cuda.onnx", tmp_path / "sinks.ort-cpu.onnx"
    assert optimize_file(source, cuda, "ort-cuda").counts["gqa_over_cache"] == 1
    (gqa,) = [n for n in onnx.load(str(cuda)).graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa.input) == 12  # head_sink
    assert _ops(cuda)["Attention"] == 0
    assert optimize_file(source, cpu, "ort-cpu").counts["decode_over_cache"] == 1
    report = validate_decode([source, cuda, cpu], SHORT)
    assert report.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]


def test_gates_norms_and_scaled_queries_keep_both_cache_passes_exact(tmp_path: Path) -> None:
    """The options outside the attention (a softplus gate per head, a full-width q/k norm, a position-scaled query)
    leave decode_over_cache and GroupQueryAttention over the in-place cache taking the block, stepping like it."""
    geometry = AttentionConfig(**{**CONFIG.__dict__, "output_gate": "softplus", "output_gate_per_head": True,
                                  "qk_norm": "rms", "qk_norm_full_width": True, "temperature_floor_scale": 8,
                                  "temperature_scale": 0.1, "temperature_offset": 0})  # fmt: skip
    source = export_scheme("rope", tmp_path / "modern.onnx", kv_cache="inplace", config=geometry).path
    cpu, cuda = tmp_path / "modern.ort-cpu.onnx", tmp_path / "modern.ort-cuda.onnx"
    assert optimize_file(source, cpu, "ort-cpu").counts["decode_over_cache"] == 1
    assert optimize_file(source, cuda, "ort-cuda").counts["gqa_over_cache"] == 1
    report = validate_decode([source, cpu, cuda], SHORT)
    assert report.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]


@pytest.mark.parametrize(
    ("facts", "reason"),
    [
        (CacheFacts(in_place=False), "--kv-cache inplace"),
        (CacheFacts(in_place=True, causal=False), "not causal"),
        (CacheFacts(in_place=True, sliding_window=8), "sliding window"),
        (CacheFacts(in_place=True, logit_softcap=30.0, placement="score"), "soft-cap"),
        (CacheFacts(in_place=True, head_dim=12), "multiple of 8"),
        (CacheFacts(in_place=True, placement="attention"), "computes its attention itself"),
    ],
)
def test_group_query_attention_refusals(facts: CacheFacts, reason: str) -> None:
    assert reason in (gqa_refusal(facts) or "")


def test_group_query_attention_takes_a_plain_causal_block() -> None:
    assert gqa_refusal(CacheFacts(in_place=True, head_dim=128)) is None
    assert gqa_refusal(CacheFacts(in_place=True, attention_sinks=True)) is None  # head_sink
    assert gqa_refusal(CacheFacts(in_place=True, logit_softcap=30.0, placement="qk")) is None


def test_tensorrt_parses_the_cache_writes_as_kv_cache_update_layers(tmp_path: Path, export_cache: Path) -> None:
    pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx not installed")
    from posenc.engine import check_parse

    target = tmp_path / "rope.trt.onnx"
    optimize_file(_in_place(export_cache, "rope"), target, "trt")
    report = check_parse(target)
    assert report.parsed is True, report.message
    assert report.layers["KV_CACHE_UPDATE"] == 2
    assert report.layers["ROTARY_EMBEDDING"] == 2
    assert report.layers["ATTENTION_OUTPUT"] == 1
