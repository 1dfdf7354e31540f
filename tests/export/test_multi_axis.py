"""Exported multi-axis RoPE (M-RoPE, axial 2-D): the graph takes ``[A, B, S]`` position ids with symbolic batch and
sequence, runs at shapes other than the export sample in both table modes, and with text-only ids (every axis the
token's position) computes plain RoPE — checked against a separately built float64 eager ``rope`` block holding the
exported weights, not against the multi-axis scheme itself."""

from __future__ import annotations

import onnx
import pytest
import torch

from posenc import AttentionBlock
from posenc.export import FeedShape, load_manifest, make_feed, run_onnx
from posenc.export.eager import load_eager, reference_inputs
from posenc.validate import tolerance_for, validate_onnx
from tests.conftest import SMALL, covers
from tests.matrix import MatrixCase, exported

AXES = {"rope_mrope": 3, "rope_axial": 2}
CASES = [(scheme, mode) for scheme in AXES for mode in ("precomputed", "dynamic")]
OTHER_SHAPES = [FeedShape(3, 7), FeedShape(2, 1, 9), FeedShape(1, 13, 5)]
"""Not the export sample's sizes: odd S with batch 3, a decode step after 9 cached tokens, S = 13 after 5."""


@covers("rope_mrope", "rope_axial")
@pytest.mark.parametrize(("scheme", "mode"), CASES)
def test_graph_takes_axis_ids_and_runs_at_other_shapes(export_cache, scheme: str, mode: str) -> None:
    path = exported(MatrixCase(scheme, mode, "float32", "block"), export_cache, SMALL)
    graph = onnx.load(str(path), load_external_data=False).graph
    (ids,) = [value for value in graph.input if value.name == "position_ids"]
    dims = [d.dim_param or d.dim_value for d in ids.type.tensor_type.shape.dim]
    assert dims == [AXES[scheme], "batch", "seq"]
    report = validate_onnx(path, shapes=OTHER_SHAPES)
    assert [row.shape for row in report.rows[:: len({r.output for r in report.rows})]] == OTHER_SHAPES
    assert report.passed, report.to_markdown()


@covers("rope_mrope")
@pytest.mark.parametrize("mode", ["precomputed", "dynamic"])
def test_exported_mrope_of_text_ids_is_plain_rope(export_cache, mode: str) -> None:
    path = exported(MatrixCase("rope_mrope", mode, "float32", "block"), export_cache, SMALL)
    manifest = load_manifest(path)
    mrope, _ = load_eager(path)
    rope = AttentionBlock(SMALL, "rope", {"rope_theta": manifest.params["rope_theta"]}, table_dtype=torch.float64)
    rope = rope.double().eval()
    weights = {key: value for key, value in mrope.state_dict().items() if not key.startswith("scheme.")}
    loaded = rope.load_state_dict(weights, strict=False)  # the projections; RoPE's own tables stay its own
    assert not loaded.unexpected_keys
    assert all(key.startswith("scheme.") for key in loaded.missing_keys)
    tol = tolerance_for("rope_mrope", "float32", "out")
    for shape in OTHER_SHAPES:
        feed = make_feed(manifest, shape, seed=3, multi_axis="text")
        ids = feed["position_ids"]
        assert (ids == ids[:1]).all(), "text ids repeat the position on every axis"
        got = run_onnx(path, feed, manifest=manifest)
        inputs = reference_inputs(manifest, feed, torch.float64)
        inputs[1] = inputs[1][0]  # plain RoPE takes the [B, S] ids
        with torch.no_grad():
            want = rope(*inputs)
        for name, reference in zip(manifest.output_names, want, strict=True):
            torch.testing.assert_close(
                torch.from_numpy(got[name]).double(), reference, atol=tol.atol, rtol=tol.rtol, msg=f"{shape} {name}"
            )
