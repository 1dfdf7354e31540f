"""posenc.export: manifest and side files, units, dtypes, opsets, dynamic dims, atomic writes, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
import torch

from posenc import AttentionBlock, ConfigError, ExportError, ModelFileError, PositionError, get_spec, scheme_names
from posenc.export import (
    FeedShape,
    check_feed,
    export_module,
    export_onnx,
    export_scheme,
    load_eager,
    load_manifest,
    make_feed,
    ort_session,
    reference_inputs,
    run_onnx,
    sha256_file,
)
from posenc.export import exporter as exporter_module
from posenc.validate import validate_onnx
from tests.conftest import SMALL, private_export
from tests.matrix import MatrixCase, exported_result


@pytest.fixture(scope="module")
def rope_block(export_cache):
    """A precomputed fp32 RoPE block (table of 64 rows, grouped-query geometry): the matrix's export, shared with the
    engine tests; read only (a test that writes beside it works on a copy)."""
    return exported_result(MatrixCase("rope", "precomputed", "float32", "block"), export_cache, SMALL)


def test_manifest_describes_the_graph(rope_block) -> None:
    m = rope_block.manifest
    stem = rope_block.path.stem  # model.onnx -> model.manifest.json, model.weights.safetensors
    assert rope_block.manifest_path.name == f"{stem}.manifest.json"
    assert rope_block.weights_path.name == f"{stem}.weights.safetensors"
    assert m.onnx_sha256 == sha256_file(rope_block.path)
    assert m.weights.sha256 == sha256_file(rope_block.weights_path)
    assert (m.scheme, m.unit, m.table_mode, m.dtype, m.table_dtype, m.opset) == (
        "rope",
        "block",
        "precomputed",
        "float32",
        "float32",
        23,
    )
    assert m.params == get_spec("rope").resolve({}, SMALL)
    assert m.max_positions == SMALL.max_position_embeddings
    assert m.attention == SMALL.to_dict()
    assert set(m.dynamic_dims) == {"batch", "seq", "past"}
    assert m.dynamic_dims["past"].min == 0
    assert m.dynamic_dims["seq"].min == 1
    assert min(d.sample for d in m.dynamic_dims.values()) >= 2  # torch.export specializes 0/1 samples
    hkv, d = SMALL.num_kv_heads, SMALL.head_dim
    assert [(s.name, s.dtype, list(s.shape)) for s in m.inputs] == [
        ("hidden", "float32", ["batch", "seq", SMALL.hidden_size]),
        ("position_ids", "int64", ["batch", "seq"]),
        ("past_key", "float32", ["batch", hkv, "past", d]),
        ("past_value", "float32", ["batch", hkv, "past", d]),
    ]
    assert [s.role for s in m.inputs] == ["activation", "positions", "cache", "cache"]
    assert [(s.name, list(s.shape)) for s in m.outputs] == [
        ("out", ["batch", "seq", SMALL.hidden_size]),
        ("present_key", ["batch", hkv, "past + seq", d]),
        ("present_value", ["batch", hkv, "past + seq", d]),
    ]
    assert {"torch", "onnx", "onnxruntime", "posenc"} <= set(m.versions)
    assert m.source.module == "posenc.blocks.attention.AttentionBlock"
    assert len(m.source.posenc_sha256) == 64
    on_disk = json.loads(rope_block.manifest_path.read_text())
    assert on_disk == m.to_dict()
    assert load_manifest(rope_block.path) == m
    assert load_manifest(rope_block.manifest_path) == m


def test_graph_inputs_match_manifest_and_run_with_and_without_past(rope_block) -> None:
    model = onnx.load(str(rope_block.path))
    assert [v.name for v in model.graph.input] == rope_block.manifest.input_names
    assert model.opset_import[0].version == 23
    reference, manifest = load_eager(rope_block.path)
    for shape in (FeedShape(1, 1, 0), FeedShape(2, 1, 30)):
        feed = make_feed(manifest, shape)
        assert np.array_equal(feed["position_ids"], np.tile(shape.past + np.arange(shape.seq), (shape.batch, 1)))
        got = run_onnx(rope_block.path, feed, manifest=manifest)
        with torch.no_grad():
            want = reference(*reference_inputs(manifest, feed, torch.float64))
        for name, expected in zip(manifest.output_names, want, strict=True):
            assert got[name].shape == tuple(expected.shape)
            np.testing.assert_allclose(got[name], expected.numpy(), atol=3e-5, rtol=1e-4)


def test_weights_rebuild_the_exported_module(tmp_path) -> None:
    block = AttentionBlock(SMALL, "learned", table_mode="precomputed")
    with torch.no_grad():
        block.scheme.weight.normal_()  # "trained" weights differ from a fresh build
    result = export_onnx(block, tmp_path / "learned.onnx", unit="block")
    rebuilt, _ = load_eager(result.path, dtype=torch.float32)
    torch.testing.assert_close(rebuilt.scheme.weight, block.scheme.weight)
    torch.testing.assert_close(rebuilt.q_proj.weight, block.q_proj.weight)
    assert validate_onnx(result.path).passed


def test_position_only_bias_op_has_only_position_inputs(export_cache) -> None:
    result = exported_result(MatrixCase("alibi", "dynamic", "float32", "op"), export_cache, SMALL)
    model = onnx.load(str(result.path))
    assert [v.name for v in model.graph.input] == ["q_pos", "k_pos"] == result.manifest.input_names
    assert result.manifest.max_positions is None
    assert any("not read" in note for note in result.manifest.notes)
    assert validate_onnx(result.path).passed


def test_fp16_graph_keeps_float32_tables(export_cache) -> None:
    result = exported_result(MatrixCase("rope", "precomputed", "float16", "op"), export_cache, SMALL)
    model = onnx.load(str(result.path))
    assert {v.type.tensor_type.elem_type for v in model.graph.input if v.name != "position_ids"} == {
        onnx.TensorProto.FLOAT16
    }
    tables = [i for i in model.graph.initializer if list(i.dims) == [SMALL.max_position_embeddings, 8]]
    assert tables
    assert {t.data_type for t in tables} == {onnx.TensorProto.FLOAT}
    assert result.manifest.dtype == "float16"
    assert result.manifest.table_dtype == "float32"


@pytest.mark.parametrize("opset", [17, 18])
def test_older_opsets_export_and_match(opset: int, tmp_path) -> None:
    # dynamic NTK reduces max(position_ids) in the graph: opset 17 needs ReduceMax with attributes
    result = export_scheme(
        "rope_dynamic", tmp_path / "ntk.onnx", unit="op", config=SMALL, table_mode="dynamic", opset=opset
    )
    model = onnx.load(str(result.path))
    assert model.opset_import[0].version == opset == result.manifest.opset
    assert validate_onnx(result.path, shapes=[FeedShape(2, 5, 70)]).passed


def _in_graph_mode(name: str) -> str:
    """``dynamic`` where the scheme has it (most ops in the graph), else ``precomputed``."""
    return "dynamic" if any(m.value == "dynamic" for m in get_spec(name).table_modes) else "precomputed"


OPSET17_FAST = ("sinusoidal", "rope", "rope_mrope", "alibi", "t5", "deberta")
"""One scheme per placement (and a multi-axis one) in make test; every other scheme's opset-17 export is slow."""


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[] if n in OPSET17_FAST else [pytest.mark.slow]) for n in scheme_names()]
)
def test_every_block_exports_to_opset_17_for_older_runtimes(name: str, tmp_path) -> None:
    result = export_scheme(
        name, tmp_path / f"{name}.onnx", unit="block", config=SMALL, table_mode=_in_graph_mode(name), opset=17
    )
    assert onnx.load(str(result.path)).opset_import[0].version == 17
    assert validate_onnx(result.path, shapes=[FeedShape(2, 5, 3)]).passed


@pytest.mark.parametrize("opset", [13, 16, 19, 25])
def test_unsupported_opset_lists_the_supported_ones(opset: int, tmp_path) -> None:
    with pytest.raises(ExportError, match=r"\[17, 18, 23, 24\]"):
        export_scheme("rope", tmp_path / "x.onnx", config=SMALL, opset=opset)
    assert list(tmp_path.iterdir()) == []


def test_in_place_cache_needs_opset_24_and_a_block(tmp_path) -> None:
    with pytest.raises(ExportError, match="--opset 24"):
        export_scheme("rope", tmp_path / "x.onnx", config=SMALL, kv_cache="inplace", opset=23)
    with pytest.raises(ExportError, match="has no cache"):
        export_scheme("rope", tmp_path / "x.onnx", unit="op", config=SMALL, kv_cache="inplace")
    with pytest.raises(ExportError, match="kv cache layout"):
        export_scheme("rope", tmp_path / "x.onnx", config=SMALL, kv_cache="paged")
    assert list(tmp_path.iterdir()) == []


def test_unsupported_dtype_raises(tmp_path, monkeypatch) -> None:
    with pytest.raises(ExportError, match="fp32, fp16, bf16"):
        export_scheme("rope", tmp_path / "x.onnx", config=SMALL, dtype="int8")
    with pytest.raises(ExportError, match="cannot be exported"):
        export_scheme("rope", tmp_path / "x.onnx", config=SMALL, dtype="float64")
    monkeypatch.delitem(get_spec("alibi").tolerances, "bfloat16")
    with pytest.raises(ExportError, match="does not support dtype bfloat16"):
        export_scheme("alibi", tmp_path / "x.onnx", config=SMALL, dtype="bf16")
    assert list(tmp_path.iterdir()) == []


def test_unit_and_table_mode_errors(tmp_path) -> None:
    with pytest.raises(ExportError, match="unit 'op'"):
        export_scheme("nope", tmp_path / "x.onnx", unit="op", config=SMALL)
    with pytest.raises(ExportError, match="unknown export unit"):
        export_scheme("rope", tmp_path / "x.onnx", unit="layer", config=SMALL)
    with pytest.raises(ConfigError, match="does not support table mode"):
        export_scheme("rope_dynamic", tmp_path / "x.onnx", config=SMALL, table_mode="precomputed")
    assert list(tmp_path.iterdir()) == []


def test_failed_export_leaves_nothing_behind(rope_block, tmp_path, monkeypatch) -> None:
    def broken_manifest(*args, **kwargs):
        raise RuntimeError("disk full while writing the manifest")

    monkeypatch.setattr(exporter_module, "export_manifest", broken_manifest)
    with pytest.raises(RuntimeError, match="disk full"):
        export_scheme("rope", tmp_path / "model.onnx", unit="op", config=SMALL)
    assert list(tmp_path.iterdir()) == []  # neither final files nor temporaries

    # a failed re-export leaves the previous, complete artifacts untouched (a copy: the shared export is left alone)
    (tmp_path / "previous").mkdir()
    previous = private_export(rope_block.path, tmp_path / "previous")
    before = {p.name: sha256_file(p) for p in previous.path.parent.iterdir()}
    with pytest.raises(RuntimeError, match="disk full"):
        export_scheme("rope", previous.path, unit="op", config=SMALL)
    assert {p.name: sha256_file(p) for p in previous.path.parent.iterdir()} == before


def test_tracing_failure_is_an_export_error(tmp_path, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise RuntimeError("unsupported operator")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    with pytest.raises(ExportError, match="unsupported operator"):
        export_scheme("rope", tmp_path / "model.onnx", unit="op", config=SMALL)
    assert list(tmp_path.iterdir()) == []


def test_positions_past_the_table_are_refused_with_the_remedy(rope_block) -> None:
    manifest = load_manifest(rope_block.path)
    limit = manifest.max_positions
    feed = make_feed(manifest, FeedShape(1, 4, limit - 4))
    check_feed(manifest, feed)  # last position limit - 1: fine
    with pytest.raises(PositionError, match=r"--max-positions|table-mode dynamic") as info:
        run_onnx(rope_block.path, make_feed(manifest, FeedShape(1, 4, limit - 3)), manifest=manifest)
    assert str(limit) in str(info.value)
    late = make_feed(manifest, FeedShape(1, 1, 0))
    late["position_ids"] = np.array([[limit + 100]], dtype=np.int64)
    with pytest.raises(PositionError, match=f"position {limit + 100}"):
        check_feed(manifest, late)
    late["position_ids"] = np.array([[-1]], dtype=np.int64)
    with pytest.raises(PositionError, match=">= 0"):
        check_feed(manifest, late)


def test_feed_errors_name_the_input(rope_block) -> None:
    manifest = rope_block.manifest
    feed = make_feed(manifest, FeedShape(2, 3, 1))
    with pytest.raises(ConfigError, match="missing"):
        check_feed(manifest, {k: v for k, v in feed.items() if k != "past_value"})
    with pytest.raises(ConfigError, match="int64"):
        check_feed(manifest, {**feed, "position_ids": feed["position_ids"].astype(np.int32)})
    with pytest.raises(ConfigError, match="all inputs must agree on batch"):
        check_feed(manifest, {**feed, "position_ids": feed["position_ids"][:1]})
    with pytest.raises(ConfigError, match="axis 2 must be 64"):
        check_feed(manifest, {**feed, "hidden": np.zeros((2, 3, 65), np.float32)})


def test_dynamic_mode_has_no_position_limit(export_cache) -> None:
    result = exported_result(MatrixCase("rope", "dynamic", "float32", "op"), export_cache, SMALL)
    manifest = result.manifest
    assert manifest.max_positions is None
    assert manifest.dynamic_dims["seq"].max is None
    assert validate_onnx(result.path, shapes=[FeedShape(2, 3, 100_000)]).passed


def test_load_manifest_errors(rope_block, tmp_path) -> None:
    with pytest.raises(ModelFileError, match="does not exist"):
        load_manifest(tmp_path / "absent.onnx")
    lonely = tmp_path / "lonely.onnx"
    lonely.write_bytes(rope_block.path.read_bytes())
    with pytest.raises(ModelFileError, match="no manifest"):
        load_manifest(lonely)


class Float64Constants(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x / (2 * math.pi), x * 2.7, 0.3 - x, x + 0.1


def test_python_scalars_keep_float64_precision_in_the_graph(tmp_path) -> None:
    # torch.onnx alone exports these constants rounded to float32 (2π -> 6.28318548)
    x = torch.randn(2, 3, dtype=torch.float64)
    path = export_module(
        Float64Constants(), (x,), tmp_path / "f64.onnx", input_names=["x"], output_names=["a", "b", "c", "d"]
    )
    got = ort_session(path).run(None, {"x": x.numpy()})
    for value, expected in zip(got, Float64Constants()(x), strict=True):
        np.testing.assert_array_equal(value, expected.numpy())


def test_records_of_later_stages_survive_a_manifest_round_trip(rope_block, tmp_path) -> None:
    """`posenc optimize` adds an `optimized` record; loading and saving the manifest must keep it, typed."""
    from posenc.export.manifest import Manifest

    data = json.loads(rope_block.manifest_path.read_text())
    data["optimized"] = {
        "target": "trt",
        "rope": "fused",
        "passes": [{"name": "fuse_rope", "count": 2}, {"name": "fold_constants", "count": 0, "skipped": "opset 18"}],
        "parity": {"q_rot": {"max_abs_diff": 1e-7, "atol": 1e-5, "rtol": 1e-4}},
        "source_onnx": "m.onnx",
        "source_sha256": "ab" * 32,
    }
    manifest = Manifest.from_dict(data)
    assert manifest.optimized is not None
    assert manifest.optimized.counts == {"fuse_rope": 2, "fold_constants": 0}
    assert manifest.optimized.passes[1].skipped == "opset 18"
    assert manifest.optimized.parity["q_rot"].max_abs_diff == 1e-7
    assert manifest.to_dict() == data
    saved = manifest.save(tmp_path / "m.manifest.json")
    assert Manifest.from_dict(json.loads(saved.read_text())) == manifest


@pytest.mark.parametrize(
    ("where", "change"),
    [
        ("top level", lambda d: d.update(weight_file=d.pop("weights"))),  # a renamed key
        ("weights", lambda d: d["weights"].pop("source")),  # a missing key
        ("weights.source", lambda d: d["weights"]["source"].update(kind="trained")),  # an unknown kind
        ("optimized", lambda d: d.update(optimized={"target": "trt", "passes": [{"name": "x", "matches": 2}]})),
        ("dynamic_dims", lambda d: d["dynamic_dims"]["seq"].update(max="64")),  # a value of the wrong type
    ],
)
def test_a_manifest_with_renamed_missing_or_malformed_keys_asks_to_re_export(rope_block, where, change) -> None:
    """Manifests are read strictly: nothing defaults silently, the error names the place and says re-export."""
    from posenc.errors import ModelFileError
    from posenc.export.manifest import Manifest

    data = json.loads(rope_block.manifest_path.read_text())
    change(data)
    with pytest.raises(ModelFileError, match="re-export") as info:
        Manifest.from_dict(data)
    if where != "top level":
        assert where.split(".")[0] in str(info.value)


@pytest.mark.parametrize("case", ["default", "interleaved_partial"])
def test_op_3d_rotates_the_projection_layout_and_matches_eager(case: str, export_cache) -> None:
    """Unit op-3d: q [B, S, H*D], k [B, S, Hkv*D] in and out, equal to the op on [B, H, S, D] re-laid out (the
    matrix's export of the case, shared with the fusion tests)."""
    params = get_spec("rope").cases[case]
    result = exported_result(MatrixCase("rope", "precomputed", "float32", "op-3d", case=case), export_cache, SMALL)
    names = [(s.name, s.layout) for s in result.manifest.inputs]
    assert names == [("q", "[B, S, H*D]"), ("k", "[B, S, Hkv*D]"), ("position_ids", "[B, S]")]
    assert validate_onnx(result.path).passed
    # independent check: the same rotation as the [B, H, S, D] op, after moving heads
    from posenc.export import run_onnx

    b, s, h, hkv, d = 2, 5, SMALL.num_heads, SMALL.num_kv_heads, SMALL.head_dim
    q, k = torch.randn(b, s, h * d), torch.randn(b, s, hkv * d)
    pos = torch.arange(3, 3 + s).expand(b, s)
    outputs = run_onnx(result.path, {"q": q.numpy(), "k": k.numpy(), "position_ids": pos.numpy()})
    q_rot, k_rot = outputs["q_rot"], outputs["k_rot"]
    from posenc import build_scheme

    scheme = build_scheme("rope", SMALL, params)
    want_q, want_k = scheme.rotate(q.view(b, s, h, d).transpose(1, 2), k.view(b, s, hkv, d).transpose(1, 2), pos)
    np.testing.assert_allclose(q_rot, want_q.transpose(1, 2).reshape(b, s, h * d).numpy(), atol=1e-5)
    np.testing.assert_allclose(k_rot, want_k.transpose(1, 2).reshape(b, s, hkv * d).numpy(), atol=1e-5)


def test_op_3d_is_only_for_rotary_schemes(tmp_path) -> None:
    with pytest.raises(ExportError, match="op-3d"):
        export_scheme("alibi", tmp_path / "a.onnx", unit="op-3d", config=SMALL)


def test_one_session_factory_serves_files_bytes_and_benchmarks(rope_block) -> None:
    """ort_session: a path or serialized bytes give the same outputs; benchmark options reach the session."""
    feed = make_feed(rope_block.manifest, FeedShape(2, 3, 1))
    timed = ort_session(rope_block.path, ["CPUExecutionProvider"], threads=1, spinning=False)
    options = timed.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.inter_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    inline = onnx.load(str(rope_block.path)).SerializeToString()  # its weights file's tensors loaded into it
    from_bytes = ort_session(inline, ["CPUExecutionProvider"])
    for a, b in zip(timed.run(None, feed), from_bytes.run(None, feed), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ModelFileError, match="ONNX Runtime cannot load the serialized model"):
        ort_session(b"not a model", ["CPUExecutionProvider"])
