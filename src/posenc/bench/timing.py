"""Latency measurement: warm-up, repeated timed calls (alternating between backends), median and p90."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from posenc.artifacts.memory import check_bytes
from posenc.errors import ConfigError
from posenc.records import field


@dataclasses.dataclass(frozen=True)
class TimingSettings:
    """How long to measure.

    Attributes:
        warmup: untimed calls before measuring (allocations, thread pools, caches).
        repeats: timed calls wanted.
        min_repeats: timed calls made even when ``max_seconds`` runs out first.
        max_seconds: time budget of the timed calls of one measurement (``None``: no budget).
        rounds: alternating rounds of :func:`measure_interleaved`.
    """

    warmup: int = 5
    repeats: int = 50
    min_repeats: int = 5
    max_seconds: float | None = 10.0
    rounds: int = 5

    def __post_init__(self) -> None:
        for name, low in (("warmup", 0), ("repeats", 1), ("min_repeats", 1), ("rounds", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an int >= {low}, got {value!r}.")
        if self.max_seconds is not None and not 0 < self.max_seconds < float("inf"):
            raise ConfigError(f"max_seconds must be > 0 (or None for no budget), got {self.max_seconds!r}.")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How a benchmark plan is run.

    Attributes:
        timing: warm-up, repeats, time budget per measurement.
        threads: intra-op threads of PyTorch and ONNX Runtime (the same for both, so ratios are fair).
        copy_mib: size of the copy-bandwidth array (MiB).
        copy_repeats: timed copies of the bandwidth measurement.
        keep_models: keep exported/optimized graphs under ``OUT/models`` (else a temporary folder).
        plots: write PNG plots at the end.
        copy_alongside_mib: positional ops moving at least this many MiB per call are timed in alternating
            rounds with a ``copy_mib`` copy, and their roofline ratio uses that copy (0: never).
        position_guard: export the graphs with the position guard (``posenc export``'s default); ``False``
            measures graphs without it.
        guard_cost: also time every graph exported without the guard, in the same alternating rounds as the
            guarded one (:attr:`BenchRecord.unguarded`): the guard's cost from one run's noise.
    """

    timing: TimingSettings = dataclasses.field(default_factory=TimingSettings)
    threads: int = 2
    copy_mib: int = 1024
    copy_repeats: int = 5
    keep_models: bool = False
    plots: bool = True
    copy_alongside_mib: int = 32
    position_guard: bool = field(optional=True, default=True)
    guard_cost: bool = field(optional=True, default=False)

    def __post_init__(self) -> None:
        if self.guard_cost and not self.position_guard:
            raise ConfigError("guard_cost times each graph with and without the position guard; keep the guard on.")
        for name, low in (("threads", 1), ("copy_mib", 1), ("copy_repeats", 1), ("copy_alongside_mib", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                kind = "a positive int" if low == 1 else f"an int >= {low}"
                raise ConfigError(f"{name} must be {kind}, got {value!r}.")
        check_bytes(
            2 * self.copy_mib << 20, f"the copy-bandwidth arrays of {self.copy_mib} MiB", "give a smaller --copy-mib."
        )


@dataclasses.dataclass(frozen=True)
class Timing:
    """Statistics of the timed calls, in seconds (JSON keys ``median_s``, ``p90_s``, ``mean_s``, ``min_s``)."""

    median: float = field(key="median_s")
    p90: float = field(key="p90_s")
    mean: float = field(key="mean_s")
    minimum: float = field(key="min_s")
    runs: int = field(key="runs")

    def per_call(self, calls: int) -> Timing:
        """The statistics of one of ``calls`` calls that each timed sample made (e.g. a replayed CUDA graph)."""
        return Timing(self.median / calls, self.p90 / calls, self.mean / calls, self.minimum / calls, self.runs)

    @classmethod
    def from_samples(cls, samples: list[float]) -> Timing:
        if not samples:
            raise ValueError("no timed samples")
        array = np.asarray(samples, dtype=np.float64)
        return cls(
            median=float(np.median(array)),
            p90=float(np.percentile(array, 90)),
            mean=float(array.mean()),
            minimum=float(array.min()),
            runs=len(samples),
        )


Timer = Callable[[Callable[[], Any]], float]
"""``timer(call) -> seconds``: runs ``call()`` once and says how long it took (wall clock, CUDA events, ...)."""


def wall_time(call: Callable[[], Any]) -> float:
    """The default :data:`Timer`: ``time.perf_counter`` around one call."""
    begin = time.perf_counter()
    call()
    return time.perf_counter() - begin


def time_samples(call: Callable[[], Any], settings: TimingSettings, timer: Timer = wall_time) -> list[float]:
    """``settings.warmup`` untimed calls of ``call``, then up to ``settings.repeats`` timed by ``timer``.

    Timed calls stop early once ``settings.max_seconds`` (wall clock) is spent, but never before ``min_repeats``.
    """
    for _ in range(settings.warmup):
        call()
    samples: list[float] = []
    started = time.perf_counter()
    wanted_minimum = min(settings.min_repeats, settings.repeats)
    for _ in range(settings.repeats):
        samples.append(timer(call))
        spent = time.perf_counter() - started
        if settings.max_seconds is not None and spent > settings.max_seconds and len(samples) >= wanted_minimum:
            break
    return samples


def measure(call: Callable[[], Any], settings: TimingSettings, timer: Timer = wall_time) -> Timing:
    """Time ``call()`` (see :func:`time_samples`) and summarize the samples."""
    return Timing.from_samples(time_samples(call, settings, timer))


def measure_interleaved(calls: Mapping[str, Callable[[], Any]], settings: TimingSettings) -> dict[str, Timing]:
    """Time several callables in alternating rounds, so slow drift of a shared machine hits them alike.

    After ``settings.warmup`` untimed calls of each, every round gives each callable one untimed call (its
    thread pool wakes up, the previous callable's spinning threads settle) and then a chunk of timed calls;
    ``repeats`` timed calls each are spread over ``settings.rounds`` rounds. Rounds stop early once ``max_seconds``
    per callable is spent, but not before each has ``min_repeats`` samples.

    Returns:
        name -> :class:`Timing`, in the order of ``calls``.
    """
    for _ in range(settings.warmup):
        for call in calls.values():
            call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    chunk = -(-settings.repeats // settings.rounds)
    budget = None if settings.max_seconds is None else settings.max_seconds * len(calls)
    wanted = min(settings.min_repeats, settings.repeats)
    clock = time.perf_counter
    started = clock()
    while any(len(s) < settings.repeats for s in samples.values()):
        for name, call in calls.items():
            call()
            for _ in range(min(chunk, settings.repeats - len(samples[name]))):
                begin = clock()
                call()
                samples[name].append(clock() - begin)
        spent = clock() - started
        if budget is not None and spent > budget and all(len(s) >= wanted for s in samples.values()):
            break
    return {name: Timing.from_samples(s) for name, s in samples.items()}
