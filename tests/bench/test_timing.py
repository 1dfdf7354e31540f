"""Timing statistics and the bandwidth measurement: counts and arithmetic, never speed."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

from posenc.bench.bandwidth import measure_copy_bandwidth
from posenc.bench.timing import Timing, TimingSettings, measure
from posenc.errors import ConfigError


def test_statistics_match_an_independent_computation() -> None:
    samples = [0.005, 0.001, 0.003, 0.010, 0.002, 0.004, 0.007, 0.006, 0.009, 0.008]
    timing = Timing.from_samples(samples)
    ordered = sorted(samples)
    assert timing.median == pytest.approx(statistics.median(samples))
    # p90 by linear interpolation between order statistics (numpy's default definition)
    rank = 0.9 * (len(ordered) - 1)
    low = int(rank)
    expected = ordered[low] + (rank - low) * (ordered[low + 1] - ordered[low])
    assert timing.p90 == pytest.approx(expected)
    assert timing.minimum == min(samples)
    assert timing.runs == len(samples)


def test_measure_makes_warmup_plus_repeat_calls() -> None:
    calls = []
    timing = measure(lambda: calls.append(1), TimingSettings(warmup=3, repeats=7, max_seconds=None))
    assert len(calls) == 10
    assert timing.runs == 7


def test_time_budget_stops_early_but_not_before_min_repeats() -> None:
    calls = []

    def slow() -> None:
        calls.append(1)
        time.sleep(0.01)

    timing = measure(slow, TimingSettings(warmup=0, repeats=1000, min_repeats=4, max_seconds=0.001))
    assert timing.runs == 4
    assert len(calls) == 4


@pytest.mark.parametrize(
    "kwargs", [{"warmup": -1}, {"repeats": 0}, {"min_repeats": 0}, {"max_seconds": 0.0}, {"repeats": True}]
)
def test_bad_timing_settings(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        TimingSettings(**kwargs)


def test_copy_bandwidth_is_the_median_of_its_samples() -> None:
    bw = measure_copy_bandwidth(mib=4, repeats=3)
    assert len(bw.samples) == 3
    assert bw.bytes_per_s == pytest.approx(float(np.median(bw.samples)))
    assert bw.bytes_per_s > 0
    with pytest.raises(ConfigError, match="mib"):
        measure_copy_bandwidth(mib=0)
    with pytest.raises(ConfigError, match="repeats"):
        measure_copy_bandwidth(mib=1, repeats=0)


def test_progress_prints_one_line_per_step_into_files() -> None:
    import io

    from posenc.bench.progress import Progress

    stream = io.StringIO()
    bar = Progress(3, stream=stream)
    bar.show("preparing")  # not a terminal: nothing
    bar.step("first")
    bar.step("second")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[########----------------] 1/3")
    assert lines[1].endswith("second")
    quiet = io.StringIO()
    Progress(2, stream=quiet, enabled=False).step("x")
    assert quiet.getvalue() == ""


def test_interleaved_rounds_alternate_and_count() -> None:
    from posenc.bench.timing import measure_interleaved

    order: list[str] = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    timings = measure_interleaved(calls, TimingSettings(warmup=1, repeats=6, rounds=3, max_seconds=None))
    assert [t.runs for t in timings.values()] == [6, 6]
    # warm-up a, b; then 3 rounds of (1 untimed + 2 timed) a-calls followed by the same for b
    assert order == ["a", "b"] + (["a"] * 3 + ["b"] * 3) * 3
