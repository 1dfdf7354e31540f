"""Latency measurement: warm-up, repeated timed calls (alternating between backends), median and p90."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from posenc.errors import ConfigError


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
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ConfigError(f"max_seconds must be > 0 (or None for no budget), got {self.max_seconds!r}.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Timing:
    """Statistics of the timed calls, in seconds."""

    median: float
    p90: float
    mean: float
    minimum: float
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_s": self.median,
            "p90_s": self.p90,
            "mean_s": self.mean,
            "min_s": self.minimum,
            "runs": self.runs,
        }

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


def measure(call: Callable[[], Any], settings: TimingSettings) -> Timing:
    """Time ``call()``: ``settings.warmup`` untimed calls, then up to ``settings.repeats`` timed ones.

    Timed calls stop early once ``settings.max_seconds`` is spent, but never before ``min_repeats``.
    """
    for _ in range(settings.warmup):
        call()
    samples: list[float] = []
    clock = time.perf_counter
    started = clock()
    wanted_minimum = min(settings.min_repeats, settings.repeats)
    for _ in range(settings.repeats):
        begin = clock()
        call()
        end = clock()
        samples.append(end - begin)
        if settings.max_seconds is not None and end - started > settings.max_seconds and len(samples) >= wanted_minimum:
            break
    return Timing.from_samples(samples)


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
