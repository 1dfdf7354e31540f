"""The float32 floor of posenc's own reference, end to end: FLOATER's table grows with the position, so at the
table's end float32 arithmetic alone is off by more than the scheme's float32 atol (``posenc demo`` failed there).
The graph is allowed 3x what the eager module in float32 gets wrong on that feed, and no more."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import torch

from posenc.config import AttentionConfig
from posenc.export import export_scheme, load_eager, reference_inputs
from posenc.schemes import get_spec
from posenc.validate import Reference, TorchModuleRunner, validate_onnx
from posenc.validate.compare import Float32Floor
from posenc.validate.runners import FLOAT32_NAME, REFERENCE_NAME

pytestmark = pytest.mark.slow  # a FLOATER export and three validations: about 30 s


@pytest.fixture(scope="module")
def floater(tmp_path_factory):
    config = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=512)
    path = tmp_path_factory.mktemp("floater") / "floater.onnx"
    return export_scheme("floater", path, config=config, params={"delta_t": 3.2}).path


def _table_end(report):
    return [row for row in report.rows if row.shape is not None and row.shape.start is not None]


def test_the_table_end_of_a_float32_graph_is_held_to_three_times_float32s_own_error(floater) -> None:
    policy = get_spec("floater").tolerance("float32")
    report = validate_onnx(floater)
    assert report.passed, report.to_markdown()
    rows = _table_end(report)
    assert rows
    assert all(row.reference == REFERENCE_NAME for row in rows)
    out = next(row for row in rows if row.output == "out")
    assert out.max_abs > policy.atol  # the policy's atol alone would fail this correct graph
    assert out.atol > policy.atol
    assert f"({FLOAT32_NAME} against {REFERENCE_NAME})" in out.note
    assert "[1]" in report.to_markdown()  # the widened rows say why
    near = [row for row in report.rows if row.shape is not None and row.shape.start is None]
    assert all(row.atol == policy.atol for row in near)  # float32 is exact enough there: nothing widened


def test_a_graph_off_by_more_than_the_floor_still_fails_at_the_table_end(floater) -> None:
    module, manifest = load_eager(floater)

    def off(feed: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        outputs = module(*reference_inputs(manifest, feed, torch.float64))
        return {name: value + 1e-3 for name, value in zip(manifest.output_names, outputs, strict=True)}

    candidate = TorchModuleRunner(off, "off-by-1e-3", manifest.output_names)
    report = validate_onnx(floater, runners=[candidate])
    failed = [row for row in _table_end(report) if not row.passed]
    assert failed, report.to_markdown()
    assert all(row.atol < 1e-3 for row in failed)


def test_a_floor_brought_by_another_reference_replaces_posencs_own(floater) -> None:
    """With a checkpoint's floor (``--against-hf``) the float32 rendering of posenc's module is not run."""
    module, manifest = load_eager(floater)

    def exact(feed: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        outputs = module(*reference_inputs(manifest, feed, torch.float64))
        return dict(zip(manifest.output_names, outputs, strict=True))

    runner = TorchModuleRunner(exact, "other-fp64", manifest.output_names)
    other = Reference(runner, "another exact reference", floor=Float32Floor(REFERENCE_NAME, "other-fp64"))
    report = validate_onnx(floater, references=["eager", other])
    assert not any(ref.measuring for ref in report.references)
