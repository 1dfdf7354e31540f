"""``posenc optimize`` / ``posenc inspect`` and the files they write."""

from __future__ import annotations

import json
import shutil
import sys

import onnx_ir as ir
import pytest

from posenc.cli import main
from posenc.errors import ConfigError, ModelFileError, ParityError
from posenc.export import export_scheme, load_manifest, manifest_path_for
from posenc.graphs import optimize as optimize_module
from posenc.graphs import optimize_file
from posenc.validate import check_ort_parity
from tests.graphs.artifacts import export_case
from tests.graphs.helpers import GUARD_OPS
from tests.matrix import MatrixCase

CASE = MatrixCase("rope", "precomputed", "float32", "op", case="partial")


@pytest.fixture
def exported(export_cache, tmp_path):
    source = export_case(export_cache, CASE)
    for path in (source, manifest_path_for(source), source.with_name(source.stem + ".weights.safetensors")):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / source.name


def test_optimize_writes_model_and_manifest_with_pass_counts(exported, capsys) -> None:
    out = exported.with_name("rope.trt.onnx")
    assert main(["optimize", str(exported), "--target", "trt", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fuse_rope" in printed
    assert "parity on ONNX Runtime CPU" in printed
    data = json.loads(manifest_path_for(out).read_text())
    record = data["optimized"]
    assert record["target"] == "trt"
    assert record["rope"] == "fused"
    counts = {p["name"]: p["count"] for p in record["passes"]}
    assert counts["fuse_rope"] == 2
    assert counts["fuse_partial_rope"] == 2
    assert set(record["parity"]) == {"q_rot", "k_rot"}
    manifest = load_manifest(out)  # hashes of the new model and its copied weights verify
    assert manifest.scheme == "rope"


def test_inspect_reports_ops_bytes_fusions_and_tensorrt(exported, capsys) -> None:
    out = exported.with_name("rope.trt.onnx")
    optimize_file(exported, out, "trt")
    assert main(["inspect", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fused_ops"] == {"RotaryEmbedding": 2}
    assert set(report["ops"]) - GUARD_OPS == {"RotaryEmbedding"}  # no decomposed rotation left
    tables = 2 * 64 * 4 * 4  # cos and sin tables [64, r/2 = 4] float32 (r = 8)
    assert tables <= report["initializer_bytes"] <= tables + 64  # and the position guard's few scalars
    assert report["fusions"]["fuse_rope"] == 2
    assert report["target"] == "trt"
    tensorrt = report["tensorrt"]
    if tensorrt["parsed"] is None:
        pytest.skip(tensorrt["message"])
    assert tensorrt["parsed"] is True
    assert tensorrt["layers"]["ROTARY_EMBEDDING"] == 2
    assert main(["inspect", str(exported)]) == 0
    assert "fusions applied: unknown" in capsys.readouterr().out


def test_optimize_refuses_to_overwrite_its_input(exported) -> None:
    with pytest.raises(ModelFileError, match="input file"):
        optimize_file(exported, exported, "trt")


def test_unknown_target_and_rope_mode_list_the_valid_ones(exported) -> None:
    with pytest.raises(ConfigError, match=r"\['ort-cpu', 'ort-cuda', 'trt'\]"):
        optimize_file(exported, exported.with_name("x.onnx"), "tensorrt")
    with pytest.raises(ConfigError, match="fused"):
        optimize_file(exported, exported.with_name("x.onnx"), "trt", "fast")


def test_corrupt_or_stale_input_is_a_clear_error(exported, tmp_path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x08\x07not a model")
    with pytest.raises(ModelFileError, match="not a readable ONNX"):
        optimize_file(broken, tmp_path / "out.onnx", "trt")
    exported.write_bytes(exported.read_bytes() + b"\x00")
    with pytest.raises(ModelFileError, match="does not match its manifest"):
        optimize_file(exported, tmp_path / "out.onnx", "trt")


def test_parity_failure_writes_nothing(exported, monkeypatch) -> None:
    def wrong(model):  # a broken pass: pairs the wrong features
        for node in model.graph:
            if node.op_type == "RotaryEmbedding":
                node.attributes["interleaved"] = ir.AttrInt64("interleaved", 1)
        return 1

    monkeypatch.setattr(optimize_module.rope, "fuse_partial_rope", lambda model: 0)
    monkeypatch.setattr(optimize_module.rope_layouts, "rope_for_tensorrt", wrong)
    out = exported.with_name("bad.onnx")
    with pytest.raises(ParityError, match="differs from the original"):
        optimize_file(exported, out, "trt", check=check_ort_parity)
    assert not out.exists()
    assert not manifest_path_for(out).exists()


def test_plugin_mode_without_the_plugin_module_says_what_to_do(exported, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "posenc.graphs.rope_plugin", None)
    with pytest.raises(ConfigError, match="--rope fused"):
        optimize_file(exported, exported.with_name("p.onnx"), "trt", "plugin")


def test_keep_mode_leaves_rope_decomposed(exported) -> None:
    result = optimize_file(exported, exported.with_name("k.onnx"), "ort-cpu", "keep")
    assert "fuse_rope" not in result.counts
    assert not any(n.op_type == "RotaryEmbedding" for n in result.model.graph)


@pytest.mark.parametrize(
    ("dtype", "max_positions"),
    [("bfloat16", None), ("float32", 4)],
    ids=["bf16-emulated", "table-shorter-than-the-parity-feed"],
)
def test_parity_check_runs_bf16_graphs_and_short_tables(export_cache, tmp_path, dtype, max_positions) -> None:
    from posenc import AttentionConfig
    from posenc.export import export_scheme

    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=64)
    source = export_scheme(
        "rope", tmp_path / "rope.onnx", unit="op", config=config, dtype=dtype, max_positions=max_positions
    ).path
    result = optimize_file(source, tmp_path / "rope.ort.onnx", "ort-cpu", check=check_ort_parity)
    assert result.counts["fuse_rope"] == 2
    assert set(result.parity) == {"q_rot", "k_rot"}
    assert load_manifest(result.path).dtype == dtype  # the new files verify against each other


def test_optimized_files_are_readable_by_others_and_land_together(exported) -> None:
    import os
    import stat

    out = exported.with_name("rope.ort.onnx")
    optimize_file(exported, out, "ort-cpu")
    mask = os.umask(0)
    os.umask(mask)
    for path in (out, manifest_path_for(out)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, path
    assert not out.with_name("rope.ort.weights.safetensors").exists()  # beside its export: reads its weights file
    assert not list(exported.parent.glob(".*.tmp"))


@pytest.mark.parametrize("target", ["trt", "ort-cpu"], ids=["for-tensorrt", "for-ort-cpu"])  # "trt": a GPU marker
def test_the_manifest_says_the_dtype_the_optimized_graph_stores_its_tables_in(export_cache, tmp_path, target) -> None:
    """A bf16 block's position tables: float32 in the export; for TensorRT its RotaryEmbedding takes them in bf16,
    and the optimized manifest's table_dtype says what the graph holds (every table initializer), with a note."""
    import onnx

    from posenc.dtypes import dtype_name

    source = export_case(export_cache, MatrixCase("rope", "precomputed", "bfloat16", "block"))
    out = tmp_path / f"block.{target}.onnx"
    optimize_file(source, out, target)
    manifest = load_manifest(out)
    graph = onnx.load(str(out), load_external_data=False)
    tables = {
        init.name: dtype_name(onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name)
        for init in graph.graph.initializer
        if any(init.name == key or init.name.startswith(f"{key}_") for key in manifest.weights.tables)
    }
    assert len(tables) == 2, tables  # cos and sin
    assert set(tables.values()) == {manifest.table_dtype}, (tables, manifest.table_dtype)
    assert manifest.table_dtype == ("bfloat16" if target == "trt" else "float32")
    assert any("bfloat16" in note and "RotaryEmbedding" in note for note in manifest.notes) is (target == "trt")


def test_inspect_totals_tables_and_weights_apart_and_warns_when_tables_outweigh(tmp_path, capsys) -> None:
    """Totals against the weights file itself (safetensors entries: the manifest's table keys vs the rest)."""
    from safetensors import safe_open

    from posenc.config import AttentionConfig

    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=4096)
    for mode, warned in (("precomputed", True), ("dynamic", False)):
        result = export_scheme("rope", tmp_path / f"{mode}.onnx", config=config, table_mode=mode)
        tables = weights = 0
        with safe_open(str(result.weights_path), "pt") as entries:
            for name in entries.keys():  # noqa: SIM118  # safe_open is not a mapping
                size = entries.get_tensor(name).numel() * 4
                if name in result.manifest.weights.tables:
                    tables += size
                else:
                    weights += size
        assert main(["inspect", str(result.path), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["table_bytes"] == (tables if warned else 0)  # dynamic: inv_freq folds into the graph's math
        assert weights <= report["weight_bytes"] <= weights + 256  # and the graph's few small constants
        assert (tables > weights) is warned  # 4096 rows of cos/sin outweigh 64-wide projections
        assert bool(report["warnings"]) is warned
        if warned:
            assert "--table-mode dynamic" in report["warnings"][0]
