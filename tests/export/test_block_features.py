"""Blocks with the options of real checkpoints (tests/features.py) export and match the float64 eager block
on ONNX Runtime at S = 1, odd S, longer than the sample, and decode with past > 0."""

from __future__ import annotations

import pytest

from posenc.export import load_manifest
from posenc.validate import validate_onnx
from posenc.validate.parity import default_shapes
from tests.features import FEATURE_CASES, FeatureCase, exported_feature


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else []) for c in FEATURE_CASES]
)
def test_feature_block_matches_the_float64_reference(export_cache, case: FeatureCase) -> None:
    path = exported_feature(export_cache, case)
    manifest = load_manifest(path)
    assert manifest.attention == case.config.to_dict()  # the options travel in the manifest
    assert manifest.attention_config() == case.config
    shapes = default_shapes(manifest)
    assert {s.seq for s in shapes} >= {1}
    assert any(s.seq % 2 for s in shapes)
    assert any(s.past > 0 for s in shapes)
    report = validate_onnx(path, shapes=shapes)
    assert report.passed, report.to_markdown()
