"""Multi-step decode parity on ONNX Runtime: both cache layouts (``--kv-cache concat|inplace``) of every scheme.

Reference: the float64 eager :class:`posenc.blocks.AttentionBlock` with its concatenated cache carried through the
same steps (:func:`posenc.validate.decode.eager_decode_reference`). Sequence: a prefill of 5 tokens, 64 single-token
steps, then a long jump (one token at the last position; for schemes that need contiguous positions, a chunk that
fills the cache, then one token in its last slot).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from posenc.errors import ConfigError
from posenc.export import FeedShape, export_scheme
from posenc.export.manifest import load_manifest
from posenc.export.units import RING_STEP
from posenc.graphs import optimize_file
from posenc.schemes import scheme_names
from posenc.validate.decode import DECODE_STEPS, decode_schedule, ring_schedule, ring_slots, validate_decode
from tests.conftest import DECODE

CONFIG = DECODE
CONTIGUOUS = {"transformer_xl"}
"""Schemes that need contiguous key positions (rel_shift): their long jump fills the cache instead."""
QUICK = ("rope",)
"""The scheme of ``make test`` (fused paths); a scheme computing attention itself is stepped in
``tests/graphs/test_cache_passes.py``, every scheme's eager in-place path in ``tests/test_in_place_cache.py``."""


def _export_both(scheme: str, folder: Path) -> list[Path]:
    return [
        export_scheme(scheme, folder / f"{scheme}-{layout}.onnx", kv_cache=layout, config=CONFIG).path
        for layout in ("concat", "inplace")
    ]


def _check(scheme: str, paths: list[Path]) -> None:
    jump = "fill" if scheme in CONTIGUOUS else "position"
    report = validate_decode(paths, jump=jump)
    steps = len(report.schedule)
    assert steps == 1 + DECODE_STEPS + (2 if jump == "fill" else 1)
    assert report.schedule[-1].first == CONFIG.max_position_embeddings - 1
    assert len(report.rows) == steps * len(paths) * 3, "one row per step, graph and output"
    failed = [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]
    assert report.passed, failed


@pytest.mark.parametrize("scheme", QUICK)
def test_decode_parity_exported_and_optimized(scheme: str, rope_inplace96, tmp_path: Path) -> None:
    concat, inplace = (tmp_path / f"{scheme}-{layout}.onnx" for layout in ("concat", "inplace"))
    paths = [export_scheme(scheme, concat, kv_cache="concat", config=CONFIG).path]
    if scheme == "rope":  # the session's in-place block (tests/conftest.py, the same geometry)
        paths.append(rope_inplace96.path)
    else:
        paths.append(export_scheme(scheme, inplace, kv_cache="inplace", config=CONFIG).path)
    optimized = []
    for path in paths:
        target = tmp_path / f"{path.stem}.ort-cpu.onnx"
        optimize_file(path, target, "ort-cpu")
        optimized.append(target)
    _check(scheme, paths + optimized)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", [s for s in scheme_names() if s not in QUICK])
def test_decode_parity_every_scheme(scheme: str, tmp_path: Path) -> None:
    _check(scheme, _export_both(scheme, tmp_path))


def test_the_in_place_graph_writes_only_into_the_bound_buffers(rope_inplace96) -> None:
    """A step run with IOBinding leaves the cache buffer holding the new slot and every other slot untouched."""
    import onnxruntime as ort

    from posenc.export import load_manifest, make_feed
    from posenc.export.runtime import ort_session
    from posenc.validate.runners import bind_in_place

    path = rope_inplace96.path
    feed = make_feed(load_manifest(path), FeedShape(1, 1, 7), seed=3)
    before = {name: feed[name].copy() for name in ("key_cache", "value_cache")}
    session = ort_session(path, ["CPUExecutionProvider"], check=False)
    expected = session.run(None, feed)
    caches = {name: ort.OrtValue.ortvalue_from_numpy(feed[name]) for name in before}
    binding = bind_in_place(session, dict(feed), caches)
    session.run_with_iobinding(binding)
    for index, name in ((1, "key_cache"), (2, "value_cache")):
        written = feed[name]  # the numpy buffer the OrtValue shares
        np.testing.assert_array_equal(written[:, :, 7], expected[index][:, :, 7])
        untouched = np.delete(np.arange(written.shape[2]), 7)
        np.testing.assert_array_equal(written[:, :, untouched], before[name][:, :, untouched])


def test_schedules_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ConfigError, match="max-positions"):
        decode_schedule(50)
    with pytest.raises(ConfigError, match="jump"):
        decode_schedule(96, jump="far")
    fill = decode_schedule(96, jump="fill")
    assert [s.past for s in fill[-2:]] == [69, 95]
    assert fill[-1].seq == 1


@pytest.mark.slow  # an export and 66 steps: about 30 s on 2 shared cores; the eager ring is tested by default
def test_a_sliding_window_ring_decodes_across_its_wrap_like_the_concatenated_cache(tmp_path: Path) -> None:
    """A sliding-window block's in-place export is a ring of W + 15 slots: the default sequence (69 tokens, past the
    ring's 19 slots, then a jump) matches the float64 block over its concatenated cache, each step's cache rows the
    ring's last 19 tokens; a schedule cut into calls the ring serves keeps every token at its position."""
    config = dataclasses.replace(CONFIG, sliding_window=4)
    paths = [export_scheme("rope", tmp_path / "ring.onnx", kv_cache="inplace", config=config).path]
    manifest = load_manifest(paths[0])
    assert manifest.cache_ring
    assert ring_slots(manifest) == 4 + RING_STEP - 1
    report = validate_decode(paths)
    assert report.schedule[-1].first == CONFIG.max_position_embeddings - 1
    assert report.passed, [(r.runner, r.output, r.feed, r.max_abs) for r in report.rows if not r.passed]
    with pytest.raises(ConfigError, match="linear mode only"):  # TensorRT's parser takes no circular writes
        optimize_file(paths[0], tmp_path / "ring.trt.onnx", "trt")
    cut = ring_schedule([FeedShape(1, 40, 0), FeedShape(1, 30, 40)], 19, 4)
    assert [(s.seq, s.past, s.first) for s in cut] == [(19, 0, 0), (16, 19, 19), (5, 35, 35), (16, 40, 40),
                                                       (14, 56, 56)]  # fmt: skip
