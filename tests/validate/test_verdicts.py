"""One verdict rule, stated and measured the same way everywhere: the margin of every row, a reference that drifts
from a more exact one judged on the data (not on how the feed was asked for), and half-precision bounds derived
from a model run in that precision."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.errors import ConfigError
from posenc.schemes.base import Tolerance
from posenc.validate import Reference, TorchModuleRunner, compare
from posenc.validate.compare import ErrorBound, Float32Floor
from posenc.validate.tolerance import RULE, margin_of, outside_tolerance

TOL = Tolerance(atol=1e-3, rtol=1e-2)


def _fn(offset: Callable[[np.ndarray], np.ndarray]) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """``y = x + offset(x)``: a runner whose error is ``offset``."""
    return lambda feed: {"y": feed["x"] + offset(feed["x"])}


def _runner(name: str, offset: Callable[[np.ndarray], np.ndarray] = np.zeros_like) -> TorchModuleRunner:
    return TorchModuleRunner(_fn(offset), name)


@settings(max_examples=200, deadline=None)
@given(
    ref=st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=6),
    err=st.lists(st.floats(-0.2, 0.2, allow_nan=False), min_size=6, max_size=6),
    atol=st.floats(0, 0.1),
    rtol=st.floats(0, 0.1),
)
def test_margin_at_most_one_exactly_when_no_element_fails(ref, err, atol, rtol) -> None:
    expected = np.array(ref)
    got = expected + np.array(err[: len(ref)])
    tol = Tolerance(atol=atol, rtol=rtol)
    assert (margin_of(got, expected, tol) <= 1.0) == (not outside_tolerance(got, expected, tol).any())


def test_a_row_passing_by_rtol_beyond_atol_shows_how_close_it_came() -> None:
    """|err| 1.5e-3 > atol 1e-3 passes by rtol (|ref| 0.2 -> 2e-3): the margin 0.75 says so."""
    feed = [{"x": np.array([0.2, 0.0])}]
    candidate = _runner("graph", lambda x: np.where(x > 0, 1.5e-3, 0.0))
    (row,) = compare([Reference(_runner("exact"), "exact")], [candidate], feed, {"y": TOL}).rows
    assert row.passed
    assert row.max_abs > row.atol
    assert row.margin == pytest.approx(0.75)
    assert "max(atol, rtol * |ref|)" in RULE


def _drifting(scale: float) -> Callable[[np.ndarray], np.ndarray]:
    """An error growing with |x| like float32 angles with the position: ``scale * x``."""
    return lambda x: scale * x


def test_a_drifting_reference_is_judged_on_the_data_of_each_feed() -> None:
    """The same runner is informational on the feed where it drifts beyond the tolerance of the exact reference
    (with a note), and counts — and fails a wrong candidate — on the feed where it does not."""
    near, far = {"x": np.full(4, 0.01)}, {"x": np.full(4, 5.0)}
    exact = Reference(_runner("hf-fp64"), "exact")
    native = Reference(_runner("hf-fp32", _drifting(2e-2)), "float32 angles", judged_by="hf-fp64")
    candidate = _runner("graph", lambda x: np.full_like(x, 2e-3))  # 2e-3 off everywhere: beyond atol near 0
    rows = compare([exact, native], [candidate], [near, far], {"y": TOL}).rows
    by = {(r.feed, r.reference): r for r in rows}
    assert not by[(0, "hf-fp32")].informational  # native agrees with exact here: its row counts
    assert not by[(0, "hf-fp32")].passed
    far_native = by[(1, "hf-fp32")]
    assert far_native.informational  # native is 1e-1 from exact here: the exact rendering decides
    assert "hf-fp32 itself is 1.00e-01 from hf-fp64" in far_native.note
    assert not by[(1, "hf-fp64")].informational


def test_the_same_feed_gets_the_same_verdict_alone_or_with_others() -> None:
    far = {"x": np.full(3, 5.0)}
    exact = Reference(_runner("exact"), "exact")
    native = Reference(_runner("native", _drifting(2e-2)), "native", judged_by="exact")
    candidate = _runner("graph")
    alone = compare([exact, native], [candidate], [far], {"y": TOL})
    mixed = compare([exact, native], [candidate], [{"x": np.zeros(3)}, far], {"y": TOL})
    strip = [(r.reference, r.passed, r.informational, r.note) for r in alone.rows]
    assert strip == [(r.reference, r.passed, r.informational, r.note) for r in mixed.rows if r.feed == 1]


def test_a_half_precision_graph_is_bound_by_the_model_in_that_precision() -> None:
    """Bound rows: the graph may be at most 2x as far from the exact reference as the half-precision module is."""
    feed = [{"x": np.linspace(1, 2, 5)}]
    exact = Reference(_runner("hf-fp64"), "exact")
    half = Reference(_runner("hf-bf16", lambda x: 4e-3 * np.ones_like(x)), "bf16", bound=ErrorBound("hf-fp64"))
    good = _runner("good", lambda x: 7e-3 * np.ones_like(x))
    bad = _runner("bad", lambda x: 9e-3 * np.ones_like(x))
    loose = {"y": Tolerance(atol=3e-2, rtol=3e-2)}
    rows = compare([exact, half], [good, bad], feed, loose).rows
    bound = {r.runner: r for r in rows if r.reference == "hf-fp64 (≤ 2 × hf-bf16's error)"}
    assert bound["good"].passed
    assert bound["good"].atol == pytest.approx(8e-3)
    assert not bound["bad"].passed  # within the scheme's loose bf16 tolerance, but beyond twice the module's error
    assert all(r.passed for r in rows if r.reference != "hf-fp64 (≤ 2 × hf-bf16's error)")


def test_a_judge_or_bound_must_be_another_reference_of_the_comparison() -> None:
    feed = [{"x": np.ones(2)}]
    lonely = Reference(_runner("native"), "native", judged_by="missing")
    with pytest.raises(ConfigError, match="'missing' as its more exact reference"):
        compare([lonely], [_runner("graph")], feed, {"y": TOL})
    itself = Reference(_runner("half"), "half", bound=ErrorBound("half"))
    with pytest.raises(ConfigError, match="not another reference"):
        compare([itself], [_runner("graph")], feed, {"y": TOL})


def test_a_float32_candidate_is_allowed_what_float32_arithmetic_alone_gets_wrong() -> None:
    """A wide layer: the module in float32 with exact angles (the floor) is itself 2e-5 from the exact rendering on
    one feed, beyond the fp32 tolerance of 1e-5. There every row allows 3x that (6e-5, with a note saying why) and
    still fails a candidate beyond it; on the feed where float32 is exact, the tolerance is unchanged."""
    fp32 = {"y": Tolerance(atol=1e-5, rtol=1e-5)}
    floor = Float32Floor("hf-fp32, fp64 angles", "hf-fp64")
    exact = Reference(_runner("hf-fp64"), "exact", floor=floor)
    rendering = Reference(_runner("hf-fp32, fp64 angles", lambda x: 2e-5 * np.sign(x)), "floor", informational=True)
    feeds = [{"x": np.array([0.0, 0.0])}, {"x": np.array([-0.5, 0.5])}]
    good = _runner("good", lambda x: 5e-5 * np.sign(x) + 8e-6)
    bad = _runner("bad", lambda x: 7e-5 * np.sign(x))
    rows = compare([exact, rendering], [good, bad], feeds, fp32).rows
    on = {(r.feed, r.runner, r.reference): r for r in rows}
    assert on[(0, "good", "hf-fp64")].atol == 1e-5  # float32 is exact here
    assert on[(0, "good", "hf-fp64")].passed
    widened = on[(1, "good", "hf-fp64")]
    assert widened.passed
    assert not widened.informational
    assert widened.atol == pytest.approx(6e-5)
    assert "3 × the 2.00e-05 that float32 arithmetic alone makes here" in widened.note
    assert not on[(1, "bad", "hf-fp64")].passed  # beyond 3x float32's own error: still a failure
    assert all(r.informational for r in rows if r.reference == "hf-fp32, fp64 angles")
