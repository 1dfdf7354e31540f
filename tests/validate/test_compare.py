"""posenc.validate.compare: references x candidates, per-reference tolerances, informational references,
PyTorch callables as references, the reference column of reports, and the optimize before/after check."""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from posenc.errors import ConfigError, ParityError
from posenc.export import FeedShape, load_eager, reference_inputs
from posenc.export.manifest import OutputDrift
from posenc.graphs.manifests import read_model_info
from posenc.schemes import DEFAULT_TOLERANCES, get_spec
from posenc.schemes.base import Tolerance
from posenc.validate import (
    EAGER,
    REFERENCE_NAME,
    Reference,
    TorchModuleRunner,
    check_ort_parity,
    compare,
    fit_shapes,
    validate_onnx,
)
from posenc.validate.compare import Float32Floor
from tests.conftest import SMALL
from tests.matrix import MatrixCase, exported

SHAPES = [FeedShape(2, 5, 3)]
TOL = get_spec("rope").tolerance("float32")


@pytest.fixture(scope="module")
def rope_op(export_cache):
    """The float32 RoPE op of the shared export cache (the parity matrix uses the same file)."""
    return exported(MatrixCase("rope", "precomputed", "float32", "op"), export_cache, SMALL)


def _posenc_module_fn(path, shift: float = 0.0):
    """The eager posenc module as a plain callable from feed dict to outputs (k_rot shifted by ``shift``)."""
    module, manifest = load_eager(path)

    def run(feed: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        q_rot, k_rot = module(*reference_inputs(manifest, feed, torch.float64))
        return {"q_rot": q_rot, "k_rot": k_rot + shift}

    return run


def test_a_torch_callable_serves_as_the_reference(rope_op) -> None:
    runner = TorchModuleRunner(_posenc_module_fn(rope_op), "posenc-module", ["q_rot", "k_rot"])
    reference = Reference(runner, "the eager posenc module called through TorchModuleRunner")
    report = validate_onnx(rope_op, shapes=SHAPES, references=[reference])
    assert report.passed, report.to_markdown()
    assert [(r.reference, r.runner, r.output) for r in report.rows] == [
        ("posenc-module", "onnxrt-cpu", "q_rot"),
        ("posenc-module", "onnxrt-cpu", "k_rot"),
    ]
    assert all(r.max_abs <= TOL.atol for r in report.rows)


def test_a_perturbed_reference_fails_only_the_output_it_moves(rope_op) -> None:
    runner = TorchModuleRunner(_posenc_module_fn(rope_op, shift=10 * TOL.atol), "shifted", ["q_rot", "k_rot"])
    report = validate_onnx(rope_op, shapes=SHAPES, references=[Reference(runner, "k_rot shifted by 10 atol")])
    assert not report.passed
    assert [(r.reference, r.output) for r in report.failures()] == [("shifted", "k_rot")]
    assert report.failures()[0].max_abs == pytest.approx(10 * TOL.atol, rel=1e-3)


def test_every_reference_has_its_rows_and_its_own_tolerance(rope_op) -> None:
    shift = 10 * TOL.atol
    loose = Tolerance(atol=1.0, rtol=0.0)
    shifted = Reference(
        TorchModuleRunner(_posenc_module_fn(rope_op, shift), "shifted", ["q_rot", "k_rot"]),
        "k_rot shifted, held to a loose tolerance",
        tolerances={"k_rot": loose},
    )
    report = validate_onnx(rope_op, shapes=SHAPES, references=[EAGER, shifted])
    assert report.passed, report.to_markdown()
    rows = {(r.reference, r.output): r for r in report.rows}
    assert set(rows) == {(ref, out) for ref in (REFERENCE_NAME, "shifted") for out in ("q_rot", "k_rot")}
    assert (rows["shifted", "k_rot"].atol, rows["shifted", "k_rot"].rtol) == (loose.atol, loose.rtol)
    for key in ((REFERENCE_NAME, "k_rot"), (REFERENCE_NAME, "q_rot"), ("shifted", "q_rot")):
        assert (rows[key].atol, rows[key].rtol) == (TOL.atol, TOL.rtol)
    assert rows["shifted", "k_rot"].max_abs == pytest.approx(shift, rel=1e-3)
    # the same shift against the scheme tolerance fails, and only against that reference
    strict = Reference(shifted.runner, "k_rot shifted, scheme tolerance")
    report = validate_onnx(rope_op, shapes=SHAPES, references=[EAGER, strict])
    assert [(r.reference, r.output) for r in report.failures()] == [("shifted", "k_rot")]


def test_a_float32_graph_brings_the_float32_rendering_its_floor_measures(rope_op) -> None:
    """The eager reference of a float32 graph is floored by the same module in float32 (float32 arithmetic's own
    error on each feed), which runs but judges nothing: every row still names the float64 reference."""
    report = validate_onnx(rope_op, shapes=SHAPES)
    assert {row.reference for row in report.rows} == {REFERENCE_NAME}
    (exact,) = [ref for ref in report.references if ref.name == REFERENCE_NAME]
    (measuring,) = [ref for ref in report.references if ref.measuring]
    assert exact.floor == Float32Floor(measuring.name, REFERENCE_NAME)
    single, double = report.run_results[measuring.name][0]["q_rot"], report.run_results[REFERENCE_NAME][0]["q_rot"]
    assert np.array_equal(single, single.astype(np.float32))  # it ran in float32: every value is a float32
    assert not np.array_equal(single, double)


def test_an_informational_reference_is_reported_but_not_judged(rope_op, tmp_path) -> None:
    shifted = Reference(
        TorchModuleRunner(_posenc_module_fn(rope_op, 10 * TOL.atol), "shifted", ["q_rot", "k_rot"]),
        "k_rot shifted (informational)",
        informational=True,
    )
    report = validate_onnx(rope_op, shapes=SHAPES, references=[EAGER, shifted])
    assert report.passed
    assert report.failures() == []
    info = [r for r in report.rows if r.reference == "shifted"]
    assert all(r.informational for r in info)
    assert [r.output for r in info if not r.passed] == ["k_rot"]
    markdown = report.to_markdown()
    assert "| 2, 5, 3 | shifted | onnxrt-cpu | k_rot |" in markdown
    assert "info: beyond tolerance" in markdown
    assert "`shifted`: k_rot shifted (informational) (informational: not part of the verdict)" in markdown
    report.save(json_path=tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["passed"] is True
    assert [(ref["name"], ref["informational"]) for ref in data["references"] if not ref["measuring"]] == [
        (REFERENCE_NAME, False),
        ("shifted", True),
    ]
    assert {(row["reference"], row["output"], row["passed"]) for row in data["rows"]} == {
        (REFERENCE_NAME, "q_rot", True),
        (REFERENCE_NAME, "k_rot", True),
        ("shifted", "q_rot", True),
        ("shifted", "k_rot", False),
    }


def test_reports_name_the_reference_of_every_row(rope_op) -> None:
    report = validate_onnx(rope_op, shapes=[FeedShape(1, 1, 0), FeedShape(3, 4, 2)])
    lines = report.to_markdown().splitlines()
    assert "| shape (B, S, P) | reference | runner | output |" in "\n".join(lines)
    assert f"- `{REFERENCE_NAME}`: float64 eager posenc reference (CPU)" in lines
    table = [line for line in lines if line.startswith("| 1, 1, 0") or line.startswith("| 3, 4, 2")]
    assert len(table) == 4
    assert all(line.split(" | ")[1] == REFERENCE_NAME for line in table)
    data = report.to_dict()
    assert data["references"][0]["description"] == "float64 eager posenc reference (CPU)"
    assert all(row["reference"] == REFERENCE_NAME for row in data["rows"])


def _array_fn(offset: Mapping[str, float]):
    return lambda feed: {"y": feed["x"] * 2.0 + offset.get("y", 0.0), "z": feed["x"][:, :1] + offset.get("z", 0.0)}


def test_compare_every_candidate_against_every_reference() -> None:
    feeds = [{"x": np.linspace(-1, 1, 12).reshape(3, 4)}, {"x": np.ones((2, 4))}]
    shapes = [FeedShape(3, 4), None]
    references = [
        Reference(TorchModuleRunner(_array_fn({}), "exact"), "exact"),
        Reference(TorchModuleRunner(_array_fn({"y": 0.5}), "off"), "y off by 0.5", tolerances={"y": Tolerance(1, 0)}),
    ]
    candidates = [TorchModuleRunner(_array_fn({}), "same"), TorchModuleRunner(_array_fn({"z": 1e-3}), "z-moved")]
    tolerances = {"y": Tolerance(1e-6, 0.0), "z": Tolerance(1e-6, 0.0)}
    result = compare(references, candidates, feeds, tolerances, shapes=shapes)
    keys = [(r.feed, r.reference, r.runner, r.output) for r in result.rows]
    assert keys == [
        (f, ref, cand, out)
        for f in (0, 1)
        for ref in ("exact", "off")
        for cand in ("same", "z-moved")
        for out in ("y", "z")
    ]
    assert [r.shape for r in result.rows[::8]] == shapes
    failed = {(r.feed, r.reference, r.runner, r.output) for r in result.failures()}
    assert failed == {(f, ref, "z-moved", "z") for f in (0, 1) for ref in ("exact", "off")}
    assert all(r.max_abs == pytest.approx(0.5) for r in result.rows if r.reference == "off" and r.output == "y")
    np.testing.assert_array_equal(result.outputs("same", 1)["y"], 2 * np.ones((2, 4)))
    assert sorted(result.run_results.keys()) == ["exact", "off", "same", "z-moved"]


def test_compare_fails_missing_outputs_and_changed_shapes_and_refuses_bad_setups() -> None:
    feeds = [{"x": np.ones((2, 3))}]
    tolerances = {"y": Tolerance(1e-6, 0.0), "z": Tolerance(1e-6, 0.0)}
    reference = Reference(TorchModuleRunner(_array_fn({}), "ref"), "reference")
    short = TorchModuleRunner(lambda feed: {"y": (feed["x"] * 2.0)[:, :2]}, "short")
    result = compare([reference], [short], feeds, tolerances)
    assert [(r.output, r.passed, r.max_abs) for r in result.rows] == [("y", False, np.inf), ("z", False, np.inf)]
    with pytest.raises(ConfigError, match="unique"):
        compare([reference], [TorchModuleRunner(_array_fn({}), "ref")], feeds, tolerances)
    with pytest.raises(ConfigError, match="no tolerance for output 'z'"):
        compare([reference], [TorchModuleRunner(_array_fn({}), "cand")], feeds, {"y": Tolerance(1, 1)})
    informational = Reference(reference.runner, "reference", informational=True)
    with pytest.raises(ConfigError, match="every reference is informational"):
        compare([informational], [TorchModuleRunner(_array_fn({}), "cand")], feeds, tolerances)
    with pytest.raises(ConfigError, match="one shape per feed"):
        compare([reference], [TorchModuleRunner(_array_fn({}), "cand")], feeds, tolerances, shapes=[None, None])


def test_fit_shapes_shrinks_seq_then_past_and_drops_duplicates() -> None:
    shapes = [FeedShape(2, 5, 0), FeedShape(2, 13, 5), FeedShape(2, 9, 9), FeedShape(1, 1, 9)]
    assert fit_shapes(shapes, 4) == [FeedShape(2, 4, 0), FeedShape(1, 1, 3)]
    assert fit_shapes(shapes, None) == shapes


def _tiny_model(scale: float) -> bytes:
    """y = x * scale + float(ids): a model without a manifest, with symbolic batch and seq dims."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["scaled"]),
        helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["ids_f", "axis"], ["ids_3d"]),
        helper.make_node("Add", ["scaled", "ids_3d"], ["y"]),
    ]
    inits = [helper.make_tensor("scale", TensorProto.FLOAT, [], [scale]), helper.make_tensor("axis", 7, [1], [-1])]
    graph = helper.make_graph(nodes, "tiny", [x, ids], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def test_optimize_check_runs_models_without_a_manifest_on_random_feeds(tmp_path) -> None:
    before = _tiny_model(2.0)
    (tmp_path / "tiny.onnx").write_bytes(before)
    info = read_model_info(tmp_path / "tiny.onnx")
    assert info.manifest is None
    report = check_ort_parity(before, _tiny_model(2.0), info)
    default = DEFAULT_TOLERANCES["float32"]
    assert report == {"y": OutputDrift(max_abs_diff=0.0, atol=default.atol, rtol=default.rtol)}
    with pytest.raises(ParityError, match=r"output 'y' of the optimized graph differs"):
        check_ort_parity(before, _tiny_model(2.001), info)
