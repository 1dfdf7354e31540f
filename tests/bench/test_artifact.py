"""``posenc bench MODEL.onnx`` / ``--hf-model``: the artifact a user ships, timed as it is (its own parameters,
weights, dtype and cache layout), prefill against a GEMM and decode against a copy from one run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from posenc import AttentionConfig
from posenc.bench.artifact import artifact_plan, artifact_shapes, artifact_workload
from posenc.bench.harness import run_bench
from posenc.bench.shapes import Shape
from posenc.bench.timing import RunSettings, TimingSettings
from posenc.cli import main
from posenc.errors import ConfigError
from posenc.export import export_scheme, load_manifest, ort_session
from posenc.export.feeds import make_feed

CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=96)
LLAMA3 = {"factor": 8.0, "original_max_position_embeddings": 32, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
FAST = RunSettings(
    timing=TimingSettings(warmup=1, repeats=2, min_repeats=1, max_seconds=1.0),
    threads=1,
    copy_mib=4,
    copy_repeats=1,
    plots=False,
)


@pytest.fixture(scope="module")
def llama3_block(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("artifact")
    return export_scheme("rope_llama3", folder / "layer.onnx", params=LLAMA3, config=CONFIG, seed=3).path


def test_the_workload_is_the_file_itself(llama3_block: Path) -> None:
    """The eager twin carries the file's weights and llama3 parameters: it computes what the graph computes."""
    workload = artifact_workload(llama3_block, Shape(2, 9, name="prefill"))
    manifest = load_manifest(llama3_block)
    assert manifest.params["factor"] == 8.0
    assert workload.scheme == "rope_llama3"
    assert workload.unit == "block"
    feed = make_feed(manifest, Shape(2, 9, name="prefill").feed)
    graph = ort_session(llama3_block).run(None, feed)
    for got, want in zip(workload.outputs, graph, strict=True):
        np.testing.assert_allclose(got.numpy(), want, atol=2e-5)
    assert workload.key.startswith("artifact-layer-")
    assert workload.export(Path("elsewhere.onnx")) == llama3_block  # never re-exported


def test_default_shapes_stay_inside_the_context(llama3_block: Path) -> None:
    shapes = artifact_shapes(load_manifest(llama3_block))
    assert [(s.name, s.batch, s.seq, s.past) for s in shapes] == [("prefill", 1, 96, 0), ("decode", 1, 1, 95)]
    with pytest.raises(ConfigError, match=r"past layer\.onnx's context of 96"):
        artifact_plan([llama3_block], [Shape(1, 1, 200, name="long")])


def test_one_run_gives_prefill_vs_gemm_and_decode_vs_copy(llama3_block: Path, tmp_path: Path) -> None:
    cases = artifact_plan([llama3_block], [Shape(1, 64, name="prefill"), Shape(1, 1, 63, name="decode")], ["ort-cpu"])
    doc = run_bench(cases, FAST, tmp_path, progress=False)
    prefill, decode = doc.records
    assert (prefill.status, decode.status) == ("ok", "ok")
    assert prefill.artifact == decode.artifact == "layer.onnx"
    assert prefill.flops_ratio is not None
    assert prefill.flops_ratio > 0
    assert decode.copy_bytes_per_s is not None  # a copy timed in the same rounds
    assert decode.roofline_ratio == pytest.approx(decode.bytes_per_s / decode.copy_bytes_per_s)
    assert doc.targets == []  # the project's scheme targets are not claimed for a user's file
    report = (tmp_path / "bench.md").read_text()
    assert "Your artifacts against their floors" in report
    assert "GEMM of the same FLOPs" in report


def test_an_optimized_file_is_timed_as_it_is(llama3_block: Path, tmp_path: Path) -> None:
    from posenc.graphs import optimize_file

    optimized = tmp_path / "layer.ort-cpu.onnx"
    optimize_file(llama3_block, optimized, "ort-cpu")
    (case,) = artifact_plan([optimized], [Shape(1, 8, name="prefill")])
    assert case.backends == ("torch", "ort-cpu")
    with pytest.raises(ConfigError, match="already optimized"):
        artifact_plan([optimized], [Shape(1, 8, name="prefill")], ["ort-cpu-fused"])


def test_cli_times_a_file_and_refuses_scheme_options(llama3_block: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "res"
    argv = ["bench", str(llama3_block), "--shape", "1,8", "--backend", "ort-cpu", "--repeats", "2", "--warmup", "1"]
    code = main(
        [*argv, "--copy-mib", "4", "--copy-repeats", "1", "--threads", "1", "--no-plots", "--quiet", "-o", str(out)]
    )
    assert code == 0
    assert "| layer.onnx | block | float32 | prefill B=1 S=8 | ort-cpu |" in capsys.readouterr().out
    assert json.loads((out / "bench.json").read_text())["results"][0]["artifact"] == "layer.onnx"
    assert main(["bench", str(llama3_block), "-s", "rope", "-o", str(tmp_path / "x")]) == 2
    assert "drop --scheme" in capsys.readouterr().err
    assert main(["bench", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "y")]) == 2
    assert "missing.onnx" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert not (tmp_path / "y").exists()


def test_cli_exports_and_times_a_checkpoint_layer(tmp_path: Path, capsys) -> None:
    from posenc.checkpoints.samples import get_sample

    checkpoint = get_sample("llama").build(tmp_path / "ckpt")
    out = tmp_path / "res"
    argv = ["bench", "--hf-model", str(checkpoint), "--layer", "1", "--shape", "1,4", "--backend", "ort-cpu"]
    argv += ["--repeats", "2", "--warmup", "1", "--copy-mib", "4", "--copy-repeats", "1", "--no-plots", "--quiet"]
    assert main([*argv, "-o", str(out)]) == 0
    exported = out / "models" / "ckpt-layer1.onnx"
    manifest = load_manifest(exported)
    assert manifest.weights.source is not None
    assert "ckpt-layer1.onnx" in capsys.readouterr().out
