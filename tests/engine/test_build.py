"""Engine builds with TensorRT-RTX ahead of time (no GPU): files, manifest, failures that leave nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from posenc.artifacts.files import sha256_file
from posenc.cli import main
from posenc.engine import EngineManifest, build_engine, engine_manifest_path
from posenc.engine import build as build_module
from posenc.errors import BuildError, ConfigError
from tests.features import ENGINE_CASES, optimized_feature
from tests.graphs.artifacts import export_case, fused_case
from tests.matrix import MatrixCase

pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx not installed (`make setup` installs tensorrt-rtx-cu13)")

ROPE = MatrixCase("rope", "precomputed", "float16", "op")
BLOCK = MatrixCase("rope", "precomputed", "float32", "block")


def _leftovers(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in (".engine", ".tmp") or p.name.endswith(".manifest.json"))


def test_build_writes_engine_and_manifest(export_cache, tmp_path) -> None:
    source = fused_case(export_cache, ROPE)
    out = tmp_path / "rope.engine"
    result = build_engine(source, out, targets=["sm89", "sm120"], profile=["seq=1:16:64"])
    manifest = json.loads(engine_manifest_path(out).read_text())
    assert manifest == result.manifest.to_dict()
    assert EngineManifest.from_dict(manifest) == result.manifest
    assert manifest["backend"] == "tensorrt_rtx"
    assert manifest["backend_version"]
    assert manifest["targets"] == ["sm89", "sm120"]
    assert manifest["profiles"][0]["seq"] == {"min": 1, "opt": 16, "max": 64}
    assert manifest["input_shapes"]["q"]["max"] == [8, 4, 64, 16]
    assert manifest["precision"] == "float16"
    assert manifest["layers"]["ROTARY_EMBEDDING"] == 2
    assert manifest["source_onnx_sha256"] == sha256_file(source)
    assert manifest["source_manifest"]["scheme"] == "rope"
    assert manifest["source_manifest"]["optimized"]["target"] == "trt"
    assert manifest["timing_cache"] is None
    assert "GPU query" in manifest["timing_cache_note"]
    assert manifest["engine_sha256"] == sha256_file(out)
    assert manifest["engine_bytes"] == out.stat().st_size


def test_fp32_attention_is_marked_decomposable_and_needs_it(export_cache, tmp_path, monkeypatch) -> None:
    source = fused_case(export_cache, BLOCK)
    result = build_engine(source, tmp_path / "block.engine", targets=["sm89"], profile=["seq=1:8:16"])
    assert result.manifest.decomposable_attention == 1
    assert result.manifest.layers["ATTENTION_OUTPUT"] == 1
    monkeypatch.setattr(build_module, "mark_fp32_attention_decomposable", lambda parsed: 0)
    failed = tmp_path / "undecomposable.engine"
    with pytest.raises(BuildError, match="failed to build"):
        build_engine(source, failed, targets=["sm89"], profile=["seq=1:8:16"])
    assert not failed.exists()
    assert not engine_manifest_path(failed).exists()
    assert [p.name for p in _leftovers(tmp_path)] == ["block.engine", "block.engine.manifest.json"]


def _contrib_rope(path: Path) -> Path:
    tables = [numpy_helper.from_array(np.ones((64, 8), np.float32), name) for name in ("cos", "sin")]
    graph = helper.make_graph(
        [helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], name="contrib_rope",
                          domain="com.microsoft")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 64]),
         helper.make_tensor_value_info("pos", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 64])],
        tables,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    onnx.save(model, path)
    return path


def test_unparsable_graph_names_the_node_and_op(tmp_path) -> None:
    source = _contrib_rope(tmp_path / "contrib.onnx")
    out = tmp_path / "contrib.engine"
    with pytest.raises(BuildError) as info:
        build_engine(source, out, profile=["b=1:1:2", "s=1:4:8"])
    message = str(info.value)
    assert "node 'contrib_rope' (op RotaryEmbedding)" in message
    assert "num_heads" in message
    assert "cudaError" not in message
    assert _leftovers(tmp_path) == []


def test_unsupported_target_and_profile_fail_before_building(export_cache, tmp_path) -> None:
    source = fused_case(export_cache, ROPE)
    with pytest.raises(ConfigError, match="sm75, sm80, sm86, sm89, sm120"):
        build_engine(source, tmp_path / "a.engine", targets=["sm90"])
    with pytest.raises(ConfigError, match="outside the manifest's range"):
        build_engine(source, tmp_path / "b.engine", profile=["seq=1:128:4096"])
    assert _leftovers(tmp_path) == []


def test_build_cli(export_cache, tmp_path, capsys) -> None:
    source = export_case(export_cache, ROPE)
    out = tmp_path / "cli.engine"
    assert main(["build", str(source), "--engine-target", "sm86", "--profile", "batch=1:1:2", "-o", str(out)]) == 0
    assert "tensorrt_rtx" in capsys.readouterr().out
    assert out.exists()
    assert main(["build", str(source), "--engine-target", "sm90", "-o", str(tmp_path / "x.engine")]) == 2
    assert "supported targets" in capsys.readouterr().err


def test_inspect_reports_the_node_tensorrt_cannot_parse(tmp_path, capsys) -> None:
    source = _contrib_rope(tmp_path / "contrib.onnx")
    assert main(["inspect", str(source)]) == 0
    printed = capsys.readouterr().out
    assert "com.microsoft::RotaryEmbedding 1" in printed
    assert "does NOT parse" in printed
    assert "node 'contrib_rope' (op RotaryEmbedding)" in printed


def test_optimize_makes_the_contrib_graph_parse(tmp_path) -> None:
    from posenc.engine import check_parse
    from posenc.graphs import optimize_file
    from posenc.validate import check_ort_parity

    source = _contrib_rope(tmp_path / "contrib.onnx")
    result = optimize_file(source, tmp_path / "contrib.trt.onnx", "trt", check=check_ort_parity)
    assert result.counts["convert_contrib_rope"] == 1
    assert result.parity is not None  # random feed of the graph's own types: no manifest here
    report = check_parse(result.path)
    assert report.parsed is True, report.message
    assert report.layers["ROTARY_EMBEDDING"] == 1
    # a graph without an export manifest gets a graph manifest; optimizing again keeps the first record
    from posenc.graphs.manifests import GraphManifest, read_manifest

    written = read_manifest(result.path)
    assert isinstance(written, GraphManifest)
    assert (written.optimized.source_onnx, written.optimized.counts["convert_contrib_rope"]) == ("contrib.onnx", 1)
    again = read_manifest(optimize_file(result.path, tmp_path / "contrib.trt2.onnx", "trt").path)
    assert isinstance(again, GraphManifest)
    assert again.optimized.previous == written.optimized
    assert len(again.notes) == 2


def test_an_output_path_that_cannot_be_written_leaves_no_manifest(export_cache, tmp_path) -> None:
    from posenc.errors import ConfigError

    source = fused_case(export_cache, ROPE)
    out = tmp_path / "rope.engine"
    out.mkdir()  # a directory where the engine should go
    with pytest.raises(ConfigError, match=r"engine .*rope\.engine is a folder; give a file path"):
        build_engine(source, out, targets=["sm89"])
    assert [p.name for p in tmp_path.iterdir()] == ["rope.engine"]  # no manifest, no temporary file
    assert not list(out.iterdir())


def test_a_stale_source_manifest_is_refused(export_cache, tmp_path) -> None:
    from posenc.errors import ModelFileError
    from posenc.export import manifest_path_for

    source = fused_case(export_cache, ROPE)
    copy = tmp_path / source.name
    copy.write_bytes(source.read_bytes() + b"\x00")  # no longer the file its manifest hashed
    manifest_path_for(copy).write_text(manifest_path_for(source).read_text())
    with pytest.raises(ModelFileError, match="does not match its manifest"):
        build_engine(copy, tmp_path / "rope.engine", targets=["sm89"])


ENGINE_CASES_SLOW = {
    "falcon_alibi": "the ALiBi blocks of tests/engine/test_matrix.py (a score bias as the Attention mask)",
    "bert_learned": "the sinusoidal blocks of the engine matrix (a table added at the embeddings)",
    "marian_sinusoidal_odd": "the sinusoidal blocks of the engine matrix",
    "deberta_v3": "the engine matrix's fused DeBERTa block (a bias that reads the keys)",
    "llama4_nope_temperature": "ministral3_scaled_query (the query scaled by position, before the Attention)",
    "olmo2_full_width_norm": "gemma2 (RMSNorm of q and k before the rotation; here over the whole projection)",
}
"""Feature engines built in make test-slow only, with the engine in make test that builds the same construct."""


def test_the_slow_feature_engines_are_feature_cases_and_leave_some_in_make_test() -> None:
    names = {c.name for c in ENGINE_CASES}
    assert set(ENGINE_CASES_SLOW) < names


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.name in ENGINE_CASES_SLOW else []) for c in ENGINE_CASES],
)
def test_blocks_with_checkpoint_options_build_ahead_of_time(export_cache, tmp_path, case) -> None:
    """q/k norm + soft-cap + window + biases, scaled bf16-rounded ALiBi, BERT embeddings, odd sinusoids and shared
    DeBERTa projections each build (the soft-capped attention decomposed: TensorRT's Attention cannot soft-cap)."""
    source = optimized_feature(export_cache, case, "trt")
    result = build_engine(source, tmp_path / "block.engine", targets=["sm89"], profile=["seq=1:8:16"])
    layers = result.manifest.layers
    assert layers.get("ATTENTION_OUTPUT", 0) == case.fused_attention_expected["trt"]
    assert result.manifest.engine_bytes > 0


def test_engine_of_a_dynamic_table_block_is_sized_to_its_context(tmp_path, capsys) -> None:
    """The engine of a dynamic-table block with 131072 positions gets a prefill and a decode profile reaching the
    context (not the old 2048 cap); build prints them and the engine manifest records them by name."""
    from posenc import AttentionConfig
    from posenc.export import export_scheme

    config = AttentionConfig(hidden_size=32, num_heads=2, num_kv_heads=1, max_position_embeddings=131072)
    source = export_scheme("rope_llama3", tmp_path / "long.onnx", config=config, table_mode="dynamic").path
    assert main(["inspect", str(source), "--no-tensorrt"]) == 0
    assert "prefill: batch 1:1:8, seq 1:512:131072, past 0:0:131071" in capsys.readouterr().out
    out = tmp_path / "long.engine"
    assert main(["build", str(source), "--engine-target", "sm89", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "decode: batch 1:1:8, seq 1:1:16, past 0:4095:131071" in printed
    manifest = json.loads(out.with_name("long.engine.manifest.json").read_text())
    assert manifest["profile_names"] == ["prefill", "decode"]
    assert [p["seq"]["max"] for p in manifest["profiles"]] == [131072, 16]


def test_a_graph_optimized_for_onnx_runtime_points_to_its_original_export(export_cache, tmp_path, capsys) -> None:
    """TensorRT cannot parse a graph optimized for ONNX Runtime; inspect and build name the original export to
    optimize for TensorRT (the optimized manifests' source), not the ONNX Runtime graph itself."""
    from posenc.graphs import optimize_file

    export = export_case(export_cache, BLOCK)
    ort = optimize_file(export, tmp_path / "block.ort.onnx", "ort-cpu").path
    again = optimize_file(ort, tmp_path / "block.ort2.onnx", "ort-cpu").path  # its record's chain leads to export
    for graph in (ort, again):
        assert main(["inspect", str(graph)]) == 0
        printed = capsys.readouterr().out
        assert "does NOT parse" in printed
        assert f"optimize its original export for TensorRT instead (`posenc optimize {export.name} --target trt`" in (
            printed
        )
        assert f"posenc optimize {graph.name}" not in printed
    with pytest.raises(BuildError, match=f"posenc optimize {export.name} --target trt"):
        build_engine(again, tmp_path / "block.engine", targets=["sm89"])
    assert not (tmp_path / "block.engine").exists()


def test_a_plugin_graph_is_not_silently_inlined_by_a_backend_without_plugins(export_cache, tmp_path, capsys) -> None:
    """`optimize --rope plugin`, then TensorRT-RTX (no plugins): inspect says the plugin node parses only as its
    ONNX function, inlined into many layers; build refuses, naming `--rope fused` on the original export, and builds
    it only when asked (--inline-plugins), the engine manifest recording the inlined layers."""
    from posenc.graphs import optimize_file

    export = export_case(export_cache, MatrixCase("rope", "precomputed", "float16", "block"))
    plugin = optimize_file(export, tmp_path / "block.plugin.onnx", "trt", "plugin").path
    assert main(["inspect", str(plugin)]) == 0
    printed = capsys.readouterr().out
    found = re.search(
        r"parses, with the posenc plugin inlined as its ONNX function \((\d+) layers\): tensorrt_rtx \S+ has no "
        r"plugins; `posenc optimize (\S+) --target trt --rope fused`",
        printed,
    )
    assert found, printed
    inlined, original = int(found[1]), found[2]
    assert inlined > 100  # the twin's elementwise body, where TensorRT's rotary layer is one layer per tensor
    assert original == export.name
    out = tmp_path / "block.engine"
    profile = ["seq=1:8:16", "past=0:0:16"]
    with pytest.raises(BuildError, match=r"has no plugins.*--rope fused.*--inline-plugins"):
        build_engine(plugin, out, targets=["sm89"], profile=profile)
    assert not out.exists()
    assert not engine_manifest_path(out).exists()
    argv = ["build", str(plugin), "--engine-target", "sm89", *(f"--profile={p}" for p in profile), "-o", str(out)]
    assert main(argv) == 2
    assert "--rope fused" in capsys.readouterr().err
    assert main([*argv, "--inline-plugins"]) == 0
    assert f"inlined as its ONNX function ({inlined} layers" in capsys.readouterr().out
    assert json.loads(engine_manifest_path(out).read_text())["inlined_plugin_layers"] == inlined
