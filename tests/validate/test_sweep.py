"""Position sweep: exported ops against the float64 reference at positions up to 131072."""

from __future__ import annotations

import json

import numpy as np

from posenc.validate.sweep import DEFAULT_BUCKETS, position_sweep, sample_positions


def test_sample_positions_cover_each_bucket_to_131072() -> None:
    chosen = sample_positions(DEFAULT_BUCKETS, per_bucket=4, seed=1)
    for (lo, hi), positions in zip(DEFAULT_BUCKETS, chosen, strict=True):
        assert positions[0] == lo
        assert positions[-1] == hi - 1
        assert np.all((positions >= lo) & (positions < hi))
    assert chosen[-1][-1] == 131072


def test_rope_sweep_series_claims_and_outputs(tmp_path) -> None:
    rope_sweep = position_sweep(["rope"], dtypes=("fp32", "fp16"), per_bucket=3)
    keys = [s.key for s in rope_sweep.series]
    assert sorted(keys) == sorted(
        f"rope/{dtype}/{mode}/tables-{tables}"
        for mode in ("dynamic", "precomputed")
        for dtype, tables in (("float32", "float32"), ("float16", "float32"), ("float16", "float16"))
    )
    by_key = {s.key: s for s in rope_sweep.series}
    for series in rope_sweep.series:
        assert [b.count for b in series.buckets] == [3, 3, 3, 3]
        assert series.points[-1].position == 131072
        assert all(b.within_tolerance for b in series.buckets), series.key
    for mode in ("dynamic", "precomputed"):
        fp32 = by_key[f"rope/float32/{mode}/tables-float32"]
        assert max(p.max_abs for p in fp32.points) < 5e-6  # no fp32 angle loss at long positions
        fp16 = by_key[f"rope/float16/{mode}/tables-float32"]
        assert fp16.rounding_required
        assert fp16.passed  # within fp16 rounding of the float64 reference at every position
        half_tables = by_key[f"rope/float16/{mode}/tables-float16"]
        assert not half_tables.rounding_required
        assert max(p.max_ulps for p in half_tables.points) > max(p.max_ulps for p in fp16.points)

    written = rope_sweep.save(tmp_path / "sweep.json", tmp_path / "sweep.md")
    data = json.loads(written[0].read_text())
    assert data["max_position"] == 131072
    assert data["buckets"] == [list(b) for b in DEFAULT_BUCKETS]
    first = data["series"][0]
    assert {"scheme", "dtype", "table_mode", "table_dtype", "buckets", "points", "passed"} <= set(first)
    assert {"position", "max_abs", "max_rel", "max_ulps"} == set(first["points"][0])
    markdown = written[1].read_text()
    assert "[32k, 128k]" in markdown
    assert markdown.count("| rope |") == 6


def test_relative_scheme_sweep_in_fp16() -> None:
    report = position_sweep(["alibi"], dtypes=("fp16",), table_modes=("precomputed",), fp16_tables=False, per_bucket=2)
    (series,) = report.series
    assert series.table_mode == "precomputed"
    assert series.passed
    assert series.points[-1].position == 131072
