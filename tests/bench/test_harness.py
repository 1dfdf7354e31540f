"""The harness on tiny sizes: files written, skips with reasons, interrupts keep results. No timing assertions."""

from __future__ import annotations

import json
import math

import pytest

from posenc.bench import BenchDocument, RunSettings, TimingSettings, make_plan, run_bench
from posenc.bench.bandwidth import CopyBandwidth
from posenc.bench.shapes import Shape
from posenc.bench.targets import evaluate_targets
from posenc.bench.timing import Timing
from posenc.config import AttentionConfig
from posenc.errors import ConfigError

TINY = AttentionConfig(hidden_size=32, num_heads=4, num_kv_heads=2, max_position_embeddings=32)
FAST = RunSettings(timing=TimingSettings(warmup=1, repeats=3, min_repeats=1, max_seconds=0.5), threads=1, plots=True)
FIXED_BW = CopyBandwidth(bytes_per_s=10e9, mib=1, repeats=1, samples=(10e9,))
ALONGSIDE = RunSettings(
    timing=TimingSettings(warmup=1, repeats=4, min_repeats=1, rounds=2, max_seconds=None),
    threads=1,
    copy_mib=1,
    copy_alongside_mib=1,
    plots=False,
)
"""A copy (and a GEMM for prefill blocks) timed in the same rounds as every case."""


def test_tiny_run_writes_json_markdown_and_plots(tmp_path) -> None:
    backends = ["torch", "ort-cpu", "ort-cuda", "tensorrt"]
    plan = make_plan(["rope"], ["op"], "precomputed", [Shape(1, 8, name="prefill")], backends, TINY)
    doc = run_bench(plan, FAST, tmp_path, progress=False, bandwidth=FIXED_BW)
    by_backend = {r.backend: r for r in doc.records}
    for name in ("torch", "ort-cpu"):
        record = by_backend[name]
        assert record.status == "ok", record.reason
        assert record.timing.runs >= 1
        assert record.timing.median > 0
        assert math.isclose(record.bytes_per_s, record.bytes_moved / record.timing.median)
        assert math.isclose(record.roofline_ratio, record.bytes_per_s / FIXED_BW.bytes_per_s)
    cuda = by_backend["ort-cuda"]
    assert cuda.status == "skipped"
    assert "CUDAExecutionProvider" in cuda.reason
    trt = by_backend["tensorrt"]
    assert trt.status == "skipped"
    assert "GPU" in trt.reason or "not installed" in trt.reason
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["status"] == "complete"
    assert len(saved["results"]) == 4
    assert saved["results"][0]["timing"]["median_s"] > 0
    loaded = BenchDocument.load(tmp_path / "bench.json")
    assert loaded.records[0].shape == Shape(1, 8, name="prefill")
    assert loaded.to_dict() == saved  # the typed document reads back exactly what was written
    markdown = (tmp_path / "bench.md").read_text()
    assert "| rope | op | precomputed | prefill B=1 S=8 |" in markdown
    assert "CUDAExecutionProvider" in markdown
    for png in ("latency.png", "roofline.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_unit_and_table_mode_are_skipped_with_reasons(tmp_path) -> None:
    plan = make_plan(["nope", "rope_dynamic"], ["op"], "precomputed", [Shape(1, 2, name="prefill")], ["torch"], TINY)
    doc = run_bench(plan, FAST, None, progress=False, bandwidth=FIXED_BW)
    reasons = {r.scheme: r.reason for r in doc.records}
    assert all(r.status == "skipped" for r in doc.records)
    assert "no positional op" in reasons["nope"]
    assert "no table mode 'precomputed'" in reasons["rope_dynamic"]


def test_interrupted_run_keeps_what_it_measured(tmp_path) -> None:
    shapes = [Shape(1, 4, name="prefill"), Shape(2, 4, name="prefill"), Shape(3, 4, name="prefill")]
    plan = make_plan(["alibi"], ["op"], "dynamic", shapes, ["torch"], TINY)
    seen = []

    def interrupt_after_two(record) -> None:
        seen.append(record)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_bench(plan, FAST, tmp_path, progress=False, bandwidth=FIXED_BW, on_record=interrupt_after_two)
    saved = BenchDocument.load(tmp_path / "bench.json")
    assert saved.status == "interrupted"
    assert [r.shape.batch for r in saved.records] == [1, 2]
    assert all(r.status == "ok" for r in saved.records)
    assert "interrupted" in (tmp_path / "bench.md").read_text()


def test_targets_are_ratios_of_records_from_one_document() -> None:
    from posenc.bench.plan import BLOCK_TARGET_SHAPE, LLAMA_LIKE, ROPE_TARGET_CONFIG, ROPE_TARGET_SHAPE
    from posenc.bench.results import BenchRecord

    def record(scheme, unit, backend, shape, config, median, ratio=None):
        timing = Timing(median=median, p90=median, mean=median, minimum=median, runs=1)
        return BenchRecord(
            scheme, unit, "precomputed", backend, shape, config, "ok", timing=timing, roofline_ratio=ratio
        )

    doc = BenchDocument(settings=RunSettings())
    doc.records = [
        record("rope", "op-3d", "ort-cpu", ROPE_TARGET_SHAPE, ROPE_TARGET_CONFIG, 0.030, 0.15),
        record("rope", "op-3d", "ort-cpu-fused", ROPE_TARGET_SHAPE, ROPE_TARGET_CONFIG, 0.004, 0.9),
        record("alibi", "block", "torch", BLOCK_TARGET_SHAPE, LLAMA_LIKE, 0.020),
        record("alibi", "block", "ort-cpu", BLOCK_TARGET_SHAPE, LLAMA_LIKE, 0.025),
        record("rope", "block", "torch", BLOCK_TARGET_SHAPE, LLAMA_LIKE, 0.020),
        record("rope", "block", "ort-cpu", BLOCK_TARGET_SHAPE, LLAMA_LIKE, 0.030),
        record("rope", "block", "ort-cpu-fused", BLOCK_TARGET_SHAPE, LLAMA_LIKE, 0.016),
        record("t5", "block", "torch", BLOCK_TARGET_SHAPE, LLAMA_LIKE, 0.020),
        record("t5", "block", "ort-cpu", BLOCK_TARGET_SHAPE, LLAMA_LIKE, 0.010),
        record("t5", "block", "ort-cpu-fused", BLOCK_TARGET_SHAPE, LLAMA_LIKE, 0.040),
    ]
    checks = evaluate_targets(doc)
    assert [c.passed for c in checks] == [True, True, False, True, True]
    assert checks[0].measured == pytest.approx(0.9)
    assert checks[1].measured == pytest.approx(0.030 / 0.004)
    assert checks[2].measured == pytest.approx(0.020 / 0.025)
    assert checks[3].measured == pytest.approx(0.020 / 0.016)  # the faster ORT graph counts
    assert checks[4].measured == pytest.approx(0.020 / 0.010)
    assert "ort-cpu 10.00 ms" in checks[4].detail


def test_large_ops_are_divided_by_a_copy_timed_alongside(tmp_path) -> None:
    wide = AttentionConfig(hidden_size=512, num_heads=8, num_kv_heads=8, max_position_embeddings=256)
    plan = make_plan(["rope"], ["op-3d", "block"], "precomputed", [Shape(1, 160, name="prefill")], ["torch"], wide)
    doc = run_bench(plan, ALONGSIDE, None, progress=False, bandwidth=FIXED_BW)
    op, block = doc.records
    assert op.bytes_moved >= 1 << 20
    assert op.copy_bytes_per_s is not None
    assert math.isclose(op.roofline_ratio, op.bytes_per_s / op.copy_bytes_per_s)
    assert block.copy_bytes_per_s is None  # blocks keep the run's copy bandwidth
    assert math.isclose(block.roofline_ratio, block.bytes_per_s / FIXED_BW.bytes_per_s)


def test_a_bench_document_with_a_renamed_or_missing_key_is_refused(tmp_path) -> None:
    """bench.json is read strictly: a renamed key fails with the place and the remedy instead of a default."""
    from posenc.errors import ModelFileError

    plan = make_plan(["alibi"], ["op"], "dynamic", [Shape(1, 4, name="prefill")], ["torch"], TINY)
    run_bench(plan, FAST, tmp_path, progress=False, bandwidth=FIXED_BW)
    data = json.loads((tmp_path / "bench.json").read_text())
    data["results"][0]["timing"]["median"] = data["results"][0]["timing"].pop("median_s")
    with pytest.raises(
        ModelFileError, match=r"results\[0\]\.timing.*unknown key\(s\) \['median'\].*missing key\(s\) \['median_s'\]"
    ):
        BenchDocument.from_dict(data)
    data = json.loads((tmp_path / "bench.json").read_text())
    del data["machine"]
    with pytest.raises(ModelFileError, match=r"missing key\(s\) \['machine'\].*re-run `posenc bench"):
        BenchDocument.from_dict(data)
    data["format"] = "posenc-bench/1"
    with pytest.raises(ModelFileError, match=r"posenc-bench/1.*re-run"):
        BenchDocument.from_dict(data)


def test_decode_times_both_cache_layouts_against_a_copy_and_prefill_against_a_gemm(tmp_path) -> None:
    shapes = [Shape(1, 1, 20, name="decode"), Shape(1, 64, name="prefill")]
    backends = ["ort-cpu", "ort-cpu-fused"]
    plan = make_plan(["rope"], ["block"], "precomputed", shapes, backends, TINY, kv_caches=("concat", "inplace"))
    assert [(c.unit, c.with_units) for c in plan] == [("block", ("block-inplace",))] * 2
    doc = run_bench(plan, ALONGSIDE, tmp_path, progress=False, bandwidth=FIXED_BW)
    decode = [r for r in doc.records if r.shape == shapes[0]]
    prefill = [r for r in doc.records if r.shape == shapes[1]]
    assert sorted((r.unit, r.backend) for r in decode) == sorted(
        (u, b) for u in ("block", "block-inplace") for b in backends
    )
    for record in decode:
        assert record.status == "ok", record.reason
        assert record.bytes_moved == decode[0].bytes_moved  # one bytes floor whatever the layout
        assert record.copy_bytes_per_s is not None  # a copy timed in the same rounds
        assert math.isclose(record.roofline_ratio, record.bytes_per_s / record.copy_bytes_per_s)
        assert record.flops_ratio is None
    for record in prefill:
        assert record.status == "ok", record.reason
        assert record.gemm_flops_per_s is not None
        assert math.isclose(record.flops_ratio, record.flops / record.timing.median / record.gemm_flops_per_s)
    markdown = (tmp_path / "bench.md").read_text()
    assert "## Decode against its bytes floor" in markdown
    assert "| rope | in-place | decode B=1 S=1 P=20 | ort-cpu-fused |" in markdown


def test_decode_targets_compare_the_layouts_of_one_document() -> None:
    from posenc.bench.plan import DECODE_TARGET_SHAPE, LLAMA_LIKE
    from posenc.bench.results import BenchRecord

    def record(scheme, unit, backend, median, ratio=None):
        timing = Timing(median=median, p90=median, mean=median, minimum=median, runs=1)
        return BenchRecord(
            scheme, unit, "precomputed", backend, DECODE_TARGET_SHAPE, LLAMA_LIKE, "ok", timing=timing,
            bytes_moved=18_900_000, bytes_per_s=18_900_000 / median, roofline_ratio=ratio,
        )  # fmt: skip

    doc = BenchDocument(settings=RunSettings())
    doc.records = [
        record("rope", "block", "ort-cpu", 0.006),
        record("rope", "block", "ort-cpu-fused", 0.0016, 0.5),
        record("rope", "block-inplace", "ort-cpu", 0.005),
        record("rope", "block-inplace", "ort-cpu-fused", 0.0008, 0.75),
        record("t5", "block", "ort-cpu", 0.002),
        record("t5", "block-inplace", "ort-cpu-fused", 0.003),
    ]
    checks = evaluate_targets(doc)
    assert [c.passed for c in checks] == [True, False, True, False]
    assert checks[0].measured == pytest.approx(0.75)
    assert checks[1].measured == pytest.approx(0.0016 / 0.0008)  # 2x: short of 2.5x
    assert checks[2].measured == pytest.approx(0.0016 / 0.0008)  # the faster graph of each layout
    assert checks[3].measured == pytest.approx(0.002 / 0.003)


def test_guard_cost_times_each_graph_with_and_without_the_guard_in_the_same_rounds(tmp_path) -> None:
    settings = RunSettings(timing=FAST.timing, threads=1, plots=False, guard_cost=True)
    shapes = [Shape(1, 1, 20, name="decode")]
    plan = make_plan(["rope"], ["block"], "precomputed", shapes, ["torch", "ort-cpu"], TINY)
    doc = run_bench(plan, settings, tmp_path, progress=False, bandwidth=FIXED_BW)
    by_backend = {r.backend: r for r in doc.records}
    assert by_backend["torch"].unguarded is None  # eager PyTorch runs no exported graph
    graph = by_backend["ort-cpu"]
    assert graph.status == "ok", graph.reason
    assert graph.unguarded is not None
    assert math.isclose(graph.guard_cost, graph.timing.median / graph.unguarded.median - 1.0)
    (check,) = [t for t in doc.targets if "unguarded latency ÷ guarded latency" in t.name]
    assert math.isclose(check.measured, graph.unguarded.median / graph.timing.median)
    assert "## Position guard cost (same rounds)" in (tmp_path / "bench.md").read_text()
    again = BenchDocument.from_dict(json.loads((tmp_path / "bench.json").read_text()))
    assert again.records[1].unguarded == graph.unguarded  # kept in bench.json


def test_guard_cost_needs_the_guard() -> None:
    with pytest.raises(ConfigError, match="keep the guard on"):
        RunSettings(position_guard=False, guard_cost=True)
