"""Default feeds cross each model's boundaries: its rope type's own (LongRoPE's switch, llama3's band edges, YaRN's
and dynamic NTK's original context), the last position it serves, and a sliding window's edge — so a graph that is
right below a boundary and wrong beyond it fails a default check."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import torch

from posenc import AttentionConfig
from posenc.export import FeedShape, export_scheme, load_eager, load_manifest, reference_inputs
from posenc.validate import TorchModuleRunner, validate_onnx
from posenc.validate.feeds import DEFAULT_SHAPES, boundary_shapes, default_shapes, scheme_boundaries

CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=256)
LONGROPE = {
    "original_max_position_embeddings": 64,
    "short_factor": [1.0] * 8,
    "long_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.0],
}


def _export(folder: Path, scheme: str, params: Mapping[str, object], **kwargs: object) -> Path:
    return export_scheme(scheme, folder / f"{scheme}.onnx", params=dict(params), config=CONFIG, **kwargs).path


@pytest.fixture(scope="module")
def longrope_op(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The LongRoPE op of :data:`LONGROPE`, exported once for the module's two tests of it."""
    return _export(tmp_path_factory.mktemp("longrope"), "rope_longrope", LONGROPE, unit="op")


@pytest.mark.parametrize(
    ("scheme", "params", "points"),
    [
        ("rope_llama3", {"original_max_position_embeddings": 128}, [32, 128, 256]),
        ("rope_yarn", {"factor": 4.0, "original_max_position_embeddings": 64}, [64, 256]),
        ("rope_longrope", LONGROPE, [64, 256]),
        ("rope", {}, [256]),
    ],
)
def test_boundaries_of_each_rope_type(
    scheme: str, params: dict, points: list[int], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if scheme == "rope_longrope":  # the module's LongRoPE op (its own test below crosses the switch)
        assert params == LONGROPE
        path = request.getfixturevalue("longrope_op")
    else:
        path = _export(tmp_path, scheme, params, unit="op")
    manifest = load_manifest(path)
    assert scheme_boundaries(manifest) == points
    windows = [(s.first, s.last) for s in boundary_shapes(manifest)]
    assert windows == [(min(p - 2, 252), min(p + 1, 255)) for p in points]
    assert default_shapes(manifest)[: len(DEFAULT_SHAPES)] == list(DEFAULT_SHAPES)


def test_a_sliding_window_block_gets_a_step_across_its_edge(tmp_path: Path) -> None:
    config = AttentionConfig(**{**CONFIG.to_dict(), "sliding_window": 16})
    path = export_scheme("rope", tmp_path / "swa.onnx", config=config).path
    assert FeedShape(1, 1, 16) in boundary_shapes(load_manifest(path))


def test_the_switch_of_longrope_is_crossed_by_default(longrope_op: Path, tmp_path: Path) -> None:
    """A candidate that uses the short factors everywhere agrees with the graph below the switch (64) and not
    beyond: the old default shapes (positions below 23) pass it; the default shapes now fail it."""
    path = longrope_op
    short_only = _export(tmp_path / "short", "rope_longrope", {**LONGROPE, "long_factor": [1.0] * 8}, unit="op")
    module, manifest = load_eager(short_only)

    def run(feed: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        q_rot, k_rot = module(*reference_inputs(manifest, feed, torch.float64))
        return {"q_rot": q_rot, "k_rot": k_rot}

    wrong = TorchModuleRunner(run, "short-factors-only", ["q_rot", "k_rot"])
    assert validate_onnx(path, shapes=list(DEFAULT_SHAPES), runners=[wrong]).passed
    report = validate_onnx(path, runners=[wrong])
    assert not report.passed
    assert {row.shape.start for row in report.failures() if row.shape is not None} >= {62}
