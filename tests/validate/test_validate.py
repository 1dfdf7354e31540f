"""posenc.validate: reports, saved polygraphy results, mismatch detection, bad model files, bf16, tolerances."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from polygraphy.comparator import Comparator, SimpleCompareFunc
from polygraphy.comparator.struct import RunResults

from posenc import ModelFileError, PositionError
from posenc.export import FeedShape, export_scheme, load_eager, load_manifest, make_feed
from posenc.schemes import get_spec
from posenc.schemes.base import Tolerance
from posenc.validate import DEFAULT_SHAPES, EagerTorchRunner, default_shapes, tolerance_for, validate_onnx
from posenc.validate.bf16 import check_bf16_structure, emulate_bf16
from tests.conftest import SMALL, copy_export
from tests.matrix import MatrixCase, exported_result


@pytest.fixture(scope="module")
def yarn_op(tmp_path_factory):
    folder = tmp_path_factory.mktemp("yarn")
    return export_scheme("rope_yarn", folder / "yarn.onnx", unit="op", config=SMALL, table_mode="precomputed")


def test_report_table_json_and_polygraphy_results(yarn_op, tmp_path) -> None:
    shapes = [FeedShape(1, 1, 0), FeedShape(3, 5, 2)]
    report = validate_onnx(yarn_op.path, shapes=shapes)
    assert report.passed
    assert [(r.shape, r.output) for r in report.rows] == [(s, o) for s in shapes for o in ("q_rot", "k_rot")]
    tol = get_spec("rope_yarn").tolerance("float32")
    assert all((r.atol, r.rtol) == (tol.atol, tol.rtol) for r in report.rows)
    assert all(r.max_abs <= tol.atol for r in report.rows)
    markdown = report.to_markdown()
    assert "| 3, 5, 2 | eager-fp64 | onnxrt-cpu | k_rot |" in markdown
    assert "PASS" in markdown
    written = report.save(tmp_path / "r.md", tmp_path / "r.json", tmp_path / "r.runs.json")
    assert [p.name for p in written] == ["r.md", "r.json", "r.runs.json"]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["passed"] is True
    assert len(data["rows"]) == 4
    # polygraphy can reload and re-compare the saved outputs on its own
    loaded = RunResults.load(str(tmp_path / "r.runs.json"))
    assert sorted(loaded.keys()) == ["eager-fp32", "eager-fp64", "onnxrt-cpu"]  # fp32: the floor's measuring runs
    again = Comparator.compare_accuracy(loaded, compare_func=SimpleCompareFunc(atol=tol.atol, rtol=tol.rtol))
    assert bool(again)


def test_eager_runner_is_a_float64_reference(yarn_op) -> None:
    module, manifest = load_eager(yarn_op.path)
    shape = FeedShape(2, 3, 4)
    runner = EagerTorchRunner(module, manifest, shape)
    with runner:
        metadata = runner.get_input_metadata(use_numpy_dtypes=False)
        assert {name: tuple(meta.shape) for name, meta in metadata.items()} == {
            "q": (2, SMALL.num_heads, 3, SMALL.head_dim),
            "k": (2, SMALL.num_kv_heads, 3, SMALL.head_dim),
            "position_ids": (2, 3),
        }
        outputs = runner.infer(make_feed(manifest, shape))
        assert runner.last_inference_time() is not None
    assert list(outputs) == ["q_rot", "k_rot"]
    assert all(v.dtype == np.float64 for v in outputs.values())


def test_a_graph_that_disagrees_with_its_reference_fails(yarn_op, tmp_path) -> None:
    path = copy_export(yarn_op, tmp_path)
    manifest_path = tmp_path / yarn_op.manifest_path.name
    data = json.loads(manifest_path.read_text())
    data["params"]["factor"] = 2.0  # the graph was built with factor 4: the reference no longer matches
    manifest_path.write_text(json.dumps(data))
    report = validate_onnx(path, shapes=[FeedShape(2, 9, 30)])
    assert not report.passed
    assert {r.output for r in report.failures()} == {"q_rot", "k_rot"}
    assert "**FAIL**" in report.to_markdown()


def test_stricter_tolerance_override_fails(yarn_op) -> None:
    strict = {"q_rot": Tolerance(atol=0.0, rtol=0.0)}
    report = validate_onnx(yarn_op.path, shapes=[FeedShape(2, 9, 30)], tolerances=strict)
    assert [r.output for r in report.failures()] == ["q_rot"]


def test_corrupt_and_truncated_models_raise_model_file_error(yarn_op, tmp_path) -> None:
    path = copy_export(yarn_op, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match=r"truncated or corrupt.*posenc export"):
        validate_onnx(path)
    path.write_bytes(b"\x00not an onnx model" * 10)
    with pytest.raises(ModelFileError, match=r"[Rr]e-export"):
        validate_onnx(path)
    with pytest.raises(ModelFileError, match="does not exist"):
        validate_onnx(tmp_path / "missing.onnx")


def test_manifest_that_does_not_match_its_model(yarn_op, tmp_path) -> None:
    path = copy_export(yarn_op, tmp_path)
    model = onnx.load(str(path))
    model.doc_string = "edited after export"  # still valid ONNX, other bytes
    onnx.save(model, str(path))
    with pytest.raises(ModelFileError, match="does not match its manifest"):
        validate_onnx(path)
    path.write_bytes(yarn_op.path.read_bytes())
    weights = tmp_path / yarn_op.weights_path.name
    weights.write_bytes(weights.read_bytes() + b"\x00")
    with pytest.raises(ModelFileError, match="does not match the sha256"):
        load_manifest(path)
    weights.unlink()
    with pytest.raises(ModelFileError, match="missing"):
        load_manifest(path)
    weights.write_bytes(yarn_op.weights_path.read_bytes())  # the graph reads its tensors from the weights file
    (tmp_path / yarn_op.manifest_path.name).unlink()
    with pytest.raises(ModelFileError, match="no manifest"):
        validate_onnx(path)


def test_shapes_past_the_table_are_refused(yarn_op) -> None:
    with pytest.raises(PositionError, match="dynamic"):
        validate_onnx(yarn_op.path, shapes=[FeedShape(1, 8, SMALL.max_position_embeddings)])


def test_bf16_graph_is_checked_structurally_and_by_emulation(export_cache) -> None:
    result = exported_result(MatrixCase("rope", "precomputed", "bfloat16", "block"), export_cache, SMALL)
    model = onnx.load(str(result.path))
    assert check_bf16_structure(model) == []
    emulated = emulate_bf16(model)
    casts = [n for n in emulated.graph.node if n.op_type == "Cast"]
    assert any(a.name == "to" and a.i == onnx.TensorProto.BFLOAT16 for n in casts for a in n.attribute)
    assert onnx.TensorProto.BFLOAT16 not in {i.data_type for i in emulated.graph.initializer}
    report = validate_onnx(result.path, shapes=[FeedShape(2, 5, 3)])
    assert report.mode == "bf16-emulated"
    assert report.passed, report.to_markdown()
    assert report.rows[0].atol == get_spec("rope").tolerance("bfloat16").atol


def test_tolerance_follows_the_output_dtype(tmp_path) -> None:
    result = export_scheme("alibi", tmp_path / "alibi16.onnx", unit="op", config=SMALL, dtype="fp16")
    (bias,) = result.manifest.outputs
    assert bias.dtype == "float32"  # gathered from the float32 table
    report = validate_onnx(result.path, shapes=[FeedShape(2, 3, 4)])
    assert report.rows[0].atol == get_spec("alibi").tolerance("float32").atol
    assert tolerance_for("rope", "fp16", "q_rot") == get_spec("rope").tolerance("float16")


def test_default_shapes_shrink_to_a_short_table(yarn_op) -> None:
    short = dataclasses.replace(yarn_op.manifest, max_positions=5)
    shapes = default_shapes(short)
    assert all(s.past + s.seq <= 5 for s in shapes)
    assert {s.seq for s in shapes} >= {1, 5}
    assert any(s.past > 0 for s in shapes)
    unbounded = default_shapes(dataclasses.replace(yarn_op.manifest, max_positions=None))
    assert unbounded[: len(DEFAULT_SHAPES)] == list(DEFAULT_SHAPES)  # then the context's boundaries
    assert all(s.seq == 4 and s.start is not None for s in unbounded[len(DEFAULT_SHAPES) :])
