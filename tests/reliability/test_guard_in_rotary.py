"""On ``--target ort-cpu`` the position guard of a rotary block is handed to ONNX Runtime CPU's ``RotaryEmbedding``,
which refuses positions outside its cos cache itself (posenc.graphs.guard): the optimized graph must still raise for
a negative position and one past the table, keep parity at valid ones (optimize_file's own check against the
exported graph), and look like the unguarded graph. Graphs whose positions reach anything that kernel does not
cover keep the guard, and other targets always keep it."""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from posenc.config import AttentionConfig
from posenc.export import ExportResult, export_scheme
from posenc.export.feeds import make_feed
from posenc.export.shapes import FeedShape
from posenc.graphs import OptimizeResult, optimize_file

CONFIG = AttentionConfig(hidden_size=64, num_heads=4, num_kv_heads=2, max_position_embeddings=32)


def _ops(path: Path) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in onnx.load(str(path)).graph.node)


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str, bool], ExportResult]:
    """The module's exports, each made once (the guarded RoPE block is optimized for two targets)."""
    folder = tmp_path_factory.mktemp("guard-in-rotary")

    @functools.cache
    def export(scheme: str, kv_cache: str, guard: bool) -> ExportResult:
        path = folder / f"{scheme}-{kv_cache}-{guard}.onnx"
        return export_scheme(scheme, path, config=CONFIG, kv_cache=kv_cache, position_guard=guard)

    return export


def _optimized(
    exports: Callable[[str, str, bool], ExportResult],
    folder: Path,
    scheme: str,
    kv_cache: str,
    guard: bool,
    target: str = "ort-cpu",
) -> tuple[Path, OptimizeResult, ExportResult]:
    exported = exports(scheme, kv_cache, guard)
    target_path = folder / f"{scheme}-{kv_cache}-{guard}.{target}.onnx"
    return target_path, optimize_file(exported.path, target_path, target), exported


def _run(path: Path, manifest, position: int) -> list[np.ndarray]:
    feed = make_feed(manifest, FeedShape(batch=1, seq=2, past=3))
    feed["position_ids"] = np.array([[3, position]], dtype=np.int64)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


@pytest.mark.parametrize("kv_cache", ["concat", "inplace"])
def test_rotary_blocks_hand_the_guard_to_rotary_embedding_and_still_raise(
    exports, tmp_path: Path, kv_cache: str
) -> None:
    path, result, exported = _optimized(exports, tmp_path, "rope", kv_cache, guard=True)
    assert result.counts["guard_in_rotary"] == 1
    bare, _, _ = _optimized(exports, tmp_path, "rope", kv_cache, guard=False)
    assert sum(_ops(path).values()) == sum(_ops(bare).values())  # no node of the guard is left
    limit = exported.manifest.max_positions
    assert np.isfinite(_run(path, exported.manifest, limit - 1)[0]).all()
    for bad in (-1, limit, limit + 1000):
        with pytest.raises(Exception, match="out of range"):
            _run(path, exported.manifest, bad)


@pytest.mark.parametrize("scheme", ["alibi", "learned", "t5"])
def test_guards_the_kernel_does_not_cover_stay(exports, tmp_path: Path, scheme: str) -> None:
    path, result, exported = _optimized(exports, tmp_path, scheme, "concat", guard=True)
    assert result.counts.get("guard_in_rotary", 0) == 0
    assert _ops(path)["Where"] >= 3  # safe ids, tripwire row, poison
    with pytest.raises(Exception, match=r"out of data bounds|out of range"):
        _run(path, exported.manifest, -1)


def test_other_targets_keep_the_guard(exports, tmp_path: Path) -> None:
    path, result, _ = _optimized(exports, tmp_path, "rope", "concat", guard=True, target="ort-cuda")
    assert "guard_in_rotary" not in result.counts
    assert _ops(path)["GreaterOrEqual"] == 1


def test_the_rope_op_on_the_projection_layout_keeps_its_output_names_and_still_raises(tmp_path: Path) -> None:
    exported = export_scheme("rope", tmp_path / "op.onnx", unit="op-3d", config=CONFIG)
    path = tmp_path / "op.ort-cpu.onnx"
    assert optimize_file(exported.path, path, "ort-cpu").counts["guard_in_rotary"] == 1
    assert set(_ops(path)) <= {"RotaryEmbedding", "Identity"}  # the poison's Adds on the outputs are gone
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["q_rot", "k_rot"]
    feed = make_feed(exported.manifest, FeedShape(batch=1, seq=2, past=0))
    session.run(None, feed)
    feed["position_ids"] = np.array([[0, -1]], dtype=np.int64)
    with pytest.raises(Exception, match="out of range"):
        session.run(None, feed)
